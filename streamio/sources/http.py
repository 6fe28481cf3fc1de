"""HTTP(S) sources: streamed, no temporary file, resumed after a dropped connection.

A dropped connection (an exception, or a body that ends before its ``Content-Length``) is resumed
with ``Range: bytes=<received>-`` and ``If-Range: <validator>``, where the validator is the first
response's strong ``ETag`` (or its ``Last-Modified``). If the object changed meanwhile, the server
answers 200 with the whole new object instead of 206, and we stop with a :class:`SourceError`
rather than splice two versions together. Retries are bounded (``max_retries`` consecutive
failures without progress) with exponential backoff.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.parse
from typing import Mapping, Optional

from ..errors import SourceError
from ..errors import UsageError
from .base import ByteSource

DEFAULT_MAX_RETRIES = 5
DEFAULT_BACKOFF = 0.25  # seconds before the first retry; doubles each time, capped below
MAX_BACKOFF = 8.0
DEFAULT_HTTP_TIMEOUT = 60.0  # socket timeout: a server silent this long counts as a dropped connection
MAX_REDIRECTS = 5
_RETRYABLE_STATUS = {500, 502, 503, 504}


class HttpSource(ByteSource):
    """Streams an ``http://`` or ``https://`` URL, resuming dropped connections."""

    def __init__(self, url: str, *, read_timeout: Optional[float] = None,
                 max_retries: int = DEFAULT_MAX_RETRIES, backoff: float = DEFAULT_BACKOFF,
                 headers: Optional[Mapping[str, str]] = None) -> None:
        if max_retries < 0:
            raise UsageError("max_retries must be >= 0")
        self.name = url
        self._url = url
        self._timeout = read_timeout if read_timeout is not None else DEFAULT_HTTP_TIMEOUT
        self._max_retries = max_retries
        self._backoff = backoff
        self._headers = dict(headers or {})
        self._conn: Optional[http.client.HTTPConnection] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self.received = 0
        self.total: Optional[int] = None
        self.retries = 0  # resumes done so far (all of them, for statistics)
        self._failures = 0  # consecutive failures without progress
        self._validator: Optional[str] = None
        self._etag: Optional[str] = None
        self._connect()

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> None:
        url = self._url
        redirects = 0
        while True:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https"):
                raise SourceError(f"unsupported URL scheme {parts.scheme!r}", source=self.name)
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            kwargs = {"timeout": self._timeout}
            if parts.scheme == "https":
                kwargs["context"] = ssl.create_default_context()
            path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            headers = {"Accept-Encoding": "identity", "User-Agent": "streamio", **self._headers}
            if self.received:
                headers["Range"] = f"bytes={self.received}-"
                if self._validator:
                    headers["If-Range"] = self._validator
            try:
                conn = cls(parts.hostname, parts.port, **kwargs)
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._retry_or_fail(exc, f"cannot connect ({exc})")
                url = self._url
                continue
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                url = urllib.parse.urljoin(url, resp.getheader("Location"))
                conn.close()
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise SourceError(f"more than {MAX_REDIRECTS} redirects", source=self.name)
                continue
            self._accept(conn, resp)
            return

    def _accept(self, conn, resp) -> None:
        status = resp.status
        if status in _RETRYABLE_STATUS:
            conn.close()
            self._retry_or_fail(None, f"HTTP {status} {resp.reason}")
            return self._connect()
        if status >= 400:
            conn.close()
            raise SourceError(f"HTTP {status} {resp.reason}", source=self.name)
        if not self.received and status == 200:
            length = resp.getheader("Content-Length")
            self.total = int(length) if length and length.isdigit() else None
            etag = resp.getheader("ETag")
            self._etag = etag
            if etag and not etag.startswith("W/"):
                self._validator = etag
            else:
                self._validator = resp.getheader("Last-Modified")
        elif self.received:
            if status != 206:
                conn.close()
                raise SourceError(
                    f"cannot resume at byte {self.received}: the server answered {status} instead"
                    " of 206 Partial Content (the object changed, or ranges are not supported)",
                    source=self.name)
            etag = resp.getheader("ETag")
            if self._etag and etag and etag != self._etag:
                conn.close()
                raise SourceError(f"the object changed while streaming (ETag {self._etag} became"
                                  f" {etag}); not mixing two versions", source=self.name)
            crange = resp.getheader("Content-Range", "")
            if not crange.startswith(f"bytes {self.received}-"):
                conn.close()
                raise SourceError(f"resume at byte {self.received} got Content-Range {crange!r}",
                                  source=self.name)
        else:
            conn.close()
            raise SourceError(f"unexpected HTTP {status} {resp.reason}", source=self.name)
        self._conn, self._resp = conn, resp

    def _retry_or_fail(self, exc: Optional[BaseException], what: str) -> None:
        self._failures += 1
        if self._failures > self._max_retries:
            where = f" at byte {self.received}" + (f" of {self.total}" if self.total else "")
            raise SourceError(f"{what}{where}; gave up after {self._max_retries} retries",
                              source=self.name) from exc
        self.retries += 1
        time.sleep(min(MAX_BACKOFF, self._backoff * 2 ** (self._failures - 1)))

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._resp = None

    # -- ByteSource ---------------------------------------------------------------------------
    def readinto(self, buf: memoryview) -> int:
        while True:
            if self.closed:
                raise SourceError("read from a closed source", source=self.name)
            try:
                n = self._resp.readinto(buf)
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                self._retry_or_fail(exc, f"connection dropped ({type(exc).__name__}: {exc})")
                self._connect()
                continue
            if n:
                self.received += n
                self._failures = 0
                return n
            if self.total is not None and self.received < self.total:
                # http.client ends quietly when the body is shorter than Content-Length.
                self._drop()
                self._retry_or_fail(None, f"body ended early ({self.received} of {self.total} bytes)")
                self._connect()
                continue
            return 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._drop()

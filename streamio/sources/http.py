"""HTTP(S) sources: streamed, no temporary file, resumed after a dropped connection.

Records flow as their bytes arrive: each read hands over what one ``recv`` brought (up to the
caller's buffer), so a slow but honest server's records are not held back until 1 MiB piles up,
while a fast stream still moves in large reads.

**Deadlines.** Every connection attempt must connect and deliver its response headers within
``open_timeout``. After that a connection is dropped and resumed when it is *silent* for
``read_timeout`` seconds, or *too slow*: fewer than ``low_speed_limit`` bytes/s averaged over the
last ``low_speed_time`` seconds (curl's ``--speed-limit``/``--speed-time``; :class:`LowSpeedMeter`).
Both count as a failed attempt: ``max_retries`` in a row end in a :class:`SourceError`; one that
made real progress first starts a new row (:meth:`HttpSource._made_progress`);
``max_total_retries`` caps all resumes of one transfer, however much each delivered. A host name
that does not resolve is a SourceError at once: its DNS answer will not change in a retry's wait.

**Never splice two versions.** A resumed transfer must continue the *same* object:

- with a strong ``ETag`` (or, failing that, ``Last-Modified``) we resume with ``Range:
  bytes=<received>-`` and ``If-Range: <validator>``; a 206 must carry the right ``Content-Range``
  (and the same ETag); a 200 instead is the whole object again: with the same strong ETag the
  delivered bytes are skipped, otherwise checked as below; a different ETag is an error at once;
- without a strong ETag we keep a running CRC-32 of every delivered byte; a resume without a
  validator re-reads the object from byte 0 (no ``Range``: an unverifiable 206 is worthless),
  checks the re-read prefix against that checksum, and only then goes on. A mismatch (or a
  different ``Content-Length``) is a :class:`SourceError` saying the object changed.

Malformed answers (a ``Content-Length`` of ``²``, a bad chunk size, a redirect to port 99999)
are :class:`SourceError`s naming the URL, never a foreign exception.
"""

from __future__ import annotations

import collections
import http.client
import math
import re
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from typing import Mapping, Optional

from ..errors import SourceError
from ..errors import UsageError
from .base import ByteSource, check_timeout, logger

DEFAULT_MAX_RETRIES = 5
#: Resumes of one transfer in all, however much each delivered: a server that keeps dropping
#: after every megabyte still ends, while a long download on a flaky link has room for many.
DEFAULT_MAX_TOTAL_RETRIES = 100
DEFAULT_BACKOFF = 0.25  # seconds before the first retry; doubles each time, capped below
MAX_BACKOFF = 8.0
#: A connection silent this long is dropped and resumed (the socket timeout of each recv).
DEFAULT_HTTP_TIMEOUT = 60.0
#: Connecting and receiving the response headers must finish within this (per attempt), so a
#: server that accepts and then says nothing, or trickles its headers, cannot hold us.
DEFAULT_OPEN_TIMEOUT = 60.0
#: Slower than 1 KiB/s over 30 s is a broken transfer for training data (at that rate a 1 GB
#: shard would take 12 days), while 30 s rides out a congested moment. curl's --speed-limit /
#: --speed-time semantics; ``low_speed_limit=None`` turns the check off (a slow live feed).
DEFAULT_LOW_SPEED_LIMIT = 1024
DEFAULT_LOW_SPEED_TIME = 30.0
#: A failed connection that delivered this much new data (at no less than the low-speed limit)
#: made real progress and resets the retry count. Tens of KiB: a server that drops every 50 KB
#: still delivers, while 10 bytes per connection (or a trickle) never counts.
PROGRESS_RESET_BYTES = 32 * 1024
MAX_REDIRECTS = 5
_RETRYABLE_STATUS = {500, 502, 503, 504}
_SAMPLE_S = 0.5  # the speed meter keeps at most one sample per this many seconds
_DIGITS = re.compile(r"[0-9]{1,19}\Z", re.ASCII)  # '²'.isdigit() is True, int('²') fails
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,19})-([0-9]{1,19})/([0-9]{1,19}|\*)\Z", re.ASCII)


class _Transient(Exception):
    """A failed attempt to retry (dropped, silent, too slow, 5xx); never leaves this module."""

    def __init__(self, what: str, cause: Optional[BaseException] = None) -> None:
        super().__init__(what)
        self.what = what
        self.cause = cause


class LowSpeedMeter:
    """Tells when a connection's rate over the last ``window`` seconds fell below ``limit`` B/s.

    Time is the caller's clock. :class:`HttpSource` passes the seconds spent *waiting for the
    server* (inside recv), not wall time: a consumer that pauses (a long training step) leaves
    the data in the socket buffer, and that pause must not make the server look slow.

    It keeps (time, bytes so far) samples, at most one per ``_SAMPLE_S``; the baseline of a check
    is the latest sample at least ``window`` old, which can only make the measured rate higher
    (never fails a connection that is fast enough). No verdict before ``window`` has passed.
    """

    def __init__(self, limit: float, window: float, now: float) -> None:
        self.limit = limit
        self.window = window
        self.start = now
        self.total = 0
        self._samples = collections.deque([(now, 0)])

    def add(self, n: int, now: float) -> None:
        self.total += n
        samples = self._samples
        if now - samples[-1][0] >= _SAMPLE_S:
            samples.append((now, self.total))
        # Keep the latest sample that is already window old: older ones can never be a baseline.
        while len(samples) >= 2 and samples[1][0] <= now - self.window:
            samples.popleft()

    def too_slow(self, now: float) -> bool:
        if now - self.start < self.window:
            return False
        base_t, base_bytes = self._samples[0]
        return self.total - base_bytes < self.limit * (now - base_t)

    def deadline(self) -> float:
        """A time by which, if no more bytes come, :meth:`too_slow` is sure to be true."""
        last_t, last_bytes = self._samples[-1]
        return max(self.start + self.window, last_t + self.window,
                   last_t + (self.total - last_bytes) / self.limit) + 0.01


class HttpSource(ByteSource):
    """Streams an ``http://`` or ``https://`` URL, resuming dropped connections (see module doc).

    Backoff between failed attempts doubles from ``backoff`` up to ``MAX_BACKOFF``. With the
    defaults a silent or trickling server ends in a SourceError after about (max_retries + 1) *
    low_speed_time plus the backoff (~190 s).
    """

    def __init__(self, url: str, *, open_timeout: Optional[float] = None,
                 read_timeout: Optional[float] = None,
                 low_speed_limit: Optional[float] = DEFAULT_LOW_SPEED_LIMIT,
                 low_speed_time: float = DEFAULT_LOW_SPEED_TIME,
                 max_retries: int = DEFAULT_MAX_RETRIES,
                 max_total_retries: int = DEFAULT_MAX_TOTAL_RETRIES,
                 backoff: float = DEFAULT_BACKOFF,
                 headers: Optional[Mapping[str, str]] = None, start: int = 0) -> None:
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise UsageError(f"start must be a byte offset >= 0, not {start!r}")
        if max_retries < 0 or max_total_retries < 0:
            raise UsageError("max_retries and max_total_retries must be >= 0")
        check_timeout("low_speed_time", low_speed_time)
        if low_speed_limit is not None and (isinstance(low_speed_limit, bool) or not isinstance(
                low_speed_limit, (int, float)) or not 0 < low_speed_limit < math.inf):
            raise UsageError(f"low_speed_limit must be a positive number of bytes/s or None,"
                             f" not {low_speed_limit!r}")
        self.name = url
        self._url = url
        self._open_timeout = _finite(check_timeout("open_timeout", open_timeout),
                                     DEFAULT_OPEN_TIMEOUT)
        self._timeout = _finite(check_timeout("read_timeout", read_timeout), DEFAULT_HTTP_TIMEOUT)
        self._low_speed_limit = low_speed_limit
        self._low_speed_time = float(low_speed_time)
        self._max_retries = max_retries
        self._max_total_retries = max_total_retries
        self._backoff = backoff
        self._headers = dict(headers or {})
        self._conn: Optional[http.client.HTTPConnection] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self._sock: Optional[socket.socket] = None
        self._meter: Optional[LowSpeedMeter] = None
        self._waited = 0.0  # seconds this connection spent waiting in recv (the meter's clock)
        self._armed = 0.0  # the socket timeout set for the current read
        # ``start``: the body is read from this byte on (a ``Range`` request; see
        # streamio.sources.ranged). ``received`` counts from the object's byte 0.
        self._origin = start
        self._answered = False  # whether a first response was accepted
        self.received = start  # stream offset of the next byte to deliver
        self.total: Optional[int] = None
        self.retries = 0  # resumes done so far (all of them, for statistics)
        self._failures = 0  # failed attempts since the last one that made real progress
        self._etag: Optional[str] = None  # strong ETag of the first response
        self._validator: Optional[str] = None  # what If-Range sends (ETag, else Last-Modified)
        self._crc: Optional[int] = None  # running CRC-32 of delivered bytes (no strong ETag)
        self._skip = 0  # bytes at the start of this response that were delivered already
        self._skip_crc: Optional[int] = None  # CRC-32 of those, when they must be checked
        self._fresh = 0  # new bytes this connection delivered (judged when it fails)
        self._eof = False
        self._connect()

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> None:
        while True:
            try:
                self._attempt()
                return
            except _Transient as exc:
                self._drop()
                self._retry_or_fail(exc)
            except BaseException:
                self._drop()
                raise

    def _attempt(self) -> None:
        url = self._url
        for _ in range(MAX_REDIRECTS + 1):
            conn, resp, sock = self._request(url)
            location = resp.getheader("Location")
            if resp.status in (301, 302, 303, 307, 308) and location:
                conn.close()
                try:
                    url = urllib.parse.urljoin(url, location)
                except ValueError as exc:
                    raise SourceError(f"malformed redirect Location {location!r}",
                                      source=self.name) from exc
                continue
            self._accept(conn, resp, sock)
            return
        raise SourceError(f"more than {MAX_REDIRECTS} redirects (last to {url})", source=self.name)

    def _target(self, url: str):
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port  # ValueError for port 99999 or ':abc'
        except ValueError as exc:
            raise SourceError(f"malformed URL {url!r}: {exc}", source=self.name) from exc
        if parts.scheme not in ("http", "https"):
            raise SourceError(f"unsupported URL scheme {parts.scheme!r} in {url!r}",
                              source=self.name)
        if not parts.hostname:
            raise SourceError(f"no host in URL {url!r}", source=self.name)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        return parts.scheme, parts.hostname, port, path

    def _request_headers(self) -> dict:
        headers = {"Accept-Encoding": "identity", "User-Agent": "streamio", **self._headers}
        if self._answered and self.received and self._validator:
            headers["Range"] = f"bytes={self.received}-"
            headers["If-Range"] = self._validator
        elif not self._answered and self._origin:
            headers["Range"] = f"bytes={self._origin}-"  # no validator yet: the first answer pins it
        # Without a validator a resume re-reads from byte 0 and checks the prefix (module doc).
        return headers

    def _request(self, url: str):
        scheme, host, port, path = self._target(url)
        kwargs = {"timeout": self._open_timeout}  # the body's reads: read_timeout (_arm)
        if scheme == "https":
            kwargs["context"] = ssl.create_default_context()
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        try:
            conn = cls(host, port, **kwargs)
        except (ValueError, http.client.InvalidURL) as exc:
            raise SourceError(f"malformed URL {url!r}: {exc}", source=self.name) from exc
        # One deadline for connecting and the whole header block: a per-recv timeout alone lets a
        # server trickle its headers forever. Shutting the socket down wakes the blocked read.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = conn.sock
            if sock is not None:
                try:  # the plain socket's shutdown, also under TLS (SSLSocket's is not thread-safe)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(self._open_timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            conn.request("GET", path, headers=self._request_headers())
            # getresponse() hands the socket to the response and forgets it when the server
            # will close the connection after the body: keep it to set read timeouts on.
            sock = conn.sock
            resp = conn.getresponse()
        except socket.gaierror as exc:  # before OSError: no retry can make a name resolve
            conn.close()
            raise SourceError(f"cannot resolve host {host!r} ({exc.strerror or exc}); not"
                              " retrying", source=self.name) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if isinstance(exc, http.client.InvalidURL):
                raise SourceError(f"malformed URL {url!r}: {exc}", source=self.name) from exc
            if expired.is_set():
                raise _Transient(f"no response headers within {self._open_timeout:g} s", exc)
            raise _Transient(f"cannot connect ({type(exc).__name__}: {exc})", exc) from exc
        except ValueError as exc:  # non-ASCII in the path or host (UnicodeError)
            conn.close()
            raise SourceError(f"malformed URL {url!r}: {exc}", source=self.name) from exc
        finally:
            timer.cancel()
        if expired.is_set():
            conn.close()
            raise _Transient(f"no response headers within {self._open_timeout:g} s")
        return conn, resp, sock

    def _accept(self, conn, resp, sock) -> None:
        status = resp.status
        self._conn, self._resp, self._sock = conn, resp, sock  # from here on _drop() closes them
        self._skip, self._skip_crc = 0, None  # a 200 on a resume sets them again
        if status in _RETRYABLE_STATUS:
            raise _Transient(f"HTTP {status} {resp.reason}")
        if status >= 400:
            raise SourceError(f"HTTP {status} {resp.reason}", source=self.name)
        length = self._content_length(resp)
        etag = resp.getheader("ETag")
        strong = etag if etag and not etag.startswith("W/") else None
        if not self._answered:
            if status == 206 and self._origin:
                self._check_content_range(resp)
                crange = _CONTENT_RANGE.match(resp.getheader("Content-Range").strip())
                self.total = None if crange.group(3) == "*" else int(crange.group(3))
            elif status != 200:
                raise SourceError(f"unexpected HTTP {status} {resp.reason}", source=self.name)
            else:
                self.total = length
                # A server without ranges sends the whole object: skip to the start.
                self._skip, self._skip_crc = self._origin, None
            self._answered = True
            self._etag = strong
            self._validator = strong or resp.getheader("Last-Modified")
            self._crc = None if strong else 0
        elif status == 206 and self._validator:
            if self._etag and strong != self._etag:
                raise SourceError(f"the object changed while streaming (ETag {self._etag} became"
                                  f" {etag}); not mixing two versions", source=self.name)
            self._check_content_range(resp)
        elif status == 200:
            self._check_whole_again(resp, length, strong)
        else:
            raise SourceError(f"cannot resume at byte {self.received}: unexpected HTTP {status}"
                              f" {resp.reason}", source=self.name)
        self._meter = None
        self._waited = 0.0
        if self._low_speed_limit is not None:
            self._meter = LowSpeedMeter(self._low_speed_limit, self._low_speed_time, 0.0)
        self._armed = 0.0  # a new socket: its timeout is the one it was made with
        self._fresh = 0

    def _content_length(self, resp) -> Optional[int]:
        if resp.chunked:
            return None
        value = resp.getheader("Content-Length")
        if value is None:
            return None
        value = value.strip()
        if not _DIGITS.match(value):
            raise SourceError(f"malformed Content-Length {value!r}", source=self.name)
        return int(value)

    def _check_content_range(self, resp) -> None:
        crange = (resp.getheader("Content-Range") or "").strip()
        m = _CONTENT_RANGE.match(crange)
        if (not m or int(m.group(1)) != self.received
                or (self.total is not None and m.group(3) != "*"
                    and int(m.group(3)) != self.total)):
            raise SourceError(f"resume at byte {self.received} got Content-Range {crange!r}",
                              source=self.name)

    def _check_whole_again(self, resp, length: Optional[int], strong: Optional[str]) -> None:
        """A 200 on a resume: the whole object again, of which ``received`` bytes were delivered."""
        asked = " instead of 206" if self._validator else ""
        if self._etag and strong != self._etag:
            raise SourceError(f"cannot resume at byte {self.received}: the server answered 200"
                              f"{asked} with ETag {strong} (was {self._etag}): the object changed;"
                              " not mixing two versions", source=self.name)
        if self.total is not None and length is not None and length != self.total:
            raise SourceError(f"cannot resume at byte {self.received}: the server answered 200"
                              f"{asked} with Content-Length {length} (was {self.total}): the"
                              " object changed; not mixing two versions", source=self.name)
        # Same strong ETag: the same bytes, skip them. Otherwise re-read and check them.
        self._skip = self.received
        self._skip_crc = None if self._etag else 0

    def _made_progress(self) -> bool:
        """Whether the connection that just failed made real progress, which starts a new row of
        ``max_retries``: it delivered at least ``PROGRESS_RESET_BYTES`` of new data, at an average
        of at least ``low_speed_limit`` bytes/s over the time it spent waiting for the server
        (its final silence included). So a server that drops every 50 KB of an object still
        delivers all of it, while one that sends 10 bytes per connection and drops, or trickles,
        or goes silent, cannot keep us reconnecting. One whose every connection does bring its
        32 KiB at the speed limit is slow, not stuck: ``max_total_retries`` ends it."""
        if self._fresh < PROGRESS_RESET_BYTES:
            return False
        return self._low_speed_limit is None or self._fresh >= self._low_speed_limit * self._waited

    def _retry_or_fail(self, exc: _Transient) -> None:
        if self._made_progress():
            self._failures = 0
        self._fresh, self._waited = 0, 0.0  # a failed connect must not count them again
        self._failures += 1
        where = f" at byte {self.received}" + (f" of {self.total}" if self.total else "")
        if self._failures > self._max_retries:
            raise SourceError(f"{exc.what}{where}; gave up after {self._max_retries} retries",
                              source=self.name) from exc.cause
        if self.retries >= self._max_total_retries:
            raise SourceError(f"{exc.what}{where}; gave up after {self.retries} resumes in all",
                              source=self.name) from exc.cause
        self.retries += 1
        pause = min(MAX_BACKOFF, self._backoff * 2 ** (self._failures - 1))
        # A resume is a wait the user should hear of (a link that flaps, a server that drops):
        # one line each, saying what failed, where, and how much of the budget is left.
        logger.warning("%s: %s%s; resuming in %.2f s (failure %d of %d in a row, resume %d of"
                       " %d in all)", self.name, exc.what, where, pause, self._failures,
                       self._max_retries + 1, self.retries, self._max_total_retries)
        time.sleep(pause)

    def _drop(self) -> None:
        if self._resp is not None:
            self._resp.close()
        if self._conn is not None:
            self._conn.close()
        self._conn = self._resp = self._sock = None

    # -- ByteSource ---------------------------------------------------------------------------
    def readinto(self, buf: memoryview) -> int:
        if self.closed:
            raise SourceError("read from a closed source", source=self.name)
        while not self._eof:
            try:
                n = self._read_some(buf)
            except _Transient as exc:
                self._drop()
                self._retry_or_fail(exc)
                self._connect()
                continue
            if n:
                return n
        return 0

    def _read_some(self, buf: memoryview) -> int:
        """Deliver what one read brings (0 if it only re-read delivered bytes); handle the end."""
        want = min(len(buf), self._skip) if self._skip else len(buf)
        data = self._recv(want)
        if not data:
            if self._skip or (self.total is not None and self.received < self.total):
                # http.client ends quietly when the body is shorter than Content-Length.
                got = self.received - self._skip
                raise _Transient(f"body ended early ({got} of {self.total} bytes)")
            self._eof = True
            self._drop()
            return 0
        n = len(data)
        if self._skip:
            at = self.received - self._skip  # stream offset of data[0]
            self._skip -= n
            if self._skip_crc is not None:
                # The running CRC covers the delivered bytes: those from the start offset on.
                self._skip_crc = zlib.crc32(data[max(self._origin - at, 0):], self._skip_crc)
                if not self._skip and self._skip_crc != self._crc:
                    raise SourceError(f"cannot resume at byte {self.received}: the first"
                                      f" {self.received} bytes read again differ from those"
                                      " delivered: the object changed; not mixing two versions",
                                      source=self.name)
            return 0
        buf[:n] = data
        self.received += n
        if self._crc is not None:
            self._crc = zlib.crc32(data, self._crc)
        self._fresh += n
        return n

    def _recv(self, want: int) -> bytes:
        meter = self._meter
        slow_first = False
        if meter is not None:
            # Wake by the speed verdict if it comes before the stall timeout.
            left = meter.deadline() - self._waited
            slow_first = left < self._timeout
            self._arm(max(0.001, min(left, self._timeout)))
        else:
            self._arm(self._timeout)
        t0 = time.monotonic()
        try:
            data = self._resp.read1(want)  # what is there now, up to want: one recv at most
        except TimeoutError as exc:
            if meter is not None:  # the silence counts against this connection's average rate
                self._waited += time.monotonic() - t0
            if slow_first:
                raise self._too_slow(exc)
            raise _Transient(f"no data for {self._timeout:g} s", exc) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(f"connection dropped ({type(exc).__name__}: {exc})", exc) from exc
        except ValueError as exc:  # http.client: a chunk size that is not hex
            raise SourceError(f"malformed chunked body at byte {self.received}: {exc}",
                              source=self.name) from exc
        if meter is not None:
            self._waited += time.monotonic() - t0
            meter.add(len(data), self._waited)
            if data and meter.too_slow(self._waited):
                raise self._too_slow(None)
        return data

    def _too_slow(self, cause: Optional[BaseException]) -> _Transient:
        return _Transient(f"slower than {self._low_speed_limit:g} bytes/s over the last"
                          f" {self._low_speed_time:g} s", cause)

    def _arm(self, timeout: float) -> None:
        # settimeout is a syscall: skip it when the value barely changed.
        if abs(timeout - self._armed) > 0.05 and self._sock is not None:
            self._sock.settimeout(timeout)
            self._armed = timeout

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._drop()


def _finite(value: Optional[float], default: float) -> float:
    if value is None:
        return default
    return value if math.isfinite(value) else 365 * 24 * 3600.0  # "forever", as a socket sees it


__all__ = ["DEFAULT_BACKOFF", "DEFAULT_HTTP_TIMEOUT", "DEFAULT_LOW_SPEED_LIMIT",
           "DEFAULT_LOW_SPEED_TIME", "DEFAULT_MAX_RETRIES", "DEFAULT_MAX_TOTAL_RETRIES",
           "DEFAULT_OPEN_TIMEOUT", "HttpSource", "LowSpeedMeter", "PROGRESS_RESET_BYTES"]

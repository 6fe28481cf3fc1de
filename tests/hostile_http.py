"""A real HTTP/1.1 server on 127.0.0.1 (stdlib ``http.server``, in a thread) that misbehaves.

Each path is a :class:`Route` saying how to misbehave::

    with HostileHTTPServer() as server:
        url = server.add("/slow", data, drip=(1, 1.0))           # 1 byte per second
        url = server.add("/liar", data, content_length="\u00b2")  # Content-Length: ²
        url = server.add("/v", versions=[a, b], etag=False, last_modified=False, drop_after=[3000])

Behaviours (all optional, combinable):

- ``versions``: the object served to the k-th request is ``versions[min(k, len - 1)]`` (the
  object changes between connections); ``etag`` / ``weak_etag`` / ``last_modified`` send (or
  not) validators derived from the version served;
- ``ranges``: honour ``Range`` + ``If-Range`` with 206 (default) or always answer 200;
- ``drip=(n, seconds)``: send ``n`` bytes, sleep, repeat; ``pieces=[...]`` sends these byte counts
  and, with ``lockstep=True``, waits after each piece until the test calls :meth:`release`;
- ``stall_after=K`` (with ``stall`` seconds, default: until the server stops): go silent after K
  body bytes, connection open; ``drop_after=K`` or a list (one per request, then none): close the
  connection after K body bytes; ``silent=True``: accept, read the request, never answer;
  ``header_drip``: send the status line and headers one byte per this many seconds;
- ``content_length``: ``True`` (the truth, default), ``None`` (omit: the body ends at close), an
  int (a lie: too long or too short) or any raw string (``"\u00b2"``, ``"-5"``);
- ``chunked=True``: chunked transfer coding; ``bad_chunk=True`` sends a chunk size that is not hex;
- ``status`` with ``body`` (an HTML error page, say); ``redirect=LOCATION`` answers 302;
- ``headers``: extra raw headers.

``server.requests`` lists ``(path, headers)`` of every request, for assertions. Every sleep
wakes when the server stops, so no test leaves a thread behind.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union


@dataclass
class Route:
    versions: Sequence[bytes] = (b"",)
    etag: bool = True
    weak_etag: bool = False
    last_modified: bool = True
    ranges: bool = True
    drip: Optional[tuple] = None
    pieces: Optional[Sequence[int]] = None
    lockstep: bool = False
    lockstep_wait: float = 10.0
    stall_after: Optional[int] = None
    stall: Optional[float] = None
    drop_after: Union[None, int, list] = None
    silent: bool = False
    header_drip: Optional[float] = None
    content_length: Any = True
    chunked: bool = False
    bad_chunk: bool = False
    status: Optional[int] = None
    body: Optional[bytes] = None
    redirect: Optional[str] = None
    headers: dict = field(default_factory=dict)
    served: int = 0  # requests answered so far
    released: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    lockstep_timeouts: int = 0  # times a lockstep wait ran out (the client did not keep up)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):  # noqa: C901 - one switch over the behaviours, read top to bottom
        server = self.server
        server.requests.append((self.path, dict(self.headers)))
        route = server.routes.get(self.path)
        if route is None:
            self._raw(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        k = route.served
        route.served += 1
        if route.silent:
            server.stopping.wait()
            self.close_connection = True
            return
        if route.redirect is not None:
            self._head(302, {"Location": route.redirect, "Content-Length": "0"}, route)
            return
        if route.status is not None:
            body = route.body or b""
            self._head(route.status, {"Content-Type": "text/html",
                                      "Content-Length": str(len(body))}, route)
            self._raw(body)
            return
        data = route.versions[min(k, len(route.versions) - 1)]
        version = min(k, len(route.versions) - 1)
        etag = '"' + hashlib.md5(data).hexdigest() + '"'
        if route.weak_etag:
            etag = "W/" + etag
        modified = email.utils.formatdate(1_000_000_000 + 3600 * version, usegmt=True)
        validator_now = {etag if route.etag else None, modified if route.last_modified else None}
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and route.ranges:
            if_range = self.headers.get("If-Range")
            if if_range is None or if_range in validator_now - {None}:
                start = int(rng.split("=")[1].split("-")[0])
                status = 206
                if start >= len(data):
                    self._head(416, {"Content-Range": f"bytes */{len(data)}",
                                     "Content-Length": "0"}, route)
                    return
        body = data[start:]
        headers = {"Accept-Ranges": "bytes" if route.ranges else "none"}
        if route.etag:
            headers["ETag"] = etag
        if route.last_modified:
            headers["Last-Modified"] = modified
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if route.chunked:
            headers["Transfer-Encoding"] = "chunked"
        elif route.content_length is True:
            headers["Content-Length"] = str(len(body))
        elif route.content_length is not None:
            value = route.content_length
            headers["Content-Length"] = str(value - start if isinstance(value, int) else value)
        if route.content_length is None and not route.chunked:
            headers["Connection"] = "close"
        self._head(status, headers, route)
        self._body(route, k, body)

    # -- pieces -------------------------------------------------------------------------------
    def _raw(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:  # the client went away: that is its right
            self.close_connection = True
            return False

    def _head(self, status: int, headers: dict, route: Route) -> None:
        reason = http.server.BaseHTTPRequestHandler.responses.get(status, ("Whatever",))[0]
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in
                                                    {**headers, **route.headers}.items()]
        block = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")
        if route.header_drip is None:
            self._raw(block)
            return
        for i in range(len(block)):
            if not self._raw(block[i:i + 1]) or self.server.stopping.wait(route.header_drip):
                self.close_connection = True
                return

    def _body(self, route: Route, k: int, body: bytes) -> None:
        cut = route.drop_after
        if isinstance(cut, list):
            cut = cut[k] if k < len(cut) else None
        sizes = self._sizes(route, len(body))
        pos = 0
        for i, size in enumerate(sizes):
            piece = body[pos:pos + size]
            if cut is not None and pos + len(piece) >= cut:
                self._send(route, body[pos:cut])
                self._drop()
                return
            if route.stall_after is not None and pos + len(piece) >= route.stall_after:
                self._send(route, body[pos:route.stall_after])
                self.server.stopping.wait(route.stall)
                self._drop()
                return
            if not self._send(route, piece):
                return
            pos += len(piece)
            if route.lockstep and i < len(sizes) - 1:
                if not route.released.acquire(timeout=route.lockstep_wait):
                    route.lockstep_timeouts += 1
            elif route.drip and pos < len(body):
                if self.server.stopping.wait(route.drip[1]):
                    return
        if route.chunked:
            self._raw(b"0\r\n\r\n")
        if route.content_length is None and not route.chunked:
            self._drop()

    def _sizes(self, route: Route, n: int) -> list:
        if route.pieces is not None:
            return list(route.pieces)
        step = route.drip[0] if route.drip else max(n, 1)
        return [step] * (-(-n // step))

    def _send(self, route: Route, piece: bytes) -> bool:
        if not piece:
            return True
        if route.bad_chunk:
            return self._raw(b"\xb2z\r\n" + piece + b"\r\n")
        if route.chunked:
            return self._raw(b"%x\r\n" % len(piece) + piece + b"\r\n")
        return self._raw(piece)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address):
        pass  # a client hanging up on a hostile server is the expected case, not news


class HostileHTTPServer:
    """Serves :class:`Route` s on 127.0.0.1 from a thread; a context manager that stops cleanly.
    ``host``/``port``: where to listen instead (the multi-host harness's storage host serves its
    link's address, tests/multihost/)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._server = _Server((host, port), _Handler)
        self._server.routes = {}
        self._server.requests = []
        self._server.stopping = threading.Event()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def requests(self) -> list:
        return self._server.requests

    def url(self, path: str) -> str:
        return f"http://{self._host}:{self.port}{path}"

    def add(self, path: str, data: bytes = b"", **behaviour: Any) -> str:
        """Serve ``data`` (or ``versions=[...]``) at ``path``, misbehaving as told; its URL."""
        if "versions" not in behaviour:
            behaviour["versions"] = [data]
        self._server.routes[path] = Route(**behaviour)
        return self.url(path)

    def route(self, path: str) -> Route:
        return self._server.routes[path]

    def release(self, path: str) -> None:
        """Let a ``lockstep`` route send its next piece."""
        self._server.routes[path].released.release()

    def start(self) -> "HostileHTTPServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> "HostileHTTPServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def closed_port() -> int:
    """A local port with nothing listening (bound, then closed): 'connection refused'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


__all__ = ["HostileHTTPServer", "Route", "closed_port"]

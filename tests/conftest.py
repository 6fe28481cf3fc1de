"""Shared real parts for the tests: FIFOs fed by another process, a local HTTP server."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
PEER = ROOT.parent / "shared" / "peer-fixtures"
SCRIPTS = Path(__file__).resolve().parent / "scripts"

sys.path.insert(0, str(ROOT))  # `from fixtures.make_fixtures import payloads`


def pytest_configure(config):
    # `pytest -m cuda` runs only the GPU tests (benchmarks/device_check.sh); without CUDA they
    # skip, saying so.
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")


def peer(relpath: str) -> str:
    path = PEER / relpath
    if not path.exists():
        pytest.skip(f"peer fixture {relpath} not present (expected in ../shared/peer-fixtures)")
    return str(path)


class FifoFeeder:
    """Creates FIFOs in a temp dir and feeds them from writer subprocesses."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    def make(self, data: bytes, *pieces: int, name: str = "pipe", delay_first: float = 0.0,
             stall_after: int = -1, stall: float = 0.0, create: bool = True) -> str:
        src = self.tmp_path / f"{name}.src"
        src.write_bytes(data)
        fifo = self.tmp_path / name
        if create:
            os.mkfifo(fifo)
        self.start(str(fifo), str(src), *pieces, delay_first=delay_first,
                   stall_after=stall_after, stall=stall)
        return str(fifo)

    def start(self, fifo: str, src: str, *pieces: int, delay_first: float = 0.0,
              stall_after: int = -1, stall: float = 0.0) -> subprocess.Popen:
        cmd = [sys.executable, str(SCRIPTS / "fifo_writer.py"), fifo, src, *map(str, pieces),
               "--delay-first", str(delay_first), "--stall-after", str(stall_after),
               "--stall", str(stall)]
        proc = subprocess.Popen(cmd)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def fifo(tmp_path):
    feeder = FifoFeeder(tmp_path)
    yield feeder
    feeder.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        server = self.server
        obj = server.objects.get(self.path)
        server.requests.append((self.path, dict(self.headers)))
        if obj is None:
            self.send_error(404, "no such object")
            return
        data, etag = obj["data"], obj["etag"]
        start = 0
        status = 200
        rng = self.headers.get("Range")
        if rng and obj.get("ranges", True):
            if_range = self.headers.get("If-Range")
            if if_range is None or if_range == etag:
                start = int(rng.split("=")[1].split("-")[0])
                status = 206
        body = data[start:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        drops = obj.get("drops", [])
        # Drop the connection after sending `cut` bytes, for the first len(drops) responses.
        cut = drops.pop(0) if drops else None
        if obj.get("replace_after_first"):
            new = obj.pop("replace_after_first")
            obj["data"], obj["etag"] = new, '"' + hashlib.md5(new).hexdigest() + '"'
        if cut is not None and cut < len(body):
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


class LocalHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict = {}
        self.requests: list = []

    def handle_error(self, request, client_address):
        # Tests drop connections on purpose and readers hang up early: a reset or broken pipe
        # in a handler is expected, not news (socketserver would print it to stderr, outside
        # any test's captured output). Anything else is still printed.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def put(self, path: str, data: bytes, *, drops=(), ranges=True, replace_after_first=None) -> str:
        self.objects[path] = {"data": data, "etag": '"' + hashlib.md5(data).hexdigest() + '"',
                              "drops": list(drops), "ranges": ranges,
                              "replace_after_first": replace_after_first}
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


@pytest.fixture
def http_server():
    server = LocalHTTPServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# `HYPOTHESIS_PROFILE=stress pytest tests/formats/test_formats.py` runs many more examples (bug
# hunting); the default keeps CI quick; `quick` is for slow builds (CI's sanitized run, .ci/run).
from hypothesis import settings as _hsettings  # noqa: E402

_hsettings.register_profile("default", max_examples=150, deadline=None)
_hsettings.register_profile("stress", max_examples=3000, deadline=None)
_hsettings.register_profile("quick", max_examples=25, deadline=None)
_hsettings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

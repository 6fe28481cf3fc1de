"""HTTP: ``open_timeout`` is the deadline for connecting and receiving the response headers,
``read_timeout`` only for the body's reads after them (the contract in sources/http.py and
ARCHITECTURE.md). Found by the multi-host harness (tests/multihost/): its storage host hashes a
200 MB object for the ETag before it answers, and with ``read_timeout=2, open_timeout=30``
every attempt failed after 2 s as "cannot connect (TimeoutError)": the header wait used
``min(open_timeout, read_timeout)`` as the socket timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from streamio.errors import SourceError
from streamio.sources import HttpSource

from hang_guard import bounded

BODY = b"x" * 5000


@pytest.fixture
def slow_headers():
    """A real server on 127.0.0.1 that reads each request, says nothing for 1 s, then answers
    in full (as a server that computes an ETag over a large object first)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            with conn:
                conn.recv(65536)
                time.sleep(1.0)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: \"v1\"\r\n"
                             b"Connection: close\r\n\r\n" % len(BODY) + BODY)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/obj"
    stop.set()
    thread.join(5)
    listener.close()


def _read_all(source):
    chunks = []
    buf = memoryview(bytearray(65536))
    with source:
        while True:
            n = source.readinto(buf)
            if n == 0:
                return b"".join(chunks)
            chunks.append(bytes(buf[:n]))


def test_headers_slower_than_read_timeout_but_within_open_timeout_are_waited_for(slow_headers):
    def read():  # the source connects when it is made
        return _read_all(HttpSource(slow_headers, open_timeout=10, read_timeout=0.3,
                                    max_retries=1, backoff=0.01))
    assert bounded(read, 30) == BODY


def test_headers_later_than_open_timeout_still_fail_after_it(slow_headers):
    def read():
        return _read_all(HttpSource(slow_headers, open_timeout=0.3, read_timeout=5,
                                    max_retries=1, backoff=0.01))
    with pytest.raises(SourceError, match="no response headers within 0.3 s"):
        bounded(read, 30)

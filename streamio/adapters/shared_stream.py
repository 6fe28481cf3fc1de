"""One stream shared by several readers: one process frames it, every reader decodes its share.

A FIFO, a :class:`~streamio.PipeChannel` or stdin can be read by one process only. When
``DataLoader(ds.to_torch(), num_workers=k)`` reads one, worker 0 starts a **dealer** thread that
opens the stream, frames it (the usual :class:`~streamio.RecordReader` loop) and cuts the records
into blocks of at most :data:`BLOCK_RECORDS` records and :data:`BLOCK_BYTES` bytes. Every worker
(worker 0 too) is a **client**: it connects to the dealer over a Unix socket and asks for a
block each time it needs one; the dealer answers requests in the order they arrive, from blocks
it framed ahead. Each block goes
to exactly one worker, and each worker runs the rest of the pipeline (shuffle, batch, decoder,
``map``) on its blocks, so decoding runs on ``k`` cores while the stream is read once.

Why pull, not round-robin: a DataLoader asks its workers for items in turn, and a worker that is
not asked does not read. A dealer that pushed block ``i`` to worker ``i % k`` would wait on a
worker the DataLoader is not asking while the DataLoader waits for another worker that needs
that block: a deadlock as soon as workers need different numbers of blocks per batch (a filter,
a shuffle buffer filling). A dealer that only answers requests never waits on a worker that is
not waiting for it (which is also why a worker asks only when it is about to read: a block asked
for ahead may not fit the socket's buffer, and sending it would wait on that worker). The price: which worker gets which block depends on timing, so the order of
batches (and a shuffle's order) is not reproducible from run to run; ``map(seed=...)`` keys record
seeds on the record itself, so random transforms are.

Memory: the dealer reads at most :data:`READ_AHEAD` blocks ahead of the requests; each client has
at most one block in flight; each worker's shuffle buffer holds its own share (a ``shuffle(n)`` costs ``n`` records in *each* worker).

Stats: worker 0's ``stats()`` counts what the dealer read (``bytes``, ``records_read``, ...);
every worker counts the records and batches it delivered. A ``map(backend="process")`` cannot
start processes inside a DataLoader worker (daemonic): use threads there, the workers are the
processes.

Failure: every side ends the epoch with an error, never a hang.

- A worker that dies (its socket closes without saying goodbye): the dealer raises a
  :class:`~streamio.errors.SourceError` naming the worker, sends it to every other worker, and
  each raises it (so does the DataLoader, which also reports the dead worker itself).
- Worker 0 (the dealer) dies or stops early: every other worker's socket closes, and each
  raises a :class:`~streamio.errors.SourceError` saying the stream's reader stopped.
- The stream is bad (a ``FormatError``) or fails (a ``SourceError``): every worker gets the
  records before the fault, then raises the same error.
- A worker that never connects (it failed to start): the dealer gives up after
  ``connect_timeout`` seconds with an error to the others.

Several ranks of one host (torchrun) could share one FIFO the same way; what that needs is said
in ``ARCHITECTURE.md`` (the dealer address derived from the FIFO's path rather than a token, the
local rank 0's worker 0 as dealer, and the clients counted as local ranks x workers).
"""

from __future__ import annotations

import collections
import os
import pickle
import selectors
import socket
import struct
import sys
import tempfile
import threading
import time
from typing import Any, Iterator, Optional

import numpy as np

from ..errors import SourceError, StreamioError
from ..pipeline.dataset import _INDEX_BITS
from ..reader import RecordReader

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "DEFAULT_CONNECT_TIMEOUT", "READ_AHEAD",
           "SharedStreamFeed"]

#: Records per block: small enough that k workers share a stream of short epochs evenly, large
#: enough that one request per block costs little next to decoding its records.
BLOCK_RECORDS = 64
#: A block is closed at this many bytes (64 image records of ~100 KB are ~6 MB).
BLOCK_BYTES = 8 << 20
#: Blocks the dealer frames ahead of the requests (bounds its memory to ~READ_AHEAD blocks).
READ_AHEAD = 4
#: How long the dealer waits for every worker to connect, and a worker for the dealer: workers
#: start one after another (spawned ones import torch), which can take tens of seconds.
DEFAULT_CONNECT_TIMEOUT = 120.0
_POLL_S = 0.2  # how often a waiting dealer looks at its deadlines and stop flag

# Dealer -> client: kind, record count, origin of the first record, payload bytes; a block's
# payload is the source name's length (u32) and name, the record lengths (u64 each), the records.
_HEADER = struct.Struct("<BxxxIQQ")
_BLOCK, _END, _ERROR = 1, 2, 3
# Client -> dealer: hello (worker, num_workers), then one byte per request, and a goodbye.
_HELLO = struct.Struct("<II")
_WANT, _BYE = b"W", b"B"


def dealer_address(token: str, epoch: int) -> Any:
    """Where the dealer of ``epoch`` listens: a Linux abstract socket (no file to clean up,
    gone with the process), elsewhere a socket file in the temp directory."""
    name = f"streamio-{token}-{epoch}"
    if sys.platform.startswith("linux"):
        return "\0" + name
    return os.path.join(tempfile.gettempdir(), name + ".sock")


class _Lost(Exception):
    """A client's socket closed before its last block (internal)."""


class _Client:
    __slots__ = ("sock", "worker", "inbox", "wants", "finished")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.worker: Optional[int] = None
        self.inbox = b""
        self.wants = 0
        self.finished = False  # got its END/ERROR, or said goodbye


class _Dealer(threading.Thread):
    """Frames the stream and answers the clients' requests (a daemon thread in worker 0)."""

    def __init__(self, dataset: Any, address: Any, num_workers: int, stats: Any,
                 connect_timeout: float) -> None:
        super().__init__(name="streamio-dealer", daemon=True)
        self.dataset = dataset
        self.num_workers = num_workers
        self.stats = stats
        self.connect_timeout = connect_timeout
        self.stop_now = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if isinstance(address, str) and not address.startswith("\0") and os.path.exists(address):
            os.unlink(address)  # a socket file left by a process that died
        self.address = address
        self.listener.bind(address)
        self.listener.listen(num_workers)
        self.listener.setblocking(False)
        self.stream_name = "the shared stream"

    # -- the stream ---------------------------------------------------------------------------
    def _blocks(self) -> Iterator[tuple]:
        """(source name, origin of the first record, records) of at most BLOCK_RECORDS records
        and about BLOCK_BYTES bytes, within one source."""
        ds = self.dataset
        for ordinal in ds._selection:
            reader = RecordReader(ds._all_sources[ordinal], ds._format, **ds._reader_options)
            self.stats.reader_opened(reader.stats)
            try:
                # Records gather across the reader's chunks (a 1 MiB read holds ~10 image
                # records): a block of 64 costs one request where 7 small ones would cost 7
                # round trips, each a wake-up of a thread on a busy machine.
                first = 0  # index in this source of pending[0]
                pending: list = []
                size = 0
                try:
                    for records in reader.record_lists():
                        self.stream_name = reader.source_name
                        for record in records:
                            pending.append(record)
                            size += len(record)
                            if len(pending) >= BLOCK_RECORDS or size >= BLOCK_BYTES:
                                yield (reader.source_name, (ordinal << _INDEX_BITS) + first,
                                       pending)
                                first += len(pending)
                                pending, size = [], 0
                except Exception:
                    if pending:  # the records before a fault are delivered first
                        yield reader.source_name, (ordinal << _INDEX_BITS) + first, pending
                    raise
                if pending:
                    yield reader.source_name, (ordinal << _INDEX_BITS) + first, pending
            finally:
                reader.close()
                self.stats.reader_closed(reader.stats)

    # -- serving ------------------------------------------------------------------------------
    def run(self) -> None:
        clients: list[_Client] = []
        try:
            self._serve(clients)
        except BaseException as exc:  # noqa: BLE001 - every client is told, then we stop
            if isinstance(exc, _Lost):
                worker = exc.args[0]
                exc = SourceError(
                    f"DataLoader worker {worker} left {self.stream_name} before the end of the"
                    " epoch (it died or stopped early): the records it held cannot be delivered",
                    source=self.stream_name)
            elif not isinstance(exc, StreamioError):
                exc = SourceError(f"the dealer of {self.stream_name} failed: {exc!r}",
                                  source=self.stream_name)
            payload = _pickled(exc)
            for client in clients:
                if not client.finished:
                    try:
                        client.sock.sendall(_HEADER.pack(_ERROR, 0, 0, len(payload)) + payload)
                    except OSError:
                        pass
        finally:
            self.listener.close()
            if isinstance(self.address, str) and not self.address.startswith("\0"):
                try:
                    os.unlink(self.address)
                except OSError:
                    pass
            for client in clients:
                client.sock.close()

    def _serve(self, clients: list) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        deadline = time.monotonic() + self.connect_timeout
        blocks = self._blocks()
        ready: collections.deque = collections.deque()
        waiting: collections.deque = collections.deque()  # one entry per request
        exhausted = False
        failure: Optional[BaseException] = None
        try:
            while not self.stop_now.is_set():
                greeted = sum(c.worker is not None for c in clients)
                if exhausted and greeted == self.num_workers and all(c.finished for c in clients):
                    return
                if greeted < self.num_workers and time.monotonic() > deadline:
                    raise SourceError(f"only {greeted} of {self.num_workers} DataLoader workers"
                                      f" connected to {self.stream_name} within"
                                      f" {self.connect_timeout:g} s", source=self.stream_name)
                reading = not exhausted and len(ready) < READ_AHEAD
                for key, _ in selector.select(0 if reading else _POLL_S):
                    if key.fileobj is self.listener:
                        self._accept(selector, clients)
                    else:
                        self._hear(key.data, waiting)
                while waiting and (ready or exhausted):
                    client = waiting.popleft()
                    if client.finished:
                        continue
                    if ready:
                        self._send_block(client, ready.popleft(), waiting)
                    else:
                        self._send_last(client, failure, waiting)
                if reading:
                    try:
                        ready.append(next(blocks))
                    except StopIteration:
                        exhausted = True
                    except Exception as exc:  # noqa: BLE001 - sent to every client in turn
                        failure = exc
                        exhausted = True
        finally:
            blocks.close()
            selector.close()

    def _accept(self, selector: selectors.BaseSelector, clients: list) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(True)
            client = _Client(sock)
            clients.append(client)
            selector.register(sock, selectors.EVENT_READ, client)

    def _hear(self, client: _Client, waiting: collections.deque) -> None:
        try:
            data = client.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            if not client.finished:
                raise _Lost(client.worker)
            return
        self._parse(client, data, waiting)

    def _parse(self, client: _Client, data: bytes, waiting: collections.deque) -> None:
        inbox = client.inbox + data
        if client.worker is None:
            if len(inbox) < _HELLO.size:
                client.inbox = inbox
                return
            client.worker, _ = _HELLO.unpack_from(inbox)
            inbox = inbox[_HELLO.size:]
        client.inbox = b""
        for byte in inbox:
            if byte == _WANT[0]:
                waiting.append(client)
            elif byte == _BYE[0]:
                client.finished = True

    def _send(self, client: _Client, message: bytes, waiting: collections.deque) -> None:
        try:
            client.sock.sendall(message)
        except OSError:
            # Gone: fine if it said goodbye (a worker that stopped early), else it died.
            try:
                client.sock.setblocking(False)
                self._parse(client, client.sock.recv(4096), waiting)
            except OSError:
                pass
            if not client.finished:
                raise _Lost(client.worker) from None

    def _send_block(self, client: _Client, block: tuple, waiting: collections.deque) -> None:
        name, first, records = block
        encoded = name.encode("utf-8", "replace")
        lengths = np.fromiter(map(len, records), np.uint64, len(records)).tobytes()
        payload = b"".join([struct.pack("<I", len(encoded)), encoded, lengths, *records])
        self._send(client, _HEADER.pack(_BLOCK, len(records), first, len(payload)) + payload,
                   waiting)

    def _send_last(self, client: _Client, failure: Optional[BaseException],
                   waiting: collections.deque) -> None:
        if failure is None:
            message = _HEADER.pack(_END, 0, 0, 0)
        else:
            payload = _pickled(failure)
            message = _HEADER.pack(_ERROR, 0, 0, len(payload)) + payload
        self._send(client, message, waiting)
        client.finished = True


def _pickled(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an exception that does not pickle is described
        return pickle.dumps(SourceError(f"{type(exc).__name__}: {exc}"))


def _recv_exact(sock: socket.socket, n: int) -> Optional[bytearray]:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:])
        except ConnectionError:  # reset: the dealer's process died with our bytes unread
            return None
        if k == 0:
            return None
        got += k
    return buf


def _connect(address: Any, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise SourceError(f"could not reach the DataLoader worker that reads the shared"
                                  f" stream (worker 0) within {timeout:g} s: it did not start,"
                                  " or it already stopped") from None
            time.sleep(0.01)  # worker 0 has not bound its socket yet


class SharedStreamFeed:
    """The source end of one worker's epoch over a shared stream.

    Called by the pipeline in place of reading the sources (``run`` is the epoch's state); yields
    ``(records, ids)`` blocks like the readers do, ``ids`` being the records' stream origins.
    Worker 0 also runs the dealer.
    """

    def __init__(self, dataset: Any, *, token: str, epoch: int, worker: int, num_workers: int,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
        self.dataset = dataset  # the Dataset whose sources the dealer reads
        self.address = dealer_address(token, epoch)
        self.worker = worker
        self.num_workers = num_workers
        self.connect_timeout = connect_timeout

    def __call__(self, run: Any) -> Iterator[tuple]:
        dealer = None
        if self.worker == 0:
            dealer = _Dealer(self.dataset, self.address, self.num_workers, run.stats,
                             self.connect_timeout)
            dealer.start()
        ended = False
        sock = None
        try:
            sock = _connect(self.address, self.connect_timeout)
            sock.sendall(_HELLO.pack(self.worker, self.num_workers))
            while True:
                # Ask only when about to read: a block asked for ahead could be larger than the
                # socket's buffer, and the dealer would block sending it to a worker that the
                # DataLoader is not asking for items while it waits on another worker, which
                # waits on the dealer (a deadlock this once had). The dealer's read-ahead keeps
                # the answer quick.
                try:
                    sock.sendall(_WANT)
                except OSError:
                    pass  # the dealer is gone: the read below says so
                block = self._receive(sock)
                if block is None:
                    ended = True
                    return
                name, first, records = block
                run.names[first >> _INDEX_BITS] = name
                ids = (np.arange(first, first + len(records), dtype=np.int64)
                       if run.track_ids else None)
                yield records, ids
        finally:
            if sock is not None:
                if not ended:
                    try:
                        sock.sendall(_BYE)
                    except OSError:
                        pass
                sock.close()
            if dealer is not None:
                if not ended:
                    dealer.stop_now.set()  # worker 0 owns the stream: its early exit ends it
                dealer.join()

    def _receive(self, sock: socket.socket) -> Optional[tuple]:
        header = _recv_exact(sock, _HEADER.size)
        if header is None:
            raise SourceError("the DataLoader worker that reads the shared stream (worker 0)"
                              " stopped before the end of the epoch (it died, or its loop"
                              " ended early)")
        kind, count, first, size = _HEADER.unpack(header)
        payload = _recv_exact(sock, size) if size else bytearray()
        if payload is None:
            raise SourceError("the DataLoader worker that reads the shared stream (worker 0)"
                              " stopped in the middle of a block")
        if kind == _END:
            return None
        if kind == _ERROR:
            raise pickle.loads(payload)
        view = memoryview(payload)
        (name_len,) = struct.unpack_from("<I", view)
        name = bytes(view[4:4 + name_len]).decode("utf-8")
        pos = 4 + name_len
        lengths = np.frombuffer(view[pos:pos + 8 * count], np.uint64).tolist()
        pos += 8 * count
        records = []
        for length in lengths:
            records.append(bytes(view[pos:pos + length]))
            pos += length
        return name, first, records

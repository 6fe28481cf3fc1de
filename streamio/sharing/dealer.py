"""The dealer of a shared stream: one thread that reads the stream and deals its blocks.

It runs in local rank 0's DataLoader worker 0 (:class:`~streamio.sharing.stream.SharedStreamFeed`
starts it), reads the Dataset's sources through the pipeline's seam
(:meth:`streamio.pipeline.EpochRun.for_sources`) and answers every worker's requests over
private local sockets (:mod:`._local_ipc`, :mod:`._wire`); the promises are stated in
:mod:`streamio.sharing.stream`.
"""

from __future__ import annotations

import collections
import os
import selectors
import socket
import threading
import time
import warnings
from typing import Any, Iterator, Optional

import numpy as np

from ..errors import SourceError, StreamioError
from ..pipeline import EpochRun, origin_source
from . import _wire as wire
from ._local_ipc import listen, stranger

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "POLL_S", "Dealer", "READ_AHEAD"]

#: Records per block: small enough that k workers share a stream of short epochs evenly, large
#: enough that one request per block costs little next to decoding its records.
BLOCK_RECORDS = 64
#: A block is closed at this many bytes (64 image records of ~100 KB are ~6 MB).
BLOCK_BYTES = 8 << 20
#: Blocks the dealer frames ahead of the requests (bounds its memory to ~READ_AHEAD blocks).
READ_AHEAD = 4
POLL_S = 0.2  # how often a waiting dealer looks at its deadlines and stop flag


def _who(local_rank: Optional[int], worker: Optional[int], local_world_size: int) -> str:
    if local_world_size <= 1:
        return f"DataLoader worker {worker}"
    return f"DataLoader worker {worker} of local rank {local_rank}"


class _Lost(Exception):
    """A client's socket closed, or it broke the protocol, after it got records (internal):
    ``(local rank, worker, what happened)``."""


class _Client:
    __slots__ = ("sock", "parser", "local_rank", "worker", "blocks", "finished")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parser = wire.ClientParser()
        self.local_rank: Optional[int] = None
        self.worker: Optional[int] = None  # None until its hello was accepted
        self.blocks = 0  # blocks sent to it
        self.finished = False  # got its END/ERROR, said goodbye, or was dropped


class Dealer(threading.Thread):
    """Frames the stream and answers the clients' requests (a daemon thread in local rank 0's
    worker 0: it dies with that process, which every client then sees)."""

    def __init__(self, dataset: Any, address: Any, epoch: int, local_world_size: int,
                 stats: Any, connect_timeout: float) -> None:
        super().__init__(name="streamio-dealer", daemon=True)
        self.dataset = dataset
        self.epoch = epoch
        self.local_world_size = local_world_size
        self.stats = stats
        self.connect_timeout = connect_timeout
        self.stop_now = threading.Event()
        self.failure: Optional[BaseException] = None  # what ended the epoch, if not its end
        # local rank -> its num_workers (from its first accepted hello), the (rank, worker)
        # greeted, and what happened to peers that were dropped (for the messages).
        self.workers_of: dict[int, int] = {}
        self.greeted: set = set()
        self.notes: list[str] = []
        self.strangers: set = set()  # uids refused (one warning each)
        self.clients: list[_Client] = []
        self.selector = selectors.DefaultSelector()
        self.stream_name = _names(dataset)
        self.address = address
        self.listener = listen(address, f"the shared stream {self.stream_name} (epoch {epoch})")
        self.listener.setblocking(False)

    # -- the stream ---------------------------------------------------------------------------
    def _blocks(self) -> Iterator[tuple]:
        """(source name, record origins, records) of at most BLOCK_RECORDS records and about
        BLOCK_BYTES bytes, within one source, after the dataset's record-level shards."""
        # The pipeline's own source end, without stages or decoder: it opens each source once,
        # applies shard() layers (a host's share of a replicated stream) exactly as a reader
        # that is not shared would, and gives each record its origin.
        run = EpochRun.for_sources(self.dataset, self.epoch, self.stats)
        pending: list = []
        pending_ids: list = []
        ordinal = -1
        size = 0

        def cut() -> tuple:
            nonlocal pending, pending_ids, size
            block = (run.names.get(ordinal, self.stream_name),
                     np.concatenate(pending_ids), pending)
            pending, pending_ids, size = [], [], 0
            return block

        # Records gather across the reader's chunks (a 1 MiB read holds ~10 image records): a
        # block of 64 costs one request where 7 small ones would cost 7 round trips, each a
        # wake-up of a thread on a busy machine.
        source_blocks = run.read_blocks()
        try:
            for records, ids in source_blocks:
                start = 0
                while start < len(records):
                    here = origin_source(ids[start])
                    if here != ordinal and pending:
                        yield cut()
                    ordinal = here
                    self.stream_name = run.names.get(ordinal, self.stream_name)
                    room = BLOCK_RECORDS - len(pending)
                    piece = records[start:start + room]
                    piece_ids = ids[start:start + room]
                    # A piece from one chunk belongs to one source (a reader's chunk does).
                    pending.extend(piece)
                    pending_ids.append(piece_ids)
                    size += sum(map(len, piece))
                    start += len(piece)
                    if len(pending) >= BLOCK_RECORDS or size >= BLOCK_BYTES:
                        yield cut()
        except Exception:
            if pending:  # the records before a fault are delivered first
                yield cut()
            raise
        finally:
            source_blocks.close()
        if pending:
            yield cut()

    # -- serving ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - every client is told, then we stop
            rank = worker = None  # the reader the error is about, if one
            if isinstance(exc, _Lost):
                rank, worker, what = exc.args
                exc = SourceError(
                    f"{_who(rank, worker, self.local_world_size)} {what} before the end of the"
                    f" epoch of {self.stream_name}: the records it held cannot be delivered",
                    source=self.stream_name)
            elif not isinstance(exc, StreamioError):
                exc = SourceError(f"the dealer of {self.stream_name} failed: {exc!r}",
                                  source=self.stream_name)
            self.failure = exc
            message = wire.encode_error(exc, rank, worker)
            for client in self.clients:
                if client.worker is not None and not client.finished:
                    try:
                        client.sock.sendall(message)
                    except OSError:
                        pass
        finally:
            self.listener.close()
            if isinstance(self.address, str) and not self.address.startswith("\0"):
                try:
                    os.unlink(self.address)
                except OSError:
                    pass
            for client in self.clients:
                _close_quietly(client.sock)
            self.selector.close()

    def _all_greeted(self) -> bool:
        if len(self.workers_of) < self.local_world_size:
            return False
        return len(self.greeted) >= sum(self.workers_of.values())

    def _missing(self) -> str:
        parts = []
        for rank in range(self.local_world_size):
            if rank not in self.workers_of:
                parts.append(f"local rank {rank} (none of its readers)")
                continue
            absent = [w for w in range(self.workers_of[rank]) if (rank, w) not in self.greeted]
            if absent:
                parts.append(f"local rank {rank} worker(s) {', '.join(map(str, absent))}")
        dropped = f" (dropped: {'; '.join(self.notes[-4:])})" if self.notes else ""
        return "; ".join(parts) + dropped

    def _serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ)
        deadline = time.monotonic() + self.connect_timeout
        blocks = self._blocks()
        ready: collections.deque = collections.deque()
        waiting: collections.deque = collections.deque()  # one entry per request
        exhausted = False
        failure: Optional[BaseException] = None
        try:
            while not self.stop_now.is_set():
                everyone = self._all_greeted()
                if exhausted and everyone and all(c.finished for c in self.clients
                                                  if c.worker is not None):
                    return
                if not everyone and time.monotonic() > deadline:
                    raise SourceError(
                        f"not every reader of {self.stream_name} connected within"
                        f" {self.connect_timeout:g} s (connect_timeout); missing: "
                        f"{self._missing()} - a rank or DataLoader worker that did not start,"
                        " or that reads another epoch or uses another num_workers",
                        source=self.stream_name)
                reading = not exhausted and len(ready) < READ_AHEAD
                for key, _ in self.selector.select(0 if reading else POLL_S):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._hear(key.data, waiting)
                while waiting and ready:
                    client = waiting.popleft()
                    if not client.finished:
                        self._send_block(client, ready.popleft(), waiting)
                if exhausted and not ready:
                    if failure is not None:
                        raise failure  # every client is told (run), after the records before it
                    if everyone:
                        # The end goes to every client now, asked or not: it is small enough
                        # never to wait on a socket, and a client whose rank is blocked in a
                        # collective may not ask until the others finish.
                        waiting.clear()
                        for client in list(self.clients):  # (a client may be dropped)
                            if client.worker is not None and not client.finished:
                                self._send_last(client, waiting)
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

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            other = stranger(sock)
            if other is not None:
                # Another user's process: not a reader of this job, whatever it would say.
                sock.close()
                if other[1] not in self.strangers:
                    self.strangers.add(other[1])
                    warnings.warn(f"the shared stream {self.stream_name} refused a connection"
                                  f" from pid {other[0]} of uid {other[1]} (another user)",
                                  RuntimeWarning, stacklevel=1)
                continue
            sock.setblocking(True)
            client = _Client(sock)
            self.clients.append(client)
            self.selector.register(sock, selectors.EVENT_READ, client)

    def _drop(self, client: _Client, note: Optional[str] = None) -> None:
        """Forget a client: one that is done, or one that held no records and left or broke
        the protocol (``note`` says how), whose place is free again for the reader it claimed
        to be."""
        if note is not None:
            self.notes.append(note)
            if client.worker is not None:
                self.greeted.discard((client.local_rank, client.worker))
        client.finished = True
        self.selector.unregister(client.sock)
        self.clients.remove(client)
        _close_quietly(client.sock)

    def _hear(self, client: _Client, waiting: collections.deque) -> None:
        try:
            data = client.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._hung_up(client)
            return
        self._parse(client, data, waiting)

    def _hung_up(self, client: _Client) -> None:
        if client.finished or client.worker is None:
            self._drop(client)  # done, or a connection that never said hello
        elif client.blocks:
            raise _Lost(client.local_rank, client.worker, "left (it died or stopped early)")
        else:
            who = _who(client.local_rank, client.worker, self.local_world_size)
            self._drop(client, f"{who} hung up before its first block")

    def _parse(self, client: _Client, data: bytes, waiting: collections.deque) -> None:
        try:
            events = client.parser.feed(data)
        except SourceError as exc:
            if client.blocks:
                raise _Lost(client.local_rank, client.worker,
                            f"broke the protocol ({exc})") from None
            self._drop(client, f"a client that broke the protocol ({exc})")
            return
        for event in events:
            if isinstance(event, wire.Hello):
                refused = self._greet(event)
                if refused is not None:
                    self.notes.append(refused)
                    try:
                        client.sock.sendall(wire.encode_error(SourceError(
                            f"{refused}: refused by the dealer of {self.stream_name}",
                            source=self.stream_name), event[0], event[1]))
                    except OSError:
                        pass
                    self._drop(client)
                    return
                client.local_rank, client.worker = event.who
            elif event == "want":
                waiting.append(client)
            else:
                client.finished = True

    def _greet(self, hello: wire.Hello) -> Optional[str]:
        """None if ``hello`` fits the readers already connected (the same layout everywhere,
        a place not taken), else why not."""
        rank, worker, num_workers, local_world = hello
        who = f"{_who(rank, worker, local_world)} (of {num_workers})"
        if local_world != self.local_world_size:
            return (f"{who} says the host has {local_world} local ranks, local rank 0 says"
                    f" {self.local_world_size}: every rank must agree (LOCAL_WORLD_SIZE /"
                    " to_torch(local_world_size=...))")
        if self.workers_of.get(rank, num_workers) != num_workers:
            return (f"{who} does not fit the readers already connected: ranks that disagree on"
                    " num_workers")
        if hello.who in self.greeted:
            return f"{who} is already connected: a second reader claiming its place"
        self.workers_of[rank] = num_workers
        self.greeted.add(hello.who)
        return None

    def _send(self, client: _Client, message: bytes, waiting: collections.deque) -> None:
        try:
            client.sock.sendall(message)
        except OSError:
            # Gone: fine if it said goodbye (a worker that stopped early), else it died.
            try:
                client.sock.setblocking(False)
                self._parse(client, client.sock.recv(4096), waiting)
            except (OSError, _Lost):
                pass
            if not client.finished:
                raise _Lost(client.local_rank, client.worker,
                            "left (it died or stopped early)") from None

    def _send_block(self, client: _Client, block: tuple, waiting: collections.deque) -> None:
        client.blocks += 1  # from now on its records may be lost with it
        self._send(client, wire.encode_block(*block), waiting)

    def _send_last(self, client: _Client, waiting: collections.deque) -> None:
        self._send(client, wire.encode_end(), waiting)
        client.finished = True


def _names(dataset: Any) -> str:
    try:
        from ..sources import source_name
        names = [source_name(s) for s in dataset.sources]
    except Exception:  # noqa: BLE001 - only for messages
        return "the shared stream"
    return ", ".join(names) if names else "the shared stream"


def _close_quietly(sock: socket.socket) -> None:
    # Read what the client sent and we did not (a request after its END): closing a Unix socket
    # with unread bytes makes the peer's next read fail with a reset instead of reading its END.
    try:
        sock.setblocking(False)
        while sock.recv(4096):
            pass
    except OSError:
        pass
    sock.close()

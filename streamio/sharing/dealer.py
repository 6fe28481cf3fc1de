"""The dealer of a shared stream: one thread that reads the stream and deals its blocks.

It runs in local rank 0's DataLoader worker 0 (:class:`~streamio.sharing.stream.SharedStreamFeed`
starts it), cuts the Dataset's stream into blocks by the pipeline's block rule
(:func:`streamio.pipeline.dealing.cut_blocks`), and answers every worker's requests over
private local sockets (:mod:`._local_ipc`, :mod:`._wire`): block ``k`` goes to reader
``k % readers`` (reader = local rank x num_workers + worker), or, while an elastic resume
replays the old readers' shares, to every reader. The promises are stated in
:mod:`streamio.sharing.stream`.
"""

from __future__ import annotations

import collections
import os
import selectors
import socket
import sys
import threading
import time
import warnings
from typing import Any, Iterator, Optional

from ..errors import SourceError, StreamioError
from ..pipeline.dealing import BLOCK_BYTES, BLOCK_RECORDS, cut_blocks
from . import _wire as wire
from ._local_ipc import listen, stranger

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "BUFFER_BYTES", "POLL_S", "Dealer", "READ_AHEAD"]

#: Blocks the dealer frames ahead of the requests, beyond one for each reader (block k is
#: reader k % readers's, so each reader's next block is at most ``readers`` blocks ahead).
READ_AHEAD = 4
#: The most bytes of blocks the dealer holds for readers that have not taken them yet (a reader
#: whose DataLoader has not asked it for a while). Readers of one DataLoader, and DDP's ranks,
#: read in step, so in practice it holds a few blocks per reader; a reader that stops taking
#: its blocks makes the others wait at this bound, and after ``connect_timeout`` seconds
#: without progress the epoch ends with a SourceError naming it.
BUFFER_BYTES = 1 << 30
POLL_S = 0.2  # how often a waiting dealer looks at its deadlines and stop flag
#: The GIL switch interval of a process while it deals (Python's default is 5 ms): see Dealer.run.
DEALER_SWITCH_INTERVAL_S = 0.0005


def _who(local_rank: Optional[int], worker: Optional[int], local_world_size: int) -> str:
    if local_world_size <= 1:
        return f"DataLoader worker {worker}"
    return f"DataLoader worker {worker} of local rank {local_rank}"


class _Lost(Exception):
    """A client's socket closed, or it broke the protocol, after it got records (internal):
    ``(local rank, worker, what happened)``."""


class _Client:
    __slots__ = ("sock", "parser", "local_rank", "worker", "index", "blocks", "finished")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parser = wire.ClientParser()
        self.local_rank: Optional[int] = None
        self.worker: Optional[int] = None  # None until its hello was accepted
        self.index = -1  # its reader index (local rank x num_workers + worker)
        self.blocks = 0  # blocks sent to it
        self.finished = False  # got its END/ERROR, said goodbye, or was dropped


class Dealer(threading.Thread):
    """Frames the stream and answers the clients' requests (a thread in local rank 0's worker
    0; not a daemon: a worker whose own share has ended keeps serving the others until they
    have theirs, and dies with its process, which every client then sees).

    ``num_workers``: every local rank's DataLoader workers (they must agree); ``broadcast``:
    every block goes to every reader (an elastic resume replaying the old readers' shares)."""

    def __init__(self, dataset: Any, address: Any, epoch: int, local_world_size: int,
                 stats: Any, connect_timeout: float, num_workers: int = 1,
                 broadcast: bool = False) -> None:
        super().__init__(name="streamio-dealer", daemon=False)
        self.dataset = dataset
        self.epoch = epoch
        self.local_world_size = local_world_size
        self.num_workers = num_workers
        self.readers = local_world_size * num_workers
        self.broadcast = broadcast
        self.stats = stats
        self.connect_timeout = connect_timeout
        self.stop_now = threading.Event()
        # Set when the reader in this process has its whole share: from then on the dealer only
        # keeps the process for the others, and gives up on them after connect_timeout seconds
        # without one of them taking a block (a process must not wait forever to exit).
        self.host_ended = threading.Event()
        self.progress = time.monotonic()  # when a block or an END last went out
        self.failure: Optional[BaseException] = None  # what ended the epoch, if not its end
        # local rank -> its num_workers (from its first accepted hello), the (rank, worker)
        # greeted, and what happened to peers that were dropped (for the messages).
        self.workers_of: dict[int, int] = {}
        self.greeted: set = set()
        self.notes: list[str] = []
        self.strangers: set = set()  # uids refused (one warning each)
        self.clients: list[_Client] = []
        # The blocks read and not yet taken by all their readers: index -> [message, readers
        # still to take it]; what each reader has taken; readers whose share is already done.
        self.window: dict[int, list] = {}
        self.window_bytes = 0
        self.read_k = 0
        self.taken = [0] * self.readers
        self.done: set = set()
        self.selector = selectors.DefaultSelector()
        self.stream_name = _names(dataset)
        self.address = address
        self.listener = listen(address, f"the shared stream {self.stream_name} (epoch {epoch})")
        self.listener.setblocking(False)

    # -- the stream ---------------------------------------------------------------------------
    def _blocks(self) -> Iterator[tuple]:
        """(source name, record origins, records) of the stream, cut by the block rule."""

        def named(name: str) -> None:
            self.stream_name = name

        return cut_blocks(self.dataset, self.epoch, self.stats, named)

    def _next_of(self, index: int) -> int:
        """The index of the next block reader ``index`` takes."""
        if self.broadcast:
            return self.taken[index]
        return index + self.readers * self.taken[index]

    def _recipients(self, k: int) -> int:
        if self.broadcast:
            return self.readers - len(self.done)
        return 0 if k % self.readers in self.done else 1

    def _add(self, block: tuple) -> None:
        k = self.read_k
        self.read_k += 1
        count = self._recipients(k)
        if count:
            message = wire.encode_block(*block)
            self.window[k] = [message, count]
            self.window_bytes += len(message)

    def _release(self, k: int) -> None:
        entry = self.window[k]
        entry[1] -= 1
        if entry[1] <= 0:
            del self.window[k]
            self.window_bytes -= len(entry[0])

    def _forget(self, index: int) -> None:
        """Reader ``index`` takes none of its blocks (its share was delivered before a
        resume): the ones held for it go."""
        self.done.add(index)
        for k in sorted(self.window):
            if k >= self._next_of(index) and (self.broadcast or k % self.readers == index):
                self._release(k)

    # -- serving ------------------------------------------------------------------------------
    def run(self) -> None:
        # Every client waits on this thread for each block while the process's own reader
        # decodes holding the GIL; at Python's default switch interval (5 ms) each request
        # could wait that long for it (measured: 2.6-6.7x slower for 2 DataLoader workers on
        # one FIFO). The process keeps the shorter interval while it deals.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, DEALER_SWITCH_INTERVAL_S))
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
            self.window.clear()
            sys.setswitchinterval(switch)

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

    def _holding(self) -> str:
        """Who the blocks held are for (for the message of a dealer that cannot go on)."""
        held = collections.Counter()
        for k in self.window:
            if not self.broadcast:
                held[k % self.readers] += 1
        if self.broadcast:
            low = min((self._next_of(c) for c in range(self.readers) if c not in self.done),
                      default=0)
            held.update(c for c in range(self.readers)
                        if c not in self.done and self._next_of(c) == low)
        names = []
        for index, count in held.most_common(3):
            rank, worker = divmod(index, self.num_workers)
            names.append(f"{_who(rank, worker, self.local_world_size)} ({count} block(s))")
        return ", ".join(names) or "nobody"

    def _serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ)
        deadline = time.monotonic() + self.connect_timeout
        blocks = self._blocks()
        waiting: collections.deque = collections.deque()  # one entry per request
        exhausted = False
        failure: Optional[BaseException] = None
        stalled_since: Optional[float] = None
        ahead = READ_AHEAD + (1 if self.broadcast else self.readers)
        try:
            while not self.stop_now.is_set():
                everyone = self._all_greeted()
                if exhausted and everyone and all(c.finished for c in self.clients
                                                  if c.worker is not None):
                    return
                now = time.monotonic()
                if not everyone and now > deadline:
                    raise SourceError(
                        f"not every reader of {self.stream_name} connected within"
                        f" {self.connect_timeout:g} s (connect_timeout); missing: "
                        f"{self._missing()} - a rank or DataLoader worker that did not start,"
                        " or that reads another epoch or uses another num_workers",
                        source=self.stream_name)
                need = not exhausted and any(
                    not c.finished and self._next_of(c.index) >= self.read_k for c in waiting)
                room = self.window_bytes < BUFFER_BYTES
                reading = not exhausted and room and (need or len(self.window) < ahead)
                if need and not room:
                    stalled_since = stalled_since or now
                    if everyone and now - stalled_since > self.connect_timeout:
                        raise SourceError(
                            f"the dealer of {self.stream_name} holds {self.window_bytes} bytes"
                            f" of blocks (the bound) for readers that have not taken them for"
                            f" {self.connect_timeout:g} s: {self._holding()}; the readers of a"
                            " shared stream must read in step (a DataLoader reads its workers"
                            " in turn, DDP's ranks step together)", source=self.stream_name)
                else:
                    stalled_since = None
                if self.host_ended.is_set() and self.window and everyone \
                        and now - self.progress > self.connect_timeout:
                    raise SourceError(
                        f"the readers of {self.stream_name} that still have blocks to take have"
                        f" taken none for {self.connect_timeout:g} s (connect_timeout), and the"
                        f" process of the dealer's own reader, done, waits for them:"
                        f" {self._holding()}", source=self.stream_name)
                for key, _ in self.selector.select(0 if reading else POLL_S):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._hear(key.data, waiting)
                self._answer(waiting)
                if exhausted and not self.window:
                    if failure is not None:
                        raise failure  # every client is told (run), after the records before it
                if exhausted and everyone and failure is None:
                    # A reader's END goes to it as soon as its share is out, asked or not: it is
                    # small enough never to wait on a socket, and a client whose rank is blocked
                    # in a collective may not ask until the others finish.
                    for client in list(self.clients):  # (a client may be dropped)
                        if client.worker is not None and not client.finished \
                                and self._next_of(client.index) >= self.read_k:
                            self._send_last(client, waiting)
                if reading:
                    try:
                        self._add(next(blocks))
                    except StopIteration:
                        exhausted = True
                    except Exception as exc:  # noqa: BLE001 - sent to every client in turn
                        failure = exc
                        exhausted = True
        finally:
            blocks.close()

    def _answer(self, waiting: collections.deque) -> None:
        """Send every waiting client its next block, where it has been read."""
        still = collections.deque()
        while waiting:
            client = waiting.popleft()
            if client.finished:
                continue
            k = self._next_of(client.index)
            if k not in self.window:
                still.append(client)
                continue
            message = self.window[k][0]
            self._release(k)
            self.taken[client.index] += 1
            self.progress = time.monotonic()
            client.blocks += 1  # from now on its records may be lost with it
            self._send(client, message, waiting)
        waiting.extend(still)

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
                client.index = event[0] * self.num_workers + event[1]
                if event.flags & wire.DONE:
                    self._forget(client.index)
            elif event == "want":
                waiting.append(client)
            else:
                client.finished = True

    def _greet(self, hello: wire.Hello) -> Optional[str]:
        """None if ``hello`` fits the readers already connected (the same layout everywhere,
        a place not taken), else why not."""
        rank, worker, num_workers, local_world, _ = hello
        who = f"{_who(rank, worker, local_world)} (of {num_workers})"
        if local_world != self.local_world_size:
            return (f"{who} says the host has {local_world} local ranks, local rank 0 says"
                    f" {self.local_world_size}: every rank must agree (LOCAL_WORLD_SIZE /"
                    " to_torch(local_world_size=...))")
        if num_workers != self.num_workers:
            return (f"{who} does not fit the readers already connected: local rank 0 has"
                    f" {self.num_workers} DataLoader worker(s), and every rank must have as many"
                    " (block k goes to reader k % readers)")
        if bool(hello.flags & wire.BROADCAST) != self.broadcast:
            mine = "replays" if self.broadcast else "does not replay"
            return (f"{who} does not fit: local rank 0 {mine} an elastic resume of this epoch,"
                    " and every reader must load the same states")
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

    def _send_last(self, client: _Client, waiting: collections.deque) -> None:
        self._send(client, wire.encode_end(), waiting)
        client.finished = True
        self.progress = time.monotonic()


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

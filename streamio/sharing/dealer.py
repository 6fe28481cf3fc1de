"""The dealer of a shared stream: one thread that reads the stream and deals its blocks.

It runs in local rank 0's DataLoader worker 0 (:class:`~streamio.sharing.stream.SharedStreamFeed`
starts it), cuts the Dataset's stream into blocks by the pipeline's block rule
(:func:`streamio.pipeline.dealing.cut_blocks`), and answers every worker's requests over
private local sockets (:mod:`._local_ipc`, :mod:`._wire`): block ``k`` goes to reader
``k % readers`` (reader = local rank x num_workers + worker), or, while an elastic resume
replays the old readers' shares, to every reader. The promises are stated in
:mod:`streamio.sharing.stream`.

It never waits on one reader or on the stream: the stream is read by a second thread
(:class:`_Reading`), one block at a time when the loop asks, and every socket is non-blocking,
its unsent bytes queued; so the loop always keeps its deadlines, answers the others, and tells
the readers that wait that it is alive (a KEEPALIVE every :data:`KEEPALIVE_S`). A reader that
takes no byte of what it asked for within the stall bound (``connect_timeout``) is named and
ends the epoch (a frozen or stopped process, or one that asks and never reads). Its waits that
last (for readers to connect, for the stream, for readers to take their blocks) are logged
(:class:`streamio._util.WaitLog`).
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

from .._util import WaitLog
from ..errors import SourceError, StreamioError
from ..pipeline.dealing import BLOCK_BYTES, BLOCK_RECORDS, cut_blocks
from . import _wire as wire
from ._local_ipc import listen, peer_credentials, stranger

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "BUFFER_BYTES", "KEEPALIVE_S", "POLL_S", "Dealer",
           "READ_AHEAD"]

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
#: How often (at most) a reader that asked and waits hears that the dealer is alive (a fourth of
#: the stall bound where that is shorter): a reader that hears nothing for ``connect_timeout``
#: seconds knows the dealer stopped.
KEEPALIVE_S = 2.0
#: How long the dealer that ends an epoch with an error gives its readers to take that error.
TELL_S = 5.0
_KEEPALIVE = wire.encode_keepalive()
SEND_BUFFER = 4 << 20  # asked of each client's socket (the kernel may cap it: net.core.wmem_max)


def _who(local_rank: Optional[int], worker: Optional[int], local_world_size: int) -> str:
    if local_world_size <= 1:
        return f"DataLoader worker {worker}"
    return f"DataLoader worker {worker} of local rank {local_rank}"


class _Lost(Exception):
    """A client's socket closed, it broke the protocol or it stopped reading, after it got
    records (internal): ``(local rank, worker, what happened)``."""


class _Client:
    __slots__ = ("sock", "parser", "local_rank", "worker", "index", "blocks", "finished",
                 "pid", "uid", "out", "stuck_since", "sent_at", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parser = wire.ClientParser()
        self.local_rank: Optional[int] = None
        self.worker: Optional[int] = None  # None until its hello was accepted
        self.index = -1  # its reader index (local rank x num_workers + worker)
        self.blocks = 0  # blocks sent to it
        self.finished = False  # got its END/ERROR, said goodbye, or was dropped
        self.pid, self.uid = peer_credentials(sock) or (None, None)
        self.out: collections.deque = collections.deque()  # bytes queued, not yet sent
        self.stuck_since: Optional[float] = None  # since when queued bytes wait, none taken
        self.sent_at = time.monotonic()  # when a message was last queued for it
        self.writing = False  # registered for EVENT_WRITE

    def process(self) -> str:
        return f"pid {self.pid}, uid {self.uid}" if self.pid is not None else "pid unknown"


class _Reading(threading.Thread):
    """Reads the stream for the dealer, one block each time it is asked (:meth:`ask`); puts
    ``("block", block)``, ``("end", None)`` or ``("error", exc)`` in :attr:`results` and wakes
    the dealer's loop through ``wake``. A daemon: a read that never returns (a FIFO whose
    writer stalls) must not keep the process; once stopped it closes the stream when that read
    returns."""

    def __init__(self, blocks: Any, wake: socket.socket) -> None:
        super().__init__(name="streamio-dealer-read", daemon=True)
        self._make_blocks = blocks
        self._wake = wake
        self._asked = threading.Semaphore(0)
        self.stop = threading.Event()
        self.results: collections.deque = collections.deque()

    def ask(self) -> None:
        self._asked.release()

    def run(self) -> None:
        blocks = None
        try:
            blocks = self._make_blocks()
            while True:
                while not self._asked.acquire(timeout=POLL_S):
                    if self.stop.is_set():
                        return
                if self.stop.is_set():
                    return
                try:
                    item = ("block", next(blocks))
                except StopIteration:
                    item = ("end", None)
                self._post(item)
                if item[0] != "block":
                    return
        except BaseException as exc:  # noqa: BLE001 - the dealer sends it to everyone
            self._post(("error", exc))  # (never a silent end: the dealer would wait on)
        finally:
            try:
                if blocks is not None:
                    blocks.close()
            finally:
                self._wake.close()

    def _post(self, item: tuple) -> None:
        self.results.append(item)
        try:
            self._wake.send(b"\0")
        except OSError:
            pass  # a wake-up already waits (or the dealer is gone)


class Dealer(threading.Thread):
    """Frames the stream and answers the clients' requests (a thread in local rank 0's worker
    0; not a daemon: a worker whose own share has ended keeps serving the others until they
    have theirs, and dies with its process, which every client then sees).

    ``num_workers``: every local rank's DataLoader workers (they must agree); ``broadcast``:
    every block goes to every reader (an elastic resume replaying the old readers' shares).
    ``connect_timeout`` is also the stall bound: a reader that takes no byte of what it asked
    for in that time is named and ends the epoch."""

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
        self.keepalive = min(KEEPALIVE_S, connect_timeout / 4)
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
        self.waiting: collections.deque = collections.deque()  # one entry per request
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
        self._wake_r, wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        wake_w.setblocking(False)
        self.reading = _Reading(self._blocks, wake_w)
        # The waits that last are logged (streamio._util.WaitLog): for readers to connect, for
        # the stream, for readers to take their blocks.
        self.waits = {"connect": WaitLog(self._waits_connect, waiting=False),
                      "stream": WaitLog(self._waits_stream, waiting=False),
                      "readers": WaitLog(self._waits_readers, waiting=False)}

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
        # (No shorter GIL switch interval while dealing: it no longer paid, docs/performance.md.)
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
            self._tell(wire.encode_error(exc, rank, worker))
        finally:
            self.reading.stop.set()
            self.listener.close()
            if isinstance(self.address, str) and not self.address.startswith("\0"):
                try:
                    os.unlink(self.address)
                except OSError:
                    pass
            for client in self.clients:
                _close_quietly(client.sock)
            self.selector.close()
            self._wake_r.close()
            self.window.clear()
            if self.reading.ident is not None:
                self.reading.join(timeout=1.0)  # (blocked in a read: it closes when that returns)

    def _tell(self, message: bytes) -> None:
        """Send ``message`` (an error) to every client that has not finished, giving them up to
        :data:`TELL_S` seconds to take it (a stalled one is finished already: not waited for)."""
        clients = [c for c in self.clients if c.worker is not None and not c.finished]
        for client in clients:
            client.out.append(memoryview(message))
        deadline = time.monotonic() + min(TELL_S, self.connect_timeout)
        with selectors.DefaultSelector() as writable:
            for client in clients:
                writable.register(client.sock, selectors.EVENT_WRITE, client)
            while writable.get_map() and time.monotonic() < deadline:
                for key, _ in writable.select(POLL_S):
                    client = key.data
                    try:
                        while client.out:
                            sent = client.sock.send(client.out[0])
                            client.out[0] = client.out[0][sent:]
                            if not client.out[0]:
                                client.out.popleft()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        client.out.clear()
                    writable.unregister(client.sock)

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
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.reading.start()
        deadline = time.monotonic() + self.connect_timeout
        exhausted = False
        asked = 0  # blocks asked of the reading thread, not yet come
        asked_at = 0.0  # when the last one came, or the first was asked
        failure: Optional[BaseException] = None
        stalled_since: Optional[float] = None
        looked = 0.0  # when the deadlines, the logs and the keep-alives were last seen to
        ahead = READ_AHEAD + (1 if self.broadcast else self.readers)
        while not self.stop_now.is_set():
            everyone = self._all_greeted()
            if exhausted and everyone and all(c.finished and not c.out for c in self.clients
                                              if c.worker is not None):
                return
            now = time.monotonic()
            if not everyone and now > deadline:
                raise SourceError(
                    f"not every reader of {self.stream_name} connected within"
                    f" {self.connect_timeout:g} s (connect_timeout); missing: "
                    f"{self._missing()} - a rank or DataLoader worker that did not start,"
                    " or that reads another epoch or uses another num_workers"
                    + (_RUN_HINT if self.local_world_size > 1 else ""),
                    source=self.stream_name)
            need = not exhausted and any(
                not c.finished and self._next_of(c.index) >= self.read_k for c in self.waiting)
            room = self.window_bytes < BUFFER_BYTES
            if need and not room:
                stalled_since = stalled_since or now
            else:
                stalled_since = None
            if now >= looked + POLL_S / 4:  # (bounds of a second or more: no need to look
                looked = now                   # at every block)
                self._check(now, everyone, stalled_since)
                self._log_waits(now, everyone, now - asked_at if asked else 0.0, stalled_since)
                self._keep_alive(now)
            # Up to `ahead` blocks framed ahead (asked in one go: one hand-over per few blocks),
            # or one more while a reader waits for a block beyond them.
            more = max(ahead - len(self.window), int(need)) - asked if room and not exhausted \
                else 0
            for _ in range(more):
                self.reading.ask()
            if more > 0 and not asked:
                asked_at = now
            asked += max(more, 0)
            for key, events in self.selector.select(POLL_S):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    _drain(self._wake_r)
                elif key.data in self.clients:  # (not one dropped since the select)
                    if events & selectors.EVENT_READ:
                        self._hear(key.data)
                    if key.data.out:
                        self._flush(key.data)
            while self.reading.results:
                kind, item = self.reading.results.popleft()
                asked, asked_at = asked - 1, time.monotonic()
                if kind == "block":
                    self._add(item)
                else:
                    exhausted, failure = True, item
            self._answer()
            if exhausted and not self.window and failure is not None:
                raise failure  # every client is told (run), after the records before it
            if exhausted and everyone and failure is None:
                # A reader's END goes to it as soon as its share is out, asked or not: it is
                # small enough never to wait on a socket, and a client whose rank is blocked
                # in a collective may not ask until the others finish.
                for client in list(self.clients):  # (a client may be dropped)
                    if client.worker is not None and not client.finished \
                            and self._next_of(client.index) >= self.read_k:
                        self._send_last(client)

    def _check(self, now: float, everyone: bool, stalled_since: Optional[float]) -> None:
        """Raise for what has waited past its bound: a reader that takes no bytes, the blocks
        held for readers that do not take them."""
        for client in self.clients:
            if client.out and now - client.stuck_since > self.connect_timeout:
                client.finished = True  # not told: it reads nothing
                raise _Lost(client.local_rank, client.worker,
                            f"stopped reading ({client.process()}): it took no byte of the"
                            f" {sum(map(len, client.out))} bytes sent to it for"
                            f" {self.connect_timeout:g} s (connect_timeout, the stall bound) -"
                            " a frozen or stopped process, or one that asks and never reads")
        if stalled_since is not None and everyone \
                and now - stalled_since > self.connect_timeout:
            raise SourceError(
                f"the dealer of {self.stream_name} holds {self.window_bytes} bytes"
                f" of blocks (the bound) for readers that have not taken them for"
                f" {self.connect_timeout:g} s: {self._holding()}; the readers of a"
                " shared stream must read in step (a DataLoader reads its workers"
                " in turn, DDP's ranks step together)", source=self.stream_name)
        if self.host_ended.is_set() and self.window and everyone \
                and now - self.progress > self.connect_timeout:
            raise SourceError(
                f"the readers of {self.stream_name} that still have blocks to take have"
                f" taken none for {self.connect_timeout:g} s (connect_timeout), and the"
                f" process of the dealer's own reader, done, waits for them:"
                f" {self._holding()}", source=self.stream_name)

    def _log_waits(self, now: float, everyone: bool, reading_for: float,
                   stalled_since: Optional[float]) -> None:
        """Say which waits go on (the logs of those that last: :attr:`waits`). A block asked
        of the stream, or bytes queued for a reader, are a wait only after a second without
        one: while blocks flow, some are asked and some queued all along."""
        idle = self.host_ended.is_set() and self.window and now - self.progress > 1.0
        for name, waiting in (("connect", not everyone), ("stream", reading_for > 1.0),
                              ("readers", bool(self._stuck(now)) or stalled_since is not None
                               or bool(idle))):
            if waiting:
                self.waits[name].tick(now)
            else:
                self.waits[name].end()

    def _stuck(self, now: float) -> list:
        return [c for c in self.clients if c.out and now - c.stuck_since > 1.0]

    def _waits_connect(self, waited: float) -> str:
        return (f"the dealer of {self.stream_name} waits for readers to connect, for"
                f" {waited:.0f} s so far: {self._missing()}; connect_timeout="
                f"{self.connect_timeout:g} s ends it")

    def _waits_stream(self, waited: float) -> str:
        return (f"the dealer of {self.stream_name} waits for its stream (no block comes: a FIFO's"
                f" writer that has not written, or a slow source), for {waited:.0f} s so far;"
                " the source's open_timeout/read_timeout end it, if set (its readers wait as"
                " long: they hear the dealer's keep-alives)")

    def _waits_readers(self, waited: float) -> str:
        stuck = self._stuck(time.monotonic())
        if stuck:
            what = "waits for readers to take what it sent them: " + ", ".join(
                f"{_who(c.local_rank, c.worker, self.local_world_size)} ({c.process()})"
                for c in stuck[:3])
        else:
            what = f"holds blocks for readers that do not ask for them: {self._holding()}"
        return (f"the dealer of {self.stream_name} {what}, for {waited:.0f} s so far;"
                f" connect_timeout={self.connect_timeout:g} s without progress ends it")

    def _keep_alive(self, now: float) -> None:
        """Tell the readers that asked and still wait that the dealer is alive."""
        for client in list(self.waiting):
            if not client.out and not client.finished and now - client.sent_at > self.keepalive:
                self._queue(client, _KEEPALIVE)

    def _answer(self) -> None:
        """Send every waiting client its next block, where it has been read."""
        still = collections.deque()
        while self.waiting:
            client = self.waiting.popleft()
            if client.finished:
                continue
            k = self._next_of(client.index)
            if k not in self.window or client.out:
                # (one block at a time: a client that asks for many and does not read them
                # holds them here, against BUFFER_BYTES, not in its queue)
                still.append(client)
                continue
            message = self.window[k][0]
            self._release(k)
            self.taken[client.index] += 1
            self.progress = time.monotonic()
            client.blocks += 1  # from now on its records may be lost with it
            self._queue(client, message)
        self.waiting.extend(still)

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
            sock.setblocking(False)
            try:  # room for a whole block in the kernel: fewer wake-ups per block sent
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            except OSError:
                pass
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
        client.out.clear()
        self.selector.unregister(client.sock)
        self.clients.remove(client)
        _close_quietly(client.sock)

    def _hear(self, client: _Client) -> None:
        try:
            data = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._hung_up(client)
            return
        self._parse(client, data)

    def _hung_up(self, client: _Client) -> None:
        if client.finished or client.worker is None:
            self._drop(client)  # done, or a connection that never said hello
        elif client.blocks:
            raise _Lost(client.local_rank, client.worker,
                        f"left (it died or stopped early; {client.process()})")
        else:
            who = _who(client.local_rank, client.worker, self.local_world_size)
            self._drop(client, f"{who} hung up before its first block")

    def _parse(self, client: _Client, data: bytes) -> None:
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
                    try:  # (small: the socket takes it, or the client is not listening)
                        client.sock.send(wire.encode_error(SourceError(
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
                client.sent_at = time.monotonic()  # (its keep-alives count from its request)
                self.waiting.append(client)
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

    def _queue(self, client: _Client, message: bytes) -> None:
        """Queue ``message`` for ``client`` and send what its socket takes now."""
        client.out.append(memoryview(message))
        client.sent_at = time.monotonic()
        self._flush(client)

    def _flush(self, client: _Client) -> None:
        """Send ``client`` what its socket takes now (never waits); the rest waits for the
        socket to be writable (EVENT_WRITE), and :meth:`_check` bounds how long."""
        took = False
        try:
            while client.out:
                sent = client.sock.send(client.out[0])
                took = took or sent > 0
                client.out[0] = client.out[0][sent:]
                if not client.out[0]:
                    client.out.popleft()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._gone(client)  # (raises unless it said goodbye: then nothing is left to send)
            if client not in self.clients:
                return
        if not client.out:
            client.stuck_since = None
        elif took or client.stuck_since is None:
            client.stuck_since = time.monotonic()
        if bool(client.out) != client.writing:
            client.writing = bool(client.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.writing else 0)
            self.selector.modify(client.sock, events, client)

    def _gone(self, client: _Client) -> None:
        """A send failed: fine if the client said goodbye (a worker that stopped early), else
        it died."""
        client.out.clear()
        try:
            self._parse(client, client.sock.recv(4096))
        except (OSError, _Lost):
            pass
        if not client.finished:
            raise _Lost(client.local_rank, client.worker,
                        f"left (it died or stopped early; {client.process()})") from None

    def _send_last(self, client: _Client) -> None:
        self._queue(client, wire.encode_end())
        client.finished = True
        self.progress = time.monotonic()


#: Said where local ranks did not meet: they find each other by the run (see stream.py).
_RUN_HINT = ("; ranks meet only within one run: started by one launcher process (torchrun, a"
             " script), or given the same STREAMIO_RUN_ID")


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass


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

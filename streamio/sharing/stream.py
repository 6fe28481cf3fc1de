"""One stream dealt to every reader of a host: the DataLoader workers of each local rank.

A FIFO, a :class:`~streamio.PipeChannel` or stdin can be read by one process only. Where more
readers than sources must share one, one reader deals: worker 0 of local rank 0 (its main
process with ``num_workers=0``) runs a :class:`~streamio.sharing.dealer.Dealer` thread that
frames the stream once, cuts it into blocks by a rule of the records alone
(:func:`streamio.pipeline.dealing.cut_blocks`) and gives block ``k`` to reader ``k % readers``
(reader = local rank x workers + worker; while an elastic resume replays, every block to every
reader). Every reader, the dealer's own too, is a :class:`SharedStreamFeed`: it asks for a block
when it is about to read one, and runs the rest of its pipeline on its share.

- **Every record once**: each record reaches one reader, with its origin, the same reader
  whenever the stream carries the same bytes (a mid-epoch state resumes); shares differ by up to
  a block and a short last one.
- **An epoch ends, never hangs nor comes up short**: a reader that dies, leaves or breaks the
  protocol holding records, stops taking its blocks or never connects; a dealer that dies, stops
  or falls silent (it sends keep-alives to readers that wait); a stream that fails: every other
  reader raises a :class:`~streamio.errors.SourceError` naming who (local rank, worker, pid,
  uid) and what, within ``connect_timeout`` (also the stall bound). The dealer never blocks on a
  reader, and holds at most :data:`~streamio.sharing.dealer.BUFFER_BYTES` for those that lag.
  A wait that lasts is logged (:class:`streamio._util.WaitLog`). Not seen: a reader that dies
  once every other reader has its whole share.
- **Other local users** cannot read, inject or redirect a record: sockets live at names nobody
  else can compute (HMACs keyed by the ``StreamDataset``'s token or the user's key, new for each
  run: :func:`stream_address`, :func:`run_nonce`), both ends check ``SO_PEERCRED`` and refuse
  another uid, and nothing received is unpickled (:mod:`._wire`). What they can do is end an
  epoch with a ``SourceError`` naming them.

Guide: docs/pipeline.md ("One FIFO feeding every core"); threats: docs/security.md; design:
ARCHITECTURE.md; costs: docs/performance.md.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time
from typing import Any, Iterator, Optional, Sequence

from .._util import WaitLog
from ..errors import SourceError, UsageError
from ..formats import DEFAULT_MAX_RECORD_SIZE
from ..pipeline import origin_source
from ..sources import PipeChannel
from ..sources.schemes import source_key
from . import _wire as wire
from ._local_ipc import peer_credentials, socket_name, stranger, user_key
from .dealer import _RUN_HINT, BLOCK_BYTES, BLOCK_RECORDS, POLL_S, READ_AHEAD, Dealer

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "DEFAULT_CONNECT_TIMEOUT", "READ_AHEAD",
           "SharedStreamFeed", "dealer_address", "stream_address"]

#: How long the dealer waits for every worker (of every local rank) to connect, and a worker for
#: the dealer: workers start one after another (spawned ones import torch), and ranks start
#: when torchrun gets to them, which can take tens of seconds.
DEFAULT_CONNECT_TIMEOUT = 120.0

#: Environment variables that tell one torchrun job from another on the same host (two jobs must
#: not meet at one dealer; a restarted job must not meet a dealer its previous attempt left).
_JOB_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                  "TORCHELASTIC_RESTART_COUNT")
#: One value shared by the local ranks of one run and by no other run: where set, it names the run
#: (ranks that are not started by one launcher process must be given it); else the launcher does.
RUN_ID_VARIABLE = "STREAMIO_RUN_ID"


def _proc_stat(pid: int) -> list:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read()
    return text[text.rindex(b")") + 2:].split()


def _rank_process() -> int:
    """The pid of this rank's main process (in a DataLoader worker: its parent)."""
    data = sys.modules.get("torch.utils.data")
    info = getattr(data, "get_worker_info", lambda: None)()
    if info is not None:
        import multiprocessing

        parent = multiprocessing.parent_process()
        return parent.pid if parent is not None and parent.pid else os.getppid()
    return os.getpid()


def run_nonce() -> str:
    """What tells this run of a job from every other, the same in all its local ranks:
    ``$STREAMIO_RUN_ID`` where set, else the launcher: the parent process of the rank's main
    process (torchrun's agent, the script or ``mpirun``/``srun`` daemon that started the ranks),
    by its pid, its start time and the boot. Every new run has another launcher, so the names
    of its sockets (keyed by the user's secret) are new, and another user who saw the last run's
    names in ``/proc/net/unix`` cannot hold the next run's. "" where ``/proc`` does not say
    (elsewhere the sockets are files in the user's private directory, which no one else can
    enter)."""
    given = os.environ.get(RUN_ID_VARIABLE)
    if given:
        return "run=" + given
    try:
        launcher = int(_proc_stat(_rank_process())[1])
        started = _proc_stat(launcher)[19].decode()
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except (OSError, ValueError, IndexError):
        return ""
    return f"launcher={launcher}:{started}:{boot}"


def dealer_address(token: str, epoch: int) -> Any:
    """Where the dealer of ``epoch`` of one rank's DataLoader workers listens: a name keyed by
    ``token`` (the ``StreamDataset``'s secret, held by its process and workers only), so that
    neither this epoch's name nor the next one's can be derived by anyone else
    (:func:`~streamio.sharing._local_ipc.socket_name`)."""
    return socket_name(token.encode("ascii"), "workers", f"epoch={epoch}")


def _stream_key(source: Any) -> Optional[str]:
    """What names ``source`` alike in every process of the host, or None (stdin, file objects:
    each process has its own)."""
    prefix = getattr(source, "path_prefix", None)
    if isinstance(source, PipeChannel) and prefix is not None:
        return "channel:" + os.path.realpath(prefix)
    if isinstance(source, (str, os.PathLike)):
        return source_key(source)  # a file's real path, or the URL; None for stdin
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "bytes:" + hashlib.sha256(bytes(source)).hexdigest()
    return None


def stream_address(sources: Sequence[Any], epoch: int) -> Any:
    """The dealer address every local rank of one job derives alike for ``sources`` in
    ``epoch``: the sources' real paths, the epoch, the user, the torchrun job
    (:data:`_JOB_VARIABLES`, where set) and the run (:func:`run_nonce`), keyed by the user's
    secret (:func:`~streamio.sharing._local_ipc.user_key`), which no other user can read. Raises
    ``UsageError`` for a source other processes cannot name (stdin, a file object)."""
    parts = [f"uid={os.getuid() if hasattr(os, 'getuid') else 0}", f"epoch={epoch}"]
    for source in sources:
        key = _stream_key(source)
        if key is None:
            raise UsageError(f"{source!r} cannot be shared between the ranks of a host: each"
                             " process has its own (stdin, a file object); give every rank the"
                             " FIFO's path or a PipeChannel")
        parts.append(key)
    for name in _JOB_VARIABLES:
        if name in os.environ:
            parts.append(f"{name}={os.environ[name]}")
    parts.append(run_nonce())
    return socket_name(user_key(), "shared", *parts)


class _Inbox:
    """A reader's receiving end: whole messages, KEEPALIVEs skipped, and a deadline: a dealer
    that sends nothing (not even a KEEPALIVE, which it sends every few seconds to a reader that
    waits) for ``timeout`` seconds has stopped (a frozen or SIGSTOPped process, or one that is
    not a dealer), and the wait ends with a ``SourceError`` naming it. A wait that lasts is
    logged."""

    def __init__(self, sock: socket.socket, timeout: float, dealer: str) -> None:
        self.sock = sock
        self.timeout = timeout
        creds = peer_credentials(sock)
        self.dealer = dealer + (f", pid {creds[0]}, uid {creds[1]}" if creds else "")
        self.heard = time.monotonic()  # when a byte last came
        self.waiting = WaitLog(self._describe_wait, waiting=False)  # for the block asked
        sock.settimeout(min(POLL_S * 5, timeout))

    def receive(self, max_payload: int) -> Optional[tuple]:
        """The next message but KEEPALIVEs, ``(kind, count, payload)``; None where the socket
        closed."""
        self.heard = time.monotonic()  # (the request just went out)
        self.waiting.tick(self.heard)
        while True:
            header = self._exact(wire.HEADER.size)
            if header is None:
                return None
            try:
                kind, count, size = wire.parse_header(header, BLOCK_RECORDS, max_payload)
            except SourceError as exc:
                raise SourceError(f"{self.dealer}, which reads the shared stream, sent {exc}")
            if kind == wire.KEEPALIVE:
                self.waiting.tick()
                continue
            self.waiting.end()
            payload = self._exact(size) if size else bytearray()
            return None if payload is None else (kind, count, payload)

    def _exact(self, n: int) -> Optional[bytearray]:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except TimeoutError:
                self._silence()
                continue
            except ConnectionError:  # reset: the dealer's process died with our bytes unread
                return None
            if k == 0:
                return None
            got += k
            self.heard = time.monotonic()
        return buf

    def _silence(self) -> None:
        now = time.monotonic()
        silent = now - self.heard
        if silent > self.timeout:
            raise SourceError(
                f"the DataLoader worker that reads the shared stream ({self.dealer}) sent"
                f" nothing for {silent:.0f} s, not even the keep-alive it sends every few"
                f" seconds (the stall bound: connect_timeout {self.timeout:g} s): it is frozen"
                " or stopped (SIGSTOP, a cgroup freeze), or not a dealer")
        self.waiting.tick(now)

    def _describe_wait(self, waited: float) -> str:
        return (f"a reader of the shared stream waits for its next block from {self.dealer}, for"
                f" {waited:.0f} s so far (last heard from it {time.monotonic() - self.heard:.0f}"
                f" s ago); {self.timeout:g} s without a word from it (connect_timeout) ends it")


def _connect(address: Any, timeout: float, dealer: str, hint: str = "") -> socket.socket:
    """A socket connected to the dealer, whose process runs as this user (another user's
    process at the address is refused at once: it took the name, it is not our dealer)."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise SourceError(f"could not reach the DataLoader worker that reads the shared"
                                  f" stream ({dealer}) within {timeout:g} s: it did not start,"
                                  f" or it already stopped{hint}") from None
            time.sleep(0.01)  # the dealer has not bound its socket yet
            continue
        other = stranger(sock)
        if other is not None:
            sock.close()
            raise SourceError(
                f"refused the process listening at the shared stream's address (pid {other[0]}"
                f" of uid {other[1]}, another user): it is not {dealer} of this job, and no"
                " record is read from it")
        return sock


class _ParentWatch:
    """In a DataLoader worker: closes the client's socket when the worker's parent (its rank's
    main process) dies, so that the dealer learns at once that this rank is gone. Without it the
    worker would live on until torch's own watchdog (every 5 s) noticed, holding blocks the dead
    rank will never deliver, and the other ranks could finish the epoch with records missing."""

    def __init__(self, sock: socket.socket) -> None:
        import multiprocessing
        from multiprocessing.connection import wait

        parent = multiprocessing.parent_process()
        self._stop = threading.Event()
        if parent is None or parent.sentinel is None:
            self._thread = None  # a main process: its death closes the socket itself
            return

        def run() -> None:
            while not self._stop.is_set():
                if wait([parent.sentinel], timeout=POLL_S):  # readable: the parent is gone
                    if not self._stop.is_set():
                        try:
                            sock.shutdown(socket.SHUT_RDWR)  # no goodbye: a lost reader
                        except OSError:
                            pass
                    return

        self._thread = threading.Thread(target=run, name="streamio-parent-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        # Not joined (it wakes every POLL_S): once stopped it never touches the socket, and a
        # closed socket object refuses shutdown() rather than reaching a reused descriptor.
        self._stop.set()


class SharedStreamFeed:
    """The source end of one reader's epoch over a shared stream.

    Called by the pipeline in place of reading the sources (``run`` is the epoch's state); yields
    ``(records, ids)`` blocks like the readers do, ``ids`` being the records' stream origins:
    this reader's share, block ``k`` of the stream for ``k % readers == index`` (:attr:`dealt`),
    the same records whenever the stream carries the same bytes (:attr:`replayable`).
    Worker 0 of local rank 0 also runs the dealer. ``token`` names the dealer of a single rank's
    workers (drawn by the ``StreamDataset``, copied into its workers); ``address`` (from
    :func:`stream_address`) replaces it when local ranks share the stream. Stats: the dealer's
    reader counts what the dealer read (``bytes``, ``records_read``, ...), every reader the
    records and batches it delivered.
    """

    #: The stream deals by a fixed rule: a restarted job whose stream carries the same bytes
    #: gives every reader the same records (a mid-epoch state resumes).
    replayable = True

    def __init__(self, dataset: Any, *, token: Optional[str] = None, epoch: int, worker: int,
                 num_workers: int, local_rank: int = 0, local_world_size: int = 1,
                 address: Any = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
        if (token is None) == (address is None):
            raise UsageError("SharedStreamFeed needs a token or an address (one of them)")
        self.dataset = dataset  # the Dataset whose sources the dealer reads
        self.epoch = epoch
        self.address = address if address is not None else dealer_address(token, epoch)
        self.worker = worker
        self.num_workers = num_workers
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.connect_timeout = connect_timeout
        self.dealer_name = ("worker 0" if local_world_size <= 1
                            else "worker 0 of local rank 0")
        # The largest block the dealer can send: cut at BLOCK_BYTES, so at most one record of
        # max_record_size past it, plus the source name and the records' origins and lengths.
        limit = getattr(dataset, "reader_options", {}).get("max_record_size",
                                                           DEFAULT_MAX_RECORD_SIZE)
        self.max_payload = BLOCK_BYTES + int(limit) + 16 * BLOCK_RECORDS + (64 << 10)

    @property
    def dealt(self) -> tuple:
        """``(readers, index)``: this reader's share of the stream (a shard layer of its
        resume state)."""
        return (self.local_world_size * self.num_workers,
                self.local_rank * self.num_workers + self.worker)

    def __call__(self, run: Any) -> Iterator[tuple]:
        for name, ids, records in self._session(run.stats, 0):
            run.name_source(origin_source(ids[0]), name)
            yield records, (ids if run.track_ids else None)

    def every_block(self, stats: Any) -> Iterator[tuple]:
        """Every block of the stream, ``(name, origins, records)``, in order: what each reader
        of an elastic resume replays the old readers' shares from (every reader of the epoch
        must ask for this, or none)."""
        return self._session(stats, wire.BROADCAST)

    def drain(self, stats: Any, *, broadcast: bool = False) -> None:
        """Take part in the epoch without reading: this reader's share was delivered before
        a resume (the dealer, if it runs here, goes on serving the others)."""
        flags = wire.DONE | (wire.BROADCAST if broadcast else 0)
        for _ in self._session(stats, flags):
            pass

    def _session(self, stats: Any, flags: int) -> Iterator[tuple]:
        dealer = None
        if self.worker == 0 and self.local_rank == 0:
            dealer = Dealer(self.dataset, self.address, self.epoch, self.local_world_size,
                            stats, self.connect_timeout, num_workers=self.num_workers,
                            broadcast=bool(flags & wire.BROADCAST))
            dealer.start()
        ended = False
        sock = None
        watch = None
        try:
            sock = _connect(self.address, self.connect_timeout, self.dealer_name,
                            _RUN_HINT if self.local_world_size > 1 else "")
            inbox = _Inbox(sock, self.connect_timeout, self.dealer_name)
            watch = _ParentWatch(sock)
            try:
                sock.sendall(wire.encode_hello(self.local_rank, self.worker, self.num_workers,
                                               self.local_world_size, flags))
            except OSError:
                pass  # the dealer is gone already: the read below says so
            if flags & wire.DONE:
                ended = True  # nothing to take: say goodbye below
                return
            while True:
                # Ask only when about to read: a block asked for ahead could be larger than the
                # socket's buffer, and the dealer would block sending it to a worker that the
                # DataLoader is not asking for items while it waits on another worker, which
                # waits on the dealer (a deadlock this once had). The dealer's read-ahead keeps
                # the answer quick.
                try:
                    sock.sendall(wire.WANT)
                except OSError:
                    pass  # the dealer is gone (or done and has pushed our END): read says so
                block = self._receive(inbox)
                if block is None:
                    ended = True
                    break
                yield block
        finally:
            if watch is not None:
                watch.stop()
            if sock is not None:
                if not ended or flags & wire.DONE:
                    try:
                        sock.sendall(wire.BYE)
                    except OSError:
                        pass
                sock.close()
            if dealer is not None and not ended:
                dealer.stop_now.set()  # this reader owns the stream: its early exit ends it
                dealer.join()
            elif dealer is not None:
                dealer.host_ended.set()
        # With our share out, the dealer goes on serving the others (a thread that keeps this
        # process until they have theirs); not waited for here, so that this reader's end
        # reaches its DataLoader, which may be waiting for it before it asks the others.
        if dealer is not None and not dealer.is_alive() and dealer.failure is not None:
            # Our own END came, but the epoch failed afterwards for another reader (one that
            # never connected, or died after we finished): say so here too.
            raise dealer.failure

    def _receive(self, inbox: _Inbox) -> Optional[tuple]:
        message = inbox.receive(self.max_payload)
        if message is None:
            raise SourceError(f"the DataLoader worker that reads the shared stream"
                              f" ({self.dealer_name}) stopped before the end of the epoch (it"
                              " died, or its loop ended early, or dropped this reader)")
        kind, count, payload = message
        if kind == wire.END:
            return None
        if kind == wire.ERROR:
            raise wire.parse_error(payload)
        try:
            return wire.parse_block(count, payload)
        except SourceError as exc:
            raise SourceError(f"{self.dealer_name}, which reads the shared stream, sent {exc}")

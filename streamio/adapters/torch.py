"""PyTorch adapter: a streamio ``Dataset`` as a ``torch.utils.data.IterableDataset``
(:class:`StreamDataset`, made by ``Dataset.to_torch()``), and :func:`to_device`, which overlaps
host-to-device copies with compute. The guide: docs/pytorch.md and docs/multihost.md.

Contract:

* **Every record once per epoch** over all readers (DataLoader workers x ranks). Each ``iter()``
  finds its reader (``get_worker_info()``; ``rank``/``world_size`` from ``to_torch()``, else
  ``torch.distributed``, else torchrun's ``RANK``/``WORLD_SIZE``) and reads
  ``dataset.with_context(...).shard(readers, rank * num_workers + worker)``: whole sources when
  there are enough, records dealt round-robin otherwise (each reader reads every byte).
* **A single stream** (FIFO, PipeChannel, stdin, file object) is read by one process: a host's
  readers (local ranks x workers) share it through one dealer (:mod:`streamio.sharing.stream`);
  several hosts must say what their streams hold (``node_streams``), else ``UsageError``: a
  guess would silently lose or repeat data. Sources bound to the main process: :mod:`._torch_bound`.
* **Epochs**: each ``iter()`` is one; the counter lives in shared memory so that the fresh worker
  copies of each epoch agree on its number; ``set_epoch(e)`` makes the next one ``e``. Seeds
  derive from (seed, epoch, rank, worker); a PipeChannel reads ``<prefix>_<start + epoch>``.
* **Stats**: workers publish their epoch's counters to a shared table (every
  :data:`STATS_INTERVAL_S` and at their end); ``stats()`` in the main process sums the latest
  epoch's rows.
* **Transport**: a worker's batch crosses to the main process through its ring of shared-memory
  slots (:mod:`._torch_slots`), else pickled (:mod:`._torch_transport`); the user sees dicts of
  tensors either way.
* **Uneven shares under DDP**: :func:`to_device` / :func:`even_batches` (``"drop"``, ``"pad"``
  or None) keep ranks in step with one tiny all-reduce per step, in the main process
  (:mod:`._torch_device`).
* **Resume**: ``state_dict``/``load_state_dict``, same layout or elastic (:mod:`._torch_resume`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import secrets
import time
from typing import Any, Iterator, Literal, Optional

import numpy as np

from .._util import check_int as _check_int
from ..errors import UsageError, UsageTypeError, require
from ..pipeline.stats import STATS_KEYS, merge_snapshots
from ..sharing import DEFAULT_CONNECT_TIMEOUT, SharedStreamFeed, stream_address
from ..sources import PipeChannel
from . import check_splittable, is_single_stream, source_groups
from ._torch_bound import BoundSources
from ._torch_device import (DEFAULT_DEPTH, DEFAULT_EVEN_BATCHES, DevicePrefetcher, even_batches,
                            to_device)
from ._torch_resume import ResumableReader
from ._torch_slots import for_transport as _for_transport
from ._torch_transport import convert_batch
from ._torch_usage import UsageChecks

torch = require("torch", "torch")

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_EVEN_BATCHES",
    "DevicePrefetcher",
    "NodeStreams",
    "StreamDataset",
    "convert_batch",
    "even_batches",
    "to_device",
    "to_torch",
]

#: What the hosts' streams hold when ranks on several hosts read one stream per host:
#: "replicated" - every host's FIFO carries the same records (SageMaker FullyReplicated), so each
#: host keeps its share; "sharded" - each host's FIFO carries its own records (ShardedByS3Key),
#: so each host keeps them all. No default: guessing wrong loses or repeats data silently.
NodeStreams = Optional[Literal["replicated", "sharded"]]
_NODE_STREAMS = ("replicated", "sharded", None)

# Shared epoch state: [next epoch when the counting started, iter() calls counted, readers per
# epoch in that count].
_BASE, _CALLS, _READERS, _SHIFT = 0, 1, 2, 3

#: How often a DataLoader worker publishes its running epoch's stats (and once at its end):
#: often enough for a progress display, rare enough that the lock costs nothing.
STATS_INTERVAL_S = 0.5
#: Rows of the shared stats table: workers with a higher id (rare) are not counted.
_STATS_ROWS = 64
# A row: [started_at, valid, epoch, first_batch_s (-1: none), finished, the numeric STATS_KEYS].
_NUMERIC_KEYS = tuple(k for k in STATS_KEYS if k not in ("epoch", "first_batch_s", "finished"))
_ROW = 5 + len(_NUMERIC_KEYS)


# -- who reads what -----------------------------------------------------------------------------
def _process_group() -> Optional[tuple[int, int]]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        # Also true in a forked DataLoader worker: get_rank() reads local state, no collective.
        return dist.get_rank(), dist.get_world_size()
    return None


def _distributed(explicit: Optional[tuple[int, int]],
                 from_parent: Optional[tuple[int, int]]) -> tuple[int, int]:
    """(rank, world_size): given to to_torch(), else the process group of this process (a
    forked worker inherits it), else that of the process that pickled us into a spawned worker,
    else torchrun's environment, else a single process."""
    found = explicit or _process_group() or from_parent
    if found is not None:
        return found
    # torchrun sets these before the script starts; the contract is to honour them when
    # no process group is initialised (yet).
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def _check_rank_pair(rank_name: str, rank: Any, size_name: str, size: Any) -> None:
    """A rank and its group size: both or neither, ints, the rank below the size."""
    if (rank is None) != (size is None):
        raise UsageError(f"pass both {rank_name} and {size_name}, or neither")
    if size is not None:
        _check_int(size_name, size, 1)
        _check_int(rank_name, rank, 0)
        if rank >= size:
            raise UsageError(f"{rank_name} {rank} is not below {size_name} {size}")


class _EpochCounter:
    """The next epoch number, shared by the main process and every DataLoader worker.

    A spawn-context array: its lock is a named semaphore, so it can be inherited by forked workers
    and pickled into spawned ones (a fork-context lock is unlinked at once and cannot).
    """

    def __init__(self) -> None:
        self._shared = multiprocessing.get_context("spawn").Array("q", 4)
        self._shared[_READERS] = 1

    @property
    def channel_shift(self) -> int:
        """How far the epoch numbers are ahead of a PipeChannel's FIFO numbers (a restarted
        job's FIFOs start again at ``_0``): shared, because a DataLoader worker may load a
        resume state that the epochs after it, read by other workers, must follow."""
        with self._shared.get_lock():
            return self._shared[_SHIFT]

    @channel_shift.setter
    def channel_shift(self, shift: int) -> None:
        with self._shared.get_lock():
            self._shared[_SHIFT] = shift

    def set(self, epoch: int) -> None:
        with self._shared.get_lock():
            self._shared[_BASE] = epoch
            self._shared[_CALLS] = 0

    def resumed(self, epoch: int) -> None:
        """Epoch ``epoch`` is being resumed (its readers do not count here): the next
        ``iter()`` reads ``epoch + 1``. Idempotent, so every worker of the epoch may call it."""
        self.set(epoch + 1)

    def peek(self) -> int:
        with self._shared.get_lock():
            s = self._shared
            return s[_BASE] + -(-s[_CALLS] // s[_READERS])

    def take(self, readers: int) -> int:
        """The epoch of this ``iter()``, for one of ``readers`` readers that iterate together."""
        with self._shared.get_lock():
            s = self._shared
            if readers != s[_READERS]:
                # A different DataLoader configuration: continue after the epochs counted so far.
                s[_BASE] = s[_BASE] + -(-s[_CALLS] // s[_READERS])
                s[_CALLS] = 0
                s[_READERS] = readers
            calls = s[_CALLS]
            s[_CALLS] = calls + 1
            return s[_BASE] + calls // readers


class _WorkerStats:
    """A shared-memory table where DataLoader workers publish their epoch's stats for the main
    process (spawn-context, like :class:`_EpochCounter`: inherited by forked workers and
    pickled into spawned ones)."""

    def __init__(self) -> None:
        self._shared = multiprocessing.get_context("spawn").Array("d", _STATS_ROWS * _ROW)

    def publish(self, worker: int, started_at: float, snapshot: dict) -> None:
        if worker >= _STATS_ROWS:
            return
        first = snapshot["first_batch_s"]
        row = [started_at, 1.0, float(snapshot["epoch"] or 0), -1.0 if first is None else first,
               1.0 if snapshot["finished"] else 0.0]
        row.extend(float(snapshot[key]) for key in _NUMERIC_KEYS)
        with self._shared.get_lock():
            self._shared[worker * _ROW:(worker + 1) * _ROW] = row

    def latest(self) -> Optional[tuple]:
        """``(started_at, snapshot)`` of the latest epoch the workers read, or None."""
        with self._shared.get_lock():
            table = np.array(self._shared[:], dtype=np.float64).reshape(_STATS_ROWS, _ROW)
        rows = table[table[:, 1] == 1.0]
        if not len(rows):
            return None
        # The latest epoch: the rows of the epoch of the latest-started worker (workers of one
        # epoch start within moments of each other; an older epoch's rows have another number).
        newest = rows[np.argmax(rows[:, 0])]
        rows = rows[(rows[:, 2] == newest[2]) & (rows[:, 0] > newest[0] - _EPOCH_START_SPREAD_S)]
        snapshots = []
        for row in rows.tolist():  # plain floats, not numpy scalars (stats() prints them)
            snap: dict = {"epoch": int(row[2]), "first_batch_s": None if row[3] < 0 else row[3],
                          "finished": bool(row[4])}
            for key, value in zip(_NUMERIC_KEYS, row[5:]):
                snap[key] = value
            for key in ("records", "batches", "bytes", "bytes_decoded", "records_read",
                        "skipped_records", "skipped_bytes", "sources_opened", "decoder_skipped"):
                snap[key] = int(snap[key])
            snapshots.append(snap)
        return float(rows[:, 0].min()), merge_snapshots(snapshots)


#: Workers of one epoch are forked within this many seconds of each other; a row that started
#: earlier than that before the newest one belongs to an earlier epoch with the same number
#: (set_epoch() replays).
_EPOCH_START_SPREAD_S = 60.0


class StreamDataset(ResumableReader, torch.utils.data.IterableDataset):
    """A streamio ``Dataset`` as a PyTorch ``IterableDataset``; made by ``Dataset.to_torch()``.

    Yields what the Dataset yields, with numpy arrays as tensors (see :func:`convert_batch`): for
    a batched Dataset, use ``DataLoader(..., batch_size=None)`` so that the DataLoader does not
    batch the batches. Sharding over workers and ranks, epochs and seeds: see the module
    docstring.
    """

    def __init__(self, dataset: Any, *, pin_memory: bool = False, rank: Optional[int] = None,
                 world_size: Optional[int] = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 local_rank: Optional[int] = None, local_world_size: Optional[int] = None,
                 node_streams: NodeStreams = None) -> None:
        super().__init__()
        for name in ("with_context", "shard", "sources"):
            if not hasattr(dataset, name):
                raise UsageTypeError(
                    f"to_torch needs a streamio Dataset, not {type(dataset).__name__}")
        _check_rank_pair("rank", rank, "world_size", world_size)
        _check_rank_pair("local_rank", local_rank, "local_world_size", local_world_size)
        if node_streams not in _NODE_STREAMS:
            raise UsageError(f"node_streams must be one of {_NODE_STREAMS}, not {node_streams!r}")
        self.dataset = dataset
        self.pin_memory = bool(pin_memory)
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.node_streams = node_streams
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) \
                or not connect_timeout > 0:
            raise UsageError(f"connect_timeout must be a positive number, not {connect_timeout!r}")
        self.connect_timeout = float(connect_timeout)
        # PipeChannel epoch e reads <prefix>_<start + e>, whichever copy of the channel opens it.
        self._channel_starts = {i: s.epoch for i, s in enumerate(dataset.sources)
                                if isinstance(s, PipeChannel)}
        self._epoch = _EpochCounter()
        self._worker_stats = _WorkerStats()
        # stdin, file objects, ByteSources: read by one worker, once (see _torch_bound).
        self._bound = BoundSources(tuple(dataset.sources))
        self._checks = UsageChecks()  # DataLoader set-ups that silently misbehave, said once
        self._ran_here = False  # this process ran an epoch of this object (see _torch_usage)
        # Names the dealer socket of a shared stream: the same in every worker copy of this
        # object, different from any other StreamDataset's.
        self._share_token = secrets.token_hex(8)
        self._parent_group: Optional[tuple[int, int]] = None
        self._last: Any = None  # the Dataset of the latest epoch iterated in this process
        # Resume (state_dict/load_state_dict): the running epoch's iterator in this process, a
        # state the next iter() resumes from, and how far the resumed epoch numbers are ahead
        # of the PipeChannel FIFOs (a restarted SageMaker job's FIFOs start again at _0).
        self._iterator: Any = None
        self._started_epoch: Optional[int] = None  # the epoch of the latest iter() here
        self._pending: Optional[tuple] = None  # (epoch, iterator state(s) or None)
        self._place: Optional[list] = None  # [rank, world_size, worker, num_workers] of iter()
        adopt = getattr(dataset, "add_stats_provider", None)
        if adopt is not None:
            adopt(self)  # dataset.stats() then sees the epochs read here and in the workers

    def __getstate__(self) -> dict:
        # Pickled in the main process when a spawn/forkserver DataLoader starts its workers: the
        # process group is known here but not in the new interpreter, so carry (rank, world).
        if multiprocessing.context.get_spawning_popen() is not None:
            self._bound.check_spawn()  # pickled for a spawned DataLoader worker
        state = self.__dict__.copy()
        state["_parent_group"] = _process_group() or self._parent_group
        state["_last"] = None
        state["_iterator"] = None
        return state

    def latest_stats(self) -> Optional[tuple]:
        """``(started_at, snapshot)`` of the latest epoch read through this object, in this
        process or in DataLoader workers (summed over the workers), or None."""
        found = self._worker_stats.latest()
        last = self._last
        stats = None if last is None else getattr(last, "epoch_stats", None)
        if stats is not None and (found is None or stats.started_at >= found[0]):
            found = (stats.started_at, stats.snapshot())
        return found

    def stats(self) -> dict:
        """The stats of the latest epoch read through this object, in this process or in
        DataLoader workers (summed over the workers); the same as the Dataset's ``stats()``."""
        found = self.latest_stats()
        return found[1] if found is not None else self.dataset.stats()

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` will read."""
        return self._epoch.peek()

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch ``epoch`` (later ones count on from it)."""
        _check_int("epoch", epoch, 0)
        self._epoch.set(epoch)

    def plan(self, *, epoch: int, rank: int = 0, world_size: int = 1, worker: int = 0,
             num_workers: int = 1, local_rank: Optional[int] = None,
             local_world_size: Optional[int] = None) -> Any:
        """The streamio Dataset one reader reads in ``epoch`` (what ``__iter__`` uses).

        ``local_rank``/``local_world_size``: where this rank sits on its host, for a single
        stream shared by the host's ranks; None: ``to_torch()``'s, else torchrun's environment,
        else one host (see the module docstring)."""
        readers = world_size * num_workers
        ds = self.dataset.with_context(epoch=epoch, rank=rank, world_size=world_size,
                                       worker=worker, num_workers=num_workers)
        sources = tuple(self.dataset.sources)
        if readers > 1 and _must_share(sources, readers):
            ds = self._plan_shared(ds, epoch, rank, world_size, worker, num_workers, local_rank,
                                   local_world_size)
        elif readers > 1:
            for group in source_groups(self.dataset):  # a mix: each reader shards every input
                check_splittable(group, readers,
                                 f"{world_size} rank(s) x {num_workers} DataLoader worker(s)",
                                 "use DataLoader(num_workers=0) on a single process")
            ds = ds.shard(readers, rank * num_workers + worker)
        for i, start in self._channel_starts.items():
            sources[i].epoch = start + epoch - self._epoch.channel_shift
        return ds

    def _local(self, rank: int, world_size: int, local_rank: Optional[int],
               local_world_size: Optional[int]) -> tuple[int, int]:
        """(local rank, local world size): given to plan(), else to to_torch(), else torchrun's
        LOCAL_RANK/LOCAL_WORLD_SIZE when they fit (rank, world_size), else one host."""
        found = None
        if local_world_size is not None:
            found = (local_rank, local_world_size)
        elif self.local_world_size is not None:
            found = (self.local_rank, self.local_world_size)
        if found is not None:
            lr, lws = found
            if world_size % lws or lr != rank % lws:
                raise UsageError(f"local_rank {lr} of local_world_size {lws} does not fit rank"
                                 f" {rank} of world_size {world_size}: ranks are numbered host"
                                 " by host, rank = host * local_world_size + local_rank")
            return lr, lws
        try:  # torchrun sets these; explicit rank/world_size (a host's own ranks) may not match
            lr = int(os.environ["LOCAL_RANK"])
            lws = int(os.environ["LOCAL_WORLD_SIZE"])
        except (KeyError, ValueError):
            return rank, world_size
        if 0 < lws <= world_size and world_size % lws == 0 and lr == rank % lws:
            return lr, lws
        return rank, world_size

    def _plan_shared(self, ds: Any, epoch: int, rank: int, world_size: int, worker: int,
                     num_workers: int, local_rank: Optional[int],
                     local_world_size: Optional[int]) -> Any:
        """A reader's plan when the readers must share a single stream: the host's readers
        (local ranks x workers) share its stream through one dealer."""
        local_rank, local_world = self._local(rank, world_size, local_rank, local_world_size)
        nodes, node = world_size // local_world, rank // local_world
        host_data = self.dataset
        if nodes > 1:
            if self.node_streams is None:
                raise UsageError(
                    f"{world_size} ranks on {nodes} hosts ({local_world} per host) read a single"
                    " stream on each host: say what the hosts' streams hold with"
                    " to_torch(node_streams='replicated') (every host's FIFO carries the same"
                    " records, SageMaker FullyReplicated: each host keeps its share) or"
                    " node_streams='sharded' (each host's FIFO carries its own records,"
                    " ShardedByS3Key: each host keeps them all)")
            if self.node_streams == "replicated":
                host_data = host_data.shard(nodes, node)
                ds = host_data.with_context(epoch=epoch, rank=rank, world_size=world_size,
                                            worker=worker, num_workers=num_workers)
        host_readers = local_world * num_workers
        index = local_rank * num_workers + worker
        host_sources = tuple(host_data.sources)
        if host_readers == 1:
            return ds  # the host's one reader reads its stream (its share, if replicated)
        if not _must_share(host_sources, host_readers):
            # Enough sources on this host for whole ones each (or files to split).
            check_splittable(host_sources, host_readers,
                             f"{local_world} local rank(s) x {num_workers} DataLoader worker(s)",
                             "use DataLoader(num_workers=0) on a single process")
            return ds.shard(host_readers, index)
        if getattr(self.dataset.decoder, "header", False) is True:
            raise UsageError("a CSV header cannot be read from one stream shared by several"
                             " DataLoader workers or ranks: give the decoder its column names"
                             " (header=False), or use num_workers=0 on a single rank")
        if local_world == 1:
            # One rank's workers: a token copied into them names the dealer.
            feed = SharedStreamFeed(host_data, token=self._share_token, epoch=epoch,
                                    worker=worker, num_workers=num_workers,
                                    connect_timeout=self.connect_timeout)
        else:
            # Ranks are separate processes with separate tokens: they meet at an address derived
            # from what they all know (the stream, the epoch, the job).
            feed = SharedStreamFeed(host_data, address=stream_address(host_sources, epoch),
                                    epoch=epoch, worker=worker, num_workers=num_workers,
                                    local_rank=local_rank, local_world_size=local_world,
                                    connect_timeout=self.connect_timeout)
        return ds.with_feed(feed)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        self._checks.check_collation(self.dataset)
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        explicit = None if self.rank is None else (self.rank, self.world_size)
        rank, world_size = _distributed(explicit, self._parent_group)
        epoch, pending = self._take_epoch(num_workers)
        self._started_epoch = epoch
        if info is not None:
            self._checks.check_worker_epoch(self.dataset, epoch, self._ran_here)
            self._ran_here = True
        self._place = [rank, world_size, worker, num_workers]
        self._iterator = None
        ds = self.plan(epoch=epoch, rank=rank, world_size=world_size, worker=worker,
                       num_workers=num_workers)
        if info is None:
            self._bound.note_main(ds.sources, epoch)
        else:
            readers = world_size * num_workers
            shared = readers > 1 and _must_share(tuple(self.dataset.sources), readers)
            reads = self._bound.adopt(ds, shared, worker)
        self._resume(ds, pending, epoch, rank, world_size, worker, num_workers)
        # Pinned memory does not survive the trip from a worker to the main process (tensors go
        # through shared memory); there DataLoader(pin_memory=True) does the pinning.
        pin = self.pin_memory and info is None and torch.cuda.is_available()
        self._last = ds
        if info is None:
            return self._generate(ds, pin)
        return self._generate_in_worker(ds, worker, reads, epoch)

    def _generate(self, ds: Any, pin: bool) -> Iterator[Any]:
        iterator = iter(ds)
        self._iterator = iterator if hasattr(iterator, "state_dict") else None
        try:
            for batch in iterator:
                yield convert_batch(batch, pin_memory=pin)
        finally:
            # Now, not when the iterator is collected: self._iterator keeps it (for
            # state_dict(), which a closed iterator still answers) and its prefetch thread.
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def _generate_in_worker(self, ds: Any, worker: int, reads: tuple = (),
                            epoch: int = 0) -> Iterator[Any]:
        """The worker's share, publishing its stats for the main process as it goes and when it
        ends (before the DataLoader learns that this worker is done); a source bound to the
        main process that its epoch reads again is refused (:mod:`._torch_bound`)."""
        iterator = iter(ds)
        self._iterator = iterator if hasattr(iterator, "state_dict") else None
        stats = getattr(ds, "epoch_stats", None)
        if stats is None:  # not a streamio Dataset: nothing to publish
            yield from self._generate(iterator, False)
            return
        board = self._worker_stats
        clock = time.monotonic
        published = clock()
        try:
            for batch in self._bound.watch(iterator, reads, epoch, stats):
                if clock() - published >= STATS_INTERVAL_S:
                    board.publish(worker, stats.started_at, stats.snapshot())
                    published = clock()
                yield _for_transport(convert_batch(batch))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            board.publish(worker, stats.started_at, stats.snapshot())

    def __repr__(self) -> str:
        return f"StreamDataset({self.dataset!r}, next epoch {self.epoch})"




def _must_share(sources: tuple, readers: int) -> bool:
    """Whether ``readers`` readers can only split ``sources`` by sharing one reader of a stream
    (fewer sources than readers, and one of them a FIFO, PipeChannel, stdin or file object)."""
    return len(sources) < readers and any(is_single_stream(s) for s in sources)


def to_torch(dataset: Any, *, pin_memory: bool = False, rank: Optional[int] = None,
             world_size: Optional[int] = None,
             connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
             local_rank: Optional[int] = None, local_world_size: Optional[int] = None,
             node_streams: NodeStreams = None) -> StreamDataset:
    """``dataset`` as a ``torch.utils.data.IterableDataset`` of dicts of tensors.

    ``pin_memory``: pin the tensors (only when CUDA is available and only with ``num_workers=0``;
    with workers pass ``DataLoader(pin_memory=True)``). ``rank``/``world_size``: override what is
    found from ``torch.distributed`` or the torchrun environment. ``connect_timeout``: with one
    stream shared by DataLoader workers (and local ranks), how long the readers wait for each
    other to connect; a rank that has not connected by then ends the epoch with a
    ``SourceError`` naming it. ``local_rank``/``local_world_size``: this rank's place on its host
    (default: torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), for one stream shared by the
    host's ranks. ``node_streams``: with ranks on several hosts each reading its own single
    stream, ``"replicated"`` (the hosts' streams carry the same records: each host keeps its
    share) or ``"sharded"`` (each carries its own: keep all); required there, no default (a
    wrong guess silently loses or repeats data).
    """
    return StreamDataset(dataset, pin_memory=pin_memory, rank=rank, world_size=world_size,
                         connect_timeout=connect_timeout, local_rank=local_rank,
                         local_world_size=local_world_size, node_streams=node_streams)

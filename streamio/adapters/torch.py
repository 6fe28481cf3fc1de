"""PyTorch adapter: a streamio ``Dataset`` as a ``torch.utils.data.IterableDataset``, and
:func:`to_device`, which overlaps host-to-device copies with compute.

How the work is split (every record once per epoch)
--------------------------------------------------
Inside ``__iter__`` each reader (a DataLoader worker, or the main process with ``num_workers=0``)
learns who it is: ``worker``/``num_workers`` from ``torch.utils.data.get_worker_info()`` and
``rank``/``world_size`` from ``torch.distributed`` when it is initialised, else from the
``RANK``/``WORLD_SIZE`` variables that ``torchrun`` sets (or from ``to_torch(rank=...,
world_size=...)``, which wins). It then reads
``dataset.with_context(epoch=..., rank=..., worker=...).shard(world_size * num_workers,
rank * num_workers + worker)``:

* at least as many sources as readers: each reader takes whole sources (no byte is read twice);
* fewer sources: records are dealt round-robin, so every reader reads (and frames) *all* the
  bytes of every source and keeps its share. That is correct but costs ``readers`` times the I/O
  and framing: give each reader its own file where you can. It is only possible for sources
  that can be read more than once at the same time (regular files, URLs, bytes);
* a single stream (a FIFO, a :class:`~streamio.PipeChannel`, stdin, a file object) cannot be
  read by two processes - they would steal each other's bytes. With one rank and
  ``num_workers=k``, worker 0 reads it and deals blocks of records to all ``k`` workers (each
  record to exactly one), which decode and transform in parallel: see
  :mod:`streamio.sharing.stream` (each worker shuffles its own share; a dead worker ends
  the epoch with an error on every side). stdin, a file object or an open ByteSource belongs to
  the main process: its worker reads the main process's (once; a later epoch that would read it
  again is a ``UsageError``, see :mod:`._torch_bound`). The local ranks of a host share it too (torchrun
  on an 8-GPU host, one FIFO per host and channel in SageMaker): local rank 0's worker 0 (its
  main process with ``num_workers=0``) deals to ``LOCAL_WORLD_SIZE x max(1, num_workers)``
  readers. The local rank and local world size come from ``to_torch(local_rank=...,
  local_world_size=...)``, else torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (when they fit
  the rank and world size), else one host holds every rank. With several hosts
  (``world_size > local_world_size``) each host reads its own stream, and
  ``to_torch(node_streams=...)`` must say what they hold: ``"replicated"`` (every host's FIFO has
  the same records, SageMaker ``FullyReplicated``: host ``rank // local_world_size`` keeps every
  ``nodes``-th record) or ``"sharded"`` (each host's FIFO has its own records,
  ``ShardedByS3Key``: it keeps them all). There is no default because a wrong guess silently
  loses or repeats data; a multi-host run over single streams without it raises
  :class:`~streamio.errors.UsageError`. (``sagemaker.channel()`` takes the host's share itself and
  passes the local rank as the rank: it needs none of this.)

Epochs
------
Each ``iter()`` is an epoch. DataLoader workers get a fresh copy of the dataset object every
epoch (``persistent_workers=False``), so the epoch counter lives in a small shared-memory array
that the copies share: every reader's ``iter()`` advances it, and readers of the same epoch agree
on its number. ``set_epoch(e)`` (as with ``DistributedSampler``) says "the next epoch is ``e``";
later ones follow ``e + 1``, ``e + 2``... Shuffle seeds derive from (seed, epoch, rank, worker).
A :class:`~streamio.PipeChannel` source reads ``<prefix>_<start + epoch>``, so worker copies
made each epoch still read the right FIFO.

Stats
-----
``Dataset.stats()`` (and ``StreamDataset.stats()``) describe the latest epoch, wherever it was
read: a DataLoader worker writes its epoch's counters into a small shared-memory table (one row
per worker, at most every :data:`STATS_INTERVAL_S` and when its share ends), and the main process
sums the rows of the latest epoch (see ``merge_snapshots``).

From workers to the main process
---------------------------------
A DataLoader worker's batch (a dict) crosses to the main process pickled. Its fixed-dtype
tensors are copied once into a slot of the worker's ring of shared memory (allocated once per
worker) and only a descriptor crosses the pipe; the main process gets a plain dict of writable
tensors over the slot, which returns to the worker when they are released
(:mod:`._torch_slots`). A batch that finds no free slot goes as one buffer inside the pickle up
to :data:`PIPE_BATCH_BYTES`, torch's shared memory (a segment per tensor) above. Nothing changes
for the user: ``collate_fn`` in the worker still sees a dict of tensors, and
``pin_memory=True`` pins in the main process as before.

Uneven shares under DDP
-----------------------
Ranks rarely hold the same number of batches, and a rank that stops early leaves the others
waiting forever in DDP's gradient all-reduce. Collectives can only run in the main process, so the
policy is applied there: :func:`to_device` (or :func:`even_batches` when you do not use it) does
one tiny all-reduce of a "have a batch" flag per step. ``"drop"`` (the default) ends the epoch on
every rank when the first rank runs out (the surplus batches of the other ranks are not used this
epoch); ``"pad"`` keeps going until the last rank runs out, and ranks that ran out repeat their
last batch (every record is used at least once; some twice); ``None`` does nothing. Ranks that
share one stream get every ``readers``-th block of 64 records (the same split in every run), so
their shares differ by at most one block and a short last one; the same policies apply
(``"drop"`` leaves that surplus unused in that epoch: use ``"pad"`` where every record must be
seen).
"""

from __future__ import annotations

import json
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
from ._torch_usage import UsageChecks
from ._torch_device import (DEFAULT_DEPTH, DEFAULT_EVEN_BATCHES, DevicePrefetcher, even_batches,
                            to_device)
from ._torch_slots import for_transport as _for_transport
from ._torch_transport import convert_batch

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


class StreamDataset(torch.utils.data.IterableDataset):
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
                raise UsageTypeError(f"to_torch needs a streamio Dataset, not {type(dataset).__name__}")
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

    # -- resume: torchdata StatefulDataLoader / torch.distributed.checkpoint Stateful -----------
    def state_dict(self) -> dict:
        """Where this process's reading stands, as a small JSON-serialisable dict.

        With ``DataLoader(num_workers=0)`` this is the epoch the loop is in; in a DataLoader
        worker it is that worker's share, which is what torchdata's ``StatefulDataLoader``
        collects from each worker (call ``loader.state_dict()`` there, not this).

        ``{"streamio_torch": 1, "resume": TEXT}``, TEXT a JSON object: ``epoch`` and
        ``iterator`` (``Dataset.iter_from``'s state, or None when this reader has begun its epoch
        but delivered nothing: its worker mates may have, and it must rejoin that epoch; before
        any ``iter()`` the epoch is None too, which restores nothing). One string, so that the
        structure never changes: ``torch.distributed.checkpoint`` loads into the structure the
        receiving object's ``state_dict()`` has."""
        it = self._iterator
        inner = {"epoch": self._started_epoch,
                 "iterator": None if it is None else it.state_dict(),
                 "place": self._place}
        return {"streamio_torch": 1, "resume": json.dumps(inner, sort_keys=True)}

    def load_state_dict(self, state: Any) -> None:
        """Make the next ``iter()`` finish the epoch ``state`` was taken in, exactly (see
        ``Dataset.iter_from``); the epochs after it count on from there.

        ``state`` may also be a **list** of the interrupted run's states gathered from every
        rank: each a ``StreamDataset.state_dict()`` or a whole torchdata
        ``StatefulDataLoader.state_dict()`` (its workers' states are taken from it). On the same
        layout (ranks x workers) each reader resumes from its own; on another, each reader gets
        its share of what the old readers had not delivered (elastic resume:
        :mod:`streamio.pipeline.elastic`). Call it before the DataLoader is made, on the
        dataset it is given, and do not load the old loader's state into the new loader."""
        if isinstance(state, (list, tuple)):
            self._load_states(list(state))
            return
        if isinstance(state, dict) and "streamio_torch" not in state and (
                "_snapshot" in state or "dataset_state" in state):
            self._load_states([state])  # a whole StatefulDataLoader state: its workers' states
            return
        epoch, inner, place = _unpack(state, with_place=True)
        _check_reader(place)
        self._set_pending(epoch, inner)

    def _set_pending(self, epoch: Any, inner: Any) -> None:
        if epoch is None:
            self._pending = None
            return
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"resume state: epoch must be an int >= 0, not {epoch!r}")
        if inner is not None and not hasattr(self.dataset, "iter_from"):
            raise UsageError("this Dataset cannot resume (it has no iter_from)")
        if inner is not None:
            from ..pipeline.resume import check_fields

            try:
                for one in ([r[1] for r in inner.readers if r[1] is not None]
                            if isinstance(inner, _Gathered) else [inner]):
                    check_fields(one)  # the rest is checked against each reader's plan
            except UsageTypeError:
                raise UsageError("not a StreamDataset state: its 'iterator' is not a resume"
                                 " state") from None
        self._pending = (epoch, None if inner is None else inner)
        if isinstance(inner, _Gathered):
            # Loaded in the main process for every DataLoader worker (forked or spawned with
            # this object): the resumed epoch's readers count as that epoch's, and a reader that
            # takes a later epoch (the next epoch's workers, made from the same object) leaves
            # the states alone.
            self._epoch.set(epoch)
        else:
            self._epoch.resumed(epoch)
        for i, start in self._channel_starts.items():
            # The next FIFO this channel opens carries the resumed epoch.
            self._epoch.channel_shift = epoch - (self.dataset.sources[i].epoch - start)

    def _load_states(self, states: list) -> None:
        """The list form of :meth:`load_state_dict`: every old reader's place and iterator
        state, kept for ``__iter__`` to sort out against the new layout."""
        readers = []
        for k, state in enumerate(states):
            for inner_state in _dataset_states(state, k):
                readers.append(_unpack(inner_state, with_place=True))
        epochs = sorted({epoch for epoch, _, _ in readers if epoch is not None})
        if not epochs:
            self._set_pending(None, None)  # no reader had started: nothing to restore
            return
        if len(epochs) > 1:
            raise UsageError(f"resume states: the readers' states are from different epochs"
                             f" {epochs[:4]}: give the states of one checkpoint")
        for _, inner, place in readers:
            if inner is not None and place is None:
                raise UsageError("resume states: a reader's state has no 'place' (taken by a"
                                 " streamio before elastic resume): load it into its own reader")
        self._set_pending(epochs[0], _Gathered(readers))

    def _elastic_state(self, gathered: "_Gathered", epoch: int, rank: int, world_size: int,
                       worker: int, num_workers: int) -> Any:
        """This reader's resume from every old reader's state: its own on the same layout,
        else the list of all old readers' Dataset states (a reader that had delivered nothing
        gets a state of its plan at 0), for ``Dataset.iter_from``. The list must hold every
        old reader once: one missing or repeated would repeat or lose its deliveries."""
        known = {}
        for _, inner, place in gathered.readers:
            if place is None:
                continue  # a reader that had not started (no place, nothing delivered)
            key = (place[0], place[2])
            if key in known:
                raise UsageError(f"resume states: rank {place[0]} worker {place[2]} appears twice"
                                 " in the list: give each old rank's state once")
            known[key] = (place, inner)
        if not any(inner is not None for _, inner in known.values()):
            return None  # no reader had delivered anything: the epoch from its start
        layouts = {(p[1], p[3]) for p, _ in known.values()}
        if len(layouts) != 1:
            raise UsageError(f"resume states: readers from different layouts (world_size,"
                             f" num_workers) {sorted(layouts)[:4]}: give one checkpoint's states")
        old_world, old_workers = layouts.pop()
        if len(gathered.readers) != old_world * old_workers:
            missing = sorted({(r, w) for r in range(old_world) for w in range(old_workers)}
                             - set(known))
            raise UsageError(
                f"resume states: the list holds {len(gathered.readers)} readers' states, the"
                f" interrupted run had {old_world} rank(s) x {old_workers} worker(s): give"
                f" every old rank's state once (missing: rank, worker {missing[:4]})")
        if (old_world, old_workers) == (world_size, num_workers):
            own = known.get((rank, worker))
            return None if own is None else own[1]
        from ..pipeline.resume import make_state, with_seeds

        template = next(inner for _, inner in known.values() if inner is not None)
        # A shared stream's old readers sat on hosts of stream[0] / workers local ranks each.
        local_world = template["stream"][0] // old_workers if "stream" in template else None
        out = []
        for r in range(old_world):
            for w in range(old_workers):
                found = known.get((r, w), (None, None))[1]
                if found is None:  # that reader had delivered nothing: all of its share is left
                    old = self.plan(epoch=epoch, rank=r, world_size=old_world, worker=w,
                                    num_workers=old_workers,
                                    local_rank=None if local_world is None else r % local_world,
                                    local_world_size=local_world)
                    found = make_state(with_seeds(old, template["seeds"]), epoch, 0, False)
                out.append(found)
        return out

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        self._checks.check_collation(self.dataset)
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        explicit = None if self.rank is None else (self.rank, self.world_size)
        rank, world_size = _distributed(explicit, self._parent_group)
        pending, self._pending = self._pending, None
        if pending is not None and isinstance(pending[1], _Gathered):
            epoch = self._epoch.take(num_workers)
            if epoch != pending[0]:
                pending = None
        else:
            epoch = pending[0] if pending is not None else self._epoch.take(num_workers)
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
        resume = None if pending is None else pending[1]
        if isinstance(resume, _Gathered):
            resume = self._elastic_state(resume, epoch, rank, world_size, worker, num_workers)
        if resume is not None:
            # Checked against this reader's plan (its shard, worker and rank) now, in __iter__,
            # so a state from another worker layout fails here rather than resuming wrongly.
            ds.load_state_dict(resume)
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


class _Gathered:
    """Every old reader's ``(epoch, iterator state or None, place or None)``, from a list
    given to :meth:`StreamDataset.load_state_dict`."""

    __slots__ = ("readers",)

    def __init__(self, readers: list) -> None:
        self.readers = readers


def _unpack(state: Any, with_place: bool = False) -> tuple:
    """``(epoch, iterator state or None)`` of a ``StreamDataset.state_dict()``, checked (and
    its reader's place, ``[rank, world_size, worker, num_workers]`` or None, ``with_place``)."""
    if not isinstance(state, dict) or state.get("streamio_torch") != 1:
        raise UsageError("not a StreamDataset state (from StreamDataset.state_dict())")
    try:
        outer = json.loads(state["resume"])
        inner = outer["iterator"]
        epoch = outer["epoch"]
        place = outer.get("place")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"not a StreamDataset state: {exc!r}") from None
    if isinstance(inner, dict):
        place = inner.get("place", place)
    if place is not None and not (isinstance(place, list) and len(place) == 4 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in place)
            and place[0] < place[1] and place[2] < place[3]):
        raise UsageError(f"not a StreamDataset state: its place is {place!r:.80}")
    return (epoch, inner, place) if with_place else (epoch, inner)


def _check_reader(place: Any) -> None:
    """One reader's state (``place``: ``[rank, world_size, worker, num_workers]``) loaded alone
    is its share of the epoch: refused now, not inside a worker at iteration, where it cannot
    be this process's (the main process, for a DataLoader with workers: every worker would get
    it) or this worker's (another number of workers)."""
    if place is None:
        return
    _, _, worker, workers = place
    info = torch.utils.data.get_worker_info()
    hint = ("pass the list of every rank's state (each rank's loader.state_dict()) to"
            " to_torch(...).load_state_dict([...]) before making the loader: it resumes on any"
            " number of ranks and workers")
    if info is None and workers > 1:
        raise UsageError(f"resume state of DataLoader worker {worker} of {workers} alone: it is"
                         f" that worker's share of the epoch; {hint}")
    if info is not None and (info.id, info.num_workers) != (worker, workers):
        raise UsageError(f"resume state of DataLoader worker {worker} of {workers} loaded into"
                         f" worker {info.id} of {info.num_workers}: a loader resumes its own"
                         f" state only with as many workers; {hint}")


def _dataset_states(state: Any, k: int) -> list:
    """The StreamDataset states in one element of a gathered list: itself, or a torchdata
    ``StatefulDataLoader.state_dict()``'s (``dataset_state`` with ``num_workers=0``, each
    worker's under ``_snapshot``/``_worker_snapshots`` otherwise)."""
    if isinstance(state, dict) and state.get("streamio_torch") == 1:
        return [state]
    if isinstance(state, dict) and isinstance(state.get("dataset_state"), dict):
        return [state["dataset_state"]]
    workers = state.get("_snapshot", {}).get("_worker_snapshots") if isinstance(state, dict) \
        else None
    if isinstance(workers, dict) and workers:
        found = [w.get("dataset_state") if isinstance(w, dict) else None
                 for w in workers.values()]
        if all(isinstance(f, dict) for f in found):
            return found
    raise UsageError(f"resume states[{k}]: neither a StreamDataset state nor a torchdata"
                     " StatefulDataLoader state holding them")


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

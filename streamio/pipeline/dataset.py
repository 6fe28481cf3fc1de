"""``streamio.Dataset``: a re-iterable, immutable description of a record pipeline.

Each ``iter(ds)`` is one epoch: the sources are opened again (a :class:`~streamio.PipeChannel`
moves to its next FIFO), read one at a time, and the records flow through the stages in the
order the methods were called. Every method returns a new Dataset; nothing is read before the
first ``next()``.

Inside an epoch, items travel in *blocks*: the list of records a reader completed from one
chunk, or the list of batches cut from such lists. Stages work on whole lists (slicing, numpy
indexing) rather than calling Python code per record; the consumer's iterator hands the items
out one by one.
"""

from __future__ import annotations

import collections
import itertools
import operator
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from .._util import batch_rows as _batch_rows, check_int as _check_int, close_iterator as _close
from ..decoders._skips import counting_skips
from ..errors import DecodeError, FormatError
from ..errors import UsageError, UsageTypeError
from ..reader import RecordReader, check_keywords, expand_sources
from ..sources import check_source, source_name
from . import parallel
from . import resume as _resume
from .prefetch import Prefetcher
from .ranges import plan_range
from .shuffle import ShuffleBuffer, derive_rng, estimate_nbytes, new_seed
from .stats import EpochStats, empty_snapshot

__all__ = ["Dataset", "PipelineContext"]

# A record's origin travels as one int: the source's position in the Dataset's source list in
# the high bits and the record's index in that source below, so a shuffled batch that fails to
# decode can still name its record. 2**40 records per source is far beyond any stream.
_INDEX_BITS = 40
_INDEX_MASK = (1 << _INDEX_BITS) - 1


@dataclass(frozen=True)
class PipelineContext:
    """Where an epoch runs, for seeds: ``(seed, epoch, rank, worker)`` gives each its own order.

    ``epoch=None``: the Dataset counts its own iterations (0, 1, 2, ...). The torch and tf
    adapters pin it and set rank/worker through :meth:`Dataset.with_context`.
    """

    epoch: Optional[int] = None
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1


# -- stages -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Shuffle:
    buffer_size: int
    buffer_bytes: Optional[int]
    seed: int
    initial: Optional[int]
    seed_drawn: bool = False  # seed=None: drawn here, so a resume state's seed replaces it


@dataclass(frozen=True)
class _Batch:
    batch_size: int
    drop_last: bool


@dataclass(frozen=True)
class _ShuffleBatches:
    n: int
    seed: int
    seed_drawn: bool = False


@dataclass(frozen=True)
class _Prefetch:
    n: Optional[int]  # None: the queue sizes itself


@dataclass(frozen=True)
class _Map:
    fn: Any
    num_parallel: Optional[int]
    ordered: bool
    backend: str
    seed: Optional[int]

    @property
    def resume_order(self) -> Optional[str]:
        # In order, a map's output is its function of the input (random draws come from the
        # per-record seeds), so a replayed epoch is the same; as tasks finish, it is not.
        return "preserve" if self.ordered else None


@dataclass(frozen=True)
class _Filter:
    predicate: Any
    resume_order = "preserve"  # drops items, keeps the order of the rest


@dataclass(frozen=True)
class _Skip:
    n: int


@dataclass(frozen=True)
class _Take:
    n: int


# -- argument checks ----------------------------------------------------------------------------
def _check_seed(seed: Any) -> int:
    if seed is None:
        # Drawn once, here: iterations of this Dataset then differ by epoch, reproducibly.
        return new_seed()
    return _check_int("seed", seed, 0)


def _takes_header(decoder: Any) -> bool:
    """Whether the decoder reads column names from each stream's first record (CSV header)."""
    return getattr(decoder, "header", False) is True


#: Adapters (to_torch/to_tf results) whose epochs stats() considers: the latest few made.
_STATS_PROVIDERS = 8
#: How many source names repr() shows before it abbreviates.
_REPR_SOURCES = 4
_REPR_DECODER_WIDTH = 60


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_DECODER_WIDTH else f"{type(value).__name__}(...)"


def _stage_call(stage: Any) -> str:
    """A stage as the method call that made it: ``.shuffle(10000, seed=0)``."""
    if isinstance(stage, _Shuffle):
        extra = "".join(f", {name}={getattr(stage, name)!r}" for name in ("buffer_bytes", "initial")
                        if getattr(stage, name) is not None)
        return f".shuffle({stage.buffer_size}{extra}, seed={stage.seed})"
    if isinstance(stage, _Batch):
        return f".batch({stage.batch_size}{', drop_last=True' if stage.drop_last else ''})"
    if isinstance(stage, _ShuffleBatches):
        return f".shuffle_batches({stage.n}, seed={stage.seed})"
    if isinstance(stage, _Prefetch):
        return f".prefetch({'' if stage.n is None else stage.n})"
    if isinstance(stage, _Skip):
        return f".skip({stage.n})"
    if isinstance(stage, _Take):
        return f".take({stage.n})"
    return f".{type(stage).__name__.lstrip('_').lower()}(...)"  # a stage added later


def _csv_framing(format: str, decoder: Any, options: dict) -> dict:
    """The reader options, with a CSV decoder's delimiter and quotechar unless given: the
    framer needs them too (a quote opens a quoted field only at the start of a field)."""
    if format != "csv" or not isinstance(getattr(decoder, "delimiter", None), str):
        return options
    wanted = {"delimiter": decoder.delimiter, "quotechar": getattr(decoder, "quotechar", '"')}
    defaults = {"delimiter": ",", "quotechar": '"'}
    extra = {k: v for k, v in wanted.items() if k not in options and v != defaults[k]}
    return {**options, **extra} if extra else options


# -- the Dataset ----------------------------------------------------------------------------------
class Dataset:
    """A re-iterable description of a stream pipeline: each ``iter()`` is one epoch.

    ``Dataset(source_or_list, format, *, decoder=None, **reader_options)``:

    - ``source_or_list``: anything :func:`streamio.read_records` reads (a path, FIFO, ``"-"``,
      URL, file object, bytes, :class:`~streamio.PipeChannel`), a glob (``"data/*.tfrecord"``,
      sorted), a directory (its files, sorted, hidden ones skipped), or a list of these, read
      in order, one source open at a time;
    - ``format``: ``"tfrecord"``, ``"recordio"``, ``"csv"``, ``"lines"``;
    - ``decoder``: turns each batch of records into a dict of numpy arrays (``batch()``);
      without one (or without ``batch()``) items are raw records, and a batch is a ``list``;
    - ``reader_options``: passed to :class:`~streamio.RecordReader` (``compression``,
      ``verify``, ``on_error``, ``multipart``, ``max_record_size``, ``read_size``,
      ``read_timeout``, format options). Checked now; the sources are opened only when an epoch
      starts.

    Methods (each returns a new Dataset; the receiver is unchanged): :meth:`shuffle`,
    :meth:`batch`, :meth:`shuffle_batches`, :meth:`map`, :meth:`filter`, :meth:`prefetch`,
    :meth:`shard`, :meth:`skip`,
    :meth:`take`, :meth:`with_context`. :meth:`stats` describes the latest epoch.

    Seeds derive from ``(seed, epoch, rank, worker)``: the same seed gives the same orders,
    each epoch its own. The epoch counter belongs to the Dataset object being iterated (its
    first ``iter()`` is epoch 0) unless :meth:`with_context` pins it.

    ``iter(ds)`` returns an :class:`EpochIterator`; leaving the loop early, dropping the
    iterator or calling its ``close()`` stops prefetch threads and closes the sources.
    """

    def __init__(self, source_or_list: Any, format: str, *, decoder: Any = None,
                 **reader_options: Any) -> None:
        check_keywords(format, reader_options, also=("decoder",))
        sources = expand_sources(source_or_list)
        for source in sources:
            check_source(source)
        reader_options = _csv_framing(format, decoder, reader_options)
        # A RecordReader checks the format, its options and their values when it is built, and
        # opens nothing until it is iterated: build one now so mistakes surface here.
        RecordReader(sources[0], format, **reader_options)
        if decoder is not None and not callable(getattr(decoder, "decode_batch", None)):
            raise UsageTypeError("decoder must have a decode_batch() method, not"
                            f" {type(decoder).__name__}")
        self._all_sources = sources
        self._format = format
        self._decoder = decoder
        self._reader_options = dict(reader_options)
        self._selection: tuple = tuple(range(len(sources)))
        self._round_robin: tuple = ()  # (num_shards, index) layers over each source's records
        self._stages: tuple = ()
        self._context = PipelineContext()
        self._feed: Any = None  # reads the records instead of the sources (a shared stream)
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        self._epochs_started = 0
        self.__dict__.pop("_pending_state", None)  # load_state_dict() is for this object only
        self._last_stats: Optional[EpochStats] = None
        # Adapters that read this Dataset elsewhere (DataLoader workers, a tf.data generator)
        # report their epochs here, so that stats() describes what happened. Held strongly (a
        # user may drop the DataLoader and then ask), but only the latest few.
        self._stats_providers: collections.deque = collections.deque(maxlen=_STATS_PROVIDERS)

    def _add_stats_provider(self, provider: Any) -> None:
        """Let :meth:`stats` also consider ``provider.latest_stats()``: ``None`` or
        ``(started_at, snapshot)`` of the latest epoch it read (wall-clock start)."""
        self._stats_providers.append(provider)

    def _derive(self, **changes: Any) -> "Dataset":
        new = object.__new__(type(self))  # a subclass (a SageMaker channel's) stays itself
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        new._reset_runtime()
        return new

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_last_stats"] = None  # holds a lock; stats belong to the process that iterated
        # They stay in the process that made them (a worker reports through the adapter).
        state["_stats_providers"] = collections.deque(maxlen=_STATS_PROVIDERS)
        return state

    # -- description ------------------------------------------------------------------------
    @property
    def sources(self) -> tuple:
        """The sources this Dataset reads, in order (globs and directories expanded; after a
        whole-source :meth:`shard`, only this shard's)."""
        return tuple(self._all_sources[i] for i in self._selection)

    @property
    def format(self) -> str:
        return self._format

    @property
    def decoder(self) -> Any:
        return self._decoder

    @property
    def reader_options(self) -> dict:
        return dict(self._reader_options)

    @property
    def batch_size(self) -> Optional[int]:
        """The batch size of :meth:`batch`, or None when items are single records."""
        for stage in self._stages:
            if isinstance(stage, _Batch):
                return stage.batch_size
        return None

    @property
    def maps_items(self) -> bool:
        """Whether a :meth:`map` changes what the items are (adapters then learn their types
        from the first item rather than from the decoder)."""
        return any(isinstance(s, _Map) for s in self._stages)

    @property
    def map_parallelism(self) -> int:
        """The most threads or processes any :meth:`map` runs on (1 when none runs in
        parallel): what ``diagnose`` counts as decoders already there."""
        return max((s.num_parallel or 1 for s in self._stages if isinstance(s, _Map)), default=1)

    @property
    def context(self) -> PipelineContext:
        return self._context

    @property
    def round_robin(self) -> bool:
        """Whether a :meth:`shard` splits the records of a source rather than whole sources (by
        byte range where the source allows it, else round-robin: each shard reads all of it)."""
        return bool(self._round_robin)

    def __repr__(self) -> str:
        names = [source_name(source) for source in self.sources]
        if len(names) > _REPR_SOURCES:  # the first and last few, and how many in all
            shown = ", ".join(repr(n) for n in names[:_REPR_SOURCES - 1])
            head = f"[{shown}, ... ({len(names)} sources), {names[-1]!r}]"
        else:
            head = repr(names[0]) if len(names) == 1 else repr(names)
        args = [head, repr(self._format)]
        if self._decoder is not None:
            args.append(f"decoder={_short_repr(self._decoder)}")
        args.extend(f"{key}={value!r}" for key, value in self._reader_options.items())
        calls = "".join(_stage_call(stage) for stage in self._stages)
        calls += "".join(f".shard({n}, {i})" for n, i in self._round_robin)
        return f"Dataset({', '.join(args)}){calls}"

    def __len__(self) -> int:
        raise UsageTypeError(
            "a streamio Dataset is a stream: how many records it holds is known only once an epoch"
            " has read it to the end (a pipe or an HTTP stream cannot be measured beforehand), so"
            " it has no len(). Count an epoch with sum(1 for _ in ds) or `streamio count`. For"
            " a PyTorch DataLoader, call ds.to_torch(): DataLoader(ds.to_torch(),"
            " batch_size=None)")

    # -- building -----------------------------------------------------------------------------
    def _batched(self) -> bool:
        return any(isinstance(s, _Batch) for s in self._stages)

    def _with_stage(self, stage: Any) -> "Dataset":
        return self._derive(_stages=self._stages + (stage,))

    def shuffle(self, buffer_size: int, *, buffer_bytes: Optional[int] = None,
                seed: Optional[int] = None, initial: Optional[int] = None) -> "Dataset":
        """Shuffle items (records, or batches after :meth:`batch`) through a bounded buffer.

        The buffer holds at most ``buffer_size`` items and ``buffer_bytes`` bytes (record
        lengths; for batches, the ``nbytes`` of their arrays), and emits uniformly chosen items
        whenever it is over a bound (see :class:`~streamio.pipeline.ShuffleBuffer`). Every epoch
        is exactly a permutation of its items. ``initial``: let items flow once this many are
        held, before the buffer is full (faster first batch, less random start). ``seed=None``
        draws a seed now, so epochs differ but are not reproducible across runs.

        Memory: with ``buffer_bytes`` the peak is about 1.5 times it (the buffer, plus a block of
        arrivals being merged and the items on their way out) on top of the reader's buffers.
        Order: buffers of 1024 items or more take arrivals in blocks (once full, with exactly the
        result of the one-at-a-time rule); the order never depends on how the source happened
        to be chunked, so a seed gives the same order from a file and from a pipe.
        """
        buffer_size = _check_int("buffer_size", buffer_size, 1)
        if buffer_bytes is not None:
            buffer_bytes = _check_int("buffer_bytes", buffer_bytes, 1)
        if initial is not None:
            initial = _check_int("initial", initial, 0)
        return self._with_stage(_Shuffle(buffer_size, buffer_bytes, _check_seed(seed), initial,
                                         seed is None))

    def batch(self, batch_size: int, *, drop_last: bool = False) -> "Dataset":
        """Group records into batches of ``batch_size``: a ``list`` of records, or with a decoder
        the dict its ``decode_batch`` returns. The last, partial batch is kept unless
        ``drop_last``.

        The batches cut from one chunk of input are decoded in one call when every output of
        the decoder has a fixed shape: their arrays are then row slices (views) of one array per
        field, which stays in memory while any of its batches does (copy a batch you keep for
        long)."""
        batch_size = _check_int("batch_size", batch_size, 1)
        if not isinstance(drop_last, bool):
            raise UsageTypeError(f"drop_last must be a bool, not {type(drop_last).__name__}")
        if self._batched():
            raise UsageError("this Dataset is already batched")
        return self._with_stage(_Batch(batch_size, drop_last))

    def shuffle_batches(self, n: int, *, seed: Optional[int] = None) -> "Dataset":
        """Hold ``n`` batches and emit them in random order (cheap extra randomness: moves whole
        batches, so it costs no per-record work)."""
        n = _check_int("n", n, 1)
        if not self._batched():
            raise UsageError("shuffle_batches() needs batch() first (use shuffle() for records)")
        return self._with_stage(_ShuffleBatches(n, _check_seed(seed), seed is None))

    def prefetch(self, n: Optional[int] = None) -> "Dataset":
        """Run everything before this point ahead of the consumer, in a background thread, at
        most ``n`` items ahead (see :class:`~streamio.pipeline.Prefetcher`).

        ``n=None`` (the default, like ``tf.data.AUTOTUNE``) sizes the queue itself: it starts
        at two items and doubles each time the consumer has to wait for the thread, up to 256
        items and 64 MiB. A consumer that finds the queue empty while the thread is idle runs
        the next step itself instead of waiting for a thread switch; one that spends time on
        its batches (a training step) finds them made meanwhile. Leaving the loop early stops
        the thread and closes the source."""
        if n is not None:
            n = _check_int("n", n, 1)
        return self._with_stage(_Prefetch(n))

    def map(self, fn: Any, *, num_parallel: Optional[int] = None, ordered: bool = True,
            backend: "parallel.MapBackend" = "thread", seed: Optional[int] = None) -> "Dataset":
        """Apply ``fn`` to each item at this point of the chain: a record before :meth:`batch`,
        a batch (a list of records, or the decoder's dict) after it.

        ``num_parallel=None`` runs ``fn`` inline, in the thread that runs this stage. An int
        runs it on that many threads (``backend="thread"``: for functions that release the GIL,
        such as image decoders, zlib, numpy) or processes (``backend="process"``: forkserver
        children, for Python-heavy functions, in the main process only; ``fn`` must pickle with
        cloudpickle, as lambdas and closures do, and the children never import ``__main__``).
        At most ``2 * num_parallel`` tasks of up to 64 items and ~1 MiB each are in flight, and
        none starts while those in flight hold 64 MiB of input. ``ordered=False`` hands results out as they finish.
        ``seed``: ``fn`` is called as ``fn(item, rng)`` with a ``numpy.random.Generator``
        derived from ``(seed, epoch, record)`` (or the batch's position), the same for
        any ``num_parallel`` and backend. An exception in ``fn`` is a
        :class:`~streamio.errors.MapError` naming the item, raised after the items before it
        (a ``FormatError`` such as a decoder's ``DecodeError`` passes through as it is).
        Details and invariants: :mod:`streamio.pipeline.parallel`.
        """
        parallel.check_map_args(fn, num_parallel, ordered, backend, seed)
        num_parallel = None if num_parallel is None else int(num_parallel)
        seed = None if seed is None else int(seed)
        return self._with_stage(_Map(fn, num_parallel, ordered, backend, seed))

    def filter(self, predicate: Any) -> "Dataset":
        """Keep the items (records, or batches after :meth:`batch`) for which ``predicate(item)``
        is true; it runs inline. An exception in it is a :class:`~streamio.errors.MapError`
        naming the item."""
        if not callable(predicate):
            raise UsageTypeError(f"filter needs a callable, not {type(predicate).__name__}")
        return self._with_stage(_Filter(predicate))

    def skip(self, n: int) -> "Dataset":
        """Drop the first ``n`` items (records, or batches after :meth:`batch`) of each epoch."""
        return self._with_stage(_Skip(_check_int("n", n, 0)))

    def take(self, n: int) -> "Dataset":
        """Stop each epoch after ``n`` items (records, or batches after :meth:`batch`); the
        source is closed then, without reading the rest."""
        return self._with_stage(_Take(_check_int("n", n, 0)))

    def shard(self, num_shards: int, index: int) -> "Dataset":
        """Keep shard ``index`` of ``num_shards``: together the shards deliver every record
        exactly once, and no two share one.

        With at least ``num_shards`` sources, whole sources are split: source ``i`` goes to shard
        ``i % num_shards`` and each shard reads only its own. With fewer, each source that allows
        it (a regular file or an http(s) URL, uncompressed, in TFRecord, RecordIO or lines; CSV
        with ``csv_quoted_newlines=False``) is **split by byte range**: shard ``i`` reads about
        the ``i``-th ``1/num_shards`` of its bytes and delivers the records that start there
        (cut at record starts by an index file beside it, if there is one; see
        :mod:`streamio.pipeline.ranges`). Any other source (a FIFO, stdin, a PipeChannel, a
        compressed file, CSV that may hold quoted line breaks) is dealt round-robin, with a
        warning saying so once: **every shard reads and frames the whole stream** and keeps
        every ``num_shards``-th record (a FIFO can have only one reader: round-robin over one
        pipe needs ``num_shards`` separate pipes or a single reader).

        Sharding applies to the records as they are read, wherever it appears in the chain (as
        tf.data's auto-sharding does): shuffling, batching and prefetching then work on the
        shard's own records, and a :meth:`take`/:meth:`skip` called before ``shard`` counts the
        items of each shard.
        """
        num_shards = _check_int("num_shards", num_shards, 1)
        index = _check_int("index", index, 0)
        if index >= num_shards:
            raise UsageError(f"shard index must be in [0, {num_shards}), not {index}")
        if num_shards == 1:
            return self._derive()
        if len(self._selection) >= num_shards:
            return self._derive(_selection=self._selection[index::num_shards])
        return self._derive(_round_robin=self._round_robin + ((num_shards, index),))

    def with_context(self, *, epoch: Optional[int] = None, rank: int = 0, world_size: int = 1,
                     worker: int = 0, num_workers: int = 1) -> "Dataset":
        """A copy that runs as ``(rank, worker)`` and, if ``epoch`` is given, always as that epoch.

        Seeds derive from ``(seed, epoch, rank, worker)``. This does not shard: pair it with
        :meth:`shard` (the adapters call ``ds.with_context(...).shard(world_size * num_workers,
        rank * num_workers + worker)``). The receiver is not changed.
        """
        if epoch is not None:
            epoch = _check_int("epoch", epoch, 0)
        world_size = _check_int("world_size", world_size, 1)
        num_workers = _check_int("num_workers", num_workers, 1)
        rank = _check_int("rank", rank, 0)
        worker = _check_int("worker", worker, 0)
        if rank >= world_size:
            raise UsageError(f"rank must be in [0, {world_size}), not {rank}")
        if worker >= num_workers:
            raise UsageError(f"worker must be in [0, {num_workers}), not {worker}")
        context = PipelineContext(epoch, rank, world_size, worker, num_workers)
        return self._derive(_context=context)

    def _with_feed(self, feed: Any) -> "Dataset":
        """A copy whose epochs take their records from ``feed(run)`` (blocks ``(records,
        ids)``) instead of opening the sources: how DataLoader workers share one stream (see
        :mod:`streamio.adapters.shared_stream`)."""
        return self._derive(_feed=feed)

    # -- adapters ---------------------------------------------------------------------------
    def to_torch(self, **kwargs: Any) -> Any:
        """A ``torch.utils.data.IterableDataset`` (see :mod:`streamio.adapters.torch`)."""
        from ..adapters.torch import to_torch

        return to_torch(self, **kwargs)

    def to_tf(self, **kwargs: Any) -> Any:
        """A ``tf.data.Dataset`` (see :mod:`streamio.adapters.tf`)."""
        from ..adapters.tf import to_tf

        return to_tf(self, **kwargs)

    # -- running ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters of the latest epoch (the running one, if any), as a dict.

        Keys: ``records`` (delivered), ``batches``, ``bytes`` (read from the sources),
        ``records_read``, ``skipped_records``/``skipped_bytes`` (corrupt data dropped under
        ``on_error="skip"``), ``source_wait_s`` (blocked on the source), ``decode_s``,
        ``wait_s`` (the consumer waiting for data), ``consumer_s`` (the consumer holding data),
        ``first_batch_s``, ``elapsed_s``, ``records_per_s``, ``epoch``, ``sources_opened``,
        ``bytes_decoded``, ``finished``. All zero before the first epoch.

        Epochs read through :meth:`to_torch` (in DataLoader workers too: each worker reports its
        counters to the main process, summed here, with ``first_batch_s`` the earliest and
        ``elapsed_s`` the longest worker's) or :meth:`to_tf` count as this Dataset's epochs.
        """
        latest: Optional[tuple] = None
        if self._last_stats is not None:
            latest = (self._last_stats.started_at, self._last_stats.snapshot())
        for provider in tuple(self._stats_providers):
            found = provider.latest_stats()
            if found is not None and (latest is None or found[0] >= latest[0]):
                latest = found
        return empty_snapshot() if latest is None else latest[1]

    def __iter__(self) -> "EpochIterator":
        pending = self.__dict__.pop("_pending_state", None)
        if pending is not None:
            return self.iter_from(pending)
        if self._context.epoch is not None:
            epoch = self._context.epoch
        else:
            epoch = self._epochs_started
        self._epochs_started += 1
        return self._start(self, epoch, None)

    def _start(self, plan: "Dataset", epoch: int, skip: Optional[_resume.FastForward]
               ) -> "EpochIterator":
        stats = EpochStats(epoch)
        self._last_stats = stats
        run = _EpochRun(plan, epoch, stats)
        run.fast_forward = skip
        it = EpochIterator(run.build(), stats, batched=self._batched())
        it._origin = (plan, epoch, 0 if skip is None else skip.count)
        return it

    # -- resuming (see streamio.pipeline.resume) -------------------------------------------------
    def iter_from(self, state: dict) -> "EpochIterator":
        """Resume an epoch from ``EpochIterator.state_dict()``: the items not yet delivered
        when the state was taken, in the order the uninterrupted epoch would have delivered
        them (same epoch number, same seeds). The earlier ones are read and framed again but not
        decoded. A state whose epoch had finished gives an empty iterator. Later ``iter()``
        calls continue with the next epoch. See :mod:`streamio.pipeline.resume`."""
        _resume.check_state(self, state)
        plan = _resume.with_seeds(self, state["seeds"])
        epoch = state["epoch"]
        if self._context.epoch is None:
            self._epochs_started = epoch + 1
        skip = _resume.plan_fast_forward(plan._stages, plan._decoder is not None,
                                         state["delivered"])
        it = self._start(plan, epoch, skip)
        if state.get("finished"):
            it.close()
            it._ended = True
        return it

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` resume from ``state`` (the same as :meth:`iter_from`,
        for code that must call ``iter()`` itself). Checked now."""
        _resume.check_state(self, state)
        self._pending_state = dict(state)


def _first_record(source: Any, ds: "Dataset") -> bytes:
    """The first record of ``source`` (a CSV header, for a reader whose byte range starts past
    it); read apart from the epoch's counters, in small reads."""
    options = {**ds._reader_options, "read_size": 64 * 1024}
    reader = RecordReader(source, ds._format, **options)
    with reader:
        for records in reader.record_lists():
            if records:
                return records[0]
    raise DecodeError("the source holds no header row", source=source_name(source),
                      record_index=0)


class _EpochRun:
    """The state of one epoch while its generator chain is built and run."""

    def __init__(self, ds: Dataset, epoch: int, stats: EpochStats) -> None:
        self.ds = ds
        self.epoch = epoch
        self.stats = stats
        decoder = ds._decoder
        if decoder is not None and callable(getattr(decoder, "fresh", None)):
            decoder = decoder.fresh()  # an un-primed decoder per epoch (a CSV header again)
        self.decoder = decoder
        # Origins are tracked only where an error could need them: a decode error, or a map or
        # filter over records (which also keys a map's seeds on the record).
        record_stages = list(itertools.takewhile(lambda s: not isinstance(s, _Batch),
                                                 ds._stages))
        self.track_ids = ((decoder is not None and ds._batched())
                          or any(isinstance(s, (_Map, _Filter)) for s in record_stages))
        self.names: dict[int, str] = {}
        # Whether records reach batch() out of stream order (a record-level shuffle before it,
        # or a map that hands results out as they finish).
        self.reordered = any(isinstance(s, _Shuffle) or (isinstance(s, _Map) and not s.ordered)
                             for s in record_stages)
        self.header: Optional[bytes] = None
        self.header_source: Optional[str] = None
        self.fast_forward: Optional[_resume.FastForward] = None  # set by Dataset.iter_from

    def build(self) -> Iterator[tuple]:
        blocks: Iterator[tuple] = self.read_blocks()
        batched = False
        stages = self.ds._stages
        ff = self.fast_forward
        for position, stage in enumerate(stages):
            if isinstance(stage, _Shuffle):
                blocks = self.shuffle(blocks, stage.buffer_size, stage.buffer_bytes, stage.seed,
                                      stage.initial, position, batched)
            elif isinstance(stage, _ShuffleBatches):
                blocks = self.shuffle(blocks, stage.n, None, stage.seed, None, position, True)
            elif isinstance(stage, _Batch):
                blocks = self.batch(blocks, stage.batch_size, stage.drop_last)
                batched = True
                if self.decoder is not None:
                    # Batches decoded together share their arrays (row slices): fine in order,
                    # but a shuffle of batches would hold slices of many blocks while its byte
                    # bound counted only the slices.
                    together = not any(isinstance(later, (_Shuffle, _ShuffleBatches))
                                       for later in stages[position + 1:])
                    if ff is not None and ff.mode == "before_decode":
                        blocks = _resume.skip_delivered(blocks, ff.count,  # never decoded
                                                        _resume.drop_batches)
                    if ff is not None and ff.mode == "lazy":
                        blocks = _resume.defer_decode(blocks)
                    else:
                        blocks = self.decode_blocks(blocks, together)
            elif isinstance(stage, _Prefetch):
                blocks = Prefetcher(blocks, stage.n, size_of=estimate_nbytes)
            elif isinstance(stage, _Map):
                blocks = parallel.map_blocks(
                    blocks, stage.fn, num_parallel=stage.num_parallel, ordered=stage.ordered,
                    backend=stage.backend, seed=stage.seed, place=self.place(position),
                    track_records=self.track_ids and not batched)
            elif isinstance(stage, _Filter):
                blocks = parallel.filter_blocks(blocks, stage.predicate,
                                                place=self.place(position),
                                                track_records=self.track_ids and not batched)
            elif isinstance(stage, _Skip):
                blocks = _skip(blocks, stage.n)
            elif isinstance(stage, _Take):
                blocks = _take(blocks, stage.n)
            else:  # pragma: no cover - every stage type is handled above
                raise TypeError(f"unknown stage {stage!r}")
            if ff is not None and ff.mode == "lazy" and ff.position == position:
                blocks = _resume.mark_and_decode(blocks, ff.keep, ff.count, self.decode)
        if ff is not None and ff.mode in ("end", "lazy"):
            blocks = _resume.skip_delivered(blocks, ff.count, _skip)  # the consumer has them
        return blocks

    def place(self, position: int) -> "parallel.MapPlace":
        ctx = self.ds._context
        return parallel.MapPlace(self.epoch, position, ctx.rank, ctx.worker, self.names,
                                 _INDEX_BITS, self.stats)

    # -- the source end -------------------------------------------------------------------------
    def read_blocks(self) -> Iterator[tuple]:
        ds = self.ds
        if ds._feed is not None:
            yield from ds._feed(self)
            return
        stats = self.stats
        layers = ds._round_robin
        takes_header = self.decoder is not None and _takes_header(self.decoder)
        for ordinal in ds._selection:
            source = ds._all_sources[ordinal]
            # Fewer sources than readers: a byte range of the source where it allows one, else
            # every record of it, dealt round-robin below.
            plan = plan_range(source, ds._format, ds._reader_options, layers) if layers else None
            shares = () if plan is not None else layers
            if plan is not None:
                start, end = plan.byte_range
                if end is not None and start >= end:
                    continue  # no record starts in this reader's range
                reader = RecordReader(source, ds._format, byte_range=plan.byte_range,
                                      **ds._reader_options)
                if takes_header and start > 0:
                    self.use_header(_first_record(source, ds), source_name(source))
            else:
                reader = RecordReader(source, ds._format, **ds._reader_options)
            stats.reader_opened(reader.stats)
            try:
                seen = 0  # records of this source so far
                counters = [0] * len(shares)
                base = ordinal << _INDEX_BITS
                for records in reader.record_lists():
                    self.names[ordinal] = reader.source_name
                    if takes_header and seen == 0 and (plan is None or plan.byte_range[0] == 0):
                        self.use_header(records[0], reader.source_name)
                        records = records[1:]
                        seen = 1
                    ids = (np.arange(base + seen, base + seen + len(records), dtype=np.int64)
                           if self.track_ids else None)
                    seen += len(records)
                    for layer, (num_shards, index) in enumerate(shares):
                        # Shard (source position + record position) % num_shards: every record
                        # of the layer's input goes to exactly one shard, and short sources
                        # do not all favour shard 0.
                        start = (index - ordinal - counters[layer]) % num_shards
                        counters[layer] += len(records)
                        records = records[start::num_shards]
                        if ids is not None:
                            ids = ids[start::num_shards]
                    if records:
                        yield records, ids
            finally:
                reader.close()
                stats.reader_closed(reader.stats)

    def use_header(self, header: bytes, source: str) -> None:
        """Prime the epoch's decoder with the first header; later streams must repeat it."""
        if header.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM is no part of the header
            header = header[3:]
        if self.header is None:
            self.header = header
            self.header_source = source
            self.decoder.decode_batch([header], source=source, first_index=0)
        elif header != self.header:
            raise DecodeError(f"the header differs from that of {self.header_source}",
                              source=source, record_index=0)

    # -- stages ---------------------------------------------------------------------------------
    def shuffle(self, blocks: Iterator[tuple], size: int, buffer_bytes: Optional[int], seed: int,
                initial: Optional[int], position: int, batched: bool) -> Iterator[tuple]:
        ctx = self.ds._context
        rng = derive_rng(seed, epoch=self.epoch, rank=ctx.rank, worker=ctx.worker, stage=position)
        buffer = ShuffleBuffer(size, rng=rng, buffer_bytes=buffer_bytes, initial=initial,
                               size_of=estimate_nbytes if batched else len)
        track = self.track_ids and not batched
        try:
            for items, ids in blocks:
                # Piece by piece: joining them would copy every emitted (scattered) reference.
                yield from buffer.push_pieces(items, ids)
            out, out_ids = buffer.drain()
            if out:
                yield out, (out_ids if track else None)
        finally:
            _close(blocks)

    def batch(self, blocks: Iterator[tuple], size: int, drop_last: bool) -> Iterator[tuple]:
        """Cut blocks of records into blocks of batches (lists of records). With a decoder the
        blocks are ``(batches, ids)``, ``ids`` the records' origins in the batches' order (one
        array for the block, or None), for :meth:`decode_blocks`; without one, ``(batches,
        None)``."""
        keep_ids = self.decoder is not None
        pending: list = []
        pending_ids: list = []
        try:
            for items, ids in blocks:
                out: list = []
                out_ids: list = []
                pos = 0
                if pending:
                    pos = size - len(pending)
                    pending.extend(items[:pos])
                    if ids is not None:
                        pending_ids.append(ids[:pos])
                    if len(pending) < size:
                        continue
                    out.append(pending)
                    out_ids = pending_ids
                    pending, pending_ids = [], []
                end = pos + (len(items) - pos) // size * size
                # Unshuffled batching is list slicing: no per-record Python work.
                out.extend([items[s:s + size] for s in range(pos, end, size)])
                if ids is not None and end > pos:
                    out_ids.append(ids[pos:end])
                if end < len(items):
                    pending = items[end:]
                    if ids is not None:
                        pending_ids = [ids[end:]]
                if out:
                    yield out, (_join_ids(out_ids) if keep_ids else None)
            if pending and not drop_last:
                yield [pending], (_join_ids(pending_ids) if keep_ids else None)
        finally:
            _close(blocks)

    def decode_blocks(self, blocks: Iterator[tuple], together: bool) -> Iterator[tuple]:
        """Decode blocks of batches; a batch that fails is raised after the ones before it.

        ``together``: a decoder whose outputs are all fixed-shape rows (``output_spec()``: no
        sparse field, no varying dimension) decodes a block's batches in one call, and each
        batch is a slice of the result: one decoder call per chunk of input instead of one per
        batch.
        """
        split: Optional[bool] = None if together else False  # known once the decoder knows
        try:
            for batches, ids in blocks:
                if split is None:
                    split = _rows_split(self.decoder)
                if len(batches) > 1 and split:
                    out = self.decode_together(batches)
                    if out is not None:
                        yield out, None
                        continue
                out = []
                start = 0
                try:
                    for records in batches:
                        stop = start + len(records)
                        out.append(self.decode(records, None if ids is None else ids[start:stop]))
                        start = stop
                except BaseException:
                    if out:
                        yield out, None  # every whole batch before the fault is delivered
                    raise
                yield out, None
        finally:
            _close(blocks)

    def decode_together(self, batches: list) -> Optional[list]:
        """Decode ``batches`` in one decoder call and slice the result back into batches; None
        if that cannot stand for decoding them one by one (an error, whose batch and record
        the caller finds by doing so, or rows that did not come out one per record)."""
        clock = time.perf_counter
        t0 = clock()
        try:
            records = list(itertools.chain.from_iterable(batches))
            try:
                with counting_skips() as skipped:
                    table = self.decoder.decode_batch(records)
            except FormatError:
                return None
            if skipped:
                return None  # rows dropped: decoded again batch by batch, counted there
            total = len(records)
            # numpy arrays, or torch tensors (an Image(device="cuda") column): sliced alike
            if not table or not all(getattr(v, "ndim", 0) and len(v) == total
                                    for v in table.values()):
                return None  # e.g. a CSV block that held a repeated header row
            out = []
            start = 0
            for batch in batches:
                stop = start + len(batch)
                out.append({name: column[start:stop] for name, column in table.items()})
                start = stop
            return out
        finally:
            self.stats.decode_s += clock() - t0

    def decode(self, records: list, ids: Optional[np.ndarray]) -> Any:
        clock = time.perf_counter
        t0 = clock()
        try:
            with counting_skips() as skipped:
                return self._decode(records, ids)
        finally:
            self.stats.note_decoder_skips(skipped)
            self.stats.decode_s += clock() - t0

    def _decode(self, records: list, ids: Optional[np.ndarray]) -> Any:
        if ids is None or not len(ids):
            return self.decoder.decode_batch(records)
        if not self.reordered:
            # In stream order: a batch within one source, without a round-robin stride, is
            # a run of consecutive records, and the decoder can name a bad one itself.
            first, last = int(ids[0]), int(ids[-1])
            if first >> _INDEX_BITS == last >> _INDEX_BITS and last - first == len(ids) - 1:
                return self.decoder.decode_batch(records,
                                                 source=self.names.get(first >> _INDEX_BITS),
                                                 first_index=first & _INDEX_MASK)
        source = self.names.get(self.ds._selection[0]) if len(self.ds._selection) == 1 else None
        try:
            return self.decoder.decode_batch(records, source=source, first_index=0)
        except FormatError as exc:
            renamed = self.rename_error(exc, ids)
            if renamed is exc:
                raise
            raise renamed from exc

    def rename_error(self, exc: FormatError, ids: np.ndarray) -> FormatError:
        """The same error, naming the record by its stream position, not its batch position."""
        position = exc.record_index
        if position is None or not 0 <= position < len(ids):
            return exc
        origin = int(ids[position])
        source = self.names.get(origin >> _INDEX_BITS)
        kwargs: dict[str, Any] = dict(source=source, offset=None,
                                      record_index=origin & _INDEX_MASK)
        if isinstance(exc, DecodeError):
            kwargs["field"] = exc.field
        try:
            return type(exc)(exc.reason, **kwargs)
        except Exception:  # noqa: BLE001 - a subclass with another signature: keep the original
            return exc


def _rows_split(decoder: Any) -> Optional[bool]:
    """Whether a batch of the decoder's output is a row slice of a larger batch's output: every
    field dense (or object) with a fixed shape. None while the decoder cannot tell (its
    ``output_spec()`` is None until it has seen a batch)."""
    if not callable(getattr(decoder, "output_spec", None)):
        return False
    spec = decoder.output_spec()
    if spec is None:
        return None
    return bool(spec) and all(f.kind != "sparse" and None not in f.shape for f in spec.values())


def _join_ids(parts: list) -> Optional[np.ndarray]:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _skip(blocks: Iterator[tuple], n: int) -> Iterator[tuple]:
    remaining = n
    try:
        for items, ids in blocks:
            if remaining:
                if len(items) <= remaining:
                    remaining -= len(items)
                    continue
                items = items[remaining:]
                ids = None if ids is None else ids[remaining:]
                remaining = 0
            yield items, ids
    finally:
        _close(blocks)


def _take(blocks: Iterator[tuple], n: int) -> Iterator[tuple]:
    remaining = n
    try:
        if remaining == 0:
            return
        for items, ids in blocks:
            if len(items) >= remaining:
                yield items[:remaining], (None if ids is None else ids[:remaining])
                return  # the finally closes the upstream: no more reading
            remaining -= len(items)
            yield items, ids
    finally:
        _close(blocks)





class EpochIterator:
    """One epoch of a Dataset: yields items and owns everything the epoch opened.

    ``close()`` (also on ``break`` out of a ``for`` loop, when the iterator is dropped, or at
    the end of a ``with`` block) stops prefetch threads and closes the sources. Counting for
    :meth:`Dataset.stats` happens here, once per block, not per item.
    """

    def __init__(self, blocks: Iterator[tuple], stats: EpochStats, *, batched: bool) -> None:
        self._blocks: Optional[Iterator[tuple]] = blocks
        self._stats = stats
        self._batched = batched
        self._items: Iterator[Any] = iter(())
        # For state_dict(): items in the blocks before the current one, the current one's size.
        self._handed = 0
        self._block_len = 0
        self._ended = False
        self._origin: Optional[tuple] = None  # (Dataset, epoch, items skipped by a resume)

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> Any:
        try:
            return next(self._items)
        except StopIteration:
            pass
        return self._next_block()

    def _next_block(self) -> Any:
        blocks = self._blocks
        if blocks is None:
            raise StopIteration
        stats = self._stats
        clock = time.perf_counter
        t0 = clock()
        try:
            while True:
                items = next(blocks)[0]
                if items:
                    break
        except BaseException as exc:
            stats.wait_s += clock() - t0
            self._ended = isinstance(exc, StopIteration)
            self.close()
            raise
        stats.wait_s += clock() - t0
        self._handed += self._block_len
        self._block_len = len(items)
        if self._batched:
            stats.batches += len(items)
            stats.records += sum(map(_batch_rows, items))
        else:
            stats.records += len(items)
        stats.first_item()
        self._items = iter(items)
        return next(self._items)

    def close(self) -> None:
        """Stop the epoch: prefetch threads end and sources are closed (idempotent)."""
        blocks = self.__dict__.get("_blocks")
        if blocks is None:
            return
        self._blocks = None
        self._handed = self.delivered
        self._block_len = 0
        self._items = iter(())
        try:
            _close(blocks)
        finally:
            self._stats.finish()

    @property
    def delivered(self) -> int:
        """Items (records, or batches) this iterator has handed out."""
        return self._handed + self._block_len - operator.length_hint(self._items)

    def state_dict(self) -> dict:
        """Where this epoch stands, as a small JSON-serialisable dict: pass it to
        :meth:`Dataset.iter_from` (in this process or a new one, with the Dataset built the
        same way) to get the rest of the epoch exactly. See :mod:`streamio.pipeline.resume`."""
        if self._origin is None:
            raise UsageError("this iterator was not made by a Dataset: it has no resume state")
        ds, epoch, skipped = self._origin
        return _resume.make_state(ds, epoch, skipped + self.delivered, self._ended)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __enter__(self) -> "EpochIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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
import os
from dataclasses import dataclass
from typing import Any, Optional

from .._util import check_int as _check_int
from ..errors import UsageError, UsageTypeError
from ..reader import RecordReader, check_keywords, expand_sources
from ..sources import check_source, source_name
from . import parallel
from .resume import elastic as _elastic
from . import resume as _resume
from .epoch import EpochRun
from .iterator import EpochIterator
from .shuffle import new_seed
from .stages import (Batch, Cache, Filter, Map, Prefetch, Shuffle, ShuffleBatches, Skip, Stage,
                     Take)
from .stats import EpochStats, empty_snapshot

__all__ = ["Dataset", "EpochIterator", "PipelineContext"]

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


# -- argument checks ----------------------------------------------------------------------------
def _check_seed(seed: Any) -> int:
    if seed is None:
        # Drawn once, here: iterations of this Dataset then differ by epoch, reproducibly.
        return new_seed()
    return _check_int("seed", seed, 0)


#: Adapters (to_torch/to_tf results) whose epochs stats() considers: the latest few made.
_STATS_PROVIDERS = 8
#: How many source names repr() shows before it abbreviates.
_REPR_SOURCES = 4
_REPR_DECODER_WIDTH = 60


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_DECODER_WIDTH else f"{type(value).__name__}(...)"


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
      sorted), a directory (its files, sorted; hidden ones, and index files beside the data
      files they index, skipped), or a list of these, read in order, one source open at a time;
    - ``format``: ``"tfrecord"``, ``"recordio"``, ``"csv"``, ``"lines"``;
    - ``decoder``: turns each batch of records into a dict of numpy arrays (``batch()``);
      without ``batch()`` each item is one record decoded (a dict of that record's row of each
      field, :mod:`streamio.pipeline.items`); without a decoder items are raw records, and a
      batch is a ``list``;
    - ``reader_options``: passed to :class:`~streamio.RecordReader` (``compression``,
      ``verify``, ``on_error``, ``multipart``, ``max_record_size``, ``read_size``,
      ``read_timeout``, format options). Checked now; the sources are opened only when an epoch
      starts.

    Methods (each returns a new Dataset; the receiver is unchanged): :meth:`shuffle`,
    :meth:`batch`, :meth:`shuffle_batches`, :meth:`map`, :meth:`filter`, :meth:`prefetch`,
    :meth:`shard`, :meth:`skip`,
    :meth:`take`, :meth:`cache`, :meth:`with_context`. :meth:`stats` describes the latest epoch.

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
        self._shard_layers: tuple = ()  # every shard(num_shards, index) call, in order
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

    def add_stats_provider(self, provider: Any) -> None:
        """Let :meth:`stats` also consider ``provider.latest_stats()``: ``None`` or
        ``(started_at, snapshot)`` of the latest epoch it read (wall-clock start). How an
        adapter that reads this Dataset elsewhere (DataLoader workers, tf.data) reports."""
        self._stats_providers.append(provider)

    @property
    def epoch_stats(self) -> Optional[EpochStats]:
        """The :class:`~streamio.pipeline.EpochStats` of the latest epoch iterated in this
        process from this object (None before the first): what an adapter reports."""
        return self._last_stats

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
            if stage.makes_batches:
                return stage.batch_size
        return None

    @property
    def stages(self) -> tuple:
        """The stages after the sources, in order (each a
        :class:`~streamio.pipeline.stages.Stage`): what adapters ask about the chain."""
        return self._stages

    @property
    def maps_items(self) -> bool:
        """Whether a :meth:`map` changes what the items are (adapters then learn their types
        from the first item rather than from the decoder)."""
        return any(s.maps_items for s in self._stages)

    @property
    def map_parallelism(self) -> int:
        """The most threads or processes any :meth:`map` runs on (1 when none runs in
        parallel): what ``diagnose`` counts as decoders already there."""
        return max((s.parallelism for s in self._stages), default=1)

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
        calls = "".join(stage.call() for stage in self._stages)
        calls += "".join(f".shard({n}, {i})" for n, i in self._round_robin)
        # A subclass (a SageMaker channel's ChannelDataset) says what it is.
        return f"{type(self).__name__}({', '.join(args)}){calls}"

    def __len__(self) -> int:
        raise UsageTypeError(
            "a streamio Dataset is a stream: how many records it holds is known only once an epoch"
            " has read it to the end (a pipe or an HTTP stream cannot be measured beforehand), so"
            " it has no len(). Count an epoch with sum(1 for _ in ds) or `streamio count`. For"
            " a PyTorch DataLoader, call ds.to_torch(): DataLoader(ds.to_torch(),"
            " batch_size=None)")

    # -- building -----------------------------------------------------------------------------
    def _batched(self) -> bool:
        return any(s.makes_batches for s in self._stages)

    def with_stage(self, stage: Stage) -> "Dataset":
        """A copy with ``stage`` (a :class:`~streamio.pipeline.stages.Stage`) appended: how
        each method below adds its stage, and how a new stage plugs in."""
        if not isinstance(stage, Stage):
            raise UsageTypeError(f"a stage is a streamio.pipeline.stages.Stage, not"
                                 f" {type(stage).__name__}")
        return self._with_stage(stage)

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
        return self.with_stage(Shuffle(buffer_size, buffer_bytes, _check_seed(seed), initial,
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
        return self.with_stage(Batch(batch_size, drop_last))

    def shuffle_batches(self, n: int, *, seed: Optional[int] = None) -> "Dataset":
        """Hold ``n`` batches and emit them in random order (cheap extra randomness: moves whole
        batches, so it costs no per-record work)."""
        n = _check_int("n", n, 1)
        if not self._batched():
            raise UsageError("shuffle_batches() needs batch() first (use shuffle() for records)")
        return self.with_stage(ShuffleBatches(n, _check_seed(seed), seed is None))

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
        return self.with_stage(Prefetch(n))

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
        return self.with_stage(Map(fn, num_parallel, ordered, backend, seed))

    def filter(self, predicate: Any) -> "Dataset":
        """Keep the items (records, or batches after :meth:`batch`) for which ``predicate(item)``
        is true; it runs inline. An exception in it is a :class:`~streamio.errors.MapError`
        naming the item."""
        if not callable(predicate):
            raise UsageTypeError(f"filter needs a callable, not {type(predicate).__name__}")
        return self.with_stage(Filter(predicate))

    def skip(self, n: int) -> "Dataset":
        """Drop the first ``n`` items (records, or batches after :meth:`batch`) of each epoch."""
        return self.with_stage(Skip(_check_int("n", n, 0)))

    def take(self, n: int) -> "Dataset":
        """Stop each epoch after ``n`` items (records, or batches after :meth:`batch`); the
        source is closed then, without reading the rest."""
        return self.with_stage(Take(_check_int("n", n, 0)))

    def cache(self, directory: Any = None, *, max_bytes: Optional[int] = None) -> "Dataset":
        """Keep what the stages before this point produce in the first complete epoch, and serve
        later epochs from it without reading the sources (stages after it run anew each
        epoch, with its number). ``directory=None`` keeps the items in memory, at most
        ``max_bytes`` (default 1 GiB) or a :class:`~streamio.UsageError`; a directory keeps one
        file per reader there (``max_bytes``: a bound on its size, None for none). The stages
        before the cache always run as epoch 0. Details and limits:
        :mod:`streamio.pipeline.cache` and docs/caching.md."""
        if directory is not None:
            if not isinstance(directory, (str, os.PathLike)) or isinstance(
                    os.fspath(directory), bytes):
                raise UsageTypeError(f"directory must be a str path or None, not"
                                     f" {type(directory).__name__}")
            directory = os.path.abspath(os.fspath(directory))
        if max_bytes is not None:
            max_bytes = _check_int("max_bytes", max_bytes, 1)
        return self.with_stage(Cache(directory, max_bytes))

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
        layers = self._shard_layers + ((num_shards, index),)
        if len(self._selection) >= num_shards:
            return self._derive(_selection=self._selection[index::num_shards],
                                _shard_layers=layers)
        return self._derive(_round_robin=self._round_robin + ((num_shards, index),),
                            _shard_layers=layers)

    def _unsharded(self) -> "Dataset":
        """This Dataset before its :meth:`shard` calls (the same stages and context): what an
        elastic resume rebuilds the old shards from."""
        return self._derive(_selection=tuple(range(len(self._all_sources))), _round_robin=(),
                            _shard_layers=())

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

    def with_feed(self, feed: Any) -> "Dataset":
        """A copy whose epochs take their records from ``feed(run)`` instead of opening the
        sources (the feed protocol: :mod:`streamio.pipeline.epoch`): how DataLoader workers
        share one stream (:mod:`streamio.sharing`)."""
        return self._derive(_feed=feed)

    _with_feed = with_feed

    # -- adapters ---------------------------------------------------------------------------
    def to_torch(self, **kwargs: Any) -> Any:
        """This Dataset as a ``torch.utils.data.IterableDataset`` (a
        :class:`~streamio.torch.StreamDataset`) of dicts of tensors; give it to
        ``DataLoader(..., batch_size=None)`` when the Dataset is batched (a DataLoader
        ``batch_size`` collates single examples of an unbatched one). Every record once per
        epoch over DataLoader workers and ranks; see :mod:`streamio.adapters.torch`.

        Keyword options (all optional):

        - ``pin_memory: bool = False``: pin the tensors (CUDA, ``num_workers=0`` only; with
          workers pass ``DataLoader(pin_memory=True)``);
        - ``rank: int | None``, ``world_size: int | None``: this process's place among the
          ranks (default: ``torch.distributed``, else torchrun's ``RANK``/``WORLD_SIZE``);
        - ``connect_timeout: float = 120.0``: seconds the readers of one shared stream (a FIFO,
          stdin) wait for each other;
        - ``local_rank: int | None``, ``local_world_size: int | None``: this rank's place on
          its host (default: torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``);
        - ``node_streams: "replicated" | "sharded" | None``: what each host's single stream
          holds when ranks on several hosts read one each (required there).
        """
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
        run = EpochRun(plan, epoch, stats)
        run.fast_forward = skip
        it = EpochIterator(run.build(), stats, batched=self._batched())
        it._origin = (plan, epoch, 0 if skip is None else skip.count)
        return it

    # -- resuming (see streamio.pipeline.resume) -------------------------------------------------
    def iter_from(self, state: Any) -> "EpochIterator":
        """Resume an epoch from ``EpochIterator.state_dict()``: the items not yet delivered
        when the state was taken, in the order the uninterrupted epoch would have delivered
        them (same epoch number, same seeds). The earlier ones are read and framed again but not
        decoded. A state whose epoch had finished gives an empty iterator. Later ``iter()``
        calls continue with the next epoch. See :mod:`streamio.pipeline.resume`.

        ``state`` may also be a **list**: the states of every shard of a sharded run
        (``shard(n, i)`` for each ``i``, or every rank x worker of ``to_torch``). On the same
        layout this shard resumes from its own state; on another (this Dataset is
        ``shard(m, j)`` of the same pipeline, or unsharded) it gets its share of everything
        the old shards had not delivered: the ``m`` shards together deliver each remaining
        record exactly once. See :mod:`streamio.pipeline.resume.elastic`."""
        if isinstance(state, (list, tuple)):
            return _elastic.iter_from_states(self, list(state))
        if isinstance(state, dict) and "elastic" in state:
            return _elastic.resume_elastic_state(self, state)
        _resume.check_state(self, state)
        _refuse_unreplayable_feed(self, state)
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
            drain = getattr(plan._feed, "drain", None)
            if drain is not None:
                # A shared stream's epoch goes on for the other readers: take part, take nothing.
                drain(it._stats)
        return it

    def load_state_dict(self, state: Any) -> None:
        """Make the next ``iter()`` resume from ``state`` (the same as :meth:`iter_from`,
        for code that must call ``iter()`` itself; a list of every shard's states too).
        Checked now (a list: each state's fields now, the rest when the epoch starts)."""
        if isinstance(state, (list, tuple)):
            self._pending_state = [dict(one) for one in _elastic.check_states(list(state))]
            return
        _resume.check_state(self, state)
        self._pending_state = dict(state)


def _refuse_unreplayable_feed(ds: Any, state: dict) -> None:
    """A feed that does not say its epochs give the same records again (``replayable``: the
    shared stream's does, :mod:`streamio.pipeline.dealing`) could hand the replay other
    records, and skipping its count of them would lose some and repeat others. Refused rather
    than resumed inexactly."""
    if ds._feed is None or getattr(ds._feed, "replayable", False):
        return
    if state["delivered"] and not state["finished"]:
        raise UsageError(
            f"cannot resume mid-epoch through the feed {type(ds._feed).__name__}: it does not"
            " say that an epoch gives the same records again (replayable), so a replay could"
            " lose and repeat records. Resume from a state taken at an epoch boundary"
            " (EpochIterator.state_after(n, next_epoch=True))")

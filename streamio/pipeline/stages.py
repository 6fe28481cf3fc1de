"""The stages of a pipeline: each one object that knows everything about itself.

A stage carries what the rest of the pipeline asks of it, so nothing outside matches a stage by
its class name:

- ``apply(blocks, run, position)``: how it applies to the epoch's block stream (``run`` is the
  epoch: :class:`streamio.pipeline.epoch.EpochRun`; ``run.batched`` says whether items are
  batches at this point);
- ``call()``: how it describes itself, as the method call that made it (``repr(Dataset)``);
- resume (:mod:`streamio.pipeline.resume`): ``resume_order`` (``"preserve"``, ``"reorder"``,
  ``"batch"``, or None: cannot be replayed), ``reads_values`` (after ``batch()``, it looks at
  decoded values, so a fast-forward through it must decode), ``item_flow`` (how item
  positions pass through it, for a fast-forward that skips batches undecoded: ``"same"`` every
  item, in order; ``"offset"`` item ``j`` out is item ``j + leading_skip`` in, until it stops;
  ``"reorder"`` a deterministic permutation by position; None, the cautious default: the
  fast-forward decodes what it skips), ``leading_skip``, ``seed``/``seed_drawn`` (fields, where
  the stage has a seed) and ``chain_name`` (its name in a
  resume state's chain digest);
- the epoch's bookkeeping: ``makes_batches``, ``needs_record_ids`` (before ``batch()``, it
  wants each record's origin), ``reorders_records``, ``buffers_items`` (holds many items: a
  batch shuffle), ``maps_items`` and ``parallelism`` (for adapters and ``diagnose``).

A stage is a frozen dataclass: its fields (seeds aside) are part of a resume state's chain
digest. Adding a stage is adding a subclass and the :class:`~streamio.Dataset` method that
appends it (``self.with_stage(MyStage(...))``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from .._util import close_iterator as close_blocks
from . import parallel
from .prefetch import Prefetcher
from .shuffle import ShuffleBuffer, derive_rng, estimate_nbytes

__all__ = ["Batch", "Cache", "Filter", "Map", "Mix", "Prefetch", "Shuffle", "ShuffleBatches",
           "Skip", "Stage", "Take", "close_blocks", "describe_stage", "skip_items", "take_items"]


class Stage:
    """What every stage says about itself; the defaults are the cautious answers."""

    #: The stage's name in a resume state's chain digest (None: the class name). The built-in
    #: stages keep the names they had, so states taken by earlier releases still load.
    chain_name: Optional[str] = None
    resume_order: Optional[str] = None
    reads_values = True
    item_flow: Optional[str] = None
    leading_skip = 0
    makes_batches = False
    needs_record_ids = False
    reorders_records = False
    buffers_items = False
    maps_items = False
    parallelism = 1
    #: True: ``apply`` gets the source end unstarted, in place of the stages before it, and
    #: builds those itself if it reads them at all (``run.upstream(position, epoch)``): a
    #: cache that serves a complete epoch starts nothing before it.
    builds_upstream = False
    #: True: what the stage keeps between epochs lives in the process that ran it (a memory
    #: cache), so a DataLoader worker that is not persistent loses it at each epoch's end.
    keeps_in_process = False

    def call(self) -> str:
        """The stage as the method call that made it: ``.shuffle(10000, seed=0)``."""
        return f".{type(self).__name__.lstrip('_').lower()}(...)"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        raise NotImplementedError(f"{type(self).__name__}.apply")


def describe_stage(stage: Any) -> str:
    """``stage.call()``, or a guess for an object that is not a :class:`Stage`."""
    call = getattr(stage, "call", None)
    return call() if callable(call) else f".{type(stage).__name__.lstrip('_').lower()}(...)"


@dataclass(frozen=True)
class Shuffle(Stage):
    buffer_size: int
    buffer_bytes: Optional[int]
    seed: int
    initial: Optional[int]
    seed_drawn: bool = False  # seed=None: drawn here, so a resume state's seed replaces it

    chain_name = "_Shuffle"
    resume_order = "reorder"
    item_flow = "reorder"
    reorders_records = True
    buffers_items = True

    @property
    def reads_values(self) -> bool:  # type: ignore[override]
        # A batch shuffle with a byte bound orders by the decoded batches' sizes.
        return self.buffer_bytes is not None

    def call(self) -> str:
        extra = "".join(f", {name}={getattr(self, name)!r}" for name in ("buffer_bytes", "initial")
                        if getattr(self, name) is not None)
        return f".shuffle({self.buffer_size}{extra}, seed={self.seed})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return shuffle_blocks(blocks, run, self.buffer_size, self.buffer_bytes, self.seed,
                              self.initial, position, run.batched)


@dataclass(frozen=True)
class Batch(Stage):
    batch_size: int
    drop_last: bool

    chain_name = "_Batch"
    resume_order = "batch"
    reads_values = False
    makes_batches = True

    def call(self) -> str:
        return f".batch({self.batch_size}{', drop_last=True' if self.drop_last else ''})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        blocks = run.batch(blocks, self.batch_size, self.drop_last)
        run.batched = True
        if run.decoder is None:
            return blocks
        # Batches decoded together share their arrays (row slices): fine in order, but a
        # shuffle of batches would hold slices of many blocks while its byte bound counted only
        # the slices.
        together = not any(later.buffers_items for later in run.ds._stages[position + 1:])
        return run.decode_stage(blocks, together)


@dataclass(frozen=True)
class ShuffleBatches(Stage):
    n: int
    seed: int
    seed_drawn: bool = False

    chain_name = "_ShuffleBatches"
    resume_order = "reorder"
    reads_values = False
    item_flow = "reorder"
    buffers_items = True

    def call(self) -> str:
        return f".shuffle_batches({self.n}, seed={self.seed})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return shuffle_blocks(blocks, run, self.n, None, self.seed, None, position, True)


@dataclass(frozen=True)
class Prefetch(Stage):
    n: Optional[int]  # None: the queue sizes itself

    chain_name = "_Prefetch"
    resume_order = "preserve"
    reads_values = False
    item_flow = "same"

    def call(self) -> str:
        return f".prefetch({'' if self.n is None else self.n})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return Prefetcher(blocks, self.n, size_of=estimate_nbytes)


@dataclass(frozen=True)
class Map(Stage):
    fn: Any
    num_parallel: Optional[int]
    ordered: bool
    backend: str
    seed: Optional[int]

    chain_name = "_Map"
    needs_record_ids = True
    maps_items = True

    @property
    def resume_order(self) -> Optional[str]:  # type: ignore[override]
        # In order, a map's output is its function of the input (random draws come from the
        # per-record seeds), so a replayed epoch is the same; as tasks finish, it is not.
        return "preserve" if self.ordered else None

    @property
    def reorders_records(self) -> bool:  # type: ignore[override]
        return not self.ordered

    @property
    def parallelism(self) -> int:  # type: ignore[override]
        return self.num_parallel or 1

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return parallel.map_blocks(
            blocks, self.fn, num_parallel=self.num_parallel, ordered=self.ordered,
            backend=self.backend, seed=self.seed, place=run.place(position),
            track_records=run.track_ids and not run.batched)


@dataclass(frozen=True)
class Filter(Stage):
    predicate: Any

    chain_name = "_Filter"
    resume_order = "preserve"  # drops items, keeps the order of the rest
    needs_record_ids = True

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return parallel.filter_blocks(blocks, self.predicate, place=run.place(position),
                                      track_records=run.track_ids and not run.batched)


@dataclass(frozen=True)
class Skip(Stage):
    n: int

    chain_name = "_Skip"
    resume_order = "preserve"
    reads_values = False
    item_flow = "offset"

    @property
    def leading_skip(self) -> int:  # type: ignore[override]
        return self.n

    def call(self) -> str:
        return f".skip({self.n})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return skip_items(blocks, self.n)


@dataclass(frozen=True)
class Take(Stage):
    n: int

    chain_name = "_Take"
    resume_order = "preserve"
    reads_values = False
    item_flow = "offset"

    def call(self) -> str:
        return f".take({self.n})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        return take_items(blocks, self.n)


@dataclass(frozen=True)
class Cache(Stage):
    """``Dataset.cache()``: the stages before it run in the first complete epoch only; later
    epochs are served from what they produced (:mod:`streamio.pipeline.cache`)."""

    directory: Optional[str]  # None: in memory
    max_bytes: Optional[int]  # None: the memory default; no bound for a directory

    resume_order = "preserve"
    builds_upstream = True
    # reads_values and item_flow keep the cautious defaults (True, None): a resume's
    # fast-forward then skips after the cache, so a replayed filling epoch sees every item.

    def __post_init__(self) -> None:
        from .cache import MemoryCache

        object.__setattr__(self, "memory", MemoryCache())

    @property
    def keeps_in_process(self) -> bool:  # type: ignore[override]
        return self.directory is None

    def __getstate__(self) -> dict:
        # A process the stage is sent to (a DataLoader worker) fills its own memory cache.
        return {"directory": self.directory, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def call(self) -> str:
        args = [] if self.directory is None else [repr(self.directory)]
        if self.max_bytes is not None:
            args.append(f"max_bytes={self.max_bytes}")
        return f".cache({', '.join(args)})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        from .cache import cached_blocks

        close_blocks(blocks)  # the source end, unstarted: the cache builds its own upstream
        return cached_blocks(self, run, position)


@dataclass(frozen=True)
class Mix(Stage):
    """``streamio.mix(inputs, weights, seed=, stop=)``: the first stage of a Dataset without
    sources of its own; it reads its inputs' epochs and interleaves their items by weight
    (:mod:`streamio.pipeline.mix`)."""

    inputs: tuple  # the input Datasets
    weights: tuple  # floats summing to 1
    seed: int
    stop: str  # "first_exhausted" or "all_exhausted"
    seed_drawn: bool = False
    # What the inputs are, for the chain digest (each input's own chain and given seeds): the
    # digest describes a field it cannot read into (a Dataset) by its type name only.
    inputs_key: str = field(init=False, repr=False)

    resume_order = "preserve"  # a deterministic function of the inputs' epochs and the seed
    reads_values = False
    item_flow = "same"

    def __post_init__(self) -> None:
        from .mix import describe_inputs

        object.__setattr__(self, "inputs_key", describe_inputs(self.inputs))

    @property
    def makes_batches(self) -> bool:  # type: ignore[override]
        return self.inputs[0].batch_size is not None  # inputs are all batched or none is

    @property
    def batch_size(self) -> Optional[int]:
        sizes = {inp.batch_size for inp in self.inputs}
        return sizes.pop() if len(sizes) == 1 else max(s for s in sizes if s is not None)

    @property
    def maps_items(self) -> bool:  # type: ignore[override]
        # Batches the inputs decoded, or an input's map: not what one decoder makes.
        return self.makes_batches or any(inp.maps_items for inp in self.inputs)

    @property
    def parallelism(self) -> int:  # type: ignore[override]
        return max(inp.map_parallelism for inp in self.inputs)

    def call(self) -> str:
        return (f"streamio.mix([{', '.join(map(repr, self.inputs))}],"
                f" weights={[round(w, 6) for w in self.weights]}, seed={self.seed},"
                f" stop={self.stop!r})")

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        from .mix import mix_blocks

        return mix_blocks(self, blocks, run, position)


# -- how the built-in stages apply ----------------------------------------------------------------
def shuffle_blocks(blocks: Iterator[tuple], run: Any, size: int, buffer_bytes: Optional[int],
                   seed: int, initial: Optional[int], position: int, batched: bool
                   ) -> Iterator[tuple]:
    ctx = run.ds.context
    rng = derive_rng(seed, epoch=run.epoch, rank=ctx.rank, worker=ctx.worker, stage=position)
    buffer = ShuffleBuffer(size, rng=rng, buffer_bytes=buffer_bytes, initial=initial,
                           size_of=estimate_nbytes if batched else len)
    track = run.track_ids and not batched
    try:
        for items, ids in blocks:
            # Piece by piece: joining them would copy every emitted (scattered) reference.
            yield from buffer.push_pieces(items, ids)
        out, out_ids = buffer.drain()
        if out:
            yield out, (out_ids if track else None)
    finally:
        close_blocks(blocks)


def skip_items(blocks: Iterator[tuple], n: int) -> Iterator[tuple]:
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
        close_blocks(blocks)


def take_items(blocks: Iterator[tuple], n: int) -> Iterator[tuple]:
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
        close_blocks(blocks)

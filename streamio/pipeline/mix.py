"""``streamio.mix``: several Datasets' items interleaved by weight, deterministically for a seed.

A mix is a sourceless :class:`~streamio.Dataset` whose first stage (:class:`~.stages.Mix`) runs
one epoch of each input (same epoch number, rank and worker: each shuffles as it would alone)
and interleaves their items; the stages after it, resume, ``shard`` and the adapters treat it as
any Dataset.

**Order** (resume and shards replay it: it must not drift): which input gives the next item is
drawn ``DRAW`` choices at a time from a PCG64 keyed by ``(seed, epoch, rank, worker, stage,
shards)``; each choice is a uint32 (half of one 64-bit output, low half first) that picks the
first live input whose cumulative weight, scaled to 2**32, is above it (a weight is honoured to
2**-32). Nothing else decides it (not how the inputs' reads were chunked): the output is a
function of the inputs' item sequences and the seed. A choice that falls on an ended input ends
the epoch (``stop="first_exhausted"``), or drops that input, discards the rest of the draw and
draws anew from the others' weights, renormalised (``"all_exhausted"``). Seeds an input drew
(``shuffle(seed=None)``) are replaced by seeds derived from the mix's seed and the input's
place; given seeds are kept, and are part of the chain digest.

**Running** (:func:`_interleave`): one ``mix_take`` pass (the C kernel, else
:func:`mix_take_reference`, its specification) per output block, no Python work per item. An
input that is its sources alone and reads small TFRecord records hands the kernel each read's
records where they lie (``RecordSpans``): the kernel makes each record as it places it (so in
output order) and checks its CRC; one that fails ends the mix after every item before it, with
its reader's error. An input's block is used up before its reader reads into that buffer again.
Output blocks hold about the inputs' longest block (``MIN_SLICE`` to ``MAX_SLICE`` items): all
of one length with a decoder after the mix; without one, also cut where the draws or an input's
block of spans end; where blocks are cut never changes the order. **Memory**: one output block,
each input's current block and read buffer; inputs without a ``read_size`` share one reader's by
weight (or equally, if more; at least ``MIN_READ_SIZE``), more once their records prove large
(:func:`_large_shares`): at most about twice one Dataset's. Figures: docs/performance.md.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from numbers import Real
from typing import Any, Iterator, Optional

import numpy as np

from ..errors import UsageError, UsageTypeError
from ..formats import RecordSpans, masked_crc_matches
from ..reader import DEFAULT_READ_SIZE
from .dataset import Dataset, _check_seed
from .epoch import INDEX_BITS, EpochRun, takes_header
from .resume import describe_chain, with_seeds
from .stages import Mix, close_blocks

__all__ = ["STOP_MODES", "MixedDataset", "describe_inputs", "mix", "mix_blocks",
           "mix_take_reference"]

STOP_MODES = ("first_exhausted", "all_exhausted")
#: The most inputs a mix takes (the kernel's parts).
MAX_INPUTS = 255
#: Choices drawn at once (a generator call costs the same for 1 or a few thousand).
DRAW = 8192
#: Items placed per output block: about the inputs' own block length (a reader's block is
#: bounded in bytes), within these bounds: enough that the per-block Python work costs little
#: per item, few enough that the records in flight stay modest.
MIN_SLICE = 64
MAX_SLICE = 8192
#: The smallest read an input's share of the read size comes to (a pipe buffer's worth).
MIN_READ_SIZE = 64 * 1024
#: Whether an input that is its sources alone hands the kernel its records where they lie in
#: its reads (made in output order, see the module's docstring); False: as lists its reader
#: made, the earlier way (the same items, in the same order), kept to compare the two.
SPANS = True
# Keys the derived input seeds apart from any other use of the mix's seed.
_INPUT_SEED_SALT = 0x6D6978


class MixedDataset(Dataset):
    """What :func:`mix` returns: a Dataset whose items come from its :attr:`inputs`.

    It has no sources of its own (``sources`` is empty); ``shard(n, i)`` shards every input.
    """

    def __init__(self, stage: Mix, decoder: Any) -> None:
        # An empty stream stands in for the sources, so every attribute a Dataset has is set as
        # Dataset.__init__ sets it; the mix's stage then replaces the source end.
        super().__init__(b"", "lines", decoder=decoder)
        self._all_sources = ()
        self._selection = ()
        self._format = "mix"
        self._stages = (stage,)

    @property
    def inputs(self) -> tuple:
        """The mixed Datasets, as given to :func:`mix`."""
        return self._stages[0].inputs

    def __repr__(self) -> str:
        calls = "".join(stage.call() for stage in self._stages)
        return calls + "".join(f".shard({n}, {i})" for n, i in self._round_robin)


def mix(datasets: Any, weights: Any = None, *, seed: Optional[int] = None,
        stop: str = "first_exhausted") -> Dataset:
    """A Dataset that interleaves the items of ``datasets`` by ``weights``. By default
    (``stop="first_exhausted"``) the epoch ends when the first input runs out, and the rest of
    the others is NOT delivered (two inputs of 2,000 items, weights ``[3, 1]``: about 1,350 of
    the second's are dropped); ``stop="all_exhausted"`` delivers every item of every input, as
    tf.data's ``sample_from_datasets`` does.

    Items are records, or batches if the inputs are batched; ``weights`` None: equal;
    deterministic for ``seed`` (None: drawn now, so epochs differ but a run is not reproduced by
    a new process unless a resume state carries it).

    ``stop="first_exhausted"``: the epoch ends when the mix first picks an input that has ended
    (the ratio holds to the end); ``"all_exhausted"``: an input that ends drops out and the
    others go on with their weights renormalised, so every item of every input is delivered
    exactly once. An input of weight 0 is not read. (The default stays ``first_exhausted``:
    changing it would change the epochs, and the resume states, of existing pipelines.)

    Each input runs its own epoch with its own shuffle, decoder and stages, as the same epoch
    number. Unbatched inputs that share one decoder (the same object, or equal type and repr)
    make it the mix's: ``mix(...).batch(n)`` then decodes batches with it; otherwise a batch is
    a list of items. The inputs are all batched or all unbatched. See
    :mod:`streamio.pipeline.mix` for the order and how seeds are derived, docs/mixing.md for
    the cost.
    """
    inputs = _check_inputs(datasets)
    probabilities = _check_weights(weights, len(inputs))
    if not isinstance(stop, str):
        raise UsageTypeError(f"stop must be a str, not {type(stop).__name__}")
    if stop not in STOP_MODES:
        raise UsageError(f"stop must be one of {STOP_MODES}, not {stop!r}")
    batched = {inp.batch_size is not None for inp in inputs}
    if len(batched) > 1:
        raise UsageError("mix() takes inputs that are all batched or all unbatched (it"
                         " interleaves items: records, or batches); batch after the mix instead")
    stage = Mix(inputs, probabilities, _check_seed(seed), stop, seed is None)
    return MixedDataset(stage, None if batched == {True} else _shared_decoder(inputs))


def _check_inputs(datasets: Any) -> tuple:
    if isinstance(datasets, Dataset) or not isinstance(datasets, (list, tuple)):
        raise UsageTypeError(f"mix() takes a list of streamio Datasets, not"
                             f" {type(datasets).__name__}")
    if not datasets:
        raise UsageError("mix() needs at least one Dataset")
    if len(datasets) > MAX_INPUTS:
        raise UsageError(f"mix() takes at most {MAX_INPUTS} Datasets, not {len(datasets)}:"
                         " mix mixes of them")
    for k, inp in enumerate(datasets):
        if not isinstance(inp, Dataset):
            raise UsageTypeError(f"mix() input {k} is a {type(inp).__name__}, not a streamio"
                                 " Dataset")
    return tuple(datasets)


def _check_weights(weights: Any, n: int) -> tuple:
    if weights is None:
        return (1.0 / n,) * n
    if isinstance(weights, np.ndarray):
        weights = weights.tolist()
    if not isinstance(weights, (list, tuple)):
        raise UsageTypeError(f"weights must be a list of numbers, not {type(weights).__name__}")
    if len(weights) != n:
        raise UsageError(f"weights has {len(weights)} entries for {n} datasets: give one weight"
                         " per dataset")
    values = []
    for k, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, Real):
            raise UsageTypeError(f"weights[{k}] must be a number, not {type(w).__name__}")
        try:
            value = float(w)  # an int beyond the float range overflows here
        except OverflowError:
            value = math.inf
        if not math.isfinite(value) or value < 0:
            shown = repr(w) if len(repr(w)) < 40 else f"{repr(w)[:20]}... ({type(w).__name__})"
            raise UsageError(f"weights[{k}] must be a finite number >= 0, not {shown}")
        values.append(value)
    largest = max(values)
    if largest <= 0:
        raise UsageError("weights are all zero: at least one dataset needs a positive weight")
    try:
        total = math.fsum(values)
    except OverflowError:  # weights near the float maximum: relative to the largest instead
        values = [value / largest for value in values]
        total = math.fsum(values)
    return tuple(value / total for value in values)


def _shared_decoder(inputs: tuple) -> Any:
    """The inputs' decoder when they all have the same one (same object, or equal type and
    repr) and no map changes their records; else None."""
    first = inputs[0].decoder
    if first is None or any(inp.maps_items for inp in inputs):
        return None
    for inp in inputs[1:]:
        other = inp.decoder
        if other is not first and (type(other) is not type(first) or repr(other) != repr(first)):
            return None
    return first


def describe_inputs(inputs: tuple) -> str:
    """The inputs for the chain digest: each one's chain (sources, format, options, decoder,
    stages, shards) and the seeds it was given (drawn ones are derived from the mix's)."""
    return json.dumps([[describe_chain(inp), _given_seeds(inp)] for inp in inputs])


def _given_seeds(ds: Any) -> list:
    return [None if getattr(s, "seed_drawn", False) else getattr(s, "seed", None)
            for s in ds._stages]


def _input_seeds(seed: int, k: int, ds: Any) -> list:
    """Input ``k``'s stage seeds: drawn ones replaced by seeds derived from the mix's."""
    out = []
    for j, stage in enumerate(ds._stages):
        own = getattr(stage, "seed", None)
        if own is not None and getattr(stage, "seed_drawn", False):
            sequence = np.random.SeedSequence(int(seed), spawn_key=(_INPUT_SEED_SALT, k, j))
            own = int(sequence.generate_state(1, np.uint64)[0])
        out.append(own)
    return out


def _source_slots(ds: Any) -> int:
    """How many record-origin source numbers ``ds``'s records use (a mix: its inputs')."""
    if isinstance(ds, MixedDataset):
        return sum(_source_slots(inp) for inp in ds.inputs)
    return len(ds._all_sources)


# -- running --------------------------------------------------------------------------------------
class _Input:
    """One input's epoch while it is mixed: its block chain and the items pulled, not placed."""

    def __init__(self, ds: Any, outer: Any, base: int, read_size: int, large_read_size: int,
                 track: bool) -> None:
        # Its counters are the mix's; its records go to the mix undecoded (the mix decodes).
        self.run = EpochRun(ds, outer.epoch, outer.stats, decode_items=False)
        self.run.read_size = read_size  # for its sources not given one
        self.run.large_read_size = large_read_size  # theirs once their records prove large
        # An input that is its sources alone gives the records of its reads where they lie
        # (RecordSpans): the kernel makes them in output order, and uses up a block before
        # the next is asked for (see the module's docstring).
        self.run.spans = SPANS and not ds._stages and ds._feed is None
        # Their CRCs checked by the kernel as it copies each record (one pass over its bytes,
        # as the list path's scan makes it), where the reader leaves them to it.
        self.run.span_crcs = True
        if track:
            self.run.track_ids = True
        self.blocks = self.run.build()
        self.outer = outer
        self.base = base  # its source numbers in the mix's record origins
        self.track = track
        self.ids: Optional[np.ndarray] = None
        self.length = 0  # of the block next_block last gave
        self.spans: Optional[RecordSpans] = None  # that block, if records in a buffer
        self.done = False
        self.error: Optional[BaseException] = None
        self.names_seen = 0
        self.header = outer.decoder is not None and takes_header(outer.decoder)

    def next_block(self) -> Optional[Any]:
        """The input's next non-empty block as the kernel takes it (a list, or a reader's
        records still in its buffer as a ``(buffer, spans)`` tuple), its length in
        :attr:`length` and its record origins in :attr:`ids`; None once the input has ended or
        failed. Not kept here: the caller's ``parts`` list is then the only holder of a block
        the input's generators handed over, and the kernel moves its items out instead of
        counting them (see ``streamio/_c/mix.c``)."""
        while not self.done:
            try:
                items, ids = next(self.blocks)
            except StopIteration:
                self.done = True
                break
            except Exception as exc:  # noqa: BLE001 - raised where the mix reaches it
                self.done = True
                self.error = exc
                break
            if len(self.run.names) != self.names_seen or self.header:
                self._learn_names()
            length = len(items)
            if not length:
                continue
            self.length = length
            if items.__class__ is RecordSpans:
                self.spans = items
                items = ((items.buffer, items.spans, True) if items.crcs else
                         (items.buffer, items.spans))
            else:
                self.spans = None
                if not isinstance(items, list):
                    items = list(items)
            if self.track:
                if ids is None:  # no origins from this input: name its first source
                    ids = np.zeros(length, np.int64)
                ids = np.ascontiguousarray(ids, np.int64)
                if self.base:
                    ids = ids + (self.base << INDEX_BITS)
                self.ids = ids
            return items
        return None

    def hand_over(self, k: int, parts: list, starts: list, origins: Optional[list]) -> bool:
        """Put this input's next block in the kernel's lists as part ``k`` (its block used up,
        or stopped at a record whose CRC failed); False once the input has ended or failed."""
        if starts[k] < self.length:
            # Not used up: its next record failed the CRC check the kernel made as it copied
            # it. The reader's error for it, raised by the reader (next_block) as it would
            # have been at that record.
            self.spans.fault(starts[k])
        # Held by `parts` alone (no local name here), so the kernel moves its items, not
        # counting them.
        parts[k] = self.next_block()
        starts[k] = 0
        if parts[k] is None:
            parts[k] = _NOTHING
            if origins is not None:
                origins[k] = _NO_ORIGINS
            return False
        if origins is not None:
            origins[k] = self.ids
        return True

    def _learn_names(self) -> None:
        names = self.run.names
        if len(names) != self.names_seen:  # a new source opened: the mix names it too
            self.names_seen = len(names)
            for ordinal, name in list(names.items()):
                self.outer.names[self.base + ordinal] = name
        if self.header and self.run.header is not None:
            # A CSV header the input read: the mix's decoder needs it (and the same one).
            self.header = False
            self.outer.use_header(self.run.header, self.run.header_source)

    def close(self) -> None:
        close_blocks(self.blocks)


def mix_blocks(stage: Mix, blocks: Iterator[tuple], run: Any, position: int
               ) -> Iterator[tuple]:
    """The :class:`~streamio.pipeline.stages.Mix` stage's blocks: its inputs interleaved."""
    close_blocks(blocks)  # the source end of a mix is empty: its records come from the inputs
    ds = run.ds
    if position != 0 or ds._all_sources:
        raise UsageError("a Mix stage is the first stage of a Dataset made by streamio.mix(),"
                         " not a stage to add to another Dataset")
    ctx = ds.context
    run.batched = stage.makes_batches
    track = run.track_ids and not run.batched
    # Each input's share of one reader's read size (DEFAULT_READ_SIZE, or the share an outer mix
    # gives this one): its weight's, or an equal share if that is more, so an input drawn rarely
    # does not read in pieces so small that the work per read outweighs them (docs/performance.md).
    budget = DEFAULT_READ_SIZE if run.read_size is None else run.read_size
    equal = 1 / sum(w > 0 for w in stage.weights)
    large = _large_shares(stage.weights, equal,
                          budget if run.large_read_size is None else run.large_read_size)
    # (input's Dataset for this epoch and reader, its first source number, its read size)
    plans: list = []
    base = 0
    for k, inp in enumerate(stage.inputs):
        if stage.weights[k] > 0:  # an input of weight 0 is never chosen: not opened
            plan = inp.with_context(epoch=run.epoch, rank=ctx.rank, world_size=ctx.world_size,
                                    worker=ctx.worker, num_workers=ctx.num_workers)
            for num_shards, index in ds._round_robin:
                plan = plan.shard(num_shards, index)
            share = max(MIN_READ_SIZE, int(budget * max(stage.weights[k], equal)))
            plans.append((with_seeds(plan, _input_seeds(stage.seed, k, plan)), base, share,
                          max(share, large[k])))
        else:
            plans.append(None)
        base += _source_slots(inp)
    layers = [x for layer in ds._round_robin for x in layer]
    sequence = np.random.SeedSequence(int(stage.seed), spawn_key=(
        run.epoch, ctx.rank, ctx.worker, position, *layers))
    # The bit generator alone: the draws are its raw outputs (no Generator around it).
    bits = np.random.PCG64(sequence)
    return _interleave(plans, run, stage.weights, stage.stop, bits, track)


def _large_shares(weights: tuple, equal: float, budget: int) -> list:
    """Each input's read size once its records prove large (a read of them is few objects:
    the work a read costs beyond its bytes is then spread as when reading alone, see
    docs/performance.md): twice ``budget`` shared by ``max(weight, equal)``, each at most
    ``budget`` (what one capped share leaves goes to the others); 0 for an input of weight 0."""
    want = {k: max(w, equal) for k, w in enumerate(weights) if w > 0}
    out = [0] * len(weights)
    total = 2 * budget
    while want:
        scale = total / math.fsum(want.values())
        capped = [k for k, w in want.items() if w * scale >= budget]
        if not capped:
            for k, w in want.items():
                out[k] = max(MIN_READ_SIZE, int(w * scale))
            break
        for k in capped:
            out[k] = budget
            total -= budget
            del want[k]
    return out


@functools.lru_cache(maxsize=256)
def _cached_bounds(weights: tuple, live: tuple) -> np.ndarray:
    """:func:`_bounds` of ``weights`` and ``live`` (tuples), read-only: made once for a mix's
    weights and each set of its inputs still live, not twice an epoch (numpy calls of a few
    microseconds each, which an epoch of a mix of small shards feels)."""
    bounds = _bounds(np.asarray(weights, dtype=np.float64), np.asarray(live, dtype=bool))
    bounds.flags.writeable = False
    return bounds


def _bounds(weights: np.ndarray, live: np.ndarray) -> np.ndarray:
    """The live inputs' cumulative weights scaled to 2**32, as uint64: a draw ``u`` (a uint32)
    picks the first input ``k`` with ``u < bounds[k]``. An input that has ended (or weighs 0)
    has an empty range; the last live one ends at 2**32, so rounding never picks past it."""
    p = np.where(live, weights, 0.0)
    scaled = np.floor(np.cumsum(p / p.sum()) * _BOUND_END)
    bounds = np.minimum(scaled, _BOUND_END).astype(np.uint64)
    bounds[int(np.flatnonzero(live)[-1]):] = _BOUND_END
    return bounds


def _interleave(plans: list, run: Any, weights: tuple, stop: str,
                bits: np.random.PCG64, track: bool) -> Iterator[tuple]:
    k_all = len(plans)
    live = [w > 0 for w in weights]
    inputs: list = [None] * k_all
    # What the kernel reads: each input's current block, where its next item is (the kernel
    # moves it on), and the block's record origins.
    parts: list = [_NOTHING] * k_all
    starts: list = [0] * k_all
    origins: Optional[list] = [_NO_ORIGINS] * k_all if track else None
    longest = 0  # the longest block an input gave
    block = MIN_SLICE  # the output blocks' length, from it
    bounds = _cached_bounds(weights, tuple(live))
    # The output block being filled: its items (the list the kernel appends to; None before
    # its first), its length when full, and, when tracked, its origins (one array a block:
    # the block's slice of it goes downstream). Plain locals: this loop runs a few hundred
    # times an epoch, and each attribute lookup or method call there is per-block overhead.
    items: Optional[list] = None
    size = 0
    placed: Optional[np.ndarray] = None
    # Blocks of one length for a decoder: it then allocates the same sizes block after block,
    # which the allocator reuses (docs/performance.md).
    equal = run.decoder is not None
    take = _TAKE
    cut = False  # whether the output block goes out at the next turn, full or not
    try:
        # Built here, not when the epoch's chain is: a closed generator that never started
        # runs no finally, and an input's prefetch thread starts when it is built.
        for k, plan in enumerate(plans):
            if plan is not None:
                inputs[k] = _Input(plan[0], run, plan[1], plan[2], plan[3], track)
        while any(live):
            draws = _draw(bits)
            ended = None
            t = 0
            while t < DRAW:
                # Output blocks about as long as the inputs' longest (whose reader bounds its
                # bytes). With a decoder after the mix they all have that length, whatever the
                # draws and wherever the inputs' blocks end (`equal`); otherwise a block also
                # ends where the draws end or where a block of records made as they are placed
                # (spans) ends (`cut`). Where blocks are cut never changes the order, only the
                # block sizes.
                if items and (cut or len(items) == size):
                    yield _output(items, placed)
                    items, size = None, 0
                cut = False
                if not size:
                    size = block
                    if track:
                        placed = np.empty(size, dtype=np.int64)
                n = 0 if items is None else len(items)
                items, t, short = take(draws, t, size - n, bounds, parts, starts, origins,
                                       None if placed is None else placed[n:], items)
                if short < 0:
                    cut = not equal  # the draws ended (or the block is full)
                    continue
                # Input `short`'s block is used up: its next one, or it has ended.
                inp = inputs[short]
                cut = not equal and inp.spans is not None
                if not inp.hand_over(short, parts, starts, origins):
                    ended = short
                    break
                if inp.length > longest:
                    longest = inp.length
                    block = min(MAX_SLICE, max(MIN_SLICE, longest))
            if ended is None:
                continue
            failed = inputs[ended].error
            if failed is not None:
                if items:
                    yield _output(items, placed)
                raise failed  # after every item the mix delivers before it
            if stop == "first_exhausted":
                break
            live[ended] = False  # the rest of the draw is discarded: drawn anew without it
            if any(live):
                bounds = _cached_bounds(weights, tuple(live))
        if items:
            yield _output(items, placed)
    finally:
        for source in inputs:
            if source is not None:
                source.close()


def _output(items: list, placed: Optional[np.ndarray]) -> tuple:
    """A finished output block: its items, and the origins placed for them (None untracked)."""
    return items, None if placed is None else placed[:len(items)]


def _draw(bits: np.random.PCG64) -> bytes:
    """``DRAW`` choices: uint32 numbers, two to each of the generator's 64-bit outputs (the
    cheapest numbers it gives), low half first. As bytes: the kernel takes them a few hundred
    times an epoch, and a bytes object gives its buffer for less than a numpy array does."""
    return bits.random_raw(DRAW // 2).astype("<u8", copy=False).tobytes()


_NOTHING: list = []
_NO_ORIGINS = np.zeros(0, dtype=np.int64)
_BOUND_END = 1 << 32
_DRAW_BYTES = 4


def mix_take_reference(draws: Any, begin: int, limit: int, bounds: Any, parts: list,
                       starts: list, origins: Optional[list], origins_out: Any,
                       out: Optional[list] = None) -> tuple:
    """The specification of the C kernel ``_speedups.mix_take``: same results, same errors.

    From draw ``begin`` on (``draws``: little-endian uint32), each draw ``u`` picks the first
    part ``k`` with ``u < bounds[k]`` (``bounds``: uint64, one per part, non-decreasing, the
    last 2**32) and takes the next item of ``parts[k]`` (a list, or a tuple ``(buffer, spans)``
    whose items are ``bytes`` made from ``buffer`` at the ``(offset, length)`` int64 pairs of
    ``spans``: records still in a reader's buffer; or ``(buffer, spans, True)``, the same with
    each record's masked CRC-32C after it in ``buffer``, checked) from ``starts[k]`` (updated in
    place), appending it to ``out`` (a list, not one of the parts; None: a new list). It stops
    after ``limit`` items, at the end of the draws, or before the first draw whose part holds
    no item left or whose record's CRC does not match. Returns ``(out, end, short)``: ``end``
    the first draw not used, ``short`` the part that ran out or whose record failed (its start
    left at that record; else -1). ``origins`` (None, or one int64 buffer per part, as long as
    it) gives the items' origins, written to ``origins_out[:n]`` for the ``n`` items taken.

    The kernel also moves the items out of a part that nothing but ``parts`` refers to (None
    takes their slots; see ``streamio/_c/mix.c``): no one else can see that part, so the
    results are the same. This reference only reads the parts."""
    begin, raw, most, bound = _take_call(draws, begin, limit, bounds, parts, starts, out)
    spans, sources, sizes = _take_parts(parts, starts, origins, origins_out, out, most)
    draw = np.frombuffer(raw.cast("B"), dtype="<u4", count=most, offset=begin * _DRAW_BYTES)
    choices = np.searchsorted(bound, draw.astype(np.uint64), side="right")
    n, short = _first_short(choices, sizes, starts)
    choices = choices[:n]
    bad = _first_bad_record(choices, spans, starts, len(parts))
    if bad is not None and bad[3]:
        raise ValueError(f"parts[{bad[1]}] item {bad[2]} lies outside its buffer")
    if bad is not None:  # the pass stops before the record whose CRC does not match
        n, short = bad[0], bad[1]
        choices = choices[:n]
    counts = np.bincount(choices, minlength=len(parts))
    # Grouped by part, in order within each: where the concatenated parts go.
    order = np.argsort(choices, kind="stable")
    items = np.empty(n, dtype=object)
    items[order] = np.fromiter(itertools.chain.from_iterable(
        (_made(*spans[k][:2], start, count) if k in spans else part[start:start + count])
        for k, (part, start, count) in enumerate(zip(parts, starts, counts))),
        dtype=object, count=n)
    if sources is not None:
        placed = np.frombuffer(memoryview(origins_out).cast("B"), dtype=np.int64)
        placed[order] = np.concatenate([np.zeros(0, np.int64)] + [
            source[start:start + count] for source, start, count in zip(sources, starts, counts)])
    for k, count in enumerate(counts.tolist()):
        if count:
            starts[k] += count
    if out is None:
        out = []
    out += items.tolist()
    return out, begin + n, short


def _take_call(draws: Any, begin: int, limit: int, bounds: Any, parts: list, starts: list,
               out: Optional[list]) -> tuple:
    """``(begin, draws, most, bounds)`` of a :func:`mix_take_reference` call, checked in the
    kernel's order: ``draws`` a memoryview of whole uint32 draws, of which at most ``most``
    (``limit``, as far as there are any from ``begin``) are taken, ``bounds`` as uint64."""
    if not isinstance(parts, list) or not isinstance(starts, list):
        raise TypeError("parts and starts must be lists")
    if out is not None and type(out) is not list:
        raise TypeError("out must be a list or None")
    begin, limit = operator.index(begin), operator.index(limit)  # as the kernel's "n"
    raw = memoryview(draws)
    if raw.nbytes % _DRAW_BYTES:
        raise ValueError(f"draws must be whole 4-byte draws, not {raw.nbytes} bytes")
    ndraws = raw.nbytes // _DRAW_BYTES
    if not 0 <= begin <= ndraws:
        raise ValueError(f"begin {begin} is outside the {ndraws} draws")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    most = min(limit, ndraws - begin)
    bounds_view = memoryview(bounds)
    nparts = len(parts)
    if not 1 <= nparts <= 256:
        raise ValueError(f"between 1 and 256 parts, not {nparts}")
    if bounds_view.itemsize != 8 or bounds_view.nbytes != nparts * 8:
        raise ValueError(f"bounds must be {nparts} uint64, one per part")
    bound = np.frombuffer(bounds_view.cast("B"), dtype=np.uint64)
    if (np.diff(bound.astype(object)) < 0).any() or (bound > _BOUND_END).any():
        raise ValueError("bounds must be non-decreasing, at most 2**32")
    if bound[-1] != _BOUND_END:
        raise ValueError("the last bound must be 2**32")
    if len(starts) != nparts:
        raise ValueError(f"starts has {len(starts)} entries for {nparts} parts")
    return begin, raw, most, bound


def _take_parts(parts: list, starts: list, origins: Optional[list], origins_out: Any,
                out: Optional[list], most: int) -> tuple:
    """``(spans, sources, sizes)`` of a :func:`mix_take_reference` call, checked in the
    kernel's order: the span parts (``k -> (bytes, int64 pairs, crcs)``), the origins per part
    as int64 arrays (None untracked) and each part's length in items."""
    if (origins is None) != (origins_out is None):
        raise TypeError("origins and origins_out are both None or neither")
    nparts = len(parts)
    sources = None
    if origins is not None:
        if not isinstance(origins, list) or len(origins) != nparts:
            raise ValueError(f"origins must be a list of {nparts} buffers")
        out_view = memoryview(origins_out)
        if out_view.readonly:
            raise TypeError("origins_out must be writable")
        if out_view.itemsize != 8 or out_view.nbytes // 8 < most:
            raise ValueError(f"origins_out must hold {most} int64")
        sources = []
        for k, origin in enumerate(origins):
            view = memoryview(origin)
            if view.itemsize != 8:
                raise ValueError(f"origins[{k}] must be a buffer of int64")
            sources.append(np.frombuffer(view.cast("B"), dtype=np.int64))
    # Span parts first, as the kernel takes their buffers.
    spans = {k: _span_part(k, part) for k, part in enumerate(parts)
             if type(part) is tuple and len(part) in (2, 3)}
    sizes = []
    for k, (part, start) in enumerate(zip(parts, starts)):
        if k not in spans and not isinstance(part, list):
            raise TypeError(f"parts[{k}] must be a list or a (buffer, spans[, crcs]) tuple")
        if part is out:
            raise ValueError(f"out is parts[{k}]")
        if type(start) is not int:
            raise TypeError(f"starts[{k}] must be an int")
        size = len(spans[k][1]) // 2 if k in spans else len(part)
        if not 0 <= start <= size:
            raise ValueError(f"starts[{k}] is {start}, outside parts[{k}] of {size} items")
        if sources is not None and len(sources[k]) != size:
            raise ValueError(f"origins[{k}] has {len(sources[k])} entries for {size} items")
        sizes.append(size)
    return spans, sources, sizes


def _first_short(choices: np.ndarray, sizes: list, starts: list) -> tuple:
    """``(n, short)``: the first choice whose part holds no item left (``short`` that part),
    else ``(len(choices), -1)``."""
    n, short = len(choices), -1
    for k in np.unique(choices).tolist():
        held = sizes[k] - starts[k]
        where = np.flatnonzero(choices == k)
        if len(where) > held and where[held] < n:  # its held-th choice finds none left
            n, short = int(where[held]), k
    return n, short


def _first_bad_record(choices: np.ndarray, spans: dict, starts: list, nparts: int
                      ) -> Optional[tuple]:
    """The first choice that takes a span outside its buffer (an error: nothing changes) or a
    record whose CRC does not match, as ``(choice, part, item, outside)``; else None."""
    counts = np.bincount(choices, minlength=nparts)
    bad = None
    for k, (data, pairs, crcs) in spans.items():
        for i in range(int(counts[k])):
            j = starts[k] + i
            offset, length = pairs[2 * j], pairs[2 * j + 1]
            outside = (offset < 0 or length < 0 or offset > data.nbytes
                       or length > data.nbytes - offset
                       or (crcs and data.nbytes - offset - length < 4))
            if outside or (crcs and not masked_crc_matches(bytes(data[offset:offset + length]),
                                                           data, offset + length)):
                where = int(np.flatnonzero(choices == k)[i])
                if bad is None or where < bad[0]:
                    bad = (where, k, j, outside)
                break
    return bad


def _span_part(k: int, part: tuple) -> tuple:
    """A ``(buffer, spans[, crcs])`` part's bytes, pairs and whether its records' CRCs are
    checked, checked as the kernel checks them."""
    crcs = bool(part[2]) if len(part) == 3 else False
    data = memoryview(part[0])
    if not data.contiguous:
        raise BufferError("memoryview: underlying buffer is not contiguous")
    data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    pairs = memoryview(part[1])
    if not pairs.c_contiguous:
        raise BufferError("memoryview: underlying buffer is not C-contiguous")
    if pairs.itemsize != 8 or pairs.nbytes % 16:
        raise ValueError(f"parts[{k}]'s spans must be int64 (offset, length) pairs")
    return data, pairs.cast("B").cast("q"), crcs


def _made(data: memoryview, pairs: memoryview, start: int, count: int) -> list:
    """Items ``start:start + count`` of a span part, as bytes."""
    return [bytes(data[pairs[2 * j]:pairs[2 * j] + pairs[2 * j + 1]])
            for j in range(start, start + count)]


def _fast_take() -> Any:
    try:
        from .. import _speedups
    except ImportError:
        return mix_take_reference
    return getattr(_speedups, "mix_take", mix_take_reference)


_TAKE = _fast_take()

"""``streamio.mix``: several Datasets' items interleaved by weight, deterministically for a seed.

A mix is a :class:`~streamio.Dataset` without sources of its own whose first stage,
:class:`~streamio.pipeline.stages.Mix`, runs one epoch of each input (same epoch number, rank
and worker, so each input shuffles as it would alone, differently each epoch) and interleaves
their items. Everything after it (``batch``, ``map``, ``prefetch``, ``shuffle``...) is an
ordinary stage, and resume, ``shard`` and the adapters take it as any other Dataset.

The order: which input gives the next item is drawn from the weights, ``DRAW`` choices at a
time (as uint8: at most ``MAX_INPUTS`` inputs), from a generator keyed by ``(seed, epoch,
rank, worker, stage, shards)``. The sequence of choices depends on nothing else (not on how
the inputs' reads were chunked), so the output is a function of the inputs' item sequences and
the seed: a replay (resume) gives the same order. When a choice falls on an input that has
ended, ``stop="first_exhausted"`` ends the epoch there; ``"all_exhausted"`` drops the input,
discards the choices drawn after it and draws anew from the others' weights, renormalised (when
the draws happen depends only on which inputs ended where, so this too is a function of the
inputs).

Cost: per output block (about as long as the inputs' blocks), a few numpy operations and one
pass that places the items (``interleave``: the C accelerator's, else
:func:`interleave_reference`, a stable argsort and object-array placement); no Python work per
item. Memory: one output
block being placed (at most ``MAX_SLICE`` items), plus each input's current block.

An input's seeds that were drawn (``shuffle(seed=None)``) are replaced by seeds derived from the
mix's seed and the input's place, so the mix's seed (which a resume state carries when it was
drawn) fixes every order; an input's given seeds are kept, and are part of the chain digest.
"""

from __future__ import annotations

import itertools
import json
import math
from numbers import Real
from typing import Any, Iterator, Optional

import numpy as np

from ..errors import UsageError, UsageTypeError
from .dataset import Dataset, _check_seed
from .epoch import INDEX_BITS, EpochRun, takes_header
from .resume import describe_chain, with_seeds
from .stages import Mix, close_blocks

__all__ = ["STOP_MODES", "MixedDataset", "describe_inputs", "interleave_reference", "mix",
           "mix_blocks"]

STOP_MODES = ("first_exhausted", "all_exhausted")
#: The choices are uint8 input numbers.
MAX_INPUTS = 255
#: Choices drawn at once (a numpy call costs the same for 1 or a few thousand).
DRAW = 8192
#: Items placed per output block: about the inputs' own block length (a reader's block is
#: bounded in bytes), within these bounds: enough that the per-block numpy calls cost little
#: per item, few enough that the records in flight stay modest.
MIN_SLICE = 64
MAX_SLICE = 8192
#: Up to this many inputs, counting each one's choices apart beats np.bincount (and a mask per
#: input a stable argsort).
_FEW_INPUTS = 8
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
    """A Dataset that interleaves the items of ``datasets`` (records, or batches if they are
    batched) by ``weights`` (None: equal), deterministically for ``seed`` (None: drawn now, so
    epochs differ but a run is not reproduced by a new process unless a resume state carries it).

    ``stop="first_exhausted"``: the epoch ends when the mix first picks an input that has ended
    (the ratio holds to the end); ``"all_exhausted"``: an input that ends drops out and the
    others go on with their weights renormalised, so every item of every input is delivered
    exactly once. An input of weight 0 is not read.

    Each input runs its own epoch with its own shuffle, decoder and stages, as the same epoch
    number. Unbatched inputs that share one decoder (the same object, or equal type and repr)
    make it the mix's: ``mix(...).batch(n)`` then decodes batches with it; otherwise a batch is
    a list of items. The inputs are all batched or all unbatched. See
    :mod:`streamio.pipeline.mix` for the order, the cost and how seeds are derived.
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
    for k, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, Real):
            raise UsageTypeError(f"weights[{k}] must be a number, not {type(w).__name__}")
        if not math.isfinite(w) or w < 0:
            raise UsageError(f"weights[{k}] must be a finite number >= 0, not {w!r}")
    total = math.fsum(float(w) for w in weights)
    if total <= 0:
        raise UsageError("weights are all zero: at least one dataset needs a positive weight")
    return tuple(float(w) / total for w in weights)


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

    def __init__(self, ds: Any, outer: Any, base: int, track: bool) -> None:
        self.run = EpochRun(ds, outer.epoch, outer.stats)  # its counters are the mix's
        if track:
            self.run.track_ids = True
        self.blocks = self.run.build()
        self.outer = outer
        self.base = base  # its source numbers in the mix's record origins
        self.track = track
        self.items: list = []
        self.ids: Optional[np.ndarray] = None
        self.pos = 0
        self.done = False
        self.error: Optional[BaseException] = None
        self.names_seen = 0
        self.block_len = 0  # the longest block it gave
        self.header = outer.decoder is not None and takes_header(outer.decoder)

    def fill(self) -> int:
        """The items held from the current block; when none are, the next non-empty block is
        pulled first (none once the input has ended or failed). Blocks are never joined: the
        mix cuts its slices where an input's block ends."""
        held = len(self.items) - self.pos
        while not held and not self.done:
            try:
                items, ids = next(self.blocks)
            except StopIteration:
                self.done = True
                break
            except Exception as exc:  # noqa: BLE001 - raised where the mix reaches it
                self.done = True
                self.error = exc
                break
            self._learn_names()
            if not len(items):
                continue
            if not isinstance(items, list):
                items = list(items)
            self.block_len = max(self.block_len, len(items))
            self.items, self.pos = items, 0
            if self.track:
                if ids is None:  # no origins from this input: name its first source
                    ids = np.zeros(len(items), np.int64)
                ids = np.asarray(ids, np.int64)
                if self.base:
                    ids = ids + (self.base << INDEX_BITS)
                self.ids = ids
            held = len(items)
        return held

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

    def take(self, n: int) -> tuple:
        start, self.pos = self.pos, self.pos + n
        ids = self.ids[start:self.pos] if self.track else None
        return self.items[start:self.pos], ids

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
    plans: list = []  # (input's Dataset for this epoch and reader, its first source number)
    base = 0
    for k, inp in enumerate(stage.inputs):
        if stage.weights[k] > 0:  # an input of weight 0 is never chosen: not opened
            plan = inp.with_context(epoch=run.epoch, rank=ctx.rank, world_size=ctx.world_size,
                                    worker=ctx.worker, num_workers=ctx.num_workers)
            for num_shards, index in ds._round_robin:
                plan = plan.shard(num_shards, index)
            plans.append((with_seeds(plan, _input_seeds(stage.seed, k, plan)), base))
        else:
            plans.append(None)
        base += _source_slots(inp)
    layers = [x for layer in ds._round_robin for x in layer]
    sequence = np.random.SeedSequence(int(stage.seed), spawn_key=(
        run.epoch, ctx.rank, ctx.worker, position, *layers))
    rng = np.random.Generator(np.random.PCG64(sequence))
    return _interleave(plans, run, np.asarray(stage.weights, dtype=np.float64), stage.stop,
                       rng, track)


def _draw(rng: np.random.Generator, weights: np.ndarray, live: np.ndarray) -> np.ndarray:
    """``DRAW`` choices among the live inputs, by weight, as uint8 input numbers: a uniform
    draw compared with the cumulative weights (cheaper than ``Generator.choice``)."""
    p = np.where(live, weights, 0.0)
    thresholds = np.cumsum(p / p.sum())[:-1].astype(np.float32)
    last = int(np.flatnonzero(live)[-1])
    thresholds[last:] = np.inf  # rounding never picks an input past the last live one
    u = rng.random(DRAW, dtype=np.float32)
    choices = np.zeros(DRAW, dtype=np.uint8)
    for threshold in thresholds:  # input k: thresholds[k - 1] <= u < thresholds[k]
        choices += u >= threshold
    return choices


def _counts(chosen: np.ndarray, k_all: int) -> np.ndarray:
    """How many of ``chosen`` name each input (``np.bincount``, which is slow on a uint8 array
    it first widens, for many inputs)."""
    if k_all > _FEW_INPUTS:
        return np.bincount(chosen, minlength=k_all)
    return np.array([np.count_nonzero(chosen == k) for k in range(k_all)])


def _interleave(plans: list, run: Any, weights: np.ndarray, stop: str,
                rng: np.random.Generator, track: bool) -> Iterator[tuple]:
    k_all = len(plans)
    live = weights > 0
    inputs: list = [None] * k_all
    try:
        # Built here, not when the epoch's chain is: a closed generator that never started
        # runs no finally, and an input's prefetch thread starts when it is built.
        for k, plan in enumerate(plans):
            if plan is not None:
                inputs[k] = _Input(plan[0], run, plan[1], track)
        while live.any():
            choices = _draw(rng, weights, live)
            ended = None
            start = 0
            while start < DRAW and ended is None:
                # Output blocks about as long as the inputs' (whose reader bounds their bytes):
                # how the choices are sliced never changes the order, only the block sizes.
                step = min(MAX_SLICE, max([MIN_SLICE, *(s.block_len for s in inputs if s)]))
                chosen = choices[start:start + step]
                counts = _counts(chosen, k_all)
                cut = len(chosen)
                short = None
                for k in np.flatnonzero(counts):
                    held = inputs[k].fill()
                    if held < counts[k]:
                        # Input k's block (or the input) ends at its held-th choice here: the
                        # slice stops there, and goes on with its next block.
                        at = int(np.flatnonzero(chosen == k)[held])
                        if at < cut:
                            cut, short = at, int(k)
                if short is not None and inputs[short].done:
                    ended = short  # it has no more items (fill pulls only when none are held)
                start += cut
                if cut:
                    if cut < len(chosen):
                        chosen = chosen[:cut]
                        counts = _counts(chosen, k_all)
                    yield _place(inputs, chosen, counts, track)
            if ended is None:
                continue
            failed = inputs[ended].error
            if failed is not None:
                raise failed  # after every item the mix delivers before it
            if stop == "first_exhausted":
                return
            live[ended] = False  # the rest of the draw is discarded: drawn anew without it
    finally:
        for source in inputs:
            if source is not None:
                source.close()


def _place(inputs: list, chosen: np.ndarray, counts: np.ndarray, track: bool) -> tuple:
    """The block of items for the choices ``chosen``: each input's next items, in the choices'
    order (no Python loop per item)."""
    present = np.flatnonzero(counts)
    if len(present) == 1:
        return inputs[present[0]].take(int(counts[present[0]]))
    parts, starts = [], []
    for source in inputs:  # the items stay in the inputs' lists: interleave reads them there
        parts.append(_NOTHING if source is None else source.items)
        starts.append(0 if source is None else source.pos)
    items = _INTERLEAVE(chosen, parts, starts)
    ids = None
    if track:
        ids = np.empty(len(chosen), dtype=np.int64)
        taken = [inputs[k].ids[starts[k]:starts[k] + counts[k]] for k in present]
        if len(inputs) > _FEW_INPUTS:
            ids[np.argsort(chosen, kind="stable")] = np.concatenate(taken)
        else:  # a mask per input is cheaper than a stable sort
            for k, part in zip(present, taken):
                ids[chosen == k] = part
    for k in present:
        inputs[k].pos += int(counts[k])
    return items, ids


_NOTHING: list = []


def interleave_reference(choices: np.ndarray, parts: list, starts: list) -> list:
    """``out[t]`` is the next item of ``parts[choices[t]]``, starting at
    ``parts[k][starts[k]]`` (``choices``: uint8 part numbers; ``parts[k]``: a list holding at
    least as many items from ``starts[k]`` on as ``choices`` names ``k``). The specification of
    the C kernel ``_speedups.interleave``: same results, same errors."""
    choices = np.frombuffer(choices, dtype=np.uint8)
    if not isinstance(parts, list) or not isinstance(starts, list):
        raise TypeError("interleave() arguments 2 and 3 must be lists")
    if len(parts) > 256:
        raise ValueError(f"at most 256 parts, not {len(parts)}")
    counts = np.bincount(choices, minlength=256)
    beyond = np.flatnonzero(counts[len(parts):])
    if len(beyond):
        raise ValueError(f"choice {len(parts) + beyond[0]} names no part ({len(parts)} parts)")
    if len(starts) != len(parts):
        raise ValueError(f"starts has {len(starts)} entries for {len(parts)} parts")
    for k, (part, start) in enumerate(zip(parts, starts)):
        if not isinstance(part, list):
            raise TypeError(f"parts[{k}] must be a list")
        if type(start) is not int:
            raise TypeError(f"starts[{k}] must be an int")
        if not 0 <= start <= len(part) or len(part) - start < counts[k]:
            raise ValueError(f"parts[{k}] holds {len(part)} items from {start} for {counts[k]}"
                             " choices")
    taken = [part[start:start + count] for part, start, count in zip(parts, starts, counts)]
    out = np.empty(len(choices), dtype=object)
    # Grouped by part, in order within each: where the concatenated parts go.
    out[np.argsort(choices, kind="stable")] = np.fromiter(
        itertools.chain.from_iterable(taken), dtype=object, count=len(choices))
    return out.tolist()


def _fast_interleave() -> Any:
    try:
        from .. import _speedups
    except ImportError:
        return interleave_reference
    return getattr(_speedups, "interleave", interleave_reference)


_INTERLEAVE = _fast_interleave()

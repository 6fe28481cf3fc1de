"""Exact mid-epoch resume by replay.

A checkpoint of an epoch is small and JSON-serialisable::

    {"streamio_resume": 1, "epoch": 3, "delivered": 1200, "finished": false,
     "seeds": [7, 11], "chain": "<sha256 of the pipeline's description>",
     "check": "<sha256 of the chain and the seeds>"}

``delivered`` counts the items (records, or batches after ``batch()``) the consumer has taken
from the epoch's iterator. Resuming (:meth:`Dataset.iter_from`) rebuilds the same epoch (same
epoch number, so the same seeds) and fast-forwards past that many items: the records are read
and framed again, shuffled and batched again, but the batches the consumer already has are
**not decoded** (decoding is most of the cost of an epoch), then the epoch continues. Because
every stage is a deterministic function of the record sequence and the seeds, the records that
sat in the shuffle buffer, the prefetch queue or a partly built batch at checkpoint time come
out again exactly where they would have: delivered-before plus delivered-after is exactly one
epoch, in the uninterrupted run's order.

What this restores and what it does not:

- Re-readable sources (files, gzip/zstd files, HTTP, S3, bytes): everything; the resumed epoch
  is identical to the uninterrupted one. Cost: reading and framing the epoch up to the
  checkpoint again (compressed sources are decompressed again), without decoding the skipped
  batches. Measured figures: README, "Resuming mid-epoch".
- A :class:`~streamio.PipeChannel` (SageMaker Pipe mode): a restarted job gets fresh FIFOs that
  start over; the resumed epoch keeps its number from the state (so the same shuffle seeds) and
  skips, by framing only, the records already delivered in that epoch. This is exact when the
  new job's channel replays the same bytes as the interrupted epoch (SageMaker does, for the
  same S3 prefix). The FIFO numbering of the new job is its own (it starts at ``_0``).
- A single non-re-readable stream (stdin, a plain FIFO, a file object): resumes only if the
  writer sends the same bytes again from the start of the epoch; streamio cannot check that,
  and different bytes give a different (still well-formed) epoch.
- Not restored: nothing of the process (threads, open sockets, decoder caches); they are
  rebuilt. The state does not hold records or buffer contents, so it stays a few hundred bytes
  whatever ``buffer_size`` is.

Stages: resume asks each stage (:class:`streamio.pipeline.stages.Stage`), never its name. A
stage takes part if it says how it orders items with ``resume_order``: ``"preserve"``
(deterministic, order-preserving), ``"reorder"`` (a deterministic function of its input
sequence and the seeds) or ``"batch"``. A stage without one makes resume raise
:class:`~streamio.UsageError` rather than resume inexactly. Where the skipped items cannot stay
undecoded (a stage after ``batch()`` whose ``reads_values`` is true: a ``map`` or ``filter``,
or a batch ``shuffle`` with ``buffer_bytes``, whose order depends on the decoded sizes),
fast-forward decodes them too: still exact, only slower; so does one whose ``item_flow`` is
unknown (None). Otherwise the skipped batches are dropped before the decoder (every stage after
``batch()`` passes items through: ``"same"``) or travel undecoded through the reordering
(``"reorder"``) and offsetting (``"offset"``, ``leading_skip`` items dropped from the front)
stages.

A state is input (a checkpoint file, a DataLoader's state dict): every field is checked before it
is used (:func:`check_fields`: types and ranges; :func:`check_state`: against the pipeline), and a
state that does not fit is a :class:`~streamio.UsageError` naming the field. ``seeds`` must be
``None`` exactly where a stage has no seed and equal every seed the pipeline was given
explicitly; a seed the pipeline drew itself (``seed=None``) comes from the state, bound to the
chain by ``check``, so a changed seed cannot pass for the epoch that was interrupted. A
``delivered`` count beyond the end of the epoch is an error when the replay gets there.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ..errors import StreamioWarning, UsageError, UsageTypeError
from .stages import close_blocks, describe_stage

__all__ = ["STATE_VERSION", "FastForward", "check_fields", "check_state", "describe_chain",
           "plan_fast_forward", "skip_delivered"]

STATE_VERSION = 1
_KEY = "streamio_resume"
_FIELDS = (_KEY, "epoch", "delivered", "finished", "seeds", "chain", "check")
#: Epochs and item counts beyond this are not a real run's (and would overflow int64 counters).
_MAX_COUNT = 2 ** 63 - 1


def _source_key(source: Any) -> str:
    from ..sources import PipeChannel, source_name

    if isinstance(source, PipeChannel):
        # Its name carries the FIFO number, which a restarted job starts again: not part of
        # what must match.
        return f"PipeChannel({source.path_prefix})"
    return source_name(source)


def _stage_key(stage: Any) -> Optional[dict]:
    """A stage as a dict of its fields, seeds left out (they travel separately)."""
    fields = getattr(stage, "__dataclass_fields__", None)
    if fields is None:
        return None
    out = {"type": getattr(stage, "chain_name", None) or type(stage).__name__}
    for name in fields:
        if name in ("seed", "seed_drawn"):
            continue
        out[name] = _value_key(getattr(stage, name))
    return out


def _value_key(value: Any) -> Any:
    """A field's value as something equal in every process (no ``id()``-bearing repr: a
    ``map`` function must match its twin in the restarted process)."""
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return [_value_key(v) for v in value]
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"{getattr(value, '__module__', '?')}.{name}"
    return type(value).__qualname__


def stage_seeds(stages: tuple) -> list:
    return [getattr(stage, "seed", None) for stage in stages]


def describe_chain(ds: Any) -> str:
    """A digest of what decides an epoch's items: sources, format, reader options, stages (not
    their seeds), shards and the reader's place (rank, worker), but not the epoch number."""
    ctx = ds._context
    description = {
        "sources": [_source_key(ds._all_sources[i]) for i in ds._selection],
        "format": ds._format,
        "options": sorted((k, repr(v)) for k, v in ds._reader_options.items()),
        "decoder": type(ds._decoder).__name__ if ds._decoder is not None else None,
        "stages": [_stage_key(stage) or repr(stage) for stage in ds._stages],
        "round_robin": [list(layer) for layer in ds._round_robin],
        "place": [ctx.rank, ctx.world_size, ctx.worker, ctx.num_workers],
    }
    text = json.dumps(description, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _seeds_check(chain: str, seeds: list) -> str:
    """Binds the seeds to the chain: a seed changed in a state no longer matches."""
    return hashlib.sha256(json.dumps([chain, seeds]).encode()).hexdigest()[:32]


def make_state(ds: Any, epoch: int, delivered: int, finished: bool) -> dict:
    check_stages(ds._stages)  # a state that could not be resumed is refused when taken
    seeds = stage_seeds(ds._stages)
    chain = describe_chain(ds)
    return {_KEY: STATE_VERSION, "epoch": int(epoch), "delivered": int(delivered),
            "finished": bool(finished), "seeds": seeds, "chain": chain,
            "check": _seeds_check(chain, seeds)}


def _count(state: dict, key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        raise UsageError(f"resume state: {key!r} must be an int in [0, 2**63), not"
                         f" {value!r:.80}")
    return value


def check_fields(state: Any) -> dict:
    """``state``'s fields checked on their own (types and ranges), before anything uses them:
    a :class:`~streamio.UsageError` names the field that is wrong."""
    if not isinstance(state, dict):
        raise UsageTypeError(f"a resume state is a dict (from state_dict()), not"
                             f" {type(state).__name__}")
    version = state.get(_KEY)
    if isinstance(version, bool) or version != STATE_VERSION:
        raise UsageError(f"not a streamio resume state: {_KEY!r} must be {STATE_VERSION}, not"
                         f" {version!r:.80} (keys {sorted(map(str, state))[:8]})")
    unknown = sorted(str(key) for key in state if key not in _FIELDS)
    if unknown:
        raise UsageError(f"resume state: unknown field(s) {unknown[:8]} (fields:"
                         f" {', '.join(_FIELDS)})")
    _count(state, "epoch")
    _count(state, "delivered")
    if not isinstance(state.get("finished"), bool):
        raise UsageError(f"resume state: 'finished' must be true or false, not"
                         f" {state.get('finished')!r:.80}")
    seeds = state.get("seeds")
    if not isinstance(seeds, list) or not all(
            seed is None or (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0)
            for seed in seeds):
        raise UsageError(f"resume state: 'seeds' must be a list of ints >= 0 and nulls, not"
                         f" {seeds!r:.80}")
    for key in ("chain", "check"):
        value = state.get(key)
        if (key in state or key == "chain") and not (
                isinstance(value, str) and len(value) == 32
                and all(c in "0123456789abcdef" for c in value)):
            raise UsageError(f"resume state: {key!r} must be a digest of 32 hex digits, not"
                             f" {value!r:.80}")
    return state


def check_state(ds: Any, state: Any) -> dict:
    """``state`` checked against ``ds``; UsageError says what does not match."""
    check_fields(state)
    check_stages(ds._stages)
    pinned = ds._context.epoch
    if pinned is not None and state["epoch"] != pinned:
        raise UsageError(f"resume state: 'epoch' is {state['epoch']}, but this Dataset is pinned"
                         f" to epoch {pinned} (with_context)")
    seeds = state["seeds"]
    if len(seeds) != len(ds._stages):
        raise UsageError("resume state: 'seeds' has one entry per stage: the pipeline has"
                         f" {len(ds._stages)} stage(s), the state {len(seeds)}")
    for position, (stage, seed) in enumerate(zip(ds._stages, seeds)):
        _check_stage_seed(stage, seed, position)
    chain = describe_chain(with_seeds(ds, seeds))
    if state["chain"] != chain:
        raise UsageError("resume state: 'chain' says it was taken from a different pipeline"
                         " (other sources, format, options, stages, shard or worker/rank);"
                         " rebuild the Dataset as it was when the state was taken")
    if "check" not in state:
        warnings.warn("resume state without 'check' (from an older streamio): its seeds cannot"
                      " be verified", StreamioWarning, stacklevel=3)
    elif state["check"] != _seeds_check(chain, seeds):
        raise UsageError("resume state: its 'seeds' do not match its 'check': the state was"
                         " changed after it was taken, and would replay a different epoch")
    return state


def _check_stage_seed(stage: Any, seed: Any, position: int) -> None:
    """A stage's seed in a state: None where the stage has none, the stage's own where it was
    given one, any seed where the stage drew its own (the state's is the epoch's)."""
    own = getattr(stage, "seed", None)
    if (own is None) != (seed is None):
        raise UsageError(f"resume state: 'seeds'[{position}] is {seed!r:.40} but"
                         f" {describe_stage(stage)} {'has no' if own is None else 'has a'} seed")
    if own is not None and not getattr(stage, "seed_drawn", False) and seed != own:
        raise UsageError(f"resume state: 'seeds'[{position}] is {seed}, but"
                         f" {describe_stage(stage)} was given seed={own}: the state is another"
                         " pipeline's")


def with_seeds(ds: Any, seeds: list) -> Any:
    """``ds`` with the stages' seeds from a state: a Dataset built with ``seed=None`` in a new
    process draws new seeds, and the state's are the ones the epoch was shuffled with."""
    if seeds == stage_seeds(ds._stages):
        return ds
    import dataclasses

    stages = []
    for stage, seed in zip(ds._stages, seeds):
        if seed is not None and getattr(stage, "seed", None) is not None:
            stage = dataclasses.replace(stage, seed=int(seed))
        stages.append(stage)
    return ds._derive(_stages=tuple(stages))


def stage_order(stage: Any) -> Optional[str]:
    """How the stage says a replay goes through it (``Stage.resume_order``)."""
    order = getattr(stage, "resume_order", None)
    return order if order in ("preserve", "reorder", "batch") else None


def check_stages(stages: tuple) -> None:
    for stage in stages:
        if stage_order(stage) is None:
            raise UsageError(f"cannot resume mid-epoch through {describe_stage(stage)}: this stage"
                             " does not say that its output is a deterministic function of its"
                             " input, so a replayed epoch could differ from the original")


# -- the fast-forward plan ------------------------------------------------------------------------
@dataclass(frozen=True)
class FastForward:
    """How an epoch skips the ``count`` items its consumer already has.

    ``mode``:
    - ``"end"``: drop them at the end of the chain; used without a decoder, or when the skipped
      batches must be decoded anyway (a stage after ``batch()`` looks at decoded values);
    - ``"before_decode"``: drop the first ``count`` batches between ``batch()`` and the
      decoder, so they are never decoded (only stages that keep order and count follow);
    - ``"lazy"``: batches leave the decode stage undecoded (:class:`_Lazy`) and travel through
      the batch shuffles; right after stage ``position`` the ones the consumer already has
      (``keep`` onwards, ``count`` of them: a later ``skip()`` hides the first ``keep``) become
      placeholders and the others are decoded; the placeholders are dropped at the end.
    """

    mode: str
    position: int
    count: int
    keep: int = 0


def plan_fast_forward(stages: tuple, has_decoder: bool, n: int) -> FastForward:
    check_stages(stages)
    last = len(stages) - 1
    batch_at = next((i for i, s in enumerate(stages) if stage_order(s) == "batch"), None)
    if not has_decoder or batch_at is None:
        return FastForward("end", last, n)
    after = stages[batch_at + 1:]
    flows = [s.item_flow for s in after]
    if any(s.reads_values for s in after) or None in flows:
        return FastForward("end", last, n)  # the skipped batches are decoded on the way
    if all(flow == "same" for flow in flows):
        return FastForward("before_decode", batch_at, n)
    reorders = [batch_at + 1 + i for i, flow in enumerate(flows) if flow == "reorder"]
    at = reorders[-1] if reorders else batch_at
    # Between that point and the consumer only skip/take/prefetch: consumer item j is item
    # j + (the skips' sum) there, whatever the takes cut off later.
    keep = sum(s.leading_skip for s in stages[at + 1:])
    return FastForward("lazy", at, n, keep)


def skip_delivered(blocks: Iterator[tuple], n: int,
                   skip: Callable[[Iterator[tuple], int], Iterator[tuple]]) -> Iterator[tuple]:
    """``skip(blocks, n)`` (drop the ``n`` items the consumer already has), and a
    :class:`~streamio.UsageError` if the epoch ends before ``n`` items went by: a state whose
    ``delivered`` is beyond this epoch."""
    seen = 0

    def counted() -> Iterator[tuple]:
        nonlocal seen
        try:
            for block in blocks:
                seen += len(block[0])
                yield block
        finally:
            close_blocks(blocks)

    yield from skip(counted(), n)
    if seen < n:
        raise UsageError(f"resume state: 'delivered' is {n}, but the epoch holds only {seen}"
                         " items: the state is not this pipeline's (or its data changed)")


def drop_batches(blocks: Iterator[tuple], n: int) -> Iterator[tuple]:
    """Drop the first ``n`` batches of ``(batches, ids)`` blocks before they are decoded
    (``ids`` runs over the records of all the block's batches)."""
    remaining = n
    try:
        for batches, ids in blocks:
            if remaining:
                if len(batches) <= remaining:
                    remaining -= len(batches)
                    continue
                if ids is not None:
                    ids = ids[sum(len(b) for b in batches[:remaining]):]
                batches = batches[remaining:]
                remaining = 0
            yield batches, ids
    finally:
        close_blocks(blocks)


class _Lazy:
    """A batch not decoded yet: its records and their origins."""

    __slots__ = ("records", "ids")

    def __init__(self, records: list, ids: Any) -> None:
        self.records = records
        self.ids = ids


def defer_decode(blocks: Iterator[tuple]) -> Iterator[tuple]:
    """Stand-in for the decode stage: each batch becomes a :class:`_Lazy`."""
    try:
        for batches, ids in blocks:
            out = []
            start = 0
            for records in batches:
                stop = start + len(records)
                out.append(_Lazy(records, None if ids is None else ids[start:stop]))
                start = stop
            yield out, None
    finally:
        close_blocks(blocks)


#: Stands for a batch the consumer already has: never decoded, dropped at the chain's end.
SKIPPED = object()


def mark_and_decode(blocks: Iterator[tuple], keep: int, count: int, decode: Any
                    ) -> Iterator[tuple]:
    """Items ``keep`` to ``keep + count`` become :data:`SKIPPED`; the others are decoded with
    ``decode(records, ids)``. A batch that fails is raised after the ones before it."""
    index = 0
    start, stop = keep, keep + count
    try:
        for items, _ in blocks:
            out = []
            try:
                for lazy in items:
                    if start <= index < stop:
                        out.append(SKIPPED)
                    else:
                        out.append(decode(lazy.records, lazy.ids))
                    index += 1
            except BaseException:
                if out:
                    yield out, None
                raise
            yield out, None
    finally:
        close_blocks(blocks)

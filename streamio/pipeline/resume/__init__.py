"""Exact mid-epoch resume by replay.

A checkpoint of an epoch is a small JSON-serialisable state (:func:`make_state`)::

    {"streamio_resume": 2, "epoch": 3, "delivered": 1200, "finished": false,
     "seeds": [7, 11], "chain": "<sha256 of the pipeline's description>",
     "shards": [[4, 1]], "place": [0, 1, 1, 2],
     "check": "<sha256 of every other field>-<4 hex digits per field>"}

``delivered`` counts the items (records, or batches after ``batch()``) the consumer took;
``shards`` (the ``shard(n, i)`` calls) and ``place`` (rank, world size, worker, workers), where
the reader sat, from which an elastic resume (:mod:`streamio.pipeline.resume.elastic`) rebuilds plans.

Resuming (:meth:`Dataset.iter_from`) rebuilds the same epoch (same number, so the same seeds) and
fast-forwards past ``delivered`` items: read, framed, shuffled and batched again but, where the
stages allow, **not decoded** (:func:`plan_fast_forward`). Every stage being a deterministic
function of the record sequence and the seeds, what sat in a shuffle buffer, a prefetch queue or
a half-built batch comes out again where it would have: delivered-before plus delivered-after is
exactly one epoch, in the uninterrupted order, wherever the sources give the same bytes again
(docs/resume.md, "What is and is not restored"). The state holds no records and nothing of the
process, so it stays a few hundred bytes. Stages are asked, never matched by name: one takes
part by its ``resume_order`` (``"preserve"``, ``"reorder"``, ``"batch"``); a stage without one
makes resume raise :class:`~streamio.UsageError` rather than resume inexactly.

A state is input: every field is checked before it is used (:func:`check_fields`: types and sizes
first, bounded whatever the object, then ``check``; :func:`check_state`: against the pipeline),
and one that does not fit is a :class:`~streamio.UsageError` naming the field. ``check`` is an
unkeyed digest of every other field (:func:`seal`): it catches accidents (an edited, truncated
or foreign checkpoint), not someone who can write the checkpoint (docs/security.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from ...errors import UsageError, UsageTypeError
from ..stages import close_blocks, describe_stage

__all__ = ["STATE_VERSION", "Deal", "FastForward", "Selection", "SkipFirst", "check_fields",
           "check_state", "describe_chain", "plan_fast_forward", "seal", "select_batches",
           "select_items"]

STATE_VERSION = 2
_KEY = "streamio_resume"
_FIELDS = (_KEY, "epoch", "delivered", "finished", "seeds", "chain", "check", "shards", "place",
           "stream", "elastic")
#: The fields ``check`` covers (every field but itself), each with a digest of its own.
_COVERED = tuple(f for f in _FIELDS if f != "check")
#: The most stages (so seeds) a state may name.
_MAX_STAGES = 4096
#: An elastic state holds the states it resumed from; bounds on what a state may hold.
_MAX_NESTING = 4
_MAX_SHARDS = 65536
_MAX_LAYERS = 16
#: Epochs and item counts beyond this are not a real run's (and would overflow int64 counters).
_MAX_COUNT = 2 ** 63 - 1
#: A state's seeds are ints >= 0 of at most 1024 bits (a bound on the work of reading one).
_MAX_SEED = 2 ** 1024 - 1


def _source_key(source: Any) -> str:
    from ...sources import PipeChannel, source_name

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
    dealt = stream_share(ds)
    if dealt is not None:
        description["stream"] = dealt
    text = json.dumps(description, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def stream_share(ds: Any) -> Optional[list]:
    """``[readers, index]``: the share of a stream dealt to several readers that ``ds``
    reads (its feed's ``dealt``: :mod:`streamio.pipeline.dealing`), or None."""
    dealt = getattr(ds._feed, "dealt", None)
    return None if dealt is None else [int(dealt[0]), int(dealt[1])]


def make_state(ds: Any, epoch: int, delivered: int, finished: bool,
               elastic: Optional[dict] = None) -> dict:
    """The state of ``ds``'s epoch ``epoch`` once ``delivered`` items went out. ``shards`` and
    ``place`` say where the reader sat in a sharded run (what an elastic resume rebuilds it
    from); ``elastic``, in an epoch resumed on another layout: the states it resumed from and
    this shard's ``deal`` (see :mod:`streamio.pipeline.resume.elastic`)."""
    check_stages(ds._stages)  # a state that could not be resumed is refused when taken
    seeds = stage_seeds(ds._stages)
    chain = describe_chain(ds)
    ctx = ds._context
    state = {_KEY: STATE_VERSION, "epoch": int(epoch), "delivered": int(delivered),
             "finished": bool(finished), "seeds": seeds, "chain": chain,
             "shards": [list(layer) for layer in ds._shard_layers],
             "place": [ctx.rank, ctx.world_size, ctx.worker, ctx.num_workers]}
    dealt = stream_share(ds)
    if dealt is not None:
        state["stream"] = dealt
    if elastic is not None:
        state["elastic"] = elastic
    return seal(state)


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _digests(state: dict) -> str:
    """``check`` for ``state``: a SHA-256 of every covered field (canonical JSON, 128 bits
    kept), then, after a ``-``, 4 hex digits per field present, in :data:`_COVERED`'s order (its
    name and value: a value moved to another field does not match), which name the fields an
    edit changed."""
    fields = {key: state[key] for key in _COVERED if key in state}
    each = "".join(_digest([key, value])[:4] for key, value in fields.items())
    return f"{_digest(fields)[:32]}-{each}"


def seal(state: dict) -> dict:
    """``state`` with its ``check`` (re)computed over its other fields: what :func:`make_state`
    does. Unkeyed (anyone can call it): ``check`` catches accidents, not forgery."""
    state = {key: value for key, value in state.items() if key != "check"}
    state["check"] = _digests(state)
    return state


def _check_integrity(state: dict) -> None:
    """``state``'s fields against its ``check``; a UsageError names the fields that changed."""
    check = state.get("check")
    if not (isinstance(check, str) and len(check) <= 33 + 4 * len(_COVERED)):
        raise UsageError(f"resume state: 'check' must be the digest make_state() wrote, not"
                         f" {_brief(check)}")
    want = _digests(state)
    if check == want:
        return
    present = [key for key in _COVERED if key in state]
    mine, theirs = want.partition("-")[2], check.partition("-")[2]
    if len(theirs) == len(mine):
        changed = [key for k, key in enumerate(present)
                   if mine[4 * k:4 * k + 4] != theirs[4 * k:4 * k + 4]]
        if changed:
            raise UsageError(f"resume state: field(s) {changed} do not match the state's"
                             " 'check': the state was changed after it was taken (or is"
                             " damaged); it would skip or repeat records. Use the state as"
                             " state_dict() wrote it")
    raise UsageError(f"resume state: its 'check' does not match its fields (it covers"
                     f" {', '.join(_COVERED)}; this state has {', '.join(present)}): the"
                     " state was changed after it was taken (a field added or removed?)")


def _brief(value: Any, depth: int = 0) -> str:
    """``value`` for an error message, in bounded time and space whatever it is (a state may be
    a Python object of any depth or size: its repr is not taken)."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 128 else f"<an int of {value.bit_length()} bits>"
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, (list, tuple, dict)):
        if depth >= 2 or len(value) > 6:
            return f"<a {type(value).__name__} of {len(value)} items>"
        if isinstance(value, dict):
            inner = ", ".join(f"{_brief(k, depth + 1)}: {_brief(v, depth + 1)}"
                              for k, v in value.items())
            return "{" + inner + "}"
        inner = ", ".join(_brief(v, depth + 1) for v in value)
        return f"[{inner}]"
    return f"<a {type(value).__name__}>"


def _int_list(value: Any, length: Optional[int] = None) -> bool:
    return isinstance(value, list) and (length is None or len(value) == length) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_COUNT for v in value)


def _check_layout(state: dict) -> None:
    """``shards`` and ``place`` (optional: states from before elastic resume lack them)."""
    if "shards" in state:
        shards = state["shards"]
        if not (isinstance(shards, list) and len(shards) <= _MAX_LAYERS and all(
                _int_list(layer, 2) and 2 <= layer[0] <= _MAX_SHARDS and layer[1] < layer[0]
                for layer in shards)):
            raise UsageError(f"resume state: 'shards' must be a list of at most {_MAX_LAYERS}"
                             f" [num_shards, index] pairs (2 <= num_shards <= {_MAX_SHARDS},"
                             f" index < num_shards), not {_brief(shards)}")
    if "stream" in state:
        stream = state["stream"]
        if not (_int_list(stream, 2) and 2 <= stream[0] <= _MAX_SHARDS and stream[1] < stream[0]):
            raise UsageError(f"resume state: 'stream' must be [readers, index] with 2 <= readers"
                             f" <= {_MAX_SHARDS} and index < readers, not {_brief(stream)}")
    if "place" in state:
        place = state["place"]
        if not (_int_list(place, 4) and place[0] < place[1] <= _MAX_SHARDS
                and place[2] < place[3] <= _MAX_SHARDS):
            raise UsageError("resume state: 'place' must be [rank, world_size, worker,"
                             f" num_workers] with rank < world_size and worker < num_workers,"
                             f" not {_brief(place)}")


def _check_elastic(state: dict, depth: int) -> None:
    if "elastic" not in state:
        return
    elastic = state["elastic"]
    if not isinstance(elastic, dict) or len(elastic) != 2 or sorted(map(str, elastic)) != [
            "deal", "from"]:
        raise UsageError("resume state: 'elastic' must be {\"from\": [states], \"deal\": [m, j]},"
                         f" not {_brief(elastic)}")
    deal = elastic["deal"]
    if not (_int_list(deal, 2) and 1 <= deal[0] <= _MAX_SHARDS and deal[1] < deal[0]):
        raise UsageError(f"resume state: 'elastic' 'deal' must be [num_shards, index] with"
                         f" index < num_shards, not {_brief(deal)}")
    old = elastic["from"]
    if not isinstance(old, list) or not 1 <= len(old) <= _MAX_SHARDS:
        raise UsageError(f"resume state: 'elastic' 'from' must be a list of 1 to {_MAX_SHARDS}"
                         f" resume states, not {_brief(old)}")
    if depth >= _MAX_NESTING:
        raise UsageError(f"resume state: elastic resumes nested more than {_MAX_NESTING} deep")
    for k, inner in enumerate(old):
        try:
            check_fields(inner, _depth=depth + 1)
        except UsageError as exc:
            raise UsageError(f"resume state: 'elastic' 'from'[{k}]: {exc}") from None


def _count(state: dict, key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        raise UsageError(f"resume state: {key!r} must be an int in [0, 2**63), not"
                         f" {_brief(value)}")
    return value


def _check_seeds(state: dict) -> None:
    seeds = state.get("seeds")
    if not (isinstance(seeds, list) and len(seeds) <= _MAX_STAGES) or not all(
            seed is None or (isinstance(seed, int) and not isinstance(seed, bool)
                             and 0 <= seed <= _MAX_SEED)
            for seed in seeds):
        raise UsageError(f"resume state: 'seeds' must be a list of at most {_MAX_STAGES} ints"
                         f" >= 0 (at most 1024 bits) and nulls, not {_brief(seeds)}")


def check_fields(state: Any, _depth: int = 0) -> dict:
    """``state``'s fields checked on their own (types and sizes, then ``check``), before
    anything uses them: a :class:`~streamio.UsageError` names the field that is wrong. Bounded
    time and memory whatever ``state`` is (no repr of what it holds). A state of version 1
    (whose ``check`` covered the seeds only) is refused with an error that says so."""
    if not isinstance(state, dict):
        raise UsageTypeError(f"a resume state is a dict (from state_dict()), not"
                             f" {type(state).__name__}")
    version = state.get(_KEY)
    if version == 1 and not isinstance(version, bool):
        raise UsageError(f"resume state of version 1 ({_KEY!r}: 1, written by a streamio before"
                         " 'check'"
                         " covered every field): not accepted, since its 'delivered', 'finished',"
                         " 'epoch', 'shards' and 'place' cannot be verified. Resume it with the"
                         " streamio that wrote it, or start the epoch again")
    if isinstance(version, bool) or version != STATE_VERSION:
        keys = sorted(_brief(key) for key in list(state)[:8])
        raise UsageError(f"not a streamio resume state: {_KEY!r} must be {STATE_VERSION}, not"
                         f" {_brief(version)} (keys {keys})")
    unknown = [key for key in state if key not in _FIELDS]
    if unknown:
        raise UsageError(f"resume state: unknown field(s) {[_brief(k) for k in unknown[:8]]}"
                         f" (fields: {', '.join(_FIELDS)})")
    _count(state, "epoch")
    _count(state, "delivered")
    if not isinstance(state.get("finished"), bool):
        raise UsageError(f"resume state: 'finished' must be true or false, not"
                         f" {_brief(state.get('finished'))}")
    _check_seeds(state)
    value = state.get("chain")
    if not (isinstance(value, str) and len(value) == 32
            and all(c in "0123456789abcdef" for c in value)):
        raise UsageError(f"resume state: 'chain' must be a digest of 32 hex digits, not"
                         f" {_brief(value)}")
    _check_layout(state)
    _check_elastic(state, _depth)
    _check_integrity(state)
    return state


def check_state(ds: Any, state: Any) -> dict:
    """``state`` checked against ``ds``; UsageError says what does not match. ``seeds`` must be
    None exactly where a stage has no seed and equal every seed the pipeline was given; a seed
    the pipeline drew itself (``seed=None``) comes from the state. A ``delivered`` count beyond
    the end of the epoch is found when the replay gets there (:func:`select_items`)."""
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
    for key, mine in (("shards", [list(layer) for layer in ds._shard_layers]),
                      ("place", [ds._context.rank, ds._context.world_size, ds._context.worker,
                                 ds._context.num_workers]),
                      ("stream", stream_share(ds))):
        if (key in state or mine is None) and state.get(key) != mine:
            raise UsageError(f"resume state: {key!r} is {_brief(state.get(key))}, this Dataset's is"
                             f" {mine}:"
                             " the state is another shard's (give the list of every shard's"
                             " states to resume on another layout)")
    chain = describe_chain(with_seeds(ds, seeds))
    if state["chain"] != chain:
        raise UsageError("resume state: 'chain' says it was taken from a different pipeline"
                         " (other sources, format, options, stages, shard or worker/rank);"
                         " rebuild the Dataset as it was when the state was taken")
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
class SkipFirst:
    """Of the items that reach it, drop the first ``n`` (the ones the consumer already has)."""

    __slots__ = ("n", "seen")

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0

    def keep(self, count: int) -> slice:
        start = min(count, max(0, self.n - self.seen))
        self.seen += count
        return slice(start, None)


class Deal:
    """Of the items that reach it (numbered ``k`` from 0 over an old shard's remainder), keep
    those with ``(k + offset) % m == j``: new shard ``j`` of ``m``'s share (elastic resume)."""

    __slots__ = ("m", "j", "offset", "seen")

    def __init__(self, m: int, j: int, offset: int) -> None:
        self.m, self.j, self.offset = m, j, offset
        self.seen = 0

    def keep(self, count: int) -> Any:
        first = (self.j - self.offset - self.seen) % self.m
        self.seen += count
        return slice(first, None, self.m)


class Selection:
    """Which items of an epoch a resumed run delivers, by their position at the point where the
    fast-forward applies: the filters in turn, each over the items the ones before it kept. A
    plain resume is ``[SkipFirst(delivered)]``; an elastic one adds :class:`Deal` and more
    :class:`SkipFirst` filters, some shared by several runs (:mod:`streamio.pipeline.resume.elastic`)."""

    __slots__ = ("filters",)

    def __init__(self, filters: list) -> None:
        self.filters = filters

    def pick(self, count: int) -> Any:
        """The positions to keep of the next ``count`` items: a slice, or an int array."""
        if len(self.filters) == 1:
            return self.filters[0].keep(count)
        index = np.arange(count)
        for f in self.filters:
            index = index[f.keep(len(index))]
        return index


def _take(items: list, ids: Any, chosen: Any) -> tuple:
    if isinstance(chosen, slice):
        return items[chosen], (None if ids is None else ids[chosen])
    return [items[i] for i in chosen], (None if ids is None else ids[chosen])


@dataclass(frozen=True)
class FastForward:
    """How a resumed epoch skips the items its consumer already has.

    ``count``: the items the consumer has (the state's ``delivered``); ``selection``: which
    items the run delivers (:class:`Selection`; None: all but the first ``count``).
    ``mode``:
    - ``"end"``: select at the end of the chain; used without a decoder, or when the skipped
      batches must be decoded anyway (a stage after ``batch()`` looks at decoded values);
    - ``"before_decode"``: select batches between ``batch()`` and the decoder, so the others
      are never decoded (only stages that keep order and count follow);
    - ``"lazy"``: batches leave the decode stage undecoded (:class:`_Lazy`) and travel through
      the batch shuffles; right after stage ``position`` the items from ``keep`` on (a later
      ``skip()`` hides the first ``keep``) that the run does not deliver become placeholders
      and the others are decoded; the placeholders are dropped at the end.
    """

    mode: str
    position: int
    count: int
    keep: int = 0
    selection: Optional[Selection] = None

    def chosen(self) -> Selection:
        return self.selection if self.selection is not None else Selection([SkipFirst(self.count)])


def plan_fast_forward(stages: tuple, has_decoder: bool, n: int,
                      selection: Optional[Selection] = None) -> FastForward:
    """How a resumed epoch skips its first ``n`` items (``selection``: the items it delivers
    instead, for an elastic resume), from what its stages say of themselves. The skipped
    batches are decoded on the way (``"end"``: still exact, only slower) where a stage after
    ``batch()`` reads decoded values (``reads_values``: a ``map`` or ``filter``, a batch
    ``shuffle`` with ``buffer_bytes``, whose order depends on the decoded sizes) or has an
    unknown ``item_flow`` (None). Otherwise they are dropped before the decoder when every stage
    after ``batch()`` passes items through (``"same"``: ``"before_decode"``), or travel undecoded
    through the reordering (``"reorder"``) and offsetting (``"offset"``: ``leading_skip`` items
    dropped from the front) stages (``"lazy"``)."""
    check_stages(stages)
    last = len(stages) - 1
    batch_at = next((i for i, s in enumerate(stages) if stage_order(s) == "batch"), None)
    if not has_decoder or batch_at is None:
        return FastForward("end", last, n, 0, selection)
    after = stages[batch_at + 1:]
    flows = [s.item_flow for s in after]
    if any(s.reads_values for s in after) or None in flows:
        return FastForward("end", last, n, 0, selection)  # skipped batches decoded on the way
    if all(flow == "same" for flow in flows):
        return FastForward("before_decode", batch_at, n, 0, selection)
    reorders = [batch_at + 1 + i for i, flow in enumerate(flows) if flow == "reorder"]
    at = reorders[-1] if reorders else batch_at
    # Between that point and the consumer only skip/take/prefetch: consumer item j is item
    # j + (the skips' sum) there, whatever the takes cut off later.
    keep = sum(s.leading_skip for s in stages[at + 1:])
    return FastForward("lazy", at, n, keep, selection)


def _beyond(n: int, seen: int) -> UsageError:
    return UsageError(f"resume state: 'delivered' is {n}, but the epoch holds only {seen}"
                      " items: the state is not this pipeline's (or its data changed)")


def select_items(blocks: Iterator[tuple], ff: FastForward) -> Iterator[tuple]:
    """The items the resumed run delivers (``ff``'s selection, at the end of the chain), and a
    :class:`~streamio.UsageError` if the epoch ends before ``ff.count`` items went by: a state
    whose ``delivered`` is beyond this epoch."""
    selection = ff.chosen()
    seen = 0
    try:
        for items, ids in blocks:
            seen += len(items)
            items, ids = _take(items, ids, selection.pick(len(items)))
            if items:
                yield items, ids
    finally:
        close_blocks(blocks)
    if seen < ff.count:
        raise _beyond(ff.count, seen)


def select_batches(blocks: Iterator[tuple], ff: FastForward) -> Iterator[tuple]:
    """:func:`select_items` over ``(batches, ids)`` blocks before they are decoded (``ids`` runs
    over the records of all the block's batches): the others are never decoded."""
    selection = ff.chosen()
    seen = 0
    try:
        for batches, ids in blocks:
            seen += len(batches)
            chosen = selection.pick(len(batches))
            kept, _ = _take(batches, None, chosen)
            if ids is not None and len(kept) != len(batches):
                ends = np.cumsum([len(b) for b in batches])
                starts = ends - np.asarray([len(b) for b in batches])
                picked = range(len(batches))[chosen] if isinstance(chosen, slice) else chosen
                parts = [ids[starts[i]:ends[i]] for i in picked]
                ids = np.concatenate(parts) if parts else ids[:0]
            if kept:
                yield kept, ids
    finally:
        close_blocks(blocks)
    if seen < ff.count:
        raise _beyond(ff.count, seen)


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


def mark_and_decode(blocks: Iterator[tuple], ff: FastForward, decode: Any) -> Iterator[tuple]:
    """Items from ``ff.keep`` on that the selection does not deliver become :data:`SKIPPED`;
    the others are decoded with ``decode(records, ids)``. A batch that fails is raised after the
    ones before it."""
    selection = ff.chosen()
    index = 0
    try:
        for items, _ in blocks:
            lead = min(len(items), max(0, ff.keep - index))
            index += len(items)
            chosen = selection.pick(len(items) - lead)
            wanted = set(range(len(items) - lead)[chosen]) if isinstance(chosen, slice) \
                else set(chosen.tolist())
            out = []
            try:
                for k, lazy in enumerate(items):
                    if k < lead or k - lead in wanted:
                        out.append(decode(lazy.records, lazy.ids))
                    else:
                        out.append(SKIPPED)
            except BaseException:
                if out:
                    yield out, None
                raise
            yield out, None
    finally:
        close_blocks(blocks)


def drop_skipped(blocks: Iterator[tuple], ff: FastForward) -> Iterator[tuple]:
    """The end of a ``"lazy"`` fast-forward: the placeholders go; the epoch must have held
    ``ff.count`` items."""
    seen = 0
    try:
        for items, ids in blocks:
            seen += len(items)
            kept = [item for item in items if item is not SKIPPED]
            if kept:
                yield kept, (ids if len(kept) == len(items) else None)
    finally:
        close_blocks(blocks)
    if seen < ff.count:
        raise _beyond(ff.count, seen)

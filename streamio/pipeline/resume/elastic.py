"""Elastic resume: finishing an interrupted epoch on a different number of shards.

A sharded run (``ds.shard(n, i)``, or ``to_torch`` over ranks x DataLoader workers) checkpoints
one state per shard. :meth:`Dataset.iter_from` given the **list** of those states, on a Dataset
sharded differently (``ds.shard(m, j)``; ``m == 1``: unsharded), gives shard ``j`` its share of
everything the old shards had not delivered: the ``m`` new shards together deliver each
remaining record exactly once, and with the old deliveries every record of the epoch exactly
once. With the same layout (``m == n``) shard ``j`` resumes from its own state, as
:meth:`~Dataset.iter_from` always did: identical to the uninterrupted epoch.

How, with states that stay small (a count, the seeds, ``shards`` and ``place``): each new shard
**replays** every old shard's epoch as a same-layout resume does (the old plan rebuilt from the
unsharded Dataset and the state's ``shards`` and ``place``, checked against its chain digest;
the same seeds, so the same order), skips the ``delivered`` items, and keeps item ``k`` of old
shard ``i``'s remainder when ``(k + i) % m == j``: what sat in buffers and half-built batches
comes out where the uninterrupted epoch had it. The remainder's items are what the old pipeline
makes (batches of the old batching); the epochs after it run on the new layout.

Cost: every new shard reads and frames every old shard's whole epoch (``m`` times the epoch's
bytes in all), but decodes only its share of the remainder wherever a same-layout resume skips
undecoded (:func:`streamio.pipeline.resume.plan_fast_forward`). Measured: ``streamio bench
--workloads elastic``.

An epoch resumed this way has its own state: the old states under ``elastic`` with this shard's
``deal``, and a count; it resumes again on the same layout or elastically on another (nested up
to :data:`~streamio.pipeline.resume._MAX_NESTING` deep; the old states' sizes plus ~200 bytes).
A stream that can be read only once (a FIFO, a ``PipeChannel``), alone or dealt to several
readers, is replayed from **one read** (:func:`_start_one_read`).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ...errors import UsageError
from .. import resume as _resume
from ..dealing import Demux, cut_blocks
from ..epoch import EpochRun
from . import Deal, Selection, SkipFirst
from ..stages import close_blocks
from ..stats import EpochStats

__all__ = ["check_states", "iter_from_states", "resume_elastic_state"]


def _layers(state: dict, where: str) -> list:
    """The state's shard layers, its share of a dealt stream last (``stream``)."""
    if "shards" not in state or "place" not in state:
        raise UsageError(f"resume state {where}: it has no 'shards'/'place' (taken by a streamio"
                         " before elastic resume): it resumes only on the layout it was taken on")
    layers = [tuple(layer) for layer in state["shards"]]
    if "stream" in state:
        layers.append(tuple(state["stream"]))
    return layers


def _ds_layers(ds: Any) -> list:
    """``ds``'s shard layers, its share of a dealt stream last."""
    layers = [tuple(layer) for layer in ds._shard_layers]
    share = _resume.stream_share(ds)
    if share is not None:
        layers.append(tuple(share))
    return layers


def _layout(states: list, where: str) -> tuple:
    """``(universe, ordered states)``: the shard layers all the states share (what the old run
    split) and the states in the order of their shard index. The states must be every shard of
    one split, once each."""
    layers = [_layers(s, f"{where}[{k}]") for k, s in enumerate(states)]
    if len(states) == 1:
        return layers[0], states
    n = len(states)
    prefix = layers[0][:-1]
    lasts = []
    for k, layer in enumerate(layers):
        if not layer or layer[:-1] != prefix or layer[-1][0] != n:
            raise UsageError(
                f"resume states {where}: {n} states must be the {n} shards of one split (each"
                f" taken by shard({n}, i) of the same Dataset); state {k} was taken by"
                f" shard layers {layer}")
        lasts.append(layer[-1][1])
    if sorted(lasts) != list(range(n)):
        missing = sorted(set(range(n)) - set(lasts))
        raise UsageError(f"resume states {where}: every shard's state is needed once: shard(s)"
                         f" {missing} missing, the list holds shards {sorted(lasts)}")
    order = sorted(range(n), key=lambda k: lasts[k])
    return prefix, [states[k] for k in order]


def _deal(universe: list, layers: list) -> Optional[tuple]:
    """``(m, j)``: which share of ``universe`` a Dataset with shard ``layers`` reads, or None
    when it does not read a share of it."""
    if layers == universe:
        return 1, 0
    if layers[:-1] == universe and layers:
        return layers[-1]
    return None


def _read_once(ds: Any) -> bool:
    """Whether ``ds`` reads a stream that can be read only once (a FIFO, a ``PipeChannel``,
    stdin), alone or shared with other readers: the old shards are then replayed together
    from one read of it (:func:`_start_one_read`)."""
    from ...adapters import is_single_stream

    return ds._feed is not None or any(is_single_stream(s) for s in ds._all_sources)


def _dealt(elastic: dict) -> bool:
    """Whether the old readers shared a stream dealt among them (then they are replayed
    together from one read of it, even where it could be read again)."""
    return any("stream" in state or ("elastic" in state and _dealt(state["elastic"]))
               for state in elastic["from"])


def _old_plan(ds: Any, state: dict, where: str, feed: Any = None) -> Any:
    """The Dataset the old shard ran, rebuilt from ``ds`` and the state, and checked against it
    (the state's chain digest); ``feed``: its share of a stream read once."""
    rank, world, worker, workers = state["place"]
    plan = ds._unsharded().with_context(epoch=state["epoch"], rank=rank, world_size=world,
                                        worker=worker, num_workers=workers)
    for n, i in state["shards"]:
        plan = plan.shard(n, i)
    if feed is not None:
        plan = plan.with_feed(feed)
    try:  # before the state's seeds replace the plan's: a seed given explicitly must match
        _resume.check_state(plan, state)
    except UsageError as exc:
        raise UsageError(f"resume state {where}: {exc}") from None
    return _resume.with_seeds(plan, state["seeds"])


class _Leaf:
    """An old reader's replay: its state, and the filters that pick its items (its own
    ``SkipFirst`` first, then the ``Deal`` of the level above)."""

    def __init__(self, state: dict, where: str, filters: list) -> None:
        self.state, self.where, self.filters = state, where, filters
        self.plan: Any = None
        self.share = tuple(state.get("stream", (1, 0)))


class _Merge:
    """An elastic epoch's items: its old shards' items taken in turn, one each (a fixed rule,
    so a state of it resumes), then its own filters."""

    def __init__(self, children: list, filters: list) -> None:
        self.children, self.filters = children, filters


def _tree(ds: Any, state: dict, where: str, extra: list) -> Any:
    """What replays what ``state``'s shard had not delivered (None: nothing), checked, finished
    or not: a :class:`_Leaf` for a plain state, a :class:`_Merge` of its old shards' trees for
    one that was itself an elastic resume. ``extra``: the filters of the level above that
    apply to this shard's items (its ``Deal``)."""
    elastic = state.get("elastic")
    skip = SkipFirst(state["delivered"])  # counted over this shard's whole stream
    if elastic is None:
        if state["finished"]:
            _old_plan(ds, state, where, _Unread(state))  # checked all the same
            return None
        return _Leaf(state, where, [skip] + extra)
    universe, old = _layout(elastic["from"], f"{where}.elastic.from")
    if _deal(universe, _layers(state, where)) != tuple(elastic["deal"]):
        raise UsageError(f"resume state {where}: its 'elastic' 'deal' {elastic['deal']} does not"
                         f" fit its shards {_layers(state, where)}")
    m, j = elastic["deal"]
    children = [_tree(ds, inner, f"{where}.elastic.from[{s}]", [Deal(m, j, s)])
                for s, inner in enumerate(old)]  # Deal: counted over old shard s's remainder
    if state["finished"]:
        return None
    return _Merge([c for c in children if c is not None], [skip] + extra)


def _runs(node: Any, above: list) -> list:
    """``[(leaf, filters)]``: each leaf with its filters and those of the levels above it, in
    the order they apply (each level's filters shared by the runs below it)."""
    if isinstance(node, _Leaf):
        return [(node, node.filters + above)]
    return [run for child in node.children for run in _runs(child, node.filters + above)]


class _Unread:
    """The feed of a finished old reader's plan, built only to check it against its state."""

    replayable = True

    def __init__(self, state: dict) -> None:
        self.dealt = tuple(state["stream"]) if "stream" in state else None

    def __call__(self, run: Any) -> Iterator[tuple]:
        return iter(())


def _epoch_of(states: list, where: str) -> int:
    epochs = sorted({s["epoch"] for s in states})
    if len(epochs) != 1:
        raise UsageError(f"resume states {where}: the shards' states are from different epochs"
                         f" {epochs[:4]}: give the states of one checkpoint")
    return epochs[0]


def check_states(states: list) -> list:
    """A list of states, each state's fields checked on their own (the rest is checked against
    the pipeline when the epoch starts)."""
    if not states:
        raise UsageError("resume states: the list is empty (give every shard's state)")
    for k, state in enumerate(states):
        try:
            _resume.check_fields(state)
        except UsageError as exc:
            raise UsageError(f"resume states[{k}]: {exc}") from None
    return states


def iter_from_states(ds: Any, states: list) -> Any:
    """:meth:`Dataset.iter_from` with a list of states: the same-layout resume where ``ds`` is
    one of the old shards, else an elastic one."""
    check_states(states)
    epoch = _epoch_of(states, "")
    if len(states) == 1 and "shards" not in states[0]:
        return ds.iter_from(states[0])  # a state from before elastic resume: same layout only
    layers = _ds_layers(ds)
    own = [s for s in states if _layers(s, "") == layers and s.get("place") == _place(ds)]
    universe, old = _layout(states, "")
    deal = _deal(universe, layers)
    if len(own) == 1 and deal is not None and deal[0] == len(old):
        return ds.iter_from(own[0])  # the same layout: this shard's own state, exactly
    if deal is None:
        raise UsageError(f"resume states: they split the Dataset with shard layers {universe}"
                         f" and this one is sharded {layers}: an elastic resume needs the same"
                         " Dataset with only the last shard() changed")
    pinned = ds._context.epoch
    if pinned is not None and pinned != epoch:
        raise UsageError(f"resume state: 'epoch' is {epoch}, but this Dataset is pinned to epoch"
                         f" {pinned} (with_context)")
    return _start(ds, epoch, {"from": old, "deal": list(deal)}, 0)


def _place(ds: Any) -> list:
    ctx = ds._context
    return [ctx.rank, ctx.world_size, ctx.worker, ctx.num_workers]


def resume_elastic_state(ds: Any, state: dict) -> Any:
    """:meth:`Dataset.iter_from` with the state of an epoch that was itself resumed
    elastically, on the layout it was taken on."""
    _resume.check_state(ds, state)
    universe, _ = _layout(state["elastic"]["from"], ".elastic.from")
    if _deal(universe, _ds_layers(ds)) != tuple(state["elastic"]["deal"]):
        raise UsageError(f"resume state: its 'elastic' 'deal' {state['elastic']['deal']} is not"
                         f" this Dataset's share (shards {_ds_layers(ds)})")
    if state["finished"] and (_read_once(ds) or _dealt(state["elastic"])):
        it = _start(ds, state["epoch"], state["elastic"], state["delivered"], done=True)
    else:
        it = _start(ds, state["epoch"], state["elastic"], state["delivered"])
    if state["finished"]:
        it.close()
        it._ended = True
    return it


def _start(ds: Any, epoch: int, elastic: dict, delivered: int, done: bool = False) -> Any:
    """The resumed epoch: the old shards' remainders, this shard's deal of them, from the
    ``delivered``-th item on (``done``: none of it, though a shared stream's epoch is still
    taken part in)."""
    from ..iterator import EpochIterator

    carrier = {"finished": False, "delivered": delivered, "elastic": elastic,
               "shards": [list(x) for x in ds._shard_layers], "place": _place(ds)}
    share = _resume.stream_share(ds)
    if share is not None:
        carrier["stream"] = share
    stats = EpochStats(epoch)
    ds._last_stats = stats
    if ds._context.epoch is None:
        ds._epochs_started = epoch + 1
    if _read_once(ds) or _dealt(elastic):
        blocks = _start_one_read(ds, carrier, epoch, stats, done)
    else:
        runs = [(_old_plan(ds, leaf.state, leaf.where), filters)
                for leaf, filters in _runs(_tree(ds, carrier, "", []), [])]
        blocks = _chain(runs, epoch, stats, delivered)
    it = EpochIterator(blocks, stats, batched=ds._batched())
    it._origin = (ds, epoch, delivered, elastic)
    return it


def _chain(runs: list, epoch: int, stats: EpochStats, delivered: int) -> Iterator[tuple]:
    """The runs one after another, each opened when the one before has ended."""
    last_skip = None
    for plan, filters in runs:
        last_skip = filters[-1]
        yield from _replayed(plan, filters, epoch, stats)
    if last_skip is not None and last_skip.seen < delivered:
        raise _beyond_share(delivered, last_skip.seen)


def _replayed(plan: Any, filters: list, epoch: int, stats: EpochStats) -> Iterator[tuple]:
    """The blocks of an old shard's replayed epoch that ``filters`` pick (its fast-forward:
    skipped batches are not decoded where the pipeline allows)."""
    run = EpochRun(plan, epoch, stats)
    run.fast_forward = _resume.plan_fast_forward(plan._stages, plan._decoder is not None,
                                                 filters[0].n, Selection(filters))
    blocks = run.build()
    try:
        yield from blocks
    finally:
        close_blocks(blocks)


def _beyond_share(delivered: int, seen: int) -> UsageError:
    return UsageError(f"resume state: 'delivered' is {delivered}, but this shard's share of the"
                      f" epoch holds only {seen} items: the state is not this pipeline's (or its"
                      " data changed)")


# -- a stream read once: the old shards replayed together -----------------------------------------
def _start_one_read(ds: Any, carrier: dict, epoch: int, stats: EpochStats,
                    done: bool) -> Iterator[tuple]:
    """An elastic epoch over a stream read once (a FIFO, a ``PipeChannel``), alone or dealt to
    several readers (``to_torch`` over one stream: block ``k`` to reader ``k % readers``, the
    state's ``stream`` field): every new reader takes every block of the epoch (the dealer sends
    each to all of them, :mod:`streamio.pipeline.dealing`; a reader with no feed reads the
    stream itself), splits them into the old readers' shares
    (:class:`~streamio.pipeline.dealing.Demux`) and replays all the old plans together, taking
    their items in turn, one each; a nested elastic state merges the same way at every level.
    Old states of shards that each read their own copy of a stream (``shard(n, i)`` of a FIFO)
    cannot be replayed so: :class:`~streamio.UsageError`."""
    root = _tree(ds, carrier, "", [])
    leaves = [] if root is None or done else [leaf for leaf, _ in _runs(root, [])]
    shares = {leaf.share[0] for leaf in leaves} or {1}
    if len(shares) > 1:
        raise UsageError(f"resume states: the old readers shared the stream among different"
                         f" numbers of readers {sorted(shares)}: give one checkpoint's states")
    readers = shares.pop()
    feed = ds._feed
    if feed is not None and not hasattr(feed, "every_block"):
        raise UsageError("an elastic resume cannot replay this Dataset's feed (it gives no"
                         " 'every_block'): resume on the layout the states were taken on")
    host = [list(layer) for layer in ds._shard_layers]
    for leaf in leaves:
        if leaf.state["shards"] != host:
            raise UsageError(f"resume state {leaf.where}: its reader read the stream with shard"
                             f" layers {leaf.state['shards']} (its own copy of it), this Dataset"
                             f" with {host}: a stream read once is replayed only from the"
                             " states of readers that shared it (to_torch's DataLoader workers"
                             " and local ranks) or of its one reader")
    if not leaves:
        if feed is not None:
            feed.drain(stats, broadcast=True)  # the others' epoch goes on without this reader
        return iter(())
    source = feed.every_block(stats) if feed is not None else cut_blocks(ds, epoch, stats)
    demux = Demux(source, readers)
    for leaf in leaves:
        leaf.plan = _old_plan(ds, leaf.state, leaf.where, demux.feed(leaf.share[1]))
    return _replay(root, demux, epoch, stats)


def _replay(root: Any, demux: Demux, epoch: int, stats: EpochStats) -> Iterator[tuple]:
    try:
        for items in _items(root, epoch, stats):
            yield items, None
    finally:
        demux.close()


def _items(node: Any, epoch: int, stats: EpochStats) -> Iterator[list]:
    """Lists of ``node``'s items, in order."""
    if isinstance(node, _Leaf):
        blocks = _replayed(node.plan, node.filters, epoch, stats)
        try:
            for block in blocks:
                if block[0]:
                    yield block[0]
        finally:
            blocks.close()
        return
    children = [_each(_items(child, epoch, stats)) for child in node.children]
    selection = Selection(node.filters)
    out: list = []
    try:
        live = children
        while live:
            going = []
            for child in live:
                for item in child:
                    out.append(item)
                    going.append(child)
                    break
            live = going
            if len(out) >= 64 or (out and not live):
                kept, _ = _resume._take(out, None, selection.pick(len(out)))
                out = []
                if kept:
                    yield kept
    finally:
        for child in children:
            child.close()
    skip = node.filters[0]
    if skip.seen < skip.n:
        raise _beyond_share(skip.n, skip.seen)


def _each(lists: Iterator[list]) -> Iterator[Any]:
    try:
        for items in lists:
            yield from items
    finally:
        lists.close()

"""Resume for :class:`~streamio.adapters.torch.StreamDataset`: ``state_dict`` /
``load_state_dict`` (torchdata's ``StatefulDataLoader``, ``torch.distributed.checkpoint``), on
the same layout or elastically on another. Part of :mod:`streamio.adapters.torch`.

Contract:

* A state is ``{"streamio_torch": 1, "resume": TEXT}``, TEXT a JSON object of the epoch, the
  reader's ``Dataset.iter_from`` state (or None: begun, nothing delivered) and its place
  ``[rank, world_size, worker, num_workers]``. One string, so the structure never changes.
* One reader's state loads only into that reader (the same worker of as many workers): anywhere
  else it is refused with a :class:`~streamio.errors.UsageError` naming both layouts and the fix,
  when it is loaded (main process) or when the worker starts (inside a DataLoader worker).
* A list of every old reader's state (each a ``StreamDataset.state_dict()`` or a whole
  ``StatefulDataLoader.state_dict()``) resumes on any layout: on the same one each reader takes
  its own; on another each reader gets its share of what the old readers had not delivered
  (:mod:`streamio.pipeline.resume.elastic`). Every old reader must appear exactly once, all from one
  epoch and one layout: a missing or repeated one would lose or repeat its deliveries.
* The resumed epoch is the next ``iter()``'s; the epochs after it count on from there, and a
  PipeChannel's FIFO numbers follow (a restarted job's FIFOs start again at ``_0``).

:class:`ResumableReader` holds the methods; it reads the ``StreamDataset``'s ``dataset``,
``plan()``, epoch counter (``_epoch``), PipeChannel starts (``_channel_starts``), and what
``__iter__`` records: ``_iterator``, ``_started_epoch``, ``_place``, ``_pending``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ..errors import UsageError, UsageTypeError, require

torch = require("torch", "torch")

__all__ = ["ResumableReader"]


class ResumableReader:
    """The resume half of ``StreamDataset`` (a mixin; see the module docstring)."""

    _pending: Optional[tuple]  # (epoch, iterator state, a _Gathered, or None) for the next iter()

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
        :mod:`streamio.pipeline.resume.elastic`). Call it before the DataLoader is made, on the
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

    def _take_epoch(self, num_workers: int) -> tuple:
        """``(epoch, pending)`` for this ``iter()``: a pending single state is its own epoch; a
        gathered list is resumed by the readers of its epoch only (the next epoch's workers,
        made from the same object, leave it alone)."""
        pending, self._pending = self._pending, None
        if pending is not None and isinstance(pending[1], _Gathered):
            epoch = self._epoch.take(num_workers)
            return epoch, (pending if epoch == pending[0] else None)
        if pending is not None:
            return pending[0], pending
        return self._epoch.take(num_workers), None

    def _resume(self, ds: Any, pending: Optional[tuple], epoch: int, rank: int, world_size: int,
                worker: int, num_workers: int) -> None:
        """Load this reader's resume (``pending`` from :meth:`_take_epoch`) into its plan ``ds``."""
        resume = None if pending is None else pending[1]
        if isinstance(resume, _Gathered):
            resume = self._elastic_state(resume, epoch, rank, world_size, worker, num_workers)
        if resume is not None:
            # Checked against this reader's plan (its shard, worker and rank) now, in __iter__,
            # so a state from another worker layout fails here rather than resuming wrongly.
            ds.load_state_dict(resume)


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
    hint = ("call ds.load_state_dict(loader_state) on the to_torch() dataset before making the"
            " loader, with the old loader's whole state (with several ranks, the list of every"
            " rank's state: [each rank's loader.state_dict()]): it resumes on any number of"
            " ranks and workers")
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

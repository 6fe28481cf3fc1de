"""Two DataLoader set-ups that run without error and silently do the wrong thing, detected in
``StreamDataset.__iter__`` and said once (a :class:`~streamio.errors.StreamioWarning` with the
fix), in whichever process sees them first:

* ``DataLoader(ds.to_torch())`` over a batched Dataset without ``batch_size=None``: the
  DataLoader's default ``batch_size=1`` collates each streamio batch into a batch of one, and
  every tensor gets an extra leading dimension (``(1, 64, 16)`` for batches of 64). Seen from the
  DataLoader's fetcher, the frame that calls ``iter()`` on the dataset: its ``auto_collation``
  is what ``batch_size`` set (an unbatched Dataset's items are single examples, which the
  DataLoader is right to collate).
* a memory ``cache()`` under DataLoader workers that are not persistent: the cache lives in the
  worker process, which ends with its epoch, so every epoch reads the sources again. Seen when a
  worker process starts a later epoch than the first one workers of the same ``StreamDataset``
  read, without having run one itself (a persistent worker runs them all).

The "said once" and "an earlier worker epoch" flags are shared by the main process and every
worker (a spawn-context array, like the epoch counter).
"""

from __future__ import annotations

import multiprocessing
import sys
import warnings
from typing import Any

from ..errors import StreamioWarning

__all__ = ["UsageChecks"]

_COLLATED, _CACHE_LOST, _WORKER_EPOCH = 0, 1, 2


def _auto_collation(depth: int = 4) -> bool:
    """Whether the code iterating us is a DataLoader fetcher that collates items into batches
    (``DataLoader(batch_size=n)`` with ``n`` not None)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if owner is not None and isinstance(getattr(owner, "auto_collation", None), bool) \
                and hasattr(owner, "collate_fn"):
            return owner.auto_collation
        frame = frame.f_back
    return False


def _stages(dataset: Any) -> tuple:
    inputs = getattr(dataset, "inputs", None)  # a mix: its inputs' stages too
    own = tuple(getattr(dataset, "stages", ()))
    return own + tuple(s for inp in (inputs or ()) for s in _stages(inp))


class UsageChecks:
    """The shared flags of one ``StreamDataset`` (made in the main process)."""

    def __init__(self) -> None:
        self._flags = multiprocessing.get_context("spawn").Array("q", 3)

    def _once(self, slot: int) -> bool:
        with self._flags.get_lock():
            first = not self._flags[slot]
            self._flags[slot] = 1
        return first

    def check_collation(self, dataset: Any) -> None:
        """From ``__iter__`` (called by the DataLoader's fetcher): warn once if it collates
        the batches of a batched Dataset."""
        size = getattr(dataset, "batch_size", None)
        if size is None or not _auto_collation() or not self._once(_COLLATED):
            return
        warnings.warn(
            f"DataLoader(ds.to_torch()) collates the batches of a batched Dataset (batch({size}))"
            f" into batches of batches: each tensor gets an extra leading dimension, (1, {size},"
            " ...) with the default batch_size=1. Pass DataLoader(ds.to_torch(),"
            " batch_size=None), or leave out batch() and let the DataLoader batch single"
            " examples", StreamioWarning, stacklevel=4)

    def check_worker_epoch(self, dataset: Any, epoch: int, ran_here: bool) -> None:
        """In a DataLoader worker starting ``epoch`` (``ran_here``: this process ran an earlier
        one): warn once if a memory cache was lost with an earlier epoch's worker."""
        with self._flags.get_lock():
            first = self._flags[_WORKER_EPOCH] - 1  # the first epoch workers read (-1: none)
            if first < 0:
                self._flags[_WORKER_EPOCH] = epoch + 1
        if first < 0 or first == epoch or ran_here:
            return
        if not any(getattr(s, "keeps_in_process", False) for s in _stages(dataset)):
            return
        if self._once(_CACHE_LOST):
            warnings.warn(
                "a memory cache() lives in the DataLoader worker that filled it, and workers"
                " that are not persistent end with each epoch: this epoch reads the sources"
                " again (and so will every epoch). Pass DataLoader(..., persistent_workers=True)"
                " or cache(directory)", StreamioWarning, stacklevel=3)

"""The consumer's end of an epoch: :class:`EpochIterator` hands the items out one by one."""

from __future__ import annotations

import operator
import time
from typing import Any, Iterator, Optional

from .._util import batch_rows as _batch_rows
from ..errors import UsageError
from . import resume as _resume
from .stages import close_blocks
from .stats import EpochStats

__all__ = ["EpochIterator"]


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
        # (Dataset, epoch, items skipped by a resume[, the elastic resume it continues])
        self._origin: Optional[tuple] = None

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
            close_blocks(blocks)
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
        return self._state(self.delivered, self._ended, next_epoch=False)

    def state_after(self, items: int, *, next_epoch: bool = False) -> dict:
        """The resume state of this epoch once its consumer has taken ``items`` items from
        this iterator (a consumer that counts its own steps, as Keras does, while a prefetching
        reader runs ahead); ``next_epoch``: the state that starts the following epoch."""
        return self._state(items, False, next_epoch=next_epoch)

    def _state(self, items: int, ended: bool, *, next_epoch: bool) -> dict:
        if self._origin is None:
            raise UsageError("this iterator was not made by a Dataset: it has no resume state")
        ds, epoch, skipped, *elastic = self._origin
        if next_epoch:
            return _resume.make_state(ds, epoch + 1, 0, False)
        return _resume.make_state(ds, epoch, skipped + items, ended,
                                  elastic=elastic[0] if elastic else None)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __enter__(self) -> "EpochIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


"""The consumer's end of an epoch: :class:`EpochIterator` hands the items out one by one."""

from __future__ import annotations

import operator
import time
from typing import Any, Iterator, Optional

from .._util import ItemChain, batch_rows as _batch_rows, exhaust_iterator
from ..errors import UsageError
from . import resume as _resume
from .stages import close_blocks
from .stats import EpochStats

__all__ = ["EpochIterator"]


class EpochIterator(ItemChain):
    """One epoch of a Dataset: yields items and owns everything the epoch opened.

    ``close()`` (also on ``break`` out of a ``for`` loop, when the iterator is dropped, or at
    the end of a ``with`` block) stops prefetch threads and closes the sources. Counting for
    :meth:`Dataset.stats` happens here, once per block, not per item.

    Items are handed out by C code (``itertools.chain`` over each block's list iterator, a
    subclass of it: ``_util.ItemChain``): Python runs once per block, not once per item, which
    was a third of an epoch of small records. Where the epoch stands (:attr:`delivered`) is the blocks before
    the current one plus what the current block's iterator has given.
    """

    _MADE_BY = "iter(dataset)"
    _INSTEAD = ": its state_dict() can"
    _feed: "_Feed"
    # (Dataset, epoch, items skipped by a resume[, the elastic resume it continues])
    _origin: Optional[tuple]

    def __new__(cls, blocks: Iterator[tuple], stats: EpochStats, *,
                batched: bool) -> "EpochIterator":
        # The blocks' side lives in a _Feed that the chain's generator updates: the generator
        # holds no reference to the iterator, so a dropped iterator is freed (and closed) at
        # once, not by the cycle collector.
        feed = _Feed(blocks, stats, batched)
        self = super().__new__(cls, _item_iterators(feed))
        self._feed = feed
        self._origin = None
        return self

    @property
    def _stats(self) -> EpochStats:
        return self._feed.stats

    @property
    def _ended(self) -> bool:
        return self._feed.ended

    @_ended.setter
    def _ended(self, value: bool) -> None:
        self._feed.ended = value

    def close(self) -> None:
        """Stop the epoch: prefetch threads end and sources are closed (idempotent)."""
        feed = self.__dict__.get("_feed")
        if feed is not None:
            feed.close()

    @property
    def delivered(self) -> int:
        """Items (records, or batches) this iterator has handed out."""
        return self._feed.delivered()

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

    def __repr__(self) -> str:
        feed = self.__dict__.get("_feed")
        if feed is None:
            return f"<{type(self).__name__}>"
        state = "finished" if feed.ended else ("closed" if feed.blocks is None else "running")
        origin = self._origin
        where = "" if origin is None else f" epoch {origin[1]} of {origin[0]!r},"
        kind = "batches" if feed.batched else "items"
        return f"<{type(self).__name__}{where} {self.delivered} {kind} delivered, {state}>"

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __enter__(self) -> "EpochIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Feed:
    """An epoch's blocks and where its consumer stands in them."""

    __slots__ = ("blocks", "stats", "batched", "items", "handed", "block_len", "ended")

    def __init__(self, blocks: Iterator[tuple], stats: EpochStats, batched: bool) -> None:
        self.blocks: Optional[Iterator[tuple]] = blocks
        self.stats = stats
        self.batched = batched
        # The current block's iterator (the one the chain is taking items from), the items
        # in the blocks before it, and its length.
        self.items: Iterator[Any] = iter(())
        self.handed = 0
        self.block_len = 0
        self.ended = False

    def delivered(self) -> int:
        return self.handed + self.block_len - operator.length_hint(self.items)

    def close(self) -> None:
        blocks = self.blocks
        if blocks is None:
            return
        self.blocks = None
        self.handed = self.delivered()
        self.block_len = 0
        # The chain would go on with the current block's iterator: it gives nothing more.
        exhaust_iterator(self.items)
        self.items = iter(())
        try:
            close_blocks(blocks)
        finally:
            self.stats.finish()


def _item_iterators(feed: _Feed) -> Iterator[Iterator[Any]]:
    """The iterator of each non-empty block's items, in order, counting each block as it
    comes; the epoch closes when the blocks end or fail."""
    stats = feed.stats
    clock = time.perf_counter
    while True:
        blocks = feed.blocks
        if blocks is None:
            return
        t0 = clock()
        try:
            while True:
                items = next(blocks)[0]
                if items:
                    break
        except StopIteration:
            stats.wait_s += clock() - t0
            feed.ended = True
            feed.close()
            return
        except BaseException:
            stats.wait_s += clock() - t0
            feed.close()
            raise
        stats.wait_s += clock() - t0
        if feed.blocks is None:  # closed while the block was made (another thread)
            return
        feed.handed += feed.block_len
        feed.block_len = len(items)
        if feed.batched:
            stats.batches += len(items)
            stats.records += sum(map(_batch_rows, items))
        else:
            stats.records += len(items)
        stats.first_item()
        feed.items = items = iter(items)
        yield items

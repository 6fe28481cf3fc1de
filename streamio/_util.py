"""Small helpers several rooms share, one home each: an int argument's check, the rows of a
batch, and closing a block iterator."""

from __future__ import annotations

import collections
import itertools
import sys
from typing import Any

import numpy as np

from .errors import UsageError, UsageTypeError


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int, if it is one (a numpy integer too, never a bool) of at least
    ``minimum``: else :class:`UsageTypeError` (not an int) or :class:`UsageError` (too small)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UsageTypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, not {value}")
    return int(value)


def batch_rows(batch: Any) -> int:
    """The rows in a batch: a dict of columns (its first column's length), a mapped tuple such
    as ``(images, labels)`` (its first part's), an array (its first dimension), a list of
    records (its length); 1 for anything without a length."""
    if isinstance(batch, dict):
        for value in batch.values():
            shape = getattr(value, "shape", None)
            return int(shape[0]) if shape else len(value)
        return 0
    if isinstance(batch, tuple) and batch and not isinstance(batch[0], (bytes, str)):
        return batch_rows(batch[0])  # a mapped batch such as (images, labels)
    shape = getattr(batch, "shape", None)
    if shape:
        return int(shape[0])
    try:
        return len(batch)
    except TypeError:
        return 1


def exhaust_iterator(items: Any) -> None:
    """Leave the iterator ``items`` with nothing more to give: a list's or a tuple's at once
    (its position set past the end), any other by running it out. An ``itertools.chain`` over
    such iterators then stops after its current one (``EpochIterator.close()``)."""
    if type(items) in _SEQUENCE_ITERATORS:
        items.__setstate__(sys.maxsize)  # clamped to the sequence's length
    else:
        collections.deque(items, maxlen=0)


_SEQUENCE_ITERATORS = (type(iter([])), type(iter(())))


class ItemChain(itertools.chain):
    """An ``itertools.chain`` over the item iterators that ``item_iterators`` (a generator over
    blocks) yields: C code hands the items out, Python runs once per block. A subclass says
    what makes it (``_MADE_BY``); ``from_iterable`` and pickling are refused (what it reads
    cannot travel; ``_INSTEAD``: what can)."""

    _MADE_BY = "streamio"
    _INSTEAD = ""

    def __new__(cls, item_iterators: Any) -> "ItemChain":
        return super().from_iterable(item_iterators)

    @classmethod
    def from_iterable(cls, iterable: Any) -> "ItemChain":
        raise UsageTypeError(f"{cls._MADE_BY} makes this iterator, not from_iterable()")

    def __reduce__(self) -> Any:
        raise UsageTypeError(f"this iterator cannot be pickled{self._INSTEAD}")


def close_iterator(blocks: Any) -> None:
    """Close a generator (or anything with ``close``), so its ``finally`` runs now."""
    close = getattr(blocks, "close", None)
    if close is not None:
        close()

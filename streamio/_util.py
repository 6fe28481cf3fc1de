"""Small helpers several rooms share, one home each: an int argument's check, the rows of a
batch, closing a block iterator, and the log of a wait that lasts."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import sys
import time
from typing import Any, Callable, Optional

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


#: A wait this long is logged (logger ``streamio``, WARNING), then again every
#: :data:`WAIT_LOG_INTERVAL_S` seconds while it lasts (:class:`WaitLog`).
WAIT_LOG_AFTER_S = 5.0
WAIT_LOG_INTERVAL_S = 30.0

_log = logging.getLogger("streamio")


class WaitLog:
    """Says on logger ``streamio`` that a wait lasts: what it waits for, for how long, and what
    would end it.

    One policy for every wait of the library (a source waiting for a FIFO's writer, stdin or a
    Pipe mode epoch; the shared stream's dealer and readers waiting for the stream or for each
    other): nothing for the first :data:`WAIT_LOG_AFTER_S` seconds (short waits are normal),
    then a WARNING, and another every :data:`WAIT_LOG_INTERVAL_S` while the wait lasts. WARNING
    because a wait that long is what a user looks at when a job seems hung, and Python shows
    warnings with no logging set up (the CLI prints them); a line every 30 s keeps a wait that
    nothing ends (a FIFO without a timeout) from flooding the log.

    ``describe(waited_s)`` returns the line: what is waited for, ``waited_s`` (how long so far)
    and which timeout ends the wait (:func:`timeout_words`); it is called only when a line is
    logged. A wait starts when the log is made (``waiting=False``: at the first :meth:`tick`);
    :meth:`tick` says it goes on and logs when a line is due, :meth:`end` that it ended (the
    next wait is logged after :data:`WAIT_LOG_AFTER_S` again). A loop that sleeps wakes by
    :attr:`due` at the latest.
    """

    __slots__ = ("describe", "since", "due")

    def __init__(self, describe: Callable[[float], str], *, waiting: bool = True) -> None:
        self.describe = describe
        self.since: Optional[float] = None
        self.due = math.inf
        if waiting:
            self.tick()

    def tick(self, now: Optional[float] = None) -> None:
        """The wait goes on (at ``now``, a ``time.monotonic()``): log it if a line is due."""
        if now is None:
            now = time.monotonic()
        if self.since is None:
            self.since, self.due = now, now + WAIT_LOG_AFTER_S
        elif now >= self.due:
            self.due = now + WAIT_LOG_INTERVAL_S
            _log.warning("%s", self.describe(now - self.since))

    def end(self) -> None:
        """The wait ended."""
        self.since, self.due = None, math.inf


def timeout_words(option: str, timeout: Optional[float]) -> str:
    """What ends a wait: ``"open_timeout=300 s ends it"``, or how to bound one that has none."""
    if timeout is None or not math.isfinite(timeout):
        return f"nothing ends it (no {option}): pass {option}= (--{option.replace('_', '-')})"
    return f"{option}={timeout:g} s ends it"

"""Counting the records a decoder drops under ``on_error="skip"`` (or ``"warn"``).

A decoder that drops a record says so with :func:`note_skip` (the field that did not decode);
whoever runs it (the pipeline's decode stage, a ``map`` thread or process) collects the notes of
one call with :func:`counting_skips` and adds them to the epoch's ``stats()``. A ``ContextVar``
keeps calls in different threads apart; outside ``counting_skips`` a note goes nowhere.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
from typing import Iterator, Optional

__all__ = ["counting_skips", "note_skip"]

_SINK: contextvars.ContextVar = contextvars.ContextVar("streamio_decoder_skips", default=None)


def note_skip(field: Optional[str]) -> None:
    """A record was dropped because ``field`` did not decode."""
    sink = _SINK.get()
    if sink is not None:
        sink[field or "record"] += 1


@contextlib.contextmanager
def counting_skips() -> Iterator[collections.Counter]:
    """Collect the skips noted in this thread while the block runs: ``{field: records}``."""
    sink: collections.Counter = collections.Counter()
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)

"""Counting the records a decoder drops under ``on_error="skip"`` (or ``"warn"``).

A decoder that drops a record says so with :func:`note_skip` (the field that did not decode,
and the error that names the record, if it has one); whoever runs it (the pipeline's decode
stage, a ``map`` thread or process) collects the notes of one call with :func:`counting_skips`
and adds them to the epoch's ``stats()``. A ``ContextVar`` keeps calls in different threads
apart; outside ``counting_skips`` a note goes nowhere.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import warnings
from typing import Iterator, Optional

from ..errors import StreamioWarning

__all__ = ["Skips", "counting_skips", "drop_record", "note_skip", "replaying"]

_SINK: contextvars.ContextVar = contextvars.ContextVar("streamio_decoder_skips", default=None)
_REPLAY: contextvars.ContextVar = contextvars.ContextVar("streamio_skips_replay", default=False)


class Skips(collections.Counter):
    """``{field: records}`` dropped, and ``errors``: the errors that named the dropped records
    (source, byte offset, record index), one per record (a call decodes one block)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list = []


def note_skip(field: Optional[str], error: Optional[BaseException] = None) -> None:
    """A record was dropped because ``field`` did not decode (``error`` says where, if given)."""
    sink = _SINK.get()
    if sink is not None and not _REPLAY.get():
        sink[field or "record"] += 1
        if error is not None:
            sink.errors.append(error)


def drop_record(field: Optional[str], error: BaseException, *, warn: bool,
                stacklevel: int = 2) -> None:
    """A decoder drops a record under ``on_error="skip"`` or ``"warn"``: warn (``warn``) and
    count it, once: a decode replayed over records already decoded (:func:`replaying`) does
    neither again."""
    if _REPLAY.get():
        return
    if warn:
        warnings.warn(f"skipped a record: {error}", StreamioWarning, stacklevel=stacklevel + 1)
    note_skip(field, error)


@contextlib.contextmanager
def replaying() -> Iterator[None]:
    """Decodes in this block decode records again that an earlier call already decoded (and
    whose drops it counted and warned about): they drop the same records silently."""
    token = _REPLAY.set(True)
    try:
        yield
    finally:
        _REPLAY.reset(token)


@contextlib.contextmanager
def counting_skips() -> Iterator[Skips]:
    """Collect the skips noted in this thread while the block runs: ``{field: records}``, and
    the errors (:class:`Skips`)."""
    sink = Skips()
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)

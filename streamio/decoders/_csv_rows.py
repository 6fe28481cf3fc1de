"""Bounds and faults of :mod:`streamio.decoders.csv`'s general path, row by row.

* :func:`more_fields_than` counts a row's fields (RFC 4180 quoting, as the csv module splits it)
  up to a limit, without making them: a row is checked against ``max_columns`` before anything is
  made per field (the csv module's list of fields, numpy's fixed-width table, the column plan).
* :func:`fixed_width` makes a fixed-width numpy array of fields only where it stays within a
  bound of the batch's own bytes; one long field among many short ones would otherwise pad
  every cell to its length (1,000 columns and one 1 MB field: 4 GB).
* :class:`RowFaults` applies ``on_error`` to the rows of one batch: ``"raise"`` raises the row's
  :class:`~streamio.errors.DecodeError`; ``"skip"`` and ``"warn"`` (with a warning) drop the row
  and count it (``decoders.skips``: the epoch's ``stats()``, which keeps the first errors too).
* :class:`RowPlace` names a row in those errors: source, record index and, where the caller
  can say where rows start (``row_offset``), the row's byte offset; asked only for a bad row.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..errors import DecodeError
from .example import _Where
from .skips import drop_record

# A row of N one-byte columns costs the decoder about 115 bytes a column (the column plan:
# names, indices; then a list entry and a value per field: 110 MB for 2**20), so the default
# bounds one wide row to that, yet admits 64x Excel's 16,384 columns and flattened 224x224x3
# images (150,528 values). A row within max_record_size may otherwise hold 128M fields (~15 GB).
DEFAULT_MAX_COLUMNS = 1 << 20

# A fixed-width table of fields may take this much plus TABLE_FACTOR times the batch's bytes.
TABLE_MIN_BYTES = 16 << 20
TABLE_FACTOR = 16

_ESCAPED_WINDOW = 1 << 16  # bytes one regex match may cover (bounds the regex engine's stack)


def more_fields_than(row: bytes, delimiter: bytes, quote: Optional[bytes], limit: int) -> bool:
    """Whether ``row`` has more than ``limit`` fields, as the csv module splits it.

    A quote opens a field only at its start and closes at a quote that is not doubled; an
    unclosed quote makes the rest of the row one field (the split then reports it). Time is
    linear in the row, the Python work bounded by ``limit`` fields and one step per 64 KiB of a
    quoted field; nothing is made per field.
    """
    if len(row) < limit or row.count(delimiter) < limit:
        return False  # n fields need n - 1 delimiters
    if quote is None or quote not in row:
        return True
    escaped = re.compile(b"[^" + re.escape(quote) + b"]*(?:" + re.escape(quote * 2) + b"[^"
                         + re.escape(quote) + b"]*)*")
    pos, count = 0, 0
    while count <= limit:
        count += 1
        if row.startswith(quote, pos):
            pos = _closing_quote(row, pos + 1, quote, escaped)
            if pos < 0:
                break  # open to the end of the row: one field
        nxt = row.find(delimiter, pos)
        if nxt < 0:
            break
        pos = nxt + 1
    return count > limit


def _closing_quote(row: bytes, pos: int, quote: bytes, escaped: "re.Pattern[bytes]") -> int:
    """Index just past the quote that closes the quoted field whose text starts at ``pos``;
    -1 if none does."""
    n = len(row)
    while True:
        end = escaped.match(row, pos, min(n, pos + _ESCAPED_WINDOW)).end()
        if end >= n:
            return -1
        if row.startswith(quote, end):
            if row.startswith(quote, end + 1):  # a doubled quote cut by the window
                pos = end + 2
                continue
            return end + 1
        pos = end  # the window ended inside text


def fixed_width(values: List[Any], budget: int) -> Optional[np.ndarray]:
    """``np.array(values)`` (fields, or rows of fields) if its cells fit in ``budget`` bytes,
    else None."""
    flat = values
    if values and isinstance(values[0], list):
        flat = list(itertools.chain.from_iterable(values))
    if not flat:
        return np.array(values)
    width = max(map(len, flat))
    size = 4 if isinstance(flat[0], str) else 1
    if len(flat) * max(width, 1) * size > budget:
        return None
    return np.array(values)


def table_budget(rows: List[bytes]) -> int:
    return TABLE_MIN_BYTES + TABLE_FACTOR * sum(map(len, rows))


def row_index(positions: Optional[np.ndarray], k: int) -> int:
    """The batch position of row ``k`` once rows were dropped (a repeated header)."""
    return k if positions is None else int(positions[k])


class RowPlace(_Where):
    """Where a batch of rows came from: its source, the record index of its first row and,
    given ``row_offset`` (record index -> byte offset in the source, or None), each row's
    byte offset, asked for only when an error names a row."""

    __slots__ = ("row_offset",)

    def __init__(self, source: Optional[str], first_index: int,
                 row_offset: Optional[Callable[[int], Optional[int]]] = None) -> None:
        super().__init__(source, first_index)
        self.row_offset = row_offset

    def error(self, message: str, row: Optional[int], field: Optional[str]) -> DecodeError:
        index = None if row is None else self.first_index + row
        offset = None
        if index is not None and self.row_offset is not None:
            offset = self.row_offset(index)
        return DecodeError(message, source=self.source, offset=offset, record_index=index,
                           field=field)


class RowFaults:
    """The rows of one batch that do not decode, under ``on_error``."""

    def __init__(self, on_error: str, where: Any, positions: Optional[np.ndarray]) -> None:
        self.on_error = on_error
        self.where = where
        self.positions = positions
        self.bad: Dict[int, DecodeError] = {}

    @property
    def raising(self) -> bool:
        return self.on_error == "raise"

    def fault(self, message: str, k: int, field: Optional[str]) -> None:
        """Row ``k`` (of the batch as decoded) does not decode: raise, or drop it."""
        self.reject(self.where.error(message, row_index(self.positions, k), field), k)

    def reject(self, err: DecodeError, k: int) -> None:
        """Row ``k`` does not decode, as ``err`` says: raise it, or drop the row."""
        if self.on_error == "raise":
            raise err from None
        if k in self.bad:
            return  # counted once, at its first fault
        self.bad[k] = err
        drop_record(err.field or "row", err, warn=self.on_error == "warn", stacklevel=5)

    def keep(self, nrows: int) -> Optional[np.ndarray]:
        """The mask of the rows that decoded, or None when all did."""
        if not self.bad:
            return None
        mask = np.ones(nrows, dtype=bool)
        mask[list(self.bad)] = False
        return mask

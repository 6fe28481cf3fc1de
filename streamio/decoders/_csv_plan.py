"""The column plan of :mod:`streamio.decoders.csv` (which columns go to which outputs, fixed by
the first row or the header) and its fast path: numpy's C parser (``np.loadtxt``) over a whole
batch of plain numeric rows."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import numpy as np

# Output dtypes that hold text (numpy object arrays), which the fast path never takes.
_TEXT = {"str", "bytes"}


class _Plan:
    """Which columns go where, fixed by the first row (or the header).

    ``outputs``: ``(name, column index, dtype)`` for one-column outputs, ``(name, [column
    indices], dtype)`` for the stacked ``features``.
    """

    def __init__(self, names: List[str], outputs: List[Tuple[str, Union[int, List[int]], str]],
                 label: Optional[int], feature_cols: List[int]) -> None:
        self.names = names
        self.outputs = outputs
        self.label = label
        self.no_text = all(dtype not in _TEXT for _, _, dtype in outputs)
        self.used = sorted(set(feature_cols) | ({label} if label is not None else set()))
        # Where each output's columns are in a fast-path table of the used columns (None: the
        # whole table, in order): arrays, not dicts, as a row may have a million columns.
        slot = np.full(len(names), -1, dtype=np.intp)
        slot[self.used] = np.arange(len(self.used))
        self._slots = [None if not isinstance(cols, int) and len(cols) == len(self.used)
                       and np.array_equal(slot[cols], np.arange(len(cols)))
                       else slot[cols] for _, cols, _ in outputs]
        kinds = [np.dtype(dtype) for _, cols, dtype in outputs
                 if dtype not in _TEXT and (isinstance(cols, int) or len(cols))]
        # numpy's C parser takes float and integer columns; bool and text go the general way.
        self.fast = self.no_text and all(d.kind in "fiu" for d in kinds)
        if not self.fast:
            self.fast_dtype = np.dtype(np.float32)  # unused
        elif len(set(kinds)) <= 1:
            # One dtype: a plain 2-D table. Float32 parsing goes through a double in numpy's
            # parser as in Python's float(), so both paths give the same values.
            self.fast_dtype = kinds[0] if kinds else np.dtype(np.float32)
        else:
            dtypes = {c: np.dtype(dtype) for _, cols, dtype in outputs
                      for c in ([cols] if isinstance(cols, int) else cols)}
            self.fast_dtype = np.dtype([(f"c{c}", dtypes[c]) for c in self.used])

    def assemble_fast(self, table: np.ndarray) -> Dict[str, np.ndarray]:
        out = {}
        if table.dtype.names:
            for name, cols, dtype in self.outputs:
                if isinstance(cols, int):
                    out[name] = np.ascontiguousarray(table[f"c{cols}"])
                else:
                    block = np.empty((len(table), len(cols)), dtype=dtype)
                    for k, c in enumerate(cols):
                        block[:, k] = table[f"c{c}"]
                    out[name] = block
            return out
        for (name, cols, dtype), slots in zip(self.outputs, self._slots):
            if slots is None:
                out[name] = table.astype(dtype, copy=False)
            else:
                out[name] = np.ascontiguousarray(table[:, slots], dtype=dtype)
        return out

    def empty(self) -> Dict[str, np.ndarray]:
        out = {}
        for name, cols, dtype in self.outputs:
            np_dtype = np.dtype(object) if dtype in _TEXT else np.dtype(dtype)
            out[name] = np.empty((0,) if isinstance(cols, int) else (0, len(cols)), dtype=np_dtype)
        return out


def _loadtxt(rows: List[bytes], plan: "_Plan", delimiter: str, every_column: bool
             ) -> Optional[np.ndarray]:
    if not all(rows):
        return None  # an empty row (one missing value): loadtxt would warn and skip it
    try:
        return np.loadtxt(rows, dtype=plan.fast_dtype, delimiter=delimiter, quotechar=None,
                          comments=None, ndmin=1 if plan.fast_dtype.names else 2,
                          usecols=None if every_column else plan.used, encoding="latin-1")
    except ValueError:
        return None


def _fields_per_row_ok(joined: bytes, delimiter: bytes, nrows: int, ncols: int) -> bool:
    """Whether every row of an unquoted batch has ``ncols`` fields (vectorised count)."""
    data = np.frombuffer(joined, dtype=np.uint8)
    breaks = np.flatnonzero(data == 10)
    if len(breaks) != nrows - 1:
        return False
    seen = np.concatenate(([0], np.cumsum(data == delimiter[0])))
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(data)]))
    return bool(((seen[ends] - seen[starts]) == ncols - 1).all())

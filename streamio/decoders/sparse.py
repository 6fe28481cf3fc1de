"""A batch of sparse rows in CSR form (what sparse RecordIO-protobuf tensors decode to)."""

from __future__ import annotations

from typing import Tuple

import numpy as np

from ..errors import UsageError

__all__ = ["SparseBatch"]

#: The largest dimension a SparseBatch may have (int64, as torch and scipy index).
MAX_DIM = 2 ** 63 - 1


class SparseBatch:
    """A ``(rows, columns)`` batch in compressed sparse row (CSR) form.

    Row ``i`` holds ``values[indptr[i]:indptr[i + 1]]`` at the columns
    ``indices[indptr[i]:indptr[i + 1]]``; the layout of ``scipy.sparse.csr_matrix`` and
    ``torch.sparse_csr_tensor``, so adapters convert without copying. ``indptr`` and ``indices``
    are ``int64``; an empty row is an all-zero row.
    """

    __slots__ = ("indptr", "indices", "values", "shape")

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray,
                 shape: Tuple[int, int]) -> None:
        indptr = np.asarray(indptr, dtype=np.int64)
        indices = np.asarray(indices, dtype=np.int64)
        values = np.asarray(values)
        shape = (int(shape[0]), int(shape[1]))
        # torch, scipy and numpy size tensors with int64: a wider shape cannot be converted.
        if not (0 <= shape[0] <= MAX_DIM and 0 <= shape[1] <= MAX_DIM):
            raise UsageError(f"shape {shape} must be two dimensions in [0, 2**63 - 1]")
        if indptr.ndim != 1 or len(indptr) != shape[0] + 1:
            raise UsageError(f"indptr must have rows + 1 = {shape[0] + 1} entries, not {indptr.shape}")
        if indices.shape != values.shape or indices.ndim != 1:
            raise UsageError(f"indices {indices.shape} and values {values.shape} must be 1-D and"
                             " of the same length")
        if len(indptr) and (indptr[0] != 0 or indptr[-1] != len(values)
                            or (len(indptr) > 1 and np.any(np.diff(indptr) < 0))):
            raise UsageError("indptr must start at 0, never decrease and end at len(values)")
        if len(indices) and (indices.min() < 0 or indices.max() >= shape[1]):
            raise UsageError(f"column indices must lie in [0, {shape[1]})")
        self.indptr = indptr
        self.indices = indices
        self.values = values
        self.shape = shape

    @classmethod
    def _checked(cls, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray,
                 shape: Tuple[int, int]) -> "SparseBatch":
        """A batch from parts a decoder has already checked as ``__init__`` would (int64
        ``indptr`` from 0 by non-negative counts to ``len(values)``, int64 ``indices`` in the
        row): the per-batch checks cost more than the decoding of a small batch."""
        batch = cls.__new__(cls)
        batch.indptr = indptr
        batch.indices = indices
        batch.values = values
        batch.shape = shape
        return batch

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nnz(self) -> int:
        """The number of stored values."""
        return len(self.values)

    def __len__(self) -> int:
        return self.shape[0]

    def to_dense(self) -> np.ndarray:
        """The batch as a dense ``(rows, columns)`` array (absent entries are 0).

        Entries given twice for one (row, column) are summed, as ``scipy.sparse`` and torch do.
        """
        dense = np.zeros(self.shape, dtype=self.values.dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        # Plain assignment would keep the last duplicate; add.at accumulates every one, but is
        # ~3x slower, so it is kept for rows whose columns are not strictly increasing (what
        # writers produce: scipy's sorted CSR, SageMaker's sorted keys) may hold duplicates.
        cols = self.indices
        same_row = rows[1:] == rows[:-1]
        if len(cols) > 1 and (cols[1:][same_row] <= cols[:-1][same_row]).any():
            np.add.at(dense, (rows, cols), self.values)
        else:
            dense[rows, cols] = self.values
        return dense

    def row_lengths(self) -> np.ndarray:
        """The number of stored values in each row (``int64``)."""
        return np.diff(self.indptr)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseBatch):
            return NotImplemented
        return (self.shape == other.shape and np.array_equal(self.indptr, other.indptr)
                and np.array_equal(self.indices, other.indices)
                and self.values.dtype == other.values.dtype
                and np.array_equal(self.values, other.values))

    __hash__ = None  # mutable arrays inside: not hashable

    def __reduce__(self):  # __slots__ classes pickle via their constructor (DataLoader workers)
        return (SparseBatch, (self.indptr, self.indices, self.values, self.shape))

    def __repr__(self) -> str:
        return (f"SparseBatch(shape={self.shape}, nnz={self.nnz}, dtype={self.values.dtype})")

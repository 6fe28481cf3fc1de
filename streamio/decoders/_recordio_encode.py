"""Writing for :mod:`streamio.decoders.recordio_protobuf`: ``encode_recordio_protobuf``."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

import numpy as np

from ..errors import UsageError, UsageTypeError
from ._recordio_parse import KIND_BYTES, KIND_FLOAT32, KIND_FLOAT64, KIND_INT32
from .wire import encode_packed_varints, encode_varint
from .sparse import SparseBatch

# --- writing ---------------------------------------------------------------------------------------

def _tensor_kind(dtype: np.dtype) -> int:
    if dtype == np.float32 or dtype == np.float16:
        return KIND_FLOAT32
    if dtype == np.float64:
        return KIND_FLOAT64
    if dtype.kind in "biu":
        return KIND_INT32
    if dtype.kind in "OS":
        return KIND_BYTES
    raise UsageTypeError(f"RecordIO-protobuf holds float32, float64, int32 or bytes, not {dtype}")


def _rows_of(data: Any, what: str) -> Tuple[str, Any, int]:
    """``("dense", 2-D array, rows)`` or ``("sparse", SparseBatch, rows)``."""
    if isinstance(data, SparseBatch):
        return "sparse", data, data.shape[0]
    if hasattr(data, "tocsr") and hasattr(data, "shape"):  # scipy.sparse, without importing it
        csr = data.tocsr()
        csr.sort_indices()
        return "sparse", SparseBatch(csr.indptr, csr.indices, np.asarray(csr.data), csr.shape), csr.shape[0]
    arr = np.asarray(data)
    if arr.dtype.kind == "U":
        raise UsageTypeError(f"{what}: str arrays are not supported; encode them to bytes")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise UsageError(f"{what} must be 1-D or 2-D (rows first), not of shape {arr.shape}")
    return "dense", arr, arr.shape[0]


def _as_int32(values: np.ndarray, what: str) -> np.ndarray:
    if values.dtype != np.int32 and values.size:
        if values.min() < -(2 ** 31) or values.max() > 2 ** 31 - 1:
            raise UsageError(f"{what}: integer values must fit in int32 (RecordIO-protobuf's"
                             " only integer type)")
    return values.astype(np.int32)


def _encode_values(values: np.ndarray, kind: int) -> bytes:
    if kind == KIND_FLOAT32:
        return values.astype("<f4").tobytes()
    if kind == KIND_FLOAT64:
        return values.astype("<f8").tobytes()
    return encode_packed_varints(values.astype(np.int64))  # int32: sign-extended varints


def _tensor_messages(data: Any, what: str) -> Tuple[List[bytes], int]:
    """One serialized ``Value`` per row of ``data``."""
    form, rows, n = _rows_of(data, what)
    kind = _tensor_kind(rows.dtype if form == "dense" else rows.values.dtype)
    tag = bytes([kind << 3 | 2])
    out: List[bytes] = []
    if form == "dense":
        if kind == KIND_BYTES:
            for row in rows:
                body = b"".join(_len_field(1, bytes(v)) for v in row)
                out.append(_len_field(kind, body))
            return out, n
        if kind == KIND_INT32:
            rows = _as_int32(rows, what)
        for row in rows:
            out.append(tag + _len_bytes(_len_field(1, _encode_values(row, kind))))
        return out, n
    if kind == KIND_BYTES:
        raise UsageTypeError(f"{what}: sparse bytes tensors are not supported")
    values = rows.values if kind != KIND_INT32 else _as_int32(rows.values, what)
    shape_field = _len_field(3, encode_packed_varints(np.array([rows.shape[1]])))
    for i in range(n):
        lo, hi = int(rows.indptr[i]), int(rows.indptr[i + 1])
        body = b""
        if hi > lo:
            body = (_len_field(1, _encode_values(values[lo:hi], kind))
                    + _len_field(2, encode_packed_varints(rows.indices[lo:hi])))
        out.append(tag + _len_bytes(body + shape_field))
    return out, n


def _len_bytes(payload: bytes) -> bytes:
    return encode_varint(len(payload)) + payload


def _len_field(field_number: int, payload: bytes) -> bytes:
    return encode_varint(field_number << 3 | 2) + encode_varint(len(payload)) + payload


def _section(data: Any, what: str) -> Tuple[List[List[bytes]], int]:
    """Serialized map entries (``key -> Value``) per row."""
    named = data.items() if isinstance(data, Mapping) else [("values", data)]
    per_row: Optional[List[List[bytes]]] = None
    rows = -1
    for key, tensor in named:
        if not isinstance(key, str):
            raise UsageTypeError(f"{what} keys must be str, not {key!r}")
        messages, n = _tensor_messages(tensor, f"{what}[{key!r}]")
        if per_row is None:
            per_row, rows = [[] for _ in range(n)], n
        elif n != rows:
            raise UsageError(f"{what}[{key!r}] has {n} rows, expected {rows}")
        key_field = _len_field(1, key.encode("utf-8"))
        for entries, message in zip(per_row, messages):
            entries.append(key_field + _len_field(2, message))
    if per_row is None:
        raise UsageError(f"{what} must hold at least one tensor")
    return per_row, rows


def encode_recordio_protobuf(features: Any, labels: Any = None) -> List[bytes]:
    """Serialize rows as ``aialgs.data.Record`` payloads (one per row), to frame as RecordIO.

    ``features``: a 2-D numpy array (one record per row: float32, float64, integer (stored as
    int32; values must fit) or bytes), a :class:`SparseBatch` or ``scipy.sparse`` matrix (sparse
    tensors with ``keys`` and ``shape=[columns]``), or a mapping ``{key: one of those}``; a bare
    array is stored under the key ``values``, as the SageMaker SDK does. ``labels``: the same, or
    ``None``; a 1-D array gives one label value per record.
    """
    feature_rows, n = _section(features, "features")
    label_rows: Optional[List[List[bytes]]] = None
    if labels is not None:
        label_rows, n_labels = _section(labels, "labels")
        if n_labels != n:
            raise UsageError(f"labels have {n_labels} rows but features have {n}")
    out = []
    for i in range(n):
        record = b"".join(_len_field(1, entry) for entry in feature_rows[i])
        if label_rows is not None:
            record += b"".join(_len_field(2, entry) for entry in label_rows[i])
        out.append(record)
    return out

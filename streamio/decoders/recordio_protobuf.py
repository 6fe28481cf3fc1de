"""SageMaker RecordIO-protobuf payloads (``aialgs.data.Record``) into numpy columns, and back.

Wire format (proto2, as Amazon's algorithms, the SageMaker SDK and ML-IO write it)::

    Record        { map<string, Value> features = 1; map<string, Value> label = 2;
                    optional string uid = 3; optional string metadata = 4;
                    optional string configuration = 5; }
    Value         { oneof value { Float32Tensor float32_tensor = 2; Float64Tensor float64_tensor = 3;
                                  Int32Tensor int32_tensor = 7; Bytes bytes = 9; } }
    Float32Tensor { repeated float values = 1 [packed]; repeated uint64 keys = 2 [packed];
                    repeated uint64 shape = 3 [packed]; }
    Float64Tensor, Int32Tensor: the same with double / int32 values.
    Bytes         { repeated bytes value = 1; optional string content_type = 2; }

A tensor is sparse when it has keys, or no values but a shape (an all-zero row); its row is
``shape`` flattened row-major, and ``keys`` index into it. RecordIO framing is the reader's job:
records here are the payloads.

As in :mod:`.example`, :func:`parse_recordio_protobuf` is the per-record reference parser (flat
arrays plus count matrices, replaceable by a C version) and :class:`RecordIOProtobuf` assembles
columns with whole-batch numpy operations.

The parts live in rooms of their own, re-exported here (this module is their public face):
``_recordio_parse`` (the reference parser, kinds and sections), ``_recordio_fast``
(``parse_recordio_protobuf_fast``, the vectorised path used where the C kernel of
streamio/_c/pb_recordio.c is not built) and ``_recordio_encode`` (``encode_recordio_protobuf``);
the decoder, :class:`RecordIOProtobuf`, is here.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import UsageError, UsageTypeError
from ._example_spec import FixedLen, VarLen
from ._recordio_encode import encode_recordio_protobuf
from ._recordio_fast import parse_recordio_protobuf_fast, record_tensors
from ._recordio_parse import (_KIND_DTYPES, _KIND_NAMES, _SECTION_NAMES, KIND_BYTES,  # noqa: F401
                              KIND_FLOAT32, KIND_FLOAT64, KIND_INT32, LABEL_PREFIX,
                              SECTION_FEATURES, SECTION_LABEL, _field_name, _Name,
                              parse_recordio_protobuf)
from .wire import _WireError
from .example import _Where
from .sparse import SparseBatch
from .spec import FieldSpec

try:  # the C kernel (streamio/_c/pb_recordio.c); tests/kernels/test_kernel_protobuf.py holds it to the reference
    from .._speedups import parse_recordio_protobuf as _c_parse_recordio_protobuf
except ImportError:  # pragma: no cover - depends on the build
    _c_parse_recordio_protobuf = None

__all__ = ["RecordIOProtobuf", "encode_recordio_protobuf", "parse_recordio_protobuf",
           "parse_recordio_protobuf_fast"]

# --- whole-batch assembly ------------------------------------------------------------------------

class _Column:
    """What the first record (or the user) fixed about one output."""

    __slots__ = ("name", "out", "kind", "spec", "sparse", "width", "shape")

    def __init__(self, name: _Name, kind: int, spec: Union[FixedLen, VarLen, None], sparse: bool,
                 width: int, shape: Tuple[int, ...]) -> None:
        self.name = name
        self.out = _field_name(name)
        self.kind = kind
        self.spec = spec
        self.sparse = sparse
        self.width = width  # dense: values per record; sparse: row width (prod(shape))
        self.shape = shape  # the first record's shape field (sparse: the row's shape)


def _check_names(value: Any, what: str) -> Optional[Dict[str, Optional[Union[FixedLen, VarLen]]]]:
    if value is None:
        return None
    if isinstance(value, str):
        raise UsageTypeError(f"{what} must be a sequence of keys or a mapping, not a str ({value!r});"
                        f" write [{value!r}]")
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        try:
            items = [(key, None) for key in value]
        except TypeError:
            raise UsageTypeError(f"{what} must be None, a sequence of keys or a mapping {{key: FixedLen |"
                            f" VarLen | None}}, not {type(value).__name__}") from None
    out: Dict[str, Optional[Union[FixedLen, VarLen]]] = {}
    for key, spec in items:
        if not isinstance(key, str):
            raise UsageTypeError(f"{what} keys must be str, not {key!r}")
        if spec is not None and not isinstance(spec, (FixedLen, VarLen)):
            raise UsageTypeError(f"{what}[{key!r}] must be FixedLen, VarLen or None, not {spec!r}")
        if isinstance(spec, FixedLen) and spec.allow_missing:
            raise UsageError(f"{what}[{key!r}]: allow_missing is for SequenceExample sequence"
                             " features; a RecordIO-protobuf tensor is always required")
        out[key] = spec
    return out


class RecordIOProtobuf:
    """Decode SageMaker RecordIO-protobuf payloads (``aialgs.data.Record``).

    ``features`` / ``label``: ``None`` takes every key of the first record the decoder sees;
    a sequence of keys takes those; a mapping ``{key: FixedLen | VarLen | None}`` also says how to
    decode each (``None``: as the first record has it). Output names: feature keys as they are
    (``values``), label keys prefixed ``label_`` (``label_values``), as ML-IO names them.

    A dense tensor gives a ``(B, n)`` array (``FixedLen(shape)``: ``(B, *shape)``; ``VarLen``:
    padded, plus ``<name>_len``); a sparse one (keys, or a shape and no values) a
    :class:`SparseBatch` of shape ``(B, prod(shape))`` (``FixedLen``: densified). The kind, dtype
    and length of each tensor are taken from the first record; a later record that differs, or
    lacks a tensor, raises :class:`~streamio.errors.DecodeError` naming the record and tensor.

    Stateful: the first record primes it. ``fresh()`` returns an unprimed copy for a new stream.
    """

    def __init__(self, features: Any = None, label: Any = None) -> None:
        self.features = _check_names(features, "features")
        self.label = _check_names(label, "label")
        self._columns: Optional[List[_Column]] = None
        self._names: Tuple[_Name, ...] = ()
        self._kinds: Tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"RecordIOProtobuf(features={self.features!r}, label={self.label!r})"

    def fresh(self) -> "RecordIOProtobuf":
        """An unprimed copy: it will take its schema from the next record it sees."""
        return RecordIOProtobuf(self.features, self.label)

    def reset(self) -> None:
        """Forget the schema taken from the first record."""
        self._columns = None
        self._names = ()
        self._kinds = ()

    def __getstate__(self) -> Dict[str, Any]:
        return {"features": self.features, "label": self.label, "columns": self._columns}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["features"], state["label"])
        if state["columns"] is not None:
            self._set_columns(state["columns"])

    def output_spec(self) -> Optional[Dict[str, FieldSpec]]:
        if self._columns is None:
            return None
        out: Dict[str, FieldSpec] = {}
        for col in self._columns:
            dtype = _KIND_DTYPES[col.kind]
            if col.spec is not None and col.spec.dtype != "bytes":
                dtype = np.dtype(col.spec.dtype)
            kind = "object" if col.kind == KIND_BYTES else "dense"
            if isinstance(col.spec, VarLen):
                out[col.out] = FieldSpec(kind, dtype, (None,))
                out[col.out + "_len"] = FieldSpec("dense", np.int64, ())
            elif isinstance(col.spec, FixedLen):
                out[col.out] = FieldSpec(kind, dtype, col.spec.shape)
            elif col.sparse:
                out[col.out] = FieldSpec("sparse", dtype, (col.width,))
            else:
                out[col.out] = FieldSpec(kind, dtype, (col.width,))
        return out

    # The schema ----------------------------------------------------------------------------

    def _set_columns(self, columns: List[_Column]) -> None:
        self._columns = columns
        self._names = tuple(col.name for col in columns)
        self._kinds = tuple(col.kind for col in columns)

    def _prime(self, record: bytes, where: _Where) -> None:
        try:
            tensors = record_tensors(record)
        except _WireError as exc:
            raise where.error(f"not a RecordIO-protobuf Record: {exc.message}", 0, None) from None
        # Label-only records are what Linear Learner and KMeans write as their output (scores,
        # closest cluster): read those. A record with no tensor at all is most likely some other
        # message that happens to parse as protobuf, so it is refused rather than read as empty.
        if not tensors and self.features is None and self.label is None:
            raise where.error("not a RecordIO-protobuf Record: it has no features and no label",
                              0, None)
        kinds = dict(tensors)
        wanted: List[Tuple[_Name, Optional[Union[FixedLen, VarLen]]]] = []
        for section, chosen in ((SECTION_FEATURES, self.features), (SECTION_LABEL, self.label)):
            if chosen is None:
                wanted.extend((name, None) for name, _ in tensors if name[0] == section)
            else:
                wanted.extend(((section, key.encode("utf-8")), spec) for key, spec in chosen.items())
        for name, _ in wanted:
            if name not in kinds:
                raise where.error(f"the first record has no {_SECTION_NAMES[name[0]]} tensor"
                                  f" {name[1].decode('utf-8', 'replace')!r}", 0, _field_name(name))
        names = tuple(name for name, _ in wanted)
        try:
            values, counts, keys, key_counts, shapes, shape_counts = parse_recordio_protobuf(
                [record], names, tuple(kinds[name] for name in names))
        except _WireError as exc:
            raise where.error(f"not a RecordIO-protobuf Record: {exc.message}", 0, exc.field) from None
        columns = []
        outs: Dict[str, _Name] = {}
        for j, (name, spec) in enumerate(wanted):
            kind = kinds[name]
            shape = tuple(int(d) for d in shapes[j])
            sparse = bool(key_counts[0, j] > 0 or (counts[0, j] == 0 and shape_counts[0, j] > 0))
            out = _field_name(name)
            if out in outs or out + "_len" in outs:
                raise where.error(f"two tensors would both be output as {out!r}", 0, out)
            outs[out] = name
            if shape:
                _check_dims(shape, where, out)
            if sparse:
                if not shape:
                    raise where.error("a sparse tensor (with keys) has no shape", 0, out)
                width = math.prod(shape)
                if isinstance(spec, VarLen):
                    raise where.error("VarLen is for dense tensors; this one is sparse", 0, out)
                if isinstance(spec, FixedLen) and spec.size != width:
                    raise where.error(f"FixedLen{spec.shape} has {spec.size} values but the"
                                      f" sparse tensor's shape {shape} has {width}", 0, out)
            else:
                width = int(counts[0, j])
                if shape and math.prod(shape) != width:
                    raise where.error(f"dense tensor has {width} values but its shape"
                                      f" {list(shape)} holds {math.prod(shape)}", 0, out)
            if spec is not None and (spec.dtype == "bytes") != (kind == KIND_BYTES):
                raise where.error(f"{spec!r} does not fit a {_KIND_NAMES[kind]}", 0, out)
            columns.append(_Column(name, kind, spec, sparse, width, shape))
        self._set_columns(columns)

    # Decoding ------------------------------------------------------------------------------

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, Union[np.ndarray, SparseBatch]]:
        where = _Where(source, first_index)
        if self._columns is None:
            if not len(records):
                return {}
            self._prime(records[0], where)
        try:
            parse = _c_parse_recordio_protobuf or parse_recordio_protobuf_fast
            values, counts, keys, key_counts, shapes, shape_counts = parse(
                records, self._names, self._kinds)
        except _WireError as exc:
            raise where.error(f"not a valid RecordIO-protobuf Record: {exc.message}",
                              exc.index, exc.field) from None
        out: Dict[str, Union[np.ndarray, SparseBatch]] = {}
        for j, col in enumerate(self._columns):  # type: ignore[union-attr]
            if (col.kind != KIND_BYTES and not col.sparse and col.spec is None and col.width
                    and not col.shape and not shape_counts[:, j].any()
                    and not key_counts[:, j].any() and (counts[:, j] == col.width).all()):
                # The common dense tensor (what write_numpy_to_dense_tensor writes): every row
                # present, unkeyed, shapeless, of the first record's length. The checks below
                # would all pass; three whole-batch operations say so instead of a dozen.
                out[col.out] = np.require(values[j].reshape(len(records), col.width),
                                          requirements="W")  # torch.from_numpy needs it
                continue
            missing = counts[:, j] < 0
            if missing.any():
                raise where.error(f"record lacks the {_SECTION_NAMES[col.name[0]]} tensor"
                                  f" {col.name[1].decode('utf-8', 'replace')!r}",
                                  int(np.argmax(missing)), col.out)
            if col.sparse and not isinstance(col.spec, FixedLen):
                batch = _plain_sparse_column(col, values[j], counts[:, j], keys[j],
                                             key_counts[:, j], shapes[j], shape_counts[:, j])
                if batch is not None:
                    out[col.out] = batch
                    continue
            _check_shapes(col, shapes[j], shape_counts[:, j], where)
            sparse_rows = (key_counts[:, j] > 0) | ((counts[:, j] == 0) & (shape_counts[:, j] > 0))
            if col.sparse:
                batch = _sparse_column(col, values[j], counts[:, j], keys[j], key_counts[:, j],
                                       sparse_rows, where)
                if isinstance(col.spec, FixedLen):
                    dense = batch.to_dense()
                    out[col.out] = _cast(dense, col, where).reshape((len(records),) + col.spec.shape)
                else:
                    out[col.out] = batch
                continue
            if sparse_rows.any():
                raise where.error("a sparse tensor where the first record has a dense one",
                                  int(np.argmax(sparse_rows)), col.out)
            flat = values[j]
            if col.kind == KIND_BYTES:
                arr = np.empty(len(flat), dtype=object)
                arr[:] = flat
                flat = arr
            if isinstance(col.spec, VarLen):
                lengths = counts[:, j]
                width = int(lengths.max()) if len(lengths) else 0
                padded = np.full((len(lengths), width), col.spec.pad_value,
                                 dtype=object if col.kind == KIND_BYTES else np.dtype(col.spec.dtype))
                padded[np.arange(width) < lengths[:, None]] = _cast(flat, col, where)
                out[col.out] = padded
                out[col.out + "_len"] = lengths
                continue
            wrong = counts[:, j] != col.width
            if wrong.any():
                i = int(np.argmax(wrong))
                raise where.error(f"tensor has {counts[i, j]} values where the first record has"
                                  f" {col.width}", i, col.out)
            shape = col.spec.shape if isinstance(col.spec, FixedLen) else (col.width,)
            if isinstance(col.spec, FixedLen) and col.spec.size != col.width:
                raise where.error(f"tensor has {col.width} values, {col.spec!r} needs"
                                  f" {col.spec.size}", 0, col.out)
            out[col.out] = np.require(_cast(flat, col, where).reshape((len(records),) + shape),
                                      requirements="W")  # writable: torch.from_numpy needs it
        return out


def _cast(values: np.ndarray, col: _Column, where: _Where) -> np.ndarray:
    if col.spec is None or col.spec.dtype == "bytes":
        return values
    target = np.dtype(col.spec.dtype)
    if target.kind == "i" and values.dtype.kind == "f" and len(values):
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            raise where.error(f"value {values.ravel()[np.argmax(bad.ravel())]} is not a whole"
                              f" number, {col.spec.dtype} requested", None, col.out)
    return values.astype(target, copy=False)


#: The widest row a sparse tensor may have: torch, scipy and numpy index with int64.
MAX_WIDTH = 2 ** 63 - 1


def _check_dims(shape: Tuple[int, ...], where: _Where, out: str) -> None:
    """A shape's dimensions are uint64 on the wire; a writer's negative int64 arrives as 2**64 - n.
    The row is ``prod(shape)`` wide and its keys index it, so that product must fit int64."""
    for d in shape:
        if d > MAX_WIDTH:
            raise where.error(f"tensor shape {list(shape)} has a negative or too large dimension"
                              f" ({d - 2 ** 64 if d >= 2 ** 63 else d})", 0, out)
    if math.prod(shape) > MAX_WIDTH:
        raise where.error(f"tensor shape {list(shape)} holds more than 2**63 - 1 values", 0, out)


def _check_shapes(col: _Column, shapes: np.ndarray, shape_counts: np.ndarray, where: _Where) -> None:
    """Every record that states a shape must state the first record's (when that one had one)."""
    if not col.shape or not shape_counts.any():
        return
    dims = len(col.shape)
    if (shape_counts[shape_counts > 0] == dims).all():
        stated = shapes.reshape(-1, dims)
        bad_stated = (stated != np.array(col.shape, dtype=np.uint64)).any(axis=1)
        if not bad_stated.any():
            return
        rows = np.flatnonzero(shape_counts > 0)
        i = int(rows[np.argmax(bad_stated)])
    else:
        i = int(np.argmax((shape_counts > 0) & (shape_counts != dims)))
    offsets = np.concatenate(([0], np.cumsum(shape_counts)))
    shape = tuple(int(d) for d in shapes[offsets[i]:offsets[i + 1]])
    raise where.error(f"tensor has shape {list(shape)} where the first record has"
                      f" {list(col.shape)}", i, col.out)


def _plain_sparse_column(col: _Column, values: np.ndarray, counts: np.ndarray, keys: np.ndarray,
                         key_counts: np.ndarray, shapes: np.ndarray, shape_counts: np.ndarray
                         ) -> Optional[SparseBatch]:
    """The batch of a sparse column in the common case, in a dozen whole-batch operations: every
    row keyed, with as many keys as values, each stating the first record's shape or none, every
    key inside the row. None for anything else: the general path then decodes it, or names the
    fault (the result is the same either way; this only spends fewer numpy calls per batch)."""
    if not len(counts) or counts.min() <= 0 or (key_counts != counts).any():
        return None
    if shape_counts.any():
        dims = len(col.shape)
        if shape_counts.min() != dims or shape_counts.max() != dims:
            return None
        if (shapes.reshape(-1, dims) != np.array(col.shape, dtype=np.uint64)).any():
            return None
    if keys.max() >= np.uint64(col.width):
        return None
    indptr = np.empty(len(counts) + 1, dtype=np.int64)
    indptr[0] = 0
    np.cumsum(counts, out=indptr[1:])
    # keys < width <= 2**63 - 1: the same bits read as int64
    # a sparse column has no spec here (VarLen is refused for it, FixedLen densifies): no cast
    return SparseBatch._checked(indptr, keys.view(np.int64), values, (len(counts), col.width))


def _sparse_column(col: _Column, values: np.ndarray, counts: np.ndarray, keys: np.ndarray,
                   key_counts: np.ndarray, sparse_rows: np.ndarray, where: _Where) -> SparseBatch:
    nrec = len(counts)
    keyed = key_counts > 0
    wrong = keyed & (key_counts != counts)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise where.error(f"sparse tensor has {key_counts[i]} keys but {counts[i]} values", i, col.out)
    dense_rows = ~sparse_rows  # rows written densely inside a sparse column: full rows only
    if dense_rows.any():
        wrong = dense_rows & (counts != col.width)
        if wrong.any():
            i = int(np.argmax(wrong))
            raise where.error(f"dense row of {counts[i]} values in a sparse tensor of width"
                              f" {col.width}", i, col.out)
    if len(keys) and keys.max() >= np.uint64(col.width):
        k = int(np.argmax(keys >= np.uint64(col.width)))
        i = int(np.searchsorted(np.cumsum(key_counts), k, "right"))
        raise where.error(f"sparse key {int(keys[k])} is outside the shape {list(col.shape)}", i, col.out)
    indptr = np.zeros(nrec + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if dense_rows.any():
        indices = np.empty(int(indptr[-1]), dtype=np.int64)
        dense_count = counts * dense_rows
        sparse_count = counts * ~dense_rows
        starts_dense = np.repeat(indptr[:-1], dense_count)
        within = np.arange(int(dense_count.sum())) - np.repeat(np.cumsum(dense_count) - dense_count,
                                                               dense_count)
        indices[starts_dense + within] = within
        starts_sparse = np.repeat(indptr[:-1], sparse_count)
        within = np.arange(int(sparse_count.sum())) - np.repeat(
            np.cumsum(sparse_count) - sparse_count, sparse_count)
        indices[starts_sparse + within] = keys.astype(np.int64)
    else:
        indices = keys.astype(np.int64)
    if col.kind == KIND_BYTES:
        raise where.error("sparse bytes tensors are not supported", int(np.argmax(sparse_rows)), col.out)
    if not isinstance(col.spec, FixedLen):  # a FixedLen spec casts after densifying
        values = _cast(values, col, where)
    return SparseBatch(indptr, indices, values, (nrec, col.width))

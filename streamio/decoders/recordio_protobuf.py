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
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._wire import (WireError, _skip_value, decode_packed_varints, encode_packed_varints,
                    encode_varint, read_len, read_varint)
from ._example_fast import _MIN_GROUP, SkeletonLayout, _merge, span_values, vectorisable_groups
from ._example_parse import _read_tag, map_entry
from ._example_spec import FixedLen, VarLen
from .example import _Where
from .sparse import SparseBatch
from .spec import FieldSpec
from ..errors import UsageError, UsageTypeError

try:  # the C kernel (streamio/_c/pb_recordio.c); tests/test_speedups.py holds it to the reference
    from .._speedups import parse_recordio_protobuf as _c_parse_recordio_protobuf
except ImportError:  # pragma: no cover - depends on the build
    _c_parse_recordio_protobuf = None

__all__ = ["RecordIOProtobuf", "encode_recordio_protobuf", "parse_recordio_protobuf",
           "parse_recordio_protobuf_fast"]

SECTION_FEATURES = 1
SECTION_LABEL = 2
_SECTION_NAMES = {SECTION_FEATURES: "features", SECTION_LABEL: "label"}
#: Labels are output as ``label_<key>``, as Amazon's ML-IO names them.
LABEL_PREFIX = "label_"

# Value.value field numbers, and the numpy dtype of each tensor's values.
KIND_FLOAT32 = 2
KIND_FLOAT64 = 3
KIND_INT32 = 7
KIND_BYTES = 9
_KIND_NAMES = {KIND_FLOAT32: "float32_tensor", KIND_FLOAT64: "float64_tensor",
               KIND_INT32: "int32_tensor", KIND_BYTES: "bytes"}
_KIND_DTYPES = {KIND_FLOAT32: np.dtype(np.float32), KIND_FLOAT64: np.dtype(np.float64),
                KIND_INT32: np.dtype(np.int32), KIND_BYTES: np.dtype(object)}
_VALUE_TAGS = {0x12: KIND_FLOAT32, 0x1A: KIND_FLOAT64, 0x3A: KIND_INT32, 0x4A: KIND_BYTES}

_Name = Tuple[int, bytes]  # (section, key)


# --- the reference wire parser ---------------------------------------------------------------

def _value_kind(buf: bytes, spans: List[Tuple[int, int]]) -> Tuple[int, List[Tuple[int, int]]]:
    """The oneof kind set last in a Value, and the spans of its (merged) tensor message."""
    kind = 0
    tensors: List[Tuple[int, int]] = []
    for pos, end in spans:
        while pos < end:
            tag, after = _read_tag(buf, pos, end)
            found = _VALUE_TAGS.get(tag)
            if found is not None:
                start, pos = read_len(buf, after, end)
                if found != kind:  # switching the oneof discards the earlier tensor
                    kind = found
                    tensors = [(start, pos)]
                else:
                    tensors.append((start, pos))
            else:
                pos = _skip_value(buf, tag, after, end, 0)
    return kind, tensors


_Spans = List[Tuple[int, int, bool]]  # (start, stop, single unpacked varint)


def _tensor_spans(buf: bytes, kind: int, tensors: List[Tuple[int, int]], values: _Spans,
                  keys: _Spans, shape: _Spans) -> None:
    """Append the spans of a tensor's values, keys and shape: fixed-width little-endian values
    (float, double), varint bytes (int32 values, keys, shape) or, for Bytes, the values."""
    for pos, end in tensors:
        while pos < end:
            tag, after = _read_tag(buf, pos, end)
            if tag == 0x0A:  # values (packed numbers, or one Bytes value)
                start, pos = read_len(buf, after, end)
                if kind == KIND_FLOAT32 and (pos - start) & 3:
                    raise WireError("packed float32 values are not a multiple of 4 bytes")
                if kind == KIND_FLOAT64 and (pos - start) & 7:
                    raise WireError("packed float64 values are not a multiple of 8 bytes")
                values.append((start, pos, False))
            elif kind == KIND_BYTES:
                pos = _skip_value(buf, tag, after, end, 0)  # content_type and unknown fields
            elif tag == 0x12:  # keys, packed
                start, pos = read_len(buf, after, end)
                keys.append((start, pos, False))
            elif tag == 0x1A:  # shape, packed
                start, pos = read_len(buf, after, end)
                shape.append((start, pos, False))
            elif tag == 0x0D and kind == KIND_FLOAT32:  # one unpacked float
                pos = after + 4
                if pos > end:
                    raise WireError("truncated float32 value")
                values.append((after, pos, False))
            elif tag == 0x09 and kind == KIND_FLOAT64:  # one unpacked double
                pos = after + 8
                if pos > end:
                    raise WireError("truncated float64 value")
                values.append((after, pos, False))
            elif tag == 0x08 and kind == KIND_INT32:  # one unpacked int32 varint
                pos = read_varint(buf, after, end)[1]
                values.append((after, pos, True))
            elif tag == 0x10:  # one unpacked key
                pos = read_varint(buf, after, end)[1]
                keys.append((after, pos, True))
            elif tag == 0x18:  # one unpacked shape dimension
                pos = read_varint(buf, after, end)[1]
                shape.append((after, pos, True))
            else:
                pos = _skip_value(buf, tag, after, end, 0)


class _Collected:
    __slots__ = ("values", "value_owner", "keys", "key_owner", "shape", "shape_owner", "present")

    def __init__(self) -> None:
        self.values: List[bytes] = []
        self.value_owner: List[int] = []
        self.keys: List[bytes] = []
        self.key_owner: List[int] = []
        self.shape: List[bytes] = []
        self.shape_owner: List[int] = []
        self.present: List[int] = []


def _record_values(buf: bytes, lookups: Tuple[Dict[bytes, int], Dict[bytes, int]],
                   every: Optional[List[Tuple[int, bytes, List[Tuple[int, int]]]]] = None
                   ) -> Dict[int, List[Tuple[int, int]]]:
    """Spans of the Value of each wanted tensor (the last entry for a key wins); ``every``, if
    given, gets ``(section, key, spans)`` of all entries."""
    found: Dict[int, List[Tuple[int, int]]] = {}
    pos, end = 0, len(buf)
    while pos < end:
        tag, after = _read_tag(buf, pos, end)
        if tag == 0x0A or tag == 0x12:  # an entry of the features (1) or label (2) map
            start, pos = read_len(buf, after, end)
            key, value = map_entry(buf, start, pos)
            j = lookups[tag >> 4].get(key)
            if j is not None:
                found[j] = value
            if every is not None:
                every.append((tag >> 3, key, value))
        else:
            pos = _skip_value(buf, tag, after, end, 0)
    return found


def _varints(pieces: List[bytes], owners: List[int], nrec: int) -> Tuple[np.ndarray, np.ndarray]:
    raw, per_piece = decode_packed_varints(pieces)
    counts = np.bincount(np.array(owners, dtype=np.int64), weights=per_piece,
                         minlength=nrec).astype(np.int64)
    return raw, counts


def parse_recordio_protobuf(records: Sequence[bytes], names: Tuple[_Name, ...],
                            kinds: Tuple[int, ...]):
    """Parse ``aialgs.data.Record`` payloads: the reference implementation.

    ``names[j]`` is ``(section, key)`` (section 1: features, 2: label; key as UTF-8 bytes) and
    ``kinds[j]`` the Value kind it must hold (2 float32, 3 float64, 7 int32, 9 bytes). Returns
    ``(values, counts, keys, key_counts, shapes, shape_counts)``: ``values[j]`` the flat values
    of tensor ``j`` over the batch (float32 / float64 / int32 array, or a list of ``bytes``),
    ``keys[j]`` and ``shapes[j]`` its flat keys and shape dimensions (``uint64``), and the three
    ``(B, F)`` int64 count matrices how many of each record ``i`` has (``counts`` is -1 where the
    record lacks the tensor). Raises :class:`WireError` (with batch ``index`` and ``field``).
    """
    nrec, nf = len(records), len(names)
    lookups: Tuple[Dict[bytes, int], Dict[bytes, int]] = ({}, {})
    for j, (section, key) in enumerate(names):
        lookups[section - 1][key] = j
    collected = [_Collected() for _ in range(nf)]
    for i, buf in enumerate(records):
        j = None
        try:
            for j, spans in _record_values(buf, lookups).items():
                kind, tensors = _value_kind(buf, spans)
                if kind == 0:  # an empty Value: treated as an absent one
                    continue
                if kind != kinds[j]:
                    raise WireError(f"holds a {_KIND_NAMES[kind]} where the first record has a"
                                    f" {_KIND_NAMES[kinds[j]]}")
                c = collected[j]
                value_spans: _Spans = []
                key_spans: _Spans = []
                shape_spans: _Spans = []
                _tensor_spans(buf, kind, tensors, value_spans, key_spans, shape_spans)
                for spans, pieces, owners in ((value_spans, c.values, c.value_owner),
                                              (key_spans, c.keys, c.key_owner),
                                              (shape_spans, c.shape, c.shape_owner)):
                    for start, stop, _ in spans:
                        pieces.append(buf[start:stop])
                        owners.append(i)
                c.present.append(i)
        except WireError as exc:
            raise WireError(exc.message, i, None if j is None else _field_name(names[j])) from None
    values: List[Union[np.ndarray, List[bytes]]] = []
    keys: List[np.ndarray] = []
    shapes: List[np.ndarray] = []
    counts = np.full((nrec, nf), -1, dtype=np.int64)
    key_counts = np.zeros((nrec, nf), dtype=np.int64)
    shape_counts = np.zeros((nrec, nf), dtype=np.int64)
    for j, c in enumerate(collected):
        kind = kinds[j]
        try:
            if kind == KIND_BYTES:
                flat: Any = c.values
                per_record = np.bincount(np.array(c.value_owner, dtype=np.int64), minlength=nrec)
            elif kind == KIND_INT32:
                raw, per_record = _varints(c.values, c.value_owner, nrec)
                # int32 varints are sign-extended to 64 bits; protobuf keeps the low 32.
                flat = raw.astype(np.uint32).view(np.int32)
            else:
                width = 4 if kind == KIND_FLOAT32 else 8
                flat = np.frombuffer(bytearray().join(c.values), dtype="<f%d" % width)
                flat = flat.astype(_KIND_DTYPES[kind], copy=False)
                sizes = np.fromiter(map(len, c.values), np.int64, len(c.values)) // width
                per_record = np.bincount(np.array(c.value_owner, dtype=np.int64), weights=sizes,
                                         minlength=nrec).astype(np.int64)
            key_flat, key_counts[:, j] = _varints(c.keys, c.key_owner, nrec)
            shape_flat, shape_counts[:, j] = _varints(c.shape, c.shape_owner, nrec)
        except WireError as exc:
            raise WireError(exc.message, _first_bad_owner(c, kind), _field_name(names[j])) from None
        rows = np.array(c.present, dtype=np.int64)
        counts[rows, j] = per_record[rows]
        values.append(flat)
        keys.append(key_flat)
        shapes.append(shape_flat)
    return values, counts, keys, key_counts, shapes, shape_counts


class _RecordLayout(SkeletonLayout):
    """The layout of an ``aialgs.data.Record`` for the tensors ``names`` (see
    :class:`~.example.SkeletonLayout`)."""

    __slots__ = ("tensors",)

    def __init__(self, buf: bytes, names: Tuple[_Name, ...], kinds: Tuple[int, ...]) -> None:
        lookups: Tuple[Dict[bytes, int], Dict[bytes, int]] = ({}, {})
        for j, (section, key) in enumerate(names):
            lookups[section - 1][key] = j
        every: List[Tuple[int, bytes, List[Tuple[int, int]]]] = []
        found = _record_values(buf, lookups, every)
        keep = np.ones(len(buf), dtype=bool)
        for _, _, spans in every:  # Values the parser does not read may differ between records
            for start, stop in spans:
                keep[start:stop] = False
        self.tensors: List[Optional[Tuple[int, _Spans, _Spans, _Spans]]] = [None] * len(names)
        varints: _Spans = []
        for j, spans in found.items():
            for start, stop in spans:
                keep[start:stop] = True
            kind, tensors = _value_kind(buf, spans)
            if kind == 0:
                continue
            if kind != kinds[j]:
                raise WireError("kind differs")  # the reference parser words the error
            values: _Spans = []
            keys: _Spans = []
            shape: _Spans = []
            _tensor_spans(buf, kind, tensors, values, keys, shape)
            for start, stop, _ in values + keys + shape:
                keep[start:stop] = False
            varints.extend(keys + shape + (values if kind == KIND_INT32 else []))
            self.tensors[j] = (kind, values, keys, shape)
        self._finish(buf, keep, varints)


_WIDTHS = {KIND_FLOAT32: 4, KIND_FLOAT64: 8, KIND_INT32: 0, KIND_BYTES: -1}


def _empty(kind: int) -> Union[np.ndarray, List[bytes]]:
    return [] if kind == KIND_BYTES else np.zeros(0, dtype=_KIND_DTYPES[kind])


def parse_recordio_protobuf_fast(records: Sequence[bytes], names: Tuple[_Name, ...],
                                 kinds: Tuple[int, ...]):
    """:func:`parse_recordio_protobuf` for whole batches: same arguments, results and errors.

    Groups of records that share one byte layout (dense tensors of a fixed length, written by
    one writer) are decoded by numpy from a byte matrix; the rest by the reference parser.
    """
    nrec, nf = len(records), len(names)
    if nrec < _MIN_GROUP:
        return parse_recordio_protobuf(records, names, kinds)
    # parts[stream][j]: (rows, flat, counts) for stream 0 values, 1 keys, 2 shapes
    parts: List[List[List[Tuple[np.ndarray, Any, np.ndarray]]]] = [[[] for _ in names] for _ in range(3)]
    leftover: List[np.ndarray] = []
    for rows, group, layout, matrix in vectorisable_groups(
            records, lambda record: _RecordLayout(record, names, kinds), leftover):
        try:
            found = []
            for j in range(nf):
                entry = layout.tensors[j]
                if entry is None:
                    absent = np.full(len(rows), -1, dtype=np.int64)
                    none = np.zeros(len(rows), dtype=np.int64)
                    found.append([(_empty(kinds[j]), absent), (np.zeros(0, np.uint64), none),
                                  (np.zeros(0, np.uint64), none)])
                    continue
                kind, values, keys, shape = entry
                flat, counts = span_values(matrix, group, values, _WIDTHS[kind])
                if kind == KIND_INT32:
                    flat = flat.astype(np.uint32).view(np.int32)
                elif kind != KIND_BYTES:
                    flat = flat.astype(_KIND_DTYPES[kind], copy=False)
                found.append([(flat, counts), span_values(matrix, group, keys, 0),
                              span_values(matrix, group, shape, 0)])
        except WireError:
            leftover.append(rows)
            continue
        for j, streams in enumerate(found):
            for stream, (flat, counts) in enumerate(streams):
                parts[stream][j].append((rows, flat, counts))
    if leftover:
        rest = np.sort(np.concatenate(leftover))
        try:
            values, counts, keys, key_counts, shapes, shape_counts = parse_recordio_protobuf(
                [records[i] for i in rest], names, kinds)
        except WireError as exc:
            raise WireError(exc.message, None if exc.index is None else int(rest[exc.index]),
                            exc.field) from None
        for j in range(nf):
            parts[0][j].append((rest, values[j], counts[:, j]))
            parts[1][j].append((rest, keys[j], key_counts[:, j]))
            parts[2][j].append((rest, shapes[j], shape_counts[:, j]))
    merged = []
    for stream in range(3):
        flats, count_matrix = [], np.zeros((nrec, nf), dtype=np.int64)
        for j in range(nf):
            empty = _empty(kinds[j]) if stream == 0 else np.zeros(0, np.uint64)
            if len(parts[stream][j]) == 1 and len(parts[stream][j][0][0]) == nrec:
                flat, count_matrix[:, j] = parts[stream][j][0][1], parts[stream][j][0][2]
            else:
                flat, count_matrix[:, j] = _merge(parts[stream][j], nrec, empty)
            flats.append(flat)
        if stream:  # keys and shapes: 0 for an absent tensor, as the reference gives
            np.maximum(count_matrix, 0, out=count_matrix)
        merged.extend((flats, count_matrix))
    return tuple(merged)


def _first_bad_owner(c: _Collected, kind: int) -> Optional[int]:
    """The first record whose varint pieces (int32 values, keys, shape) do not decode."""
    bad = []
    streams = [(c.keys, c.key_owner), (c.shape, c.shape_owner)]
    if kind == KIND_INT32:  # float and bytes values are not varints
        streams.insert(0, (c.values, c.value_owner))
    for pieces, owners in streams:
        for piece, owner in zip(pieces, owners):
            try:
                decode_packed_varints([piece])
            except WireError:
                bad.append(owner)
                break
    return min(bad) if bad else None


def _field_name(name: _Name) -> str:
    key = name[1].decode("utf-8", "replace")
    return LABEL_PREFIX + key if name[0] == SECTION_LABEL else key


def record_tensors(record: bytes) -> List[Tuple[_Name, int]]:
    """``((section, key), kind)`` of every tensor in one record, in order of first appearance
    (features first); a key given twice counts once, with its last Value."""
    every: List[Tuple[int, bytes, List[Tuple[int, int]]]] = []
    _record_values(record, ({}, {}), every)
    last: Dict[_Name, List[Tuple[int, int]]] = {}
    for section, key, spans in every:
        last[(section, key)] = spans
    out: List[Tuple[_Name, int]] = []
    for section in (SECTION_FEATURES, SECTION_LABEL):
        for name, spans in last.items():
            if name[0] == section:
                kind, _ = _value_kind(record, spans)
                if kind:
                    out.append((name, kind))
    return out


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
        except WireError as exc:
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
        except WireError as exc:
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
        except WireError as exc:
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

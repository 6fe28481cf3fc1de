"""The reference parser of :mod:`streamio.decoders.recordio_protobuf`
(``parse_recordio_protobuf``): per record, flat arrays plus count matrices; the C kernel
(streamio/_c/pb_recordio.c) has the same signature and results, errors included."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._example_parse import _read_tag, map_entry
from .wire import _WireError, _skip_value, decode_packed_varints, read_len, read_varint


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
                    raise _WireError("packed float32 values are not a multiple of 4 bytes")
                if kind == KIND_FLOAT64 and (pos - start) & 7:
                    raise _WireError("packed float64 values are not a multiple of 8 bytes")
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
                    raise _WireError("truncated float32 value")
                values.append((after, pos, False))
            elif tag == 0x09 and kind == KIND_FLOAT64:  # one unpacked double
                pos = after + 8
                if pos > end:
                    raise _WireError("truncated float64 value")
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
    record lacks the tensor). Raises :class:`_WireError` (with batch ``index`` and ``field``).
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
                    raise _WireError(f"holds a {_KIND_NAMES[kind]} where the first record has a"
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
        except _WireError as exc:
            raise _WireError(exc.message, i, None if j is None else _field_name(names[j])) from None
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
        except _WireError as exc:
            raise _WireError(exc.message, _first_bad_owner(c, kind), _field_name(names[j])) from None
        rows = np.array(c.present, dtype=np.int64)
        counts[rows, j] = per_record[rows]
        values.append(flat)
        keys.append(key_flat)
        shapes.append(shape_flat)
    return values, counts, keys, key_counts, shapes, shape_counts


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
            except _WireError:
                bad.append(owner)
                break
    return min(bad) if bad else None


def _field_name(name: _Name) -> str:
    key = name[1].decode("utf-8", "replace")
    return LABEL_PREFIX + key if name[0] == SECTION_LABEL else key

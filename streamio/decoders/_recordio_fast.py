"""The vectorised path of :mod:`streamio.decoders.recordio_protobuf`
(``parse_recordio_protobuf_fast``): records that share one layout decoded by numpy a group at a
time, the others by the reference parser; used where the C kernel is not built."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._example_fast import _MIN_GROUP, SkeletonLayout, _merge, span_values, vectorisable_groups
from ._recordio_parse import (_KIND_DTYPES, KIND_BYTES, KIND_FLOAT32, KIND_FLOAT64, KIND_INT32,
                              SECTION_FEATURES, SECTION_LABEL, _Name, _record_values, _Spans,
                              _tensor_spans, _value_kind, parse_recordio_protobuf)
from .wire import _WireError

# --- the vectorised path: records that share one layout -------------------------------------

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
                raise _WireError("kind differs")  # the reference parser words the error
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
        except _WireError:
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
        except _WireError as exc:
            raise _WireError(exc.message, None if exc.index is None else int(rest[exc.index]),
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

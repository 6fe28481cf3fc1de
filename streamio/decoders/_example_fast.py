"""The vectorised path of :mod:`streamio.decoders.example` (``parse_examples_fast``): the records
of a batch that share one layout decoded by numpy a group at a time, the others by the reference
parser; used where the C kernel is not built."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._example_parse import (_check_kind, _feature_kind, _list_spans, _map_entries, _top_level,
                             parse_examples)
from ._example_spec import KIND_BYTES, KIND_FLOAT, KIND_INT64
from .wire import _WireError, decode_packed_varints


# --- the vectorised path: a batch of records that share one layout -------------------------------

# A group of records of one length is decoded by numpy only if it has at least this many records;
# below it, the fixed numpy cost per group (~50 us) exceeds what the reference parser spends on
# them (~5 us a record).
_MIN_GROUP = 16


class SkeletonLayout:
    """Where the values sit in one record, and which bytes are protobuf structure.

    Structure (tags, lengths, keys, bytes the parser never reads) is the *skeleton*; value bytes
    are not. Any record of the same length whose skeleton bytes are equal parses to the same
    structure, so its values can be cut out of a ``(records, length)`` byte matrix at the same
    columns: no per-record Python work. Only varint value bytes need checking per record,
    because a varint's length depends on its bytes: each varint span must end at its last byte,
    and a single (unpacked) varint must not end earlier.
    """

    __slots__ = ("skeleton_idx", "skeleton", "varint_last", "varint_inner")

    def _finish(self, buf: bytes, keep: np.ndarray, varint_spans: List[Tuple[int, int, bool]]) -> None:
        last: List[int] = []
        inner: List[int] = []
        for start, stop, single in varint_spans:
            if stop > start:
                last.append(stop - 1)
                if single:
                    inner.extend(range(start, stop - 1))
        self.skeleton_idx = np.flatnonzero(keep)
        self.skeleton = np.frombuffer(buf, dtype=np.uint8)[self.skeleton_idx]
        self.varint_last = np.array(last, dtype=np.int64)
        self.varint_inner = np.array(inner, dtype=np.int64)

    def matching_rows(self, matrix: np.ndarray) -> np.ndarray:
        """Which rows of a ``(records, length)`` byte matrix have this layout (bool)."""
        ok = (matrix[:, self.skeleton_idx] == self.skeleton).all(axis=1)
        if len(self.varint_last):
            ok &= (matrix[:, self.varint_last] < 0x80).all(axis=1)
        if len(self.varint_inner):
            ok &= (matrix[:, self.varint_inner] >= 0x80).all(axis=1)
        return ok


class _Layout(SkeletonLayout):
    """The layout of a tf.train.Example for the features ``names``."""

    __slots__ = ("features",)

    def __init__(self, buf: bytes, names: Tuple[bytes, ...], kinds: Tuple[int, ...]) -> None:
        lookup = {name: j for j, name in enumerate(names)}
        found: Dict[int, List[Tuple[int, int]]] = {}
        every: List[Tuple[int, int]] = []
        _map_entries(buf, _top_level(buf, len(buf), (0x0A,))[0], lookup, found, every)
        keep = np.ones(len(buf), dtype=bool)
        # The reference parser never looks inside the Feature of a key it was not asked for, or
        # of a key that a later entry replaces: those bytes may differ between records.
        for start, stop in every:
            keep[start:stop] = False
        self.features: List[Optional[Tuple[int, List[Tuple[int, int, bool]]]]] = [None] * len(names)
        varints: List[Tuple[int, int, bool]] = []
        for j, spans in found.items():
            for start, stop in spans:
                keep[start:stop] = True
            kind, lists = _feature_kind(buf, spans)
            if kind == 0:
                continue
            _check_kind(kind, kinds[j])
            values = _list_spans(buf, kind, lists)
            for start, stop, _ in values:
                keep[start:stop] = False
            if kind == KIND_INT64:
                varints.extend(values)
            self.features[j] = (kind, values)
        self._finish(buf, keep, varints)


def vectorisable_groups(records: Sequence[bytes], build: Any, leftover: List[np.ndarray]):
    """Yield ``(rows, group records, layout, byte matrix)`` for each group of records of one
    length that share the layout ``build(first record)`` finds; rows that do not (a small group,
    another layout, a record ``build`` rejects) are appended to ``leftover``."""
    nrec = len(records)
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=nrec)
    if (lengths == lengths[0]).all():
        groups = [np.arange(nrec)]
    else:
        order = np.argsort(lengths, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1)
        if sum(len(g) for g in groups if len(g) >= _MIN_GROUP) * 2 < nrec:
            # Mostly small groups (variable-length features): the reference parser is faster.
            leftover.append(np.arange(nrec))
            return
    for rows in groups:
        if len(rows) < _MIN_GROUP:
            leftover.append(rows)
            continue
        group = [records[i] for i in rows] if len(rows) != nrec else list(records)
        try:
            layout = build(group[0])
        except _WireError:
            leftover.append(rows)
            continue
        matrix = np.frombuffer(b"".join(group), dtype=np.uint8).reshape(len(rows), -1)
        ok = layout.matching_rows(matrix)
        if not ok.all():
            leftover.append(rows[~ok])
            rows = rows[ok]
            matrix = matrix[ok]
            group = [rec for rec, good in zip(group, ok.tolist()) if good]
        yield rows, group, layout, matrix


def _span_columns(spans: List[Tuple[int, int, bool]]) -> Union[slice, np.ndarray]:
    if len(spans) == 1:
        return slice(spans[0][0], spans[0][1])
    if not spans:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(start, stop) for start, stop, _ in spans])


def span_values(matrix: np.ndarray, group: List[bytes], spans: List[Tuple[int, int, bool]],
                width: int) -> Tuple[Union[np.ndarray, List[bytes]], np.ndarray]:
    """Values at ``spans`` of every row: ``width`` 4 / 8 little-endian floats, 0 varints (as
    uint64), -1 bytes values. Returns ``(flat values, count per row)``."""
    rows = len(matrix)
    if width < 0:
        return ([rec[start:stop] for rec in group for start, stop, _ in spans],
                np.full(rows, len(spans), dtype=np.int64))
    cols = matrix[:, _span_columns(spans)]
    if width:
        flat = np.ascontiguousarray(cols).view("<f%d" % width).ravel()
        return flat, np.full(rows, cols.shape[1] // width, dtype=np.int64)
    last = cols < 0x80
    if last.all():  # one-byte varints
        return cols.astype(np.uint64).ravel(), np.full(rows, cols.shape[1], dtype=np.int64)
    raw, _ = decode_packed_varints([np.ascontiguousarray(cols).tobytes()])
    return raw, last.sum(axis=1).astype(np.int64)


def _group_values(layout: _Layout, j: int, matrix: np.ndarray, group: List[bytes]
                  ) -> Tuple[Optional[Union[np.ndarray, List[bytes]]], np.ndarray]:
    """Flat values and per-record counts of feature ``j`` for records sharing ``layout``."""
    entry = layout.features[j]
    if entry is None:
        return None, np.full(len(matrix), -1, dtype=np.int64)  # absent: typed by the caller
    kind, spans = entry
    if kind == KIND_BYTES:
        return span_values(matrix, group, spans, -1)
    if kind == KIND_FLOAT:
        flat, counts = span_values(matrix, group, spans, 4)
        return flat.astype(np.float32, copy=False), counts
    flat, counts = span_values(matrix, group, spans, 0)
    return flat.view(np.int64), counts


def _empty_values(kind: int) -> Union[np.ndarray, List[bytes]]:
    if kind == KIND_FLOAT:
        return np.zeros(0, dtype=np.float32)
    if kind == KIND_INT64:
        return np.zeros(0, dtype=np.int64)
    return []


def _merge(parts: List[Tuple[np.ndarray, Union[np.ndarray, List[bytes]], np.ndarray]], nrec: int,
           empty: Union[np.ndarray, List[bytes]]) -> Tuple[Union[np.ndarray, List[bytes]], np.ndarray]:
    """Join per-group ``(rows, flat values, counts)`` into record order (``empty``: an empty
    array of the values' dtype, or a list for bytes values)."""
    counts = np.full(nrec, -1, dtype=np.int64)
    for rows, _, cnt in parts:
        counts[rows] = cnt
    sizes = np.maximum(counts, 0)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    total = int(offsets[-1])
    if isinstance(empty, list):
        out_list: List[bytes] = [b""] * total
        for rows, flat, cnt in parts:
            dest = _destinations(offsets, rows, np.maximum(cnt, 0))
            for d, value in zip(dest.tolist(), flat):
                out_list[d] = value
        return out_list, counts
    out = np.empty(total, dtype=empty.dtype)
    for rows, flat, cnt in parts:
        out[_destinations(offsets, rows, np.maximum(cnt, 0))] = flat
    return out, counts


def _destinations(offsets: np.ndarray, rows: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    starts = np.repeat(offsets[rows], cnt)
    within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return starts + within


def parse_examples_fast(records: Sequence[bytes], names: Tuple[bytes, ...], kinds: Tuple[int, ...]
                        ) -> Tuple[List[Union[np.ndarray, List[bytes]]], np.ndarray]:
    """:func:`parse_examples` for whole batches: same arguments, same results, same errors.

    Records are grouped by length; a group whose records share the byte layout of its first
    record (the usual case: one writer, one schema, fixed-size features) is decoded by numpy
    from a ``(records, length)`` byte matrix. Records that do not fit go through
    :func:`parse_examples`.
    """
    nrec = len(records)
    if nrec < _MIN_GROUP:
        return parse_examples(records, names, kinds)
    parts: List[List[Tuple[np.ndarray, Any, np.ndarray]]] = [[] for _ in names]
    leftover: List[np.ndarray] = []
    groups = 0
    for rows, group, layout, matrix in vectorisable_groups(
            records, lambda record: _Layout(record, names, kinds), leftover):
        try:
            found = [_group_values(layout, j, matrix, group) for j in range(len(names))]
        except _WireError:  # a varint over 10 bytes: let the reference parser name the record
            leftover.append(rows)
            continue
        groups += 1
        for j, (flat, cnt) in enumerate(found):
            parts[j].append((rows, _empty_values(kinds[j]) if flat is None else flat, cnt))
    if leftover:
        rest = np.sort(np.concatenate(leftover))
        try:
            values, counts = parse_examples([records[i] for i in rest], names, kinds)
        except _WireError as exc:
            raise _WireError(exc.message, None if exc.index is None else int(rest[exc.index]),
                            exc.field) from None
        for j in range(len(names)):
            parts[j].append((rest, values[j], counts[:, j]))
    if groups == 1 and not leftover:
        counts = np.stack([p[0][2] for p in parts], axis=1) if parts else np.zeros((nrec, 0), np.int64)
        return [p[0][1] for p in parts], counts
    values = []
    counts = np.empty((nrec, len(names)), dtype=np.int64)
    for j in range(len(names)):
        values_j, counts[:, j] = _merge(parts[j], nrec, _empty_values(kinds[j]))
        values.append(values_j)
    return values, counts

"""``tf.train.Example`` and ``tf.train.SequenceExample`` records into numpy columns, without TF.

Wire format (tensorflow/core/example/example.proto, feature.proto; proto3)::

    Example         { Features features = 1; }
    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
    Features        { map<string, Feature> feature = 1; }
    FeatureLists    { map<string, FeatureList> feature_list = 1; }
    FeatureList     { repeated Feature feature = 1; }
    Feature         { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }   FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

Decoding is split in two so that the per-record part stays small and replaceable:

* :func:`parse_examples` / :func:`parse_sequence_examples` are the *reference* wire parsers:
  pure functions from a batch of records to flat value arrays plus a ``counts`` matrix. They are
  the only per-record Python code, and a C version can replace them with the same signature.
* :class:`Example` / :class:`SequenceExample` turn those flat arrays into ``FixedLen`` and
  ``VarLen`` columns with whole-batch numpy operations (reshape, defaults, padding).

Protobuf semantics kept (so that results equal ``tf.io.parse_example`` and any protobuf parser):
the last map entry for a key wins; a message field that occurs twice is merged (parsed as the
concatenation of its occurrences); the ``oneof`` keeps the kind set last; packed and unpacked
encodings of a repeated field are both accepted; unknown fields are skipped.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DecodeError
from ..errors import UsageError, UsageTypeError
from .image import Image
from ._wire import (WireError, _skip_value, decode_packed_varints, encode_packed_varints,
                    len_field, read_len, read_varint)
from .sparse import SparseBatch
from .spec import FieldSpec

try:  # the C kernel (streamio/_c/protobuf.c); tests/test_speedups.py holds it to parse_examples
    from .._speedups import parse_examples as _c_parse_examples
except ImportError:  # pragma: no cover - depends on the build
    _c_parse_examples = None
try:  # the same file; tests/test_speedups.py holds it to parse_sequence_examples
    from .._speedups import parse_sequence_examples as _c_parse_sequence_examples
except ImportError:  # pragma: no cover - depends on the build (or an older one)
    _c_parse_sequence_examples = None

__all__ = [
    "Example",
    "FixedLen",
    "encode_example",
    "SequenceExample",
    "VarLen",
    "parse_examples",
    "parse_sequence_examples",
]

# Feature.kind field numbers; parse functions take and report kinds as these numbers.
KIND_BYTES = 1
KIND_FLOAT = 2
KIND_INT64 = 3
_KIND_NAMES = {0: "no value list", KIND_BYTES: "bytes_list", KIND_FLOAT: "float_list",
               KIND_INT64: "int64_list"}

# dtype name -> (wire kind it is read from, numpy dtype of the output)
_DTYPES: Dict[str, Tuple[int, Any]] = {
    "float32": (KIND_FLOAT, np.float32),
    "float64": (KIND_FLOAT, np.float64),
    "int64": (KIND_INT64, np.int64),
    "int32": (KIND_INT64, np.int32),
    "bytes": (KIND_BYTES, object),
}
_INT32_RANGE = (-(2 ** 31), 2 ** 31 - 1)

DEFAULT_PAD_VALUE = 0


def _dtype_name(dtype: Any) -> str:
    if dtype is bytes or dtype == "string":  # tf.string users write "string"
        return "bytes"
    if isinstance(dtype, str) and dtype in _DTYPES:
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name in _DTYPES:
        return name
    raise UsageError(f"dtype must be one of {sorted(_DTYPES)}, not {dtype!r}")


class FixedLen:
    """A feature with a fixed number of values per example, decoded to ``(B, *shape)``.

    ``dtype``: ``"float32"`` / ``"int64"`` / ``"bytes"`` (the three Example value lists), or
    ``"float64"`` / ``"int32"`` to cast (int32 values out of range are an error, not a wrap).
    ``bytes`` gives an object array of ``bytes``. ``default`` (a scalar, broadcast, or an array of
    ``shape``) fills examples that lack the feature; without one a missing feature is a
    :class:`~streamio.errors.DecodeError` naming the record.

    As a :class:`SequenceExample` *sequence* feature it plays TF's ``FixedLenSequenceFeature``:
    ``default`` pads the steps, and an absent feature list raises "... is required", unless
    ``allow_missing=True`` (as in TF), which reads it as 0 steps. ``allow_missing`` means nothing
    elsewhere and is refused there.
    """

    __slots__ = ("shape", "dtype", "default", "allow_missing")

    def __init__(self, shape: Union[int, Sequence[int]], dtype: Any, default: Any = None, *,
                 allow_missing: bool = False) -> None:
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        try:
            shape = tuple(int(d) for d in shape)
        except TypeError:
            raise UsageTypeError(f"shape must be an int or a sequence of ints, not {shape!r}") from None
        if any(d < 0 for d in shape):
            raise UsageError(f"shape must not have negative dimensions: {shape}")
        self.shape: Tuple[int, ...] = shape
        self.dtype: str = _dtype_name(dtype)
        self.default: Optional[np.ndarray] = (None if default is None
                                              else _as_default(default, self.dtype, shape))
        if not isinstance(allow_missing, bool):
            raise UsageTypeError(f"allow_missing must be True or False, not {allow_missing!r}")
        self.allow_missing: bool = allow_missing

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        default = "" if self.default is None else f", default={self.default.tolist()!r}"
        missing = ", allow_missing=True" if self.allow_missing else ""
        return f"FixedLen({self.shape}, {self.dtype!r}{default}{missing})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FixedLen) and (self.shape, self.dtype) == (other.shape, other.dtype)
                and _same_default(self.default, other.default)
                and self.allow_missing == other.allow_missing)

    __hash__ = None

    def __reduce__(self):
        return (_fixed_len, (self.shape, self.dtype, self.default, self.allow_missing))


class VarLen:
    """A feature with any number of values: ``batch[name]`` is ``(B, longest in the batch)``,
    padded with ``pad_value``, and ``batch[name + "_len"]`` the lengths (``int64``).

    For ``dtype="bytes"`` a ``pad_value`` of 0 means ``b""``.
    """

    __slots__ = ("dtype", "pad_value")

    def __init__(self, dtype: Any, pad_value: Any = DEFAULT_PAD_VALUE) -> None:
        self.dtype: str = _dtype_name(dtype)
        if self.dtype == "bytes" and isinstance(pad_value, int) and pad_value == 0:
            pad_value = b""
        self.pad_value = _as_default(pad_value, self.dtype, ()).item()

    def __repr__(self) -> str:
        return f"VarLen({self.dtype!r}, pad_value={self.pad_value!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, VarLen) and self.dtype == other.dtype
                and _same_default(np.asarray(self.pad_value), np.asarray(other.pad_value)))

    __hash__ = None

    def __reduce__(self):
        return (VarLen, (self.dtype, self.pad_value))


def _fixed_len(shape: Tuple[int, ...], dtype: str, default: Any, allow_missing: bool) -> FixedLen:
    return FixedLen(shape, dtype, default, allow_missing=allow_missing)  # keyword-only: unpickle


def _same_default(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.all((a == b) | ((a != a) & (b != b))))


def _as_default(value: Any, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    """``value`` as an array of ``shape`` and ``dtype``; ValueError/TypeError if it cannot be."""
    if dtype == "bytes":
        arr = np.asarray(value, dtype=object)
        flat = arr.ravel()
        for k, item in enumerate(flat):
            if isinstance(item, str):
                flat[k] = item.encode("utf-8")
            elif not isinstance(item, bytes):
                raise UsageTypeError(f"a bytes default must hold bytes or str, not {item!r}")
        arr = flat.reshape(arr.shape)
    else:
        target = _DTYPES[dtype][1]
        try:
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise UsageTypeError(f"a {dtype} default must be numeric, not {value!r}")
            if target in (np.int32, np.int64) and arr.dtype.kind == "f":
                if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                    raise UsageError(f"a {dtype} default must hold whole numbers, not {value!r}")
            info = np.iinfo(target) if target in (np.int32, np.int64) else None
            if info is not None and arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise UsageError(f"default {value!r} does not fit in {dtype}")
            arr = arr.astype(target)
        except (OverflowError, ValueError) as exc:
            raise UsageError(f"default {value!r} is not a valid {dtype} value: {exc}") from None
    try:
        return np.array(np.broadcast_to(arr, shape))
    except ValueError:
        raise UsageError(f"default of shape {arr.shape} does not fit the feature shape {shape}") from None


# --- the reference wire parsers --------------------------------------------------------------

def _read_tag(buf: bytes, pos: int, end: int) -> Tuple[int, int]:
    tag = buf[pos]
    if tag < 0x80:
        return tag, pos + 1
    return read_varint(buf, pos, end)


def _map_entries(buf: bytes, spans: List[Tuple[int, int]], lookup: Mapping[bytes, int],
                 found: Dict[int, List[Tuple[int, int]]],
                 every: Optional[List[Tuple[int, int]]] = None) -> None:
    """Walk ``map<string, Message> = 1`` entries (a Features or FeatureLists message).

    ``found[j]`` gets the spans of the value of the last entry whose key is ``names[j]``: a later
    entry replaces an earlier one, and a value that occurs twice within one entry is merged
    (kept as two spans, parsed as one). ``every``, if given, gets the value spans of all entries.
    """
    for pos, end in spans:
        while pos < end:
            tag, after = _read_tag(buf, pos, end)
            if tag != 0x0A:  # field 1, length-delimited: a map entry
                pos = _skip_value(buf, tag, after, end, 0)
                continue
            start, pos = read_len(buf, after, end)
            key, value = map_entry(buf, start, pos)
            j = lookup.get(key)
            if j is not None:
                found[j] = value
            if every is not None:
                every.extend(value)


def map_entry(buf: bytes, pos: int, end: int) -> Tuple[bytes, List[Tuple[int, int]]]:
    """``(key, value spans)`` of one ``map<string, Message>`` entry: ``{key = 1; value = 2}``."""
    key = b""
    value: List[Tuple[int, int]] = []
    while pos < end:
        tag, after = _read_tag(buf, pos, end)
        if tag == 0x0A:  # key
            start, pos = read_len(buf, after, end)
            key = buf[start:pos]
        elif tag == 0x12:  # value
            start, pos = read_len(buf, after, end)
            value.append((start, pos))
        else:
            pos = _skip_value(buf, tag, after, end, 0)
    return key, value


def _top_level(buf: bytes, end: int, wanted: Tuple[int, ...]) -> List[List[Tuple[int, int]]]:
    """Spans of each length-delimited top-level field in ``wanted`` (tags), in order."""
    spans: List[List[Tuple[int, int]]] = [[] for _ in wanted]
    pos = 0
    while pos < end:
        tag, after = _read_tag(buf, pos, end)
        if tag in wanted:
            start, pos = read_len(buf, after, end)
            spans[wanted.index(tag)].append((start, pos))
        else:
            pos = _skip_value(buf, tag, after, end, 0)
    return spans


def _feature_kind(buf: bytes, spans: List[Tuple[int, int]]) -> Tuple[int, List[Tuple[int, int]]]:
    """The oneof kind set last in a Feature, and the spans of its (merged) value list."""
    kind = 0
    lists: List[Tuple[int, int]] = []
    for pos, end in spans:
        while pos < end:
            tag, after = _read_tag(buf, pos, end)
            if tag == 0x0A or tag == 0x12 or tag == 0x1A:
                start, pos = read_len(buf, after, end)
                if tag >> 3 != kind:  # switching the oneof discards the earlier list
                    kind = tag >> 3
                    lists = [(start, pos)]
                else:
                    lists.append((start, pos))
            else:
                pos = _skip_value(buf, tag, after, end, 0)
    return kind, lists


def _list_spans(buf: bytes, kind: int, lists: List[Tuple[int, int]]) -> List[Tuple[int, int, bool]]:
    """``(start, stop, single_varint)`` of the value bytes of a BytesList / FloatList / Int64List.

    Float spans are little-endian float32 bytes (a packed payload or one unpacked value), int64
    spans are varint bytes (a packed payload, or one unpacked varint: ``single_varint``), bytes
    spans are the values themselves.
    """
    spans: List[Tuple[int, int, bool]] = []
    for pos, end in lists:
        while pos < end:
            tag, after = _read_tag(buf, pos, end)
            if tag == 0x0A:  # value, length-delimited: packed numbers or one bytes value
                start, pos = read_len(buf, after, end)
                if kind == KIND_FLOAT and (pos - start) & 3:
                    raise WireError("packed float list is not a multiple of 4 bytes")
                spans.append((start, pos, False))
            elif tag == 0x0D and kind == KIND_FLOAT:  # one unpacked float (fixed32)
                pos = after + 4
                if pos > end:
                    raise WireError("truncated float")
                spans.append((after, pos, False))
            elif tag == 0x08 and kind == KIND_INT64:  # one unpacked int64 (varint)
                pos = read_varint(buf, after, end)[1]
                spans.append((after, pos, True))
            else:
                pos = _skip_value(buf, tag, after, end, 0)
    return spans


def _list_values(buf: bytes, kind: int, lists: List[Tuple[int, int]], pieces: List[bytes],
                 owners: List[int], owner: int) -> None:
    """Append the value bytes of a value list to ``pieces`` (see :func:`_list_spans`); int64
    pieces stay varint bytes, decoded for the whole batch at once."""
    for start, stop, _ in _list_spans(buf, kind, lists):
        pieces.append(buf[start:stop])
        owners.append(owner)


def _finish_values(kind: int, pieces: List[bytes], owners: List[int], n_owners: int
                   ) -> Tuple[Union[np.ndarray, List[bytes]], np.ndarray]:
    """Convert collected pieces to ``(flat values, count per owner)`` in one numpy step."""
    owner_arr = np.array(owners, dtype=np.int64)
    if kind == KIND_FLOAT:
        # bytearray.join: one copy, and the array numpy wraps around it is writable.
        values: Any = np.frombuffer(bytearray().join(pieces), dtype="<f4").astype(np.float32, copy=False)
        per_piece = np.fromiter(map(len, pieces), np.int64, len(pieces)) >> 2
    elif kind == KIND_INT64:
        raw, per_piece = decode_packed_varints(pieces)
        values = raw.view(np.int64)
    else:
        values = pieces
        per_piece = np.ones(len(pieces), np.int64)
    counts = np.bincount(owner_arr, weights=per_piece, minlength=n_owners).astype(np.int64)
    return values, counts


def _check_kind(kind: int, want: int) -> None:
    # An empty Feature (no list set) in a sequence step is a step with zero values, as in
    # tf.io.parse_sequence_example.
    if kind != want and kind != 0:
        raise WireError(f"feature holds a {_KIND_NAMES[kind]}, expected a {_KIND_NAMES[want]}")


def _feature_name(names: Sequence[bytes], j: Optional[int]) -> Optional[str]:
    return None if j is None else names[j].decode("utf-8", "replace")


def parse_examples(records: Sequence[bytes], names: Tuple[bytes, ...], kinds: Tuple[int, ...]
                   ) -> Tuple[List[Union[np.ndarray, List[bytes]]], np.ndarray]:
    """Parse serialized ``tf.train.Example`` records: the reference implementation.

    ``names[j]`` is a feature key (UTF-8 bytes) and ``kinds[j]`` the value list it must hold
    (``KIND_BYTES`` 1, ``KIND_FLOAT`` 2, ``KIND_INT64`` 3). Returns ``(values, counts)``:
    ``values[j]`` is the flat concatenation, in record order, of feature ``j``'s values (float32
    or int64 array, or a list of ``bytes``), ``counts[i, j]`` the number of values record ``i``
    has for feature ``j``, or -1 where the feature is absent. Raises :class:`WireError` (with the
    batch ``index`` and ``field``) for malformed protobuf or a feature of the wrong kind.
    """
    nf = len(names)
    lookup = {name: j for j, name in enumerate(names)}
    pieces: List[List[bytes]] = [[] for _ in range(nf)]
    owners: List[List[int]] = [[] for _ in range(nf)]
    present: List[List[int]] = [[] for _ in range(nf)]
    for i, buf in enumerate(records):
        j = None
        try:
            found: Dict[int, List[Tuple[int, int]]] = {}
            _map_entries(buf, _top_level(buf, len(buf), (0x0A,))[0], lookup, found)
            for j, spans in found.items():
                kind, lists = _feature_kind(buf, spans)
                if kind == 0:  # an empty Feature is a missing one, as in tf.io.parse_example
                    continue
                _check_kind(kind, kinds[j])
                _list_values(buf, kind, lists, pieces[j], owners[j], i)
                present[j].append(i)
        except WireError as exc:
            raise WireError(exc.message, i, _feature_name(names, j)) from None
    counts = np.full((len(records), nf), -1, dtype=np.int64)
    values: List[Union[np.ndarray, List[bytes]]] = []
    for j in range(nf):
        try:
            flat, per_record = _finish_values(kinds[j], pieces[j], owners[j], len(records))
        except WireError as exc:  # a packed varint list cut short: find the record for the message
            bad = _first_bad_varint_owner(pieces[j], owners[j])
            raise WireError(exc.message, bad, _feature_name(names, j)) from None
        rows = np.array(present[j], dtype=np.int64)
        counts[rows, j] = per_record[rows]
        values.append(flat)
    return values, counts


def _first_bad_varint_owner(pieces: List[bytes], owners: List[int]) -> Optional[int]:
    for piece, owner in zip(pieces, owners):
        try:
            decode_packed_varints([piece])
        except WireError:
            return owner
    return None


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
        except WireError:
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
        except WireError:  # a varint over 10 bytes: let the reference parser name the record
            leftover.append(rows)
            continue
        groups += 1
        for j, (flat, cnt) in enumerate(found):
            parts[j].append((rows, _empty_values(kinds[j]) if flat is None else flat, cnt))
    if leftover:
        rest = np.sort(np.concatenate(leftover))
        try:
            values, counts = parse_examples([records[i] for i in rest], names, kinds)
        except WireError as exc:
            raise WireError(exc.message, None if exc.index is None else int(rest[exc.index]),
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


def parse_sequence_examples(records: Sequence[bytes], context_names: Tuple[bytes, ...],
                            context_kinds: Tuple[int, ...], sequence_names: Tuple[bytes, ...],
                            sequence_kinds: Tuple[int, ...]):
    """Parse serialized ``tf.train.SequenceExample`` records: the reference implementation.

    Returns ``(context_values, context_counts, sequence_values, sequence_steps, step_counts)``:
    the context part as :func:`parse_examples` returns it; ``sequence_steps[i, j]`` the number
    of steps (Features in the FeatureList) record ``i`` has for sequence feature ``j`` (-1:
    absent), ``sequence_values[j]`` the flat values of all steps of all records in order and
    ``step_counts[j]`` the number of values in each of those steps (``int64``).
    """
    nc, ns = len(context_names), len(sequence_names)
    c_lookup = {name: j for j, name in enumerate(context_names)}
    s_lookup = {name: j for j, name in enumerate(sequence_names)}
    c_pieces: List[List[bytes]] = [[] for _ in range(nc)]
    c_owners: List[List[int]] = [[] for _ in range(nc)]
    c_present: List[List[int]] = [[] for _ in range(nc)]
    s_pieces: List[List[bytes]] = [[] for _ in range(ns)]
    s_owners: List[List[int]] = [[] for _ in range(ns)]  # owner = global step number
    s_steps = np.full((len(records), ns), -1, dtype=np.int64)
    n_steps = [0] * ns
    for i, buf in enumerate(records):
        j = None
        names = context_names
        try:
            context_spans, list_spans = _top_level(buf, len(buf), (0x0A, 0x12))
            found: Dict[int, List[Tuple[int, int]]] = {}
            _map_entries(buf, context_spans, c_lookup, found)
            for j, spans in found.items():
                kind, lists = _feature_kind(buf, spans)
                if kind == 0:  # an empty Feature is a missing one, as in Example
                    continue
                _check_kind(kind, context_kinds[j])
                _list_values(buf, kind, lists, c_pieces[j], c_owners[j], i)
                c_present[j].append(i)
            j = None
            names = sequence_names
            found = {}
            _map_entries(buf, list_spans, s_lookup, found)
            for j, spans in found.items():
                steps = 0
                for pos, end in spans:  # FeatureList: repeated Feature feature = 1
                    while pos < end:
                        tag, after = _read_tag(buf, pos, end)
                        if tag == 0x0A:
                            start, pos = read_len(buf, after, end)
                            kind, lists = _feature_kind(buf, [(start, pos)])
                            _check_kind(kind, sequence_kinds[j])
                            _list_values(buf, kind, lists, s_pieces[j], s_owners[j], n_steps[j])
                            n_steps[j] += 1
                            steps += 1
                        else:
                            pos = _skip_value(buf, tag, after, end, 0)
                s_steps[i, j] = steps
        except WireError as exc:
            raise WireError(exc.message, i, _feature_name(names, j)) from None
    c_counts = np.full((len(records), nc), -1, dtype=np.int64)
    c_values = []
    for j in range(nc):
        try:
            flat, per_record = _finish_values(context_kinds[j], c_pieces[j], c_owners[j], len(records))
        except WireError as exc:
            bad = _first_bad_varint_owner(c_pieces[j], c_owners[j])
            raise WireError(exc.message, bad, _feature_name(context_names, j)) from None
        rows = np.array(c_present[j], dtype=np.int64)
        c_counts[rows, j] = per_record[rows]
        c_values.append(flat)
    s_values, step_counts = [], []
    for j in range(ns):
        try:
            flat, per_step = _finish_values(sequence_kinds[j], s_pieces[j], s_owners[j], n_steps[j])
        except WireError as exc:
            step = _first_bad_varint_owner(s_pieces[j], s_owners[j])
            owner = None
            if step is not None:  # step number -> record
                owner = int(np.searchsorted(np.cumsum(np.maximum(s_steps[:, j], 0)), step, "right"))
            raise WireError(exc.message, owner, _feature_name(sequence_names, j)) from None
        s_values.append(flat)
        step_counts.append(per_step)
    return c_values, c_counts, s_values, s_steps, step_counts


# --- whole-batch assembly ------------------------------------------------------------------------

def _object_array(values: List[bytes]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _cast(values: Any, dtype: str, counts: np.ndarray, where: "_Where", name: str) -> np.ndarray:
    """Flat wire values as the output dtype (int32 only if every value fits)."""
    if dtype == "bytes":
        return _object_array(values)
    target = _DTYPES[dtype][1]
    if target is np.int32 and len(values):
        bad = (values < _INT32_RANGE[0]) | (values > _INT32_RANGE[1])
        if bad.any():
            k = int(np.argmax(bad))
            owner = int(np.searchsorted(np.cumsum(np.maximum(counts, 0)), k, "right"))
            raise where.error(f"value {int(values[k])} does not fit in int32", owner, name)
    return values.astype(target, copy=False)


class _Where:
    """Where a batch came from, for error messages."""

    __slots__ = ("source", "first_index")

    def __init__(self, source: Optional[str], first_index: int) -> None:
        self.source = source
        self.first_index = first_index

    def error(self, message: str, row: Optional[int], field: Optional[str]) -> DecodeError:
        return DecodeError(message, source=self.source,
                           record_index=None if row is None else self.first_index + row,
                           field=field)


def _fixed_column(name: str, spec: FixedLen, values: Any, counts: np.ndarray,
                  where: _Where) -> np.ndarray:
    n = spec.size
    nrec = len(counts)
    wrong = (counts >= 0) & (counts != n)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise where.error(f"feature has {counts[i]} values, expected {n} for shape {spec.shape}",
                          i, name)
    missing = counts < 0
    any_missing = bool(missing.any())
    if any_missing and spec.default is None:
        raise where.error("feature is missing and has no default", int(np.argmax(missing)), name)
    flat = _cast(values, spec.dtype, counts, where, name)
    if not any_missing:
        # Writable, so that torch.from_numpy takes it without a warning or a copy.
        return np.require(flat.reshape((nrec,) + spec.shape), requirements="W")
    out = np.empty((nrec, n), dtype=flat.dtype)
    out[~missing] = flat.reshape(-1, n)
    out[missing] = spec.default.reshape(n)
    return out.reshape((nrec,) + spec.shape)


def _varlen_column(name: str, spec: VarLen, values: Any, counts: np.ndarray, where: _Where
                   ) -> Tuple[np.ndarray, np.ndarray]:
    lengths = np.maximum(counts, 0)
    flat = _cast(values, spec.dtype, counts, where, name)
    width = int(lengths.max()) if len(lengths) else 0
    out = np.full((len(lengths), width), spec.pad_value, dtype=flat.dtype)
    out[np.arange(width) < lengths[:, None]] = flat
    return out, lengths


def _validate_features(features: Any, what: str,
                       sequence: bool = False) -> Dict[str, Union[FixedLen, VarLen]]:
    if not isinstance(features, Mapping):
        raise UsageTypeError(f"{what} must be a mapping {{name: FixedLen | VarLen}}, not {type(features).__name__}")
    out: Dict[str, Union[FixedLen, VarLen]] = {}
    for name, spec in features.items():
        if not isinstance(name, str):
            raise UsageTypeError(f"feature names must be str, not {name!r}")
        if not isinstance(spec, (FixedLen, VarLen)):
            raise UsageTypeError(f"feature {name!r}: expected FixedLen or VarLen, not {spec!r}")
        if isinstance(spec, FixedLen) and spec.allow_missing and not sequence:
            raise UsageError(f"feature {name!r}: allow_missing is for SequenceExample sequence"
                             " features; give a default for a feature that may be missing")
        out[name] = spec
    return out


def _output_names(groups: Sequence[Tuple[Mapping[str, Any], bool]]) -> None:
    """Raise ValueError if two outputs would share a name (``x`` VarLen and a feature ``x_len``)."""
    seen: Dict[str, str] = {}
    for features, is_sequence in groups:
        for name, spec in features.items():
            outs = [name]
            if isinstance(spec, VarLen) or is_sequence:
                outs.append(name + "_len")
            if is_sequence and isinstance(spec, VarLen):
                outs.append(name + "_step_len")
            for out in outs:
                if out in seen:
                    raise UsageError(f"output {out!r} of feature {name!r} clashes with feature {seen[out]!r}")
                seen[out] = name


def _spec_of(spec: Union[FixedLen, VarLen], steps: bool) -> Dict[str, Tuple[str, Any, tuple]]:
    kind = "object" if spec.dtype == "bytes" else "dense"
    dtype = _DTYPES[spec.dtype][1]
    lead = (None,) if steps else ()
    if isinstance(spec, FixedLen):
        return {"": (kind, dtype, lead + spec.shape)}
    out = {"": (kind, dtype, lead + (None,))}
    if steps:
        out["_step_len"] = ("dense", np.int64, (None,))
    return out


class Example:
    """Decode serialized ``tf.train.Example`` records: ``Example({"x": FixedLen((3,), "float32"),
    "tags": VarLen("bytes")})``.

    ``decode_batch(records)`` returns ``{name: (B, *shape) array}`` for each ``FixedLen`` and
    ``{name: (B, longest) padded array, name + "_len": (B,) int64}`` for each ``VarLen``;
    features the spec does not name are ignored. Results equal ``tf.io.parse_example`` with the
    matching ``FixedLenFeature`` / ``VarLenFeature`` (a ``VarLen`` comes padded instead of as a
    ``SparseTensor``). Stateless: one instance may decode any number of streams.
    """

    def __init__(self, features: Mapping[str, Union[FixedLen, VarLen, Image]]) -> None:
        # An Image feature is a bytes feature on the wire, decoded after parsing (decoders/image.py).
        self._images: Dict[str, Image] = ({name: spec for name, spec in features.items()
                                           if isinstance(spec, Image)}
                                          if isinstance(features, Mapping) else {})
        self.features = _validate_features(
            {name: FixedLen([], "bytes") if name in self._images else spec
             for name, spec in features.items()} if self._images else features, "features")
        _output_names([(self.features, False)])
        self._names = tuple(name.encode("utf-8") for name in self.features)
        self._kinds = tuple(_DTYPES[spec.dtype][0] for spec in self.features.values())

    def __repr__(self) -> str:
        return f"Example({dict(self.features, **self._images)!r})"

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch to the random crops of ``Image`` features."""
        for image in self._images.values():
            image.set_epoch(epoch)

    def fresh(self) -> "Example":
        """A decoder for a new stream (Example keeps no state, so this is ``self``)."""
        return self

    def reset(self) -> None:
        """Nothing to forget: Example decoders are stateless."""

    def output_spec(self) -> Dict[str, FieldSpec]:
        out: Dict[str, FieldSpec] = {}
        for name, spec in self.features.items():
            for suffix, (kind, dtype, shape) in _spec_of(spec, False).items():
                out[name + suffix] = FieldSpec(kind, dtype, shape)
            if isinstance(spec, VarLen):
                out[name + "_len"] = FieldSpec("dense", np.int64, ())
        for name, image in self._images.items():
            out[name] = image.field_spec()
        return out

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, Union[np.ndarray, SparseBatch]]:
        where = _Where(source, first_index)
        try:
            parse = _c_parse_examples or parse_examples_fast
            values, counts = parse(records, self._names, self._kinds)
        except WireError as exc:
            raise where.error(f"not a valid tf.train.Example: {exc.message}", exc.index, exc.field) from None
        out: Dict[str, Union[np.ndarray, SparseBatch]] = {}
        for j, (name, spec) in enumerate(self.features.items()):
            if isinstance(spec, FixedLen):
                out[name] = _fixed_column(name, spec, values[j], counts[:, j], where)
            else:
                out[name], out[name + "_len"] = _varlen_column(name, spec, values[j], counts[:, j], where)
        if self._images:
            out = _decode_images(self._images, out, source, first_index)
        return out


def _decode_images(images: Mapping[str, Image], out: Dict[str, Any], source: Optional[str],
                   first_index: int) -> Dict[str, Any]:
    """Decode the Image columns; a record an image skips (``on_error="skip"``) leaves every
    column."""
    kept: Dict[str, np.ndarray] = {}
    for name, image in images.items():
        out[name], ok = image.decode_column(out[name], source=source, first_index=first_index,
                                            field=name)
        if ok is not None:
            kept[name] = ok
    if not kept:
        return out
    keep = np.logical_and.reduce(list(kept.values()))
    return {k: v[keep[kept[k]]] if k in kept else v[keep] for k, v in out.items()}


class SequenceExample:
    """Decode serialized ``tf.train.SequenceExample`` records.

    ``context`` features decode as in :class:`Example`. Each ``sequence`` feature is a list of
    steps, padded to the longest sequence in the batch: ``FixedLen(shape)`` gives
    ``(B, steps, *shape)`` (padding: its ``default``, else 0), ``VarLen`` gives ``(B, steps,
    longest step)``; ``batch[name + "_len"]`` holds the number of steps of each example, and a
    ``VarLen`` sequence also gets ``batch[name + "_step_len"]`` ``(B, steps)`` with the length of
    each step. As in TF, an absent feature list is an error for a ``FixedLen`` sequence feature
    unless it says ``allow_missing=True`` (then: 0 steps), and 0 steps for a ``VarLen`` one; a
    feature list that is present but empty has 0 steps. Stateless.
    """

    def __init__(self, context: Optional[Mapping[str, Union[FixedLen, VarLen]]] = None,
                 sequence: Optional[Mapping[str, Union[FixedLen, VarLen]]] = None) -> None:
        self.context = _validate_features({} if context is None else context, "context")
        self.sequence = _validate_features({} if sequence is None else sequence, "sequence",
                                           sequence=True)
        _output_names([(self.context, False), (self.sequence, True)])
        self._c_names = tuple(name.encode("utf-8") for name in self.context)
        self._c_kinds = tuple(_DTYPES[spec.dtype][0] for spec in self.context.values())
        self._s_names = tuple(name.encode("utf-8") for name in self.sequence)
        self._s_kinds = tuple(_DTYPES[spec.dtype][0] for spec in self.sequence.values())

    def __repr__(self) -> str:
        return f"SequenceExample(context={self.context!r}, sequence={self.sequence!r})"

    def fresh(self) -> "SequenceExample":
        """A decoder for a new stream (stateless, so this is ``self``)."""
        return self

    def reset(self) -> None:
        """Nothing to forget: SequenceExample decoders are stateless."""

    def output_spec(self) -> Dict[str, FieldSpec]:
        out = Example(self.context).output_spec()
        for name, spec in self.sequence.items():
            for suffix, (kind, dtype, shape) in _spec_of(spec, True).items():
                out[name + suffix] = FieldSpec(kind, dtype, shape)
            out[name + "_len"] = FieldSpec("dense", np.int64, ())
        return out

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, Union[np.ndarray, SparseBatch]]:
        where = _Where(source, first_index)
        try:
            parse = _c_parse_sequence_examples or parse_sequence_examples
            c_values, c_counts, s_values, s_steps, step_counts = parse(
                records, self._c_names, self._c_kinds, self._s_names, self._s_kinds)
        except WireError as exc:
            raise where.error(f"not a valid tf.train.SequenceExample: {exc.message}",
                              exc.index, exc.field) from None
        out: Dict[str, Union[np.ndarray, SparseBatch]] = {}
        for j, (name, spec) in enumerate(self.context.items()):
            if isinstance(spec, FixedLen):
                out[name] = _fixed_column(name, spec, c_values[j], c_counts[:, j], where)
            else:
                out[name], out[name + "_len"] = _varlen_column(name, spec, c_values[j],
                                                               c_counts[:, j], where)
        for j, (name, spec) in enumerate(self.sequence.items()):
            absent = s_steps[:, j] < 0
            if isinstance(spec, FixedLen) and not spec.allow_missing and absent.any():
                # TF (FixedLenSequenceFeature, allow_missing=False): "Feature list ... is required"
                raise where.error(f"feature list {name!r} is required but absent; pass"
                                  f" FixedLen(..., allow_missing=True) to read it as 0 steps",
                                  int(np.argmax(absent)), name)
            steps = np.maximum(s_steps[:, j], 0)
            out.update(_sequence_column(name, spec, s_values[j], steps, step_counts[j], where))
        return out


def _sequence_column(name: str, spec: Union[FixedLen, VarLen], values: Any, steps: np.ndarray,
                     step_counts: np.ndarray, where: _Where) -> Dict[str, np.ndarray]:
    nrec = len(steps)
    longest = int(steps.max()) if nrec else 0
    step_owner = np.repeat(np.arange(nrec), steps)
    if isinstance(spec, FixedLen):
        n = spec.size
        wrong = step_counts != n
        if wrong.any():
            k = int(np.argmax(wrong))
            raise where.error(f"a step has {step_counts[k]} values, expected {n} for shape"
                              f" {spec.shape}", int(step_owner[k]), name)
        # values per record: only an int32 cast that fails needs them (to name the record)
        per_record = (np.bincount(step_owner, weights=step_counts, minlength=nrec).astype(np.int64)
                      if _DTYPES[spec.dtype][1] is np.int32 else steps * n)
        flat = _cast(values, spec.dtype, per_record, where, name)
        pad = spec.default.reshape(n) if spec.default is not None else (
            b"" if spec.dtype == "bytes" else 0)
        out = np.empty((nrec, longest, n), dtype=flat.dtype)
        out[...] = pad
        # Step g of the batch (record r's step t) goes to out[r, t] = row r * longest + t of the
        # (B * T, n) output. numpy copies (steps, n) blocks by a row index or a (B, T) mask
        # element by element (4-6x slower): numbers are moved as one n-value item a step.
        shift = np.arange(nrec, dtype=np.int64) * longest - (np.cumsum(steps) - steps)
        rows = np.arange(len(step_owner), dtype=np.int64) + np.repeat(shift, steps)
        if flat.dtype == object:
            out.reshape(-1, n)[rows] = flat.reshape(-1, n)
        elif n:
            step_item = np.dtype((np.void, n * flat.itemsize))
            out.reshape(-1, n).view(step_item).reshape(-1)[rows] = \
                np.ascontiguousarray(flat).reshape(-1, n).view(step_item).reshape(-1)
        return {name: out.reshape((nrec, longest) + spec.shape), name + "_len": steps}
    step_mask = np.arange(longest) < steps[:, None]  # (B, T): which steps exist
    per_record = np.bincount(step_owner, weights=step_counts, minlength=nrec).astype(np.int64)
    flat = _cast(values, spec.dtype, per_record, where, name)
    width = int(step_counts.max()) if len(step_counts) else 0
    out = np.full((nrec, longest, width), spec.pad_value, dtype=flat.dtype)
    step_len = np.zeros((nrec, longest), dtype=np.int64)
    step_len[step_mask] = step_counts
    out[np.arange(width) < step_len[:, :, None]] = flat
    return {name: out, name + "_len": steps, name + "_step_len": step_len}


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize one ``tf.train.Example`` without TensorFlow (the inverse of :class:`Example`).

    Values: floats (a float, a list, a float numpy array) -> ``float_list``; ints or bools ->
    ``int64_list``; ``bytes``/``str`` or a list of them -> ``bytes_list``. Wire layout
    (tensorflow/core/example/example.proto): ``Example{features=1: Features{feature=1:
    map<string, Feature>}}``, each map entry ``{key=1, value=2}``, ``Feature{bytes_list=1 |
    float_list=2 | int64_list=3}``, each list ``{value=1}``, numbers packed.
    """
    entries = []
    for name, value in features.items():
        if isinstance(value, (bytes, str)):
            value = [value]
        array = np.asarray(value)
        if array.ndim == 0:
            array = array.reshape(1)
        if array.dtype.kind in "OSU":
            items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.ravel()]
            feature = len_field(1, b"".join(len_field(1, v) for v in items))
        elif array.dtype.kind == "f":
            feature = len_field(2, len_field(1, array.astype("<f4").tobytes()))
        elif array.dtype.kind in "iub":
            feature = len_field(3, len_field(1, encode_packed_varints(array.astype(np.int64))))
        else:
            raise UsageTypeError(f"feature {name!r}: cannot encode values of dtype {array.dtype}")
        entries.append(len_field(1, len_field(1, name.encode("utf-8")) + len_field(2, feature)))
    return len_field(1, b"".join(entries))

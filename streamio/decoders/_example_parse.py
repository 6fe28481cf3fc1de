"""The reference wire parsers of :mod:`streamio.decoders.example` (``parse_examples``,
``parse_sequence_examples``): pure functions from a batch of records to flat value arrays plus a
``counts`` matrix; the C kernels (streamio/_c/pb_example.c) have the same signatures and results,
errors included, and tests/kernels/test_kernel_protobuf.py holds them to these."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._example_spec import _KIND_NAMES, KIND_FLOAT, KIND_INT64
from .wire import _WireError, _skip_value, decode_packed_varints, read_len, read_varint


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
                    raise _WireError("packed float list is not a multiple of 4 bytes")
                spans.append((start, pos, False))
            elif tag == 0x0D and kind == KIND_FLOAT:  # one unpacked float (fixed32)
                pos = after + 4
                if pos > end:
                    raise _WireError("truncated float")
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
        raise _WireError(f"feature holds a {_KIND_NAMES[kind]}, expected a {_KIND_NAMES[want]}")


def _feature_name(names: Sequence[bytes], j: Optional[int]) -> Optional[str]:
    return None if j is None else names[j].decode("utf-8", "replace")


def parse_examples(records: Sequence[bytes], names: Tuple[bytes, ...], kinds: Tuple[int, ...]
                   ) -> Tuple[List[Union[np.ndarray, List[bytes]]], np.ndarray]:
    """Parse serialized ``tf.train.Example`` records: the reference implementation.

    ``names[j]`` is a feature key (UTF-8 bytes) and ``kinds[j]`` the value list it must hold
    (``KIND_BYTES`` 1, ``KIND_FLOAT`` 2, ``KIND_INT64`` 3). Returns ``(values, counts)``:
    ``values[j]`` is the flat concatenation, in record order, of feature ``j``'s values (float32
    or int64 array, or a list of ``bytes``), ``counts[i, j]`` the number of values record ``i``
    has for feature ``j``, or -1 where the feature is absent. Raises :class:`_WireError` (with the
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
        except _WireError as exc:
            raise _WireError(exc.message, i, _feature_name(names, j)) from None
    counts = np.full((len(records), nf), -1, dtype=np.int64)
    values: List[Union[np.ndarray, List[bytes]]] = []
    for j in range(nf):
        try:
            flat, per_record = _finish_values(kinds[j], pieces[j], owners[j], len(records))
        except _WireError as exc:  # a packed varint list cut short: find the record for the message
            bad = _first_bad_varint_owner(pieces[j], owners[j])
            raise _WireError(exc.message, bad, _feature_name(names, j)) from None
        rows = np.array(present[j], dtype=np.int64)
        counts[rows, j] = per_record[rows]
        values.append(flat)
    return values, counts


def _first_bad_varint_owner(pieces: List[bytes], owners: List[int]) -> Optional[int]:
    for piece, owner in zip(pieces, owners):
        try:
            decode_packed_varints([piece])
        except _WireError:
            return owner
    return None


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
        except _WireError as exc:
            raise _WireError(exc.message, i, _feature_name(names, j)) from None
    c_counts = np.full((len(records), nc), -1, dtype=np.int64)
    c_values = []
    for j in range(nc):
        try:
            flat, per_record = _finish_values(context_kinds[j], c_pieces[j], c_owners[j], len(records))
        except _WireError as exc:
            bad = _first_bad_varint_owner(c_pieces[j], c_owners[j])
            raise _WireError(exc.message, bad, _feature_name(context_names, j)) from None
        rows = np.array(c_present[j], dtype=np.int64)
        c_counts[rows, j] = per_record[rows]
        c_values.append(flat)
    s_values, step_counts = [], []
    for j in range(ns):
        try:
            flat, per_step = _finish_values(sequence_kinds[j], s_pieces[j], s_owners[j], n_steps[j])
        except _WireError as exc:
            step = _first_bad_varint_owner(s_pieces[j], s_owners[j])
            owner = None
            if step is not None:  # step number -> record
                owner = int(np.searchsorted(np.cumsum(np.maximum(s_steps[:, j], 0)), step, "right"))
            raise _WireError(exc.message, owner, _feature_name(sequence_names, j)) from None
        s_values.append(flat)
        step_counts.append(per_step)
    return c_values, c_counts, s_values, s_steps, step_counts

"""One record shown to a person (``streamio head``): decoded where the format says what the bytes
mean, as text where they are text, and as hex only where they are opaque.

- CSV and lines records are text rows: shown as text (control characters escaped);
- a TFRecord payload that is a ``tf.train.Example`` is shown as its features, decoded without a
  spec: ``{x: float[16] [0.5, -1.25, ...], y: int64 [1]}``;
- a RecordIO payload that is a SageMaker RecordIO-protobuf ``Record`` is shown as its tensors;
- any other payload: quoted text if it is printable UTF-8, otherwise hex.

Nothing here does I/O; a record that does not parse as what it might be falls through to the
next way of showing it.
"""

from __future__ import annotations

import struct
from typing import Any, Optional

import numpy as np

from ..decoders.wire import read_len, read_varint, skip_field

__all__ = ["preview"]


class _NotAnExample(Exception):
    """The bytes parse as protobuf, but not as a tf.train.Example (preview shows them raw)."""

#: Values shown per feature before "...".
MAX_VALUES = 4
_TEXT_FORMATS = ("csv", "lines")


def preview(record: bytes, format: str, width: int) -> str:
    """``record`` (a record of ``format``) as one line of at most about ``width`` characters."""
    if format in _TEXT_FORMATS:
        return _clip(_escape(record.decode("utf-8", errors="backslashreplace")), width)
    text = _printable(record)
    if text is not None:
        return _clip(repr(text), width)
    decoded = None
    if format == "tfrecord":
        decoded = _example(record)
    elif format == "recordio":
        decoded = _recordio_protobuf(record)
    if decoded is not None:
        return _clip(decoded, width)
    shown = record[:max(1, width // 3)].hex(" ")
    return shown + (" ..." if len(record) > max(1, width // 3) else "")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width] + " ..."


def _escape(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _printable(record: bytes) -> Optional[str]:
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


# -- tf.train.Example without a spec ---------------------------------------------------------------
# Example { Features features = 1 }   Features { map<string, Feature> feature = 1 }
# Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3 } }
# each list: repeated values = 1 (floats and int64s packed, or one per field).
def _fields(buf: bytes, start: int, end: int):
    """(field number, wire type, value start, value end) of each field of a message."""
    pos = start
    while pos < end:
        tag, after = read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            lo, hi = read_len(buf, after, end)
            yield number, wire, lo, hi
            pos = hi
        else:
            nxt = skip_field(buf, pos, end)
            yield number, wire, after, nxt
            pos = nxt


def _example(record: bytes) -> Optional[str]:
    try:
        features: dict[str, str] = {}
        for number, wire, lo, hi in _fields(record, 0, len(record)):
            if number != 1 or wire != 2:
                return None
            for n2, w2, elo, ehi in _fields(record, lo, hi):
                if n2 != 1 or w2 != 2:
                    return None
                name, value = _map_entry(record, elo, ehi)
                features[name] = value
    except (_NotAnExample, ValueError, struct.error, IndexError):  # wire helpers: ValueErrors
        return None
    return "{" + ", ".join(f"{name}: {value}" for name, value in features.items()) + "}"


def _map_entry(buf: bytes, start: int, end: int) -> tuple[str, str]:
    name, value = "", "empty"
    for number, wire, lo, hi in _fields(buf, start, end):
        if number == 1 and wire == 2:
            name = buf[lo:hi].decode("utf-8")
        elif number == 2 and wire == 2:
            value = _feature(buf, lo, hi)
        else:
            raise _NotAnExample("not an Example map entry")
    return name, value


def _feature(buf: bytes, start: int, end: int) -> str:
    kind, values = "empty", []
    for number, wire, lo, hi in _fields(buf, start, end):
        if wire != 2 or number not in (1, 2, 3):
            raise _NotAnExample("not a Feature")
        kind = {1: "bytes", 2: "float", 3: "int64"}[number]
        values = []
        for n2, w2, vlo, vhi in _fields(buf, lo, hi):
            if n2 != 1:
                raise _NotAnExample("not a value list")
            if number == 1:
                values.append(bytes(buf[vlo:vhi]))
            elif number == 2:
                raw = buf[vlo:vhi] if w2 == 2 else buf[vlo:vlo + 4]
                values.extend(np.frombuffer(raw, "<f4").tolist())
            else:
                if w2 == 2:
                    pos = vlo
                    while pos < vhi:
                        value, pos = read_varint(buf, pos, vhi)
                        values.append(value - (1 << 64) if value >> 63 else value)
                else:
                    value, _ = read_varint(buf, vlo, vhi)
                    values.append(value - (1 << 64) if value >> 63 else value)
    return _values(kind, values)


def _values(kind: str, values: list) -> str:
    shown = [f"{v:.6g}" if isinstance(v, float) else repr(v) for v in values[:MAX_VALUES]]
    more = ", ..." if len(values) > MAX_VALUES else ""
    size = f"[{len(values)}]" if len(values) != 1 else ""
    return f"{kind}{size} [{', '.join(shown)}{more}]"


# -- SageMaker RecordIO-protobuf ----------------------------------------------------------------
def _recordio_protobuf(record: bytes) -> Optional[str]:
    from ..decoders.recordio_protobuf import RecordIOProtobuf
    from ..decoders.sparse import SparseBatch
    from ..errors import StreamioError

    try:
        batch = RecordIOProtobuf().decode_batch([record])
    except (StreamioError, ValueError, TypeError, OverflowError):
        return None
    if not batch:
        return None
    parts = []
    for name, value in batch.items():
        if isinstance(value, SparseBatch):
            parts.append(f"{name}: sparse[{value.shape[1]}] {_values(_kind(value.values), list(zip(value.indices.tolist(), value.values.tolist())))}")
            continue
        array = np.asarray(value)[0]
        parts.append(f"{name}: {_values(_kind(array), np.ravel(array).tolist())}")
    return "{" + ", ".join(parts) + "}"


def _kind(array: Any) -> str:
    return str(np.asarray(array).dtype)

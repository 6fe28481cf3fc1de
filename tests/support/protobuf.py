"""Protocol buffer bytes by hand, for tests that need what no encoder would write (any uint64,
wrong wire types, entries without values). Built on the package's own varint writer
(streamio.decoders.wire), so the encoding is written once."""

from __future__ import annotations

from streamio.decoders.wire import encode_varint, len_field

MASK64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """``n`` as a varint; a negative ``n`` as its uint64 (ten bytes), as protobuf writes int64."""
    return encode_varint(n & MASK64)


def varints(numbers) -> bytes:
    return b"".join(map(varint, numbers))


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): tag, length, payload."""
    return len_field(number, payload)


def tagged(number: int, wire_type: int, payload: bytes) -> bytes:
    """A field of any wire type: the tag, then ``payload`` as given (a varint's bytes, four or
    eight fixed bytes, or, for wire type 2, the length and the bytes; see ``field``)."""
    if wire_type == 2:
        return field(number, payload)
    return varint(number << 3 | wire_type) + payload

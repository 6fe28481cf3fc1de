"""A minimal protobuf wire-format reader and writer: just what the decoders need.

Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): a message is a sequence
of fields, each ``tag = field_number << 3 | wire_type`` (a varint) followed by its value:
wire type 0 a varint, 1 eight bytes (fixed64/double), 2 a varint length and that many bytes
(sub-messages, strings, bytes, packed repeated scalars), 5 four bytes (fixed32/float), 3 and 4
the start and end of a (deprecated) group. Unknown fields, and known fields that arrive with an
unexpected wire type, are skipped, as every protobuf parser does; that is what lets a newer
writer add fields.

Why not ``google.protobuf``: parsing into message objects and reading them back field by field
costs more Python work per record than walking the bytes once and keeping only the *spans* of the
values; the spans of a whole batch are then converted by numpy in one call each. This module is
pure Python and imports no I/O.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

__all__ = [
    "_WireError",
    "decode_packed_varints",
    "encode_varint",
    "encode_packed_varints",
    "len_field",
    "read_varint",
    "skip_field",
]

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LEN = 2
WIRE_START_GROUP = 3
WIRE_END_GROUP = 4
WIRE_FIXED32 = 5

_MASK64 = (1 << 64) - 1
# Protobuf never writes more than 10 bytes for a varint (64 bits in 7-bit groups); a longer one
# is corrupt, and bounding it keeps garbage from building huge Python ints.
_MAX_VARINT_BYTES = 10
# Groups nest; bound the depth so that garbage cannot recurse without limit (upb uses 100 too).
_MAX_GROUP_DEPTH = 100


class _WireError(ValueError):
    """Internal: the bytes are not valid protobuf, or not the message we expect.

    ``index`` is the position of the record in the batch being parsed and ``field`` the feature
    name, where known. Decoders translate it into :class:`streamio.errors.DecodeError` with the
    source and the stream index of the record; it never leaves the decoders package.
    """

    def __init__(self, message: str, index: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.index = index
        self.field = field


def read_varint(buf: bytes, pos: int, end: int) -> Tuple[int, int]:
    """Read the varint at ``buf[pos:end]``: ``(value as an unsigned 64-bit int, next position)``."""
    if pos >= end:
        raise _WireError("truncated varint")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise _WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            # Bits past the 64th (possible in a 10-byte varint) are dropped, as protobuf does.
            return result & _MASK64, pos
        shift += 7
        if shift >= 7 * _MAX_VARINT_BYTES:
            raise _WireError("varint longer than 10 bytes")


def read_len(buf: bytes, pos: int, end: int) -> Tuple[int, int]:
    """Read a length prefix at ``pos``: ``(start, stop)`` of the delimited bytes."""
    byte = buf[pos] if pos < end else 0x80
    if byte < 0x80:
        start = pos + 1
        stop = start + byte
    else:
        length, start = read_varint(buf, pos, end)
        stop = start + length
    if stop > end:
        raise _WireError("length-delimited field runs past the end of its message")
    return start, stop


def skip_field(buf: bytes, pos: int, end: int) -> int:
    """Skip the whole field (tag and value) that starts at ``pos``; return the next position."""
    tag, pos = read_varint(buf, pos, end)
    return _skip_value(buf, tag, pos, end, 0)


def _skip_value(buf: bytes, tag: int, pos: int, end: int, depth: int) -> int:
    if tag >> 3 == 0:
        raise _WireError("field number 0")
    wire_type = tag & 7
    if wire_type == WIRE_VARINT:
        return read_varint(buf, pos, end)[1]
    if wire_type == WIRE_LEN:
        return read_len(buf, pos, end)[1]
    if wire_type == WIRE_FIXED32:
        pos += 4
    elif wire_type == WIRE_FIXED64:
        pos += 8
    elif wire_type == WIRE_START_GROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise _WireError("groups nested too deeply")
        while True:
            inner, pos = read_varint(buf, pos, end)
            if inner & 7 == WIRE_END_GROUP:
                if inner >> 3 != tag >> 3:
                    raise _WireError("end-group tag does not match its start-group tag")
                return pos
            pos = _skip_value(buf, inner, pos, end, depth + 1)
    else:  # wire type 4 (an end-group with no start), 6 or 7
        raise _WireError(f"invalid wire type {wire_type}")
    if pos > end:
        raise _WireError("fixed-width field runs past the end of its message")
    return pos


def decode_packed_varints(pieces: Sequence[bytes]) -> Tuple[np.ndarray, np.ndarray]:
    """Decode the varints of many packed fields at once: ``(values uint64, count per piece)``.

    Each piece is the payload of one packed repeated varint field (or a single unpacked varint).
    Vectorised: a varint ends at each byte below 0x80, so numbering the bytes by the varint they
    belong to lets numpy shift and OR the 7-bit groups of all of them in a few array operations.
    Raises :class:`_WireError` if a piece ends inside a varint or a varint exceeds 10 bytes.
    """
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    if not len(data):
        return np.zeros(0, np.uint64), np.zeros(len(pieces), np.int64)
    last = data < 0x80
    piece_ends = np.cumsum(lengths)
    nonempty = lengths > 0
    if not last[piece_ends[nonempty] - 1].all():
        raise _WireError("packed varints end inside a varint")
    ends = np.flatnonzero(last)
    # Varints seen by the end of each piece, differenced: the count in each piece.
    terminators = np.concatenate(([0], np.cumsum(last)))
    counts = np.diff(terminators[np.concatenate(([0], piece_ends))])
    if len(ends) == len(data):  # all one-byte varints: the common case of small ints
        return data.astype(np.uint64), counts
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if (ends - starts).max() >= _MAX_VARINT_BYTES:
        raise _WireError("varint longer than 10 bytes")
    owner = terminators[:-1]  # varint index of every byte (terminators seen before it)
    shift = (np.arange(len(data)) - starts[owner]).astype(np.uint64) * np.uint64(7)
    groups = (data & 0x7F).astype(np.uint64) << shift
    return np.bitwise_or.reduceat(groups, starts), counts


# --- writing -----------------------------------------------------------------------------------

def encode_varint(value: int) -> bytes:
    """The varint encoding of a non-negative int below 2**64 (negatives: pass ``value & MASK64``)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_packed_varints(values: np.ndarray) -> bytes:
    """The concatenated varint encodings of ``values`` (any integer array; negatives as uint64)."""
    vals = np.asarray(values).astype(np.int64, copy=False).view(np.uint64).ravel()
    if not len(vals):
        return b""
    # Bytes per value: 1 + the number of 7-bit groups above the lowest one.
    nbytes = np.ones(len(vals), np.int64)
    for k in range(1, _MAX_VARINT_BYTES):
        nbytes += vals >= (np.uint64(1) << np.uint64(7 * k))
    ends = np.cumsum(nbytes)
    owner = np.repeat(np.arange(len(vals)), nbytes)
    position = np.arange(ends[-1]) - np.repeat(ends - nbytes, nbytes)
    out = ((vals[owner] >> (position.astype(np.uint64) * np.uint64(7))) & np.uint64(0x7F))
    out = out.astype(np.uint8)
    out[position < nbytes[owner] - 1] |= 0x80
    return out.tobytes()


def len_field(field_number: int, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return encode_varint(field_number << 3 | WIRE_LEN) + encode_varint(len(payload)) + payload


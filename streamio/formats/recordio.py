"""RecordIO framing (MXNet / dmlc-core, also SageMaker's RecordIO-protobuf).

Layout of one frame (little-endian)::

    u32 magic 0xCED7230A | u32 lrec | payload[length] | zero pad to a multiple of 4

with ``cflag = lrec >> 29`` and ``length = lrec & 0x1FFFFFFF``. cflag 0 is a whole record; a
record split in parts is cflag 1 (first), 2 (middle)..., 3 (last). Two conventions join parts:

* ``"dmlc"`` (MXNet's ``RecordIOWriter``): the writer splits a payload exactly where the magic
  number appears at a 4-aligned offset and drops those 4 bytes, so the reader puts the magic back
  between parts.
* ``"concat"`` (Amazon's tools, e.g. ML-IO): parts are joined as they are.
"""

from __future__ import annotations

import struct
from typing import Literal, Optional

from ..errors import CorruptRecordError, FormatError, RecordTooLargeError, TruncatedStreamError
from ..errors import UsageError
from ._base import DEFAULT_MAX_RECORD_SIZE, OnError
from ._framing import BAD_HEADER, OK, SPECIAL, TOO_LARGE, LengthPrefixedFramer

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
HEADER_SIZE = 8
LENGTH_MASK = (1 << 29) - 1
MULTIPART_CHOICES = ("dmlc", "concat")
Multipart = Literal["dmlc", "concat"]
_HEADER = struct.Struct("<II")


def scan_recordio(buf, pos: int, end: int, max_record_size: int, out: list) -> tuple[int, int]:
    """Frame whole cflag-0 records from ``buf[pos:end]`` into ``out``.

    Stops with ``SPECIAL`` at a whole multi-part frame (the framer assembles parts), ``BAD_HEADER``
    at a wrong magic number, ``TOO_LARGE`` at a length over the limit, ``OK`` when the next frame
    is not whole yet. Reference implementation of ``streamio._speedups.scan_recordio``.
    """
    unpack = _HEADER.unpack_from
    append = out.append
    while end - pos >= HEADER_SIZE:
        magic, lrec = unpack(buf, pos)
        if magic != MAGIC:
            return pos, BAD_HEADER
        length = lrec & LENGTH_MASK
        if length > max_record_size:
            return pos, TOO_LARGE
        stop = pos + HEADER_SIZE + length
        if stop + (-length & 3) > end:
            return pos, OK
        if lrec >> 29:
            return pos, SPECIAL
        append(bytes(buf[pos + HEADER_SIZE:stop]))
        pos = stop + (-length & 3)
    return pos, OK


try:
    from .._speedups import scan_recordio as _fast_scan_recordio  # type: ignore
except ImportError:  # pragma: no cover - depends on the build
    _fast_scan_recordio = None


def encode_recordio(payload, *, multipart: Multipart = "dmlc") -> bytes:
    """Frame ``payload`` the way MXNet's writer does.

    With ``"dmlc"``, the payload is split wherever the magic number sits at a 4-aligned offset
    (those 4 bytes are dropped and restored by the reader), so the magic never appears inside a
    frame at an aligned position and a reader can resynchronise on it.
    """
    payload = bytes(payload)
    if len(payload) > LENGTH_MASK:
        raise UsageError(f"RecordIO payloads are limited to {LENGTH_MASK} bytes")
    parts = []
    start = 0
    if multipart == "dmlc":
        i = payload.find(MAGIC_BYTES)
        while i != -1:
            if i % 4 == 0:
                parts.append(payload[start:i])
                start = i + 4
                i = payload.find(MAGIC_BYTES, start)
            else:
                i = payload.find(MAGIC_BYTES, i + 1)
    elif multipart != "concat":
        raise UsageError(f"multipart must be one of {MULTIPART_CHOICES}, not {multipart!r}")
    last = payload[start:]
    frames = []
    for k, part in enumerate(parts):
        frames.append(_frame(1 if k == 0 else 2, part))
    frames.append(_frame(3 if parts else 0, last))
    return b"".join(frames)


def _frame(cflag: int, part: bytes) -> bytes:
    return b"".join((_HEADER.pack(MAGIC, (cflag << 29) | len(part)), part, b"\0" * (-len(part) & 3)))


class RecordIOFramer(LengthPrefixedFramer):
    """Sans-IO RecordIO framer: ``feed(chunk) -> records``, ``finish()`` at end of stream."""

    HEADER = HEADER_SIZE

    def __init__(self, *, multipart: Multipart = "dmlc", on_error: OnError = "raise",
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE, source: Optional[str] = None,
                 accelerate: bool = True) -> None:
        super().__init__(on_error=on_error, max_record_size=max_record_size, source=source)
        if multipart not in MULTIPART_CHOICES:
            raise UsageError(f"multipart must be one of {MULTIPART_CHOICES}, not {multipart!r}")
        self.multipart = multipart
        self._joiner = MAGIC_BYTES if multipart == "dmlc" else b""
        self._kernel = _fast_scan_recordio if accelerate and _fast_scan_recordio else scan_recordio
        self._parts: Optional[list] = None  # parts of the record being assembled
        self._parts_size = 0
        self._parts_offset = 0  # stream offset of the first part
        self._frames = 0  # frames seen before the current kernel call (for messages)

    def _scan(self, buf, pos, end, out):
        if self._parts is not None:
            # Inside a multi-part record every frame goes through _special, cflag 0 included.
            if end - pos < HEADER_SIZE:
                return pos, OK
            magic, lrec = _HEADER.unpack_from(buf, pos)
            if magic != MAGIC:
                return pos, BAD_HEADER
            length = lrec & LENGTH_MASK
            if length > self.max_record_size:
                return pos, TOO_LARGE
            if pos + HEADER_SIZE + length + (-length & 3) > end:
                return pos, OK
            return pos, SPECIAL
        before = len(out)
        result = self._kernel(buf, pos, end, self.max_record_size, out)
        self._frames += len(out) - before
        return result

    def _frame_size(self, buf, pos):
        length = _HEADER.unpack_from(buf, pos)[1] & LENGTH_MASK
        return HEADER_SIZE + length + (-length & 3)

    def _header_is_sound(self, buf, pos, base):
        # A record (or a first part) starts on a 4-aligned stream offset with the magic number.
        if (base + pos) & 3:
            return False
        magic, lrec = _HEADER.unpack_from(buf, pos)
        return magic == MAGIC and lrec >> 29 in (0, 1) and lrec & LENGTH_MASK <= self.max_record_size

    def _length_is_trusted(self, buf, pos):
        return True  # the magic number checked out

    def _header_fault(self, buf, pos, offset) -> FormatError:
        magic = _HEADER.unpack_from(buf, pos)[0]
        self._drop_parts()
        return self._fault(CorruptRecordError,
                           f"RecordIO part #{self._frames + 1}: bad magic number 0x{magic:08X}"
                           f" (expected 0x{MAGIC:08X})", offset)

    def _data_fault(self, buf, pos, offset):  # RecordIO has no payload checksum
        raise AssertionError("unreachable")

    def _too_large(self, buf, pos, offset) -> RecordTooLargeError:
        length = _HEADER.unpack_from(buf, pos)[1] & LENGTH_MASK
        self._drop_parts()
        return self._fault(RecordTooLargeError,
                           f"RecordIO part #{self._frames + 1} length {length} exceeds"
                           f" max_record_size={self.max_record_size}", offset)

    def _drop_parts(self) -> None:
        if self._parts is not None:
            self._parts = None
            self._parts_size = 0

    def _special(self, buf, pos, end, base, out) -> Optional[int]:
        """Handle one whole frame of a multi-part record (or a cflag 0 frame inside one)."""
        lrec = _HEADER.unpack_from(buf, pos)[1]
        cflag, length = lrec >> 29, lrec & LENGTH_MASK
        size = HEADER_SIZE + length + (-length & 3)
        self._frames += 1
        part = bytes(buf[pos + HEADER_SIZE:pos + HEADER_SIZE + length])
        offset = base + pos
        if cflag > 3:  # three bits, but only 0..3 mean anything: a corrupt header
            self._frames -= 1
            err = self._fault(CorruptRecordError,
                              f"RecordIO part #{self._frames + 1}: invalid cflag {cflag}", offset)
            self._drop_parts()
            if self._stop(err):
                return None
            self._skip(err, 1)
            self._resync = True
            return pos + 1
        names = {0: "a whole record (cflag 0)", 1: "a first part (cflag 1)",
                 2: "a middle part (cflag 2)", 3: "a last part (cflag 3)"}
        if self._parts is None:
            if cflag == 1:
                self._parts, self._parts_size, self._parts_offset = [part], length, offset
                return pos + size
            # cflag 2 or 3 with no record started (cflag 0 never reaches here outside a record)
            err = self._fault(
                CorruptRecordError,
                f"RecordIO part #{self._frames} is {names[cflag]} but no multi-part record was"
                f" started: a whole record (cflag 0) or a first part (cflag 1) must come", offset)
            if self._stop(err):
                return None
            self._skip(err, size)
            return pos + size
        if cflag in (0, 1):
            err = self._fault(
                CorruptRecordError,
                f"RecordIO part #{self._frames} is {names[cflag]} inside an unfinished multi-part"
                f" record that started at byte {self._parts_offset}", self._parts_offset)
            if self._stop(err):
                return None
            self._skip(err, offset - self._parts_offset)
            self._drop_parts()
            return pos  # reprocess this frame as the start of a new record
        self._parts_size += length + len(self._joiner)
        if self._parts_size > self.max_record_size:
            err = self._fault(
                RecordTooLargeError,
                f"RecordIO multi-part record exceeds max_record_size={self.max_record_size}",
                self._parts_offset)
            self._drop_parts()
            if self._stop(err):
                return None
            self._skip(err, offset + size - self._parts_offset)
            return pos + size
        self._parts.append(part)
        if cflag == 3:
            out.append(self._joiner.join(self._parts))
            self.records += 1
            self._drop_parts()
        return pos + size

    def _finish_extra(self, out):
        if self._parts is not None:
            err = self._fault(
                TruncatedStreamError,
                f"stream ends inside a multi-part record ({len(self._parts)} parts, no last part)",
                self._parts_offset)
            nbytes = self._consumed - self._parts_offset
            self._drop_parts()
            self._end_fault(err, nbytes)

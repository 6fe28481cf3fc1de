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

import re
import struct
from typing import Literal, Optional, Tuple

from ..errors import CorruptRecordError, FormatError, RecordTooLargeError, TruncatedStreamError
from ..errors import UsageError
from ._base import DEFAULT_MAX_RECORD_SIZE, OnError
from ._framing import BAD_HEADER, OK, SPECIAL, TOO_LARGE, UNCONFIRMED, LengthPrefixedFramer
from ._recordio_sync import find_recordio_sync_numpy

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
HEADER_SIZE = 8
LENGTH_MASK = (1 << 29) - 1
MULTIPART_CHOICES = ("dmlc", "concat")
Multipart = Literal["dmlc", "concat"]
_HEADER = struct.Struct("<II")


def scan_recordio(buf, pos: int, end: int, max_record_size: int, out: list) -> tuple[int, int]:
    """Frame whole cflag-0 records from ``buf[pos:end]`` into ``out``.

    RecordIO has no checksum, so a frame is taken only when the next frame's magic number follows
    it: a length damaged in transit is caught before it swallows the records after it. Stops with
    ``SPECIAL`` at a whole multi-part frame (the framer assembles parts), ``BAD_HEADER`` at a wrong
    magic number, ``TOO_LARGE`` at a length over the limit, ``UNCONFIRMED`` at a whole frame not
    followed by the magic (or by fewer than 4 bytes: the framer decides), ``OK`` when the next
    frame is not whole yet. Reference implementation of ``streamio._speedups.scan_recordio``.
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
        frame_end = stop + (-length & 3)
        if frame_end > end:
            return pos, OK
        if end - frame_end < 4 or buf[frame_end:frame_end + 4] != MAGIC_BYTES:
            return pos, UNCONFIRMED
        if lrec >> 29:
            return pos, SPECIAL
        append(bytes(buf[pos + HEADER_SIZE:stop]))
        pos = frame_end
    return pos, OK


_MAGIC_SEARCH = re.compile(re.escape(MAGIC_BYTES)).search  # works on any buffer, no copy
# Magic numbers the loop rejects before the rest of the search goes to numpy: on garbage the
# magic is rare and ``re`` finds it at GB/s, but each rejected one costs the loop about a
# microsecond of Python (garbage made of magic numbers ran at 7-25 MB/s); numpy's set-up costs
# about what the loop spends on ten.
_LOOP_REJECTS = 8


def find_recordio_sync(buf, pos: int, end: int, base: int, max_record_size: int) -> int:
    """The first ``q`` in ``[pos, end - 8]`` where a record can start, or -1.

    A record (or the first part of one) starts at a 4-aligned stream offset (``base + q``) with
    the magic number, cflag 0 or 1 and a length within ``max_record_size``. Reference of
    ``streamio._speedups.find_recordio_sync``, and what the framer uses without it:
    :func:`_find_recordio_sync_loop` (the specification) until it has rejected a few magic
    numbers, then the numpy version (same answers) for the rest.
    """
    found, stopped = _magic_loop(buf, pos, end, base, max_record_size, _LOOP_REJECTS)
    if stopped is None:
        return found
    return find_recordio_sync_numpy(buf, stopped, end, base, max_record_size)


def _find_recordio_sync_loop(buf, pos: int, end: int, base: int, max_record_size: int) -> int:
    """``find_recordio_sync`` spelled out, the specification: every magic number ``re`` finds
    is tested in turn."""
    return _magic_loop(buf, pos, end, base, max_record_size, None)[0]


def _magic_loop(buf, pos: int, end: int, base: int, max_record_size: int,
                give_up: Optional[int]) -> Tuple[int, Optional[int]]:
    """Test the magic numbers ``re`` finds in turn: ``(offset or -1, None)``, or ``(-1, where
    to go on)`` once more than ``give_up`` were rejected."""
    last = end - HEADER_SIZE
    rejects = 0
    while pos <= last:
        hit = _MAGIC_SEARCH(buf, pos, last + 4)
        if hit is None:
            return -1, None
        q = hit.start()
        if not (base + q) & 3:
            lrec = _HEADER.unpack_from(buf, q)[1]
            if lrec >> 29 <= 1 and lrec & LENGTH_MASK <= max_record_size:
                return q, None
        pos = q + 1
        rejects += 1
        if give_up is not None and rejects > give_up:
            return -1, pos
    return -1, None


try:
    from .._speedups import find_recordio_sync as _fast_find_recordio_sync  # type: ignore
    from .._speedups import scan_recordio as _fast_scan_recordio  # type: ignore
except ImportError:  # pragma: no cover - depends on the build
    _fast_scan_recordio = _fast_find_recordio_sync = None


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
        fast = accelerate and _fast_scan_recordio is not None
        self._kernel = _fast_scan_recordio if fast else scan_recordio
        self._sync_kernel = _fast_find_recordio_sync if fast else find_recordio_sync
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
            frame_end = pos + HEADER_SIZE + length + (-length & 3)
            if frame_end > end:
                return pos, OK
            if end - frame_end < 4 or buf[frame_end:frame_end + 4] != MAGIC_BYTES:
                return pos, UNCONFIRMED
            return pos, SPECIAL
        before = len(out)
        result = self._kernel(buf, pos, end, self.max_record_size, out)
        self._frames += len(out) - before
        return result

    def _frame_size(self, buf, pos):
        length = _HEADER.unpack_from(buf, pos)[1] & LENGTH_MASK
        return HEADER_SIZE + length + (-length & 3)

    # A frame cut short by the end of the stream may be one whose length was damaged: under
    # on_error="skip" the records in the bytes it held are still found.
    RESCAN_TRUNCATED = True

    def _find_sync(self, buf, pos, end, base):
        q = self._sync_kernel(buf, pos, end, base, self.max_record_size)
        return None if q < 0 else q

    def _length_is_trusted(self, buf, pos):
        # No checksum covers the length: an oversized one is as likely a damaged one, so the
        # framer resynchronises (on the next aligned magic) instead of dropping that many bytes.
        return False

    def _unconfirmed(self, buf, pos, end, base, out) -> Optional[int]:
        """A whole frame that the next frame's magic number does not follow (or not yet).

        If the frame would hold the start of another record (an aligned magic with a sound
        header), its length is the likely damage: drop the frame and go on at that record. If it
        holds none, the length is plausible: take the frame (what follows it is checked next).
        With fewer than 4 bytes after it, wait for them unless the stream has ended.
        """
        size = self._frame_size(buf, pos)
        frame_end = pos + size
        inner = self._sync_kernel(buf, pos + HEADER_SIZE, min(end, frame_end + HEADER_SIZE - 1),
                                  base, self.max_record_size)
        if inner < 0 and not self._at_eof and self._undecided(buf, pos, frame_end, end, base):
            # A record may start inside the frame, but its header runs past the bytes so far:
            # wait for them, so that how the stream was cut cannot change the verdict.
            self._tail = bytearray(buf[pos:end])  # held: at most max_record_size + 15 bytes
            return None
        if inner < 0 or (self._at_eof and frame_end == end):
            return self._take(buf, pos, end, base, out)
        if end - frame_end < 4 and not self._at_eof:
            self._tail = bytearray(buf[pos:end])  # held: at most max_record_size + 15 bytes
            return None
        length = _HEADER.unpack_from(buf, pos)[1] & LENGTH_MASK
        err = self._fault(
            CorruptRecordError,
            f"RecordIO part #{self._frames + 1}: length {length} is not followed by the magic"
            f" number, and the frame would swallow the record at byte {base + inner}"
            " (corrupt length)", base + pos)
        self._drop_parts()
        if self._stop(err):
            return None
        self._skip(err, inner - pos)
        return inner

    @staticmethod
    def _undecided(buf, pos: int, frame_end: int, end: int, base: int) -> bool:
        """Whether an aligned offset inside the frame shows the magic number (or as much of it
        as there is) while its 8-byte header is not whole in ``buf[:end]``: a record start that
        only more bytes can confirm or rule out."""
        first = max(pos + HEADER_SIZE, end - HEADER_SIZE + 1)
        first += -(base + first) & 3
        for q in range(first, min(frame_end, end), 4):
            seen = bytes(buf[q:min(q + 4, end)])
            if MAGIC_BYTES.startswith(seen):
                return True
        return False

    # Byte ranges. dmlc: a record starts exactly where an aligned magic with cflag 0 or 1 sits
    # (the writer splits payloads at every aligned magic), so both sides of a boundary agree on
    # the header alone. "concat" payloads may hold such a magic: the frame must also be followed
    # by another magic (or end the stream). A chance match then needs a payload that holds, at
    # aligned offsets, the magic, a plausible length word and the magic again where that length
    # points (about 2**-67 per aligned word of random data); a payload that is itself RecordIO
    # data (a nested .rec file) can fool it, and such data should be split by an index.
    def _at_stop(self, buf, pos, end, base):
        if self._parts is not None:
            return False  # a part of a record that started before the range's end
        if end - pos < HEADER_SIZE:
            return False if self._at_eof else None
        magic, lrec = _HEADER.unpack_from(buf, pos)
        length = lrec & LENGTH_MASK
        if magic != MAGIC or (base + pos) & 3 or lrec >> 29 > 1 or length > self.max_record_size:
            return False
        if self.multipart == "dmlc":
            return True
        frame_end = pos + HEADER_SIZE + length + (-length & 3)
        if frame_end + 4 <= end:
            return bytes(buf[frame_end:frame_end + 4]) == MAGIC_BYTES
        if self._at_eof:
            return frame_end == end
        return None

    def _seek_accepts(self, buf, pos, end, base):
        return self._at_stop(buf, pos, end, base)

    def _framed_size(self, record):
        return HEADER_SIZE + len(record) + (-len(record) & 3)

    def _take(self, buf, pos, end, base, out) -> Optional[int]:
        """Take the whole frame at ``pos`` as the kernel would have."""
        lrec = _HEADER.unpack_from(buf, pos)[1]
        if self._parts is not None or lrec >> 29:
            return self._special(buf, pos, end, base, out)
        length = lrec & LENGTH_MASK
        out.append(bytes(buf[pos + HEADER_SIZE:pos + HEADER_SIZE + length]))
        self.records += 1
        self._frames += 1
        return pos + self._frame_size(buf, pos)

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

    def _magic_inside(self, buf, pos: int, length: int, base: int) -> int:
        """With "dmlc", the offset of an aligned magic number inside the frame's payload, or -1.

        MXNet's writer splits a payload at every aligned magic, so a part never holds one: if it
        does, its length is damaged and it swallowed the frames after it (a coincidence the
        next-magic check misses when the bad length ends exactly on another frame). Checked for
        multi-part frames, which pass through Python anyway.
        """
        if self.multipart != "dmlc":
            return -1
        q, stop = pos + HEADER_SIZE, pos + HEADER_SIZE + length
        while True:
            hit = _MAGIC_SEARCH(buf, q, stop)
            if hit is None:
                return -1
            q = hit.start()
            if not (base + q) & 3:
                return q
            q += 1

    def _special(self, buf, pos, end, base, out) -> Optional[int]:
        """Handle one whole frame of a multi-part record (or a cflag 0 frame inside one)."""
        lrec = _HEADER.unpack_from(buf, pos)[1]
        cflag, length = lrec >> 29, lrec & LENGTH_MASK
        size = HEADER_SIZE + length + (-length & 3)
        self._frames += 1
        part = bytes(buf[pos + HEADER_SIZE:pos + HEADER_SIZE + length])
        offset = base + pos
        swallowed = self._magic_inside(buf, pos, length, base)
        if cflag > 3 or swallowed >= 0:  # cflag: three bits, but only 0..3 mean anything
            self._frames -= 1
            what = (f"invalid cflag {cflag}" if cflag > 3 else
                    f"length {length} would swallow the frame at byte {base + swallowed}"
                    " (corrupt length)")
            err = self._fault(CorruptRecordError, f"RecordIO part #{self._frames + 1}: {what}",
                              offset)
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

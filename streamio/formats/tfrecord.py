"""TFRecord framing.

Layout of one record (all integers little-endian)::

    u64 length | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)

with ``masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xA282EAD8  (mod 2**32)`` over CRC-32C
(Castagnoli). Both checksums are verified unless ``verify=False``.
"""

from __future__ import annotations

import struct
from typing import Optional

import crc32c as _crc32c

from ..errors import CorruptRecordError, FormatError, RecordTooLargeError, SplitError
from ._base import DEFAULT_MAX_RECORD_SIZE, OnError
from ._framing import BAD_DATA, BAD_HEADER, OK, TOO_LARGE, LengthPrefixedFramer
from ._tfrecord_sync import find_tfrecord_sync_numpy

HEADER_SIZE = 12
FOOTER_SIZE = 4
#: How far a byte-range reader follows the chain of frames from a candidate record start
#: before it takes it (and the reader before it, before it stops there): a payload that holds
#: TFRecord frames chaining over less than this is never taken for records; one chaining over
#: more makes the split fail loudly (see ``TFRecordFramer._chain_confirms``). Each range reads
#: about this much past its end and holds it while it decides.
CONFIRM_BYTES = 256 * 1024
_CONFIRM_SPANS = 4096  # frames per call of the hop kernel
_DEAD_LINKS_MAX = 1 << 16  # offsets remembered as not starting a record
_PENDING_MAX = 4  # candidates remembered as chained so far (two are pending at most)
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_crc = _crc32c.crc32c


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = _crc(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def scan_tfrecords(buf, pos: int, end: int, verify: bool, max_record_size: int,
                   out: list) -> tuple[int, int]:
    """Frame whole records from ``buf[pos:end]`` into ``out`` (as ``bytes``).

    Returns ``(pos, status)``: ``pos`` is where the first frame not taken starts, ``status`` says
    why it was not taken (``OK``: not whole yet). This is the reference implementation of the
    kernel; ``streamio._speedups.scan_tfrecords`` must give identical results.
    """
    unpack = _HEADER.unpack_from
    crc = _crc
    append = out.append
    while end - pos >= HEADER_SIZE:
        length, length_crc = unpack(buf, pos)
        if verify:
            c = crc(buf[pos:pos + 8])
            if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                return pos, BAD_HEADER
        if length > max_record_size:
            return pos, TOO_LARGE
        start = pos + HEADER_SIZE
        stop = start + length
        if stop + FOOTER_SIZE > end:
            return pos, OK
        data = buf[start:stop]
        if verify:
            c = crc(data)
            if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != _U32.unpack_from(buf, stop)[0]:
                return pos, BAD_DATA
        append(bytes(data))
        pos = stop + FOOTER_SIZE
    return pos, OK


def scan_tfrecord_spans(buf, pos: int, end: int, verify: bool, max_record_size: int,
                       spans, data: bool = True) -> tuple[int, int, int]:
    """Frame whole records from ``buf[pos:end]`` as :func:`scan_tfrecords` does, writing each
    payload's ``(offset in buf, length)`` to ``spans`` (a writable buffer of int64, two entries
    a record) instead of making it a ``bytes``: the records stay in ``buf`` until someone makes
    them (:class:`~streamio.formats._framing.RecordSpans`). Stops with ``OK`` once ``spans`` is
    full. ``data=False``: the payload CRCs are not checked (the headers' are, under
    ``verify``); the consumer checks each one as it copies the record (its masked CRC follows
    it in ``buf``), in one pass over its bytes. Returns ``(n, pos, status)``: ``n`` records
    framed. The reference implementation of ``streamio._speedups.scan_tfrecord_spans``:
    identical results, same errors."""
    out = memoryview(spans)
    if out.readonly:
        raise BufferError("Object is not writable.")
    if out.itemsize != 8:
        raise ValueError("spans must be a writable buffer of int64")
    view = memoryview(buf)
    if pos < 0:
        raise ValueError(f"pos must be >= 0, not {pos}")
    if end > view.nbytes:
        raise ValueError(f"end {end} is past the end of the buffer ({view.nbytes} bytes)")
    if _overlap(view, out):
        raise ValueError("spans overlaps buf")
    pairs = out.cast("B").cast("q")
    cap = len(pairs) // 2
    unpack = _HEADER.unpack_from
    n = 0
    while n < cap and end - pos >= HEADER_SIZE:
        length, length_crc = unpack(buf, pos)
        if verify and masked_crc32c(buf[pos:pos + 8]) != length_crc:
            return n, pos, BAD_HEADER
        if length > max_record_size:
            return n, pos, TOO_LARGE
        start = pos + HEADER_SIZE
        stop = start + length
        if stop + FOOTER_SIZE > end:
            return n, pos, OK
        if verify and data and masked_crc32c(buf[start:stop]) != _U32.unpack_from(buf, stop)[0]:
            return n, pos, BAD_DATA
        pairs[2 * n], pairs[2 * n + 1] = start, length
        n += 1
        pos = stop + FOOTER_SIZE
    return n, pos, OK


def _overlap(a: memoryview, b: memoryview) -> bool:
    """Whether two buffers share memory (numpy tells, for any objects that export buffers)."""
    import numpy as np

    return bool(np.shares_memory(np.frombuffer(a.cast("B") if a.format != "B" else a, np.uint8),
                                 np.frombuffer(b.cast("B"), np.uint8)))


# Below this many bytes the loop beats numpy's set-up cost (the junction of two chunks, a
# header probed at a range boundary): about 10 us against 0.2 us per offset.
_LOOP_SPAN = 76


def find_tfrecord_sync(buf, pos: int, end: int, max_record_size: int) -> int:
    """The first ``q`` in ``[pos, end - 12]`` where a sound TFRecord header starts, or -1.

    Sound: the length is within ``max_record_size`` and its masked CRC checks out (always checked
    here, even with verify=False: it is the only way to tell a frame boundary from payload bytes).
    Reference of ``streamio._speedups.find_tfrecord_sync``, and what the framer uses without
    it: :func:`_find_tfrecord_sync_loop` (the specification) for a few offsets, the numpy
    version (same answers, 40-200x faster on a long search) for more.
    """
    if end - pos < _LOOP_SPAN:
        return _find_tfrecord_sync_loop(buf, pos, end, max_record_size)
    return find_tfrecord_sync_numpy(buf, pos, end, max_record_size)


def _find_tfrecord_sync_loop(buf, pos: int, end: int, max_record_size: int) -> int:
    """``find_tfrecord_sync`` spelled out: it tests every offset; the CRC of a length is
    computed once per distinct length in a row (garbage such as a run of zeros repeats one), and
    lengths over the limit are rejected before any CRC."""
    unpack = _HEADER.unpack_from
    last_length, last_crc = -1, 0
    for q in range(pos, end - HEADER_SIZE + 1):
        length, length_crc = unpack(buf, q)
        if length > max_record_size:
            continue
        if length != last_length:
            last_length, last_crc = length, masked_crc32c(buf[q:q + 8])
        if last_crc == length_crc:
            return q
    return -1


try:  # the C accelerator, if it was built; tests compare it with the reference above
    from .._speedups import find_tfrecord_sync as _fast_find_tfrecord_sync  # type: ignore
    from .._speedups import scan_tfrecords as _fast_scan_tfrecords  # type: ignore
except ImportError:  # pragma: no cover - depends on the build
    _fast_scan_tfrecords = _fast_find_tfrecord_sync = None
try:
    from .._speedups import scan_tfrecord_spans as _fast_scan_spans  # type: ignore
except ImportError:  # pragma: no cover - depends on the build
    _fast_scan_spans = None


def encode_tfrecord(payload) -> bytes:
    """One TFRecord frame holding ``payload``."""
    length = struct.pack("<Q", len(payload))
    return b"".join((length, _U32.pack(masked_crc32c(length)), bytes(payload),
                     _U32.pack(masked_crc32c(payload))))


class TFRecordFramer(LengthPrefixedFramer):
    """Sans-IO TFRecord framer: ``feed(chunk) -> records``, ``finish()`` at end of stream."""

    HEADER = HEADER_SIZE
    COMPLETES_IN_PLACE = True
    CHECK_NEXT_START = True  # see _at_stop

    def __init__(self, *, verify: bool = True, on_error: OnError = "raise",
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE, source: Optional[str] = None,
                 accelerate: bool = True) -> None:
        super().__init__(on_error=on_error, max_record_size=max_record_size, source=source)
        self.verify = bool(verify)
        fast = accelerate and _fast_scan_tfrecords is not None
        self._kernel = _fast_scan_tfrecords if fast else scan_tfrecords
        self._spans_kernel = (_fast_scan_spans if fast and _fast_scan_spans is not None
                              else scan_tfrecord_spans)
        self._sync_kernel = _fast_find_tfrecord_sync if fast else find_tfrecord_sync
        # Byte ranges: the kernel that hops from frame to frame (writing spans, no copies), the span
        # buffer it writes, how far pending candidates have chained (this range's start and the
        # next one's may be pending at once, in a short range), and offsets known not to start
        # a record (their chain broke).
        self._hop_kernel = (_fast_scan_spans if fast and _fast_scan_spans is not None
                            else scan_tfrecord_spans)
        self._confirm_spans = None
        self._confirm_at: dict = {}
        self._dead_links: set = set()

    def _scan(self, buf, pos, end, out):
        return self._kernel(buf, pos, end, self.verify, self.max_record_size, out)

    def _scan_spans(self, buf, pos, end, spans):
        return self._spans_kernel(buf, pos, end, self.verify, self.max_record_size, spans,
                                  not self.span_crcs)

    def _defers_crcs(self):
        # Under "skip"/"warn" a damaged record is dropped and framing goes on: the scan checks.
        return self.verify and self.on_error == "raise"

    def _frame_size(self, buf, pos):
        return HEADER_SIZE + _HEADER.unpack_from(buf, pos)[0] + FOOTER_SIZE

    def _find_sync(self, buf, pos, end, base):
        q = self._sync_kernel(buf, pos, end, self.max_record_size)
        return None if q < 0 else q

    # Byte ranges: see _chain_confirms. The reader that stops makes the search the next
    # range's reader makes (the first offset from its stop that confirms), so the two agree on
    # where the next range begins, or the one that stops raises SplitError.
    def _at_stop(self, buf, pos, end, base):
        start = self._next_range_start()
        if start is None:
            return None
        if start < base + pos:
            # The next range starts inside this reader's records: they end here, then the
            # error (parked: raised by the next call), whatever on_error says.
            self._error = self._split_fault(start)
            return True
        return start == base + pos

    def _seek_accepts(self, buf, pos, end, base):
        return self._chain_confirms(buf, pos, end, base)

    def _chain_confirms(self, buf, pos, end, base) -> Optional[bool]:
        """Whether a record starts at ``buf[pos]`` (stream offset ``base + pos``) for a byte
        range: the frames from there chain, each whole (length and data CRCs; the length CRC
        only with ``verify=False``), over at least :data:`CONFIRM_BYTES` or exactly to the end
        of the stream (a chain that ends in a cut frame, or in bytes too few for a header, does
        not confirm). None: more bytes are needed. The reader that starts takes the first
        offset at or after its start that confirms. The reader that stops makes that same
        search from its stop offset (:meth:`_next_range_start`) and ends at the offset found,
        which must be one of its own frames. The file's own frames chain to its end and frames
        inside a payload do not (below), so both find the file's first record start there:
        the ranges tile the records, each delivered once.

        Why a chain: a payload may hold whole TFRecord frames (TFRecords packed as records).
        Frames inside a payload chain only inside it: at its end come the outer frame's data
        CRC and the next header, which make no sound header (save for a CRC collision), so the
        inner chain breaks within that record, while the file's chain goes on. An offset on a
        broken chain is remembered as no record start (``_dead_links``: a payload of many small
        frames is searched once, not once per frame). Damage that breaks the file's own chain
        makes the reader that stops frame on through it, reporting it, to the next offset that
        confirms, where the next range starts. Limit: frames in payloads that chain over more
        than ``CONFIRM_BYTES`` (a TFRecord file stored as one record, or frames forged to run
        on across records) confirm, and the next range's reader takes them for records; no
        rule that reads from a split point on can do better for every file (the bytes after
        it may be the tail of a record that holds them all). The reader that stops, which
        reads the file's own frames, then finds the offset inside its records and raises
        :class:`~streamio.errors.SplitError`: such files need an index, or whole-file shards."""
        at = base + pos
        if at in self._dead_links:
            return False
        p = pos
        reached = self._confirm_at.pop(at, None)
        if reached is not None:
            p = max(pos, min(reached - base, end))  # already chained this far
        horizon = pos + CONFIRM_BYTES
        spans = self._confirm_spans
        if spans is None:
            import numpy as np

            spans = self._confirm_spans = np.empty(2 * _CONFIRM_SPANS, np.int64)
        links = []
        while p < horizon:
            n, after, status = self._hop_kernel(buf, p, end, True, self.max_record_size, spans,
                                                self.verify)
            if n:
                links.extend(spans[0:2 * n:2].tolist())
            p = after
            if status == OK and n == _CONFIRM_SPANS:
                continue  # the span buffer was full
            if p >= horizon:
                break
            if status == OK and not self._at_eof:  # the end of the bytes so far
                if len(self._confirm_at) >= _PENDING_MAX:
                    self._confirm_at.clear()
                self._confirm_at[at] = base + p
                return None
            if status == OK and p == end:
                break  # chained to the end of the stream exactly
            if status == TOO_LARGE and p > pos:
                break  # chained to a sound header; the framer reports its length
            if len(self._dead_links) < _DEAD_LINKS_MAX:
                # The frames on this chain break where it does: none of them starts a record.
                self._dead_links.update(base + q - HEADER_SIZE for q in links)
                self._dead_links.add(at)
            return False
        return True

    def _framed_size(self, record):
        return HEADER_SIZE + len(record) + FOOTER_SIZE

    def _finish_extra(self, out):
        # The stream ended before a frame of this reader's where its range ends: the next
        # range's reader must find no record start either (it would be inside these records).
        if self._stop_at is not None and not self.done and self._error is None:
            self._at_eof = True
            start = self._next_range_start()
            if start < self._fed:
                self._error = self._split_fault(start)

    def _split_fault(self, start: int) -> SplitError:
        """The next range's reader starts at stream offset ``start``, inside the records of
        this one (whose last record framed is ``_last_frame``)."""
        at, end, index = self._last_frame or (None, None, None)
        if end is None:
            where = "inside this range's records"
        elif start < end:
            where = f"inside record {index} (bytes {at} to {end})"
        else:
            where = f"in damaged bytes this reader skipped after record {index} (at byte {at})"
        return SplitError(
            f"cannot split by byte range at byte {self._stop_at}: the next range's reader would"
            f" start at byte {start}, {where}, where TFRecord frames chain over {CONFIRM_BYTES}"
            " bytes (TFRecord data stored as a record?) and would be read as records. The file"
            " need not be damaged: write an index beside it (`streamio index FILE`), which"
            " makes the cuts exact, or shard by whole files",
            source=self.source, offset=at, record_index=index, split_offset=self._stop_at,
            next_start=start)

    def _length_is_trusted(self, buf, pos):
        length, length_crc = _HEADER.unpack_from(buf, pos)
        return self.verify and masked_crc32c(buf[pos:pos + 8]) == length_crc

    def _header_fault(self, buf, pos, offset) -> FormatError:
        return self._fault(CorruptRecordError, "TFRecord length CRC mismatch (corrupt header)",
                           offset)

    def _data_fault(self, buf, pos, offset) -> FormatError:
        return self._fault(CorruptRecordError, "TFRecord data CRC mismatch (corrupt payload)",
                           offset)

    def _too_large(self, buf, pos, offset) -> RecordTooLargeError:
        length = _HEADER.unpack_from(buf, pos)[0]
        return self._fault(
            RecordTooLargeError,
            f"TFRecord length {length} exceeds max_record_size={self.max_record_size}", offset)

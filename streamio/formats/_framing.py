"""The shared state machine of length-prefixed framers (TFRecord, RecordIO).

A format supplies a *scan kernel*, a pure function that frames as many whole records as a buffer
holds and stops at the first frame it cannot take whole (too short, or faulty), plus a few small
hooks. This class keeps everything that must survive between chunks: the tail of a frame split
across chunks, the resynchronisation state after corruption, and the bytes still to discard after
an oversized record.

Kernel statuses (also returned by the C accelerator, which implements the same kernels):
"""

from __future__ import annotations

from typing import Optional

from ..errors import FormatError, RecordTooLargeError, TruncatedStreamError, UsageError
from ._base import FramerBase

OK = 0  # stopped because the next frame is not complete yet (or the buffer is exhausted)
BAD_HEADER = 1  # the frame header does not check out (length CRC, magic number)
BAD_DATA = 2  # the payload's checksum does not match; the header (so the frame size) is sound
TOO_LARGE = 3  # the length field exceeds max_record_size
SPECIAL = 4  # a frame the format handles itself (RecordIO multi-part); it is whole in the buffer
# A whole frame not followed by the next frame's start, or followed by too few bytes to tell
# (RecordIO, whose length has no checksum: the framer decides whether to trust it).
UNCONFIRMED = 5


def as_bytes_view(chunk) -> memoryview:
    view = memoryview(chunk)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def masked_crc_matches(record: bytes, buffer, at: int) -> bool:
    """Whether the masked CRC-32C at ``buffer[at:at + 4]`` is ``record``'s (TFRecord's footer:
    the one format whose spans leave their CRCs to the consumer). Public for that consumer
    (``streamio.mix`` checks a :class:`RecordSpans` record as it makes it); re-exported by
    :mod:`streamio.formats`."""
    from .tfrecord import masked_crc32c

    return masked_crc32c(record) == int.from_bytes(buffer[at:at + 4], "little")


_crc_matches = masked_crc_matches  # its earlier private name, which the fuzz targets use


class RecordSpans:
    """Records that still lie in a read buffer: a sequence of ``bytes`` made on demand.

    ``buffer`` holds them at the ``(offset, length)`` pairs of ``spans`` (int64, two entries a
    record). :meth:`LengthPrefixedFramer.feed_spans` frames them so, and
    ``RecordReader.record_lists(spans=True)`` hands them to a consumer that makes each record
    when it needs it (``streamio.mix`` makes them in the order it hands them out). Valid only
    while the buffer holds those bytes: the reader releases ``buffer`` before it reads into it
    again, after which any use raises ValueError rather than giving other bytes.
    """

    __slots__ = ("buffer", "spans", "crcs", "error", "_on_fault")

    def __init__(self, buffer, spans, on_fault=None) -> None:
        self.buffer = buffer
        self.spans = spans
        #: Whether the records' CRCs are left to the consumer (``on_fault`` given): each
        #: record's masked CRC-32C follows it in ``buffer``; the consumer checks it as it makes
        #: the record (one pass over its bytes, as the list path's scan does) and reports a
        #: mismatch with :meth:`fault`. ``__getitem__`` checks it.
        self.crcs = on_fault is not None
        #: The error :meth:`fault` returned (the reader raises it when asked for the next block).
        self.error = None
        self._on_fault = on_fault

    def __len__(self) -> int:
        return len(self.spans) // 2

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("record index out of range")
        offset, length = self.spans[2 * index], self.spans[2 * index + 1]
        record = bytes(self.buffer[offset:offset + length])
        if self.crcs and not masked_crc_matches(record, self.buffer, offset + length):
            raise self.fault(index)
        return record

    def fault(self, index: int):
        """Record ``index`` failed the CRC check its consumer made (:attr:`crcs`): the error the
        list path raises there (a :class:`~streamio.errors.CorruptRecordError` naming the
        source, the frame's offset and the record's index), which the consumer raises after
        the records before it, and the reader again if asked for the next block; the counters
        stop at that record."""
        if self.error is None:
            self.error = self._on_fault(index)
        return self.error

    def __iter__(self):
        # One at a time: a record that fails its CRC (crcs) raises after those before it.
        return map(self.__getitem__, range(len(self)))

    def release(self) -> None:
        """End the records' life (the buffer is about to hold other bytes)."""
        self.buffer.release()
        self.spans.release()


class LengthPrefixedFramer(FramerBase):
    """Base of framers whose records are ``header | payload | trailer`` with the length in the header."""

    HEADER = 0  # bytes needed to know a frame's total size
    # Formats whose frame is whole once its size is known (TFRecord; not RecordIO, which also
    # needs the next frame's magic number): a large frame cut by the end of a chunk is then
    # completed in a buffer of its exact size, which the reader may fill straight from the
    # source (rest_buffer). The rest of a frame otherwise goes source -> read buffer -> tail,
    # and the tail regrows (a realloc that copies it again): about a tenth of the bytes at
    # 100 KB records and 1 MiB reads.
    COMPLETES_IN_PLACE = False
    #: Offer the rest of a frame only when this much is missing: below it a chunk read is as good.
    REST_BUFFER_MIN = 16 * 1024
    #: Nor for frames larger than this: the buffer is allocated before the bytes arrive, and a
    #: header with verify=False is not checked, so a corrupt length would claim up to
    #: max_record_size at once (the tail grows only as bytes come).
    REST_BUFFER_MAX = 64 * 1024 * 1024

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._tail = bytearray()  # bytes of a frame not yet complete; starts at self._consumed
        self._consumed = 0  # stream offset of the first byte not yet framed
        self._fed = 0
        self._resync = False  # searching for the next sound header after corruption
        self._discard = 0  # bytes of an oversized (but soundly framed) record still to drop
        self._at_eof = False  # finish() is framing what the tail held: nothing more will come
        # A frame being completed in place (COMPLETES_IN_PLACE): its whole size, the first
        # _rest_fill bytes present; it starts at self._consumed, and _tail is empty meanwhile.
        self._rest_frame: Optional[bytearray] = None
        self._rest_fill = 0
        # Byte ranges (start_range): the stream fed starts at byte ``start`` of the source, in the
        # middle of some record; records are framed from the first one the format confirms
        # starts at or after ``start`` (``_seeking``) up to the first one that starts at or after
        # ``_stop_at``, which belongs to the next range and ends this one (``done``).
        self._seeking = False
        self._seekbuf = bytearray()
        self._stop_at: Optional[int] = None
        # The last frame start at or after _stop_at found not to end the range (_at_stop False:
        # this reader frames it); -1: none yet.
        self._passed = -1
        # Formats that CHECK_NEXT_START: the bytes fed from _stop_at on (from _watch_at), kept
        # until _next_range_start finds where the next range's reader starts (_next_start);
        # and the last record framed, (start, end, index), to name it if that is inside it.
        self._watchbuf: Optional[bytearray] = None
        self._watch_at = 0
        self._next_start: Optional[int] = None
        self._last_frame: Optional[tuple] = None
        self.done = False  # every record that starts in the range has been handed out
        # feed_spans: the span buffer while it runs, and what it framed there.
        self._span_out = None
        self._span_result: Optional[tuple] = None
        self.span_crcs = False  # the last feed_spans left its payload CRCs to the consumer
        self._span_origin = (0, 0)

    # -- hooks --------------------------------------------------------------------------------
    def _scan(self, buf, pos: int, end: int, out: list) -> tuple[int, int]:
        raise NotImplementedError

    #: ``_scan_spans(buf, pos, end, spans) -> (n, pos, status)``: the scan kernel writing
    #: ``(offset, length)`` pairs to ``spans`` instead of records to a list, for
    #: :meth:`feed_spans`; None: the format frames records into lists only.
    _scan_spans = None

    def _frame_size(self, buf, pos: int) -> int:
        """Total size of the frame whose sound header starts at ``buf[pos]``."""
        raise NotImplementedError

    def _find_sync(self, buf, pos: int, end: int, base: int) -> Optional[int]:
        """The first ``q`` in ``[pos, end - HEADER]`` where a sound frame header starts, or None.

        ``base`` is the stream offset of ``buf[0]``. Formats call their resync kernel (C, or a
        pure-Python reference that avoids testing offsets one by one where it can).
        """
        raise NotImplementedError

    def _header_fault(self, buf, pos: int, offset: int) -> FormatError:
        raise NotImplementedError

    def _data_fault(self, buf, pos: int, offset: int) -> FormatError:
        raise NotImplementedError

    def _length_is_trusted(self, buf, pos: int) -> bool:
        return False

    def _special(self, buf, pos: int, end: int, base: int, out: list) -> Optional[int]:
        raise NotImplementedError

    def _unconfirmed(self, buf, pos: int, end: int, base: int, out: list) -> Optional[int]:
        raise NotImplementedError

    # Whether a frame cut short by the end of the stream may hold whole frames after its header
    # (its length being the corrupt part): RecordIO, whose length has no checksum, looks for them
    # under on_error="skip"; TFRecord's length CRC rules that out.
    RESCAN_TRUNCATED = False

    # Byte ranges: whether the range ends at the frame starting at ``buf[pos]`` (stream offset
    # ``base + pos``, at or past the range's end) because the reader of the next range starts its
    # records there (True), or whether this reader must still frame it (False: a fault the next
    # reader cannot see as a frame boundary, or a continuation); None: more bytes are needed.
    def _at_stop(self, buf, pos: int, end: int, base: int) -> Optional[bool]:
        raise NotImplementedError

    def _seek_accepts(self, buf, pos: int, end: int, base: int) -> Optional[bool]:
        """Whether the sound header at ``buf[pos]`` starts a record (after a range start): the
        same answer the previous range's reader gives with :meth:`_at_stop`. None: more bytes."""
        raise NotImplementedError

    def _framed_size(self, record: bytes) -> int:
        """Size of the frame a record the scan kernel delivered came from."""
        raise NotImplementedError

    #: Byte ranges: whether the reader that stops runs the next range's search itself
    #: (:meth:`_next_range_start`), for formats where a start found from the split point may
    #: lie inside a record of the range before (:mod:`~streamio.formats.tfrecord`).
    CHECK_NEXT_START = False
    #: Bytes past the range's end kept for that search before it runs on each chunk fed:
    #: more than a TFRecord range needs past its end in the common case (its last record and
    #: CONFIRM_BYTES), so it runs only when this reader asks where its range ends.
    WATCH_HELD = 4 * 1024 * 1024

    # -- public -------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        """Bytes fed so far (the stream offset the next chunk starts at)."""
        return self._fed

    def start_range(self, start: int, stop: Optional[int]) -> int:
        """Frame only the records that start in ``[start, stop)`` (``stop`` None: to the end).

        Call before the first :meth:`feed`. Returns the stream offset the caller must start
        feeding at (``start``): the framer then searches for the first record start it can
        confirm, and stops (:attr:`done`) at the first record that starts at or after ``stop``
        (a format that ``CHECK_NEXT_START``s: where the next range's reader starts, or it
        raises :class:`~streamio.errors.SplitError` after its records). Offsets in errors stay
        those of the whole stream; record indexes count from the range.
        """
        if self._fed or self._tail:
            raise UsageError("start_range() must come before the first feed()")
        self._fed = self._consumed = start
        self._seeking = start > 0  # offset 0 starts a record by definition
        self._stop_at = stop
        if stop is not None and self.CHECK_NEXT_START:
            self._watchbuf, self._watch_at = bytearray(), stop
        return start

    def rest_buffer(self) -> Optional[memoryview]:
        frame = self._rest_frame
        if frame is None or self._error is not None:
            return None
        return memoryview(frame)[self._rest_fill:]

    def rest_filled(self, nbytes: int) -> list[bytes]:
        self._raise_pending()
        frame = self._rest_frame
        if frame is None:
            return super().rest_filled(nbytes)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not (
                0 < nbytes <= len(frame) - self._rest_fill):
            raise UsageError(f"rest_filled({nbytes!r}): the rest buffer holds"
                             f" {len(frame) - self._rest_fill} bytes")
        self._fed += nbytes
        self._rest_fill += nbytes
        out: list[bytes] = []
        if self._rest_fill == len(frame):
            self._frame_rest(out)
        return out

    def _frame_rest(self, out: list) -> None:
        """The frame completed in place is whole: frame it where it lies (its buffer is never
        resized, so views the caller still holds stay harmless)."""
        frame = memoryview(self._rest_frame)
        self._rest_frame = None
        self._run(frame, 0, out)

    def _fill_rest(self, view) -> int:
        """Move the first bytes of ``view`` into the frame being completed; how many it took."""
        frame, fill = self._rest_frame, self._rest_fill
        take = min(len(frame) - fill, len(view))
        frame[fill:fill + take] = view[:take]
        self._rest_fill += take
        return take

    def _start_rest(self, buf, pos: int, end: int) -> bool:
        """Keep the partial frame at ``buf[pos:end]`` (whose header the scan found sound) in a
        buffer of its final size, if it is worth it; False: the caller keeps it as the tail."""
        if (not self.COMPLETES_IN_PLACE or self._stop_at is not None or self._at_eof
                or end - pos < self.HEADER):
            return False
        size = self._frame_size(buf, pos)
        if size - (end - pos) < self.REST_BUFFER_MIN or size > self.REST_BUFFER_MAX:
            return False
        frame = bytearray(size)
        frame[:end - pos] = buf[pos:end]
        self._rest_frame, self._rest_fill = frame, end - pos
        return True

    def feed(self, chunk) -> list[bytes]:
        self._raise_pending()
        view = as_bytes_view(chunk)
        if self._watchbuf is not None and not self.done:
            self._watch(view)
        self._fed += len(view)
        out: list[bytes] = []
        if self.done:
            return out
        if self._rest_frame is not None:  # the caller fed a chunk rather than rest_buffer()
            taken = self._fill_rest(view)
            if self._rest_fill < len(self._rest_frame):
                return out
            self._frame_rest(out)
            if self._error is not None:
                return out
            view = view[taken:]
        if self._seeking:
            self._seek(view, out)
        else:
            self._feed(view, out)
        return out

    def feed_spans(self, chunk, spans, crcs: bool = False) -> tuple:
        """:meth:`feed`, with the records framed where they lie in ``chunk`` left there.

        ``spans``: a writable int64 buffer (two entries a record) the framer may fill. Returns
        ``(records, buffer, n, at)``: the chunk's records in stream order are ``records[:at]``
        (frames completed from earlier chunks), then the ``n`` records at the ``(offset,
        length)`` pairs ``spans[:2 * n]`` of ``buffer`` (a view of the chunk's bytes, None when
        ``n`` is 0), then ``records[at:]`` (what follows a fault, a frame that did not fit).
        ``buffer`` holds them only while the chunk's bytes stay as they are. A format without
        a span kernel, a byte range or a resynchronisation frames everything into ``records``.
        Errors, counters and every record delivered are exactly those of :meth:`feed`.

        ``crcs=True``: where the format allows it (TFRecord read with ``verify`` and
        ``on_error="raise"``: :attr:`span_crcs` then says so), the payload CRCs of the ``n``
        records are not checked here but left to the consumer, who checks each as it makes the
        record and reports the first mismatch to :meth:`span_fault` before feeding on.
        """
        if self._scan_spans is None or self._stop_at is not None:
            self.span_crcs = False
            records = self.feed(chunk)
            return records, None, 0, len(records)
        self.span_crcs = crcs and self._defers_crcs()
        self._span_out, self._span_result = spans, None
        try:
            records = self.feed(chunk)
            got = self._span_result
        finally:
            self._span_out = self._span_result = None
        if got is None:
            return records, None, 0, len(records)
        buffer, n, at = got
        return records, buffer, n, at

    def _run_spans(self, buf, pos: int, out: list) -> None:
        """:meth:`_run` for :meth:`feed_spans`: the whole frames from ``buf[pos]`` on go to the
        span buffer, then :meth:`_run` frames the rest (a tail, a fault and what follows it)."""
        n, after, _ = self._scan_spans(buf, pos, len(buf), self._span_out)  # _run sees why
        if n:
            # Where a record the consumer finds damaged lies (span_crcs): the stream offset
            # of buf[0], and the records framed before the spans.
            self._span_origin = (self._consumed - pos, self.records)
            self.records += n
            self._consumed += after - pos
            self._span_result = (buf, n, len(out))
        self._run(buf, after, out)

    def span_fault(self, index: int, start: int) -> FormatError:
        """Record ``index`` of the span block the last :meth:`feed_spans` gave (with
        :attr:`span_crcs`), whose payload starts at ``start`` in its buffer, failed the CRC
        check its consumer made: the error :meth:`feed` would have raised at that frame, and
        the framer stops there as it would have (the error parked, raised by any later call;
        the records counted up to that one)."""
        base, before = self._span_origin
        self.records = before + index
        pos = start - self.HEADER
        err = self._data_fault(None, pos, base + pos)
        self._stop(err)  # deferred only under on_error="raise": parks it
        return err

    def _defers_crcs(self) -> bool:
        """Whether :meth:`feed_spans` may leave the payload CRCs to the consumer."""
        return False

    def finish(self) -> list[bytes]:
        self._raise_pending()
        out: list[bytes] = []
        try:
            self._finish(out)
        except FormatError:
            if not out or self._error is None:
                raise
            # Records framed at the end (a range's end decided only now) come first; the
            # fault is raised by the next call (``pending_error``).
        return out

    def _finish(self, out: list) -> None:
        if self._rest_frame is not None:  # cut short: the tail's truncation report covers it
            self._tail = bytearray(memoryview(self._rest_frame)[:self._rest_fill])
            self._rest_frame = None
        if self.done:
            return
        if self._seeking:
            self._at_eof = True
            self._seek(b"", out)
            if self._seeking:  # no record starts in the range
                self._seeking = False
                self._seekbuf = bytearray()
                self.done = True
                return
            if self.done:
                return
        if self._discard:
            err = TruncatedStreamError(
                f"stream ends {self._discard} bytes before the end of an oversized record",
                source=self.source, offset=self._fed, record_index=self.record_index - 1)
            self._discard = 0
            self._end_fault(err, 0)
        else:
            self._at_eof = True
            self._drain_tail(out)
        self._finish_extra(out)
        return

    def _drain_tail(self, out: list) -> None:
        """End of stream: frame what the tail still holds (a frame held back, a truncated one)."""
        while self._tail and self._error is None:
            if self._resync:
                self.skipped_bytes += len(self._tail)
                self._tail = bytearray()
                return
            tail = memoryview(bytes(self._tail))
            self._tail = bytearray()
            if len(tail) >= self.HEADER and self._frame_size(tail, 0) <= len(tail):
                self._run(tail, 0, out)  # a whole frame held back for what would follow it
                continue
            err = self._truncated(len(tail))
            if not self.RESCAN_TRUNCATED or self.on_error == "raise" or len(tail) <= 1:
                self._end_fault(err, len(tail))
                return
            self._skip(err, 1)  # the record; the rest are counted as the resynchronisation drops them
            self._resync = True
            self._consumed += 1
            self._run(tail, 1, out)

    def _truncated(self, held: int) -> TruncatedStreamError:
        return self._fault(
            TruncatedStreamError,
            f"stream ends inside a record ({held} bytes of an unfinished frame)",
            self._consumed)

    def _end_fault(self, err: FormatError, nbytes: int) -> None:
        self._tail = bytearray()
        if self.on_error == "raise":
            self._error = err
            raise err
        self._skip(err, nbytes)

    def _finish_extra(self, out: list) -> None:
        """Format-specific checks at end of stream (RecordIO: an unfinished multi-part record)."""

    # -- byte ranges ----------------------------------------------------------------------------
    def _seek(self, view, out: list) -> None:
        """Range start: find the first confirmed record start; bytes before it are no damage (they
        end the previous range's last record), so they are not counted as skipped."""
        buf = self._seekbuf
        buf += view
        base = self._consumed  # stream offset of buf[0]
        mv = memoryview(buf)
        try:
            q, keep = self._first_start(mv, len(buf), base)
            if q is not None:
                rest = memoryview(bytes(mv[q:]))
                self._seeking = False
                self._consumed = base + q
        finally:
            mv.release()
        if not self._seeking:
            self._seekbuf = bytearray()
            self._run(rest, 0, out)
            return
        del buf[:keep]
        self._consumed = base + keep

    def _first_start(self, mv, end: int, base: int) -> tuple:
        """The search a range reader starts with: ``(q, q)`` for the first offset ``q`` of
        ``mv[:end]`` (``mv[0]`` at stream offset ``base``) where a sound header starts that
        :meth:`_seek_accepts` takes; ``(None, keep)`` when the bytes so far hold none (those
        before ``keep`` start none; at the end of the stream ``keep`` is ``end``)."""
        p = 0
        while True:
            q = self._find_sync(mv, p, end, base) if end - p >= self.HEADER else None
            if q is None:
                return None, (end if self._at_eof else max(p, end - (self.HEADER - 1)))
            ok = self._seek_accepts(mv, q, end, base)
            if ok is None:
                return None, q  # wait for the rest of the candidate frame
            if ok:
                return q, q
            p = q + 1

    def _watch(self, view) -> None:
        """Keep what ``view`` (at stream offset :attr:`offset`) holds from the range's end
        on for :meth:`_next_range_start`. :meth:`_at_stop` asks it; past ``WATCH_HELD`` bytes
        it is asked here too, so the bytes kept stay few (from the first offset not yet ruled
        out) while this reader frames on, through damage, without asking."""
        skip = self._stop_at - self._fed
        if skip < len(view):
            self._watchbuf += view[max(skip, 0):]
            if len(self._watchbuf) > self.WATCH_HELD:
                self._next_range_start()

    def _next_range_start(self) -> Optional[int]:
        """Where the next range's reader starts its records: the first offset at or after
        this range's end that :meth:`_first_start` finds (the search that reader makes, in the
        same bytes), or the stream's end if none; None: more bytes are needed. The range ends
        there: :meth:`_at_stop` of a format that ``CHECK_NEXT_START`` answers from it."""
        if self._next_start is None:
            buf = self._watchbuf
            mv = memoryview(buf)
            try:
                q, keep = self._first_start(mv, len(buf), self._watch_at)
            finally:
                mv.release()
            if q is not None or self._at_eof:
                self._next_start = self._watch_at + (keep if q is None else q)
                self._watchbuf = None
            else:
                del buf[:keep]
                self._watch_at += keep
        return self._next_start

    def _end_range(self, offset: int) -> None:
        self._consumed = offset
        self._tail = bytearray()
        self.done = True

    def _trim(self, out: list, first: int, offset: int) -> Optional[int]:
        """Drop the records in ``out[first:]`` (contiguous frames from stream ``offset``) that
        start at or past the range's end; the offset of the first one dropped, or None."""
        for i in range(first, len(out)):
            if self._past_stop(offset):
                del out[i:]
                return offset
            offset += self._framed_size(out[i])
        return None

    def _note_last(self, out: list, before: int, end: int) -> None:
        """Byte ranges (``CHECK_NEXT_START``): the records ``out[before:]`` were framed, the
        last ending at stream offset ``end``; remember where it lies, to name it."""
        if self._stop_at is not None and len(out) > before and self.CHECK_NEXT_START:
            self._last_frame = (end - self._framed_size(out[-1]), end, self.record_index - 1)

    def _past_stop(self, offset: int) -> bool:
        """Whether a frame starting at stream ``offset`` must be asked :meth:`_at_stop` before
        it is framed (at or past the range's end, and not already found to be this range's)."""
        return self._stop_at is not None and offset >= self._stop_at and offset > self._passed

    # -- the state machine ----------------------------------------------------------------------
    def _discard_from(self, view, pos: int) -> Optional[int]:
        if not self._discard:
            return pos
        take = min(self._discard, len(view) - pos)
        self._discard -= take
        self._consumed += take
        return None if self._discard else pos + take

    def _fill_tail(self, view, pos: int) -> Optional[int]:
        """Move bytes from ``view`` into the tail until it holds one whole frame (or a bad header)."""
        tail, n = self._tail, len(view)
        if len(tail) < self.HEADER:
            take = min(self.HEADER - len(tail), n - pos)
            tail += view[pos:pos + take]
            pos += take
            if len(tail) < self.HEADER:
                return None
        need = self._needed(tail)
        if need > len(tail):
            take = min(need - len(tail), n - pos)
            tail += view[pos:pos + take]
            pos += take
            if len(tail) < need:
                return None
        return pos

    def _needed(self, tail) -> int:
        """Bytes the tail must hold before it is framed: a whole frame if the header is sound."""
        probe: list = []
        pos, status = self._scan(tail, 0, self.HEADER, probe)
        if status in (OK, SPECIAL, BAD_DATA, UNCONFIRMED):
            return self._frame_size(tail, 0)
        return self.HEADER  # a faulty header is handled as soon as it is whole

    def _feed(self, view, out: list) -> None:
        pos = self._discard_from(view, 0)
        if pos is None:
            return
        if self._tail and not self._resync and self._past_stop(self._consumed):
            # Whether the range ends at the frame the tail starts with is pending: the tail
            # holds everything from there until it is decided (bounded by the format's rule).
            self._tail += view[pos:]
            held = memoryview(bytes(self._tail))
            self._tail = bytearray()
            self._run(held, 0, out)
            return
        if self._tail and not self._resync:
            pos = self._fill_tail(view, pos)
            if pos is None:
                return
            # The tail is framed where it lies: a new tail is made below, never this one
            # resized, so a view of it stays valid (a copy cost a pass over each frame that
            # straddles two reads: one in ten at 100 KB records and 1 MiB reads).
            frame = memoryview(self._tail)
            self._tail = bytearray()
            self._run(frame, 0, out)
            if self._error is not None:
                return
            pos = self._discard_from(view, pos)
            if pos is None:
                return
        if self._tail and self._resync and self._junction_is_garbage(view, pos):
            # Searching garbage: the few bytes kept from the last chunk start no header, so go on
            # in this chunk without copying it (a stream of garbage must scan at memory speed).
            self.skipped_bytes += len(self._tail)
            self._consumed += len(self._tail)
            self._tail = bytearray()
        if self._tail:  # carried over from the previous chunk (a frame held back, a header
            # straddling the chunks while resynchronising): rare, so copy
            view = memoryview(bytes(self._tail) + bytes(view[pos:]))
            self._tail = bytearray()
            pos = 0
        if self._span_out is not None and not self._resync:
            self._run_spans(view, pos, out)
        else:
            self._run(view, pos, out)

    def _junction_is_garbage(self, view, pos: int) -> bool:
        """Whether no sound header starts in the tail kept while resynchronising (< HEADER bytes),
        given the bytes of this chunk that follow it."""
        held = len(self._tail)
        junction = bytes(self._tail) + bytes(view[pos:pos + self.HEADER - 1])
        end = min(len(junction), held + self.HEADER - 1)
        sync = self._find_sync(junction, 0, end, self._consumed)
        return sync is None and len(junction) == held + self.HEADER - 1

    def _run(self, buf, pos: int, out: list) -> None:
        """Frame ``buf[pos:]``; ``buf[pos]`` is at stream offset ``self._consumed``."""
        end = len(buf)
        base = self._consumed - pos
        while True:
            if self._resync:
                sync = self._find_sync(buf, pos, end, base)
                if sync is None:
                    keep = max(pos, end - (self.HEADER - 1))
                    self.skipped_bytes += keep - pos
                    self._tail = bytearray(buf[keep:])
                    self._consumed = base + keep
                    return
                self.skipped_bytes += sync - pos
                pos = sync
                self._resync = False
            if pos < end and self._past_stop(base + pos):
                ends = self._at_stop(buf, pos, end, base)
                if ends:
                    self._end_range(base + pos)
                    return
                if ends is None:
                    self._consumed = base + pos
                    self._tail = bytearray(buf[pos:])
                    return
                self._passed = base + pos  # this range's: framed below
            before = len(out)
            first = pos
            pos, status = self._scan(buf, pos, end, out)
            if self._stop_at is not None and base + pos > self._stop_at and len(out) > before:
                at = self._trim(out, before, base + first)
                if at is not None:
                    # A frame at or past the range's end: ask there (the loop's top).
                    self.records += len(out) - before
                    pos = at - base
                    self._consumed = at
                    self._note_last(out, before, at)
                    continue
            self.records += len(out) - before
            self._consumed = base + pos
            self._note_last(out, before, base + pos)
            if pos < end and self._past_stop(base + pos):
                continue  # decided at the loop's top, before the fault or the tail
            if status == OK:
                if pos < end and not self._start_rest(buf, pos, end):
                    self._tail = bytearray(buf[pos:])
                return
            pos = self._on_fault(status, buf, pos, end, base, out)
            if pos is None:
                return
            self._consumed = base + pos

    def _on_fault(self, status: int, buf, pos: int, end: int, base: int, out: list) -> Optional[int]:
        offset = base + pos
        if status == SPECIAL:
            return self._special(buf, pos, end, base, out)
        if status == UNCONFIRMED:
            return self._unconfirmed(buf, pos, end, base, out)
        if status == BAD_DATA:
            err = self._data_fault(buf, pos, offset)
            if self._stop(err):
                return None
            size = self._frame_size(buf, pos)
            self._skip(err, size)
            return pos + size
        if status == TOO_LARGE:
            err = self._too_large(buf, pos, offset)
            if self._stop(err):
                return None
            if self._length_is_trusted(buf, pos):
                # The header checks out, so the frame boundary is known: drop the record's bytes
                # as they stream past instead of buffering them.
                size = self._frame_size(buf, pos)
                self._skip(err, size)
                avail = end - pos
                if size <= avail:
                    return pos + size
                self._discard = size - avail
                self._consumed = base + end
                return None
        else:
            err = self._header_fault(buf, pos, offset)
            if self._stop(err):
                return None
        self._skip(err, 1)  # this byte; the rest are counted as the resynchronisation drops them
        self._resync = True
        return pos + 1

    def _too_large(self, buf, pos: int, offset: int) -> RecordTooLargeError:
        raise NotImplementedError

    def _stop(self, err: FormatError) -> bool:
        """Under on_error="raise", park the fault (raised by the next call) and stop framing."""
        if self.on_error != "raise":
            return False
        self._error = err
        self._tail = bytearray()
        return True


__all__ = [
    "BAD_DATA", "BAD_HEADER", "LengthPrefixedFramer", "OK", "RecordSpans", "SPECIAL",
    "TOO_LARGE", "UNCONFIRMED", "as_bytes_view", "masked_crc_matches",
]

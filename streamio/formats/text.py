"""Row framing for CSV (RFC 4180, as the csv module and pandas read it) and plain text lines.

CSV (``csv_rows=True``):

* A row ends at LF, CRLF or a lone CR (classic Mac OS / old Excel files), as in the csv module
  reading a file opened with ``newline=""`` and in pandas.
* A quote is special only at the start of a field (right after the row start or a delimiter):
  it opens a quoted field, in which delimiters, line breaks and doubled quotes ``""`` are data,
  until a quote that is not doubled closes it. Anywhere else a quote is a literal character
  (``5 ft 3"``), as in the csv module and pandas. The framer therefore knows the delimiter.
* Blank rows and rows of only spaces and tabs are skipped, as pandas skips blank lines
  (``skip_blank_lines=True``); a UTF-8 byte-order mark at the very start of the stream is
  dropped (files written with ``encoding="utf-8-sig"``, Excel's "CSV UTF-8").

Lines (``csv_rows=False``): a line ends at LF, a CR before it is dropped, blank lines are kept.
In both, a last row without a line break is kept.

Bounded time and space on any input: the scan uses ``bytes.find`` (C speed) and remembers how far
each search went, so no byte is searched twice for the same thing; the unfinished row is one
``bytearray`` that never exceeds ``max_record_size`` (checked before it grows), and rows of a
chunk that hold no quoted field are cut with one ``split`` per run of rows.

Row offsets (CSV, on request: :meth:`TextRowFramer.keep_row_offsets`): the framer keeps the last
few MiB of the stream and, per feed, a row boundary; :meth:`~TextRowFramer.row_offset` frames
those bytes again to say where a recent row starts. Nothing is done per row until it is asked.
"""

from __future__ import annotations

import bisect
import collections
import re
from typing import Optional

from ..errors import RecordTooLargeError, TruncatedStreamError
from ..errors import UsageError
from ._base import DEFAULT_MAX_RECORD_SIZE, FramerBase, OnError
from ._framing import as_bytes_view

_BOM = b"\xef\xbb\xbf"
_LF = 10
_CR = 13
_BLANKS = b" \t"  # what pandas' tokenizer counts as whitespace on a blank line
_BLANK_STARTS = (b" ", b"\t")
_ESCAPED_WINDOW = 1 << 16  # bytes one regex match may cover (~4 MB of regex stack at worst)
_BLANK_BYTES = b" \t\r\n"  # a row that starts with one of these may be blank

# Scanner states of the unfinished row (the csv module's names in parentheses).
_UNQUOTED = 0  # outside quotes (START_FIELD / IN_FIELD): a line break ends the row
_QUOTED = 1  # inside a quoted field (IN_QUOTED_FIELD): everything is data but a quote
_QUOTE_SEEN = 2  # a quote inside a quoted field, the next byte not seen yet (QUOTE_IN_QUOTED_FIELD)

#: What a framer asked for row offsets keeps of the stream (at least): a batch is decoded right
#: after the read that completes it, so its rows lie within the last read and the batch's bytes.
ROW_OFFSET_BYTES = 4 << 20


class TextRowFramer(FramerBase):
    """Sans-IO row framer for ``"csv"`` (``csv_rows=True``) and ``"lines"`` (``csv_rows=False``).

    ``quotechar=None`` turns quoting off (CSV rows then end at every line break).
    """

    def __init__(self, *, quotechar: Optional[str] = '"', delimiter: str = ",",
                 keep_blank: bool = False, csv_rows: bool = True, on_error: OnError = "raise",
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
                 source: Optional[str] = None) -> None:
        super().__init__(on_error=on_error, max_record_size=max_record_size, source=source)
        self._quote = _one_byte("quotechar", quotechar) if quotechar is not None else None
        self._delim = _one_byte("delimiter", delimiter)
        if self._quote == self._delim:
            raise UsageError("delimiter and quotechar must differ")
        # bytes after which a quote opens a field: a delimiter, or a line break (a row start)
        self._openers = self._delim + b"\r\n"
        if self._quote is not None:
            # the inside of a quoted field from a doubled quote on: text and doubled quotes
            q = re.escape(self._quote)
            self._escaped = re.compile(b"[^" + q + b"]*(?:" + q + q + b"[^" + q + b"]*)*")
            self._run = re.compile(q + b"+")
            self._long_run = self._quote * 8
        self.keep_blank = keep_blank
        self._csv = csv_rows
        self._buf = bytearray()  # the unfinished row (never more than max_record_size bytes)
        self._state = _UNQUOTED
        self._field_start = True  # the next byte starts a field (row start, or after a delimiter)
        self._cr_held = False  # lines: a CR ended the last chunk; an LF next makes it a CRLF
        self._lf_after_cr = False  # csv: a CR ended the last chunk and its row; skip an LF next
        self._head = b"" if csv_rows else None  # csv: first bytes, until a BOM is ruled out
        self._row_start = 0  # stream offset of the unfinished row
        self._fed = 0
        # Byte ranges (start_range): rows start after a line feed, so a range's reader drops the
        # bytes up to the first LF at or after ``start - 1`` (``_seeking``) and frames up to the
        # first LF at or after ``stop - 1`` (``_range_stop``), the end of the last row that
        # starts in the range. CSV is split this way only when rows hold no quoted line breaks.
        self._seeking = False
        self._range_stop: Optional[int] = None
        self.done = False
        self._dropping = False  # skipping an oversized row under on_error="skip"
        self._options = dict(quotechar=quotechar, delimiter=delimiter, keep_blank=keep_blank,
                             csv_rows=csv_rows, max_record_size=max_record_size)
        self._recent: Optional[_RecentRows] = None  # kept for row_offset(), once asked
        self._finished = False

    @property
    def offset(self) -> int:
        return self._fed

    # --- feeding -------------------------------------------------------------------------------

    def start_range(self, start: int, stop: Optional[int]) -> int:
        """Frame only the rows that start in ``[start, stop)`` (``stop`` None: to the end).

        Call before the first :meth:`feed`. Returns the stream offset the caller must start
        feeding at: ``start - 1`` (the byte that tells whether a row starts at ``start``), or 0.
        """
        if self._fed:
            raise UsageError("start_range() must come before the first feed()")
        origin = max(start - 1, 0)
        self._fed = self._row_start = origin
        if start > 0:
            self._seeking = True
            self._head = None  # a byte-order mark can only open the whole stream
        self._range_stop = stop
        return origin

    def keep_row_offsets(self, keep_bytes: int = ROW_OFFSET_BYTES) -> None:
        """From the next feed on, keep the last ``keep_bytes`` (or more: whole chunks) of the
        stream, so that :meth:`row_offset` can say where a row among them starts. CSV only:
        a lines framer keeps nothing (its ``row_offset`` is None)."""
        if self._csv and self._recent is None:
            self._recent = _RecentRows(keep_bytes, self._options)

    def row_offset(self, index: int) -> Optional[int]:
        """The stream offset where delivered row ``index`` (0: the first this framer delivered)
        starts, its first byte after a byte-order mark the stream opened with; None where its
        bytes are no longer kept (:meth:`keep_row_offsets`) or were never asked to be."""
        if self._recent is None or not 0 <= index < self.records:
            return None
        return self._recent.offset(index, self._finished)

    def feed(self, chunk) -> list[bytes]:
        self._raise_pending()
        if self.done:
            return []
        data = bytes(as_bytes_view(chunk))
        if self._recent is not None:
            self._keep_recent(data)
        if self._seeking or self._range_stop is not None:
            return self._feed_range(data)
        return self._feed_whole(data)

    def _keep_recent(self, data: bytes) -> None:
        """Keep ``data`` for :meth:`row_offset`, with a row boundary to frame again from: where
        the unfinished row starts (not where a CR just ended a row, an LF perhaps next, nor
        inside a range's first bytes or an oversized row)."""
        clean = not (self._seeking or self._dropping or self._lf_after_cr)
        self._recent.add(self._fed, data, self.records if clean else None, self._row_start,
                         self._head is not None)

    def _feed_range(self, data: bytes) -> list[bytes]:
        base = self._fed
        if self._seeking:
            cut = data.find(b"\n")
            if cut < 0:
                self._fed += len(data)
                self._row_start = self._fed
                return []
            self._seeking = False
            data = data[cut + 1:]
            base += cut + 1
            self._fed = self._row_start = base
            if self._recent is not None:  # the range's first row starts here
                self._recent.mark(self.records, base, False)
            if self._range_stop is not None and base >= self._range_stop:
                self._fed = base + len(data)  # the range's first row starts past its end
                self.done = True
                return []
        stop = self._range_stop
        if stop is None:
            return self._feed_whole(data)
        cut = data.find(b"\n", max(stop - 1 - base, 0))
        if cut < 0:
            return self._feed_whole(data)
        out = self._feed_whole(data[:cut + 1])
        self._fed = base + len(data)
        out += self._finish_whole()
        self.done = True
        return out

    def _feed_whole(self, data: bytes) -> list[bytes]:
        base = self._fed
        self._fed += len(data)
        out: list[bytes] = []
        if self._head is not None:
            data, base = self._strip_bom(data, base, final=False)
        if data:
            self._scan(data, base, out)
        return out

    def finish(self) -> list[bytes]:
        self._raise_pending()
        self._finished = True
        if self.done or self._seeking:  # no row starts in the rest of the range
            self.done = True
            return []
        return self._finish_whole()

    def _finish_whole(self) -> list[bytes]:
        out: list[bytes] = []
        if self._head:  # a stream of 1 or 2 bytes that began like a BOM
            data, base = self._strip_bom(b"", self._fed, final=True)
            self._scan(data, base, out)
            if self._error is not None:
                return out
        # lines: a CR at the very end is dropped as before a line break, but ends a line
        cr_line, self._cr_held = self._cr_held, False
        if self._state == _QUOTED:
            err = self._fault(TruncatedStreamError,
                              "stream ends inside a quoted CSV field (unbalanced quote)",
                              self._row_start)
            nbytes = len(self._buf)
            self._reset_row()
            if self.on_error == "raise":
                self._error = err
                raise err
            self._skip(err, nbytes)
            return out
        if self._dropping:
            self._dropping = False
        elif self._buf or cr_line:
            self._emit([bytes(self._buf)], self._csv, out)
        self._reset_row()
        return out

    def _strip_bom(self, data: bytes, base: int, final: bool) -> tuple[bytes, int]:
        """Drop a UTF-8 BOM at the start of the stream; hold back up to 2 bytes to decide."""
        head = self._head + data
        if not final and len(head) < len(_BOM) and _BOM.startswith(head):
            self._head = head
            return b"", base
        self._head = None
        base -= len(head) - len(data)
        if head.startswith(_BOM):
            self._row_start = base + len(_BOM)
            return head[len(_BOM):], base + len(_BOM)
        return head, base

    def _scan(self, data: bytes, base: int, out: list) -> None:
        """Frame ``data`` (stream offset ``base``): rows into ``out``, the rest into the state.

        ``lead`` is where the unfinished row's bytes in ``data`` begin (the row's earlier bytes
        are in ``self._buf``); they are copied into the buffer only at the end of the chunk.
        """
        end = len(data)
        lead = 0
        if self._lf_after_cr:  # csv: the last chunk ended with a CR, which ended its row
            self._lf_after_cr = False
            if data[0] == _LF:  # ... and this LF is the rest of that CRLF
                lead = 1
                self._row_start = base + 1
        elif self._cr_held:  # lines: the last chunk ended with a CR
            self._cr_held = False
            if data[0] == _LF:  # a CRLF: the line ends here
                if not self._dropping:
                    self._emit([bytes(self._buf)], False, out)
                self._reset_row()
                lead = 1
                self._row_start = base + 1
            elif not self._keep(b"\r", 0, 1):  # a lone CR: data
                return
        if not self._csv and data[-1] == _CR:
            self._cr_held = True  # lines: a CR last is decided by the next byte
            end -= 1
        quote = self._quote
        if quote is None:
            lead = self._cut(data, lead, lead, end, base, out)
        elif self._state == _UNQUOTED and quote not in data:
            lead = self._cut(data, lead, lead, end, base, out)  # the common case: one split
            self._field_start = data[-1] in self._openers
        else:
            lead = self._scan_quoted(data, lead, base, out)
        if lead is not None:
            self._keep(data, lead, end)

    def _scan_quoted(self, data: bytes, lead: int, base: int, out: list) -> Optional[int]:
        """Frame ``data`` where quotes may open fields; the new ``lead``, None after a fault."""
        quote = self._quote
        quote_byte = quote[0]
        openers = self._openers
        n = len(data)
        limit = self.max_record_size
        pos = lead
        lf = cr = -1  # the next LF and CR at or after pos, once searched (n: none)
        state = self._state
        fresh = not self._buf and not self._dropping  # the unfinished row starts in this chunk
        append = out.append
        inline = 0  # rows delivered inline (counted into self.records at the end)
        while pos < n:
            if state == _QUOTED:
                close = data.find(quote, pos)
                if close < 0:
                    pos = n
                    break
                if close + 1 == n:  # the next byte (next chunk) says what this quote is
                    state = _QUOTE_SEEN
                    pos = n
                    break
                if data[close + 1] == quote_byte:
                    # Doubled quotes (data): a regex skips them and the text between them in
                    # C, up to a quote that is not doubled, within a window that bounds the
                    # regex engine's stack (it grows with each "" it passes). A long run of
                    # quotes is measured at once: its last quote closes the field if odd.
                    if data.startswith(self._long_run, close):
                        end = self._run.match(data, close).end()
                        pos = end - ((end - close) & 1)
                    else:
                        pos = self._escaped.match(data, close, min(n, close + _ESCAPED_WINDOW)).end()
                    continue
                pos = close + 1
                state = _UNQUOTED  # the field is closed; what follows is unquoted
                field_start = False
            elif state == _QUOTE_SEEN:  # only at the start of a chunk
                if data[pos] == quote_byte:
                    pos += 1
                    state = _QUOTED
                    continue
                state = _UNQUOTED
                field_start = False
            else:
                field_start = self._field_start if pos == 0 else data[pos - 1] in openers
            # Unquoted: the next quote that opens a field. Quotes elsewhere are literal (rare);
            # the search goes on after each one, so no byte is searched twice.
            opening = data.find(quote, pos)
            while opening >= 0 and not (data[opening - 1] in openers if opening > pos
                                        else field_start):
                opening = data.find(quote, opening + 1)
            if opening < 0:
                break
            # Rows that end before it; the rest is the row that holds it. The usual case, one
            # row with a quoted field after another, is done inline: the next LF and CR are
            # remembered, so no byte is searched twice for them either.
            if lf < pos:
                lf = data.find(b"\n", pos)
                if lf < 0:
                    lf = n
            if cr < pos:
                cr = data.find(b"\r", pos)
                if cr < 0:
                    cr = n
            if lf < opening < cr and fresh:
                following = data.find(b"\n", lf + 1)  # the next LF after it, remembered
                if following < 0:
                    following = n
            else:
                following = -1
            if following > opening and lf - lead <= limit and data[lead] not in _BLANK_BYTES:
                append(data[lead:lf])  # exactly one row ends before the quote
                inline += 1
                lead = lf + 1
                lf = following
            else:
                if fresh:
                    self._row_start = base + lead
                self.records += inline  # an error made by _cut counts them
                inline = 0
                lead = self._cut(data, lead, pos, opening, base, out)
                if lead is None:
                    return None
                fresh = not self._buf and not self._dropping
            pos = opening + 1
            state = _QUOTED
        self._state = state
        self.records += inline
        if fresh:
            self._row_start = base + lead
        if state == _UNQUOTED:
            if pos < n:
                lead = self._cut(data, lead, pos, n, base, out)
            self._field_start = data[n - 1] in openers
        return lead

    def _cut(self, data: bytes, lead: int, a: int, b: int, base: int, out: list) -> Optional[int]:
        """Deliver the rows that end in ``data[a:b]``, where every line break ends a row; the
        first one begins at ``lead`` (after what ``self._buf`` holds). Returns where the
        unfinished row now begins (``lead`` if no row ended), None after a fault."""
        seg = data if a == 0 and b == len(data) else data[a:b]
        csv_rows = self._csv
        if b"\r" in seg:
            if csv_rows and b == len(data) and seg[-1] == _CR:
                self._lf_after_cr = True  # this CR ends its row; an LF next belongs to it
            seg = seg.replace(b"\r\n", b"\n")
            if csv_rows:
                seg = seg.replace(b"\r", b"\n")  # a lone CR ends a row too (csv module, pandas)
        rows = seg.split(b"\n")
        rest = rows.pop()
        if not rows:
            return lead
        new_lead = b - len(rest)  # ``rest`` holds no CR or LF: its length is as in ``data``
        # Only a row that starts with a space or a tab can be blank in pandas' sense
        # (one-byte searches first: they are memchr-fast, two-byte ones are not).
        blanks = csv_rows and (
            (self._buf[:1] if self._buf else data[lead:lead + 1]) in _BLANK_STARTS
            or ((b" " in seg or b"\t" in seg)
                and (seg[:1] in _BLANK_STARTS or b"\n " in seg or b"\n\t" in seg)))
        first = rows[0]
        skip_first = False
        if self._dropping:  # the end of an oversized row being skipped
            self.skipped_bytes += a - lead + len(first)
            self._dropping = False
            skip_first = True
        elif self._buf or lead < a:
            size = len(self._buf) + (a - lead) + len(first)
            if size > self.max_record_size:
                if not self._oversized():
                    return None
                self.skipped_bytes += a - lead + len(first)
                self._dropping = False
                skip_first = True
            elif self._buf:
                self._buf += memoryview(data)[lead:a]
                self._buf += first
                rows[0] = bytes(self._buf)
                self._buf = bytearray()
            else:
                rows[0] = data[lead:a] + first
        if b - a > self.max_record_size and max(map(len, rows)) > self.max_record_size:
            if not self._rows_with_oversized(rows, skip_first, data, a, base, blanks, out):
                return None
        else:
            self._emit(rows[1:] if skip_first else rows, blanks, out)
        self._row_start = base + new_lead
        return new_lead

    def _emit(self, rows: list, blanks: bool, out: list) -> None:
        """Deliver rows, but blank ones (CSV: and, if ``blanks``, rows of only spaces/tabs)."""
        if not self.keep_blank:
            if not all(rows):
                rows = [r for r in rows if r]
            if blanks:
                rows = [r for r in rows if r.strip(_BLANKS)]
        out += rows
        self.records += len(rows)

    def _rows_with_oversized(self, rows: list, skip_first: bool, data: bytes, a: int, base: int,
                             blanks: bool, out: list) -> bool:
        """The rare case of whole rows over the limit in one chunk: deliver or skip one by one;
        False after a fault."""
        starts = self._row_starts(data, a, len(rows))
        for k, row in enumerate(rows):
            if k == 0 and skip_first:
                continue
            if len(row) > self.max_record_size:
                if k:
                    self._row_start = base + starts[k]
                if not self._oversized():
                    return False
                self.skipped_bytes += len(row)
                self._dropping = False
            else:
                self._emit([row], blanks, out)
        return True

    def _row_starts(self, data: bytes, a: int, count: int) -> list[int]:
        """Offsets in ``data`` where rows 1..count-1 of ``data[a:]`` begin (row 0: unused)."""
        starts = [a]
        pos = a
        n = len(data)
        while len(starts) < count:
            lf = data.find(b"\n", pos)
            cr = data.find(b"\r", pos) if self._csv else -1
            brk = min(e for e in (lf, cr, n) if e >= 0)
            pos = brk + 2 if (brk == cr and brk + 1 < n and data[brk + 1] == _LF) else brk + 1
            starts.append(pos)
        return starts

    def _keep(self, data: bytes, a: int, b: int) -> bool:
        """Add ``data[a:b]`` to the unfinished row; False after a fault (too large to go on)."""
        if a >= b:
            return True
        if self._dropping:
            self.skipped_bytes += b - a
            return True
        if len(self._buf) + (b - a) > self.max_record_size:
            # Refused before it is buffered: the row so far and this piece are over the limit.
            if not self._oversized():
                return False
            self.skipped_bytes += b - a
            return True
        self._buf += memoryview(data)[a:b]
        return True

    def _reset_row(self) -> None:
        self._buf = bytearray()
        self._state = _UNQUOTED
        self._field_start = True

    def _oversized(self) -> bool:
        """The unfinished row is over the limit: raise (False: stop) or drop it (True: go on)."""
        err = self._fault(RecordTooLargeError,
                          f"row longer than max_record_size={self.max_record_size} bytes",
                          self._row_start)
        nbytes = len(self._buf)
        self._buf = bytearray()
        if self.on_error == "raise":
            self._error = err
            return False
        self._skip(err, nbytes)
        self._dropping = True
        return True


class _RecentRows:
    """The last bytes of a CSV stream and, per feed, a row boundary in them (``marks``: the
    rows delivered before it, its stream offset, whether a byte-order mark may open the stream
    there), so that a recent row's start can be found when asked (:meth:`offset`): the bytes
    from the last boundary before the row to the next are framed again by a fresh framer with
    the same options (the same rows, blank ones, CRLFs and quoted line breaks alike), and each
    row is found after the one before it (between two rows lie only line breaks, blanks and
    rows of blanks, none of which can begin a match). Nothing is done per row until asked;
    the rows of the last boundary asked for are remembered."""

    def __init__(self, keep_bytes: int, options: dict) -> None:
        self.keep_bytes = keep_bytes
        self.options = options
        self.chunks: collections.deque = collections.deque()  # (stream offset, bytes)
        self.size = 0
        self.marks: collections.deque = collections.deque()  # (rows before, offset, bom)
        self.found: tuple = (None, [])  # (what was framed, the starts of its rows)

    def add(self, base: int, data: bytes, records: Optional[int], boundary: int,
            bom: bool) -> None:
        if records is not None:
            self.mark(records, boundary, bom)
        self.chunks.append((base, data))
        self.size += len(data)
        while self.size - len(self.chunks[0][1]) >= self.keep_bytes:
            self.size -= len(self.chunks.popleft()[1])
        first = self.chunks[0][0]
        while self.marks and self.marks[0][1] < first:
            self.marks.popleft()

    def mark(self, records: int, offset: int, bom: bool) -> None:
        self.marks.append((records, offset, bom))

    def offset(self, index: int, finished: bool) -> Optional[int]:
        # Copies: a reader thread may be feeding while a decoder asks.
        marks, chunks = list(self.marks), list(self.chunks)
        at = bisect.bisect_right([m[0] for m in marks], index) - 1
        if at < 0 or not chunks or marks[at][1] < chunks[0][0]:
            return None
        mark = marks[at]
        end = marks[at + 1][1] if at + 1 < len(marks) else None
        # The rows from the mark: to the next mark, else to the last byte kept (and the end).
        key = (mark, end) if end is not None else (mark, chunks[-1][0], finished)
        if self.found[0] != key:
            self.found = (key, self._starts(chunks, mark, end, finished and end is None))
        starts = self.found[1]
        k = index - mark[0]
        return mark[1] + starts[k] if k < len(starts) else None

    def _starts(self, chunks: list, mark: tuple, end: Optional[int], last: bool) -> list:
        """The starts of the rows framed from ``mark`` up to ``end`` (None: all that is kept;
        ``last``: and the stream's end), relative to the mark's offset."""
        _, start, bom = mark
        held = [(base, data) for base, data in chunks if base + len(data) > start
                and (end is None or base < end)]
        if not held:
            return []
        text = b"".join(data for _, data in held)
        text = text[start - held[0][0]:None if end is None else end - held[0][0]]
        framer = TextRowFramer(**self.options, on_error="skip")
        if not bom:
            framer._head = None  # a byte-order mark opens only the stream
        rows = framer.feed(text)
        if last:
            rows += framer.finish()
        starts, pos = [], 0
        for row in rows:
            pos = text.find(row, pos)
            if pos < 0:  # not framed alike: say nothing rather than something wrong
                break
            starts.append(pos)
            pos += len(row)
        return starts


def _one_byte(name: str, char: object) -> bytes:
    if not isinstance(char, str) or len(char) != 1 or char in "\r\n" or not char.isascii():
        raise UsageError(f"{name} must be one ASCII character other than CR/LF, not {char!r}")
    return char.encode("ascii")

"""Row framing for CSV (RFC 4180) and plain text lines.

A row ends at LF; a CR before it is dropped (CRLF files). In CSV, a quoted field may hold
delimiters, doubled quotes and line breaks, so an LF ends a row only where the quotes seen so far
in the row are balanced: RFC 4180 quotes come in pairs (a doubled ``""`` adds two), so counting
quote characters per line piece (``bytes.count``, C speed) tells whether a line break is inside a
field without a per-byte state machine. Blank CSV rows are dropped (as pandas and ML-IO do);
blank text lines are kept. A last row without a newline is kept.
"""

from __future__ import annotations

from typing import Optional

from ..errors import RecordTooLargeError, TruncatedStreamError
from ..errors import UsageError
from ._base import DEFAULT_MAX_RECORD_SIZE, FramerBase, OnError
from ._framing import as_bytes_view


class TextRowFramer(FramerBase):
    """Sans-IO row framer for ``"csv"`` (``quotechar`` set) and ``"lines"`` (``quotechar=None``)."""

    def __init__(self, *, quotechar: Optional[str] = '"', keep_blank: bool = False,
                 on_error: OnError = "raise", max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
                 source: Optional[str] = None) -> None:
        super().__init__(on_error=on_error, max_record_size=max_record_size, source=source)
        if quotechar is not None:
            if not isinstance(quotechar, str) or len(quotechar) != 1 or quotechar in "\r\n":
                raise UsageError(f"quotechar must be one character other than CR/LF, not {quotechar!r}")
            self._quote: Optional[bytes] = quotechar.encode("ascii")
        else:
            self._quote = None
        self.keep_blank = keep_blank
        self._pending: list[bytes] = []  # pieces of the unfinished row (split at LFs inside quotes)
        self._pending_size = 0
        self._odd = False  # the unfinished row has an unbalanced quote
        self._row_start = 0  # stream offset of the unfinished row
        self._fed = 0
        self._dropping = False  # skipping an oversized row under on_error="skip"

    @property
    def offset(self) -> int:
        return self._fed

    def feed(self, chunk) -> list[bytes]:
        self._raise_pending()
        data = bytes(as_bytes_view(chunk))
        start = self._fed
        self._fed += len(data)
        pieces = data.split(b"\n")
        out: list[bytes] = []
        quote = self._quote
        limit = self.max_record_size
        if (not self._dropping and not self._odd and len(pieces) > 1
                and (quote is None or quote not in data)
                and self._pending_size + len(pieces[0]) <= limit
                and (len(data) <= limit or max(map(len, pieces)) <= limit)):
            # Fast path: no quotes in this chunk, so every LF ends a row. A row carried over
            # from the previous chunk (its quotes balanced: not _odd) ends at the first LF; a
            # chunk no longer than max_record_size cannot hold an oversized row.
            if self._pending:
                pieces[0] = b"".join(self._pending) + pieces[0]
                self._pending, self._pending_size = [], 0
            last = pieces.pop()
            if b"\r" in data or pieces[0][-1:] == b"\r":
                pieces = [p[:-1] if p[-1:] == b"\r" else p for p in pieces]
            if not self.keep_blank and not all(pieces):
                pieces = [p for p in pieces if p]
            out = pieces
            self.records += len(out)
            self._row_start = self._fed - len(last)
            if last:
                self._pending, self._pending_size = [last], len(last)
                if len(last) > self.max_record_size:
                    self._oversized([])
            return out
        return self._slow(pieces, start, out)

    def _slow(self, pieces: list, start: int, out: list) -> list[bytes]:
        # pieces[k] and pieces[k + 1] were separated by an LF; the last piece has no LF after it
        # yet, and the first one continues the row carried over from the previous chunk.
        quote = self._quote
        pos = start  # stream offset of the current piece
        last = len(pieces) - 1
        for k, piece in enumerate(pieces):
            has_lf = k < last
            if quote is not None and piece.count(quote) & 1:
                self._odd = not self._odd
            if self._dropping:
                self.skipped_bytes += len(piece) + has_lf
                pos += len(piece) + has_lf
                if has_lf and not self._odd:
                    self._dropping = False
                    self._row_start = pos
                continue
            if not self._pending:
                self._row_start = pos
            pos += len(piece) + has_lf
            if piece:
                self._pending.append(piece)
                self._pending_size += len(piece)
            if self._pending_size > self.max_record_size:
                if not self._oversized(out):
                    return out
                if has_lf and not self._odd:
                    self._dropping = False
                    self._row_start = pos
                continue
            if not has_lf:
                continue  # the row goes on in the next chunk
            if self._odd:
                self._pending.append(b"\n")  # a line break inside a quoted field
                self._pending_size += 1
                continue
            self._end_row(out)
        return out

    def _end_row(self, out: list) -> None:
        """The pending pieces make a whole row: drop a CR before the LF, keep it if not blank."""
        row = b"".join(self._pending)
        self._pending, self._pending_size = [], 0
        if row[-1:] == b"\r":
            row = row[:-1]
        if row or self.keep_blank:
            out.append(row)
            self.records += 1

    def _oversized(self, out: list) -> bool:
        err = self._fault(RecordTooLargeError,
                          f"row longer than max_record_size={self.max_record_size} bytes",
                          self._row_start)
        if self.on_error == "raise":
            self._error = err
            self._pending, self._pending_size = [], 0
            return False
        self._skip(err, self._pending_size)
        self._pending, self._pending_size = [], 0
        self._dropping = True
        return True

    def finish(self) -> list[bytes]:
        self._raise_pending()
        out: list[bytes] = []
        if self._odd and (self._pending or self._dropping):
            err = self._fault(TruncatedStreamError,
                              "stream ends inside a quoted CSV field (unbalanced quote)",
                              self._row_start)
            nbytes = self._pending_size
            self._pending, self._pending_size, self._odd = [], 0, False
            if self.on_error == "raise":
                self._error = err
                raise err
            self._skip(err, nbytes)
            return out
        if self._pending:
            self._end_row(out)
        return out

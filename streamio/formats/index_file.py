"""Record index files: the one owner of their format, read and written here (no I/O).

An index lists where each record of an uncompressed file starts, one text line per record, in
file order. Two dialects, the ones other tools read and write:

- ``offset length`` (DALI's and the ``tfrecord`` package's ``tfrecord2idx``; ``FILE.index``): the
  record's frame offset and its frame length, so each line ends where the next begins. Used for
  TFRecord and for lines.
- ``key<TAB>offset`` (MXNet's ``im2rec`` / ``MXIndexedRecordIO``; ``FILE.idx``): any key (im2rec
  writes the image id, so keys need not be in order), then the offset; lines are written as the
  records are, so the offsets increase.

Blank lines and a ``\\r`` before the line feed are ignored. An index is a *hint* read from a file
anyone may have written, stale, or cut short: :func:`parse_index` takes bytes and gives a
:class:`RecordIndex` or a :class:`~streamio.errors.FormatError` naming the line, in time linear in
its size (numbers of at most 19 digits: no ``int()`` of a megabyte of digits); :func:`index_misfit`
says why it cannot describe a file of a given size. What only the data file can tell (is there a
record start at each offset?) is checked by the reader of the file
(:mod:`streamio.pipeline.ranges`).
"""

from __future__ import annotations

import posixpath
from typing import Iterable, Iterator, Optional

import numpy as np

from ..errors import FormatError

__all__ = ["RecordIndex", "encode_index", "index_misfit", "index_suffix", "parse_index",
           "without_index_files",
           "parse_index_lines"]

#: Digits of one number: 2**63 - 1 has 19. More is not an offset in any file (and Python's
#: ``int()`` of a long digit string is quadratic).
MAX_DIGITS = 19
#: Characters of an MXNet key (im2rec writes an int; other tools a short name).
MAX_KEY = 256
_KEY_CHARS = bytes(range(0x21, 0x7F))  # printable ASCII but the space


class RecordIndex:
    """What an index file says: ``offsets`` of the records in the order listed; ``lengths`` of
    their frames for ``offset length`` files, None for ``key<TAB>offset`` ones."""

    __slots__ = ("offsets", "lengths")

    def __init__(self, offsets: list, lengths: Optional[list]) -> None:
        self.offsets = offsets
        self.lengths = lengths

    def __repr__(self) -> str:
        kind = "offset length" if self.lengths is not None else "key<TAB>offset"
        return f"RecordIndex({len(self.offsets)} records, {kind!r})"


def index_suffix(format: str) -> str:
    """The suffix of ``format``'s index beside its file: ``.idx`` (MXNet) for RecordIO, else
    ``.index``."""
    return ".idx" if format == "recordio" else ".index"


def _number(text: bytes) -> Optional[int]:
    # bytes.isdigit() is ASCII only ('²' is not a digit here, unlike str.isdigit()).
    if 0 < len(text) <= MAX_DIGITS and text.isdigit():
        return int(text)
    return None


def parse_index(data: bytes, *, source: Optional[str] = None) -> RecordIndex:
    """The records an index file's bytes list. The first non-blank line decides the dialect (a
    tab: ``key<TAB>offset``); every line must then follow it. Raises :class:`FormatError` naming
    the first line that does not (its number and the byte offset where it starts)."""
    data = bytes(data)
    return _parse_canonical(data) or parse_index_lines(data, source=source)


def _parse_canonical(data: bytes) -> Optional[RecordIndex]:
    """The index as the writers write it (``a b\n`` or ``a<TAB>b\n`` lines, numbers of 1-19
    digits), read with whole-buffer checks, about 3x faster than line by line; None for anything
    else (then :func:`parse_index_lines`, the reference, reads it and names a bad line)."""
    if not data.endswith(b"\n"):
        return None
    sep = b"\t" if b"\t" in data[:40] else b" "
    if data.translate(None, b"0123456789\n" + sep):
        return None
    # The separators must alternate sep, line feed, sep, ... with 1-19 digits between them.
    buf = np.frombuffer(data, np.uint8)
    seps = np.flatnonzero((buf == sep[0]) | (buf == 10))
    kinds = buf[seps]
    gaps = np.diff(seps, prepend=-1)
    if (len(seps) % 2 or not (kinds[0::2] == sep[0]).all() or not (kinds[1::2] == 10).all()
            or (gaps < 2).any() or (gaps > MAX_DIGITS + 1).any()):
        return None
    numbers = list(map(int, data.split()))
    if sep == b"\t":
        return RecordIndex(numbers[1::2], None)
    return RecordIndex(numbers[0::2], numbers[1::2])


def parse_index_lines(data: bytes, *, source: Optional[str] = None) -> RecordIndex:
    """:func:`parse_index`, line by line: any index it accepts (blank lines, ``\r\n``, keys
    that are not numbers), and the one that names a bad line."""
    offsets: list = []
    lengths: Optional[list] = None
    mxnet: Optional[bool] = None
    first = 0  # number of the first non-blank line, whose dialect the others must follow
    at = 0  # byte offset of the line
    for number, line in enumerate(bytes(data).split(b"\n"), 1):
        start, at = at, at + len(line) + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            continue
        if mxnet is None:
            mxnet, first = b"\t" in line, number
            lengths = None if mxnet else []
        offset = length = None
        if mxnet:
            fields = line.split(b"\t")
            if (len(fields) == 2 and 0 < len(fields[0]) <= MAX_KEY
                    and not fields[0].translate(None, _KEY_CHARS)):
                offset = _number(fields[1].rstrip(b" "))
        else:
            fields = line.split()
            if len(fields) == 2 and b"\t" not in line:
                offset, length = _number(fields[0]), _number(fields[1])
        if offset is None or (not mxnet and length is None):
            shown = line[:60].decode("ascii", "backslashreplace")
            want = ("'offset length' nor 'key<TAB>offset'" if number == first else
                    f"{'key<TAB>offset' if mxnet else 'offset length'!r} (as line {first} is)")
            raise FormatError(f"index line {number} is not {want}: {shown!r}", source=source,
                              offset=start)
        offsets.append(offset)
        if lengths is not None:
            lengths.append(length)
    return RecordIndex(offsets, lengths)


def index_misfit(index: RecordIndex, size: int) -> Optional[str]:
    """Why ``index`` cannot list the records of a ``size``-byte file (None: it may): no records,
    an offset at or past the end, offsets that do not increase, or (``offset length`` files)
    frames that do not follow one another to the end of the file. Only the file itself can say
    whether a record starts at each offset."""
    offsets, lengths = index.offsets, index.lengths
    if not offsets:
        return "it lists no records" if size else None
    previous = -1
    for k, offset in enumerate(offsets):
        if offset >= size:
            return f"entry {k + 1} says a record starts at byte {offset}, past the file's {size}"
        if offset <= previous:
            return f"its offsets do not increase (entry {k + 1}: {offset} after {previous})"
        previous = offset
    if lengths is not None:
        for k in range(len(offsets)):
            end = offsets[k + 1] if k + 1 < len(offsets) else size
            if offsets[k] + lengths[k] != end:
                what = f"byte {end}" if k + 1 < len(offsets) else f"the end of the file ({size})"
                return (f"entry {k + 1} (offset {offsets[k]}, length {lengths[k]}) does not end"
                        f" at {what}")
    return None


def encode_index(format: str, entries: Iterable[tuple]) -> Iterator[str]:
    """The lines of ``format``'s index for ``(key, offset, length)`` entries in file order:
    ``key<TAB>offset`` for RecordIO (MXNet), ``offset length`` otherwise (DALI)."""
    if format == "recordio":
        for key, offset, _ in entries:
            yield f"{key}\t{offset}\n"
    else:
        for _, offset, length in entries:
            yield f"{offset} {length}\n"


def without_index_files(paths: list) -> list:
    """``paths`` less the record indexes of other files among them (``x.tfrecord.index``,
    ``x.rec.idx``, MXNet's ``x.idx`` beside ``x.rec``: what ``streamio index``, ``streamio pack
    --index``, DALI and MXNet write). They hold offsets, not records; the byte-range planner
    finds them beside their files by itself. What a directory, a glob and a SageMaker File-mode
    channel read."""
    listed = set(paths)
    indexes = set()
    for path in paths:
        stem = posixpath.splitext(path)[0]  # names only: no I/O in this layer
        for candidate in (path + ".index", path + ".idx", stem + ".idx", stem + ".index"):
            if candidate != path and candidate in listed:
                indexes.add(candidate)
    return [p for p in paths if p not in indexes]

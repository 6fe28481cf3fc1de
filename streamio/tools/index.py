"""``streamio index FILE...``: write a record index beside each file, so that readers sharing one
file by byte range (``Dataset.shard``, DataLoader workers) cut it exactly at record starts.

The files are the ones other tools read: for TFRecord (and lines) ``FILE.index`` with one
``offset length`` line per record, as DALI's ``tfrecord2idx`` and the ``tfrecord`` package write;
for RecordIO ``FILE.idx`` with one ``key<TAB>offset`` line per record, as MXNet's ``im2rec``
writes (``streamio pack --index`` writes the same two). The walk reads only the frame headers it
needs and checks each (TFRecord: the length CRC; RecordIO: the magic number), so a damaged file
fails with the offset of the damage instead of giving an index that cuts records in two.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import Any, Callable, Iterator, Optional, TextIO

from ..errors import CorruptRecordError, TruncatedStreamError, UsageError
from ..formats.recordio import LENGTH_MASK, MAGIC
from ..formats.tfrecord import masked_crc32c
from .pack_checks import create_temp

__all__ = ["add_cli", "index_path", "iter_record_spans", "write_index"]

_CHUNK = 8 * 1024 * 1024
_SUFFIX_FORMATS = {".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfrec": "tfrecord",
                   ".rec": "recordio", ".recordio": "recordio", ".txt": "lines",
                   ".jsonl": "lines", ".ndjson": "lines", ".csv": "lines"}
_TF_HEADER = struct.Struct("<QI")
_RIO_HEADER = struct.Struct("<II")


def index_path(path: str, format: str) -> str:
    """Where the index of ``path`` goes (and where readers look first)."""
    return path + (".idx" if format == "recordio" else ".index")


def _format_of(path: str) -> str:
    fmt = _SUFFIX_FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise UsageError(f"cannot tell the format of {path} from its name: pass --format")
    return fmt


def _chunks(path: str, progress: Optional[Callable[[int], None]]) -> Iterator[tuple]:
    """``(offset, bytes)`` pieces of the file, read front to back."""
    with open(path, "rb") as f:
        offset = 0
        while True:
            data = f.read(_CHUNK)
            if not data:
                return
            yield offset, data
            offset += len(data)
            if progress is not None:
                progress(offset)


def iter_record_spans(path: str, format: str,
                      progress: Optional[Callable[[int], None]] = None) -> Iterator[tuple]:
    """``(offset, length)`` of each record of an uncompressed file: its frame (TFRecord, RecordIO:
    all parts of a multi-part record) or its line with the line feed."""
    if format == "lines":
        yield from _line_spans(path, progress)
        return
    if format not in ("tfrecord", "recordio"):
        raise UsageError(f"cannot index format {format!r} (tfrecord, recordio or lines)")
    buf = bytearray()
    base = 0  # file offset of buf[0]
    pos = 0  # next frame, in buf
    start = None  # RecordIO: where the multi-part record being walked started
    for _, data in _chunks(path, progress):
        buf += data
        while True:
            if format == "tfrecord":
                if len(buf) - pos < 12:
                    break
                length, length_crc = _TF_HEADER.unpack_from(buf, pos)
                if masked_crc32c(buf[pos:pos + 8]) != length_crc:
                    raise CorruptRecordError("TFRecord length CRC mismatch: cannot index past"
                                             " it", source=path, offset=base + pos)
                size = 16 + length
                if len(buf) - pos < size:
                    break
                yield base + pos, size
            else:
                if len(buf) - pos < 8:
                    break
                magic, lrec = _RIO_HEADER.unpack_from(buf, pos)
                if magic != MAGIC:
                    raise CorruptRecordError(f"RecordIO bad magic number 0x{magic:08X}: cannot"
                                             " index past it", source=path, offset=base + pos)
                length = lrec & LENGTH_MASK
                size = 8 + length + (-length & 3)
                if len(buf) - pos < size:
                    break
                cflag = lrec >> 29
                if cflag in (0, 1):
                    start = base + pos
                if cflag in (0, 3) and start is not None:
                    yield start, base + pos + size - start
                    start = None
            pos += size
        del buf[:pos]
        base += pos
        pos = 0
    if buf:
        raise TruncatedStreamError(f"the file ends inside a record ({len(buf)} bytes)",
                                   source=path, offset=base)


def _line_spans(path: str, progress: Optional[Callable[[int], None]]) -> Iterator[tuple]:
    start = 0
    for offset, data in _chunks(path, progress):
        at = data.find(b"\n")
        while at >= 0:
            yield start, offset + at + 1 - start
            start = offset + at + 1
            at = data.find(b"\n", at + 1)
    end = os.stat(path).st_size
    if end > start:
        yield start, end - start  # a last line without a line feed


def write_index(path: str, format: Optional[str] = None, *,
                progress: Optional[Callable[[int], None]] = None) -> str:
    """Write the index of ``path`` beside it (under a temporary name, then renamed, so a reader
    never sees half an index); returns its path. ``format``: from the suffix if None."""
    fmt = format or _format_of(path)
    out = index_path(path, fmt)
    with create_temp(out) as f:  # a random name, O_EXCL|O_NOFOLLOW: a planted link is not followed
        lines = []
        for key, (offset, length) in enumerate(iter_record_spans(path, fmt, progress)):
            lines.append(f"{key}\t{offset}\n" if fmt == "recordio" else f"{offset} {length}\n")
            if len(lines) >= 65536:
                f.write("".join(lines).encode("ascii"))
                lines = []
        f.write("".join(lines).encode("ascii"))
    return out


class _Bar:
    """A progress bar on a terminal: ``name [#####     ] 52%``, rewritten in place."""

    def __init__(self, stream: TextIO, name: str, total: int) -> None:
        self.stream, self.name, self.total = stream, name, max(total, 1)
        self._shown = 0.0

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self._shown < 0.1 and done < self.total:
            return
        self._shown = now
        part = min(done / self.total, 1.0)
        bar = "#" * int(part * 30)
        self.stream.write(f"\r{self.name} [{bar:<30}] {part:4.0%}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def add_cli(sub: Any) -> None:
    p = sub.add_parser("index", help="write a record index beside each file (exact byte-range"
                                     " splits)",
                       description="Write FILE.index (TFRecord, lines: 'offset length' lines) or"
                                   " FILE.idx (RecordIO: 'key<TAB>offset' lines) beside each"
                                   " FILE, so readers sharing a file split it at record starts.")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--format", "-f", choices=("tfrecord", "recordio", "lines"), default=None,
                   help="the records' format (default: from the file name)")
    p.set_defaults(func=cmd_index)


def cmd_index(args: Any) -> int:
    for path in args.files:
        bar = (_Bar(sys.stderr, os.path.basename(path), os.stat(path).st_size)
               if sys.stderr.isatty() else None)
        try:
            out = write_index(path, args.format, progress=bar)
        finally:
            if bar is not None:
                bar.close()
        print(out)
    return 0

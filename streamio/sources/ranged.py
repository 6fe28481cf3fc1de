"""Reading a source from a known byte offset: the one place where a source is positioned.

Everywhere else streamio never seeks, because any source may be a pipe. A regular file or an
http(s) URL can also be read from a byte offset; byte-range splits use that (several readers share
one big file, each reading about 1/N of it), and so can exact resume. Files are read with
``os.pread`` from the offset (``os.stat`` gives the size); HTTP sends ``Range: bytes=<offset>-``
and pins the object by its ETag like any resume (``Content-Length`` / ``Content-Range`` give the
size). ``s3://`` objects go through smart_open, whose reader turns one ``seek`` into a ranged
GET. Other sources (FIFOs, stdin, PipeChannels, file objects, other smart_open URLs) are read
front to back only.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Optional

from ..errors import SourceError, UsageError, require
from .base import ByteSource
from .http import HttpSource
from .local import StreamSource
from .schemes import lookup

#: Bytes of the head looked at to tell whether a source without a telling suffix is compressed.
SNIFF_BYTES = 64 * 1024
#: The largest byte offset a source can be opened at (a signed 64-bit off_t; os.pread raises
#: OverflowError past it).
MAX_OFFSET = 2**63 - 1


def open_s3_range(uri: str, start: int, **timeouts: Optional[float]) -> tuple:
    """``(StreamSource, size)`` of an S3 object read from byte ``start`` (smart_open, untimed:
    ``check_timeouts_apply`` refuses timeouts for s3:// URLs)."""
    smart_open = require("smart_open", "s3")
    try:
        fileobj = smart_open.open(uri, "rb", compression="disable")
        # The one positioning of an object-store reader: smart_open answers the size from the
        # object's metadata and makes the next read a ranged GET from ``start``.
        size = fileobj.seek(0, os.SEEK_END)
        fileobj.seek(start)
    except Exception as exc:  # smart_open raises many transport-specific types
        raise SourceError(f"cannot open at byte {start}: {exc}", source=uri) from exc
    return StreamSource(fileobj, name=uri, owned=True), size


class FileRangeSource(ByteSource):
    """A regular file read with ``os.pread`` from byte ``start`` on (the file offset is never
    moved, so nothing else about the descriptor changes)."""

    def __init__(self, path: str, start: int = 0) -> None:
        self.name = path
        self.offset = start  # the next byte to read
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise SourceError(f"cannot open: {exc.strerror}", source=path) from exc

    def readinto(self, buf: memoryview) -> int:
        if self.closed:
            raise SourceError("read from a closed source", source=self.name)
        try:
            n = os.preadv(self._fd, [buf], self.offset)
        except OSError as exc:
            raise SourceError(f"read failed at byte {self.offset}: {exc.strerror}",
                              source=self.name) from exc
        self.offset += n
        return n

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._fd)


def open_file_range(path: str, start: int, **timeouts: Optional[float]) -> tuple:
    """``(FileRangeSource, size)`` of a regular file read from byte ``start`` (a file never
    waits: no timeout applies)."""
    src = FileRangeSource(path, start)
    try:
        return src, os.fstat(src._fd).st_size
    except OSError as exc:
        src.close()
        raise SourceError(f"cannot stat: {exc.strerror}", source=path) from exc


def open_http_range(url: str, start: int, *, open_timeout: Optional[float] = None,
                    read_timeout: Optional[float] = None) -> tuple:
    """``(HttpSource, size)`` of an http(s) URL read from byte ``start`` (``Range:``)."""
    src = HttpSource(url, open_timeout=open_timeout, read_timeout=read_timeout, start=start)
    return src, src.total


def _ranged(source: Any) -> Optional[tuple]:
    """``(descriptor, URL, local path or None)`` of a source whose scheme reads byte ranges."""
    found = lookup(source)
    if found is None or found[0].open_range is None:
        return None
    descriptor, text = found
    return descriptor, text, descriptor.path(text) if descriptor.path else None


def range_capable(source: Any) -> bool:
    """Whether ``source`` could be read from a byte offset (a regular file or an http(s) or s3://
    URL), judged without opening it."""
    found = _ranged(source)
    if found is None:
        return False
    path = found[2]
    if path is None:
        return True  # a URL: whether the server honours ranges is learnt when it answers
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _open_range(source: Any, start: int, why: str, **timeouts: Optional[float]) -> tuple:
    found = _ranged(source)
    if found is None:
        raise UsageError(f"{source!r} {why}")
    descriptor, text, _ = found
    return descriptor.open_range(text, start, **timeouts)


def probe(source: Any, *, head: bool = True, open_timeout: Optional[float] = None,
          read_timeout: Optional[float] = None) -> tuple[Optional[int], bytes]:
    """``(size, head)`` of a range-capable source: its size in bytes (None if the server does
    not say) and, if ``head``, its first bytes (up to :data:`SNIFF_BYTES`, to tell whether it is
    compressed; else ``b""``). One ``os.fstat`` (and ``os.pread``) for a file, one request for
    HTTP or S3."""
    src, size = _open_range(source, 0, "cannot be read by byte range",
                            open_timeout=open_timeout, read_timeout=read_timeout)
    try:
        if not head:
            return size, b""
        buf = bytearray(SNIFF_BYTES)
        view = memoryview(buf)
        got = 0
        while got < SNIFF_BYTES:
            n = src.readinto(view[got:])
            if not n:
                break
            got += n
        view.release()
        return size, bytes(buf[:got])
    finally:
        src.close()


def open_at(source: Any, start: int, *, open_timeout: Optional[float] = None,
            read_timeout: Optional[float] = None) -> ByteSource:
    """Open a regular file, an http(s) URL or an s3:// object so that its first byte read is
    byte ``start``."""
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= MAX_OFFSET:
        raise UsageError(f"a byte offset must be an int from 0 to 2**63 - 1, not {start!r}")
    why = "cannot be read from a byte offset: only regular files and http(s) URLs can"
    return _open_range(source, start, why, open_timeout=open_timeout,
                       read_timeout=read_timeout)[0]


def split_range(size: int, parts: tuple) -> tuple[int, int]:
    """The byte range ``[start, end)`` of a ``size``-byte source that the shard layers ``parts``
    (``((num_shards, index), ...)``, outermost first) give: each layer cuts the range before it
    into ``num_shards`` nearly equal pieces, so together the shards cover every byte once."""
    start, end = 0, size
    for num_shards, index in parts:
        length = end - start
        start, end = (start + length * index // num_shards,
                      start + length * (index + 1) // num_shards)
    return start, end


__all__ = ["FileRangeSource", "MAX_OFFSET", "SNIFF_BYTES", "open_at", "open_file_range",
           "open_http_range", "open_s3_range", "probe", "range_capable", "split_range"]

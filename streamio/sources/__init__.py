"""Byte sources: I/O only. ``open_source`` turns whatever the user passed into a ``ByteSource``.

Schemes are looked up in ``SCHEMES`` (``register_scheme``, :mod:`.schemes`): one descriptor per
scheme (open, open at a byte offset, the local path, whether timeouts apply), so a new transport
is one module plus one registration line. Anything else with ``://`` goes to smart_open.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import UsageError
from ..errors import UsageTypeError
from .base import ByteSource, check_timeout
from .http import HttpSource
from .local import BytesSource, FileSource, StreamSource, stdin_source
from .pipe_channel import PipeChannel
from .ranged import open_file_range, open_http_range, open_s3_range
from .schemes import SCHEMES, SMART_OPEN, SourceScheme, lookup, register_scheme, url_scheme


def _file_path(url: str) -> str:
    """The path a ``file://`` URL (or a plain path) names."""
    return url[len("file://"):] if url_scheme(url) == "file" else url


def _open_file(url: str, **timeouts: Optional[float]) -> ByteSource:
    return FileSource(_file_path(url), **timeouts)


def _open_file_range(url: str, start: int, **timeouts: Optional[float]) -> tuple:
    return open_file_range(_file_path(url), start, **timeouts)


register_scheme("file", _open_file, open_range=_open_file_range, path=_file_path)
register_scheme("http", HttpSource, open_range=open_http_range)
register_scheme("https", HttpSource, open_range=open_http_range)
register_scheme("s3", SMART_OPEN.open, open_range=open_s3_range, timeouts=False)


def source_name(source: Any) -> str:
    """A readable name for a source (before it is opened)."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        return "<stdin>" if text == "-" else text
    if isinstance(source, PipeChannel):
        return source.name
    if isinstance(source, ByteSource):
        return source.name
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "<bytes>"
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else f"<{type(source).__name__}>"


def check_source(source: Any) -> None:
    """Raise TypeError now for something that can never be a source."""
    if isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview, PipeChannel, ByteSource)):
        return
    if callable(getattr(source, "readinto", None)) or callable(getattr(source, "read", None)):
        return
    raise UsageTypeError(f"cannot read from a {type(source).__name__}: pass a path, URL, '-', bytes,"
                    " a binary file object or a PipeChannel")


def _timeless_kind(source: Any) -> Optional[str]:
    """What kind of source this is if streamio cannot bound its waits (else None)."""
    if isinstance(source, ByteSource):
        return "an already opened source (give it its timeouts when you create it)"
    found = lookup(source)
    if found is not None and not found[0].timeouts:
        scheme = url_scheme(found[1])
        return f"a {scheme}:// URL (read through smart_open, which streamio cannot time)"
    if isinstance(source, (str, os.PathLike)):
        return None
    if isinstance(source, (bytes, bytearray, memoryview, PipeChannel)):
        return None  # in-memory bytes never wait; a PipeChannel takes them per epoch
    return ("a file object (streamio cannot bound its reads; pass its path, or '-' for stdin)")


def check_timeouts_apply(source: Any, *, open_timeout: Optional[float] = None,
                         read_timeout: Optional[float] = None) -> None:
    """Raise :class:`UsageError` if timeouts are asked for a source that cannot honour them.

    Timeouts bound waiting: paths (regular files never wait; FIFOs are polled), ``"-"``, http(s)
    and ``file://`` URLs and PipeChannels take them, and in-memory bytes satisfy any. A file
    object or a smart_open URL could wait without bound, so asking for a timeout there is an
    error rather than a promise silently not kept.
    """
    given = [name for name, value in (("open_timeout", open_timeout),
                                      ("read_timeout", read_timeout)) if value is not None]
    kind = _timeless_kind(source) if given else None
    if kind:
        raise UsageError(f"option {' and '.join(given)} cannot apply to {source_name(source)}:"
                         f" it is {kind}")


def open_source(source: Any, *, open_timeout: Optional[float] = None,
                read_timeout: Optional[float] = None) -> ByteSource:
    """Open ``source`` for reading. Paths may name FIFOs; ``"-"`` is stdin.

    ``open_timeout``: seconds to wait for the source to start (a FIFO's writer and its first
    data; an HTTP connection and its response headers); ``read_timeout``: seconds any later
    read may wait. None: the source's default (FIFOs and stdin: ``open_timeout`` takes
    ``read_timeout``'s value, and both None wait as long as it takes; HTTP: see
    :mod:`streamio.sources.http`).
    """
    check_timeout("open_timeout", open_timeout)
    check_timeout("read_timeout", read_timeout)
    check_source(source)
    check_timeouts_apply(source, open_timeout=open_timeout, read_timeout=read_timeout)
    timeouts = {"open_timeout": open_timeout, "read_timeout": read_timeout}
    if isinstance(source, ByteSource):
        if source.closed:
            raise UsageError(f"{source.name} was already read to the end and closed")
        return source
    if isinstance(source, PipeChannel):
        return source.open(**timeouts)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return BytesSource(source)
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text == "-":
            return stdin_source(**timeouts)
        descriptor, _ = lookup(text)
        return descriptor.open(text, **timeouts)
    return StreamSource(source)


__all__ = ["ByteSource", "BytesSource", "FileSource", "HttpSource", "PipeChannel", "SCHEMES",
           "SourceScheme", "StreamSource", "check_source", "check_timeouts_apply", "open_source",
           "register_scheme", "source_name"]

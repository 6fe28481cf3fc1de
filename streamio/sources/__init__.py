"""Byte sources: I/O only. ``open_source`` turns whatever the user passed into a ``ByteSource``.

Schemes are looked up in ``SCHEMES`` (``register_scheme``): a new transport is one module plus one
registration line. Anything else with ``://`` goes to smart_open.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from ..errors import UsageError
from ..errors import UsageTypeError
from .base import ByteSource, check_timeout
from .http import HttpSource
from .local import BytesSource, FileSource, StreamSource, stdin_source
from .pipe_channel import PipeChannel
from .remote import open_smart

Opener = Callable[..., ByteSource]
SCHEMES: dict[str, Opener] = {}


def register_scheme(scheme: str, opener: Opener) -> None:
    """``opener(url, read_timeout=...) -> ByteSource`` serves URLs of ``scheme://``."""
    SCHEMES[scheme] = opener


register_scheme("http", lambda url, read_timeout=None: HttpSource(url, read_timeout=read_timeout))
register_scheme("https", lambda url, read_timeout=None: HttpSource(url, read_timeout=read_timeout))
register_scheme("file", lambda url, read_timeout=None: FileSource(url[len("file://"):],
                                                                  read_timeout=read_timeout))


def _scheme(text: str) -> str:
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.isalnum() else ""


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


def open_source(source: Any, *, read_timeout: Optional[float] = None) -> ByteSource:
    """Open ``source`` for reading. Paths may name FIFOs; ``"-"`` is stdin."""
    check_timeout("read_timeout", read_timeout)
    check_source(source)
    if isinstance(source, ByteSource):
        if source.closed:
            raise UsageError(f"{source.name} was already read to the end and closed")
        return source
    if isinstance(source, PipeChannel):
        return source.open()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return BytesSource(source)
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text == "-":
            return stdin_source()
        scheme = _scheme(text)
        if scheme in SCHEMES:
            return SCHEMES[scheme](text, read_timeout=read_timeout)
        if scheme:
            return open_smart(text)
        return FileSource(text, read_timeout=read_timeout)
    return StreamSource(source)


__all__ = ["ByteSource", "BytesSource", "FileSource", "HttpSource", "PipeChannel", "SCHEMES",
           "StreamSource", "check_source", "open_source", "register_scheme", "source_name"]

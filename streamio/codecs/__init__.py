"""Incremental whole-stream decompression, sans-IO like the framers.

A codec has ``decode(chunk) -> Iterator[bytes]`` and ``finish() -> Iterator[bytes]``. Output comes
in pieces of at most ``MAX_PIECE`` bytes, so a small compressed chunk that inflates enormously
(a "zip bomb") never materialises at once: the framer's ``max_record_size`` bounds what is kept.

- :mod:`.deflate`: gzip and zlib (several members/streams in a row, zero padding after them);
- :mod:`.zstd`: Zstandard (optional: ``pip install 'streamio[zstd]'``), frames in a row;
- :mod:`._inflate`: a faster inflater (ISA-L, zlib-ng) when installed, zlib otherwise;
- :mod:`.sniff`: ``compression="infer"`` for a name that says nothing (look at the first bytes),
  and :func:`describe_head`, which says what a stream's first bytes look like.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from ..errors import UsageError
from .deflate import MAX_PIECE, ZlibCodec
from .sniff import SniffingCodec, describe_head
from .zstd import ZstdCodec

Compression = Optional[Literal["gzip", "zlib", "zstd", "infer"]]
COMPRESSION_CHOICES = (None, "gzip", "zlib", "zstd", "infer")
_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zz": "zlib", ".zlib": "zlib", ".zst": "zstd",
             ".zstd": "zstd"}


def infer_compression(name: Optional[str]) -> Optional[str]:
    """The compression implied by a source name's suffix (``.gz``, ``.zz``/``.zlib``, ``.zst``),
    if any."""
    if not name:
        return None
    base = name.split("?", 1)[0].lower()
    for suffix, kind in _SUFFIXES.items():
        if base.endswith(suffix):
            return kind
    return None


def check_compression(compression: Any) -> None:
    if compression not in COMPRESSION_CHOICES:
        raise UsageError(f"compression must be one of {COMPRESSION_CHOICES}, not {compression!r}")


def _named_codec(kind: str, source: str) -> Any:
    if kind == "zstd":
        return ZstdCodec(source=source)
    return ZlibCodec(kind, source=source)


def make_compressor(kind: str) -> Any:
    """An object with ``compress(data) -> bytes`` and ``flush() -> bytes`` writing ``kind``."""
    check_compression(kind)
    if kind == "zstd":
        from .zstd import zstd_compressor
        return zstd_compressor()
    import zlib
    return zlib.compressobj(6, zlib.DEFLATED, 31 if kind == "gzip" else 15)


def make_codec(compression: Compression, name: Optional[str]) -> Optional[Any]:
    """The codec for ``compression``, or None for plain bytes.

    ``"infer"`` goes by the suffix of ``name``; a name without one (a FIFO, stdin, an URL without
    an extension) gets a :class:`SniffingCodec`, which decides from the stream's first bytes.
    """
    check_compression(compression)
    source = name or "<stream>"
    kind = infer_compression(name) if compression == "infer" else compression
    if kind:
        return _named_codec(kind, source)
    if compression == "infer":
        return SniffingCodec(source=source, make=lambda found: _named_codec(found, source))
    return None


__all__ = ["COMPRESSION_CHOICES", "MAX_PIECE", "SniffingCodec", "ZlibCodec", "ZstdCodec",
           "check_compression", "describe_head", "infer_compression", "make_codec",
           "make_compressor"]

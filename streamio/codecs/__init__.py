"""Incremental whole-stream decompression, sans-IO like the framers.

A codec has ``decode(chunk) -> Iterator[bytes]`` and ``finish() -> Iterator[bytes]``. Output comes
in pieces of at most ``MAX_PIECE`` bytes, so a small compressed chunk that inflates enormously
(a "zip bomb") never materialises at once: the framer's ``max_record_size`` bounds what is kept.
"""

from __future__ import annotations

import zlib
from typing import Iterator, Literal, Optional, Union

from ..errors import CorruptRecordError, TruncatedStreamError
from ..errors import UsageError

Compression = Optional[Literal["gzip", "zlib", "infer"]]
COMPRESSION_CHOICES = (None, "gzip", "zlib", "infer")
MAX_PIECE = 4 * 1024 * 1024
_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zz": "zlib", ".zlib": "zlib"}


def infer_compression(name: Optional[str]) -> Optional[str]:
    """The compression implied by a source name's suffix (``.gz``, ``.zz``/``.zlib``), if any."""
    if not name:
        return None
    base = name.split("?", 1)[0].lower()
    for suffix, kind in _SUFFIXES.items():
        if base.endswith(suffix):
            return kind
    return None


def check_compression(compression) -> None:
    if compression not in COMPRESSION_CHOICES:
        raise UsageError(f"compression must be one of {COMPRESSION_CHOICES}, not {compression!r}")


class ZlibCodec:
    """gzip (``wbits=31``, several members allowed, as ``gzip`` concatenation makes) or zlib."""

    def __init__(self, kind: str, *, source: str) -> None:
        self.kind = kind
        self.source = source
        self._wbits = 31 if kind == "gzip" else 15
        self._d = zlib.decompressobj(self._wbits)
        self._out = 0  # decompressed bytes produced (offsets in errors are in this stream)
        self._member_started = False

    def _fault(self, cls, message: str):
        return cls(f"{self.kind} stream: {message}", source=self.source, offset=self._out)

    def decode(self, chunk) -> Iterator[Union[bytes, bytearray]]:
        data = chunk
        while True:
            if self._d.eof and len(data):
                # gzip allows several members back to back; zlib data ends at its trailer.
                if self.kind != "gzip":
                    raise self._fault(CorruptRecordError, "trailing bytes after the end of the stream")
                self._d = zlib.decompressobj(self._wbits)
            if len(data):
                self._member_started = True
            try:
                piece = self._d.decompress(data, MAX_PIECE)
            except zlib.error as exc:
                raise self._fault(CorruptRecordError, f"corrupt compressed data ({exc})") from exc
            if piece:
                self._out += len(piece)
                yield piece
            if self._d.eof:
                data = self._d.unused_data
                if not data:
                    return
                continue
            data = self._d.unconsumed_tail
            # A full piece may leave output pending inside zlib even with no input left.
            if not data and len(piece) < MAX_PIECE:
                return

    def finish(self) -> Iterator[bytes]:
        try:
            piece = self._d.flush()
        except zlib.error as exc:  # pragma: no cover - flush rarely fails
            raise self._fault(CorruptRecordError, f"corrupt compressed data ({exc})") from exc
        if piece:
            self._out += len(piece)
            yield piece
        if self._member_started and not self._d.eof:
            raise self._fault(TruncatedStreamError, "compressed stream ends early (cut short?)")


def make_codec(compression: Compression, name: Optional[str]) -> Optional[ZlibCodec]:
    """The codec for ``compression`` (``"infer"`` goes by ``name``), or None for plain bytes."""
    check_compression(compression)
    kind = infer_compression(name) if compression == "infer" else compression
    return ZlibCodec(kind, source=name or "<stream>") if kind else None


__all__ = ["COMPRESSION_CHOICES", "ZlibCodec", "check_compression", "infer_compression", "make_codec"]

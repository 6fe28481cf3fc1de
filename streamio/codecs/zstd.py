"""Zstandard (``.zst``) streams: several frames in a row (``cat a.zst b.zst``, or a writer that
flushes frame by frame) are read as one stream, as ``zstd -d`` does.

Needs the standard library's ``compression.zstd`` (Python 3.14+) or its backport
(``pip install 'streamio[zstd]'``, package ``backports.zstd``). Not the ``zstandard`` package:
its incremental decompressor cannot bound how much one call returns, and a few KiB of zstd can
inflate to gigabytes; ``decompress(data, max_length)`` here keeps every piece within
``MAX_PIECE``, as for gzip.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..errors import CorruptRecordError, MissingDependencyError, TruncatedStreamError
from .deflate import MAX_PIECE, input_windows


def zstd_module() -> Any:
    """``compression.zstd`` or ``backports.zstd`` (the same API), or MissingDependencyError."""
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+
    except ImportError:
        try:
            from backports import zstd  # type: ignore[import-not-found,no-redef]
        except ImportError as exc:
            raise MissingDependencyError("backports.zstd", "zstd") from exc
    return zstd


class ZstdCodec:
    """Incremental Zstandard decompression (RFC 8878), frame after frame."""

    kind = "zstd"

    def __init__(self, *, source: str) -> None:
        self._zstd = zstd_module()
        self.source = source
        self._d = self._zstd.ZstdDecompressor()
        self._out = 0
        self._in = 0
        self._started = False  # bytes of a frame received and its end not reached
        self._head = b""

    def _corrupt(self, exc: Exception) -> Exception:
        message = f"zstd stream: corrupt compressed data before compressed offset {self._in} ({exc})"
        if not self._out:
            from .sniff import describe_head
            hint = describe_head(self._head, compression="zstd")
            if hint:
                message += f"; {hint}"
        return CorruptRecordError(message, source=self.source, offset=self._out)

    def decode(self, chunk: Any) -> Iterator[bytes]:
        size = len(chunk)
        if not size:
            return
        if len(self._head) < 16:
            self._head += bytes(chunk[:16 - len(self._head)])
        # In windows, as for gzip: a frame's end copies the rest of the input (unused_data).
        for window in input_windows(chunk):
            yield from self._decode_window(window)

    def _decode_window(self, data: Any) -> Iterator[bytes]:
        self._in += len(data)
        while True:
            self._started = True
            try:
                piece = self._d.decompress(data, MAX_PIECE)
            except self._zstd.ZstdError as exc:
                raise self._corrupt(exc) from exc
            data = b""  # the decompressor keeps what it did not consume
            if piece:
                self._out += len(piece)
                yield piece
            if self._d.eof:
                # A frame ended; whatever follows is the next frame (or garbage, said next call).
                data = self._d.unused_data
                self._d = self._zstd.ZstdDecompressor()
                self._started = False
                if not data:
                    return
                continue
            if self._d.needs_input:
                return

    def finish(self) -> Iterator[bytes]:
        if self._started:
            raise TruncatedStreamError("zstd stream: compressed stream ends early (cut short?)",
                                       source=self.source, offset=self._out)
        return iter(())


def zstd_compressor() -> Any:
    """An object with ``compress(data)`` and ``flush()`` writing one zstd frame (level 3)."""
    return zstd_module().ZstdCompressor()


__all__ = ["ZstdCodec", "zstd_compressor", "zstd_module"]

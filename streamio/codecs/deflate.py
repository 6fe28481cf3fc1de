"""gzip and zlib streams (DEFLATE inside), decompressed incrementally.

Like ``gzip -d`` and Python's :mod:`gzip`, a stream may hold several members (``cat a.gz b.gz``);
zlib streams may be concatenated the same way (``cat a.zz b.zz``: TensorFlow stops after the
first, silently; streamio reads them all). Zero bytes between or after members are tape/block
padding and are skipped, as ``gzip -d`` and :mod:`gzip` do; any other trailing bytes are not a
member and raise :class:`~streamio.errors.CorruptRecordError` naming their compressed offset.
"""

from __future__ import annotations

from typing import Any, Iterator, Union

from ..errors import CorruptRecordError, TruncatedStreamError

#: Output comes in pieces of at most this many bytes, so a small compressed chunk that inflates
#: enormously (a "zip bomb") never materialises at once: the framer's ``max_record_size`` bounds
#: what is kept.
MAX_PIECE = 4 * 1024 * 1024
#: Compressed input is handed to the inflater at most this many bytes at a time. When a member
#: ends, the inflater copies the rest of its input into ``unused_data``: fed a whole 4 MiB chunk
#: of tiny members, that copy would cost O(chunk) per member (quadratic in the chunk). A window
#: bounds it, and costs one more call per 64 KiB of a large member (nothing measurable).
INPUT_WINDOW = 64 * 1024
#: How many of the first raw bytes are kept to say what a stream that fails to inflate looks like.
HEAD_BYTES = 16

GZIP_MAGIC = b"\x1f\x8b"


def zlib_header_ok(cmf: int, flg: int) -> bool:
    """RFC 1950: CM = 8 (deflate), CINFO <= 7 (window <= 32 KiB), FCHECK makes the pair a
    multiple of 31. A preset dictionary (FDICT) is not something a file stream can use."""
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0 and not flg & 0x20


def input_windows(chunk: Any) -> Iterator[Any]:
    """``chunk`` in pieces of at most INPUT_WINDOW bytes (views: nothing is copied)."""
    size = len(chunk)
    if size <= INPUT_WINDOW:
        yield chunk
        return
    view = memoryview(chunk).cast("B")
    for start in range(0, size, INPUT_WINDOW):
        yield view[start:start + INPUT_WINDOW]


def _inflater(wbits: int, backend: Any) -> Any:
    return backend.decompressobj(wbits)


class ZlibCodec:
    """gzip (``wbits=31``) or zlib (``wbits=15``); several members or streams in a row.

    ``backend`` is a module with zlib's ``decompressobj``/``error`` API (the standard ``zlib``,
    or a faster drop-in from :mod:`._inflate`); every backend gives the same bytes.
    """

    def __init__(self, kind: str, *, source: str, backend: Any = None) -> None:
        if backend is None:
            from ._inflate import default_backend
            backend = default_backend()
        self.kind = kind
        self.source = source
        self._backend = backend
        self._error = backend.error
        self._wbits = 31 if kind == "gzip" else 15
        self._d = _inflater(self._wbits, backend)
        self._out = 0  # decompressed bytes produced (offsets in errors are in this stream)
        self._in = 0  # compressed bytes received before the current chunk
        self._members = 0  # members (streams) finished
        self._member_at = 0  # compressed offset where the current member starts
        self._member_out = 0  # decompressed bytes of the current member
        self._between = False  # after a member's end: padding, another member or the end
        self._started = False  # some bytes of a member were received
        self._head = b""

    def _fault(self, cls, message: str) -> Exception:
        return cls(f"{self.kind} stream: {message}", source=self.source, offset=self._out)

    def _corrupt(self, exc: Exception) -> Exception:
        if self._members and not self._member_out:
            return self._fault(CorruptRecordError, f"the bytes at compressed offset"
                               f" {self._member_at} after the last {self.kind} member are not"
                               f" another member nor zero padding ({exc})")
        message = f"corrupt compressed data before compressed offset {self._in} ({exc})"
        if not self._out:
            from .sniff import describe_head
            hint = describe_head(self._head, compression=self.kind)
            if hint:
                message += f"; {hint}"
        return self._fault(CorruptRecordError, message)

    def _next_member(self, data: Any, offset: int) -> Any:
        """After a member's end: skip zero padding; what follows must start another member.
        Returns the bytes to inflate (empty when the chunk holds only padding)."""
        raw = bytes(data)
        rest = raw.lstrip(b"\0")
        if not rest:
            return b""
        at = offset + len(raw) - len(rest)
        first = rest[0]
        plausible = (first == 0x1F and (len(rest) < 2 or rest[1] == 0x8B) if self.kind == "gzip"
                     else first & 0x0F == 8 and (len(rest) < 2 or zlib_header_ok(first, rest[1])))
        if not plausible:
            raise self._fault(CorruptRecordError, f"trailing garbage at compressed offset {at}"
                              f" (byte 0x{first:02x}): after the last {self.kind} member only"
                              " zero padding may follow")
        self._d = _inflater(self._wbits, self._backend)
        self._between = False
        self._member_at = at
        self._member_out = 0
        return rest

    def decode(self, chunk: Any) -> Iterator[Union[bytes, bytearray]]:
        size = len(chunk)
        if not size:
            return
        if len(self._head) < HEAD_BYTES:
            self._head += bytes(chunk[:HEAD_BYTES - len(self._head)])
        for window in input_windows(chunk):
            yield from self._decode_window(window)

    def _decode_window(self, window: Any) -> Iterator[Union[bytes, bytearray]]:
        size = len(window)
        base = self._in
        self._in += size
        data = window
        decompress = self._d.decompress
        while True:
            if self._between:
                # ``data`` is always a suffix of ``window``: its offset follows from its length.
                data = self._next_member(data, base + size - len(data))
                if not data:
                    return
                decompress = self._d.decompress
            self._started = True
            try:
                piece = decompress(data, MAX_PIECE)
            except self._error as exc:
                raise self._corrupt(exc) from exc
            if piece:
                self._out += len(piece)
                self._member_out += len(piece)
                yield piece
            if self._d.eof:
                self._members += 1
                self._between = True
                data = self._d.unused_data
                if not data:
                    return
                continue
            data = self._d.unconsumed_tail
            # A full piece may leave output pending inside the inflater even with no input left.
            if not data and len(piece) < MAX_PIECE:
                return

    def finish(self) -> Iterator[bytes]:
        if self._between or not self._started:
            return  # ended after a member (and its padding), or an empty stream
        try:
            piece = self._d.flush()
        except self._error as exc:  # pragma: no cover - flush rarely fails
            raise self._corrupt(exc) from exc
        if piece:
            self._out += len(piece)
            yield piece
        if not self._d.eof:
            raise self._fault(TruncatedStreamError, "compressed stream ends early (cut short?)")


__all__ = ["GZIP_MAGIC", "INPUT_WINDOW", "MAX_PIECE", "input_windows", "ZlibCodec", "zlib_header_ok"]

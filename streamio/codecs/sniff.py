"""What the first bytes of a stream look like: used to pick a codec when ``compression="infer"``
and the name says nothing, and to tell a user who passed the wrong format or compression what
the bytes are. Sans-IO, like the codecs: nothing here seeks or reads; bytes are fed in.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Callable, Iterator, Optional, Tuple

from .deflate import GZIP_MAGIC, zlib_header_ok

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878: a Zstandard frame starts with 0xFD2FB528 (LE)
RECORDIO_MAGIC = b"\x0a\x23\xd7\xce"  # dmlc RecordIO: u32 0xCED7230A (LE) before every part
#: A gzip or zlib header is only 2-3 bytes, which plain data can start with by chance (a TFRecord
#: whose length is 0x178 starts ``78 01``, a zlib header). So the candidate must also inflate
#: without error for this many bytes, or to its end, before the stream is taken as compressed.
TRIAL_BYTES = 4096
_TRIAL_OUT = 64 * 1024  # a trial that has inflated this much is convincing: stop there


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the end of the sample
            return False
        text = head[:exc.start].decode("utf-8")
    if text.startswith("\ufeff"):
        text = text[1:]
    return bool(text) and all(ch.isprintable() or ch in "\t\r\n" for ch in text)


def _looks_like_tfrecord(head: bytes) -> bool:
    if len(head) < 12:
        return False
    from ..formats.tfrecord import masked_crc32c  # TFRecord: u64 length, u32 masked crc32c of it
    return masked_crc32c(head[:8]) == struct.unpack_from("<I", head, 8)[0]


def describe_head(head: bytes, *, format: Optional[str] = None,
                  compression: Optional[str] = None, decompressed: bool = False) -> Optional[str]:
    """A hint saying what ``head`` (the first bytes a layer saw) looks like, when that differs
    from what the caller assumed (``format`` of the records, ``compression`` of the stream);
    None when the bytes look like nothing in particular or like what was assumed.

    ``decompressed``: ``head`` came out of a codec, so only the records' format is described.
    """
    head = bytes(head)
    if decompressed:
        seen = None
    elif head[:2] == GZIP_MAGIC:
        seen = "gzip"
    elif head[:4] == ZSTD_MAGIC:
        seen = "zstd"
    elif len(head) >= 2 and zlib_header_ok(head[0], head[1]) and not _looks_like_text(head):
        seen = "zlib"
    else:
        seen = None
    if seen is not None:
        if seen == compression:
            return None
        return f"the stream looks like {seen}-compressed data: pass compression={seen!r}"
    if compression is not None:
        seen_format = _records_look_like(head)
        what = f" (it looks like {seen_format[1]})" if seen_format else ""
        return f"the stream does not look {compression}-compressed{what}: pass compression=None"
    seen_format = _records_look_like(head)
    if seen_format is None or seen_format[0] == format or (
            seen_format[0] == "text" and format in ("csv", "lines")):
        return None
    if seen_format[0] == "text":
        return "the stream looks like text: pass format='csv' or format='lines'"
    return f"the stream looks like {seen_format[1]}: pass format={seen_format[0]!r}"


def _records_look_like(head: bytes) -> Optional[Tuple[str, str]]:
    """(format, description) of what the first decompressed bytes look like, if anything."""
    if head[:4] == RECORDIO_MAGIC:
        return "recordio", "RecordIO data"
    if _looks_like_tfrecord(head):
        return "tfrecord", "TFRecord data"
    if _looks_like_text(head):
        return "text", "text"
    return None


class SniffingCodec:
    """``compression="infer"`` for a name without a telling suffix: look at the first bytes.

    gzip (``1f 8b``), zstd (``28 b5 2f fd``) and a zlib header (CM = 8, FCHECK) are recognised;
    a gzip or zlib candidate must also inflate cleanly (see ``TRIAL_BYTES``). Anything else is
    passed through as it is. Nothing is seeked: the first bytes are held back until decided
    (at most ``TRIAL_BYTES`` plus one chunk), then handed to the chosen codec.
    """

    def __init__(self, *, source: str, make: Callable[[str], Any]) -> None:
        self.source = source
        self._make = make  # kind -> codec
        self._held = bytearray()
        self._decided = False
        self._inner: Any = None
        self.kind: Optional[str] = None  # what was chosen, once decided
        self._trial: Any = None
        self._trial_kind: Optional[str] = None
        self._trial_fed = 0

    def _candidate(self, final: bool) -> Optional[str]:
        """'gzip', 'zlib', 'zstd', '' (plain) or None (too few bytes to tell yet)."""
        held = self._held
        n = len(held)
        if held[:2] == GZIP_MAGIC[:n]:
            return "gzip" if n >= 2 else (None if not final else "")
        if held[:4] == ZSTD_MAGIC[:n]:
            return "zstd" if n >= 4 else (None if not final else "")
        if n >= 2 and zlib_header_ok(held[0], held[1]):
            return "zlib"
        if n == 1 and held[0] & 0x0F == 8 and not final:
            return None
        return ""

    def _trial_says(self, kind: str, final: bool) -> Optional[bool]:
        """Does the candidate inflate? True, False, or None (not enough bytes yet)."""
        if self._trial is None:
            self._trial = zlib.decompressobj(31 if kind == "gzip" else 15)
        new = bytes(self._held[self._trial_fed:TRIAL_BYTES])
        self._trial_fed += len(new)
        try:
            out = self._trial.decompress(new, _TRIAL_OUT)
        except zlib.error:
            return False
        if self._trial.eof or len(out) >= _TRIAL_OUT or self._trial_fed >= TRIAL_BYTES:
            return True
        return False if final else None

    def _decide(self, final: bool) -> bool:
        kind = self._candidate(final)
        if kind is None:
            return False
        if kind in ("gzip", "zlib"):
            verdict = self._trial_says(kind, final)
            if verdict is None:
                return False
            if not verdict:
                kind = ""
        self._decided = True
        self.kind = kind or None
        self._trial = None
        if kind:
            self._inner = self._make(kind)
        return True

    @property
    def plain(self) -> bool:
        """Decided, and the stream is not compressed: decode() hands chunks on as they are."""
        return self._decided and self._inner is None

    def decode(self, chunk: Any) -> Iterator[Any]:
        if self._decided:
            if self._inner is None:
                yield chunk
            else:
                yield from self._inner.decode(chunk)
            return
        if not self._held:
            # The first chunk: decided on its first bytes alone where they tell, it goes on as
            # it is (holding and copying it cost two passes over a reader's first read of every
            # stream: a whole small file). Else it is held, as the bytes after it are.
            view = memoryview(chunk)
            self._held += view[:TRIAL_BYTES]
            if self._decide(final=False):
                self._held = bytearray()
                if self._inner is None:
                    yield chunk
                else:
                    yield from self._inner.decode(chunk)
                return
            self._held += view[TRIAL_BYTES:]
            return
        self._held += chunk
        if self._decide(final=False):
            yield from self._release()

    def _release(self) -> Iterator[Any]:
        held, self._held = bytes(self._held), bytearray()
        if not held:
            return
        if self._inner is None:
            yield held
        else:
            yield from self._inner.decode(held)

    def finish(self) -> Iterator[Any]:
        if not self._decided:
            self._decide(final=True)
            yield from self._release()
        if self._inner is not None:
            yield from self._inner.finish()


__all__ = ["RECORDIO_MAGIC", "SniffingCodec", "TRIAL_BYTES", "ZSTD_MAGIC", "describe_head"]

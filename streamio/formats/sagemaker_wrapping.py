"""SageMaker's RecordIO wrapping and the framings built on it, sans-IO.

With ``RecordWrapperType: RecordIO`` SageMaker wraps each S3 object (or, for an augmented
manifest, each attribute of each JSON line) in one RecordIO record before it enters the FIFO::

    u32 magic 0xCED7230A | u32 lrec (cflag << 29 | length) | payload | zero pad to 4

Objects over a part's 2**29 - 1 bytes come in parts (cflag 1 first, 2 middle, 3 last) that are
joined as they are. :class:`RecordIOUnwrapper` turns the wrapped bytes into the objects' bytes
piece by piece, never holding a whole object, so a 1 GB object costs no more memory than a 1 KB
one; ``streamio.sagemaker.wrapping`` applies it to a source and to each epoch's FIFO.

An augmented manifest keeps its attributes apart: :class:`ManifestGroupFramer` (format
``"sagemaker-manifest"``) frames the wrapped records and makes each JSON line's ``n`` attribute
records one record, which :func:`split_manifest_record` takes apart again.
"""

from __future__ import annotations

import struct
from typing import Optional

from ..errors import (CorruptRecordError, DecodeError, RecordTooLargeError,
                      TruncatedStreamError, UsageError)
from .recordio import HEADER_SIZE, LENGTH_MASK, MAGIC, RecordIOFramer

_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<Q")
# cflag values: 0 whole record, 1 first part, 2 middle part, 3 last part.
_WHOLE, _FIRST, _MIDDLE, _LAST = 0, 1, 2, 3


class RecordIOUnwrapper:
    """Sans-IO: ``feed(chunk)`` returns the unwrapped pieces it completes, as a list of
    ``bytes`` (an object's bytes in order) and ``None`` (an object ended); ``finish()`` checks the
    stream did not stop inside a record.

    ``max_object_size`` bounds nothing in memory (objects stream through); it is a sanity limit
    on the declared sizes, checked before a part is passed on.
    """

    def __init__(self, *, source: str = "<stream>",
                 max_object_size: Optional[int] = None) -> None:
        self.source = source
        self.max_object_size = max_object_size
        self.offset = 0  # bytes of the wrapped stream consumed
        self.objects = 0  # objects completed
        self._header = bytearray()
        self._remaining = 0  # payload bytes of the current part still to pass on
        self._pad = 0  # padding bytes still to drop
        self._cflag: Optional[int] = None  # the current part's cflag, None between parts
        self._in_object = False  # inside a multi-part object (after cflag 1, before 3)
        self._object_size = 0
        self._part_start = 0

    def feed(self, chunk) -> list:
        view = memoryview(chunk).cast("B")
        out: list = []
        pos, end = 0, len(view)
        while pos < end:
            if self._remaining:
                take = min(self._remaining, end - pos)
                out.append(bytes(view[pos:pos + take]))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._end_part(out)
            elif self._pad:
                take = min(self._pad, end - pos)
                pos += take
                self._pad -= take
            else:
                take = min(HEADER_SIZE - len(self._header), end - pos)
                self._header += view[pos:pos + take]
                pos += take
                if len(self._header) == HEADER_SIZE:
                    self._start_part(out, self.offset + pos - HEADER_SIZE)
        self.offset += end
        return out

    def _fault(self, cls, message: str, offset: int):
        return cls(f"SageMaker RecordIO wrapping: {message}", source=self.source, offset=offset,
                   record_index=self.objects)

    def _start_part(self, out: list, offset: int) -> None:
        magic, lrec = _HEADER.unpack(self._header)
        self._header.clear()
        if magic != MAGIC:
            raise self._fault(CorruptRecordError, f"bad magic number 0x{magic:08X} (expected"
                              f" 0x{MAGIC:08X}); is the channel really RecordIO-wrapped?",
                              offset)
        cflag, length = lrec >> 29, lrec & LENGTH_MASK
        if self._in_object and cflag not in (_MIDDLE, _LAST):
            raise self._fault(CorruptRecordError, f"part with cflag {cflag} inside a multi-part"
                              " object (expected a middle or last part)", offset)
        if not self._in_object and cflag not in (_WHOLE, _FIRST):
            raise self._fault(CorruptRecordError, f"part with cflag {cflag} outside a multi-part"
                              " object (expected a whole record or a first part)", offset)
        self._object_size = (self._object_size if self._in_object else 0) + length
        if self.max_object_size is not None and self._object_size > self.max_object_size:
            raise self._fault(RecordTooLargeError, f"object of at least {self._object_size}"
                              f" bytes exceeds max_record_size={self.max_object_size}", offset)
        self._part_start = offset
        self._cflag = cflag
        self._in_object = cflag in (_FIRST, _MIDDLE)
        self._remaining = length
        self._pad = -length & 3
        if not length:
            self._end_part(out)

    def _end_part(self, out: list) -> None:
        if self._cflag in (_WHOLE, _LAST):
            out.append(None)
            self.objects += 1
        self._cflag = None

    def finish(self) -> None:
        if self._header or self._remaining or self._in_object or self._cflag is not None:
            raise self._fault(TruncatedStreamError, "the stream ends inside a wrapped record",
                              self._part_start)
        # Trailing padding cut short is harmless: every object was delivered whole.


# -- augmented manifests ----------------------------------------------------------------------
class ManifestGroupFramer:
    """Frames RecordIO-wrapped attribute records and makes every ``attributes`` consecutive ones
    (one JSON line of an augmented manifest) a single record: for each attribute in order, a u64
    little-endian length and its bytes. A stream that ends inside a line raises
    :class:`~streamio.TruncatedStreamError` after the whole lines before it."""

    def __init__(self, *, attributes: int, on_error: str, max_record_size: int,
                 source: str) -> None:
        if isinstance(attributes, bool) or not isinstance(attributes, int) or attributes < 1:
            raise UsageError(f"attributes must be a positive int, not {attributes!r}")
        self.attributes = attributes
        self._inner = RecordIOFramer(multipart="concat", on_error=on_error,
                                     max_record_size=max_record_size, source=source)
        self._group: list = []
        self.records = 0

    # The reader reads the inner framer's counters through these.
    @property
    def skipped_records(self) -> int:
        return self._inner.skipped_records

    @property
    def skipped_bytes(self) -> int:
        return self._inner.skipped_bytes

    @property
    def offset(self) -> int:
        return self._inner.offset

    def _group_records(self, parts: list) -> list:
        out = []
        for part in parts:
            self._group.append(part)
            if len(self._group) == self.attributes:
                out.append(b"".join(_LENGTH.pack(len(p)) + p for p in self._group))
                self._group = []
        self.records += len(out)
        return out

    def feed(self, chunk) -> list:
        return self._group_records(self._inner.feed(chunk))

    def finish(self) -> list:
        out = self._group_records(self._inner.finish())
        if self._group:
            got = len(self._group)
            self._group = []
            raise TruncatedStreamError(
                f"augmented manifest line cut short: {got} of {self.attributes} attribute"
                " records", source=self._inner.source, offset=self._inner.offset,
                record_index=self.records)
        return out


def split_manifest_record(record: bytes) -> list:
    """The attribute payloads of one ``"sagemaker-manifest"`` record, in attribute order
    (a :class:`~streamio.DecodeError` if it was not made by the manifest framer)."""
    parts = []
    pos, end = 0, len(record)
    while pos < end:
        if end - pos < _LENGTH.size:
            raise DecodeError("truncated manifest record")
        (n,) = _LENGTH.unpack_from(record, pos)
        pos += _LENGTH.size
        if n > end - pos:
            raise DecodeError("truncated manifest record")
        parts.append(record[pos:pos + n])
        pos += n
    return parts


class ManifestAttributes:
    """``record -> {attribute name: bytes}`` for a ``"sagemaker-manifest"`` record: what an
    augmented-manifest channel read without a decoder yields (a :meth:`Dataset.map`)."""

    def __init__(self, names: tuple) -> None:
        self.names = tuple(names)

    def __call__(self, record: bytes) -> dict:
        parts = split_manifest_record(record)
        if len(parts) != len(self.names):
            raise DecodeError(f"{len(parts)} attributes where {len(self.names)} were expected")
        return dict(zip(self.names, parts))

    def __repr__(self) -> str:
        return f"ManifestAttributes({self.names!r})"


__all__ = ["ManifestAttributes", "ManifestGroupFramer", "RecordIOUnwrapper",
           "split_manifest_record"]

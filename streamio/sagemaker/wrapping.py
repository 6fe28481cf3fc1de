"""SageMaker's RecordIO wrapping, undone as the bytes stream past: the I/O side.

With ``RecordWrapperType: RecordIO`` SageMaker wraps each S3 object (or each attribute of each
augmented-manifest line) in one RecordIO record before it enters the FIFO. The sans-IO
:class:`~streamio.formats.sagemaker_wrapping.RecordIOUnwrapper` turns the wrapped bytes into the
objects' bytes piece by piece, never holding a whole object; :class:`UnwrappedSource` applies it
to an open source, and :class:`WrappedPipeChannel` to each epoch's FIFO. The inner format is then
framed as usual. Augmented manifests are framed by ``ManifestGroupFramer`` (format
``"sagemaker-manifest"``) and taken apart by ``split_manifest_record`` and
:class:`~streamio.sagemaker.AugmentedManifest`. The byte layout and those framers live in
``streamio/formats/sagemaker_wrapping.py``.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

# The sans-IO parts live with the other framers (and register their formats there); they are
# re-exported here, where they were first importable from.
from ..formats.sagemaker_wrapping import (ManifestAttributes, ManifestGroupFramer,
                                          RecordIOUnwrapper, split_manifest_record)
from ..sources import ByteSource, PipeChannel
from ..sources.local import FileSource


class UnwrappedSource(ByteSource):
    """The objects' bytes inside a RecordIO-wrapped source, read without holding an object.

    ``separator``: bytes appended to an object that does not already end with them (``b"\\n"``
    for line formats, so the last row of one object never runs into the first of the next, as
    reading the objects as files would keep them apart). Errors in the wrapping are
    :class:`~streamio.FormatError`s naming the source and the offset in the wrapped stream.
    """

    def __init__(self, inner: ByteSource, *, separator: bytes = b"",
                 max_object_size: Optional[int] = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.separator = separator
        self._unwrapper = RecordIOUnwrapper(source=inner.name, max_object_size=max_object_size)
        self._pending: deque = deque()  # pieces ready to hand out, in order
        self._held = memoryview(b"")
        self._last = b""  # the end of the object being passed on (for the separator)
        self._buf = bytearray(1 << 20)
        self._eof = False

    def readinto(self, buf: memoryview) -> int:
        while not self._held:
            if self._pending:
                self._held = memoryview(self._pending.popleft())
                continue
            if self._eof:
                return 0
            n = self.inner.readinto(memoryview(self._buf))
            if n == 0:
                self._eof = True
                self._unwrapper.finish()
                continue
            for piece in self._unwrapper.feed(memoryview(self._buf)[:n]):
                if piece is None:
                    if self.separator and not self._last.endswith(self.separator):
                        self._pending.append(self.separator)
                    self._last = b""
                elif piece:
                    self._pending.append(piece)
                    self._last = piece[-len(self.separator):] if self.separator else b""
        n = min(len(buf), len(self._held))
        buf[:n] = self._held[:n]
        self._held = self._held[n:]
        return n

    def close(self) -> None:
        self.inner.close()
        super().close()


class WrappedPipeChannel(PipeChannel):
    """A Pipe-mode channel whose FIFOs carry RecordIO-wrapped objects: each open unwraps."""

    def __init__(self, path_prefix: str, *, separator: bytes = b"", **kwargs) -> None:
        super().__init__(path_prefix, **kwargs)
        self.separator = separator

    def open(self, **timeouts) -> UnwrappedSource:  # type: ignore[override]
        inner: FileSource = super().open(**timeouts)
        return UnwrappedSource(inner, separator=self.separator)



__all__ = ["ManifestAttributes", "ManifestGroupFramer", "RecordIOUnwrapper", "UnwrappedSource",
           "WrappedPipeChannel", "split_manifest_record"]

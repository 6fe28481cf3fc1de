"""Format ``"object"``: a whole stream is one record (an image file in a SageMaker File-mode
channel, say, or one object of a RecordIO-wrapped Pipe-mode channel)."""

from __future__ import annotations

from ..errors import RecordTooLargeError


class WholeObjectFramer:
    """Format ``"object"``: the whole stream is one record (an image file, say); bounded by
    ``max_record_size``, checked as bytes arrive. An empty stream is no record."""

    def __init__(self, *, max_record_size: int, source: str) -> None:
        self.max_record_size = max_record_size
        self.source = source
        self._buf = bytearray()
        self.records = self.skipped_records = self.skipped_bytes = 0
        self.offset = 0

    def feed(self, chunk) -> list:
        if len(self._buf) + len(chunk) > self.max_record_size:
            raise RecordTooLargeError(
                f"object exceeds max_record_size={self.max_record_size}", source=self.source,
                offset=0, record_index=0)
        self._buf += chunk
        self.offset += len(chunk)
        return []

    def finish(self) -> list:
        if not self._buf:
            return []
        self.records = 1
        out, self._buf = bytes(self._buf), bytearray()
        return [out]


__all__ = ["WholeObjectFramer"]

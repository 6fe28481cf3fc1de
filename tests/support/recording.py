"""A binary file object that notes the size of each read asked of it: a real source (users
pass file objects) through which a test sees the reads a reader makes."""

from __future__ import annotations

import io


class RecordingStream(io.RawIOBase):
    """A readable binary stream over ``data``; ``sizes``: the size of every read asked of it."""

    def __init__(self, data: bytes, name: str = "recording") -> None:
        self._data = io.BytesIO(data)
        self.name = name
        self.sizes: list = []

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.sizes.append(len(buffer))
        return self._data.readinto(buffer)

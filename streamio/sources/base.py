"""What every source is: something that fills a buffer, never seeks, and says who it is."""

from __future__ import annotations

import logging
from typing import Optional

# How long a source waits before it says so (docs/sources-and-formats.md names them here): the
# one policy of every wait, streamio._util.WaitLog.
from .._util import WAIT_LOG_AFTER_S, WAIT_LOG_INTERVAL_S  # noqa: F401 (set in _util)
from ..errors import UsageError, UsageTypeError

logger = logging.getLogger("streamio")


class ByteSource:
    """A readable stream of bytes.

    ``readinto(buf)`` fills a prefix of ``buf`` and returns how many bytes it wrote (0 at the end
    of the stream). Implementations raise :class:`~streamio.errors.SourceError` for I/O faults.
    """

    name: str = "<stream>"
    closed: bool = False

    def readinto(self, buf: memoryview) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "ByteSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def check_timeout(name: str, value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageTypeError(f"{name} must be a number of seconds or None, not {type(value).__name__}")
    if value <= 0:
        raise UsageError(f"{name} must be positive, not {value}")
    return float(value)

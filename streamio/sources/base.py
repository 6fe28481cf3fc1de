"""What every source is: something that fills a buffer, never seeks, and says who it is."""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Optional

from ..errors import UsageError, UsageTypeError

#: A source that has kept a reader waiting this long says so (logger ``streamio``, WARNING), and
#: again every ``WAIT_LOG_INTERVAL_S``: a FIFO no writer has opened, or a Pipe mode epoch that
#: never comes, would otherwise wait in silence (forever, by default, for a FIFO).
WAIT_LOG_AFTER_S = 5.0
WAIT_LOG_INTERVAL_S = 30.0

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


class WaitLog:
    """Logs a wait that has lasted ``WAIT_LOG_AFTER_S``, then every ``WAIT_LOG_INTERVAL_S``.

    ``describe(waited_s)`` says what is waited for and what would end the wait. A waiting loop
    sleeps until :attr:`due` at the latest (its own deadline may come first), then calls
    :meth:`tick`.
    """

    def __init__(self, describe: Callable[[float], str]) -> None:
        self.describe = describe
        self.start = time.monotonic()
        self.due = self.start + WAIT_LOG_AFTER_S

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.due:
            logger.warning("%s", self.describe(now - self.start))
            self.due = now + WAIT_LOG_INTERVAL_S


def timeout_words(option: str, timeout: Optional[float]) -> str:
    """What ends a wait: ``"open_timeout=300 s ends it"``, or how to bound one that has none."""
    if timeout is None or not math.isfinite(timeout):
        return f"nothing ends it (no {option}): pass {option}= (--{option.replace('_', '-')})"
    return f"{option}={timeout:g} s ends it"

"""Shared machinery of the framers: counters, the error policy and the pending-error rule.

A framer is sans-IO: the caller feeds bytes and gets records back. Faults follow one rule: every
whole record before a fault is returned first, and the fault is raised on the *next* call to
``feed``/``finish`` (and again on every later call), so no good record is lost and a consumer that
retries sees the same error.
"""

from __future__ import annotations

import warnings
from typing import Literal, Optional

from ..errors import FormatError, StreamioWarning
from ..errors import UsageError, UsageTypeError

OnError = Literal["raise", "skip", "warn"]
ON_ERROR_CHOICES = ("raise", "skip", "warn")

# 256 MiB: far above any sane training record (TFRecord shards use ~100 KB-10 MB records, and
# MXNet RecordIO caps a part at 512 MiB), yet small enough that a corrupted length field cannot make
# us try to buffer gigabytes. It is checked before anything is allocated.
DEFAULT_MAX_RECORD_SIZE = 256 * 1024 * 1024


def check_common(on_error: str, max_record_size: int) -> None:
    if on_error not in ON_ERROR_CHOICES:
        raise UsageError(f"on_error must be one of {ON_ERROR_CHOICES}, not {on_error!r}")
    if isinstance(max_record_size, bool) or not isinstance(max_record_size, int):
        raise UsageTypeError(f"max_record_size must be an int, not {type(max_record_size).__name__}")
    if max_record_size <= 0:
        raise UsageError(f"max_record_size must be positive, not {max_record_size}")


class FramerBase:
    """Counters and error policy common to all framers."""

    def __init__(self, *, on_error: OnError, max_record_size: int, source: Optional[str]) -> None:
        check_common(on_error, max_record_size)
        self.on_error = on_error
        self.max_record_size = max_record_size
        self.source = source if source is not None else "<stream>"
        self.records = 0  # records delivered
        self.skipped_records = 0  # damaged records dropped under on_error="skip"/"warn"
        self.skipped_bytes = 0
        self._error: Optional[FormatError] = None

    @property
    def pending_error(self) -> Optional[FormatError]:
        """The fault met after the records last returned (raised by the next call), or None:
        a caller that will not call again after :meth:`finish` raises it itself."""
        return self._error

    @property
    def record_index(self) -> int:
        """Index of the next record in the stream, counting delivered and skipped records."""
        return self.records + self.skipped_records

    # -- reading straight into a frame (asyncio's BufferedProtocol, without the I/O) ------------
    def rest_buffer(self) -> Optional[memoryview]:
        """A writable view the caller may read the stream's next bytes into, instead of passing
        them to :meth:`feed`, then call :meth:`rest_filled`; None: feed chunks as usual.

        Length-prefixed framers offer the unread rest of a large frame whose header they hold,
        so its bytes go from the source to their place once. Feeding chunks instead stays valid.
        """
        return None

    def rest_filled(self, nbytes: int) -> list:
        """``nbytes`` were written at the start of the last :meth:`rest_buffer`; the records
        this completes (as :meth:`feed` returns them)."""
        raise UsageError("rest_filled() without a rest_buffer() to fill")

    def _raise_pending(self) -> None:
        if self._error is not None:
            # Re-raise the same fault every time: a caller that asks again hears the same answer.
            raise self._error

    def _fault(self, cls: type[FormatError], message: str, offset: int) -> FormatError:
        return cls(message, source=self.source, offset=offset, record_index=self.record_index)

    def _skip(self, err: FormatError, nbytes: int, nrecords: int = 1) -> None:
        """Account for damaged bytes dropped under on_error="skip"/"warn"."""
        self.skipped_records += nrecords
        self.skipped_bytes += nbytes
        if self.on_error == "warn":
            warnings.warn(f"skipped {nbytes} bytes: {err}", StreamioWarning, stacklevel=4)

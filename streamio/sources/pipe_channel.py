"""SageMaker Pipe mode channels: one FIFO per epoch.

SageMaker streams channel ``train`` to ``/opt/ml/input/data/train_0`` for the first epoch,
``train_1`` for the second, and so on; each FIFO appears when its epoch starts and is closed by the
writer at the end of the epoch. A :class:`PipeChannel` is a source whose every open takes the
next epoch's FIFO.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Optional

from .._util import WaitLog, timeout_words
from ..errors import SourceError
from ..errors import UsageError
from .base import check_timeout
from .local import FileSource

#: How long to wait for the next epoch's FIFO to appear and its first bytes to arrive. SageMaker
#: creates it when the training job asks for the next epoch, usually within seconds; five minutes
#: leaves room for slow starts without hanging forever.
DEFAULT_OPEN_TIMEOUT = 300.0
#: A writer silent this long is taken for dead (SageMaker streams continuously once started).
DEFAULT_READ_TIMEOUT = 120.0
SAGEMAKER_INPUT_ROOT = "/opt/ml/input/data"
_APPEAR_POLL_S = 0.01  # how often to look for the FIFO while waiting for it to appear


class PipeChannel:
    """A SageMaker-style Pipe mode channel: ``<path_prefix>_<epoch>``, one FIFO per epoch.

    ``open()`` (called by the readers; each ``iter()`` of a Dataset is one open) waits up to
    ``open_timeout`` for the next FIFO and its first data, then reads it with ``read_timeout``
    between chunks. Closing early (leaving the loop) is allowed: the next open takes the next epoch.
    """

    def __init__(self, path_prefix: str, *, start_epoch: int = 0,
                 open_timeout: Optional[float] = DEFAULT_OPEN_TIMEOUT,
                 read_timeout: Optional[float] = DEFAULT_READ_TIMEOUT) -> None:
        if isinstance(start_epoch, bool) or not isinstance(start_epoch, int) or start_epoch < 0:
            raise UsageError(f"start_epoch must be a non-negative int, not {start_epoch!r}")
        self.path_prefix = os.fspath(path_prefix)
        self.epoch = start_epoch  # the epoch the next open() reads
        self.open_timeout = check_timeout("open_timeout", open_timeout)
        self.read_timeout = check_timeout("read_timeout", read_timeout)

    @classmethod
    def sagemaker(cls, channel: str, *, root: str = SAGEMAKER_INPUT_ROOT, **kwargs) -> "PipeChannel":
        """The channel SageMaker Pipe mode serves as ``<root>/<channel>_<epoch>``."""
        return cls(os.path.join(root, channel), **kwargs)

    def path(self, epoch: int) -> str:
        return f"{self.path_prefix}_{epoch}"

    @property
    def name(self) -> str:
        return self.path(self.epoch)

    def open(self, *, open_timeout: Optional[float] = None,
             read_timeout: Optional[float] = None) -> FileSource:
        """Open the next epoch's FIFO (waiting for it to appear) and move to the epoch after.

        ``open_timeout``/``read_timeout`` given here (a reader's options) override the channel's
        for this epoch.
        """
        open_timeout = check_timeout("open_timeout", open_timeout)
        if open_timeout is None:
            open_timeout = self.open_timeout
        read_timeout = check_timeout("read_timeout", read_timeout)
        if read_timeout is None:
            read_timeout = self.read_timeout
        path = self.path(self.epoch)
        deadline = None
        if open_timeout is not None and math.isfinite(open_timeout):
            deadline = time.monotonic() + open_timeout
        epoch = self.epoch
        log = WaitLog(lambda waited: (
            f"{path}: waiting for the FIFO of epoch {epoch} to appear (the Pipe mode writer has"
            f" not created it yet), for {waited:.0f} s so far;"
            f" {timeout_words('open_timeout', open_timeout)}"))
        while not os.path.exists(path):
            log.tick()
            if deadline is not None and time.monotonic() >= deadline:
                raise SourceError(
                    f"the FIFO of epoch {self.epoch} did not appear within {open_timeout:g} s:"
                    f" the writer may have served fewer epochs than this reader asked for"
                    f" (`streamio sagemaker-local` and `serve-pipe` serve --epochs, 1 by"
                    f" default)", source=path)
            time.sleep(_APPEAR_POLL_S)
        # The time left, or "forever": FileSource would take None to mean read_timeout.
        remaining = math.inf if deadline is None else max(0.001, deadline - time.monotonic())
        source = FileSource(path, open_timeout=remaining, read_timeout=read_timeout)
        self.epoch += 1
        return source

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path_prefix!r}{_timeouts(self)}, next epoch {self.epoch})"


def _timeouts(channel: Any) -> str:
    """The channel's timeouts, as its arguments (the ones set)."""
    return "".join(f", {name}={getattr(channel, name)!r}" for name in ("open_timeout",
                   "read_timeout") if getattr(channel, name, None) is not None)

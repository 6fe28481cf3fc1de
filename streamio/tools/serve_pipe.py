"""``streamio serve-pipe``: emulate SageMaker Pipe mode, one FIFO per epoch fed from files.

The FIFO writer's open (wait for a reader, within a timeout) is shared with the SageMaker
emulator (:mod:`streamio.sagemaker.emulator`).
"""

from __future__ import annotations

import os
import stat
import time
from typing import Sequence

from ..errors import SourceError

#: The size of each read from a served file (and so of each write into the FIFO).
SERVE_CHUNK = 1024 * 1024


def open_fifo_writer(fifo: str, timeout: float) -> int:
    """Open ``fifo`` for writing once a reader has it open, within ``timeout`` seconds (a
    :class:`SourceError` otherwise; an open error is one too)."""
    # O_WRONLY|O_NONBLOCK fails with ENXIO until a reader has the FIFO open: poll, so a reader
    # that never comes ends in an error instead of a hang.
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != 6:  # ENXIO: no reader yet
                raise SourceError(f"cannot open for writing: {exc.strerror}", source=fifo) from exc
            if time.monotonic() > deadline:
                raise SourceError(f"no reader opened the pipe within {timeout:g} s",
                                  source=fifo) from None
            time.sleep(0.005)
            continue
        os.set_blocking(fd, True)
        return fd


def serve_pipe(channel: str, epochs: int, files: Sequence[str], *, start_epoch: int = 0,
               open_timeout: float = 300.0, log=None) -> None:
    """Emulate SageMaker Pipe mode: for each epoch create ``<channel>_<epoch>`` as a FIFO, stream
    the files into it (concatenated, as SageMaker does), close it and remove it.

    Opening the FIFO for writing waits for the reader; ``open_timeout`` bounds that wait.
    """
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"not a file: {path}")
    directory = os.path.dirname(os.path.abspath(channel))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot create the FIFOs {channel}_<epoch>: directory {directory}"
                                " does not exist")
    for epoch in range(start_epoch, start_epoch + epochs):
        fifo = f"{channel}_{epoch}"
        if os.path.exists(fifo):
            if not stat.S_ISFIFO(os.stat(fifo).st_mode):
                raise FileExistsError(f"{fifo} exists and is not a FIFO")
        else:
            os.mkfifo(fifo)
        try:
            fd = open_fifo_writer(fifo, open_timeout)
            sent = 0
            try:
                for path in files:
                    with open(path, "rb", buffering=0) as f:
                        while True:
                            block = f.read(SERVE_CHUNK)
                            if not block:
                                break
                            view = memoryview(block)
                            while view:
                                n = os.write(fd, view)
                                view = view[n:]
                                sent += n
            except BrokenPipeError:
                if log:
                    print(f"epoch {epoch}: reader closed {fifo} early after {sent} bytes", file=log)
            finally:
                os.close(fd)
            if log:
                print(f"epoch {epoch}: served {sent} bytes on {fifo}", file=log)
        finally:
            try:
                os.unlink(fifo)
            except FileNotFoundError:
                pass

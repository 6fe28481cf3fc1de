"""Measuring one case: a FIFO fed by a writer process, and the process's peak memory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from .config import Measurement


# -- measuring --------------------------------------------------------------------------------------
def reset_peak_rss() -> None:
    # Linux: writing 5 to clear_refs resets the VmHWM high-water mark, so each measurement gets
    # its own peak in one long-lived process.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _status_mib(field: str) -> Optional[float]:
    """A memory figure of this process from /proc/self/status (``VmHWM``, ``VmRSS``), in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> Optional[float]:
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except (ImportError, OSError):  # pragma: no cover - not Unix
        return None


def rss_mib() -> Optional[float]:
    return _status_mib("VmRSS")


# The writer process: says "ready", opens the FIFO (blocking until the reader opens it), writes
# the whole file (sendfile where the kernel allows it), and exits quietly if the reader leaves.
_WRITER = r"""
import os, sys
src, fifo = sys.argv[1], sys.argv[2]
sys.stdout.write("ready\n"); sys.stdout.flush()
try:
    out = os.open(fifo, os.O_WRONLY)
    with open(src, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        try:
            while offset < size:
                n = os.sendfile(out, f.fileno(), offset, min(size - offset, 1 << 24))
                if n == 0:
                    break
                offset += n
        except OSError as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            while offset < size:  # no sendfile here: plain reads and writes
                view = memoryview(os.pread(f.fileno(), 1 << 20, offset))
                offset += len(view)
                while view:
                    view = view[os.write(out, view):]
    os.close(out)
except BrokenPipeError:
    pass
"""


class FifoFeed:
    """A fresh FIFO in ``tmpdir`` with a writer process ready to stream ``src`` into it."""

    def __init__(self, src: str, tmpdir: str) -> None:
        fd, path = tempfile.mkstemp(prefix="fifo-", dir=tmpdir)
        os.close(fd)
        os.unlink(path)
        os.mkfifo(path)
        self.path = path
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, src, path],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read().decode(errors="replace")
            raise RuntimeError(f"FIFO writer failed to start: {err}")

    def close(self, timeout: float = 60.0) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def unblock(self) -> None:
        """Open and close the read end, so a writer still waiting in open() can finish."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass


def measure_here(consume: Callable[[str], int], path: str, nbytes: int,
                  fifo_src: Optional[str], tmpdir: str) -> Measurement:
    """Time ``consume(path)`` (-> records) in this process; through a fresh FIFO if ``fifo_src``."""
    feed = FifoFeed(fifo_src, tmpdir) if fifo_src else None
    target = feed.path if feed else path
    try:
        reset_peak_rss()
        t0 = time.perf_counter()
        records = consume(target)
        seconds = time.perf_counter() - t0
        peak = peak_rss_mib()
    except BaseException:
        if feed:
            feed.unblock()
        raise
    finally:
        if feed:
            feed.close()
    return Measurement(records, seconds, nbytes, peak)

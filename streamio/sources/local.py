"""Local byte sources: regular files, named pipes (FIFOs), stdin, file objects and bytes."""

from __future__ import annotations

import math
import os
import select
import stat
import sys
import time
from typing import Optional

from .._util import WaitLog, timeout_words
from ..errors import SourceError
from ..errors import UsageTypeError
from .base import ByteSource

try:
    import fcntl

    # F_SETPIPE_SZ is in fcntl since Python 3.10; the number is Linux's.
    F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
    F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
except ImportError:  # pragma: no cover - not Linux
    fcntl = None

#: A larger pipe buffer lets the writer run ahead while we parse, and means fewer, larger reads
#: (fewer context switches): several times the throughput of the default 64 KiB on this machine.
DEFAULT_PIPE_BUFFER = 4 * 1024 * 1024


def _pipe_max() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size", "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 1024 * 1024


def enlarge_pipe(fd: int, want: int = DEFAULT_PIPE_BUFFER) -> Optional[int]:
    """Grow a pipe's kernel buffer towards ``want`` (capped by pipe-max-size); returns the size."""
    if fcntl is None:
        return None
    size = want if os.geteuid() == 0 else min(want, _pipe_max())
    for attempt in (size, _pipe_max()):
        try:
            return fcntl.fcntl(fd, F_SETPIPE_SZ, attempt)
        except OSError:
            continue
    try:
        return fcntl.fcntl(fd, F_GETPIPE_SZ)
    except OSError:
        return None


class _PolledReads(ByteSource):
    """Reads of a pipe, FIFO, socket or terminal fd, each after ``poll``, so no wait is unbounded.

    The first data must come within ``open_timeout`` (for a FIFO: a writer must connect and
    write), each later read within ``read_timeout``; ``None`` (or ``math.inf``) waits as long as
    it takes, like ``cat``. Poll tells the cases apart on Linux: a FIFO opened non-blocking with
    no writer yet polls as *not ready* (no POLLHUP until a writer has come and gone), so a
    writer that connects late is waited for; a writer that closed gives POLLHUP and a 0-byte
    read, the end of the stream.
    """

    _fd: int

    def _init_polling(self, open_timeout: Optional[float], read_timeout: Optional[float]) -> None:
        self.open_timeout = open_timeout
        self.read_timeout = read_timeout
        self._first = True
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN | select.POLLPRI)

    # A non-blocking fd (a FIFO we opened) is read first and polled only when it has nothing:
    # one system call per read instead of two while the writer keeps ahead. Not before the
    # first data: a FIFO with no writer yet reads as end of stream.
    _try_before_poll = False

    def _polled_read(self, buf: memoryview) -> int:
        if self._try_before_poll and not self._first:
            try:
                return os.readv(self._fd, [buf])
            except BlockingIOError:
                pass
            except OSError as exc:
                raise SourceError(f"read failed: {exc.strerror}", source=self.name) from exc
        timeout = self.open_timeout if self._first else self.read_timeout
        deadline = None
        if timeout is not None and math.isfinite(timeout):
            deadline = time.monotonic() + timeout
        log = WaitLog(lambda waited: self._waiting(waited, timeout))
        while True:
            until = log.due if deadline is None else min(deadline, log.due)
            wait_ms = max(0, math.ceil((until - time.monotonic()) * 1000))
            ready = self._poll.poll(wait_ms)  # PEP 475: EINTR is retried with the time left
            if not ready and deadline is not None and time.monotonic() >= deadline:
                what = ("no writer connected and sent data" if self._first
                        else "the writer went silent")
                raise SourceError(f"{what} for {timeout:g} s (timeout)", source=self.name)
            if not ready:
                log.tick()
                continue
            try:
                n = os.readv(self._fd, [buf])
            except BlockingIOError:
                continue  # woken without data (another reader took it); wait again
            except OSError as exc:
                raise SourceError(f"read failed: {exc.strerror}", source=self.name) from exc
            self._first = False
            return n

    def _waiting(self, waited: float, timeout: Optional[float]) -> str:
        if self._first:
            what = ("its first data: no writer has opened it yet (or none has written)"
                    if self.name != "<stdin>" else "its first data: nothing has been written")
            ends = timeout_words("open_timeout", timeout)
        else:
            what = "more data: the writer has sent nothing since its last data"
            ends = timeout_words("read_timeout", timeout)
        return f"{self.name}: waiting for {what}, for {waited:.0f} s so far; {ends}"


class FileSource(_PolledReads):
    """A path: a regular file, or a named pipe read without ever seeking.

    A FIFO is opened non-blocking (so opening never hangs, whether or not a writer exists) and
    read after ``poll``: a writer must connect and send its first data within ``open_timeout``,
    and each later read must come within ``read_timeout``. ``open_timeout=None`` takes
    ``read_timeout``'s value (so ``read_timeout`` alone bounds every wait); both None (or
    ``math.inf``): wait as long as it takes, like ``cat``. Regular files never wait.
    """

    def __init__(self, path: str, *, read_timeout: Optional[float] = None,
                 open_timeout: Optional[float] = None,
                 pipe_buffer: int = DEFAULT_PIPE_BUFFER) -> None:
        self.name = os.fspath(path)
        self.pipe_size: Optional[int] = None
        try:
            self._is_fifo = stat.S_ISFIFO(os.stat(self.name).st_mode)
            flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
            if self._is_fifo:
                flags |= os.O_NONBLOCK
            self._fd = os.open(self.name, flags)
        except OSError as exc:
            raise SourceError(f"cannot open: {exc.strerror}", source=self.name) from exc
        self._init_polling(read_timeout if open_timeout is None else open_timeout, read_timeout)
        if self._is_fifo:
            self.pipe_size = enlarge_pipe(self._fd, pipe_buffer)
            self._try_before_poll = True  # opened O_NONBLOCK above

    @property
    def is_fifo(self) -> bool:
        return self._is_fifo

    def readinto(self, buf: memoryview) -> int:
        if self.closed:
            raise SourceError("read from a closed source", source=self.name)
        if self._is_fifo:
            return self._polled_read(buf)
        try:
            return os.readv(self._fd, [buf])
        except OSError as exc:
            raise SourceError(f"read failed: {exc.strerror}", source=self.name) from exc

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                os.close(self._fd)
            except OSError:  # pragma: no cover
                pass


class PolledStdin(_PolledReads):
    """stdin when it is a pipe, socket or terminal and a timeout is asked for.

    stdin's file status flags are shared with whoever else holds it (the shell's terminal), so
    it stays blocking: after ``poll`` says it is readable, one ``read`` returns what is there
    without blocking. We never close fd 0.
    """

    def __init__(self, *, open_timeout: Optional[float] = None,
                 read_timeout: Optional[float] = None) -> None:
        self.name = "<stdin>"
        self._fd = sys.stdin.fileno()
        self._init_polling(read_timeout if open_timeout is None else open_timeout, read_timeout)

    def readinto(self, buf: memoryview) -> int:
        if self.closed:
            raise SourceError("read from a closed source", source=self.name)
        return self._polled_read(buf)


class StreamSource(ByteSource):
    """A binary file object (need not be seekable), or stdin. We never close what we did not open."""

    def __init__(self, fileobj, *, name: Optional[str] = None, owned: bool = False) -> None:
        self._f = fileobj
        self.name = name or getattr(fileobj, "name", None) or f"<{type(fileobj).__name__}>"
        if not isinstance(self.name, str):
            self.name = f"<fd {self.name}>"
        self._owned = owned
        self._readinto = getattr(fileobj, "readinto", None)
        if not callable(getattr(fileobj, "read", None)) and self._readinto is None:
            raise UsageTypeError(f"{type(fileobj).__name__} is not a readable binary file object")

    def readinto(self, buf: memoryview) -> int:
        try:
            if self._readinto is not None:
                n = self._readinto(buf)
                if n is None:  # a non-blocking raw stream with nothing yet
                    raise SourceError("non-blocking file object has no data", source=self.name)
                return n
            data = self._f.read(len(buf))
        except SourceError:
            raise
        except (OSError, ValueError) as exc:
            raise SourceError(f"read failed: {exc}", source=self.name) from exc
        if isinstance(data, str):
            raise SourceError("file object is in text mode; open it with 'rb'", source=self.name)
        n = len(data)
        buf[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._owned:
                self._f.close()


def stdin_source(*, open_timeout: Optional[float] = None,
                 read_timeout: Optional[float] = None) -> ByteSource:
    """stdin as raw bytes, read in large unbuffered pieces.

    When stdin is a pipe, FIFO, socket or terminal (something that can keep us waiting), reads
    are polled (:class:`PolledStdin`): bounded by the timeouts, and a long wait is logged even
    without them; a regular file never waits.
    """
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError) as exc:
        if open_timeout is not None or read_timeout is not None:
            raise SourceError(f"cannot use stdin: {exc}", source="<stdin>") from exc
        mode = 0  # as before: the open below says what is wrong with it
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode):
        return PolledStdin(open_timeout=open_timeout, read_timeout=read_timeout)
    raw = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    return StreamSource(raw, name="<stdin>", owned=True)


class BytesSource(ByteSource):
    """In-memory bytes, handed out without copying the whole thing again."""

    def __init__(self, data, *, name: str = "<bytes>") -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0
        self.name = name

    def readinto(self, buf: memoryview) -> int:
        n = min(len(buf), len(self._view) - self._pos)
        buf[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


__all__ = ["BytesSource", "DEFAULT_PIPE_BUFFER", "FileSource", "PolledStdin", "StreamSource",
           "enlarge_pipe", "stdin_source"]

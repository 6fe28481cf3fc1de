"""Sources bound to the main process, read by DataLoader workers: stdin, file objects, ByteSources.

A DataLoader worker is another process. A path or URL it opens itself; three kinds of source it
can only inherit from the main process:

* **stdin** (``"-"``): multiprocessing points a child's ``sys.stdin`` at ``/dev/null``, so a
  worker reading ``sys.stdin`` got an empty stream and the epoch ended "finished" with no
  records. The main process's descriptor 0 is still open in every worker (forked, spawned or
  from the forkserver: each inherits descriptors 0-2), so the worker that reads the stream
  (worker 0, which deals it to the others through :mod:`streamio.sharing`, or the only worker)
  checks that its descriptor 0 is the main process's stdin (same device and inode) and points
  ``sys.stdin`` back at it. ``cat data/*.tfrecord | python train.py`` then reads every record
  once, however many workers.
* **a file object or an opened ByteSource**: a forked worker gets a copy that shares the
  main process's descriptor (one worker reads it, as above); a spawned one gets a pickled copy,
  and an object that cannot be pickled (an open file, a socket) is refused with a
  :class:`~streamio.errors.UsageError` naming the fix when the workers start.

A stream is read once. Without workers the reader refuses a second pass over stdin or a file
object; under workers every epoch starts from a fresh copy of the main process's objects, so
that memory is shared here: the worker that reads such a source marks it (in a small
shared-memory array, like the epoch counter), and a later epoch (in workers or in the main
process) that would read it again raises a ``UsageError`` instead of delivering an empty or
repeated epoch.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
from typing import Any, Iterator, Optional, Sequence

from ..errors import UsageError
from ..sources import ByteSource, PipeChannel, source_name

__all__ = ["BoundSources", "is_bound"]

# The shared mark of a bound source: 0 not read yet, else (epoch << 2) | who read it.
_MAIN, _WORKER = 1, 2


def is_bound(source: Any) -> bool:
    """Whether only the process that holds ``source`` can read it: stdin, a file object, an
    opened ByteSource (paths, URLs, bytes and PipeChannels are opened by name anywhere)."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source) == "-"
    return not isinstance(source, (bytes, bytearray, memoryview, PipeChannel))


def _identity(fd: int) -> Optional[tuple]:
    try:
        st = os.fstat(fd)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def _main_stdin() -> Optional[tuple]:
    """What the main process's stdin is (device, inode), or None where it has none."""
    try:
        return _identity(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return None


class BoundSources:
    """The bound sources of a Dataset (made in the main process, shared with its workers)."""

    def __init__(self, sources: Sequence[Any]) -> None:
        self.sources = [s for s in sources if is_bound(s)]
        self.stdin = _main_stdin() if any(isinstance(s, (str, os.PathLike))
                                          for s in self.sources) else None
        self._marks = (multiprocessing.get_context("spawn").Array("q", len(self.sources))
                       if self.sources else None)

    def _positions(self, read: Sequence[Any]) -> list:
        return [i for i, s in enumerate(self.sources) if any(r is s for r in read)]

    def check_spawn(self) -> None:
        """When pickled for a spawned worker: refuse a bound source that cannot travel (an open
        file or socket), naming the fix, rather than let the DataLoader fail with a
        ``TypeError`` from pickle."""
        for source in self.sources:
            if isinstance(source, (str, os.PathLike)):
                continue  # stdin: descriptor 0, which the worker inherits
            try:
                pickle.dumps(source)
            except Exception:  # noqa: BLE001 - whatever pickle says, the fix is the same
                raise UsageError(
                    f"{source_name(source)} is an open {_kind(source)} of the main process, which"
                    " a spawned DataLoader worker cannot receive: pass its path (a FIFO's path"
                    " is shared by the workers; '-' for stdin), or use DataLoader(num_workers=0)"
                    " or multiprocessing_context='fork'") from None

    def adopt(self, plan: Any, shared: bool, worker: int) -> tuple:
        """In DataLoader worker ``worker`` about to read ``plan`` (its Dataset; ``shared``: the
        readers share one stream, which worker 0 reads and deals): the sources it opens. If
        stdin is among them, this worker's ``sys.stdin`` becomes the main process's (checked to
        be the same file); a file object closed here is refused, naming the fix."""
        read = (plan.sources if worker == 0 else ()) if shared else plan.sources
        read = tuple(read)
        for i in self._positions(read):
            source = self.sources[i]
            if isinstance(source, (str, os.PathLike)):
                self._adopt_stdin(worker)
            elif getattr(source, "closed", False) is True:
                raise UsageError(
                    f"{source_name(source)} is closed in DataLoader worker {worker}"
                    " (multiprocessing closes sys.stdin in its children): pass '-' for stdin,"
                    " or the file's path")
        return read

    def watch(self, items: Iterator[Any], read: Sequence[Any], epoch: int,
              stats: Any) -> Iterator[Any]:
        """``items`` (a worker's epoch over ``read``), marking the bound sources among ``read``
        once the epoch shows it opened its sources (``stats.sources_opened``, at its first
        item or its end; a complete cache() opens none), and refusing one an earlier epoch
        read: such an epoch found it spent, or would repeat it."""
        if not self._positions(read):
            yield from items
            return
        marked = False
        try:
            for item in items:
                if not marked:
                    marked = True
                    if stats.sources_opened:
                        self.opened(read, epoch)
                yield item
            if not marked and stats.sources_opened:
                self.opened(read, epoch)
        except BaseException:
            if not marked and stats.sources_opened:
                self.opened(read, epoch, refuse=False)  # partly read: never again
            raise

    def opened(self, read: Sequence[Any], epoch: int, *, refuse: bool = True) -> None:
        """In a DataLoader worker whose epoch opened its sources (not one a complete
        ``cache()`` served): mark the bound ones among ``read`` read by ``epoch``, and (with
        ``refuse``) raise if an earlier epoch had read one of them: this epoch found it empty
        or would repeat it."""
        positions = self._positions(read)
        if not positions:
            return
        with self._marks.get_lock():
            if refuse:
                for i in positions:
                    self._refuse_reread(i, epoch)
            for i in positions:
                self._marks[i] = (epoch << 2) | _WORKER

    def note_main(self, read: Sequence[Any], epoch: int) -> None:
        """In the main process about to read ``read``: refuse a source that DataLoader workers
        read in an earlier epoch (the reader itself refuses its own second pass)."""
        positions = self._positions(read)
        if not positions:
            return
        with self._marks.get_lock():
            for i in positions:
                if self._marks[i] & _WORKER:
                    self._refuse_reread(i, epoch)
                self._marks[i] = (epoch << 2) | _MAIN

    def _refuse_reread(self, i: int, epoch: int) -> None:
        mark = self._marks[i]
        if not mark:
            return
        where = "in a DataLoader worker" if mark & _WORKER else "in the main process"
        raise UsageError(
            f"{source_name(self.sources[i])} was read by epoch {mark >> 2} ({where}); epoch"
            f" {epoch} cannot read it again: a stream is read once. Keep what the first epoch"
            " reads with ds.cache(directory) (or cache() in memory with"
            " DataLoader(persistent_workers=True)), or pass a path, URL or PipeChannel that"
            " can be read every epoch")

    def _adopt_stdin(self, worker: int) -> None:
        if self.stdin is None:
            return  # the main process has no stdin: the reader says so
        if _identity(0) != self.stdin:
            raise UsageError(
                f"DataLoader worker {worker} cannot read the main process's stdin: its"
                " descriptor 0 is another file (a forkserver started before stdin was"
                " redirected?); pass the FIFO's path, or use DataLoader(num_workers=0)")
        if _stdin_fd() != 0:
            # multiprocessing made the worker's sys.stdin /dev/null; descriptor 0 is the main
            # process's stdin, which this worker alone reads.
            sys.stdin = open(0, "r", closefd=False)


def _stdin_fd() -> Optional[int]:
    try:
        return sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _kind(source: Any) -> str:
    return "ByteSource" if isinstance(source, ByteSource) else "file object"

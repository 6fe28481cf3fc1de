"""Read buffers kept for the next reader: a reader's chunk buffer and its span pairs.

A :class:`~streamio.reader.RecordReader` borrows its chunk buffer here and gives it back when
its source ends, rather than making a ``bytearray(read_size)`` of its own (zero-filled: a pass
over a MiB before the first byte is read) for each source: an epoch of a mix opens a reader per
input, a job reading many small files one per file.

- :func:`lend` gives a buffer of exactly ``size`` bytes whose contents are undefined (a reader
  only ever exposes the bytes it has just read into it). A kept buffer is lent only if nothing
  still holds a view of it: a view (a ``memoryview`` of it or of a piece of it, a numpy array
  over it) pins the buffer, which is then dropped from the pool, never written.
- :func:`give_back` keeps a buffer for the next reader of that size, within :data:`POOL_BYTES`
  in all; a buffer over :data:`KEEP_MAX` bytes is not kept.

The C allocator: glibc raises its mmap threshold to the size of a large block when such a block
(allocated by mmap) is freed, and its trim threshold to twice that: later blocks of that size
come from the heap, and the heap is given back to the system only beyond the trim threshold.
A pooled buffer is never freed, so before the first buffer of a size is made the pool makes and
frees one block of that size (``bytes(size)``: calloc, untouched, so it costs neither a pass nor
page faults), leaving the thresholds where a reader's own freed buffer would. Without it a mix
of two inputs of 16 KiB records had its heap trimmed and faulted back, about 3,000 page faults
an epoch (docs/performance.md, "History from reader.py and _read_buffers.py"). Other
allocators ignore it.

Lending and giving back take a lock (once per reader, not per read; re-entrant, for a reader
that the garbage collector closes under it); a forked child starts with an empty pool and a new
lock.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

#: The most bytes the pool keeps, all sizes together (a reader's 1 MiB buffer, a mix's inputs'
#: shares, a few readers running at once in threads).
POOL_BYTES = 16 * 1024 * 1024
#: Buffers larger than this are freed, not kept (a user's very large ``read_size``).
KEEP_MAX = 8 * 1024 * 1024

# Re-entrant: a garbage collection that runs at an allocation under it may close a dropped
# reader, which gives its buffer back from the same thread (a plain Lock: a silent hang).
_lock = threading.RLock()
_free: dict = {}  # size -> [bytearray, ...]
_kept = 0  # bytes in _free
_sizes_seen: set = set()  # sizes a block of which was made and freed (see the docstring)


def lend(size: int) -> bytearray:
    """A buffer of ``size`` bytes nothing else uses (contents undefined): a kept one, else new."""
    global _kept
    with _lock:
        free = _free.get(size)
        while free:
            buf = free.pop()
            _kept -= size
            try:
                buf.append(buf.pop())  # raises BufferError while anything holds a view of it
            except BufferError:
                continue  # pinned by a view someone kept: not ours to write any more
            return buf
        first = size not in _sizes_seen
        _sizes_seen.add(size)
    if first:
        _free_one_block(size)
    return bytearray(size)


def _free_one_block(size: int) -> None:
    """Make and free one block of ``size`` bytes (see the module's docstring)."""
    block = bytes(size)  # calloc: fresh mmap pages are zero, so none is touched
    del block


def give_back(buf: bytearray) -> None:
    """Keep ``buf`` for the next :func:`lend` of its size, if there is room."""
    global _kept
    size = len(buf)
    if size > KEEP_MAX:
        return
    with _lock:
        if _kept + size > POOL_BYTES:
            return
        _free.setdefault(size, []).append(buf)
        _kept += size


@contextlib.contextmanager
def borrowed(size: int) -> Iterator[memoryview]:
    """A view of a lent buffer of ``size`` bytes for the ``with`` block; on leaving it the
    view is released and the buffer given back (lent again only once no piece of it is
    held)."""
    buf = lend(size)
    view = memoryview(buf)
    try:
        yield view
    finally:
        view.release()
        give_back(buf)


def kept_bytes() -> int:
    """Bytes the pool holds now."""
    return _kept


def clear() -> None:
    """Drop every kept buffer (they are freed once no view holds them)."""
    global _kept
    with _lock:
        _free.clear()
        _kept = 0


def _after_fork_in_child() -> None:
    global _lock, _free, _kept
    _lock = threading.RLock()
    _free = {}
    _kept = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

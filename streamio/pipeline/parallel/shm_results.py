"""Results of map processes through shared memory: numpy arrays travel out of band, and are
lent to the consumer without a copy.

A map process pickles a task's results with protocol 5 and a ``buffer_callback``: every buffer
of :data:`OUT_OF_BAND_MIN` bytes or more (a numpy array's data, a ``bytes``-like
``PickleBuffer``) is written into one of the process's *result segments*, and only the pickle of
the rest (shapes, dtypes, small values) and the buffers' offsets go through the pipe: a large
batch costs one ``memcpy`` instead of a pickle, a pipe transfer in 64 KiB pieces and an unpickle.

**Lending.** The parent rebuilds the arrays as views of the segment itself (no copy) and *lends*
the segment to the consumer: it goes back to its process for reuse only once every array of
that result is gone (a ``weakref.finalize`` on the one array all of them view). A process lends
at most :data:`LEASES` results at a time; a result past that (a consumer that keeps batches) is
copied out and its segment reused at once, so a process has at most ``LEASES`` lent segments,
plus those of its results in flight or read ahead (two) and of those being given back, whatever
the consumer keeps. A result is rebuilt only when the consumer takes it, so results read ahead
are not lent. Arrays are writable and stay valid after the stage closes (an unlinked segment
lives on while it is mapped).

**Ownership**, so that nothing is left in ``/dev/shm`` whatever happens: a child creates its
result segments (only it knows how large a result is) under names the parent chose first
(:class:`ChildResults`); the parent, at close, unlinks every segment a child may have left,
reported or not (:meth:`ParentResults.close`). **Names**: ``/dev/shm`` is shared by every user
and a name there is claimed by whoever creates it first, so every name ends in a fresh random
part (:func:`new_segment_name`), a name taken anyway is retried with fresh ones
(:func:`create_segment`), and a name someone else created is never attached or unlinked. Why
lend rather than copy out, in figures: docs/performance.md.
"""

from __future__ import annotations

import collections
import mmap
import os
import pickle
import secrets
import weakref
from multiprocessing import shared_memory
from typing import Any, Iterable, Optional

import numpy as np

from ...errors import MapError

try:  # what multiprocessing.shared_memory itself uses on POSIX
    import _posixshmem
except ImportError:  # pragma: no cover - not POSIX: results are copied out
    _posixshmem = None

__all__ = ["LEASES", "OUT_OF_BAND_MIN", "ChildResults", "ParentResults", "attach",
           "create_segment", "dump_results", "new_segment_name", "release_segment"]

#: Buffers at least this large go through shared memory; smaller ones stay in the pickle, where
#: they cost less than the bookkeeping of a span.
OUT_OF_BAND_MIN = 32 << 10
#: Spans start at multiples of this, so arrays rebuilt from them are aligned for SIMD kernels.
_ALIGN = 64
#: The smallest result segment: a few MiB of address space costs nothing until pages are written.
_MIN_CAPACITY = 1 << 20
#: Results of one map process lent to the consumer at a time (each holds one result segment);
#: results read ahead, not yet handed to the consumer, are not counted.
LEASES = 2
#: Fresh names tried when a segment's name is taken (by another user: 64 random bits each,
#: so a second collision means someone predicts our randomness, not bad luck).
CREATE_ATTEMPTS = 16


def segment_token() -> str:
    """The random part of a segment name (64 bits)."""
    return secrets.token_hex(8)


def new_segment_name(stem: str) -> str:
    """``stem`` and a fresh random part: a name nobody can create before us on purpose."""
    return f"{stem}-{segment_token()}"


def create_segment(name: str, size: int) -> shared_memory.SharedMemory:
    """Create the segment ``name`` (from :func:`new_segment_name`), or, where another process
    already holds that name, one named ``<name>-<fresh random part>`` (so whoever chose
    ``name`` can still find it: :meth:`ParentResults.close`)."""
    first = name
    for _ in range(CREATE_ATTEMPTS):
        try:
            return shared_memory.SharedMemory(name, create=True, size=size)
        except FileExistsError:
            name = new_segment_name(first)
    raise MapError(f"cannot create a shared-memory segment: {CREATE_ATTEMPTS} fresh random names"
                   f" after {first} were all taken (does another process predict them?)")


def dump_results(results: Any) -> tuple[bytes, list, list, int]:
    """``(pickle, buffers, spans, total)``: ``results`` pickled without its large buffers, the
    buffers (flat byte views), their ``(offset, length)`` in a segment and the bytes needed."""
    buffers: list = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True  # true: serialize in band
        buffers.append(raw)
        return False

    payload = pickle.dumps(results, 5, buffer_callback=out_of_band)
    spans = []
    total = 0
    for raw in buffers:
        spans.append((total, raw.nbytes))
        total += -(-raw.nbytes // _ALIGN) * _ALIGN
    return payload, buffers, spans, total


def attach(cache: dict, key: Any, name: str) -> shared_memory.SharedMemory:
    """The segment called ``name``, mapped once and kept in ``cache[key]``.

    Its owner reuses a segment for task after task and replaces it (unlinking the old one) only
    to grow it, so a new name under ``key`` means the mapped segment is stale: it is unmapped and
    ``name`` attached in its place. A map process attaches its input slots so (the parent
    maps result segments by name, lends them, and keeps every mapping: see ParentResults).
    """
    segment = cache.get(key)
    if segment is None or segment.name != name:
        if segment is not None:
            segment.close()
        segment = cache[key] = shared_memory.SharedMemory(name)
    return segment


def _capacity(total: int) -> int:
    return max(_MIN_CAPACITY, 1 << max(0, total - 1).bit_length())


class ChildResults:
    """A map process's result segments: written into while free, lent out, given back.

    The child creates them itself, because only it knows how large a result is; it names each
    one as the task it first carries says (``<prefix><child>-r<slot>-<random>``), a name the
    parent chose and knows before the child can create it. It writes a result into the
    smallest of its free segments that fits, else creates one (replacing, that is unlinking, a
    free one that is too small, and saying so), and reports the segment's name with the
    result. A segment is free again when the parent says so with a later task: right after
    copying out of it, or once the consumer dropped the arrays lent from it.
    """

    def __init__(self) -> None:
        self.segments: dict = {}  # name -> SharedMemory created by this process
        self.free: list = []  # names of segments the parent is done with

    def release(self, names: Iterable[str]) -> None:
        """The parent is done with these segments (sent with a task)."""
        self.free.extend(n for n in names if n in self.segments)

    def write(self, suggested: str, buffers: list, spans: list, total: int) -> tuple[str, list]:
        """Write ``buffers`` at ``spans`` into a free segment of at least ``total`` bytes (or a
        new one named ``suggested``); return ``(its name, names of segments unlinked)``."""
        fits = [n for n in self.free if self.segments[n].size >= total]
        retired: list = []
        if fits:
            name = min(fits, key=lambda n: self.segments[n].size)
            self.free.remove(name)
            segment = self.segments[name]
        else:
            segment = create_segment(suggested, _capacity(total))
            name = segment.name
            if self.free:
                # Replace a free segment that is too small rather than add one: the parent
                # attaches by name and drops its mapping of a retired one.
                old = self.free.pop()
                release_segment(self.segments.pop(old))
                retired.append(old)
            self.segments[name] = segment
        view = segment.buf
        try:
            for raw, (offset, length) in zip(buffers, spans):
                view[offset:offset + length] = raw
        finally:
            del view
        return name, retired

    def close(self) -> None:
        """Unmap (the parent unlinks: it may still have a result to read from them)."""
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()
        self.free.clear()


def release_segment(segment: shared_memory.SharedMemory) -> None:
    """Unmap a segment and unlink its name (gone already is fine). Both sides use it: the map
    stage for its input slots, a map process for result segments it replaces, the parent for
    every name left at close."""
    try:
        segment.close()
    finally:
        try:
            segment.unlink()
        except FileNotFoundError:
            pass


class ParentResults:
    """The parent's side: map the children's result segments, rebuild results, lend them."""

    def __init__(self) -> None:
        self.maps: dict = {}  # segment name -> this process's mmap of it
        self.names: set = set()  # every segment name a child reported (unlinked at close)
        self.lent: collections.Counter = collections.Counter()  # child -> results lent out
        self.returned: collections.deque = collections.deque()  # (child, name), any thread
        self.done: dict = collections.defaultdict(list)  # child -> names to give back to it

    def receive(self, name: Optional[str], retired: Iterable[str]) -> None:
        """A message arrived naming the result's segment and the segments its child unlinked
        (called at once, in message order; the result is rebuilt when the consumer takes it)."""
        for old in retired:
            self.maps.pop(old, None)
        if name is not None:
            self.names.add(name)

    def load(self, child: int, name: Optional[str], payload: bytes, spans: list) -> Any:
        """The results of one message from ``child``, for the consumer: its arrays lent from
        the segment, or copied out of it when the child has :data:`LEASES` results lent."""
        if not spans:
            return pickle.loads(payload)
        mapping = self._map(name)
        self._collect()
        if self.lent[child] < LEASES and _posixshmem is not None:
            whole = np.frombuffer(mapping, np.uint8)  # every array of this result views it
            results = pickle.loads(payload, buffers=[whole[o:o + n] for o, n in spans])
            self.lent[child] += 1
            weakref.finalize(whole, self.returned.append, (child, name)).atexit = False
            return results
        buffers = [bytearray(mapping[o:o + n]) for o, n in spans]
        self.done[child].append(name)
        return pickle.loads(payload, buffers=buffers)

    def _map(self, name: str) -> Any:
        mapping = self.maps.get(name)
        if mapping is None:
            if _posixshmem is None:  # pragma: no cover - not POSIX
                segment = shared_memory.SharedMemory(name)
                mapping = bytes(segment.buf)
                segment.close()
                return mapping
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
            try:
                mapping = self.maps[name] = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return mapping

    def _collect(self) -> None:
        while self.returned:
            child, name = self.returned.popleft()
            self.lent[child] -= 1
            self.done[child].append(name)

    def give_back(self, child: int) -> list:
        """Names of ``child``'s segments it may write into again (sent with its next task)."""
        self._collect()
        return self.done.pop(child, [])

    def close(self, leftovers: Iterable[str]) -> None:
        """Forget every mapping (a lent array keeps its own) and unlink every segment reported
        and every name in ``leftovers`` that exists (call once the children are gone).

        ``leftovers``: the suggested name of every task still in flight; the name a child took
        instead where that one was taken (a child killed between creating a segment and
        reporting it) is found too. Names that no longer exist, or that another user holds, are
        skipped. Mappings are never closed explicitly (a lent array may still use one); they go
        with their last reference."""
        leftovers = set(leftovers)
        names = self.names | leftovers | _retried(leftovers)
        self.names = set()
        self.maps.clear()
        self.done.clear()
        for name in sorted(names):
            if not _ours(name):
                continue  # never created, already unlinked, or another user's (a taken name)
            try:
                segment = shared_memory.SharedMemory(name)
            except FileNotFoundError:
                continue
            except ValueError:  # empty: a child stopped between creating it and sizing it
                _unlink_empty(name)
                continue
            release_segment(segment)


def _unlink_empty(name: str) -> None:
    """Unlink a segment of ours that has no size (nothing can be mapped from it)."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _retried(suggested: set) -> set:
    """The names a child may have created instead of ``suggested`` ones that were taken
    (``<suggested>-<random>``: :func:`create_segment`), found in ``/dev/shm`` (Linux)."""
    if not suggested or not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm")
            if name.rpartition("-")[0] in suggested}


def _ours(name: str) -> bool:
    """Whether the segment ``name`` exists and this user created it (a name a child was told to
    use may have been taken by someone else: that one is not ours to unlink)."""
    if _posixshmem is None:  # pragma: no cover - not POSIX
        return True
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
    except OSError:  # gone, or not readable by us: not ours either way
        return False
    try:
        return os.fstat(fd).st_uid == os.geteuid()
    finally:
        os.close(fd)

"""Dealing one stream to several readers: the block rule, and replaying old readers' shares.

A single stream (a FIFO, a ``PipeChannel``) read by several readers (DataLoader workers, the
local ranks of a host: :mod:`streamio.sharing`) is cut into **blocks** by one rule,
:func:`cut_blocks`: at most :data:`BLOCK_RECORDS` records, closed at :data:`BLOCK_BYTES` bytes,
never across two sources. Block ``k`` of the epoch goes to reader ``k % readers``. The rule
depends on the stream's records only (not on how its bytes arrived), so a restarted job whose
stream carries the same bytes deals every reader the same records again: that is what makes a
shared stream resumable mid-epoch, and a reader's share is a shard layer of its own (the
state's ``stream`` field: ``[readers, index]``).

An elastic resume (:mod:`streamio.pipeline.resume.elastic`) replays every old reader's share from one
read of the stream: :class:`Demux` splits a stream of blocks (all of them, in order) into the
old readers' shares, each a feed (:meth:`streamio.pipeline.Dataset.with_feed`) for that reader's
replayed plan. Blocks of a share that nobody replays are dropped as they come; the others wait
in memory until their replay takes them (the replays are read in turn, so they stay close).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .epoch import EpochRun, origin_source

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "Demux", "cut_blocks"]

#: Records per block: small enough that k readers share a stream of short epochs evenly, large
#: enough that one request per block costs little next to decoding its records.
BLOCK_RECORDS = 64
#: A block is closed at this many bytes (64 image records of ~100 KB are ~6 MB).
BLOCK_BYTES = 8 << 20


def cut_blocks(dataset: Any, epoch: int, stats: Any,
               named: Optional[Callable[[str], None]] = None) -> Iterator[tuple]:
    """``(source name, record origins, records)``: the blocks of ``dataset``'s stream in
    ``epoch``, after its ``shard()`` layers (a host's share of a replicated stream), cut by the
    block rule. ``named(name)`` hears each source's name as reading reaches it. The records
    before a fault come out as a block before the fault is raised."""
    # The pipeline's own source end, without stages or decoder: it opens each source once,
    # applies shard() layers exactly as a reader that is not shared would, and gives each
    # record its origin.
    run = EpochRun.for_sources(dataset, epoch, stats)
    pending: list = []
    pending_ids: list = []
    ordinal = -1
    size = 0
    fallback = "the shared stream"

    def cut() -> tuple:
        nonlocal pending, pending_ids, size
        block = (run.names.get(ordinal, fallback), np.concatenate(pending_ids), pending)
        pending, pending_ids, size = [], [], 0
        return block

    # Records gather across the reader's chunks (a 1 MiB read holds ~10 image records): where a
    # block ends depends on the records only, never on how the bytes arrived.
    source_blocks = run.read_blocks()
    try:
        for records, ids in source_blocks:
            start = 0
            while start < len(records):
                here = origin_source(ids[start])
                if here != ordinal and pending:
                    yield cut()
                ordinal = here
                if named is not None and ordinal in run.names:
                    named(run.names[ordinal])
                room = BLOCK_RECORDS - len(pending)
                piece = records[start:start + room]
                piece_ids = ids[start:start + room]
                # A piece from one chunk belongs to one source (a reader's chunk does).
                pending.extend(piece)
                pending_ids.append(piece_ids)
                size += sum(map(len, piece))
                start += len(piece)
                if len(pending) >= BLOCK_RECORDS or size >= BLOCK_BYTES:
                    yield cut()
    except Exception:
        if pending:  # the records before a fault are delivered first
            yield cut()
        raise
    finally:
        source_blocks.close()
    if pending:
        yield cut()


class Demux:
    """The old readers' shares of one read of a stream dealt to ``readers`` readers.

    ``blocks`` yields every block of the epoch in order, as ``(name, origins, records)``;
    :meth:`feed` ``(i)`` is a feed that yields reader ``i``'s blocks (``k % readers == i``),
    each feed all of them (a nested elastic state replays one old reader's share once for each
    of its resumed shards that had not finished). Blocks of a share no feed reads are dropped as
    they come. Safe to read from several threads (a replayed plan may prefetch in a thread of
    its own). ``close()`` closes ``blocks``.
    """

    def __init__(self, blocks: Iterator[tuple], readers: int) -> None:
        self._blocks = blocks
        self.readers = readers
        self._queues: dict = {}  # share -> one queue per feed of it
        self._next = 0  # the index of the next block to read
        self._done = False
        self._failure: Optional[BaseException] = None
        self._lock = threading.Lock()

    def _take(self, queue: deque) -> Optional[tuple]:
        with self._lock:
            while not queue:
                if self._failure is not None:
                    raise self._failure
                if self._done:
                    return None
                try:
                    block = next(self._blocks)
                except StopIteration:
                    self._done = True
                    return None
                except BaseException as exc:
                    self._failure = exc
                    raise
                owner = self._next % self.readers
                self._next += 1
                for waiting in self._queues.get(owner, ()):
                    waiting.append(block)
            return queue.popleft()

    def feed(self, index: int) -> "DemuxFeed":
        """A feed of share ``index`` (made before the first block is read)."""
        queue: deque = deque()
        self._queues.setdefault(index, []).append(queue)
        return DemuxFeed(self, index, queue)

    def close(self) -> None:
        close = getattr(self._blocks, "close", None)
        if close is not None:
            close()


class DemuxFeed:
    """One old reader's share of a :class:`Demux` (the feed protocol of
    :mod:`streamio.pipeline.epoch`)."""

    replayable = True

    def __init__(self, demux: Demux, index: int, queue: deque) -> None:
        self.demux = demux
        self.index = index
        self._queue = queue

    @property
    def dealt(self) -> Optional[tuple]:
        return (self.demux.readers, self.index) if self.demux.readers > 1 else None

    def __call__(self, run: Any) -> Iterator[tuple]:
        while True:
            block = self.demux._take(self._queue)
            if block is None:
                return
            name, ids, records = block
            run.name_source(origin_source(ids[0]), name)
            yield records, (ids if run.track_ids else None)

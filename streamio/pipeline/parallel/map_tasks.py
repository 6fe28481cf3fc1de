"""What every ``map`` backend shares: tasks, per-item seeds, running ``fn`` over a task.

A task is up to :data:`TASK_ITEMS` consecutive items of one input block (about
:data:`TASK_BYTES`); :func:`apply_fn` runs ``fn`` over one, in the consumer, a thread or a
child process (:mod:`streamio.pipeline.parallel` runs the backends and states the invariants).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Optional

import numpy as np

from ...decoders.skips import counting_skips

__all__ = ["BACKENDS", "MAX_INFLIGHT_BYTES", "MapBackend", "MapPlace", "Outcome", "Seeds",
           "TASK_BYTES", "TASK_ITEMS", "Task", "apply_fn", "cut_tasks", "item_nbytes",
           "item_rng"]

MapBackend = Literal["thread", "process"]
BACKENDS = ("thread", "process")
#: Items per task: enough that a task's overhead (a queue hand-off, a pipe message, a segment)
#: is small next to the work, few enough that the ``2 * k`` tasks in flight stay small.
TASK_ITEMS = 64
#: A task is closed once its items hold this many bytes (one 100 KB image record is ~10 a task).
TASK_BYTES = 1 << 20
#: No new task starts while those in flight hold this many bytes of input.
MAX_INFLIGHT_BYTES = 64 << 20

# The spawn key's second entry tells record keys from batch keys, so they never collide.
_RECORD_KEY, _ITEM_KEY = 0, 1


def item_rng(seed: int, *, epoch: int, record: Optional[int] = None, rank: int = 0,
             worker: int = 0, position: int = 0) -> np.random.Generator:
    """The generator ``map(fn, seed=seed)`` passes with one item.

    ``record`` (the record's origin: source position << 40 | index in that source) when the
    item is a record; otherwise ``(rank, worker, position)``, the item's place in one reader's
    epoch. The stage's place in the chain is not part of the key (adding a ``prefetch()`` must
    not change the draws): give two seeded maps two seeds. ``numpy.random.SeedSequence`` mixes
    the spawn key into the entropy, so neighbouring keys give independent streams.
    """
    if record is not None:
        key: tuple = (int(epoch), _RECORD_KEY, int(record))
    else:
        key = (int(epoch), _ITEM_KEY, int(rank), int(worker), int(position))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=key)))


@dataclass(frozen=True)
class MapPlace:
    """Where a map stage runs, for seeds and error messages."""

    epoch: int
    stage: int
    rank: int
    worker: int
    names: dict  # source position -> source name (filled by the reader as sources open)
    index_bits: int
    stats: Any  # EpochStats: map time is added to decode_s


@dataclass(frozen=True)
class Seeds:
    seed: int
    epoch: int
    rank: int
    worker: int

    def rng(self, record: Optional[int], position: int) -> np.random.Generator:
        return item_rng(self.seed, epoch=self.epoch, record=record,
                        rank=self.rank, worker=self.worker, position=position)


class Task:
    """Consecutive items of one input block. ``records``: their origins, or None (batches)."""

    __slots__ = ("tid", "items", "records", "first", "nbytes")

    def __init__(self, tid: int, items: list, records: Optional[np.ndarray], first: int,
                 nbytes: int) -> None:
        self.tid = tid
        self.items = items
        self.records = records
        self.first = first  # position of items[0] in this stage's input this epoch
        self.nbytes = nbytes


def item_nbytes(item: Any) -> int:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return len(item)
    if isinstance(item, (list, tuple)):
        return sum(item_nbytes(x) for x in item)
    if isinstance(item, dict):
        return sum(item_nbytes(v) for v in item.values())
    nbytes = getattr(item, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else 0


def cut_tasks(blocks: Iterator[tuple]) -> Iterator[Task]:
    """Cut blocks ``(items, ids)`` into tasks of at most TASK_ITEMS items and ~TASK_BYTES."""
    tid = 0
    position = 0
    for items, ids in blocks:
        start = 0
        n = len(items)
        while start < n:
            stop = start
            size = 0
            while stop < n and stop - start < TASK_ITEMS and size < TASK_BYTES:
                size += item_nbytes(items[stop])
                stop += 1
            records = None if ids is None else ids[start:stop]
            yield Task(tid, list(items[start:stop]), records, position + start, size)
            tid += 1
            start = stop
        position += n


# -- running fn over one task (in the consumer, a thread or a child process) ---------------------
def apply_fn(fn: Callable, items: list, records: Optional[np.ndarray], first: int,
           seeds: Optional[Seeds]) -> tuple[list, Optional[tuple[int, BaseException]], dict]:
    """``fn`` over ``items``: (results, None, skips), or (results before the fault, (its
    position in the task, the exception), skips); ``skips``: records a decoder called by
    ``fn`` dropped, ``{field: records}`` (counted in ``stats()``)."""
    out = []
    with counting_skips() as skipped:
        try:
            if seeds is None:
                for item in items:
                    out.append(fn(item))
            else:
                for i, item in enumerate(items):
                    record = None if records is None else int(records[i])
                    out.append(fn(item, seeds.rng(record, first + i)))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, with the position
            return out, (len(out), exc), dict(skipped)
    return out, None, dict(skipped)


class Outcome:
    """A finished task: its results and, if ``fn`` failed, the failure."""

    __slots__ = ("task", "results", "failure", "busy_s", "skipped")

    def __init__(self, task: Task, results: list, failure: Optional[tuple[int, BaseException]],
                 busy_s: float, skipped: dict) -> None:
        self.task = task
        self.results = results
        self.failure = failure
        self.busy_s = busy_s
        self.skipped = skipped

"""The ``map`` and ``filter`` stages: a function over every item, inline, on threads or in
processes.

Invariants of a parallel ``map`` (``num_parallel=k``):

- **Bounded**: at most ``2 * k`` tasks in flight, a task being up to :data:`TASK_ITEMS` items
  and :data:`TASK_BYTES` bytes of one input block (so at most ``2 * k * TASK_ITEMS`` items),
  and no new task starts while the tasks in flight hold :data:`MAX_INFLIGHT_BYTES` of input
  (a single larger task still runs, alone). Results wait only in the tasks that made them.
- **Order**: ``ordered=True`` hands results out in input order; ``ordered=False`` hands each
  task's results out as soon as it finishes (every item still exactly once).
- **Errors**: an exception in ``fn`` reaches the consumer after every result before it (in
  order) was delivered: a :class:`~streamio.errors.MapError` naming the item (the record's
  source and index before ``batch()``, the batch's position after it) whose ``__cause__`` is the
  original exception with its traceback (from a process: the child's traceback text, as
  ``concurrent.futures`` does). A :class:`~streamio.errors.FormatError` raised by ``fn`` (a
  decoder's ``DecodeError``) is a data error that already names its record: it is re-raised
  as it is, with a note saying where in the stream its item was.
- **Cleanup**: the stage is a generator owned by the epoch; leaving the loop, ``close()`` or
  dropping the iterator stops the workers (threads are joined after their running task;
  processes are terminated) and unlinks every shared-memory segment.

Processes (:class:`_Processes`) come from a ``forkserver``, never ``fork``, and never import the
user's ``__main__``; ``fn`` travels parent -> child only, pickled by value where it must be
(cloudpickle): nothing a child sends back is code. Records and results travel through shared
memory only this user can open (:mod:`.shm_results`). Seeds: ``map(..., seed=s)`` calls
``fn(item, rng)`` with :func:`item_rng`'s generator, from ``(s, epoch, record)`` for records
(the same draws whatever the parallelism, worker or arrival order) and from ``(s, epoch, rank,
worker, position)`` for batches; never from time or process ids.
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import multiprocessing.connection
import os
import pickle
import pickletools
import secrets
import sys
import time
import traceback
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ...errors import FormatError, MapError, MissingDependencyError, UsageError, UsageTypeError
from ._mainless import MainlessProcess
from .map_tasks import (BACKENDS, MAX_INFLIGHT_BYTES, TASK_BYTES, TASK_ITEMS, MapBackend,
                        MapPlace, Outcome, Seeds, Task, apply_fn, cut_tasks, item_rng)
from .shm_results import (ChildResults, ParentResults, attach, create_segment, dump_results,
                          new_segment_name,
                          release_segment)

__all__ = ["MAX_INFLIGHT_BYTES", "MapBackend", "TASK_BYTES", "TASK_ITEMS", "filter_blocks",
           "item_rng", "map_blocks"]

#: Shared-memory segments of map tasks: ``streamio-map-<pid>-<random>-<child>-<slot>-<random>``.
SEGMENT_PREFIX = "streamio-map-"
#: How long a closing pool waits for idle processes to exit before terminating them.
_EXIT_GRACE_S = 1.0


class _Inline:
    """``num_parallel=None``: each task runs in the consumer's thread when it is submitted."""

    def __init__(self, fn: Callable, seeds: Optional[Seeds]) -> None:
        self.fn = fn
        self.seeds = seeds
        self.done: collections.deque = collections.deque()
        self.max_tasks = 1

    def submit(self, task: Task) -> None:
        t0 = time.perf_counter()
        results, failure, skipped = apply_fn(self.fn, task.items, task.records, task.first,
                                           self.seeds)
        self.done.append(Outcome(task, results, failure, time.perf_counter() - t0, skipped))

    def wait(self, ordered: bool) -> Outcome:
        return self.done.popleft()

    def close(self) -> None:
        self.done.clear()


class _Threads:
    """``backend="thread"``: a ``ThreadPoolExecutor`` of ``k`` threads (for functions that
    release the GIL: image decoders, zlib, numpy)."""

    def __init__(self, fn: Callable, k: int, seeds: Optional[Seeds]) -> None:
        self.fn = fn
        self.seeds = seeds
        self.max_tasks = 2 * k
        self.pool = concurrent.futures.ThreadPoolExecutor(k, thread_name_prefix="streamio-map")
        self.pending: dict = {}  # future -> task, in submission order

    def _run(self, task: Task) -> Outcome:
        t0 = time.perf_counter()
        results, failure, skipped = apply_fn(self.fn, task.items, task.records, task.first,
                                           self.seeds)
        return Outcome(task, results, failure, time.perf_counter() - t0, skipped)

    def submit(self, task: Task) -> None:
        self.pending[self.pool.submit(self._run, task)] = task

    def wait(self, ordered: bool) -> Outcome:
        if ordered:
            future = next(iter(self.pending))
        else:
            done, _ = concurrent.futures.wait(self.pending, return_when="FIRST_COMPLETED")
            future = min(done, key=lambda f: self.pending[f].tid)
        del self.pending[future]
        return future.result()

    def close(self) -> None:
        # Queued tasks are dropped; running ones finish their items (a thread cannot be stopped)
        # and the threads are joined before close() returns.
        self.pending.clear()
        self.pool.shutdown(wait=True, cancel_futures=True)


# -- processes -------------------------------------------------------------------------------------
def _process_class(fn_bytes: bytes) -> Any:
    """The Process class of map children: forkserver children that do not import ``__main__``
    (see :mod:`._mainless`); ``spawn`` where there is no forkserver."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn").Process
    _preload(multiprocessing.get_context("forkserver"), fn_bytes)
    return MainlessProcess


def dump_function(fn: Callable) -> bytes:
    """``fn`` pickled for a map process: by value where it cannot be imported by name (defined
    in ``__main__``, a lambda, a closure), as cloudpickle does, so that a child never imports
    the user's script. The bytes go from parent to child only (a child trusts its parent)."""
    try:
        import cloudpickle
    except ImportError as exc:  # a dependency of streamio, but an environment may lack it
        raise MissingDependencyError(message="map(backend='process') needs cloudpickle (a"
                                     " dependency of streamio): pip install 'cloudpickle>=3.1'"
                                     ) from exc

    return cloudpickle.dumps(fn, pickle.HIGHEST_PROTOCOL)


def _preload(ctx: Any, fn_bytes: bytes) -> None:
    """Have the forkserver import what ``fn`` needs before it forks its first child.

    A child otherwise imports ``fn``'s modules (numpy, streamio, the image codecs: ~0.5 s of CPU)
    itself, every epoch, in each of the ``k`` children: on a 2-core machine that is a tenth of an
    epoch of 1,000 images. Imported once in the server, they come with every fork for free. Only
    effective before the server starts (the first process map of this program); names already
    set with ``set_forkserver_preload`` are kept, except ``__main__``, which would run a script
    without a ``__main__`` guard inside the server. Only streamio's own modules (and the libraries
    they name) are preloaded: a user's module may import something that starts threads (TensorFlow
    does), and a fork of a server with threads could inherit a held lock; such modules are
    imported by each child after its fork, as before.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the process-wide server behind the context
    if getattr(server, "_forkserver_pid", None) is not None:
        return  # already running: its modules are fixed
    modules = _pickled_modules(fn_bytes)
    for name in list(modules):
        modules.extend(getattr(sys.modules[name], "_FORKSERVER_PRELOAD", ()))
    current = list(getattr(server, "_preload_modules", ["__main__"]))
    kept = [m for m in current if m != "__main__"]
    wanted = kept + [m for m in dict.fromkeys(modules) if m not in kept]
    if wanted != current:
        ctx.set_forkserver_preload(wanted)


def _pickled_modules(fn_bytes: bytes) -> list:
    """streamio's modules, already imported here, whose globals ``fn``'s pickle names (its
    function, the classes of the objects bound to it: a decoder's). A module may name optional
    libraries it imports lazily in ``_FORKSERVER_PRELOAD`` (the image codecs do); the server
    skips those that are missing."""
    found: list = ["streamio.pipeline.parallel"]
    for _, arg, _ in pickletools.genops(fn_bytes):
        if (isinstance(arg, str) and (arg.startswith("streamio.") or arg == "cloudpickle")
                and arg in sys.modules and arg not in found):
            found.append(arg)
    return found


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a map process (its frames do not pickle)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any unpicklable exception is described instead
        return RuntimeError(f"{type(exc).__qualname__}: {exc}")


# A task's payload in shared memory: items that are records (``bytes``) or raw batches (lists of
# ``bytes``) are written end to end and described by ``shape`` (-1: one record; n >= 0: a list
# of n records) and ``lengths``; any other items are pickled into the segment instead.
def _pack(items: list) -> tuple[Optional[np.ndarray], np.ndarray, list]:
    shape = np.empty(len(items), np.int64)
    parts: list = []
    for i, item in enumerate(items):
        if isinstance(item, bytes):
            shape[i] = -1
            parts.append(item)
        elif isinstance(item, list) and all(isinstance(r, bytes) for r in item):
            shape[i] = len(item)
            parts.extend(item)
        else:
            return None, np.array([], np.int64), [pickle.dumps(items, pickle.HIGHEST_PROTOCOL)]
    return shape, np.fromiter(map(len, parts), np.int64, len(parts)), parts


def _unpack(buf: memoryview, shape: Optional[np.ndarray], lengths: np.ndarray) -> list:
    if shape is None:
        return pickle.loads(buf)
    ends = np.cumsum(lengths).tolist()
    starts = [0] + ends[:-1]
    records = [bytes(buf[s:e]) for s, e in zip(starts, ends)]
    items: list = []
    r = 0
    for n in shape.tolist():
        if n < 0:
            items.append(records[r])
            r += 1
        else:
            items.append(records[r:r + n])
            r += n
    return items


def _child_main(conn: Any, fn_bytes: bytes, seeds: Optional[Seeds]) -> None:
    """A map process: tasks in, results out, until told to stop or the parent goes away."""
    fn = pickle.loads(fn_bytes)
    attached: dict = {}  # slot -> its segment, mapped once and kept while the parent reuses it
    results_out = ChildResults()
    try:
        _serve_tasks(conn, fn, seeds, attached, results_out)
    finally:
        for segment in attached.values():
            segment.close()
        results_out.close()


def _serve_tasks(conn: Any, fn: Callable, seeds: Optional[Seeds], attached: dict,
                 results_out: ChildResults) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return  # the parent is gone or stopping us
        if message is None:
            return
        (tid, slot, name, size, shape, lengths, records, first, result_name,
         given_back) = message
        results_out.release(given_back)
        t0 = time.perf_counter()
        try:
            # The parent owns (and unlinks) the segments; a slot's segment changes name only
            # when the parent replaced it with a larger one. (Attaching registers the name with
            # the resource tracker, which the child shares with its parent: a set, so the
            # parent's unlink leaves it clean.)
            items = _unpack(attach(attached, slot, name).buf[:size], shape, lengths)
            results, failure, skipped = apply_fn(fn, items, records, first, seeds)
        except Exception as exc:  # noqa: BLE001 - reported like a failure of fn on item 0
            results, failure, skipped = [], (0, exc), {}
        busy = time.perf_counter() - t0
        if failure is not None:
            position, exc = failure
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            failure = (position, _portable(exc), text)
        try:
            # Large buffers (numpy arrays) go through a result segment; the pipe carries the
            # rest of the pickle and where the buffers lie.
            payload, buffers, spans, total = dump_results(results)
            segment_name, retired = (results_out.write(result_name, buffers, spans, total)
                                     if buffers else (None, []))
            del buffers
            conn.send_bytes(pickle.dumps((tid, segment_name, retired, payload, spans, failure,
                                          busy, skipped), pickle.HIGHEST_PROTOCOL))
        except Exception as exc:  # noqa: BLE001 - e.g. results that do not pickle
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            conn.send_bytes(pickle.dumps((tid, None, [], pickle.dumps([]), [],
                                          (0, _portable(exc), text), busy, skipped)))


class _Processes:
    """``backend="process"``: ``k`` forkserver children, two tasks queued on each at most.

    Started with ``forkserver`` (``spawn`` where there is none), never ``fork``: by the time an
    epoch runs, the parent has threads (prefetch, torch's pools, TensorFlow's runtime), and a
    forked child can inherit a lock one of them held and deadlock. A forkserver child is a fork
    of a small single-threaded server, so starting ``k`` of them is cheap (docs/performance.md),
    and they import neither torch nor TensorFlow unless ``fn`` needs them. ``fn`` is pickled
    with cloudpickle (by value where it cannot be imported by name: a lambda, a closure, a
    function of the user's script), and a child never imports the user's ``__main__``
    (:mod:`._mainless`), so a script without an ``if __name__ == "__main__":`` guard works; that
    ``fn`` pickles is checked when ``map()`` is called. The pickled function travels parent ->
    child only; nothing a child sends back is code (results are pickled data through the
    child's private pipe, buffers through segments only this user can open). Records go to a
    child through shared memory: each child has two slots (its two queued tasks), each a
    segment the parent creates once, reuses for task after task (grown when a task needs more)
    and unlinks when the stage closes; a task's records are written end to end and only their
    lengths travel through the pipe. Results come back the same way, one message per task:
    their large buffers (numpy arrays) through a result segment that the child creates and
    reuses, the rest pickled (:mod:`.shm_results`); the consumer gets arrays that view the
    segment, lent until it drops them (no copy), or, past :data:`.shm_results.LEASES` results
    of one child in its hands, arrays copied out of it.
    """

    def __init__(self, fn: Callable, k: int, seeds: Optional[Seeds]) -> None:
        if multiprocessing.current_process().daemon:
            raise UsageError("map(backend='process') cannot start processes inside a daemonic"
                             " process (a DataLoader worker is one): use backend='thread' there,"
                             " or run the map in the main process (num_workers=0)")
        self.max_tasks = 2 * k
        # Named for the process that owns them, so a leftover is easy to attribute.
        self.prefix = f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
        fn_bytes = dump_function(fn)
        process_class = _process_class(fn_bytes)
        self.conns: list = []
        self.procs: list = []
        self.queued: list = []  # per child: deque of task ids sent to it
        # Two slots per child (its two queued tasks), each with a segment that is reused from
        # task to task: creating and unlinking one per task costs more than copying 1 MiB.
        self.segments: dict = {}  # (child, slot) -> SharedMemory
        self.free: list = []  # per child: its free slots
        self.tasks: dict = {}  # tid -> (task, child, slot)
        self.result_names: dict = {}  # tid -> the name its result segment would get
        self.finished: dict = {}  # tid -> Outcome, waiting for its turn
        self.results = ParentResults()
        try:
            for _ in range(k):
                parent, child = multiprocessing.Pipe(duplex=True)
                proc = process_class(target=_child_main, args=(child, fn_bytes, seeds),
                                     name="streamio-map", daemon=True)
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
                self.queued.append(collections.deque())
                self.free.append(collections.deque([0, 1]))
        except BaseException:
            self.close()
            raise

    def submit(self, task: Task) -> None:
        child = min(range(len(self.procs)), key=lambda i: len(self.queued[i]))
        slot = self.free[child].popleft()
        shape, lengths, parts = _pack(task.items)
        size = int(lengths.sum()) if shape is not None else len(parts[0])
        segment = self.segments.get((child, slot))
        if segment is None or segment.size < size:
            if segment is not None:
                release_segment(segment)
            capacity = max(TASK_BYTES, 1 << max(0, size - 1).bit_length())
            segment = create_segment(new_segment_name(f"{self.prefix}{child}-{slot}"), capacity)
            self.segments[(child, slot)] = segment
        self.tasks[task.tid] = (task, child, slot)
        buf = segment.buf
        pos = 0
        for part in parts:
            buf[pos:pos + len(part)] = part
            pos += len(part)
        del buf
        # Only names, sizes and lengths go through the pipe: a few hundred bytes, so a send
        # never waits on a child that is itself waiting to send its results.
        try:
            self.conns[child].send((task.tid, slot, segment.name, size, shape, lengths,
                                    task.records, task.first,
                                    self._result_name(child, slot, task.tid),
                                    self.results.give_back(child)))
        except OSError:
            self.procs[child].join(_EXIT_GRACE_S)
            raise self._died(child) from None
        self.queued[child].append(task.tid)

    def _result_name(self, child: int, slot: int, tid: int) -> str:
        # The name the child gives a result segment it creates for this task: known here
        # first, so close() can unlink it even if the child dies right after creating it.
        # Random, so that no one can take it first (if someone does, the child takes
        # "<name>-<random>", which close() finds too).
        name = self.result_names[tid] = new_segment_name(f"{self.prefix}{child}-r{slot}")
        return name

    def _died(self, child: int) -> MapError:
        proc = self.procs[child]
        return MapError(f"a map process (pid {proc.pid}) died with exit code {proc.exitcode}"
                        " while it held items: the epoch cannot continue")

    def _receive(self) -> None:
        """Wait for messages from the children (or for a child's death) and file them."""
        sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
        ready = multiprocessing.connection.wait(list(self.conns) + list(sentinels))
        for item in ready:
            if item in sentinels:
                continue
            child = self.conns.index(item)
            try:
                while item.poll():
                    self._file(child, item.recv_bytes())
            except (EOFError, OSError):
                pass  # it died: reported below through its sentinel
        for item in ready:
            if item in sentinels:
                i = sentinels[item]
                if self.queued[i]:
                    raise self._died(i)

    def _file(self, child: int, message: bytes) -> None:
        tid, segment_name, retired, payload, spans, failure, busy, skipped = pickle.loads(message)
        task, _, slot = self.tasks[tid]
        self.results.receive(segment_name, retired)
        self.queued[child].remove(tid)
        del self.tasks[tid]
        self.result_names.pop(tid, None)
        self.free[child].append(slot)
        if failure is not None:
            position, exc, text = failure
            exc.__cause__ = _RemoteTraceback(text)
            failure = (position, exc)
        # Rebuilt when the consumer takes it (see _take): a result read ahead is not lent yet.
        self.finished[tid] = (Outcome(task, [], failure, busy, skipped), child, segment_name,
                              payload, spans)

    def _take(self, tid: int) -> Outcome:
        outcome, child, segment_name, payload, spans = self.finished.pop(tid)
        try:
            outcome.results = self.results.load(child, segment_name, payload, spans)
        except Exception as exc:  # noqa: BLE001 - a result that does not unpickle here
            outcome.failure = (0, exc)
        return outcome

    def wait(self, ordered: bool) -> Outcome:
        while True:
            if self.finished:
                if ordered:
                    first = min(self.tasks) if self.tasks else None
                    head = min(self.finished)
                    if first is None or head < first:
                        return self._take(head)
                else:
                    return self._take(min(self.finished))
            self._receive()

    def close(self) -> None:
        """Stop every child and unlink every segment (idempotent)."""
        idle = not self.tasks
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + (_EXIT_GRACE_S if idle else 0.0)
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.terminate()  # busy with items no one will take
        for proc in self.procs:
            proc.join()
        for conn in self.conns:
            conn.close()
        self.results.close(self.result_names.values())
        self.result_names.clear()
        self.conns, self.procs = [], []
        for segment in self.segments.values():
            release_segment(segment)
        self.segments.clear()
        self.tasks.clear()
        self.finished.clear()


# -- the stages ------------------------------------------------------------------------------------
def _where(place: MapPlace, task: Task, position: int) -> dict:
    """Keyword arguments for MapError: the item's source/record (records) or position."""
    index = task.first + position
    if task.records is not None:
        origin = int(task.records[position])
        mask = (1 << place.index_bits) - 1
        return dict(source=place.names.get(origin >> place.index_bits),
                    record_index=origin & mask, item_index=index)
    return dict(source=None, record_index=None, item_index=index)


def _raise_failure(place: MapPlace, what: str, fn: Callable, task: Task, position: int,
                   exc: BaseException) -> None:
    where = _where(place, task, position)
    if isinstance(exc, FormatError):
        # A data error (a decoder's DecodeError) already names its record within the item:
        # keep its type, so `except DecodeError` works through map, and say where the item was.
        item = ("record" if where["record_index"] is not None else "item")
        at = where["record_index"] if where["record_index"] is not None else where["item_index"]
        exc.add_note(f"raised by {what} {_name(fn)} on {item} {at}"
                     + (f" of {where['source']}" if where["source"] else ""))
        raise exc
    raise MapError(f"{what} {_name(fn)} raised {type(exc).__name__}: {exc}", **where) from exc


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def map_blocks(blocks: Iterator[tuple], fn: Callable, *, num_parallel: Optional[int],
               ordered: bool, backend: str, seed: Optional[int], place: MapPlace,
               track_records: bool) -> Iterator[tuple]:
    """The map stage over blocks ``(items, ids)``: yields ``(results, ids)``, one block per task.

    ``track_records``: ``ids`` are the items' record origins (items are records), which name a
    failing record and key its seed."""
    seeds = (None if seed is None else
             Seeds(seed, place.epoch, place.rank, place.worker))
    if not track_records:
        blocks = ((items, None) for items, _ in blocks)  # batch-level ids are not records
    tasks = cut_tasks(blocks)
    pool: Any = None
    try:
        if num_parallel is None:
            pool = _Inline(fn, seeds)
        elif backend == "thread":
            pool = _Threads(fn, num_parallel, seeds)
        else:
            pool = _Processes(fn, num_parallel, seeds)
        yield from _drive(pool, tasks, ordered, place, fn)
    finally:
        try:
            if pool is not None:
                pool.close()
        finally:
            tasks.close()
            close = getattr(blocks, "close", None)
            if close is not None:
                close()


def _drive(pool: Any, tasks: Iterator[Task], ordered: bool, place: MapPlace,
           fn: Callable) -> Iterator[tuple]:
    in_flight = 0
    in_flight_bytes = 0
    upstream_error: Optional[BaseException] = None
    exhausted = False
    stats = place.stats
    while True:
        # Keep the pool busy within the bounds; reading upstream happens here, in the consumer.
        while (not exhausted and in_flight < pool.max_tasks
               and (in_flight == 0 or in_flight_bytes < MAX_INFLIGHT_BYTES)):
            try:
                task = next(tasks)
            except StopIteration:
                exhausted = True
                break
            except Exception as exc:  # noqa: BLE001 - raised after the work before it
                upstream_error = exc
                exhausted = True
                break
            pool.submit(task)
            in_flight += 1
            in_flight_bytes += task.nbytes
        if in_flight == 0:
            if upstream_error is not None:
                raise upstream_error
            return
        outcome = pool.wait(ordered)
        in_flight -= 1
        in_flight_bytes -= outcome.task.nbytes
        stats.decode_s += outcome.busy_s
        stats.note_decoder_skips(outcome.skipped)
        task = outcome.task
        records = task.records
        if outcome.results:
            n = len(outcome.results)
            yield outcome.results, (None if records is None else records[:n])
        if outcome.failure is not None:
            position, exc = outcome.failure
            _raise_failure(place, "map function", fn, task, position, exc)


def filter_blocks(blocks: Iterator[tuple], predicate: Callable, *, place: MapPlace,
                  track_records: bool) -> Iterator[tuple]:
    """Keep the items for which ``predicate`` is true (inline: a predicate is cheap)."""
    position = 0
    try:
        for items, ids in blocks:
            keep = []
            for i, item in enumerate(items):
                try:
                    ok = predicate(item)
                except Exception as exc:  # noqa: BLE001 - wrapped with the item's position
                    if keep:
                        yield ([items[j] for j in keep],
                               None if ids is None else ids[np.asarray(keep, np.int64)])
                    records = ids if track_records else None
                    task = Task(-1, items, records, position, 0)
                    _raise_failure(place, "filter predicate", predicate, task, i, exc)
                if ok:
                    keep.append(i)
            position += len(items)
            if len(keep) == len(items):
                yield items, ids
            elif keep:
                yield ([items[j] for j in keep],
                       None if ids is None else ids[np.asarray(keep, np.int64)])
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def check_map_args(fn: Any, num_parallel: Any, ordered: Any, backend: Any,
                   seed: Any) -> None:
    """Raise TypeError/ValueError for arguments ``map()`` cannot use, at construction."""
    if not callable(fn):
        raise UsageTypeError(f"map needs a callable, not {type(fn).__name__}")
    if num_parallel is not None:
        if isinstance(num_parallel, bool) or not isinstance(num_parallel, (int, np.integer)):
            raise UsageTypeError(f"num_parallel must be an int or None, not"
                            f" {type(num_parallel).__name__}")
        if num_parallel < 1:
            raise UsageError(f"num_parallel must be >= 1, not {num_parallel}")
    if not isinstance(ordered, bool):
        raise UsageTypeError(f"ordered must be a bool, not {type(ordered).__name__}")
    if backend not in BACKENDS:
        raise UsageError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise UsageError(f"seed must be a non-negative int or None, not {seed!r}")
    if backend == "process" and num_parallel is not None:
        try:
            dump_function(fn)
        except MissingDependencyError:
            raise
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing
            raise UsageTypeError(f"map(backend='process') needs a function that pickles (with"
                                 f" cloudpickle: functions, lambdas, closures, a decoder's"
                                 f" method), and {_name(fn)} does not: {exc}") from exc


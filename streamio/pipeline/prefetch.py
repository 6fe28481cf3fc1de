"""Background prefetch: one thread, one bounded queue.

The pipeline moves items in *blocks* (the records of one chunk, or the batches cut from it) so
that no stage pays a Python call per record; the queue therefore counts items, not blocks, and
cuts a block that would not fit.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Iterator, Optional

__all__ = ["CLOSE_JOIN_S", "FILL_WAIT_S", "PUT_POLL_S", "Prefetcher"]

#: How often a producer blocked on a full queue looks at the stop flag. Small enough that
#: ``close()`` returns promptly, large enough that an idle wait costs nothing measurable.
PUT_POLL_S = 0.05
#: How long ``close()`` waits for the producer thread to finish. A producer waiting for room
#: sees the stop flag at once; one busy with a block finishes it first (milliseconds). Only a
#: producer blocked reading a silent source (a FIFO whose writer stalls) takes longer: close()
#: then returns anyway, and the daemon thread closes the reader as soon as its read returns
#: (the source's ``read_timeout`` bounds that).
CLOSE_JOIN_S = 5.0
#: The longest a consumer that found the queue empty waits for it to fill before it takes what
#: there is (see ``_BlockQueue``): about two of CPython's 5 ms GIL switch intervals.
FILL_WAIT_S = 0.01

_END = object()


class _BlockQueue:
    """A FIFO of blocks holding at most ``maxsize`` items in all (one lock, two conditions).

    Waking a thread costs far more than handing over an item (under the GIL each wake-up is a
    thread switch), so neither side is woken for every item: a consumer that found the queue
    empty is woken once it is full (the producer must wait for room) or the stream ended, and a
    producer waiting for room once the queue is down to half. A timed wait of
    :data:`FILL_WAIT_S` bounds the consumer's extra latency when the producer is slow; the
    producer's wait is a :data:`PUT_POLL_S` loop that also watches the stop flag.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.items = 0
        self._blocks: collections.deque = collections.deque()
        lock = threading.Lock()
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)
        self._low_water = maxsize // 2
        self._consumer_waiting = False
        self._producer_waiting = False
        self._final = False

    def _consumer_may_go(self) -> bool:
        return self._final or self._producer_waiting or self.items >= self.maxsize

    def put(self, block: Any, count: int, stop: threading.Event) -> bool:
        """Wait for room for ``count`` items, then append; False if ``stop`` was set meanwhile."""
        with self._not_full:
            while self.items and self.items + count > self.maxsize:
                if stop.is_set():
                    return False
                self._producer_waiting = True
                if self._consumer_waiting:
                    self._not_empty.notify()  # the queue is as full as it gets: take it
                self._not_full.wait(PUT_POLL_S)
                self._producer_waiting = False
            if stop.is_set():
                return False
            self._blocks.append((block, count))
            self.items += count
            if self._consumer_waiting and self._consumer_may_go():
                self._not_empty.notify()
            return True

    def put_final(self, message: Any) -> None:
        """Append an end-of-stream or error message; it takes no room, so it never waits."""
        with self._not_full:
            self._blocks.append((message, 0))
            self._final = True
            self._not_empty.notify()

    def get(self) -> Any:
        with self._not_empty:
            if not self._blocks or not self._consumer_may_go():
                self._consumer_waiting = True
                try:
                    while not self._blocks or not self._consumer_may_go():
                        if not self._not_empty.wait(FILL_WAIT_S) and self._blocks:
                            break  # the producer is slow: take what there is
                finally:
                    self._consumer_waiting = False
            block, count = self._blocks.popleft()
            self.items -= count
            if self._producer_waiting and self.items <= self._low_water:
                self._not_full.notify()  # room for half a queue: worth a thread switch
            return block

    def clear(self) -> None:
        with self._not_full:
            self._blocks.clear()
            self.items = 0
            self._not_full.notify_all()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _produce(upstream: Iterator[Any], queue: _BlockQueue, stop: threading.Event, n: int) -> None:
    # The thread's target holds no reference to the Prefetcher, so dropping the consumer's
    # iterator really frees it and its __del__ can stop this thread.
    message: Any = _END
    try:
        for block in upstream:
            items = block[0]
            if len(items) <= n:
                if not queue.put(block, len(items), stop):
                    return
                continue
            # A block larger than the whole queue is cut, so the bound holds for every block.
            for start in range(0, len(items), n):
                piece = (items[start:start + n], _slice_ids(block[1], start, n))
                if not queue.put(piece, len(piece[0]), stop):
                    return
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
        message = _Failure(exc)
    finally:
        close = getattr(upstream, "close", None)
        try:
            if close is not None:
                close()  # closes the readers, in the thread that was running them
        except BaseException as exc:  # noqa: BLE001
            if message is _END:
                message = _Failure(exc)
        # Sent after the upstream is closed: a consumer that sees the end finds no fd left open.
        queue.put_final(message)


def _slice_ids(ids: Optional[Any], start: int, n: int) -> Optional[Any]:
    return None if ids is None else ids[start:start + n]


class Prefetcher:
    """Run an upstream iterator of blocks in one daemon thread, at most ``n`` items ahead.

    Invariant: at most ``n`` items wait in the queue (a block is cut to fit); the producer holds
    at most one more block while it waits for room, and it checks a stop flag between puts. An
    exception raised upstream is handed over and re-raised by the consumer's ``next()`` as the
    same object: the original class, attributes and traceback (plus the consumer's frames).
    ``close()`` (also run by ``__del__``, so leaving a ``for`` loop early or dropping the
    iterator is enough) sets the flag, empties the queue and joins the thread, which closes the
    upstream iterator, and with it the readers and their file descriptors, on its way out.
    """

    def __init__(self, upstream: Iterator[Any], n: int, *, name: str = "streamio-prefetch") -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"prefetch size must be a positive int, not {n!r}")
        self._queue = _BlockQueue(n)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=_produce,
                                        args=(upstream, self._queue, self._stop, n),
                                        name=name, daemon=True)
        self._thread.start()

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        block = self._queue.get()
        if block is _END:
            self._finish()
            raise StopIteration
        if isinstance(block, _Failure):
            exc = block.exc
            self._finish()
            raise exc
        return block

    def _finish(self) -> None:
        self._done = True
        self._thread.join(CLOSE_JOIN_S)

    def close(self) -> None:
        """Stop the producer thread and close the upstream (safe to call more than once)."""
        if self.__dict__.get("_thread") is None:
            return  # __init__ failed before the thread existed
        self._done = True
        self._stop.set()
        self._queue.clear()  # wakes a producer waiting for room; drops buffered items now
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_JOIN_S)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter shutdown)
            pass

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

"""Background prefetch: one thread, one bounded queue, and a consumer that does not wait idle.

The pipeline moves items in *blocks* (the records of one chunk, or the batches cut from it) so
that no stage pays a Python call per record; the queue therefore counts items, not blocks, and
cuts a block that would not fit.

Waking a thread is the expensive part: tens of microseconds on a small VM, against well under
one for handing over a block. So the two threads hand work over as rarely as they can:

- **A consumer that finds the queue empty makes the next block itself** when the producer is not
  in the middle of one (only one thread runs the upstream at a time; a lock decides which). A
  consumer faster than its input (a loop that only counts, a model waiting on data anyway) thus
  runs the pipeline inline, with no thread switch per block, while a consumer that spends time
  on each batch (a training step) finds the queue filled by the producer.
- **The producer backs off** when the consumer had to wait for the block it was making (the
  consumer is the faster one): it sleeps for :data:`IDLE_POLL_S` before it looks again, instead
  of racing the consumer for the next block. It is woken early only when the consumer takes
  from a queue that the producer had filled (room for half of it again).
- **The queue can size itself** (``n=None``): from :data:`AUTO_START` items it doubles each time
  the consumer had to wait for the producer, up to :data:`AUTO_MAX_ITEMS` items and
  :data:`AUTO_MAX_BYTES` bytes.

No wait is silent: a consumer waiting for the producer's block logs (logger ``streamio``) after
``WAIT_LOG_AFTER_S`` and fails if the producer thread is gone (a forked child); a ``close()``
that leaves the thread running after :data:`CLOSE_JOIN_S` says so.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Iterator, Optional

from ..errors import UsageError
from .._util import WaitLog

logger = logging.getLogger("streamio")

__all__ = ["AUTO_MAX_BYTES", "AUTO_MAX_ITEMS", "AUTO_START", "CLOSE_JOIN_S", "IDLE_POLL_MAX_S",
           "IDLE_POLL_S", "PUT_POLL_S", "Prefetcher"]

#: How often a producer blocked on a full queue looks at the stop flag. Small enough that
#: ``close()`` returns promptly, large enough that an idle wait costs nothing measurable.
PUT_POLL_S = 0.05
#: How long a producer that found the consumer faster than itself stays away before it looks
#: at the queue again: one CPython GIL switch interval at first, doubling (up to
#: :data:`IDLE_POLL_MAX_S`) while it keeps finding the consumer making blocks itself, since each
#: look costs a GIL hand-over. A consumer that starts spending time on its batches has the
#: producer filling the queue again within that long, and the interval starts over.
IDLE_POLL_S = 0.005
IDLE_POLL_MAX_S = 0.04
#: How long ``close()`` waits for the producer thread to finish. A producer waiting for room
#: sees the stop flag at once; one busy with a block finishes it first (milliseconds). Only a
#: producer blocked reading a silent source (a FIFO whose writer stalls) takes longer: close()
#: then returns anyway, and the daemon thread closes the reader as soon as its read returns
#: (the source's ``read_timeout`` bounds that).
CLOSE_JOIN_S = 5.0
#: A self-sizing queue (``n=None``) starts this large ...
AUTO_START = 2
#: ... and grows (doubling) while the consumer keeps waiting for the producer, up to this many
#: items ...
AUTO_MAX_ITEMS = 256
#: ... and this many bytes of items (measured with the Prefetcher's ``size_of``).
AUTO_MAX_BYTES = 64 << 20

_END = object()
_GONE = ("prefetch: the prefetch thread is gone while it was making a block (the process was"
         " forked while it ran, and threads do not survive a fork): the block will never come;"
         " iterate the Dataset anew in this process")


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Shared:
    """The upstream, the queue and the flags both threads use, under one lock.

    The producer thread's target is :meth:`produce`, a method of this object, not of the
    Prefetcher: dropping the consumer's iterator then really frees the Prefetcher, and its
    ``__del__`` stops the thread.
    """

    def __init__(self, upstream: Iterator[Any], maxsize: int, auto: bool,
                 size_of: Optional[Callable[[Any], int]]) -> None:
        self.upstream = upstream
        self.maxsize = maxsize
        self.auto = auto
        self.size_of = size_of if auto else None
        self.item_bytes = 1  # the most bytes per item seen (auto only)
        self.blocks: collections.deque = collections.deque()
        self.items = 0
        # Re-entrant: the producer allocates under it, and a garbage collection there may run
        # the finalizer of its own Prefetcher (dropped inside a cycle), whose close() takes it.
        lock = threading.RLock()
        self.ready = threading.Condition(lock)  # the consumer waits here for the producer
        self.room = threading.Condition(lock)  # the producer waits here for room or its turn
        self.busy = False  # a thread is running the upstream
        self.finished = False  # the upstream ended (or failed); no more blocks will be made
        self.stop = False
        self.consumer_waiting = False
        self.producer_waiting = False  # for room in a full queue
        self.backoff = False
        self.idle_poll = IDLE_POLL_S
        self.thread: Optional[threading.Thread] = None  # the producer (set once started)

    # -- the consumer's side ------------------------------------------------------------------
    def take(self) -> Any:
        """The next block, from the queue or made here; ``_END`` or a ``_Failure`` at the end."""
        log = None
        with self.ready:
            while True:
                if self.blocks:
                    block, count = self.blocks.popleft()
                    self.items -= count
                    if self.producer_waiting and self.items <= self.maxsize // 2:
                        self.room.notify()  # room for half a queue: worth a thread switch
                    return block
                if self.finished:
                    return _END
                if not self.busy:
                    self.busy = True  # the upstream is free: make the block here
                    break
                # The producer is making a block: wait for it (it notifies when done).
                if self.auto:
                    self._grow()
                if log is None:
                    log = WaitLog(self._waiting)
                elif self.thread is not None and not self.thread.is_alive():
                    return _Failure(UsageError(_GONE))  # busy for ever: nothing will notify
                log.tick()
                self.consumer_waiting = True
                try:
                    self.ready.wait(PUT_POLL_S)
                finally:
                    self.consumer_waiting = False
        try:
            block = next(self.upstream)
        except BaseException as exc:  # noqa: BLE001 - StopIteration included: the end
            self._end_here()
            return _END if isinstance(exc, StopIteration) else _Failure(exc)
        with self.ready:
            self.busy = False
        return block

    def _waiting(self, waited: float) -> str:
        name = "?" if self.thread is None else self.thread.name
        return (f"prefetch: waiting for the next block from the prefetch thread ({name}), for"
                f" {waited:.0f} s so far: it is still reading or decoding upstream (a wait on a"
                " source is logged by the source, with the timeout that ends it); this ends"
                " when the block is made or the upstream fails")

    def _end_here(self) -> None:
        # The upstream ended in the consumer's thread (its generators have closed the readers):
        # the producer has nothing left to do.
        with self.ready:
            self.busy = False
            self.finished = True
            self.stop = True
            self.room.notify_all()

    def close(self) -> None:
        with self.ready:
            self.stop = True
            self.blocks.clear()  # drops buffered items now
            self.items = 0
            self.room.notify_all()

    # -- the producer thread ------------------------------------------------------------------
    def produce(self) -> None:
        message: Any = _END
        mine = False  # whether this thread holds the upstream (busy) right now
        try:
            while True:
                with self.room:
                    if not self._my_turn():
                        return
                    self.busy = mine = True
                block = next(self.upstream, _END)
                if block is _END:
                    return
                if not self._put(block):
                    return
                with self.room:
                    self.busy = mine = False
                    if self.consumer_waiting:
                        self.ready.notify()  # it waits for the upstream, not for a block
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            message = _Failure(exc)
        finally:
            with self.room:
                closing = mine or not self.busy  # never close under a consumer's feet
                self.busy = True
            try:
                if closing:
                    close = getattr(self.upstream, "close", None)
                    if close is not None:
                        close()  # closes the readers, in the thread that was running them
            except BaseException as exc:  # noqa: BLE001
                if message is _END:
                    message = _Failure(exc)
            with self.ready:
                # Queued after the upstream is closed: a consumer that sees the end finds no
                # fd left open.
                if not self.finished:
                    self.blocks.append((message, 0))
                self.finished = True
                self.busy = False
                self.ready.notify_all()

    def _my_turn(self) -> bool:
        """Wait until the producer should make a block: the upstream is free, the queue has
        room, and the consumer has not just shown itself faster. False once stopped."""
        while not self.stop and (self.busy or self.items >= self.maxsize or self.backoff):
            if self.backoff or self.busy:
                # The consumer made (or waited for) the last block: look again later, and
                # later still if it is still at it then.
                self.backoff = False
                self.room.wait(self.idle_poll)
                if self.busy:
                    self.idle_poll = min(IDLE_POLL_MAX_S, self.idle_poll * 2)
            else:
                self.producer_waiting = True
                self.room.wait(PUT_POLL_S)
                self.producer_waiting = False
        return not self.stop and not self.finished

    def _put(self, block: Any) -> bool:
        """Queue a block, cut to fit, waiting for room; False once stopped."""
        items = block[0]
        if self.size_of is not None and items:
            # One item stands for the block: measuring every item would cost per item.
            self._measure(self.size_of(items[0]) * len(items), len(items))
        n = self.maxsize
        pieces = [block] if len(items) <= n else [
            (items[start:start + n], _slice_ids(block[1], start, n))
            for start in range(0, len(items), n)]
        for piece in pieces:
            count = len(piece[0])
            with self.room:
                while self.items and self.items + count > self.maxsize and not self.stop:
                    self.producer_waiting = True
                    self.room.wait(PUT_POLL_S)
                    self.producer_waiting = False
                if self.stop:
                    return False
                self.blocks.append((piece, count))
                self.items += count
                if self.consumer_waiting:
                    # The consumer waited for this block: it is the faster side, so let it make
                    # the next one itself rather than wait for this thread again.
                    self.backoff = True
                    self.ready.notify()
                else:
                    self.idle_poll = IDLE_POLL_S  # made ahead of need: this thread is useful
        return True

    def _measure(self, nbytes: int, count: int) -> None:
        per_item = -(-nbytes // max(1, count))
        if per_item > self.item_bytes:
            with self.room:
                self.item_bytes = per_item
                self.maxsize = max(AUTO_START, min(self.maxsize, AUTO_MAX_BYTES // per_item))

    def _grow(self) -> None:
        cap = max(AUTO_START, min(AUTO_MAX_ITEMS, AUTO_MAX_BYTES // self.item_bytes))
        self.maxsize = min(cap, self.maxsize * 2)


def _slice_ids(ids: Optional[Any], start: int, n: int) -> Optional[Any]:
    return None if ids is None else ids[start:start + n]


class Prefetcher:
    """Run an upstream iterator of blocks ahead of the consumer, in a daemon thread, at most
    ``n`` items ahead; a consumer that would otherwise wait makes the next block itself.

    Blocks are ``(items, ids)`` pairs (``ids``: None, or a sequence parallel to ``items``).
    Only one thread runs the upstream at a time, so blocks come out in order, each once. See
    the module's docstring for how the two threads share the work. ``n=None`` sizes the queue
    itself: from :data:`AUTO_START` items, doubling while the consumer waits for the producer,
    up to :data:`AUTO_MAX_ITEMS` items and :data:`AUTO_MAX_BYTES` bytes as ``size_of(item)``
    counts them (the first item of each block stands for all of it); without ``size_of`` only
    the item cap applies.

    Invariant: at most ``n`` (the current size) items wait in the queue (the producer cuts a
    block to fit); the producer holds at most one more block while it waits for room, and it
    checks a stop flag between puts. An exception raised upstream, in either thread, reaches the
    consumer's ``next()`` as the same object: the original class, attributes and traceback.
    ``close()`` (also run by ``__del__``, so leaving a ``for`` loop early or dropping the
    iterator is enough) sets the flag, empties the queue and joins the thread, which closes the
    upstream iterator, and with it the readers and their file descriptors, on its way out.
    """

    def __init__(self, upstream: Iterator[Any], n: Optional[int] = None, *,
                 size_of: Optional[Callable[[Any], int]] = None,
                 name: str = "streamio-prefetch") -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise UsageError(f"prefetch size must be a positive int or None, not {n!r}")
        auto = n is None
        self._shared = _Shared(upstream, AUTO_START if auto else n, auto, size_of)
        self._done = False
        self._left_running = False  # close() has said that the thread outlived it
        self._thread = threading.Thread(target=self._shared.produce, name=name, daemon=True)
        self._shared.thread = self._thread
        self._thread.start()

    @property
    def size(self) -> int:
        """The queue's current bound in items (fixed, or where auto sizing has taken it)."""
        return self._shared.maxsize

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        block = self._shared.take()
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
        self._join()

    def close(self) -> None:
        """Stop the producer thread and close the upstream (safe to call more than once)."""
        if self.__dict__.get("_thread") is None:
            return  # __init__ failed before the thread existed
        self._done = True
        self._shared.close()
        if self._thread is not threading.current_thread():
            self._join()

    def _join(self) -> None:
        """Wait up to :data:`CLOSE_JOIN_S` for the producer to end; if it has not, say so (once)
        and let it end on its own (a daemon thread, blocked in an upstream read)."""
        thread = self._thread
        if not thread.is_alive():
            return
        thread.join(CLOSE_JOIN_S)
        if thread.is_alive() and not self._left_running:
            self._left_running = True
            logger.warning("prefetch: the prefetch thread (%s) has not ended %g s after it was"
                           " told to stop: it is blocked upstream (a source read: the source's"
                           " read_timeout bounds it), and closes its sources when that returns;"
                           " going on without it", thread.name, CLOSE_JOIN_S)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter shutdown)
            pass

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

"""Random order under a memory bound: the record shuffle buffer and batch shuffling.

A :class:`ShuffleBuffer` takes items in arrival order and hands them back in random order, each
exactly once. It holds at most ``buffer_size`` items and, if asked, at most ``buffer_bytes``
bytes. Full, it works as the textbook buffer: each arrival takes the slot of a uniformly chosen
item, which is emitted. Below a bound it grows; over one (an arrival of large items against the
byte bound) it emits uniformly chosen items, the last item moving into each emptied slot (swap
with last, O(1)), until it is within both. Nothing is ever shifted.

Batch shuffling (``Dataset.shuffle_batches``) is the same buffer over whole batches.

Seeds are derived, never taken from time or pid: :func:`derive_rng` turns
``(seed, epoch, rank, worker, stage)`` into an independent ``numpy`` generator, so the same seed
replays the same orders and every epoch (and worker) gets its own.
"""

from __future__ import annotations

import bisect
import itertools
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import UsageError

__all__ = ["DEFAULT_BLOCK", "NUMPY_MIN_BUFFER", "ShuffleBuffer", "derive_rng", "estimate_nbytes",
           "new_seed"]

#: Buffers at least this large move items with numpy fancy indexing on object arrays (C loops);
#: smaller ones use a plain Python loop, which is cheaper than numpy's per-call overhead when only
#: a few items are exchanged at a time (batch shuffling, tiny record buffers).
NUMPY_MIN_BUFFER = 1024
#: Arrivals handled per numpy step. They are re-cut into blocks of this many items (and, with a
#: byte bound, at most a quarter of it), so the order depends on the seed and the item sequence
#: only, never on how a pipe or socket happened to split the stream into chunks. 2048 amortises
#: numpy's per-call overhead (a few us) to a few ns per item; a block is also at most a quarter
#: of the buffer, which bounds the extra memory while a block is merged.
DEFAULT_BLOCK = 2048
_RANDOM_BLOCK = 1024  # uniform floats drawn per call on the Python path
_NO_IDS = np.zeros(0, np.int64)


def new_seed() -> int:
    """A fresh 64-bit seed from the OS (used once, when a Dataset with ``seed=None`` is built)."""
    return int.from_bytes(os.urandom(8), "little")


def derive_rng(seed: int, *, epoch: int, rank: int = 0, worker: int = 0,
               stage: int = 0) -> np.random.Generator:
    """An independent generator for one stage of one epoch on one (rank, worker).

    ``numpy.random.SeedSequence`` mixes the spawn key into the entropy, so neighbouring keys
    (epoch 0 and 1, worker 0 and 1) give statistically independent streams.
    """
    seq = np.random.SeedSequence(int(seed), spawn_key=(int(epoch), int(rank), int(worker),
                                                       int(stage)))
    return np.random.Generator(np.random.PCG64(seq))


def estimate_nbytes(item: Any) -> int:
    """The memory an item holds, as far as it can be told cheaply.

    ``bytes`` count their length; a raw batch (a list of records) the sum; a decoded batch the
    ``nbytes`` of its arrays (a :class:`SparseBatch` its three arrays). Object arrays count their
    pointers only: an estimate, as the option's name says.
    """
    if isinstance(item, (bytes, bytearray, memoryview)):
        return len(item)
    if isinstance(item, (list, tuple)):
        return sum(estimate_nbytes(x) for x in item)
    if isinstance(item, dict):
        return sum(estimate_nbytes(v) for v in item.values())
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    parts = [getattr(item, name, None) for name in ("indptr", "indices", "values")]
    if all(isinstance(p, np.ndarray) for p in parts):
        return sum(p.nbytes for p in parts)
    return 0


class ShuffleBuffer:
    """Hand items back in random order, each exactly once, holding a bounded number of them.

    ``push(items)`` adds items in arrival order and returns the ones the buffer lets go;
    ``drain()`` returns everything left, in random order, at the end of the stream. Between
    calls the buffer holds at most ``buffer_size`` items and at most ``buffer_bytes`` bytes
    (``size_of(item)`` each; ``len`` for records). An item larger than ``buffer_bytes`` on its
    own passes straight through.

    The rule, once the buffer is full, is the textbook one: each arrival takes the slot of a
    uniformly chosen item, which is emitted. Before that (and whenever the buffer is over its
    byte bound) an arrival joins the buffer and, while it is over a bound, a uniformly chosen
    item is emitted and the last item moves into its slot (swap with last, O(1)). Buffers of
    at least :data:`NUMPY_MIN_BUFFER` items apply the rule to blocks of up to ``block``
    arrivals with a few numpy calls (see ``_ExchangePlan``; the optional C accelerator's
    ``shuffle_exchange`` runs the same loop). Blocks are cut by count, and with a byte bound by
    bytes too, never by how the input happened to be chunked, so a seed fixes the order.

    ``initial``: until the buffer first reaches a bound, it emits nothing while it holds fewer
    than ``initial`` items, and then one item for every two that arrive (it keeps filling while
    the first items already flow); ``None`` waits for a full buffer.

    ``ids`` (optional, one int per item) travel with their items, so a caller can tell where an
    emitted item came from (the pipeline uses it to name the record in a decode error).
    """

    def __init__(self, buffer_size: int, *, rng: np.random.Generator,
                 buffer_bytes: Optional[int] = None, initial: Optional[int] = None,
                 size_of: Callable[[Any], int] = len, block: int = DEFAULT_BLOCK) -> None:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise UsageError(f"buffer_size must be a positive int, not {buffer_size!r}")
        if buffer_bytes is not None and (isinstance(buffer_bytes, bool)
                                         or not isinstance(buffer_bytes, int) or buffer_bytes < 1):
            raise UsageError(f"buffer_bytes must be a positive int or None, not {buffer_bytes!r}")
        if initial is not None and (isinstance(initial, bool) or not isinstance(initial, int)
                                    or initial < 0):
            raise UsageError(f"initial must be a non-negative int or None, not {initial!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise UsageError(f"block must be a positive int, not {block!r}")
        self.buffer_size = buffer_size
        self.buffer_bytes = buffer_bytes
        self.initial = initial
        self._rng = rng
        self._size_of = size_of
        self._limit_bytes = buffer_bytes if buffer_bytes is not None else float("inf")
        self._filled = initial is None  # "filled" once a bound has been reached
        self._owed = 0  # arrivals in the initial phase not yet matched by an emission
        self._nbytes = 0
        self._numpy = buffer_size >= NUMPY_MIN_BUFFER
        if self._numpy:
            self._block = min(block, max(1, buffer_size // 4))
            cap = buffer_size + self._block
            self._buf = np.empty(cap, dtype=object)
            self._ids = np.zeros(cap, dtype=np.int64)
            self._track = False  # ids given: carry them (costs a few numpy calls per block)
            self._sizes = np.zeros(cap, dtype=np.int64) if buffer_bytes is not None else None
            self._n = 0
            self._staged: list = []  # arrivals waiting for a whole block
            self._staged_ids = _NO_IDS
            self._staged_sizes: list = []
            self._staged_bytes = 0
            # With a byte bound, a block also ends once it holds a quarter of it: staged items
            # are held memory too, so 100 KB records must not wait for 2048 of them.
            self._block_bytes = max(1, buffer_bytes // 4) if buffer_bytes is not None else None
        else:
            self._items: list = []
            self._item_ids: list = []
            self._item_sizes: list = []
            self._uniform: list = []

    # -- public -----------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._numpy:
            return self._n + len(self._staged)
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes held (``size_of`` summed; 0 when ``buffer_bytes`` is None: not tracked)."""
        if self._numpy:
            return int(self._nbytes) + self._staged_bytes
        return int(self._nbytes)

    @property
    def block(self) -> int:
        """Items taken in per step: 1 on the Python path, else up to :data:`DEFAULT_BLOCK`."""
        return self._block if self._numpy else 1

    def push(self, items: Sequence[Any], ids: Optional[Sequence[int]] = None) -> tuple[list, Any]:
        """Add ``items``; return ``(emitted, emitted_ids)`` (``emitted_ids`` None without ids)."""
        if not len(items):
            return [], (None if ids is None else np.zeros(0, np.int64))
        if self._numpy:
            emitted, emitted_ids = _concat(*self._push_numpy(items, ids))
            return emitted, (emitted_ids if ids is not None else None)
        return self._push_python(items, ids)

    def push_pieces(self, items: Sequence[Any],
                    ids: Optional[Sequence[int]] = None) -> list[tuple[list, Any]]:
        """:meth:`push`, with the emitted items as a list of ``(items, ids)`` pieces in order.

        The same items in the same order; a caller that can take them piece by piece (the
        pipeline) saves joining them: a copy that touches the reference count of every emitted
        item, which after shuffling lie scattered in memory.
        """
        if not len(items):
            return []
        if not self._numpy:
            return [self._push_python(items, ids)]
        outs, out_ids = self._push_numpy(items, ids)
        if ids is None:
            return [(o, None) for o in outs if o]
        return [(o, oi) for o, oi in zip(outs, out_ids) if o]

    def drain(self) -> tuple[list, Any]:
        """Everything still held, in random order (call once, at the end of the stream)."""
        if self._numpy:
            out, out_ids = [], []
            if self._staged:
                items, ids, sizes = self._staged, self._staged_ids, self._staged_sizes
                self._staged, self._staged_ids, self._staged_sizes = [], _NO_IDS, []
                self._staged_bytes = 0
                emitted, emitted_ids = self._step(items, ids, sizes)
                out.append(emitted)
                out_ids.append(emitted_ids)
            n = self._n
            perm = self._rng.permutation(n)
            out.append(self._buf[:n][perm].tolist())
            out_ids.append(self._ids[:n][perm] if self._track else _NO_IDS)
            self._buf[:n] = None  # drop our references: memory goes back now
            self._n = 0
            self._nbytes = 0
            return _concat(out, out_ids)
        items, ids = self._items, self._item_ids
        perm = self._rng.permutation(len(items)).tolist()
        out = [items[i] for i in perm]
        out_ids = np.array([ids[i] for i in perm], dtype=np.int64) if ids else np.zeros(0, np.int64)
        self._items, self._item_ids, self._item_sizes = [], [], []
        self._nbytes = 0
        return out, out_ids

    # -- Python path: one arrival at a time ---------------------------------------------------
    def _random_index(self, n: int) -> int:
        # Uniform floats drawn in blocks: one numpy call per _RANDOM_BLOCK removals, not per item.
        if not self._uniform:
            self._uniform = self._rng.random(_RANDOM_BLOCK).tolist()
        return int(self._uniform.pop() * n)

    def _push_python(self, items, ids) -> tuple[list, Any]:
        buf, buf_ids, sizes = self._items, self._item_ids, self._item_sizes
        track_bytes = self.buffer_bytes is not None
        size_of = self._size_of
        limit_n, limit_b = self.buffer_size, self._limit_bytes
        initial = self.initial
        out: list = []
        out_ids: list = []
        for j, item in enumerate(items):
            item_id = 0 if ids is None else int(ids[j])
            size = size_of(item) if track_bytes else 0
            if self._filled and len(buf) >= limit_n:
                # Full: the arrival takes the slot of a uniformly chosen item, which leaves.
                i = self._random_index(len(buf))
                out.append(buf[i])
                out_ids.append(buf_ids[i])
                buf[i] = item
                buf_ids[i] = item_id
                if track_bytes:
                    self._nbytes += size - sizes[i]
                    sizes[i] = size
            else:
                buf.append(item)
                buf_ids.append(item_id)
                if track_bytes:
                    sizes.append(size)
                    self._nbytes += size
                if not self._filled:
                    if len(buf) >= limit_n or self._nbytes > limit_b:
                        self._filled = True
                    else:
                        if len(buf) >= initial:
                            self._owed += 1
                            if self._owed == 2:
                                self._owed = 0
                                self._remove_python(out, out_ids)
                        continue
            while len(buf) > limit_n or (self._nbytes > limit_b and buf):
                self._remove_python(out, out_ids)
        return out, (np.array(out_ids, dtype=np.int64) if ids is not None else None)

    def _remove_python(self, out: list, out_ids: list) -> None:
        buf, buf_ids, sizes = self._items, self._item_ids, self._item_sizes
        i = self._random_index(len(buf))
        # Swap with last: the emptied slot takes the last item, so removal is O(1).
        out.append(buf[i])
        out_ids.append(buf_ids[i])
        last = buf.pop()
        last_id = buf_ids.pop()
        if i < len(buf):
            buf[i] = last
            buf_ids[i] = last_id
        if sizes:
            self._nbytes -= sizes[i]
            last_size = sizes.pop()
            if i < len(sizes):
                sizes[i] = last_size

    # -- numpy path: blocks of self._block arrivals ---------------------------------------------
    def _push_numpy(self, items, ids) -> tuple[list, list]:
        """Add ``items``; return the emitted pieces: a list of item lists and one of id arrays."""
        if ids is not None:
            self._track = True
            ids = np.asarray(ids, dtype=np.int64)
        # The pool is what waits for a block: staged leftovers plus the arrival. Without
        # leftovers the arrival itself is the pool (no copy: this is the common case).
        if self._staged:
            pool = self._staged
            pool.extend(items)
            pool_ids = self._staged_ids
            if ids is not None:
                pool_ids = np.concatenate([pool_ids, ids])
        else:
            pool = items if isinstance(items, list) else list(items)
            pool_ids = ids if ids is not None else _NO_IDS
        if self._block_bytes is not None:
            sizes = list(map(self._size_of, items))
            self._staged_sizes.extend(sizes)
            self._staged_bytes += sum(sizes)
        out, out_ids = [], []
        start = 0
        while True:
            end = self._block_end(pool, start)
            if not end:
                break
            block_sizes = self._staged_sizes[start:end] if self._block_bytes is not None else []
            emitted, emitted_ids = self._step(pool[start:end], pool_ids[start:end], block_sizes)
            out.append(emitted)
            out_ids.append(emitted_ids)
            self._staged_bytes -= sum(block_sizes)
            start = end
        self._staged = pool[start:]
        self._staged_ids = pool_ids[start:].copy()  # not a view into the caller's array
        if self._block_bytes is not None:
            del self._staged_sizes[:start]
        return out, out_ids

    def _block_end(self, pool: list, start: int) -> int:
        """Where the next block of ``pool[start:]`` ends (0: not enough items yet).

        The cut depends only on the item sequence (counts and sizes), never on how items were
        split between calls, so the same seed gives the same order whatever the chunking.
        """
        count = len(pool) - start
        block = self._block
        if self._block_bytes is None or self._staged_bytes < self._block_bytes:
            return start + block if count >= block else 0
        cumulative = list(itertools.accumulate(self._staged_sizes[start:start + block]))
        cut = bisect.bisect_left(cumulative, self._block_bytes)
        return start + (cut + 1 if cut < len(cumulative) else block)

    def _step(self, items: list, ids: np.ndarray, item_sizes: list) -> tuple[list, np.ndarray]:
        """Add one block, then emit until within bounds (or as the initial phase allows)."""
        k = len(items)
        n = self._n
        if self._filled and n == self.buffer_size and k <= n:
            return self._exchange(items, ids, item_sizes)
        total = n + k
        buf = self._buf
        buf[n:total] = np.fromiter(items, dtype=object, count=k)  # fromiter: lists stay items
        if self._track:
            self._ids[n:total] = ids if len(ids) else 0
        sizes = self._sizes
        if sizes is not None:
            sizes[n:total] = item_sizes
            self._nbytes += sum(item_sizes)
        self._n = total
        emit = max(0, total - self.buffer_size)
        if not self._filled:
            if emit or self._nbytes > self._limit_bytes:
                self._filled = True
            else:
                # Initial phase: one emission per two arrivals once `initial` items are held.
                eligible = min(k, total - self.initial + 1) if total >= self.initial else 0
                self._owed += max(0, eligible)
                emit, self._owed = divmod(self._owed, 2)
        outs, out_ids = [], []
        if emit:
            sel = self._rng.choice(total, emit, replace=False)  # a random subset, random order
            o, oi = self._remove_numpy(sel)
            outs.append(o)
            out_ids.append(oi)
        if self._filled and self._nbytes > self._limit_bytes:
            o, oi = self._remove_until_within_bytes()
            outs.append(o)
            out_ids.append(oi)
        return _concat(outs, out_ids)

    def _exchange(self, items: list, ids: np.ndarray, item_sizes: list) -> tuple[list, np.ndarray]:
        """The steady state of a full buffer, exactly the one-at-a-time rule: for each arrival
        in turn, emit the item in a uniformly chosen slot and put the arrival there."""
        k = len(items)
        slots = self._rng.integers(0, self._n, size=k)
        plan = None
        if _FAST_EXCHANGE is not None:
            out = _FAST_EXCHANGE(self._buf, slots, items)
        else:
            plan = _ExchangePlan(slots, self._n)
            out = plan.apply(self._buf, np.fromiter(items, dtype=object, count=k)).tolist()
        if _FAST_EXCHANGE_INT64 is not None:
            def move(a: np.ndarray, new: np.ndarray) -> np.ndarray:
                # ids and sizes move the same way, by the same loop in C: no sort of the slots.
                emitted = np.empty(k, np.int64)
                _FAST_EXCHANGE_INT64(a, slots, np.ascontiguousarray(new, np.int64), emitted)
                return emitted
        else:
            def move(a: np.ndarray, new: np.ndarray) -> np.ndarray:
                nonlocal plan
                if plan is None:
                    plan = _ExchangePlan(slots, self._n)
                return plan.apply(a, new)
        out_ids = _NO_IDS
        if self._track:
            new_ids = ids if len(ids) else np.zeros(k, np.int64)
            out_ids = move(self._ids, new_ids)
        sizes = self._sizes
        if sizes is not None:
            emitted = move(sizes, np.asarray(item_sizes, dtype=np.int64))
            self._nbytes += sum(item_sizes) - int(emitted.sum())
            if self._nbytes > self._limit_bytes:
                more, more_ids = self._remove_until_within_bytes()
                return _concat([out, more], [out_ids, more_ids])
        return out, out_ids

    def _remove_until_within_bytes(self) -> tuple[list, np.ndarray]:
        outs, out_ids = [], []
        while self._n and self._nbytes > self._limit_bytes:
            n = self._n
            over = self._nbytes - self._limit_bytes
            # Guess how many to take from the mean size, draw that many in random order, and keep
            # the shortest prefix that is enough: a prefix of a random ordering is itself one.
            mean = max(1.0, self._nbytes / n)
            guess = min(n, max(1, int(over / mean) + 1))
            sel = self._rng.choice(n, guess, replace=False)
            freed = np.cumsum(self._sizes[sel])
            need = int(np.searchsorted(freed, over, side="left")) + 1
            o, oi = self._remove_numpy(sel[:min(need, guess)])
            outs.append(o)
            out_ids.append(oi)
        return _concat(outs, out_ids)

    def _remove_numpy(self, sel: np.ndarray) -> tuple[list, np.ndarray]:
        """Emit the items at positions ``sel`` (in that order) and close the gaps they leave."""
        buf, ids, sizes = self._buf, self._ids, self._sizes
        total = self._n
        out = buf[sel].tolist()
        out_ids = ids[sel] if self._track else _NO_IDS
        if sizes is not None:
            self._nbytes -= int(sizes[sel].sum())
        keep = total - len(sel)
        # Gaps below `keep` are filled from the survivors above it (swap with last, in bulk).
        chosen = np.zeros(total - keep, dtype=bool)
        high = sel[sel >= keep]
        chosen[high - keep] = True
        holes = sel[sel < keep]
        fillers = np.flatnonzero(~chosen) + keep
        buf[holes] = buf[fillers]
        if self._track:
            ids[holes] = ids[fillers]
        if sizes is not None:
            sizes[holes] = sizes[fillers]
        buf[keep:total] = None  # release emitted items: the bound is on what we reference
        self._n = keep
        return out, out_ids


class _ExchangePlan:
    """``for j: out[j] = a[slots[j]]; a[slots[j]] = new[j]`` in order, as a few numpy calls.

    Draws that hit a slot already drawn in the same block emit what the earlier draw put there,
    exactly as the loop would; one stable sort of the slots finds those repeats. The plan is
    computed once and applied to the items and to any parallel arrays (ids, sizes).
    """

    __slots__ = ("slots", "distinct", "repeat_j", "previous_j", "last_j", "last_slots")

    def __init__(self, slots: np.ndarray, n: int) -> None:
        self.slots = slots
        # Slot numbers below 2**16 sort with numpy's O(k) radix sort.
        key = slots.astype(np.uint16) if n <= 0xFFFF else slots
        order = np.argsort(key, kind="stable")
        ordered = slots[order]
        first = np.empty(len(slots), dtype=bool)
        first[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
        self.distinct = bool(first.all())
        if not self.distinct:
            repeat = np.flatnonzero(~first)
            self.repeat_j = order[repeat]
            self.previous_j = order[repeat - 1]
            last = np.empty(len(slots), dtype=bool)
            last[-1:] = True
            last[:-1] = first[1:]
            self.last_j = order[last]
            self.last_slots = slots[self.last_j]

    def apply(self, a: np.ndarray, new: np.ndarray) -> np.ndarray:
        out = a[self.slots]
        if self.distinct:
            a[self.slots] = new
        else:
            out[self.repeat_j] = new[self.previous_j]
            a[self.last_slots] = new[self.last_j]
        return out


def _fast_exchange_kernel(name: str = "shuffle_exchange") -> Optional[Callable[..., Any]]:
    # The same loop in C, when the optional accelerator provides it: same slots, same result.
    try:
        from .. import _speedups
    except ImportError:
        return None
    return getattr(_speedups, name, None)


_FAST_EXCHANGE = _fast_exchange_kernel()
# Its int64 twin, for the ids and sizes that travel with the items.
_FAST_EXCHANGE_INT64 = _fast_exchange_kernel("shuffle_exchange_int64")


def _concat(outs: list, out_ids: list) -> tuple[list, np.ndarray]:
    if not outs:
        return [], _NO_IDS
    if len(outs) == 1:
        return outs[0], out_ids[0]
    items: list = []
    for o in outs:
        items.extend(o)
    return items, np.concatenate(out_ids)

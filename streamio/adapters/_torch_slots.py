"""Batches from a DataLoader worker to the main process through a ring of shared-memory slots.

Each DataLoader worker allocates one ring, once (a torch shared-memory tensor: a segment created
``0600`` with an unpredictable name and unlinked at once, or an anonymous one; torch passes its
file descriptor), and copies each batch's fixed-dtype tensors into a free slot of it when the
batch is pickled into the DataLoader's result queue. Only a small descriptor crosses the pipe:
the slot, where each tensor lies in it, and the batch's other values (lists of bytes, sparse
tensors), which travel as they do without the ring. The ring itself rides with the descriptors
until the main process says it has mapped it (a byte in the ring's header), so no descriptor
depends on an earlier one having been read.

In the main process the tensors are views of the mapped slot; when the last of them is released
(a weak reference to the slot's array, which their storage keeps alive) the main process
clears the slot's byte in the header and the worker may reuse it. A worker that finds no free
slot (the main process still holds all of them), a batch larger than a slot can be, or a batch
outside a DataLoader worker goes the older way (:class:`._torch_transport._PipeBatch`): a
slot is never reused while a tensor over it lives, and a worker never waits for one.

Nothing is unpickled from shared memory: the descriptors come through the DataLoader's pipe;
the ring holds only the tensors' bytes and the header's flags.
"""

from __future__ import annotations

import os
import secrets
import weakref
from typing import Any, Optional

import numpy as np

from ..errors import StreamioError
from ._torch_transport import _PIPE_ALIGN, _PipeBatch, torch

#: Slots per worker's ring: more than the batches a DataLoader keeps in flight per worker
#: (``prefetch_factor``, 2 by default), the one being used, a pin-memory thread's and a
#: ``to_device`` prefetcher's (``depth``); a worker that finds them all held sends the batch the
#: older way rather than wait.
SLOTS = 16
#: A ring's size limit (shared memory, touched only as slots are used): fewer slots for larger
#: batches, and batches over 64 MiB (a slot each of at least 4) go the older way, where torch's
#: per-tensor cost is small beside the copy.
RING_BYTES = 256 << 20
_MIN_SLOTS = 4
# The header: one byte per slot (1: filled by the worker, not yet released by the main process),
# and at _MAPPED a byte the main process sets once it has mapped the ring.
_HEADER = 4096
_MAPPED = 2048
_PAGE = 4096


class _Ring:
    """One worker's ring: ``slots`` slots of ``slot_bytes`` after a header (see the module)."""

    def __init__(self, slot_bytes: int) -> None:
        self.slot_bytes = -(-slot_bytes // _PAGE) * _PAGE
        self.slots = max(_MIN_SLOTS, min(SLOTS, RING_BYTES // self.slot_bytes))
        # Made shared from the start (share_memory_() would copy, touching every page): the
        # kernel zeroes the pages, so the header starts with every slot free.
        storage = torch.UntypedStorage._new_shared(_HEADER + self.slots * self.slot_bytes)
        self.tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.array = self.tensor.numpy()
        self.token = secrets.token_hex(8)
        self.pid = os.getpid()
        self._next = 0
        # Batch layouts seen (see _plan): most batches of an epoch share one.
        self.plans: dict = {}

    def claim(self) -> Optional[int]:
        """A free slot, now marked as filled; None if the main process holds every slot."""
        flags = self.array
        for i in range(self.slots):
            k = (self._next + i) % self.slots
            if not flags[k]:
                flags[k] = 1
                self._next = k + 1
                return k
        return None


_ring: Optional[_Ring] = None


def _worker_ring(size: int) -> Optional[_Ring]:
    """This worker's ring, made (or remade with larger slots) for a batch of ``size`` bytes;
    None outside a DataLoader worker or for a batch too large for a ring."""
    global _ring
    if torch.utils.data.get_worker_info() is None:
        return None
    ring = _ring
    if ring is not None and ring.pid == os.getpid() and size <= ring.slot_bytes:
        return ring
    if size * _MIN_SLOTS > RING_BYTES:
        return None
    # A quarter to spare: the last batch of a share is smaller, but a batch of variable-length
    # fixed-dtype columns may be a little larger than the first.
    _ring = _Ring(size + size // 4)
    return _ring


def _layout(batch: dict) -> Optional[tuple]:
    """``(layout, rest, arrays, size)``: where each dense CPU tensor of ``batch`` goes in one
    buffer (name, numpy dtype string, shape, offset, nbytes), the other values, and the tensors
    as numpy arrays (views, no copy); None when a tensor has no numpy view (bfloat16, one that
    requires grad): such a batch goes the older way."""
    layout, rest, arrays, size = [], {}, [], 0
    for name, value in batch.items():
        if type(value) is not torch.Tensor or value.layout != torch.strided:
            rest[name] = value
            continue
        try:
            array = value.numpy()
        except (TypeError, RuntimeError):
            return None
        size += -size % _PIPE_ALIGN
        layout.append((name, array.dtype.str, array.shape, size, array.nbytes))
        arrays.append((size, array))
        size += array.nbytes
    return layout, rest, arrays, size


class _SlotBatch(dict):
    """A batch (dict) that a DataLoader worker hands to the main process through its ring.

    In the worker it is a dict of tensors like any other (a ``collate_fn`` sees just that); the
    slot is taken only when it is pickled into the result queue (see the module docstring).
    """

    def __copy__(self) -> "_SlotBatch":  # default_convert clones mappings with copy.copy
        return _SlotBatch(self)

    def __reduce__(self) -> Any:
        plan = _plan(self)
        ring = _ring
        slot = None if plan is None else ring.claim()
        if slot is None:
            return _PipeBatch(self).__reduce__()
        layout, size, columns, targets = plan
        views = targets[slot]
        if views is None:
            views = targets[slot] = _slot_views(ring, slot, layout)
        rest = None
        try:
            for view, name in zip(views, columns):
                view[...] = self[name].numpy()
        except (TypeError, RuntimeError):  # a tensor with no numpy view: see _layout
            ring.array[slot] = 0
            return _PipeBatch(self).__reduce__()
        if len(self) > len(columns):
            rest = {name: value for name, value in self.items() if name not in columns}
        start = _HEADER + slot * ring.slot_bytes
        return (_rebuild_from_slot,
                (ring.token, ring.pid, None if ring.array[_MAPPED] else ring.tensor, slot, start,
                 size, layout, rest))


#: Layouts a ring keeps (see _plan); past this many (shapes that keep changing) it forgets them.
_PLANS = 32


def _plan(batch: dict) -> Optional[tuple]:
    """``(layout, size, column names, per-slot views)`` for ``batch`` in this worker's ring,
    computed once per layout (names, dtypes and shapes of its dense tensors) and kept by the
    ring; None when the batch goes the older way (no ring here, too large, no numpy view)."""
    key = []
    for name, value in batch.items():
        if type(value) is torch.Tensor:
            key.append((name, value.dtype, value.shape, value.layout))
    key = tuple(key)
    ring = _ring
    if ring is not None and ring.pid == os.getpid():
        plan = ring.plans.get(key)
        if plan is not None:
            return plan
    found = _layout(batch)
    if found is None or not found[3]:
        return None
    layout, _, _, size = found
    ring = _worker_ring(size)
    if ring is None:
        return None
    if len(ring.plans) >= _PLANS:
        ring.plans.clear()
    plan = ring.plans[key] = (tuple(layout), size, tuple(entry[0] for entry in layout),
                              [None] * ring.slots)
    return plan


def _slot_views(ring: _Ring, slot: int, layout: tuple) -> list:
    """Numpy arrays over ``slot`` of ``ring``, one per tensor of ``layout``."""
    start = _HEADER + slot * ring.slot_bytes
    return [ring.array[start + offset:start + offset + nbytes].view(dtype).reshape(shape)
            for _, dtype, shape, offset, nbytes in layout]


def for_transport(batch: Any) -> Any:
    """What a DataLoader worker yields for ``batch``: a dict goes through the worker's ring."""
    return _SlotBatch(batch) if type(batch) is dict else batch


# -- the main process's side ------------------------------------------------------------------------
#: The rings mapped in this process: token -> (worker pid, the ring as a numpy array).
_mapped: dict = {}


def _map_ring(token: str, pid: int, tensor: Any) -> memoryview:
    """Keep a worker's ring, dropping that worker's earlier rings and those of workers that
    have exited (tensors over them keep their memory mapped until released)."""
    for old, (old_pid, _) in list(_mapped.items()):
        if old_pid == pid or not _alive(old_pid):
            del _mapped[old]
    array = tensor.numpy()
    # Slots are taken as arrays over a memoryview (not slices of ``array``): numpy gives a view of
    # a slice the slice's own base, so every column's array would keep only the whole ring alive,
    # where the slot's array must live exactly as long as a tensor over it.
    ring = memoryview(array)
    _mapped[token] = (pid, ring)
    array[_MAPPED] = 1
    return ring


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: The slots whose tensors the main process holds: id of a weak reference to the slot's array ->
#: (that reference, the ring, the slot). A weak reference nobody keeps calls nothing; this keeps
#: them, and the callback (:func:`_released`) drops the entry as it frees the slot.
_held: dict = {}
#: numpy dtypes by the descriptors' dtype strings (parsing one costs more than the lookup).
_dtypes: dict = {}


def _released(ref: Any) -> None:
    entry = _held.pop(id(ref), None)
    if entry is not None:
        entry[1][entry[2]] = 0


def _bad_descriptor(pid: int, what: str) -> StreamioError:
    return StreamioError(f"a batch descriptor from DataLoader worker pid {pid} does not fit its"
                         f" shared-memory ring ({what})")


def _rebuild_from_slot(token: str, pid: int, tensor: Any, slot: int, start: int, size: int,
                       layout: tuple, rest: Optional[dict]) -> dict:
    """A plain dict of tensors over the slot (released when the last of them is), plus the
    values that were pickled as they are."""
    found = _mapped.get(token)
    if found is not None:
        ring = found[1]
    elif tensor is not None:
        ring = _map_ring(token, pid, tensor)
    else:
        raise StreamioError(f"a batch from DataLoader worker pid {pid} names a shared-memory ring"
                            " this process never mapped (was it unpickled outside the"
                            " DataLoader that started the worker?)")
    # The columns are arrays whose base is ``owner`` (np.ndarray over it as a buffer), and each
    # tensor keeps its array: ``owner`` dies with the last of them, and its weak reference frees
    # the slot. (A plain weak reference: weakref.finalize costs several times more per batch.)
    if not (0 <= slot < _MAPPED and start >= _HEADER and size >= 0):
        raise _bad_descriptor(pid, f"slot {slot} at byte {start}")
    out = {}
    dtypes = _dtypes
    try:
        owner = np.frombuffer(ring, dtype=np.uint8, count=size, offset=start)
        for name, dtype, shape, offset, _ in layout:
            np_dtype = dtypes.get(dtype)
            if np_dtype is None:
                np_dtype = dtypes[dtype] = np.dtype(dtype)
            out[name] = torch.from_numpy(np.ndarray(shape, np_dtype, owner, offset))
    except (ValueError, TypeError) as exc:  # numpy checks every column against the slot
        raise _bad_descriptor(pid, str(exc)) from None
    ref = weakref.ref(owner, _released)
    _held[id(ref)] = (ref, ring, slot)
    if rest:
        out.update(rest)
    return out

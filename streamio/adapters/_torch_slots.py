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
(``weakref.finalize`` on the slot's array, which their storage keeps alive) the main process
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
        found = _layout(self)
        ring = _worker_ring(found[3]) if found is not None and found[3] else None
        slot = None if ring is None else ring.claim()
        if slot is None:
            return _PipeBatch(self).__reduce__()
        layout, rest, arrays, size = found
        start = _HEADER + slot * ring.slot_bytes
        target = ring.array
        for offset, array in arrays:
            if array.nbytes:
                at = start + offset
                np.copyto(target[at:at + array.nbytes].view(array.dtype).reshape(array.shape),
                          array)
        mapped = bool(target[_MAPPED])
        return (_rebuild_from_slot,
                (ring.token, ring.pid, None if mapped else ring.tensor, slot, start, size,
                 layout, rest))


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


def _release(ring: memoryview, slot: int) -> None:
    ring[slot] = 0


def _rebuild_from_slot(token: str, pid: int, tensor: Any, slot: int, start: int, size: int,
                       layout: list, rest: dict) -> dict:
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
    owner = np.frombuffer(ring, dtype=np.uint8, count=size, offset=start)
    weakref.finalize(owner, _release, ring, slot)
    out = {}
    for name, dtype, shape, offset, nbytes in layout:
        out[name] = torch.from_numpy(owner[offset:offset + nbytes].view(dtype).reshape(shape))
    out.update(rest)
    return out

"""Batches from a DataLoader worker to the main process: numpy columns become tensors
(:func:`convert_batch`), and a batch of fixed-dtype tensors travels as one buffer through the
worker's pipe when small, or through torch's shared memory when large (:class:`_PipeBatch`).
Part of :mod:`streamio.adapters.torch`, which re-exports the public names."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..decoders.sparse import SparseBatch
from ..errors import DecodeError, require

torch = require("torch", "torch")


# -- conversion ---------------------------------------------------------------------------------
def _tensor(array: np.ndarray, pin: bool) -> Any:
    if not array.flags.writeable:
        # torch.from_numpy shares memory and warns on read-only arrays (tensors are writable, so
        # an in-place op would write into memory numpy promised not to change): copy these.
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if pin else tensor


def convert_batch(batch: Any, *, pin_memory: bool = False) -> Any:
    """A decoded batch with numpy arrays turned into tensors.

    Numeric arrays become tensors that share their memory (``torch.from_numpy``, no copy);
    :class:`~streamio.SparseBatch` becomes a ``torch.sparse_csr_tensor`` over the same three
    arrays; object/bytes/str arrays become Python lists (torch has no string tensors). Raw
    records (``bytes``, lists of ``bytes``) are returned as they are.
    """
    if isinstance(batch, dict):
        return {name: convert_batch(value, pin_memory=pin_memory) for name, value in batch.items()}
    if isinstance(batch, np.ndarray):
        if batch.dtype.kind in "OSU":
            return batch.tolist()
        return _tensor(batch, pin_memory)
    if isinstance(batch, np.generic):  # a scalar field of an unbatched example
        return batch.item() if batch.dtype.kind in "OSU" else torch.as_tensor(batch)
    if isinstance(batch, SparseBatch):
        crow = _tensor(batch.indptr, pin_memory)
        col = _tensor(batch.indices, pin_memory)
        values = _tensor(batch.values, pin_memory)
        # SparseBatch checked the CSR invariants when it was built: do not check them again.
        try:
            with warnings.catch_warnings():
                # torch warns "support is in beta" on every CSR tensor it makes: noise for the
                # user at each batch, about torch, not about their data.
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                return torch.sparse_csr_tensor(crow, col, values, size=batch.shape,
                                               check_invariants=False)
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            # Only a SparseBatch altered after construction (or of a dtype torch lacks) gets
            # here; torch words it as an argument-unpacking TypeError, so say what was wrong.
            raise DecodeError(f"{batch!r} cannot become a torch sparse tensor: {exc}") from exc
    if isinstance(batch, tuple):
        return tuple(convert_batch(v, pin_memory=pin_memory) for v in batch)
    return batch


# -- from a DataLoader worker to the main process ---------------------------------------------------
#: Batches up to this many bytes of tensors cross from a DataLoader worker to the main process as
#: one buffer inside the pickle (the queue's pipe); larger ones go torch's way, each tensor's
#: storage moved to its own shared-memory segment whose file descriptor is passed. That costs
#: ~1 ms per tensor whatever its size (segment, fd passing, mmap), where copying through the
#: pipe costs per byte: on 2 cores the pipe won up to 256 KiB and lost at 1 MiB.
PIPE_BATCH_BYTES = 512 << 10
_PIPE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                          torch.bool, torch.complex64, torch.complex128})
#: Offsets of the tensors inside the buffer: aligned for any dtype and for vector loads.
_PIPE_ALIGN = 64


def _rebuild_batch(buffer: bytearray, layout: list, rest: dict) -> dict:
    """The main process's side of :class:`_PipeBatch`: a plain dict of tensors that share the
    unpickled (writable) buffer, plus the values that were pickled as they are."""
    out = {}
    for name, dtype, shape, offset, nbytes in layout:
        if nbytes:
            out[name] = torch.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize,
                                         offset=offset).view(shape)
        else:
            out[name] = torch.empty(shape, dtype=dtype)
    out.update(rest)
    return out


class _PipeBatch(dict):
    """A batch (dict) that a DataLoader worker hands to the main process as one buffer.

    In the worker it is a dict of tensors like any other (a ``collate_fn`` sees just that);
    pickled, its dense CPU tensors are copied into one ``bytearray``, and unpickling gives a
    plain ``dict`` whose tensors are views of it (see :data:`PIPE_BATCH_BYTES` for why).
    """

    def __copy__(self) -> "_PipeBatch":  # default_convert clones mappings with copy.copy
        return _PipeBatch(self)

    def __reduce__(self) -> Any:
        layout, rest, pieces, size = [], {}, [], 0
        for name, value in self.items():
            if (isinstance(value, torch.Tensor) and value.layout == torch.strided
                    and value.device.type == "cpu" and value.dtype in _PIPE_DTYPES
                    and not value.requires_grad):
                flat = value.detach().contiguous().reshape(-1).view(torch.uint8)
                size += -size % _PIPE_ALIGN
                layout.append((name, value.dtype, tuple(value.shape), size, flat.numel()))
                pieces.append((size, flat))
                size += flat.numel()
            else:
                rest[name] = value
        if size > PIPE_BATCH_BYTES:
            return (dict, (dict(self),))  # torch's shared-memory segments, per tensor
        buffer = bytearray(size)
        target = torch.frombuffer(buffer, dtype=torch.uint8) if size else None
        for offset, flat in pieces:
            if flat.numel():
                target[offset:offset + flat.numel()].copy_(flat)
        return (_rebuild_batch, (buffer, layout, rest))


def _for_transport(batch: Any) -> Any:
    return _PipeBatch(batch) if type(batch) is dict else batch

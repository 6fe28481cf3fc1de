"""Host to device: :func:`to_device` and :class:`DevicePrefetcher` overlap the copy of the next
batches (pinned memory, a CUDA side stream) with the compute on the current one. Part of
:mod:`streamio.adapters.torch`, which re-exports the public names."""

from __future__ import annotations

import collections
import time
from typing import Any, Iterable, Iterator, Literal, Optional, Union

from .._util import check_int as _check_int
from ..errors import UsageError, require

torch = require("torch", "torch")

EvenBatches = Optional[Literal["drop", "pad"]]
_EVEN_BATCHES = ("drop", "pad", None)
#: Dropping never invents data and never fails; "pad" repeats batches (see
#: :mod:`streamio.adapters.torch`).
DEFAULT_EVEN_BATCHES: EvenBatches = "drop"
#: Two batches in flight hide one copy behind one step of compute; more only costs GPU memory
#: unless batch times vary a lot.
DEFAULT_DEPTH = 2


# -- even batch counts under DDP ---------------------------------------------------------------
_flag_groups: dict = {}


def _flag_group_and_device(group: Any) -> tuple[Any, Any]:
    """A process group for the per-step flag, and the device its tensor must live on.

    With NCCL a flag on the GPU would make ``.item()`` wait for all queued compute every step, so
    a gloo group (CPU) is made once, collectively, on first use.
    """
    dist = torch.distributed
    backend = str(dist.get_backend(group))
    # "gloo", or "cpu:gloo,cuda:nccl" from init_process_group() without a backend: CPU works.
    if backend == "gloo" or "cpu:gloo" in backend:
        return group, torch.device("cpu")
    key = id(group if group is not None else dist.group.WORLD)
    if key not in _flag_groups:
        try:
            _flag_groups[key] = dist.new_group(backend="gloo") if group is None else None
        except (RuntimeError, ValueError):  # no gloo in this build: use the group's own device
            _flag_groups[key] = None
    side = _flag_groups[key]
    if side is not None:
        return side, torch.device("cpu")
    return group, torch.device("cuda", torch.cuda.current_device())


def even_batches(batches: Iterable[Any], policy: EvenBatches = DEFAULT_EVEN_BATCHES, *,
                 group: Any = None) -> Iterator[Any]:
    """Yield ``batches`` so that every rank of ``group`` yields the same number per epoch.

    One all-reduce of a tiny flag tensor per batch, in the calling (main) process. ``"drop"``
    stops every rank when the first runs out; ``"pad"`` continues until the last runs out,
    repeating each finished rank's last batch; ``None`` (or no initialised process group, or one
    rank) passes ``batches`` through.
    """
    if policy not in _EVEN_BATCHES:
        raise UsageError(f"even_batches must be one of {_EVEN_BATCHES}, not {policy!r}")
    dist = torch.distributed
    active = (policy is not None and dist.is_available() and dist.is_initialized()
              and dist.get_world_size(group) > 1)
    if not active:
        yield from batches
        return
    flag_group, device = _flag_group_and_device(group)
    # "drop": MIN of [have a batch]. "pad": MAX of [have a batch, ran out with nothing to repeat]
    # (the second entry makes every rank fail together, rather than one rank raising while the
    # others wait forever in the next all-reduce).
    op = dist.ReduceOp.MIN if policy == "drop" else dist.ReduceOp.MAX
    flags = torch.zeros(1 if policy == "drop" else 2, dtype=torch.int32, device=device)
    iterator = iter(batches)
    exhausted = False
    last = None
    try:
        while True:
            batch = None
            if not exhausted:
                try:
                    batch = next(iterator)
                except StopIteration:
                    exhausted = True
            flags[0] = 0 if exhausted else 1
            if policy == "pad":
                flags[1] = 1 if exhausted and last is None else 0
            dist.all_reduce(flags, op=op, group=flag_group)
            values = flags.tolist()
            if not values[0]:
                return  # "drop": some rank is out; "pad": every rank is out
            if policy == "pad" and values[1]:
                raise UsageError("a rank has no batch at all this epoch while others do, so"
                                 " even_batches='pad' has nothing to repeat on it; use"
                                 " even_batches='drop', or give every rank data")
            if not exhausted:
                last = batch
                yield batch
            else:
                yield last
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()


# -- host to device -----------------------------------------------------------------------------
def _pinned(tensor: Any) -> Any:
    if tensor.layout == torch.sparse_csr:
        return torch.sparse_csr_tensor(_pinned(tensor.crow_indices()),
                                       _pinned(tensor.col_indices()), _pinned(tensor.values()),
                                       size=tensor.shape, check_invariants=False)
    return tensor if tensor.is_pinned() else tensor.pin_memory()


def _move(batch: Any, device: Any, non_blocking: bool) -> Any:
    if isinstance(batch, torch.Tensor):
        if non_blocking and batch.device.type == "cpu":
            batch = _pinned(batch)  # a copy from pageable memory would be synchronous
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _move(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_move(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        moved = [_move(v, device, non_blocking) for v in batch]
        return moved if isinstance(batch, list) else tuple(moved)
    return batch  # str, bytes, numbers: stay on the host


def _record_stream(batch: Any, stream: Any) -> None:
    """Tell the caching allocator that ``stream`` uses ``batch``'s memory (it was allocated on the
    copy stream, and would otherwise be reused as soon as that stream moves on)."""
    if isinstance(batch, torch.Tensor):
        if batch.layout == torch.sparse_csr:
            for part in (batch.crow_indices(), batch.col_indices(), batch.values()):
                part.record_stream(stream)
        elif batch.device.type == "cuda":
            batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            _record_stream(v, stream)


class DevicePrefetcher:
    """Iterates ``batches`` with each batch moved to ``device``; made by :func:`to_device`.

    CUDA: each batch is pinned (unless it already is) and copied with ``non_blocking=True`` on a
    side stream, ``depth`` batches ahead; an event recorded after each batch's copies lets the
    compute stream wait for that batch only, never for the copies of later ones. Other devices:
    CPU batches pass through unchanged; anything else gets a plain ``.to(device)``.

    ``wait_s`` is the time spent waiting for the loader to hand over a batch (data starvation);
    ``batches`` counts the batches yielded.

    Resume: the prefetcher takes up to ``depth`` batches from the loader ahead of the one it
    hands over, so a ``StatefulDataLoader``'s own ``state_dict()`` would skip those on resume.
    :meth:`state_dict` is the loader's state as of the last batch yielded: save that, and give it
    to the new loader's ``load_state_dict`` (or this object's :meth:`load_state_dict`).
    """

    def __init__(self, batches: Iterable[Any], device: Any, depth: int = DEFAULT_DEPTH, *,
                 even_batches: EvenBatches = DEFAULT_EVEN_BATCHES, group: Any = None) -> None:
        _check_int("depth", depth, 1)
        if even_batches not in _EVEN_BATCHES:
            raise UsageError(f"even_batches must be one of {_EVEN_BATCHES}, not {even_batches!r}")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise UsageError(f"not a torch device: {device!r} ({exc})") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError(f"device {device} asked for, but torch.cuda.is_available() is"
                                 " False")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        self.batches = batches
        self.device = device
        self.depth = depth
        self.even_batches = even_batches
        self.group = group
        self.wait_s = 0.0
        self.batches_yielded = 0
        self._state: Any = None  # the loader's state_dict() after the last batch yielded

    def __repr__(self) -> str:
        return (f"DevicePrefetcher({type(self.batches).__name__}, device={str(self.device)!r},"
                f" depth={self.depth}, even_batches={self.even_batches!r}:"
                f" {self.batches_yielded} batches, waited {self.wait_s:.3f} s)")

    def state_dict(self) -> dict:
        """The loader's ``state_dict()`` as of the last batch this iterator yielded (the
        loader's current one before the first)."""
        if not callable(getattr(self.batches, "state_dict", None)):
            raise UsageError(f"{type(self.batches).__name__} has no state_dict(): resume needs a"
                             " StatefulDataLoader (torchdata) or a StreamDataset")
        if isinstance(self._state, BaseException):
            raise self._state
        return self._state if self._state is not None else self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Give ``state`` (from :meth:`state_dict`) to the loader, before iterating."""
        if not callable(getattr(self.batches, "load_state_dict", None)):
            raise UsageError(f"{type(self.batches).__name__} has no load_state_dict()")
        self.batches.load_state_dict(state)
        self._state = None

    def _loader_state(self) -> Any:
        """The loader's state now, or the exception that getting it raised (kept for
        :meth:`state_dict` to raise: iterating must not fail for a resume nobody asked for)."""
        try:
            return self.batches.state_dict()
        except Exception as exc:  # noqa: BLE001 - re-raised by state_dict(), if it is called
            return exc

    def _source(self) -> Iterator[tuple]:
        """``(batch, the loader's state right after it)`` pairs (state None without one)."""
        clock = time.perf_counter
        iterator = iter(even_batches(self.batches, self.even_batches, group=self.group))
        stateful = callable(getattr(self.batches, "state_dict", None))
        try:
            while True:
                t0 = clock()
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                finally:
                    self.wait_s += clock() - t0
                yield batch, (self._loader_state() if stateful else None)
        finally:
            iterator.close()

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._cuda()
        if self.device.type == "cpu":
            return self._counted(self._source())
        return self._counted((_move(b, self.device, False), state)
                             for b, state in self._source())

    def _counted(self, batches: Iterator[tuple]) -> Iterator[Any]:
        for batch, state in batches:
            self.batches_yielded += 1
            self._state = state
            yield batch

    def _cuda(self) -> Iterator[Any]:
        device = self.device
        copy_stream = torch.cuda.Stream(device)
        in_flight: collections.deque = collections.deque()
        source = self._source()

        def launch() -> bool:
            try:
                batch, state = next(source)
            except StopIteration:
                return False
            with torch.cuda.stream(copy_stream):
                moved = _move(batch, device, True)
                done = torch.cuda.Event()
                done.record(copy_stream)
            in_flight.append((moved, done, state))
            return True

        try:
            # The copy stream must not start before work already queued on the compute stream
            # that produced anything we copy from (CPU tensors: nothing; but be safe and cheap).
            copy_stream.wait_stream(torch.cuda.current_stream(device))
            for _ in range(self.depth):
                if not launch():
                    break
            while in_flight:
                moved, done, state = in_flight.popleft()
                compute = torch.cuda.current_stream(device)
                compute.wait_event(done)
                _record_stream(moved, compute)
                launch()  # queue the next copy before handing this batch to compute
                self.batches_yielded += 1
                self._state = state
                yield moved
        finally:
            source.close()


def to_device(batches: Iterable[Any], device: Union[str, Any], depth: int = DEFAULT_DEPTH, *,
              even_batches: EvenBatches = DEFAULT_EVEN_BATCHES,
              group: Any = None) -> DevicePrefetcher:
    """Iterate ``batches`` (a DataLoader, usually) with every tensor moved to ``device``.

    On CUDA, copies overlap compute: pinned host memory, ``non_blocking`` copies on a side stream,
    ``depth`` batches in flight, one event per batch so the compute stream waits only for its own
    batch. On CPU the batches pass through. Under ``torch.distributed`` every rank yields the same
    number of batches per epoch (``even_batches``: ``"drop"``, ``"pad"`` or ``None``; see
    :func:`even_batches`). Lists (of bytes or str) and other non-tensors stay on the host.
    Iterate the result once per epoch; ``wait_s`` is the time spent waiting for data.
    """
    return DevicePrefetcher(batches, device, depth, even_batches=even_batches, group=group)

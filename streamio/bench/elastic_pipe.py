"""The ``pipe`` source of ``streamio bench --workloads elastic``: a Pipe-mode channel shared by
DataLoader workers.

One TFRecord file is written into a :class:`~streamio.PipeChannel`'s FIFO by a ``cat`` process,
afresh for every job (a restarted SageMaker job's channel replays the same bytes). An epoch is
read by ``StatefulDataLoader(ds.to_torch(), num_workers=n)`` (``n == 1``: ``num_workers=0``, the
main process reads the FIFO itself; ``n >= 2``: the workers share the stream, block ``k`` to
worker ``k % n``); a job interrupted after ``depth`` of its batches gives the loader's state;
the restarted job resumes it on ``m`` workers (the list form) or on ``n`` (the loader's own
``load_state_dict``). The figures are wall seconds of whole jobs, worker start-up included (the
workers are processes: unlike the file sources' shards, they run at once):

- ``elastic_s`` / ``first_s``: the resumed job on ``m`` workers to its end / its first batch;
- ``same_s``: the resumed job on ``n`` workers to its end;
- ``rest_s``: the uninterrupted job on ``n`` workers from the checkpoint's batch to its end;
- ``epoch_s``: a whole epoch on ``m`` workers.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Any, Optional

import streamio

from .cases import example_decoder


def available() -> Optional[str]:
    """None if torch and torchdata's StatefulDataLoader import, else why not."""
    try:
        import torch  # noqa: F401
        from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: F401
    except ImportError as exc:
        return f"pipe: skipped ({exc})"
    return None


class _Channel:
    """A PipeChannel whose FIFO ``<prefix>_0`` a ``cat`` process fills with ``data``, made
    afresh for each job."""

    def __init__(self, tmp: str, data: str) -> None:
        self.prefix = os.path.join(tmp, "channel")
        self.data = data
        self.writer: Any = None

    def start(self) -> None:
        self.stop()
        fifo = f"{self.prefix}_0"
        if os.path.exists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo)
        self.writer = subprocess.Popen(["sh", "-c", 'exec cat "$0" > "$1"', self.data, fifo],
                                       stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.writer is not None:
            try:
                self.writer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.writer.kill()
                self.writer.wait()
            self.writer = None


def _loader(channel: _Channel, workers: int, states: Any = None, own: Any = None) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = streamio.Dataset(streamio.PipeChannel(channel.prefix, open_timeout=60), "tfrecord",
                          decoder=example_decoder()).shuffle(10000, seed=0).batch(256).prefetch()
    tds = ds.to_torch()
    if states is not None:
        tds.load_state_dict(states)
    loader = StatefulDataLoader(tds, batch_size=None,
                                num_workers=workers if workers > 1 else 0)
    if own is not None:
        loader.load_state_dict(own)
    return loader


def _job(channel: _Channel, workers: int, *, states: Any = None, own: Any = None,
         stop: Optional[int] = None) -> tuple:
    """``(marks, state)``: the seconds at which each batch arrived and the job ended, and the
    loader's state after ``stop`` batches (the job then stops, as a killed one would)."""
    channel.start()
    clock = time.perf_counter
    t0 = clock()
    loader = _loader(channel, workers, states, own)
    marks = []
    state = None
    it = iter(loader)
    for _ in it:
        marks.append(clock() - t0)
        if stop is not None and len(marks) == stop:
            state = loader.state_dict()
            break
    del it
    marks.append(clock() - t0)
    channel.stop()
    return marks, state


def rows(tmp: str, data: str, layouts: list, depths: list, rounds: int) -> list:
    """``(n, m, depth, [elastic_s, first_s, same_s, rest_s, epoch_s])`` medians."""
    channel = _Channel(tmp, data)
    out = []
    for n, m in layouts:
        found: dict = {d: [] for d in depths}
        for _ in range(rounds):
            whole, _ = _job(channel, n)
            epoch_m = _job(channel, m)[0][-1]
            batches = len(whole) - 1
            for depth in depths:
                cut = min(max(batches - 1, 1), round(depth * batches))
                _, state = _job(channel, n, stop=cut)
                elastic, _ = _job(channel, m, states=[state])
                same, _ = _job(channel, n, own=state)
                for what, marks in (("elastic", elastic), ("same-layout", same)):
                    if len(marks) - 1 != batches - cut:  # the old batches, dealt
                        raise RuntimeError(f"the {what} resume delivered {len(marks) - 1}"
                                           f" batches, not {batches - cut}")
                found[depth].append((elastic[-1], elastic[0], same[-1],
                                     whole[-1] - whole[cut - 1], epoch_m))
        for depth in depths:
            out.append((n, m, depth, [statistics.median(col) for col in zip(*found[depth])]))
    return out

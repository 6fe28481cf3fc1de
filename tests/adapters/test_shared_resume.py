"""Resuming a stream shared by DataLoader workers (a SageMaker Pipe-mode channel: one FIFO per
epoch, dealt to every worker) mid-epoch, from a restarted job whose channel carries the same
bytes: on the same layout the resumed epoch is the uninterrupted one exactly; on another number
of workers (or none) every record comes exactly once over the two runs (issue #25).

Real parts: a PipeChannel whose FIFOs a writer process feeds, torchdata's StatefulDataLoader
with workers started from a forkserver (support/clean_workers.py), states through JSON."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import streamio
from streamio.decoders import Example, FixedLen, encode_example
from support.clean_workers import context_for

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]
stateful = pytest.importorskip("torchdata.stateful_dataloader")

N = 1500


def _ids(batch) -> list:
    return [int(x) for x in np.asarray(batch["x"]).reshape(-1)]


@pytest.fixture
def channel(tmp_path, fifo):
    """``(prefix, feed(epoch))``: ``feed`` makes ``<prefix>_<epoch>`` afresh and starts a writer
    of the same N records into it (a restarted job's channel replays the same bytes)."""
    ref = str(tmp_path / "ref.tfrecord")
    streamio.write_records(ref, "tfrecord", [encode_example({"x": [i], "pad": b"p" * (i % 37)})
                                             for i in range(N)])
    prefix = str(tmp_path / "train")

    def feed(epoch: int = 0) -> None:
        path = f"{prefix}_{epoch}"
        if os.path.exists(path):
            os.unlink(path)
        os.mkfifo(path)
        fifo.start(path, ref)

    return prefix, feed


def _dataset(prefix: str) -> streamio.Dataset:
    return streamio.Dataset(streamio.PipeChannel(prefix, open_timeout=60), "tfrecord",
                            decoder=Example({"x": FixedLen((), np.int64)})) \
        .shuffle(200, seed=1).batch(16)


def _loader(prefix: str, workers: int, states=None):
    tds = _dataset(prefix).to_torch()
    if states is not None:
        tds.load_state_dict(states)  # the list form: before the loader is made
    return stateful.StatefulDataLoader(tds, batch_size=None, num_workers=workers,
                                       multiprocessing_context=context_for(workers))


def _interrupted(prefix: str, feed, workers: int, after: int) -> tuple:
    """The batches a job delivered before it was stopped after ``after`` batches, and its
    loader's state (through JSON, as a checkpoint file would carry it)."""
    feed()
    loader = _loader(prefix, workers)
    it = iter(loader)
    got = [_ids(next(it)) for _ in range(after)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it  # the job dies: its workers go, the writer sees its FIFO closed
    return got, state


def test_the_same_layout_resumes_the_uninterrupted_epoch_exactly(channel):
    prefix, feed = channel
    feed()
    whole = [_ids(b) for b in _loader(prefix, 2)]
    assert sorted(i for b in whole for i in b) == list(range(N))
    for after in (1, 7, 40):
        before, state = _interrupted(prefix, feed, 2, after)
        feed()
        job = _loader(prefix, 2)
        job.load_state_dict(state)
        after_ids = [_ids(b) for b in job]
        assert before + after_ids == whole, after


@pytest.mark.parametrize("workers,after", [(3, 13), (1, 13), (0, 13), (3, 1)])
def test_another_number_of_workers_gets_every_remaining_record_once(channel, workers, after):
    """2 workers interrupted, resumed on 3, 1 and 0 (the main process reads the FIFO itself),
    and the next epoch is whole on the new layout; after 1 batch, worker 1 had delivered
    nothing (its state is none: all of its share is left)."""
    prefix, feed = channel
    before, state = _interrupted(prefix, feed, 2, after)
    feed(0)
    feed(1)
    job = _loader(prefix, workers, [state])
    rest = [i for b in job for i in _ids(b)]
    delivered = [i for b in before for i in b]
    assert sorted(delivered + rest) == list(range(N))
    assert len(delivered) == after * 16
    nxt = [i for b in job for i in _ids(b)]
    assert sorted(nxt) == list(range(N))

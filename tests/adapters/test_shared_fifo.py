"""One FIFO (or PipeChannel) shared by DataLoader workers: worker 0 deals blocks of records, every
worker decodes its share. The DataLoader scenarios run in a fresh process (see the script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import streamio
from streamio import Dataset
from streamio.sharing.stream import SharedStreamFeed

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "shared_fifo_check.py")
N = 1000


def run_scenario(tmp_path, scenario: str) -> dict:
    out = subprocess.run([sys.executable, SCRIPT, str(tmp_path), scenario], capture_output=True,
                         text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["tensorflow_imported"] is False  # the torch path never imports TensorFlow
    return result


@pytest.fixture(scope="module")
def epochs(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("shared"), "epochs")


@pytest.mark.parametrize("key", ["fifo-2-0", "fifo-3-1", "channel-2-0", "channel-3-1"])
def test_every_record_exactly_once_per_epoch(epochs, key):
    """2 workers (fresh each epoch) and 3 (persistent), a plain FIFO refilled by a writer process
    each epoch and a PipeChannel (a new FIFO each epoch), three epochs, shuffle + decoder + a
    threaded map running in the workers."""
    runs = epochs[key]
    assert len(runs) == 3
    for ids in runs:
        assert len(ids) == N and sorted(ids) == list(range(N))


def test_blocks_larger_than_a_socket_buffer_do_not_deadlock(tmp_path):
    assert run_scenario(tmp_path, "big")["counts"] == [2000, 2000, 2000]


def test_a_killed_worker_ends_the_epoch_with_an_error_not_a_hang(tmp_path):
    result = run_scenario(tmp_path, "kill")
    for victim in ("worker1", "worker0"):  # worker 0 is the one reading the FIFO
        outcome = result[victim]
        assert outcome["error"] is not None, victim
        # The DataLoader names the dead worker ("killed by signal", "exited unexpectedly"), or
        # a worker reports that the worker reading the stream is gone (SourceError); or torch
        # itself fails to fetch a tensor the dead worker had already queued (it passes tensors
        # as file descriptors over a socket to that worker: ConnectionResetError in
        # multiprocessing: a reset or EOF, or a refused connection when the dead worker's
        # resource-sharer socket is still on disk), which is torch's behaviour for any killed
        # worker.
        if outcome["error"] in ("ConnectionResetError", "ConnectionRefusedError", "EOFError"):
            assert "multiprocessing" in outcome["raised_in"], outcome
        else:
            assert outcome["error"] in ("RuntimeError", "SourceError"), outcome
            assert "DataLoader worker" in outcome["message"], outcome
        assert outcome["delivered"] < N // 16


def test_a_corrupt_stream_fails_in_the_workers_after_the_records_before_it(tmp_path):
    result = run_scenario(tmp_path, "corrupt")
    assert result["error"] == "CorruptRecordError"
    assert "corrupt.fifo" in result["message"] and "record 501" in result["message"]
    ids = result["ids"]
    assert len(ids) == len(set(ids)) and all(i < 501 for i in ids)
    assert len(ids) >= 501 - 2 * 16  # at most a partial batch per worker is lost


def test_plan_shares_one_stream_between_workers_and_local_ranks(tmp_path, monkeypatch):
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    path = str(tmp_path / "pipe")
    os.mkfifo(path)
    tds = Dataset(path, "tfrecord").to_torch()
    plan = tds.plan(epoch=0, worker=1, num_workers=2)
    assert isinstance(plan._feed, SharedStreamFeed) and plan.sources == (path,)
    channel = streamio.PipeChannel(str(tmp_path / "train"))
    # Two ranks with no word on hosts: one host, both ranks share the channel's FIFO.
    feed = Dataset(channel, "tfrecord").to_torch().plan(epoch=0, rank=1, world_size=2)._feed
    assert (feed.local_rank, feed.local_world_size) == (1, 2)
    # Two hosts of one rank each: what their streams hold must be said (no silent guess).
    with pytest.raises(streamio.UsageError, match="node_streams"):
        Dataset(channel, "tfrecord").to_torch().plan(epoch=0, rank=1, world_size=2,
                                                    local_rank=0, local_world_size=1)
    with pytest.raises(streamio.UsageError, match="CSV header"):
        Dataset(path, "csv", decoder=streamio.Csv(header=True)).to_torch().plan(
            epoch=0, worker=0, num_workers=2)
    with pytest.raises(ValueError):
        Dataset(path, "tfrecord").to_torch(connect_timeout=0)


def test_every_other_worker_learns_that_one_died(tmp_path):
    """Without a DataLoader watching: three processes share a FIFO, one is killed while every
    one of them still has blocks of its share to take; the two others each end with a
    SourceError that says which worker went away (worker 1: the dealer tells them; worker 0, the
    dealer itself: their sockets close). A worker whose whole share was out before the death is
    not told (its records were delivered), so the scenario holds every worker after its first
    batch until the victim is dead (it once killed whenever the victim had its first batch: a
    flaky failure under load, the dealer's own worker having finished its share by then)."""
    result = run_scenario(tmp_path, "direct")
    for victim, others in ((1, ("0", "2")), (0, ("1", "2"))):
        ends = result[f"worker{victim}"]["others"]
        assert set(ends) == set(others), ends
        for end in ends.values():
            assert end["error"] == "SourceError", (victim, end)
            if victim == 1:
                assert "DataLoader worker 1 left" in end["message"], end  # the dealer names it
                assert "direct-1.fifo" in end["message"], end
            else:
                assert "(worker 0) stopped" in end["message"], end


def test_dealing_leaves_the_processs_switch_interval_alone(tmp_path):
    """The dealer changes no process-wide setting of the process it runs in (a worker's, or a
    rank's main process): a shorter GIL switch interval no longer made dealing faster
    (docs/performance.md), and the process's code may rely on its own."""
    import threading

    path = str(tmp_path / "d.tfrecord")
    streamio.write_records(path, "tfrecord", (b"%d" % i for i in range(N)))
    ds = Dataset(path, "tfrecord")
    before = sys.getswitchinterval()
    seen: set = set()
    got: dict = {}

    def read(worker: int) -> None:
        feed = SharedStreamFeed(ds, token="s" * 16, epoch=0, worker=worker, num_workers=2,
                                connect_timeout=30.0)
        got[worker] = []
        for record in ds._with_feed(feed):
            seen.add(sys.getswitchinterval())
            got[worker].append(int(record))

    threads = [threading.Thread(target=read, args=(w,), daemon=True) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got[0] + got[1]) == list(range(N))
    assert seen == {before}

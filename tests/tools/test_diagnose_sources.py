"""``streamio diagnose`` (and ``streamio.diagnose``) on inputs that can keep it waiting or cannot
be read twice: a plain FIFO is refused before anything is read (it hung in silence), a Pipe mode
channel is read one epoch per run, ``--open-timeout``/``--read-timeout`` bound the waits; and the
process CPU figure never exceeds the cores the process may use (it said 3.35 on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import streamio
from streamio.errors import UsageError
from hang_guard import bounded

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "streamio", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("diag") / "small.tfrecord"
    streamio.write_records(str(path), "tfrecord", [b"x" * 100] * 3000)
    return str(path)


def test_the_cli_refuses_a_fifo_it_could_read_only_once(tmp_path, fifo, records):
    path = fifo.make(open(records, "rb").read(), 65536)  # a writer feeds it once
    out = run("diagnose", path, "--format", "tfrecord", "--seconds", "2", timeout=60)
    assert out.returncode == 1, out
    assert "is a FIFO, which cannot be read twice" in out.stderr
    assert "--channel PREFIX" in out.stderr
    os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # the writer may go


def test_the_python_diagnose_refuses_a_fifo_too(tmp_path):
    path = str(tmp_path / "fifo")
    os.mkfifo(path)
    with pytest.raises(UsageError, match="is a FIFO, which cannot be read twice"):
        bounded(lambda: streamio.diagnose(streamio.Dataset(path, "tfrecord").batch(8),
                                          seconds=1), 30)


def test_the_cli_reads_a_pipe_channel_one_epoch_per_run(tmp_path, records):
    prefix = str(tmp_path / "train")
    writer = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel",
                               prefix, "--epochs", "2", records],
                              env={**os.environ, "PYTHONPATH": ROOT}, stderr=subprocess.DEVNULL)
    try:
        out = run("diagnose", "--channel", prefix, "--format", "tfrecord", "--seconds", "2",
                  "--open-timeout", "60", "--json")
    finally:
        writer.wait(timeout=60)
    assert out.returncode == 0, out.stderr
    figures = pytest.importorskip("json").loads(out.stdout)
    assert figures["alone"]["records"] > 0 and figures["with_step"]["records"] > 0


def test_the_cli_open_timeout_bounds_the_wait_for_a_channel(tmp_path):
    out = run("diagnose", "--channel", str(tmp_path / "none"), "--format", "tfrecord",
              "--open-timeout", "1", timeout=60)
    assert out.returncode == 1
    assert "did not appear within 1 s" in out.stderr


def test_process_cpu_never_exceeds_the_cores(records):
    cores = len(os.sched_getaffinity(0))
    seen = []
    for _ in range(10):  # short runs: os.times() counted in 10 ms ticks gave 9.95 on 2 cores
        ds = streamio.Dataset(records, "tfrecord").batch(64).prefetch()
        d = streamio.diagnose(ds, seconds=1.0, step_ms=0)
        seen += [d.alone.cpu_process, d.with_step.cpu_process]
    assert max(seen) <= cores + 0.01, (cores, sorted(seen)[-4:])

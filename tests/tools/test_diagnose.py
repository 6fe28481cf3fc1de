"""streamio diagnose names the right bottleneck: a throttled FIFO writer, a slow decoder, a slow
consumer; and the command prints a table or JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import streamio
from streamio import Dataset, Example, FixedLen, PipeChannel

from support.clean_workers import forkserver_by_default

SPEC = {"x": FixedLen([32], "float32"), "y": FixedLen([], "int64")}
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts")


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    path = tmp_path_factory.mktemp("diag") / "data.tfrecord"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, 32)).astype(np.float32)
    streamio.write_records(str(path), "tfrecord",
                           (streamio.encode_example({"x": x[i], "y": i % 2})
                            for i in range(len(x))))
    return str(path)


class SlowDecoder:
    """The Example decoder plus 20 ms of work per batch: a decoder that cannot keep up."""

    def __init__(self):
        self.inner = Example(SPEC)

    def decode_batch(self, records, **kwargs):
        time.sleep(0.02)
        return self.inner.decode_batch(records, **kwargs)

    def output_spec(self):
        return None  # unknown shapes: decoded batch by batch, so the 20 ms is per batch


def test_throttled_fifo_writer_is_io_bound(tmp_path, examples):
    prefix = str(tmp_path / "train")
    writer = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "throttled_channel.py"),
                               prefix, examples, "2", "400000"])
    try:
        ds = Dataset(PipeChannel(prefix, open_timeout=30), "tfrecord",
                     decoder=Example(SPEC)).batch(64).prefetch()
        d = streamio.diagnose(ds, step_ms=1, seconds=4)
    finally:
        writer.kill()
        writer.wait()
    assert d.bottleneck == "io", d.table()
    assert d.alone.source_wait_s > 0.5 * d.alone.seconds
    assert "source" in d.explanation and "MB/s" in d.explanation


def test_slow_decoder_is_decode_bound_with_an_estimated_gain(examples):
    ds = Dataset(examples, "tfrecord", decoder=SlowDecoder(),
                 read_size=1 << 16).batch(64).prefetch()
    d = streamio.diagnose(ds, step_ms=2, seconds=3)
    assert d.bottleneck == "decode", d.table()
    assert d.alone.decode_s > 0.5 * d.alone.seconds
    assert "num_parallel=2" in d.suggestion and "would cut the input wait from" in d.suggestion
    assert d.source_limit_mb_s is not None and d.source_limit_mb_s > 0


def test_slow_consumer_is_consumer_bound(examples):
    ds = Dataset(examples, "tfrecord", decoder=Example(SPEC)).batch(64).prefetch()
    d = streamio.diagnose(ds, step_ms=40, seconds=3)
    assert d.bottleneck == "consumer", d.table()
    assert d.with_step.wait_share < 0.10
    assert "input keeps up" in d.explanation


def test_slow_start_is_start_up_bound(tmp_path, examples):
    prefix = str(tmp_path / "train")
    # Each epoch's FIFO appears 2 s late (as after a download), then the data streams fast.
    writer = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "throttled_channel.py"),
                               prefix, examples, "2", "1e12", "2"])
    try:
        ds = Dataset(PipeChannel(prefix, open_timeout=30), "tfrecord",
                     decoder=Example(SPEC)).batch(64)
        d = streamio.diagnose(ds, step_ms=0, seconds=2)
    finally:
        writer.kill()
        writer.wait()
    assert d.bottleneck == "start-up", d.table()
    assert d.alone.first_batch_s >= 1.5


def test_user_step_and_timeline(examples):
    seen = []
    ds = Dataset(examples, "tfrecord", decoder=Example(SPEC)).batch(128)
    d = streamio.diagnose(ds, step=lambda b: seen.append(len(b["y"])), seconds=1)
    assert seen and all(n == 128 for n in seen[:-1])
    assert len(d.with_step.timeline) == d.with_step.batches == len(seen)
    assert d.with_step.records == sum(seen)


def test_cli_table_and_json(tmp_path, examples):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"x": {"shape": [32], "dtype": "float32"},
                                "y": {"shape": [], "dtype": "int64"}}))
    base = [sys.executable, "-m", "streamio", "diagnose", examples, "--format", "tfrecord",
            "--decoder", f"example:{spec}", "--seconds", "1", "--step-ms", "50"]
    proc = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "bottleneck: consumer-bound" in proc.stdout and "records/s" in proc.stdout
    if importlib.util.find_spec("torch") is not None:  # by default it measures 2 workers too
        assert "2 workers" in proc.stdout and "DataLoader: num_workers=" in proc.stdout
    proc = subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=120)
    figures = json.loads(proc.stdout)
    assert figures["bottleneck"] == "consumer" and figures["with_step"]["batches"] > 0
    bad = subprocess.run(base[:-6] + ["--decoder", "example:/nonexistent.json"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "expected a JSON file" in bad.stderr


def test_dataloader_worker_runs(tmp_path, examples):
    pytest.importorskip("torch")
    # Two files, so two DataLoader workers each get a whole source.
    second = tmp_path / "b.tfrecord"
    second.write_bytes(open(examples, "rb").read())
    ds = Dataset([examples, str(second)], "tfrecord", decoder=Example(SPEC)).batch(64)
    with forkserver_by_default():  # diagnose makes the DataLoader: no context to pass
        d = streamio.diagnose(ds, step_ms=1, seconds=2, workers=[0, 2])
    [run] = d.workers
    assert run.name == "2 workers" and run.batches > 0 and run.records > 0
    assert "2 workers" in d.table()
    # A recommendation from what was measured, with the figures it came from.
    assert d.num_workers in (0, 2)
    assert f"DataLoader: num_workers={d.num_workers} (measured records/s" in d.table()


def _run(name, records, seconds, batches=100, readers=1):
    from streamio.tools.diagnose import RunFigures

    return RunFigures(name, seconds=seconds, batches=batches, records=records,
                      first_batch_s=0.0, readers=readers)


@pytest.mark.parametrize("worker_rates, expected", [
    ({2: 600_000}, 0),                 # cheap decode: moving batches costs more than it saves
    ({2: 1_050_000}, 0),               # within the margin: not worth processes and start-up
    ({2: 1_800_000, 4: 2_500_000}, 4),  # decode-bound: the fastest measured count
    ({2: 1_800_000, 4: 1_700_000}, 2),
])
def test_num_workers_is_recommended_from_the_measured_rates(worker_rates, expected):
    from streamio.tools.diagnose import Diagnosis, _recommend_workers

    d = Diagnosis(alone=_run("input alone", 2_000_000, 1.0),
                  with_step=_run("with step", 1_000_000, 1.0),
                  workers=[_run(f"{k} workers", rate, 1.0, readers=k)
                           for k, rate in worker_rates.items()])
    _recommend_workers(d)
    assert d.num_workers == expected
    assert "0 (in the main process): 990,000" in d.num_workers_reason  # after the first batch


def test_plot_writes_a_png_timeline(tmp_path, examples):
    pytest.importorskip("matplotlib")
    ds = Dataset(examples, "tfrecord", decoder=Example(SPEC)).batch(256)
    d = streamio.diagnose(ds, step_ms=2, seconds=1)
    out = tmp_path / "t.png"
    assert d.plot(str(out)) is True
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 2000

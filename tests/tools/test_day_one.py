"""What a new user met on day one (issue #22): the CLI's help and hints, `streamio index` over
several files, a PipeChannel that waited in vain, two writers on one FIFO, diagnose's report."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import streamio
from streamio import Dataset, PipeChannel
from streamio.cli import build_parser
from streamio.errors import SourceError
from streamio.tools.diagnose import Diagnosis, RunFigures, _verdict

from support.clean_workers import forkserver_by_default


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamio", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_every_subcommand_once():
    out = run_cli("--help").stdout
    text = " ".join(out.split("\n\n")[1].split())  # the description paragraph, unwrapped
    subcommands = list(build_parser()._subparsers._group_actions[0].choices)
    assert text == f"The streamio command: {', '.join(subcommands)}."
    assert "bench" in subcommands and "index" in subcommands


def test_hints_on_the_command_line_use_its_options(tmp_path):
    plain = tmp_path / "x.tfrecord"
    streamio.write_records(str(plain), "tfrecord", [b"abc"] * 5)
    (tmp_path / "x.bin").write_bytes(gzip.compress(plain.read_bytes()))
    done = run_cli("count", str(tmp_path / "x.bin"), "--format", "tfrecord", "--compression", "none")
    assert done.returncode == 1
    assert "pass --compression gzip" in done.stderr and "compression=" not in done.stderr
    done = run_cli("count", str(plain), "--format", "recordio")
    assert "pass --format tfrecord" in done.stderr and "format=" not in done.stderr


def test_index_goes_on_past_a_file_it_cannot_index(tmp_path):
    tf, rec = str(tmp_path / "big.tfrecord"), str(tmp_path / "big.rec")
    streamio.write_records(tf, "tfrecord", [b"x" * 100] * 10)
    streamio.write_records(rec, "recordio", [b"y" * 100] * 10)
    # The README's old example: --format recordio for both files.
    done = run_cli("index", tf, rec, "--format", "recordio")
    assert done.returncode == 1
    assert done.stdout.split() == [rec + ".idx"] and os.path.exists(rec + ".idx")
    assert f"{tf}: CorruptRecordError" in done.stderr
    assert "looks like TFRecord data: pass --format tfrecord" in done.stderr
    os.unlink(rec + ".idx")
    # The README's example now: each file's format from its name.
    done = run_cli("index", tf, rec)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [tf + ".index", rec + ".idx"]


def test_a_channel_that_waited_in_vain_names_its_epoch(tmp_path):
    channel = PipeChannel(str(tmp_path / "train"), start_epoch=1, open_timeout=0.2)
    with pytest.raises(SourceError, match="the FIFO of epoch 1 did not appear within 0.2 s: the"
                                          " writer may have served fewer epochs") as info:
        channel.open()
    assert info.value.source == str(tmp_path / "train_1")


WRITE_TWICE = """
import sys
for _ in range(2):
    with open(sys.argv[1], "wb") as f:   # opens when the reader has the FIFO open
        f.write(open(sys.argv[2], "rb").read())
"""


def test_two_writers_back_to_back_on_one_fifo_never_hang(tmp_path):
    src = tmp_path / "a.tfrecord"
    streamio.write_records(str(src), "tfrecord", [b"r" * 10] * 3000)
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", WRITE_TWICE, fifo, str(src)])
    try:
        ds = Dataset(fifo, "tfrecord", open_timeout=1.0, read_timeout=1.0)
        counts = []
        start = time.monotonic()
        for _ in range(3):  # 6,000 records in one epoch or two; the next one has no writer
            try:
                counts.append(sum(1 for _ in ds))
            except SourceError as exc:
                assert "no writer connected" in str(exc)
                break
        assert sum(counts) == 6000 and counts in ([6000], [3000, 3000])
        assert time.monotonic() - start < 10  # ended by open_timeout, not a hang
    finally:
        writer.kill()
        writer.wait()


def _figures(name: str, *, seconds: float, batches: int, source_wait: float, decode: float,
             wait: float, step: float) -> RunFigures:
    return RunFigures(name, seconds=seconds, batches=batches, records=batches * 64,
                      bytes=batches * 64 * 1000, first_batch_s=0.01, source_wait_s=source_wait,
                      decode_s=decode, wait_s=wait, step_s=step)


def _decode_bound(parallel: int) -> Diagnosis:
    d = Diagnosis(alone=_figures("input alone", seconds=10, batches=1000, source_wait=0.5,
                                 decode=8, wait=10, step=0),
                  with_step=_figures("with step", seconds=10, batches=500, source_wait=0.5,
                                     decode=8, wait=5, step=5),
                  map_parallelism=parallel)
    _verdict(d, step_per_batch=0.010, cores=8)
    return d


def test_diagnose_advice_counts_the_parallelism_already_there():
    assert "num_parallel=2" in _decode_bound(1).suggestion
    two = _decode_bound(2)
    assert two.bottleneck == "decode"
    assert "num_parallel=4 instead of the map's 2" in two.suggestion
    d = Diagnosis(alone=two.alone, with_step=two.with_step, map_parallelism=8)
    _verdict(d, step_per_batch=0.010, cores=8)
    assert "already maps with num_parallel=8 on 8 cores" in d.suggestion


def test_print_of_a_diagnosis_is_the_report():
    d = _decode_bound(1)
    assert str(d) == d.table() and str(d).splitlines()[-1].startswith("suggestion:")
    assert "RunFigures(" not in str(d)


def _floats(batch: list) -> dict:
    # At module level: the DataLoader workers get the dataset pickled, and a lambda is not.
    return {"x": np.frombuffer(b"".join(batch), np.float32)}


def test_diagnose_reports_the_workers_figures(tmp_path):
    pytest.importorskip("torch")
    path = str(tmp_path / "x.tfrecord")
    streamio.write_records(path, "tfrecord", [np.float32(np.arange(64)).tobytes()] * 20_000)
    ds = Dataset(path, "tfrecord").batch(64).map(_floats)
    with forkserver_by_default():  # diagnose makes the DataLoader: no context to pass
        d = streamio.diagnose(ds, step_ms=0.0, seconds=3.0, workers=[2])
    workers = d.workers[0]
    assert workers.counted and workers.readers == 2 and workers.bytes > 0
    row = {line[:28].strip(): line[28:].split() for line in d.table().splitlines()}
    assert row["MB/s read"][-1] != "0.0" and float(row["MB/s read"][-1].replace(",", "")) > 0


def test_decode_advice_never_promises_more_waiting():
    d = Diagnosis(alone=_figures("input alone", seconds=10, batches=1000, source_wait=0.1,
                                 decode=9, wait=10, step=0),
                  with_step=_figures("with step", seconds=10, batches=1000, source_wait=0.1,
                                     decode=9, wait=8, step=0.001))
    _verdict(d, step_per_batch=0.000001, cores=2)
    assert d.bottleneck == "decode"
    assert "take the input from 100 to ~" in d.suggestion and "wait" not in d.suggestion

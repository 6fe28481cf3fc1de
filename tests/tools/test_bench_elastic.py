"""``streamio bench --workloads elastic`` runs in one command (a small size): one row per
source, layout and depth, each resume checked to deliver the batches the old shards had not."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


def test_elastic_benchmark_prints_a_row_per_source_layout_and_depth():
    proc = subprocess.run(
        [sys.executable, "-m", "streamio", "bench", "--workloads", "elastic", "--records",
         "3000", "--rounds", "1", "--layouts", "2-3,3-1", "--depths", "0.25,0.9"],
        capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("source"))
    assert lines[header].split() == ["source", "n->m", "depth", "elastic_s", "first_s", "same_s",
                                     "rest_s", "epoch_s"]
    rows = [line.split() for line in lines[header + 1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (source, layout, depth) for source in ("files", "gzip") for layout in ("2->3", "3->1")
        for depth in ("0.25", "0.90")]
    assert all(float(v) >= 0 for r in rows for v in r[3:])


def test_the_pipe_source_resumes_a_shared_channel_in_real_jobs():
    """``--sources pipe``: a PipeChannel fed by a writer process, read by DataLoader workers
    that share it; each resumed job is checked (in the benchmark) to deliver exactly the
    batches the interrupted one had not."""
    pytest.importorskip("torchdata.stateful_dataloader")
    proc = subprocess.run(
        [sys.executable, "-m", "streamio", "bench", "--workloads", "elastic", "--records",
         "3000", "--rounds", "1", "--layouts", "2-3,1-2", "--depths", "0.5",
         "--sources", "pipe"], capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("source"))
    rows = [line.split() for line in lines[header + 1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("pipe", "2->3", "0.50"),
                                                  ("pipe", "1->2", "0.50")]
    assert all(float(v) >= 0 for r in rows for v in r[3:])

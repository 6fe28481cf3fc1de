"""``streamio bench --workloads torch-workers`` runs end to end: numpy, ``num_workers=0`` and
``num_workers=2`` (and the DataLoader's floor) from part files and from one FIFO, each a fresh
process that checks both epochs delivered every record, and one row per case with the CPU time
per batch of the main process and of its workers."""

from __future__ import annotations

import json

import pytest


def test_the_torch_workers_benchmark_runs_and_reports_every_case(tmp_path, capsys):
    pytest.importorskip("torch")
    from streamio.bench import main

    out = tmp_path / "r.json"
    # Workers' CPU comes from /proc in clock ticks (10 ms): enough records that two workers
    # spend several (3,000 records read 0 ticks on a quiet machine).
    assert main(["--workloads", "torch-workers", "--records", "40000", "--rounds", "1",
                 "--batch-sizes", "256", "--json", str(out)]) == 0
    rows = {row["case"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"files/bs256/numpy", "files/bs256/w0", "files/bs256/w2",
                         "files/bs256/floor-w2", "fifo/bs256/numpy", "fifo/bs256/w0",
                         "fifo/bs256/w2"}
    assert all(row["median"] > 0 and row["ratio"] > 0 for row in rows.values())
    assert rows["files/bs256/numpy"]["ratio"] == 1.0
    # Where the time went: CPU per batch of the main process and of its workers (from /proc).
    assert all(row["main_cpu_us"] > 0 for row in rows.values())
    assert rows["files/bs256/w2"]["workers_cpu_us"] > 0
    assert rows["files/bs256/numpy"]["workers_cpu_us"] == 0
    printed = capsys.readouterr().out
    assert "load average before" in printed and "fifo/bs256/w2" in printed

"""The benchmark's end-to-end adapter rows run: to_tf() in both graph-mode loops reading a FIFO
in the TensorFlow worker, tf.data on the file, to_torch() through DataLoader with 0 and 2
workers, each counting every record (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from streamio.bench import main

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("torch") is None,
    reason="the adapter rows need tensorflow and torch (CI installs both)")


def test_adapter_rows_run_in_their_workers_and_count_every_record(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["--workloads", "adapters", "--scale", "0.01", "--rounds", "1", "--quiet",
                 "--tmpdir", str(tmp_path / "work"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cases = {c["case"]: c for c in report["cases"]}
    records = report["workloads"]["adapters"]["records"]
    assert records == 2000 and len(report["workloads"]["adapters"]["meta"]["parts"]) == 4
    expected = {"adapters/numpy": ("fifo", "streamio"), "adapters/numpy-files": ("file", "streamio"),
                "adapters/to_tf-graph": ("fifo", "tf"), "adapters/to_tf-step": ("fifo", "tf"),
                "adapters/tf.data-graph": ("file", "tf"), "adapters/tf.data-step": ("file", "tf"),
                "adapters/to_torch-w0": ("file", "torch"),
                "adapters/to_torch-w2": ("file", "torch")}
    for name, (source, process) in expected.items():
        case = cases[name]
        assert "error" not in case and "skipped" not in case, case
        assert (case["input"], case["process"]) == (source, process)
        assert case["records"] == records and case["records_per_s"] > 0
    ratios = {r["name"]: r for r in report["ratios"]}
    graph = ratios["adapters: to_tf() / tf.data, graph loop"]
    assert graph["value"] is not None and graph["target"] == 2.0 and graph["met"] is None
    assert ratios["adapters: to_torch() DataLoader(2) / numpy"]["value"] is not None
    assert not list((tmp_path / "work").glob("fifo-*"))  # every FIFO was removed

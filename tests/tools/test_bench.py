"""The benchmark (streamio.bench) runs end to end in one command."""

from __future__ import annotations

def test_benchmark_runs_in_one_command_and_writes_json(tmp_path):
    """A tiny run (no peers: no TensorFlow in this process) gives the table and the JSON."""
    import json

    from streamio.bench import main

    out = tmp_path / "bench.json"
    assert main(["--scale", "0.002", "--rounds", "1", "--no-peers", "--quiet",
                 "--tmpdir", str(tmp_path / "work"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cases = {c["case"]: c for c in report["cases"]}
    assert report["machine"]["nproc"] >= 1
    # Frames-only cases need no decoder, so they always run, and count every record.
    for name in ("examples/read_records", "large/streamio-read_records", "large/raw-read"):
        assert "error" not in cases[name], cases[name]
        assert cases[name]["records"] == report["workloads"][name.split("/")[0]]["records"]
    # The pipeline case has its own workload, and every variant delivers all of it.
    for name in ("pipeline/bare-decode", "pipeline/shuffle-batch-prefetch",
                 "pipeline/shuffle-batch-prefetch2", "pipeline/shuffle-batch"):
        assert "error" not in cases[name], cases[name]
        assert cases[name]["records"] == report["workloads"]["pipeline"]["records"]
    assert {r["name"] for r in report["ratios"]} >= {"examples: streamio / tf.data",
                                                     "csv: streamio / pandas"}
    assert not list((tmp_path / "work").glob("fifo-*"))  # every FIFO was removed

"""``streamio bench --workloads mix`` runs end to end and prints one row per pipeline."""

from __future__ import annotations


def test_the_mix_benchmark_runs_and_reports_each_pipeline(capsys):
    from streamio.bench import main

    assert main(["--workloads", "mix", "--records", "2000", "--large-records", "40",
                 "--rounds", "2", "--epochs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"raw", "decoded", "raw-16k"}
    # alone_s mixed_s ratio [q1-q3] alone_cpu mixed_cpu cpu_ratio alone_flt mixed_flt: times
    # (printed to the ms: a fast machine may print 0.000), positive ratios within their
    # quartiles, page faults per epoch
    for row in rows.values():
        assert len(row) == 9
        low, high = (float(q) for q in row[3].strip("[]").split("-"))
        values = [float(v) for v in row[:3] + row[4:]]
        assert all(v >= 0 for v in values) and values[2] > 0 and values[5] > 0
        assert 0 < low <= float(row[2]) <= high

"""``streamio bench --workloads mix`` runs end to end and prints one row per pipeline."""

from __future__ import annotations


def test_the_mix_benchmark_runs_and_reports_each_pipeline(capsys):
    from streamio.bench import main

    assert main(["--workloads", "mix", "--records", "2000", "--large-records", "40",
                 "--rounds", "2", "--epochs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"raw", "decoded", "raw-16k", "raw-placed"}
    # alone_s mixed_s ratio [q1-q3] [ci95] alone_cpu mixed_cpu cpu_ratio alone_flt mixed_flt:
    # times (printed to the ms: a fast machine may print 0.000), positive ratios within their
    # quartiles and the median's confidence interval, page faults per epoch
    for row in rows.values():
        assert len(row) == 10
        values = [float(v) for v in row[:3] + row[5:]]
        assert all(v >= 0 for v in values) and values[2] > 0 and values[5] > 0
        for bracket in row[3:5]:
            low, high = (float(q) for q in bracket.strip("[]").split("-"))
            assert 0 < low <= float(row[2]) <= high


def test_the_median_interval_holds_the_median_and_narrows_with_more_pairs():
    import random
    import statistics

    from streamio.bench.mix import _median_interval

    rng = random.Random(0)
    few = [rng.gauss(1.1, 0.1) for _ in range(20)]
    many = [rng.gauss(1.1, 0.1) for _ in range(500)]
    for values in (few, many, [1.0], [2.0, 1.0]):
        low, high = _median_interval(values)
        assert min(values) <= low <= statistics.median(values) <= high <= max(values)
    assert _median_interval(many)[1] - _median_interval(many)[0] < (
        _median_interval(few)[1] - _median_interval(few)[0])
    # About 95% coverage: of 400 samples of 60 pairs, the interval holds the true median
    # (1.1) in 90-99% of them.
    held = 0
    for _ in range(400):
        low, high = _median_interval([rng.gauss(1.1, 0.1) for _ in range(60)])
        held += low <= 1.1 <= high
    assert 360 <= held <= 396

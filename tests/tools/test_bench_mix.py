"""``streamio bench --workloads mix`` runs end to end and prints one row per pipeline."""

from __future__ import annotations


def test_the_mix_benchmark_runs_and_reports_each_pipeline(capsys):
    from streamio.bench import main

    assert main(["--workloads", "mix", "--records", "2000", "--large-records", "40",
                 "--rounds", "2", "--epochs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"raw", "decoded", "raw-16k", "raw-placed"}
    # alone_s mixed_s ratio [q1-q3] [ci95] [ci95_rounds] alone_cpu mixed_cpu cpu_ratio
    # alone_flt mixed_flt: times (printed to the ms: a fast machine may print 0.000), positive
    # ratios within their quartiles and the median's confidence interval from the pairs, an
    # interval from the rounds' medians, page faults per epoch
    for row in rows.values():
        assert len(row) == 11
        values = [float(v) for v in row[:3] + row[6:]]
        assert all(v >= 0 for v in values) and values[2] > 0 and values[5] > 0
        for bracket in row[3:5]:
            low, high = (float(q) for q in bracket.strip("[]").split("-"))
            assert 0 < low <= float(row[2]) <= high
        low, high = (float(q) for q in row[5].strip("[]").split("-"))
        assert 0 < low <= high


def test_the_rounds_interval_is_wider_when_rounds_differ_more_than_their_pairs():
    """Pairs of a round share their processes: when whole rounds differ (one round's mix slower
    throughout) the interval from the rounds' medians says so, while the pairs' interval, which
    takes every pair as independent, stays narrow; rounds that agree give a narrow one too."""
    import random

    from streamio.bench.mix import _summary

    rng = random.Random(0)

    def figures(round_spread: float) -> dict:
        runs: dict = {"alone": [], "mixed": []}
        first = []
        for r in range(8):
            first.append(len(runs["alone"]))
            slower = 1.1 + round_spread * rng.uniform(-1, 1)  # this round's processes
            for _ in range(12):
                alone = rng.uniform(0.03, 0.04)
                runs["alone"].append({"wall": alone, "cpu": alone, "faults": 0})
                mixed = alone * slower * rng.gauss(1, 0.01)
                runs["mixed"].append({"wall": mixed, "cpu": mixed, "faults": 0})
        return _summary(runs, first)

    apart, together = figures(0.08), figures(0.0)
    width = {name: (f["wall_interval"][1] - f["wall_interval"][0],
                    f["wall_round_interval"][1] - f["wall_round_interval"][0])
             for name, f in (("apart", apart), ("together", together))}
    assert width["apart"][0] < 0.04 < width["apart"][1]  # pairs: narrow; rounds: not
    assert width["together"][1] < 0.04
    for f in (apart, together):
        low, high = f["wall_round_interval"]
        assert low <= f["wall_ratio"] <= high


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

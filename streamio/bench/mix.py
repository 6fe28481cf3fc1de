"""What mixing costs: ``streamio bench --workloads mix``.

Writes two TFRecord files of tf.train.Example records (the benchmark's: ``x`` float32[32],
``label``; 178 bytes), ``a`` with 3/4 of ``--records`` and ``b`` with the rest, and times one
epoch of

- ``alone``: ``Dataset([a, b])``, the two files read one after the other;
- ``mixed``: ``streamio.mix([Dataset(a), Dataset(b)], [0.75, 0.25], stop="all_exhausted")``,

the same records either way, in three pipelines: ``raw`` (records, no decoder), ``decoded``
(the Example decoder, ``batch(256)``) and ``raw-16k`` (``--large-records`` records of 16 KiB,
split the same way: per-record costs that dwarf the placement). Each round times both (in
alternating order); the report gives the median times and the median of the per-round ratios mixed / alone (the
target: at most 1.10), in wall-clock time and in the process's CPU time (which a machine shared
with other jobs disturbs less).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import streamio

from .cases import example_decoder
from .workloads import example_payloads

BATCH = 256


def _epoch_s(ds: streamio.Dataset) -> tuple:
    """(wall seconds, CPU seconds of this process, items) of one epoch. CPU time counts the
    epoch's own work, not the time other jobs on a shared machine held the cores; the pipelines
    run no threads of their own, so on a quiet machine the two agree."""
    w0, c0 = time.perf_counter(), time.process_time()
    items = 0
    for _ in ds:
        items += 1
    return time.perf_counter() - w0, time.process_time() - c0, items


LARGE_RECORD = 16 * 1024


def _pipelines(a: str, b: str, decoded: bool) -> tuple:
    decoder = example_decoder() if decoded else None
    alone = streamio.Dataset([a, b], "tfrecord", decoder=decoder)
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=decoder),
                          streamio.Dataset(b, "tfrecord", decoder=decoder)],
                         [0.75, 0.25], seed=0, stop="all_exhausted")
    if decoded:
        alone, mixed = alone.batch(BATCH), mixed.batch(BATCH)
    return alone, mixed


def _write_pair(tmp: str, name: str, records: list) -> tuple:
    split = len(records) * 3 // 4
    a, b = os.path.join(tmp, f"{name}-a.tfrecord"), os.path.join(tmp, f"{name}-b.tfrecord")
    streamio.write_records(a, "tfrecord", records[:split])
    streamio.write_records(b, "tfrecord", records[split:])
    return a, b


def _measure(alone: streamio.Dataset, mixed: streamio.Dataset, rounds: int) -> dict:
    """Median alone and mixed epoch times (wall, CPU) and the medians of the per-round ratios."""
    _epoch_s(alone), _epoch_s(mixed)  # warm the page cache and the decoder
    runs: dict = {"alone": [], "mixed": []}
    for r in range(rounds):
        order = ("alone", "mixed") if r % 2 == 0 else ("mixed", "alone")
        got = {kind: _epoch_s(alone if kind == "alone" else mixed) for kind in order}
        if got["alone"][2] != got["mixed"][2]:
            raise SystemExit(f"the mix delivered {got['mixed'][2]} items, the inputs alone"
                             f" {got['alone'][2]}")
        for kind in runs:
            runs[kind].append(got[kind])
    out = {}
    for i, clock in enumerate(("wall", "cpu")):
        out[clock] = tuple(statistics.median(run[i] for run in runs[kind]) for kind in runs)
        out[f"{clock}_ratio"] = statistics.median(m[i] / a[i] for a, m in zip(runs["alone"],
                                                                               runs["mixed"]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--large-records", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        a, b = _write_pair(tmp, "examples", [bytes(p) for p in payloads])
        del payloads
        rng = np.random.default_rng(1)
        big_a, big_b = _write_pair(tmp, "large", [rng.bytes(LARGE_RECORD)
                                                  for _ in range(args.large_records)])
        print(f"{args.records} Example records and {args.large_records} of 16 KiB, 3/4 in a,"
              f" 1/4 in b; weights [0.75, 0.25], stop='all_exhausted'; {args.rounds} rounds,"
              " medians")
        print(f"{'pipeline':9} {'alone_s':>8} {'mixed_s':>8} {'ratio':>6} {'alone_cpu':>9}"
              f" {'mixed_cpu':>9} {'cpu_ratio':>9}")
        cases = (("raw", a, b, False), ("decoded", a, b, True), ("raw-16k", big_a, big_b, False))
        for name, first, second, decoded in cases:
            m = _measure(*_pipelines(first, second, decoded), args.rounds)
            print(f"{name:9} {m['wall'][0]:8.3f} {m['wall'][1]:8.3f} {m['wall_ratio']:6.2f}"
                  f" {m['cpu'][0]:9.3f} {m['cpu'][1]:9.3f} {m['cpu_ratio']:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

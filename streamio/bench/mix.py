"""What mixing costs: ``streamio bench --workloads mix``.

Writes two TFRecord files of tf.train.Example records (the benchmark's: ``x`` float32[32],
``label``; 178 bytes), ``a`` with 3/4 of ``--records`` and ``b`` with the rest, and times
epochs of

- ``alone``: ``Dataset([a, b])``, the two files read one after the other;
- ``mixed``: ``streamio.mix([Dataset(a), Dataset(b)], [0.75, 0.25], stop="all_exhausted")``,

the same records either way, in three pipelines: ``raw`` (records, no decoder), ``decoded``
(the Example decoder, ``batch(256)``) and ``raw-16k`` (``--large-records`` records of 16 KiB,
split the same way: per-record costs that dwarf the placement).

Each pipeline runs in a fresh process of its own, as a training job runs one of them: a process
that ran the other pipeline first would start from the heap that one left (the C allocator
returns memory to the system, or keeps it, by thresholds that earlier allocations move, and the
page faults of memory taken back from the system are a tenth of an epoch here). A round runs
``alone`` and ``mixed`` once each (in alternating order), each process one epoch to warm up and
then ``--epochs``; the report gives the medians of the processes' median epoch times, the median
of the per-round ratios mixed / alone (the target: at most 1.10) in wall-clock time and in the
process's CPU time (which a machine shared with other jobs disturbs less), and the minor page
faults per epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
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


def _child(case: str, kind: str, a: str, b: str, epochs: int) -> int:
    """One process's measurement: a warm-up epoch, then ``epochs``; prints the median epoch's
    wall and CPU seconds, the items of an epoch and the minor page faults per epoch (JSON)."""
    alone, mixed = _pipelines(a, b, case == "decoded")
    ds = alone if kind == "alone" else mixed
    _epoch_s(ds)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    runs = [_epoch_s(ds) for _ in range(epochs)]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    if len({items for _, _, items in runs}) != 1:
        raise SystemExit(f"the {kind} pipeline delivered different item counts across epochs")
    print(json.dumps({"wall": statistics.median(r[0] for r in runs),
                      "cpu": statistics.median(r[1] for r in runs),
                      "items": runs[0][2], "faults": faults / epochs}))
    return 0


def _run_child(case: str, kind: str, a: str, b: str, epochs: int) -> dict:
    # The streamio this process runs, whether installed or not.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(streamio.__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-m", "streamio.bench.mix", "--child", case, kind,
                           a, b, str(epochs)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {case} {kind} measurement failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure(case: str, a: str, b: str, rounds: int, epochs: int) -> dict:
    """Median alone and mixed epoch times (wall, CPU), the medians of the per-round ratios and
    the page faults per epoch, each pipeline in its own process every round."""
    runs: dict = {"alone": [], "mixed": []}
    for r in range(rounds):
        order = ("alone", "mixed") if r % 2 == 0 else ("mixed", "alone")
        got = {kind: _run_child(case, kind, a, b, epochs) for kind in order}
        if got["alone"]["items"] != got["mixed"]["items"]:
            raise SystemExit(f"the mix delivered {got['mixed']['items']} items, the inputs"
                             f" alone {got['alone']['items']}")
        for kind in runs:
            runs[kind].append(got[kind])
    out = {}
    for clock in ("wall", "cpu", "faults"):
        out[clock] = tuple(statistics.median(run[clock] for run in runs[kind]) for kind in runs)
    for clock in ("wall", "cpu"):
        out[f"{clock}_ratio"] = statistics.median(
            m[clock] / a[clock] if a[clock] > 0 else 1.0
            for a, m in zip(runs["alone"], runs["mixed"]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--large-records", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--epochs", type=int, default=5,
                        help="epochs timed in each process, after one to warm up")
    parser.add_argument("--child", nargs=5, metavar=("CASE", "KIND", "A", "B", "EPOCHS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        case, kind, a, b, epochs = args.child
        return _child(case, kind, a, b, int(epochs))
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        a, b = _write_pair(tmp, "examples", [bytes(p) for p in payloads])
        del payloads
        rng = np.random.default_rng(1)
        big_a, big_b = _write_pair(tmp, "large", [rng.bytes(LARGE_RECORD)
                                                  for _ in range(args.large_records)])
        print(f"{args.records} Example records and {args.large_records} of 16 KiB, 3/4 in a,"
              f" 1/4 in b; weights [0.75, 0.25], stop='all_exhausted'; {args.rounds} rounds of"
              f" a fresh process each ({args.epochs} epochs after one to warm up), medians")
        print(f"{'pipeline':9} {'alone_s':>8} {'mixed_s':>8} {'ratio':>6} {'alone_cpu':>9}"
              f" {'mixed_cpu':>9} {'cpu_ratio':>9} {'alone_flt':>9} {'mixed_flt':>9}")
        for name, first, second in (("raw", a, b), ("decoded", a, b),
                                    ("raw-16k", big_a, big_b)):
            m = _measure(name, first, second, args.rounds, args.epochs)
            print(f"{name:9} {m['wall'][0]:8.3f} {m['wall'][1]:8.3f} {m['wall_ratio']:6.2f}"
                  f" {m['cpu'][0]:9.3f} {m['cpu'][1]:9.3f} {m['cpu_ratio']:9.2f}"
                  f" {m['faults'][0]:9.0f} {m['faults'][1]:9.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

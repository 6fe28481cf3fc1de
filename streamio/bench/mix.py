"""What mixing costs: ``streamio bench --workloads mix``.

Writes two TFRecord files of tf.train.Example records (the benchmark's: ``x`` float32[32],
``label``; 178 bytes), ``a`` with 3/4 of ``--records`` and ``b`` with the rest, and times
epochs of

- ``alone``: ``Dataset([a, b])``, the two files read one after the other;
- ``mixed``: ``streamio.mix([Dataset(a), Dataset(b)], [0.75, 0.25], stop="all_exhausted")``,

the same records either way, in four pipelines: ``raw`` (records, no decoder), ``decoded``
(the Example decoder, ``batch(256)``), ``raw-16k`` (``--large-records`` records of 16 KiB,
split the same way: per-record costs that dwarf the placement) and ``raw-placed`` (``raw``
with the mix placing records its inputs' readers made, the way before it made them in output
order: ``streamio.pipeline.mix.SPANS = False``; what that change is worth, in the same run).

Each pipeline runs in a fresh process of its own, as a training job runs one of them: a process
that ran another pipeline first would start from the heap that one left (the C allocator keeps
memory or returns it to the system by thresholds that earlier allocations move). A round starts
an ``alone`` and a ``mixed`` process side by side; each runs one epoch to warm up, then they
take ``--epochs`` epochs by turns (one runs while the other waits; who goes first alternates),
so each pair of epochs is timed within a fraction of a second and a machine whose speed drifts
slows both alike. The report (:func:`_summary`) gives the median epoch times, the median of the
per-pair ratios mixed / alone (the target: at most 1.10) with its quartiles and two 95%
confidence intervals of that median, in wall-clock and in CPU time (which other jobs on the
machine disturb less), and the minor page faults per epoch. Figures: docs/mixing.md, and
docs/performance.md for the history.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

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


def _child(case: str, kind: str, a: str, b: str) -> int:
    """One process of a round: a warm-up epoch, then an epoch each time a line asks for one
    (its wall and CPU seconds, items and minor page faults, as a JSON line), until stdin ends."""
    if case.endswith("-placed"):
        from streamio.pipeline import mix as mix_module

        mix_module.SPANS = False
    alone, mixed = _pipelines(a, b, case == "decoded")
    ds = alone if kind == "alone" else mixed
    _epoch_s(ds)
    print("ready", flush=True)
    for _ in sys.stdin:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wall, cpu, items = _epoch_s(ds)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(json.dumps({"wall": wall, "cpu": cpu, "items": items, "faults": faults}),
              flush=True)
    return 0


class _Child:
    """A child process running one pipeline, an epoch at a time on request."""

    #: Seconds a child may take to start or to run one epoch before it counts as failed.
    TIMEOUT = 600

    def __init__(self, case: str, kind: str, a: str, b: str) -> None:
        # The streamio this process runs, whether installed or not.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
            streamio.__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self.what = f"the {case} {kind} measurement"
        # Its stderr to a file: a pipe nobody reads until the end could fill and stop it.
        self.errors = tempfile.NamedTemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamio.bench.mix", "--child", case, kind, a, b],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
            text=True)
        self._line("ready")

    def _line(self, expect: Optional[str] = None) -> str:
        # One line answers each request, so nothing waits in the reader's buffer: select() on
        # the pipe tells whether the answer came in time.
        ready = select.select([self.proc.stdout], [], [], self.TIMEOUT)[0]
        line = self.proc.stdout.readline() if ready else ""
        if not line or (expect is not None and line.strip() != expect):
            self.proc.kill()
            self.proc.wait()
            said = self._said()
            self.close()
            late = "" if ready else f"no answer in {self.TIMEOUT} s\n"
            raise SystemExit(f"{self.what} failed:\n{late}{line}{said}")
        return line

    def _said(self, most: int = 2000) -> str:
        """The last ``most`` characters the child wrote to its stderr (the file opened again by
        its name: the child's writes moved the offset this handle shares with it)."""
        with open(self.errors.name, "rb") as f:
            return f.read().decode("utf-8", "replace")[-most:]

    def epoch(self) -> dict:
        self.proc.stdin.write("epoch\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the child's loop ends with its stdin
        except OSError:  # it is gone already
            pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=self.TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.errors.close()  # closing twice is harmless


def _quartiles(values: list) -> tuple:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return q[0], q[2]


def _median_interval(values: list, z: float = 1.96) -> tuple:
    """A distribution-free confidence interval of the median of ``values`` (about 95% with
    the default ``z``): the order statistics whose ranks are ``n/2 -+ z*sqrt(n)/2`` (the normal
    approximation of the binomial count of values under the median). It says whether the median
    ratio is under a target, which the quartiles (the spread of single pairs) do not."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[low], ordered[max(low, high)]


def _measure(case: str, a: str, b: str, rounds: int, epochs: int) -> dict:
    """Median alone and mixed epoch times (wall, CPU), the median and quartiles of the
    per-pair ratios and the page faults per epoch: ``rounds`` pairs of fresh processes, each
    pair timing ``epochs`` epochs by turns."""
    runs: dict = {"alone": [], "mixed": []}
    first_of_round: list = []  # where each round's pairs start in runs
    for r in range(rounds):
        first_of_round.append(len(runs["alone"]))
        children = {kind: _Child(case, kind, a, b) for kind in runs}
        try:
            for e in range(epochs):
                order = ("alone", "mixed") if (r + e) % 2 == 0 else ("mixed", "alone")
                got = {kind: children[kind].epoch() for kind in order}
                if got["alone"]["items"] != got["mixed"]["items"]:
                    raise SystemExit(f"the mix delivered {got['mixed']['items']} items, the"
                                     f" inputs alone {got['alone']['items']}")
                for kind in runs:
                    runs[kind].append(got[kind])
        finally:
            for child in children.values():
                child.close()
    return _summary(runs, first_of_round)


def _summary(runs: dict, first_of_round: list) -> dict:
    """The figures of :func:`_measure` from its epochs (``runs``: each kind's epochs, pair by
    pair; ``first_of_round``: where each round's pairs start).

    The quartiles are the spread of single pairs; the two 95% intervals of the median ratio say
    whether it is under the target (on a noisy machine a few rounds cannot say): one from the
    pairs (``*_interval``), one from the rounds' medians (``*_round_interval``, "ci95_rounds" in
    the report). Judge a target by the rounds' one (see the comment below)."""
    out: dict = {}
    for clock in ("wall", "cpu", "faults"):
        out[clock] = tuple(statistics.median(run[clock] for run in runs[kind]) for kind in runs)
    for clock in ("wall", "cpu"):
        ratios = [m[clock] / a[clock] if a[clock] > 0 else 1.0
                  for a, m in zip(runs["alone"], runs["mixed"])]
        out[f"{clock}_ratio"] = statistics.median(ratios)
        out[f"{clock}_quartiles"] = _quartiles(ratios)
        out[f"{clock}_interval"] = _median_interval(ratios)
        # The pairs of a round share their two processes (their heaps, where their pages
        # lie), so their ratios are not independent: runs of the same code differed by more
        # than the pairs' interval says. The interval of the rounds' medians does not assume
        # they are (wider, with fewer values).
        bounds = first_of_round + [len(ratios)]
        out[f"{clock}_round_interval"] = _median_interval(
            [statistics.median(ratios[i:j]) for i, j in zip(bounds, bounds[1:]) if j > i])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--large-records", type=int, default=8000)
    # 144 pairs a pipeline: about 2 minutes for the four; the median's 95% interval is then
    # about +-0.03 on the development VM, where a single pair's ratio spreads +-0.1.
    parser.add_argument("--rounds", type=int, default=12,
                        help="pairs of fresh processes (alone, mixed) per pipeline")
    parser.add_argument("--epochs", type=int, default=12,
                        help="epochs each process of a pair times, by turns, after one to warm up")
    parser.add_argument("--child", nargs=4, metavar=("CASE", "KIND", "A", "B"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(*args.child)
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        a, b = _write_pair(tmp, "examples", [bytes(p) for p in payloads])
        del payloads
        rng = np.random.default_rng(1)
        big_a, big_b = _write_pair(tmp, "large", [rng.bytes(LARGE_RECORD)
                                                  for _ in range(args.large_records)])
        print(f"{args.records} Example records and {args.large_records} of 16 KiB, 3/4 in a,"
              f" 1/4 in b; weights [0.75, 0.25], stop='all_exhausted'; {args.rounds} pairs of"
              f" fresh processes, {args.epochs} epochs each by turns after one to warm up;"
              f" medians, ratios per pair of epochs (quartiles in brackets, then the median"
              f" ratio's 95% confidence interval from the pairs, and from the rounds' medians:"
              f" the pairs of a round share their processes, so judge a target by the second)")
        print(f"{'pipeline':10} {'alone_s':>8} {'mixed_s':>8} {'ratio':>6} {'quartiles':>11}"
              f" {'ci95':>11} {'ci95_rounds':>11}"
              f" {'alone_cpu':>9} {'mixed_cpu':>9} {'cpu_ratio':>9} {'alone_flt':>9}"
              f" {'mixed_flt':>9}")
        for name, first, second in (("raw", a, b), ("decoded", a, b),
                                    ("raw-16k", big_a, big_b), ("raw-placed", a, b)):
            m = _measure(name, first, second, args.rounds, args.epochs)
            low, high = m["wall_quartiles"]
            sure_low, sure_high = m["wall_interval"]
            round_low, round_high = m["wall_round_interval"]
            print(f"{name:10} {m['wall'][0]:8.3f} {m['wall'][1]:8.3f} {m['wall_ratio']:6.2f}"
                  f" {f'[{low:.2f}-{high:.2f}]':>11} {f'[{sure_low:.2f}-{sure_high:.2f}]':>11}"
                  f" {f'[{round_low:.2f}-{round_high:.2f}]':>11}"
                  f" {m['cpu'][0]:9.3f} {m['cpu'][1]:9.3f}"
                  f" {m['cpu_ratio']:9.2f} {m['faults'][0]:9.0f} {m['faults'][1]:9.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

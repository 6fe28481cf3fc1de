"""What mixing costs: ``streamio bench --workloads mix``.

Writes two TFRecord files of tf.train.Example records (the benchmark's: ``x`` float32[32],
``label``), ``a`` with 3/4 of ``--records`` and ``b`` with the rest, and times one epoch of

- ``alone``: ``Dataset([a, b])``, the two files read one after the other;
- ``mixed``: ``streamio.mix([Dataset(a), Dataset(b)], [0.75, 0.25], stop="all_exhausted")``,

the same records either way, in two pipelines: ``raw`` (records, no decoder) and ``decoded``
(the Example decoder, ``batch(256)``). Each round times both (in alternating order); the
report gives the median of the per-round ratios mixed / alone (the target: at most 1.10) and
the median times.
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
    t0 = time.perf_counter()
    items = 0
    for _ in ds:
        items += 1
    return time.perf_counter() - t0, items


def _pipelines(a: str, b: str, decoded: bool) -> tuple:
    decoder = example_decoder() if decoded else None
    alone = streamio.Dataset([a, b], "tfrecord", decoder=decoder)
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=decoder),
                          streamio.Dataset(b, "tfrecord", decoder=decoder)],
                         [0.75, 0.25], seed=0, stop="all_exhausted")
    if decoded:
        alone, mixed = alone.batch(BATCH), mixed.batch(BATCH)
    return alone, mixed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        records = [bytes(p) for p in payloads]
        split = args.records * 3 // 4
        a, b = os.path.join(tmp, "a.tfrecord"), os.path.join(tmp, "b.tfrecord")
        streamio.write_records(a, "tfrecord", records[:split])
        streamio.write_records(b, "tfrecord", records[split:])
        del records, payloads
        print(f"{args.records} Example records ({split} + {args.records - split}), weights"
              f" [0.75, 0.25], stop='all_exhausted'; {args.rounds} rounds, medians")
        print(f"{'pipeline':9} {'alone_s':>8} {'mixed_s':>8} {'ratio':>6}")
        for name, decoded in (("raw", False), ("decoded", True)):
            alone, mixed = _pipelines(a, b, decoded)
            _epoch_s(alone), _epoch_s(mixed)  # warm the page cache and the decoder
            times: dict = {"alone": [], "mixed": []}
            ratios = []
            for r in range(args.rounds):
                order = ("alone", "mixed") if r % 2 == 0 else ("mixed", "alone")
                got = {}
                for kind in order:
                    got[kind] = _epoch_s(alone if kind == "alone" else mixed)
                if got["alone"][1] != got["mixed"][1]:
                    raise SystemExit(f"the mix delivered {got['mixed'][1]} items, the inputs"
                                     f" alone {got['alone'][1]}")
                for kind in times:
                    times[kind].append(got[kind][0])
                ratios.append(got["mixed"][0] / got["alone"][0])
            print(f"{name:9} {statistics.median(times['alone']):8.3f}"
                  f" {statistics.median(times['mixed']):8.3f} {statistics.median(ratios):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

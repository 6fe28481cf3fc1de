"""A cached epoch against the first: ``streamio bench --workloads cache``.

Writes N tf.train.Example records (``x`` float32[32], ``label``; the benchmark's records) as a
TFRecord file and serves it from an HTTP server on 127.0.0.1. For each source (file, HTTP) and
cache (memory, directory), each round builds a fresh Dataset (and an empty cache directory) and
times:

- ``plain_s``: one epoch of the pipeline without a cache (read, frame, decode);
- ``fill_s``: epoch 0 with ``.cache()``: the same work, plus keeping the decoded batches;
- ``cached_s``: epochs 1 and 2 (their mean), served from the cache;

and prints the medians over the rounds, the records per second of a cached epoch and the
ratios ``fill/plain`` (what filling costs) and ``plain/cached`` (what a cached epoch saves).

Pipeline: ``batch(256).cache(...).shuffle_batches(16, seed=0)`` with the Example decoder.
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
from .resume import _serve
from .workloads import example_payloads


def _pipeline(source: str, where: object) -> streamio.Dataset:
    ds = streamio.Dataset(source, "tfrecord", decoder=example_decoder()).batch(256)
    ds = ds.prefetch(1) if where is False else ds.cache(where)
    return ds.shuffle_batches(16, seed=0)


def _epoch_s(ds: streamio.Dataset) -> float:
    t0 = time.perf_counter()
    for _ in ds:
        pass
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        plain = os.path.join(tmp, "data.tfrecord")
        streamio.write_records(plain, "tfrecord", [bytes(p) for p in payloads])
        del payloads
        server, base = _serve(tmp)
        try:
            sources = {"file": plain, "http": f"{base}/data.tfrecord"}
            print(f"{args.records} records, {os.stat(plain).st_size / 1e6:.1f} MB;"
                  f" batch(256).cache().shuffle_batches(16), Example decoder;"
                  f" medians of {args.rounds} rounds")
            print(f"{'source':6} {'cache':9} {'plain_s':>8} {'fill_s':>8} {'cached_s':>9}"
                  f" {'cached rec/s':>13} {'fill/plain':>11} {'plain/cached':>13}")
            for kind, source in sources.items():
                for cache in ("memory", "directory"):
                    rows = []
                    for r in range(args.rounds):
                        where = None if cache == "memory" else os.path.join(tmp, f"c-{kind}-{r}")
                        plain_s = _epoch_s(_pipeline(source, False))
                        ds = _pipeline(source, where)
                        fill_s = _epoch_s(ds)
                        cached_s = (_epoch_s(ds) + _epoch_s(ds)) / 2
                        rows.append((plain_s, fill_s, cached_s))
                    p, f, c = (statistics.median(col) for col in zip(*rows))
                    print(f"{kind:6} {cache:9} {p:8.3f} {f:8.3f} {c:9.3f}"
                          f" {args.records / c:13,.0f} {f / p:11.2f} {p / c:13.1f}")
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

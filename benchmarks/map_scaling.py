"""How a GIL-releasing map scales with num_parallel (not a test: prints a table).

usage: PYTHONPATH=. python benchmarks/map_scaling.py [--records 600] [--size 100000]
       [--work zlib|sleep]
Each record is ~100 KB of zlib-compressed bytes; the map decompresses it (zlib releases the GIL)
and hashes the result (hashlib releases it too, for buffers over 2 KB).
"""

import argparse
import hashlib
import os
import tempfile
import time
import zlib

import numpy as np

import streamio
from streamio import Dataset


def work(record: bytes) -> bytes:
    return hashlib.sha256(zlib.decompress(record)).digest()


def nap(record: bytes) -> int:
    time.sleep(0.001)  # an I/O-like wait: scales with parallelism even on a busy machine
    return len(record)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=600)
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", choices=["zlib", "sleep"], default="zlib")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    # Half random bytes, half zeros: compresses to ~55% and takes ~0.3 ms to inflate.
    records = []
    for _ in range(args.records):
        raw = rng.integers(0, 256, args.size // 2, dtype=np.uint8).tobytes() + bytes(args.size // 2)
        records.append(zlib.compress(raw, 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.tfrecord")
        streamio.write_records(path, "tfrecord", records)
        mb = sum(map(len, records)) / 1e6
        configs = [("inline", None, "thread"), ("1 thread", 1, "thread"),
                   ("2 threads", 2, "thread"), ("1 process", 1, "process"),
                   ("2 processes", 2, "process")]
        best: dict = {}
        startup: dict = {}
        for _ in range(args.rounds):
            for name, k, backend in configs:
                fn = work if args.work == "zlib" else nap
                ds = Dataset(path, "tfrecord").map(fn, num_parallel=k, backend=backend)
                # Steady state: timed from the first item (process start-up, once per epoch,
                # is reported apart).
                t_start = time.perf_counter()
                it = iter(ds)
                next(it)
                t0 = time.perf_counter()
                n = 1 + sum(1 for _ in it)
                dt = time.perf_counter() - t0
                assert n == args.records
                best[name] = min(best.get(name, dt), dt)
                startup[name] = min(startup.get(name, t0 - t_start), t0 - t_start)
        for name, _, _ in configs:
            dt = best[name]
            print(f"{name:12s} {(args.records - 1) / dt:8.0f} records/s {mb / dt:8.1f} MB/s"
                  f"  x{best['inline'] / dt:.2f} vs inline  (first item after"
                  f" {startup[name] * 1e3:.0f} ms)")
        print(f"2 threads / 1 thread: {best['1 thread'] / best['2 threads']:.2f};"
              f" 2 processes / 1 process: {best['1 process'] / best['2 processes']:.2f}")


if __name__ == "__main__":
    main()

"""The pipe's physical limit (issue 14, item 4): 100 KB TFRecords with CRCs verified, read from a
FIFO by ``read_records``, against the best raw read of the same FIFO (``readinto`` a reused
1 MiB buffer, the pipe grown to 1 MiB with ``F_SETPIPE_SZ``).

Every contestant runs in its own process (so a snapshot of an older streamio can run beside this
one: ``--before DIR``, a source tree with its extension built), reads a fresh FIFO fed by a
writer process, and times itself from opening the FIFO to the last byte. Rounds alternate
between the contestants; the table gives each one's median MB/s and the median of the per-round
ratios to the raw read, and the reader's CPU seconds per GB (user + system: steadier than the
wall clock on a shared machine).

The last line is the floor no reader that checks CRCs can go under: the CRC-32C of 100 KB records
alone (streamio's kernel, on a buffer already in cache, CPU time), as CPU seconds per GB and as a
share of the raw read's. A reader on one core whose extra work is more than 5% of the raw read's
cannot reach 0.95x of it where the raw read is CPU-bound.

    python benchmarks/pipe_limit.py [--records 1000] [--rounds 5] [--before /tmp/old-streamio]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

RECORD_SIZE = 100 * 1024

_RAW = r"""
import fcntl, os, sys, time
import resource
path = sys.argv[1]
ru = resource.getrusage(resource.RUSAGE_SELF)
cpu0 = ru.ru_utime + ru.ru_stime
t0 = time.perf_counter()
fd = os.open(path, os.O_RDONLY)
try:
    fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
except OSError:
    pass
buf = bytearray(1 << 20)
view = memoryview(buf)
total = 0
while True:
    n = os.readv(fd, [view])
    if not n:
        break
    total += n
os.close(fd)
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t0, total, ru.ru_utime + ru.ru_stime - cpu0)
"""

_STREAMIO = r"""
import resource, sys, time
from streamio.reader import read_records
path = sys.argv[1]
ru = resource.getrusage(resource.RUSAGE_SELF)
cpu0 = ru.ru_utime + ru.ru_stime
t0 = time.perf_counter()
total = 0
for record in read_records(path, "tfrecord"):
    total += len(record)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t0, total, ru.ru_utime + ru.ru_stime - cpu0)
"""


_CRC_SPEED = r"""
import os, time
from streamio import _speedups
data = os.urandom(%d)
best = float("inf")
for _ in range(5):
    t0 = time.process_time()
    for _ in range(2000):
        _speedups.crc32c(data)
    best = min(best, time.process_time() - t0)
print(2000 * len(data) / best / 1e9)
""" % RECORD_SIZE


def crc_speed(pythonpath: str) -> float:
    """GB/s of streamio's CRC-32C on a cached 100 KB record (CPU time: load-independent)."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, "-c", _CRC_SPEED], capture_output=True, text=True,
                          env=env, timeout=300, cwd=pythonpath)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return float(proc.stdout)


def make_file(path: str, n: int) -> int:
    from streamio.formats.tfrecord import encode_tfrecord

    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, RECORD_SIZE, dtype=np.uint8).tobytes()
    size = 0
    with open(path, "wb") as f:
        for i in range(n):
            frame = encode_tfrecord(i.to_bytes(8, "little") + payload[8:])
            f.write(frame)
            size += len(frame)
    return size


def run_one(code: str, pythonpath: str, src: str, tmpdir: str) -> tuple:
    """(seconds, CPU seconds) of one contestant's pass over a fresh FIFO."""
    from streamio.bench.measure import FifoFeed

    feed = FifoFeed(src, tmpdir)
    try:
        env = dict(os.environ, PYTHONPATH=pythonpath)
        # cwd too: ``python -c`` puts the working directory first on sys.path, so a contestant
        # started from another tree would import that tree's streamio.
        proc = subprocess.run([sys.executable, "-c", code, feed.path], capture_output=True,
                              text=True, env=env, timeout=300, cwd=pythonpath)
    except BaseException:
        feed.unblock()
        raise
    finally:
        feed.close()
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    seconds, _, cpu = proc.stdout.split()
    return float(seconds), float(cpu)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1000, help="100 KB records (default 1000)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", help="a streamio source tree to measure beside this one")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    contestants = {"raw readinto(1 MiB), F_SETPIPE_SZ 1 MiB": (_RAW, here),
                   "streamio read_records (this tree)": (_STREAMIO, here)}
    if args.before:
        contestants["streamio read_records (--before)"] = (_STREAMIO, os.path.abspath(args.before))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "large.tfrecord")
        nbytes = make_file(src, args.records)
        seconds = {name: [] for name in contestants}
        cpu = {name: [] for name in contestants}
        for _ in range(args.rounds):
            for name, (code, path) in contestants.items():
                wall, used = run_one(code, path, src, tmp)
                seconds[name].append(wall)
                cpu[name].append(used)
    raw = seconds["raw readinto(1 MiB), F_SETPIPE_SZ 1 MiB"]
    result = {}
    print(f"{args.records} TFRecords of {RECORD_SIZE} bytes ({nbytes / 1e6:.0f} MB) through a FIFO,"
          f" median of {args.rounds} rounds")
    for name, secs in seconds.items():
        mbs = statistics.median(nbytes / s / 1e6 for s in secs)
        ratio = statistics.median(r / s for r, s in zip(raw, secs))
        cpu_gb = statistics.median(cpu[name]) / (nbytes / 1e9)
        result[name] = {"MB/s": mbs, "ratio_to_raw": ratio, "seconds": secs, "cpu_s": cpu[name]}
        print(f"  {name:45s} {mbs:8.0f} MB/s   {ratio:5.2f}x raw   {cpu_gb:5.3f} CPU s/GB")
    raw_cpu_gb = statistics.median(cpu["raw readinto(1 MiB), F_SETPIPE_SZ 1 MiB"]) / (nbytes / 1e9)
    for label, path in [("this tree", here)] + ([("--before", os.path.abspath(args.before))]
                                                if args.before else []):
        gbs = crc_speed(path)
        result[f"crc32c GB/s ({label})"] = gbs
        print(f"  CRC-32C alone ({label}): {gbs:.1f} GB/s = {1 / gbs:.3f} CPU s/GB ="
              f" {100 / gbs / raw_cpu_gb:.0f}% of the raw read's CPU; CPU-bound ceiling"
              f" {raw_cpu_gb / (raw_cpu_gb + 1 / gbs):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Inflate speed (issue 14, item 3): one gzip-compressed TFRecord file, read

* by streamio from a FIFO (a writer process ``cat``s the file into it), once per inflate backend
  installed (zlib, ISA-L, zlib-ng), records framed and CRC-checked;
* by ``gzip -dc`` into /dev/null (inflate only, no framing);
* by tf.data, ``TFRecordDataset(path, compression_type="GZIP")`` on the regular file (it cannot
  read a FIFO), counted inside TensorFlow (``Dataset.reduce``), in its own process;

side by side in one run; each figure is the median of ``--runs``. MB/s are decompressed bytes.

    python benchmarks/inflate.py [--size-mb 100] [--runs 3] [--dir /tmp/streamio-inflate]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import streamio
from streamio.codecs import _inflate
from streamio.reader import RecordReader

RECORD_FLOATS = 256  # ~1 KiB records, like a dense feature vector


def make_file(directory: str, size_mb: int) -> tuple[str, int, int]:
    """A ``.tfrecord.gz`` of ``size_mb`` MB decompressed (gzip level 6, as TF and gzip write)."""
    path = os.path.join(directory, f"bench-{size_mb}mb.tfrecord.gz")
    nrec = size_mb * 1_000_000 // (RECORD_FLOATS * 4 + 16)
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        # Quantised features compress about 3x, as real feature data often does.
        rows = (np.round(rng.standard_normal((nrec, RECORD_FLOATS)) * 8) / 8).astype(np.float32)
        streamio.write_records(path + ".part", "tfrecord", (row.tobytes() for row in rows),
                               compression="gzip")
        os.replace(path + ".part", path)
    return path, nrec, nrec * (RECORD_FLOATS * 4 + 16)


def streamio_from_fifo(path: str, backend: str, directory: str) -> tuple[float, int]:
    _inflate._default = _inflate.backend(backend)  # what default_backend() would pick
    fifo = os.path.join(directory, f"pipe-{os.getpid()}-{backend}")
    os.mkfifo(fifo)
    try:
        # The writer opens the FIFO itself (an argv, no shell string): cat file > fifo.
        writer = subprocess.Popen(["sh", "-c", 'exec cat "$0" > "$1"', path, fifo])
        t0 = time.perf_counter()
        n = 0
        for records in RecordReader(fifo, "tfrecord", compression="gzip").record_lists():
            n += len(records)
        elapsed = time.perf_counter() - t0
        writer.wait()
    finally:
        os.unlink(fifo)
        _inflate._default = None
    return elapsed, n


def inflate_only(data: bytes, backend: str) -> float:
    """The codec alone, in memory (1 MiB chunks): no pipe, no framing, no CRCs."""
    from streamio.codecs.deflate import ZlibCodec
    codec = ZlibCodec("gzip", source="bench", backend=_inflate.backend(backend))
    view = memoryview(data)
    t0 = time.perf_counter()
    for i in range(0, len(data), 1 << 20):
        for _ in codec.decode(view[i:i + (1 << 20)]):
            pass
    for _ in codec.finish():
        pass
    return time.perf_counter() - t0


def gzip_cli(path: str) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run(["gzip", "-dc", path], stdout=null, check=True)
    return time.perf_counter() - t0


TF_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import tensorflow as tf
    path, runs = sys.argv[1], int(sys.argv[2])
    times, count = [], 0
    for _ in range(runs):
        ds = tf.data.TFRecordDataset(path, compression_type="GZIP", buffer_size=1 << 20)
        t0 = time.perf_counter()
        count = int(ds.reduce(np.int64(0), lambda n, _: n + 1))
        times.append(time.perf_counter() - t0)
    print(json.dumps({"times": times, "records": count}))
""")


def tf_data(path: str, runs: int) -> tuple[list, int]:
    import json
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", TF_SCRIPT, path, str(runs)], env=env,
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["times"], result["records"]


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "streamio-inflate"))
    parser.add_argument("--no-tf", action="store_true", help="skip tf.data")
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    path, nrec, raw = make_file(args.dir, args.size_mb)
    print(f"{path}: {raw / 1e6:.0f} MB decompressed, {os.path.getsize(path) / 1e6:.0f} MB gzip,"
          f" {nrec} records; median of {args.runs}")
    with open(path, "rb") as f:
        data = f.read()
    # Round-robin (every method once per round, median over rounds), so that a busy machine's
    # load drifts over all methods alike instead of favouring whichever ran in a quiet moment.
    methods = []
    for backend in _inflate.available():
        def fifo_run(backend=backend):
            elapsed, n = streamio_from_fifo(path, backend, args.dir)
            assert n == nrec, (backend, n, nrec)
            return elapsed
        methods.append((f"streamio, FIFO, {backend}", fifo_run))
    for backend in _inflate.available():
        methods.append((f"inflate only (memory), {backend}",
                        lambda backend=backend: inflate_only(data, backend)))  # noqa: F821 (del after use)
    if shutil.which("gzip"):
        methods.append(("gzip -dc > /dev/null (file)", lambda: gzip_cli(path)))
    times = {name: [] for name, _ in methods}
    for _ in range(args.runs):
        for name, run in methods:
            times[name].append(run())
    del data
    rows = [(name, statistics.median(times[name])) for name, _ in methods]
    tf_time = None
    if not args.no_tf:
        try:
            tf_times, n = tf_data(path, args.runs)
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            print(f"tf.data skipped: {exc}")
        else:
            assert n == nrec, ("tf.data", n, nrec)
            tf_time = statistics.median(tf_times)
            rows.append(("tf.data TFRecordDataset GZIP (file)", tf_time))
    zlib_time = dict(rows)["streamio, FIFO, zlib"]
    print(f"{'reader':40} {'s':>7} {'MB/s':>7} {'x zlib':>7} {'x tf.data':>9}")
    for name, seconds in rows:
        vs_tf = f"{tf_time / seconds:9.2f}" if tf_time else f"{'-':>9}"
        print(f"{name:40} {seconds:7.3f} {raw / seconds / 1e6:7.0f} {zlib_time / seconds:7.2f}"
              f" {vs_tf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Cost of an exact mid-epoch resume: ``streamio bench --workloads resume``.

Writes N tf.train.Example records (``x`` float32[32], ``label``; the benchmark's records) as a
TFRecord file and a gzip TFRecord file, and serves the plain file from an HTTP server on
127.0.0.1. For each source and checkpoint depth (a fraction of the epoch's batches), prints:

- ``resume_s``: from ``Dataset.iter_from(state)`` to the first batch after the checkpoint
  (the epoch is read, framed, shuffled and batched again up to there, without decoding);
- ``reach_s``: what the uninterrupted epoch took to deliver that many batches (read + decode),
  for comparison.

Pipeline: ``shuffle(10000, seed=0).batch(256).prefetch()`` with the Example decoder.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import tempfile
import threading
import time

import numpy as np

import streamio

from .cases import example_decoder
from .workloads import example_payloads


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionError:  # the benchmark closes epochs early, mid-body
            pass


def _serve(directory: str) -> tuple:
    handler = functools.partial(_Quiet, directory=directory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _pipeline(source: str) -> streamio.Dataset:
    ds = streamio.Dataset(source, "tfrecord", decoder=example_decoder())
    return ds.shuffle(10000, seed=0).batch(256).prefetch().with_context(epoch=0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--depths", default="0,0.25,0.5,0.9")
    args = parser.parse_args(argv)
    depths = [float(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        records = [bytes(p) for p in payloads]
        plain = os.path.join(tmp, "data.tfrecord")
        streamio.write_records(plain, "tfrecord", records)
        streamio.write_records(plain + ".gz", "tfrecord", records, compression="gzip")
        del records, payloads
        server, base = _serve(tmp)
        try:
            sources = {"file": plain, "gzip": plain + ".gz", "http": f"{base}/data.tfrecord"}
            size, gz_size = os.stat(plain).st_size, os.stat(plain + ".gz").st_size
            print(f"{args.records} records, {size / 1e6:.1f} MB ({gz_size / 1e6:.1f} MB gzip);"
                  " shuffle(10000).batch(256).prefetch(), Example decoder")
            print(f"{'source':6} {'depth':>6} {'batches':>8} {'resume_s':>9} {'reach_s':>8}")
            for kind, source in sources.items():
                ds = _pipeline(source)
                clock = time.perf_counter
                t0 = clock()
                marks = []  # time at which each batch arrived in the uninterrupted epoch
                for _ in ds:
                    marks.append(clock() - t0)
                total = len(marks)
                for depth in depths:
                    cut = min(total - 1, round(depth * total))
                    it = iter(ds)
                    for _ in range(cut):
                        next(it)
                    state = it.state_dict()
                    it.close()
                    t0 = clock()
                    resumed = _pipeline(source).iter_from(state)
                    next(resumed)
                    resume_s = clock() - t0
                    resumed.close()
                    reach = marks[cut]
                    print(f"{kind:6} {depth:6.2f} {cut:8d} {resume_s:9.3f} {reach:8.3f}")
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

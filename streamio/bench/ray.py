"""streamio on Ray Data vs Ray's own reader: ``streamio bench --workloads ray``.

Writes ``--files`` TFRecord files of ``--records`` ``tf.train.Example`` each (``x`` float32[32],
``label`` int64: ~178 B framed, the records of ``streamio bench``), then, on one local Ray
(``--cpus`` logical CPUs, loopback only), measures records/s of:

- streamio in this process (``Dataset(files).batch(4096)``, decoded), the rate Ray is held to;
- the ratio Ray is judged by: ``--ratio-records`` Examples ``{i: int64, x: float32[8]}`` (1M),
  ``streamio.ray.read`` with ``iter_batches(batch_size=4096)`` against the same in this process,
  the two alternating for ``--rounds`` rounds (the median of the rounds' own ratios; target
  0.5x); ``--ratio-only`` runs this row alone;
- ``streamio.ray.read(files, decoder=...)`` consumed with ``iter_batches`` at each
  ``--batch-sizes`` (numpy batches; the time includes planning and starting the read tasks);
- ``ray.data.read_tfrecords`` on the first ``--peer-records`` of them (the tfx-bsl fast path too
  when ``tfx_bsl`` imports);
- 100 KB raw records (``--large`` of them; MB/s), and RecordIO-protobuf (``--recordio`` rows of
  float32[128] + label: Ray has no reader for it), through Ray and in this process.

Ray listens on every interface and probes 8.8.8.8 to find its address, so the benchmark re-runs
itself inside a private network namespace with only loopback up (``unshare --net``; root, Linux).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

_INSIDE = "--inside-namespace"


def _write_examples(path: str, n: int, rng: np.random.Generator) -> None:
    from .workloads import example_payloads
    from ..reader import write_records

    payloads, _, _ = example_payloads(n, rng)
    write_records(path, "tfrecord", (row.tobytes() for row in payloads))


def _rate(fn) -> tuple:
    t0 = time.perf_counter()
    n = fn()
    return n, n / (time.perf_counter() - t0)


def _count_batches(ds, batch_size: int, column: str) -> int:
    return sum(len(b[column]) for b in ds.iter_batches(batch_size=batch_size,
                                                       batch_format="numpy"))


def _ray_read_rows(args: argparse.Namespace, files: list, decoder, inproc: float) -> list:
    """streamio.ray.read of the Examples at each batch size (and rows per block)."""
    import streamio.ray as sray

    rows = []
    total = args.files * args.records
    for bs in args.batch_sizes:
        for blk in args.rows_per_block or [None]:
            ds = sray.read(files, "tfrecord", decoder=decoder, rows_per_block=blk,
                           parallelism=args.parallelism)
            n, rate = _rate(lambda: _count_batches(ds, bs, "label"))
            assert n == total, (n, total)
            label = f"streamio.ray.read, iter_batches {bs}"
            if blk:
                label += f", {blk} rows/block"
            rows.append((label, n, rate, rate / inproc))
    return rows


def _peer_rows(args: argparse.Namespace, tmp: str, files: list, inproc: float) -> list:
    """Ray's own reader on a prefix of the same records (it is ~1000x slower), with tfx-bsl
    where it is installed."""
    import ray
    from ..reader import read_records, write_records

    peer = os.path.join(tmp, f"peer-{args.records}-{args.peer_records}.tfrecord")
    if not os.path.exists(peer):
        write_records(peer, "tfrecord", read_records(files[0], "tfrecord")
                      if args.peer_records >= args.records else
                      _first(files[0], args.peer_records))
    ds = ray.data.read_tfrecords(peer)
    n, rate = _rate(lambda: _count_batches(ds, 4096, "label"))
    rows = [("ray.data.read_tfrecords, iter_batches 4096", n, rate, rate / inproc)]
    if importlib.util.find_spec("tfx_bsl") is None:
        return rows + [("read_tfrecords + tfx-bsl: not installed", 0, 0.0, 0.0)]
    from ray.data import TFXReadOptions

    ds = ray.data.read_tfrecords(peer, tfx_read_options=TFXReadOptions())
    n, rate = _rate(lambda: _count_batches(ds, 4096, "label"))
    return rows + [("read_tfrecords + tfx-bsl, iter_batches 4096", n, rate, rate / inproc)]


def _large_rows(args: argparse.Namespace, tmp: str, rng: np.random.Generator) -> list:
    """100 KB records, raw (MB/s in the label): in-process, then through streamio.ray.read."""
    import streamio.ray as sray
    from ..pipeline import Dataset
    from ..reader import write_records

    large = os.path.join(tmp, f"large-{args.large}.tfrecord")
    if not os.path.exists(large):
        block = rng.integers(0, 256, 100_000 + 4096, dtype=np.uint8).tobytes()
        write_records(large, "tfrecord", (block[i * 97 % 4096:i * 97 % 4096 + 100_000]
                                          for i in range(args.large)))
    n, big_in = _rate(lambda: sum(len(b) for b in Dataset(large, "tfrecord").batch(64)))
    ds = sray.read(large, "tfrecord", parallelism=args.parallelism)
    n_ray, rate = _rate(lambda: _count_batches(ds, 64, "record"))
    return [("100 KB records in-process (MB/s = rate/10)", n, big_in, 1.0),
            ("100 KB records, streamio.ray.read, batch 64", n_ray, rate, rate / big_in)]


def _recordio_rows(args: argparse.Namespace, tmp: str, rng: np.random.Generator) -> list:
    """RecordIO-protobuf (no Ray reader exists): in-process, then through streamio.ray.read."""
    import streamio.ray as sray
    from ..decoders import RecordIOProtobuf
    from ..pipeline import Dataset
    from ..reader import write_records
    from .workloads import recordio_protobuf_payloads

    rio = os.path.join(tmp, f"dense-{args.recordio}.rec")
    if not os.path.exists(rio):
        payloads, _, _ = recordio_protobuf_payloads(args.recordio, rng)
        write_records(rio, "recordio", (row.tobytes() for row in payloads), multipart="concat")
    dec = RecordIOProtobuf()
    n, rio_in = _rate(lambda: sum(len(b["values"]) for b in
                                  Dataset(rio, "recordio", decoder=dec).batch(4096)))
    ds = sray.read(rio, "recordio", decoder=RecordIOProtobuf(), parallelism=args.parallelism)
    n_ray, rate = _rate(lambda: _count_batches(ds, 4096, "values"))
    return [("RecordIO-protobuf in-process, batch 4096", n, rio_in, 1.0),
            ("RecordIO-protobuf, streamio.ray.read, batch 4096", n_ray, rate, rate / rio_in)]


def _example8_path(tmp: str, n: int) -> str:
    """A file of ``n`` Examples ``{i: int64, x: float32[8]}`` (made once per ``--tmpdir``)."""
    from ..decoders import encode_example
    from ..reader import write_records

    path = os.path.join(tmp, f"example8-{n}.tfrecord")
    if not os.path.exists(path):
        xs = np.random.default_rng(1).standard_normal((n, 8)).astype(np.float32)
        write_records(path, "tfrecord", (encode_example({"i": np.int64(k), "x": xs[k]})
                                         for k in range(n)))
    return path


def _ratio_rows(args: argparse.Namespace, tmp: str) -> list:
    """streamio.ray.read / in-process on Examples {i, x[8]} at iter_batches(4096): the two
    alternate (in-process first on even rounds), and the row gives the median of the rounds'
    own ratios, which a drift in the machine's load skews less than a ratio of medians."""
    import statistics

    import streamio.ray as sray
    from ..decoders import Example, FixedLen
    from ..pipeline import Dataset

    path = _example8_path(tmp, args.ratio_records)
    decoder = Example({"i": FixedLen((), "int64"), "x": FixedLen((8,), "float32")})

    def inproc() -> int:
        return sum(len(b["i"]) for b in Dataset(path, "tfrecord", decoder=decoder).batch(4096))

    def through_ray() -> int:
        ds = sray.read(path, "tfrecord", decoder=decoder, parallelism=args.parallelism)
        return _count_batches(ds, 4096, "i")

    through_ray()  # the workers' first task imports streamio: not part of any round
    rates: dict = {"in": [], "ray": [], "ratio": []}
    for rnd in range(args.rounds):
        order = (("in", inproc), ("ray", through_ray))
        for name, fn in order if rnd % 2 == 0 else order[::-1]:
            n, rate = _rate(fn)
            assert n == args.ratio_records, (n, args.ratio_records)
            rates[name].append(rate)
        rates["ratio"].append(rates["ray"][-1] / rates["in"][-1])
    med = statistics.median
    ratios = rates["ratio"]
    return [("Examples {i, x[8]} in-process, batch 4096", args.ratio_records, med(rates["in"]),
             1.0),
            (f"  streamio.ray.read, iter_batches 4096 ({args.rounds} rounds,"
             f" {min(ratios):.2f}-{max(ratios):.2f})", args.ratio_records, med(rates["ray"]),
             med(ratios))]


def run(args: argparse.Namespace) -> list:
    from ..decoders import Example, FixedLen
    from ..pipeline import Dataset
    from .config import EXAMPLE_FLOATS

    rng = np.random.default_rng(0)
    tmp = args.tmpdir or tempfile.mkdtemp(prefix="streamio-bench-ray-")
    os.makedirs(tmp, exist_ok=True)
    if args.ratio_only:
        return _with_ray(args, tmp, lambda: _ratio_rows(args, tmp))
    files = [os.path.join(tmp, f"ex-{args.records}-{i:02d}.tfrecord") for i in range(args.files)]
    for path in files:
        if not os.path.exists(path):
            _write_examples(path, args.records, rng)
    decoder = Example({"x": FixedLen((EXAMPLE_FLOATS,), "float32"), "label": FixedLen((), "int64")})
    n, inproc = _rate(lambda: sum(len(b["label"]) for b in
                                  Dataset(files, "tfrecord", decoder=decoder).batch(4096)))

    def rows_in_ray() -> list:
        return ([("streamio in-process, batch 4096", n, inproc, 1.0)]
                + _ray_read_rows(args, files, decoder, inproc) + _ratio_rows(args, tmp)
                + _peer_rows(args, tmp, files, inproc) + _large_rows(args, tmp, rng)
                + _recordio_rows(args, tmp, rng))
    return _with_ray(args, tmp, rows_in_ray)


def _with_ray(args: argparse.Namespace, tmp: str, rows) -> list:
    """``rows()`` on a local Ray of ``--cpus`` CPUs (loopback only), shut down after."""
    import ray

    # address="local": a new Ray of its own, even where another's address file is in /tmp/ray
    ray.init(address="local", num_cpus=args.cpus, object_store_memory=args.object_store_mb << 20,
             include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        return rows()
    finally:
        ray.shutdown()
        if not args.tmpdir:
            shutil.rmtree(tmp, ignore_errors=True)


def _first(path: str, n: int):
    from ..reader import read_records

    for i, record in enumerate(read_records(path, "tfrecord")):
        if i >= n:
            return
        yield record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamio bench --workloads ray", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=10)
    p.add_argument("--records", type=int, default=200_000, help="Examples per file")
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[256, 4096])
    p.add_argument("--rows-per-block", type=lambda s: [int(x) for x in s.split(",")],
                   default=None, help="also try these rows per block (default: Ray's target"
                   " block size)")
    p.add_argument("--parallelism", type=int, default=-1, help="read tasks (-1: Ray decides)")
    p.add_argument("--peer-records", type=int, default=200_000,
                   help="records for ray.data.read_tfrecords")
    p.add_argument("--large", type=int, default=2000, help="100 KB records")
    p.add_argument("--recordio", type=int, default=200_000, help="RecordIO-protobuf rows")
    p.add_argument("--ratio-records", type=int, default=1_000_000,
                   help="Examples {i, x[8]} of the ratio row")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the ratio row (alternating)")
    p.add_argument("--ratio-only", action="store_true", help="run the ratio row alone")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--object-store-mb", type=int, default=1024)
    p.add_argument("--tmpdir", help="keep the data here (re-used when present)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _INSIDE not in argv:
        build_parser().parse_args(argv)  # --help and mistakes before the namespace
        if shutil.which("unshare") is None:
            print("streamio bench --workloads ray needs unshare (util-linux)", file=sys.stderr)
            return 2
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")
        inner = " ".join([sys.executable, "-m", "streamio.bench.ray", _INSIDE,
                          *(_quote(a) for a in argv)])
        return subprocess.call(["unshare", "--net", "--pid", "--fork", "--mount-proc",
                                "--kill-child", "sh", "-c", f"ip link set lo up && exec {inner}"],
                               env=env)
    argv.remove(_INSIDE)
    args = build_parser().parse_args(argv)
    rows = run(args)
    print(f"\n{'workload':<52} {'records':>9} {'records/s':>12} {'vs in-process':>14}")
    for label, n, rate, ratio in rows:
        print(f"{label:<52} {n:>9} {rate:>12,.0f} {ratio:>13.2f}x")
    return 0


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


if __name__ == "__main__":
    sys.exit(main())

"""``streamio bench --workloads torch-workers``: ``to_torch()`` through ``DataLoader`` workers
against in-process numpy iteration of the same Dataset.

Writes N ``tf.train.Example`` records (``x`` float32[32], ``label`` int64; the benchmark's
records) as part files and as one file fed through a FIFO, and for each source and batch size
measures, each in a fresh process, alternating, for several rounds:

- ``numpy``: iterating the Dataset (``.batch(bs)``) in the process;
- ``w0``: ``DataLoader(ds.to_torch(), batch_size=None, num_workers=0)``;
- ``wN``: the same with ``num_workers=N`` (``persistent_workers=True``);
- ``floor-wN``: a DataLoader over an IterableDataset that yields one tiny constant object per
  batch with N workers: what the DataLoader's own per-item machinery allows, with no decoding
  and no data to move.

Each timed figure is the *second* epoch (the first starts the workers and warms the caches); a
FIFO's writer process feeds the file once per epoch. Ratios are medians of per-round ratios
against ``numpy`` of the same round; the machine's load average is printed with the results,
and so is the CPU time per batch of the main process (all its threads) and of the workers
together (from ``/proc``): on a shared machine it says where the time goes when the rates
cannot (a loaded machine gives a process of several more of its cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

#: The part files the files case splits between the workers (or one per worker, if more).
PARTS = 4
DEFAULT_RECORDS = 1_000_000
DEFAULT_ROUNDS = 5

# The FIFOs' writer: the file's bytes once per epoch into ``<prefix>_<epoch>`` (a PipeChannel:
# one FIFO per epoch, so an epoch's end cannot run into the next epoch's bytes).
_WRITER = r"""
import os, sys
src, prefix, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(src, "rb").read()
for epoch in range(epochs):
    fd = os.open(f"{prefix}_{epoch}", os.O_WRONLY)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view[:1 << 20]):]
    except BrokenPipeError:
        pass
    os.close(fd)
"""


def _dataset(job: dict, bs: int):
    import streamio

    from .cases import example_decoder

    sources = (streamio.PipeChannel(job["channel"]) if job["source"] == "fifo"
               else job["paths"])
    return streamio.Dataset(sources, "tfrecord", decoder=example_decoder()).batch(bs)


def _floor_loader(workers: int, batches: int):
    import torch

    class Tiny(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            share = batches // (info.num_workers if info else 1)
            return iter([1] * share)

    return torch.utils.data.DataLoader(Tiny(), batch_size=None, num_workers=workers,
                                       persistent_workers=workers > 0)


def _children_cpu() -> float:
    """CPU seconds of this process's children so far (0 where there is no ``/proc``)."""
    me, total = str(os.getpid()), 0.0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _one(job: dict) -> dict:
    """One measurement, in this (fresh) process: records/s of the second epoch, and the CPU
    microseconds per batch it took here and in the workers."""
    mode, bs = job["mode"], job["batch_size"]
    expected = job["records"]
    if mode.startswith("floor-w"):
        workers = int(mode[7:])
        floor = _floor_loader(workers, job["records"] // bs)
        expected = job["records"] // bs // workers * workers * bs

        def epoch() -> int:
            return bs * sum(1 for _ in floor)
    elif mode == "numpy":
        ds = _dataset(job, bs)

        def epoch() -> int:
            return sum(len(b["label"]) for b in ds)
    else:
        import torch

        workers = int(mode[1:])
        ds = _dataset(job, bs)
        options = job.get("loader_options", {}) if workers else {}
        loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=workers,
                                             persistent_workers=workers > 0, **options)

        def epoch() -> int:
            return sum(int(b["label"].shape[0]) for b in loader)
    first = epoch()
    cpu0, workers0, t0 = time.process_time(), _children_cpu(), time.perf_counter()
    n = epoch()
    seconds = time.perf_counter() - t0
    cpu, workers = time.process_time() - cpu0, _children_cpu() - workers0
    if n != first or n != expected:
        raise RuntimeError(f"{mode}: {first} then {n} records, expected {expected}")
    batches = -(-n // bs)
    return {"rate": n / seconds, "main_cpu_us": 1e6 * cpu / batches,
            "workers_cpu_us": 1e6 * workers / batches}


def _run_fresh(job: dict, fifo_src: str, tmpdir: str, timeout: float) -> dict:
    writer = None
    if job["source"] == "fifo":
        prefix = os.path.join(tmpdir, f"fifo-{time.monotonic_ns()}")
        for epoch in range(2):
            os.mkfifo(f"{prefix}_{epoch}", 0o600)
        job = dict(job, channel=prefix)
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, fifo_src, prefix, "2"])
    try:
        out = subprocess.run([sys.executable, "-m", "streamio.bench.torch_workers", "--one",
                              json.dumps(job)], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{job['mode']} {job['source']}: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        if writer is not None:
            try:
                writer.wait(timeout=5)
            except subprocess.TimeoutExpired:
                writer.kill()
                writer.wait()
            for epoch in range(2):
                os.unlink(f"{job['channel']}_{epoch}")


def _write(tmp: str, records: int, parts_count: int = PARTS) -> tuple:
    import streamio

    from .workloads import example_payloads

    payloads, _, _ = example_payloads(records, np.random.default_rng(0))
    rows = [bytes(p) for p in payloads]
    whole = os.path.join(tmp, "all.tfrecord")
    streamio.write_records(whole, "tfrecord", rows)
    parts = []
    for k in range(parts_count):
        part = os.path.join(tmp, f"part-{k}.tfrecord")
        streamio.write_records(part, "tfrecord", rows[k::parts_count])
        parts.append(part)
    return whole, parts


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def measure(records: int, rounds: int, sizes: list, workers: list, sources: list, *,
            floor: bool = True, timeout: float = 300.0, log=None,
            loader_options: Optional[dict] = None) -> tuple:
    """``({"source/bsN/mode": [{"rate": records/s, "main_cpu_us": .., "workers_cpu_us": ..}
    per round]}, modes)``: every mode, source and batch size once per round, each in a fresh
    process (see the module docstring). ``loader_options``: more DataLoader arguments for the
    ``wN`` modes (``{"in_order": False}``...)."""
    modes = ["numpy", "w0"] + [f"w{w}" for w in workers]
    if floor:
        modes += [f"floor-w{w}" for w in workers]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        whole, parts = _write(tmp, records, max([PARTS, *workers]))
        for rnd in range(rounds):
            for source in sources:
                for bs in sizes:
                    for mode in modes:
                        if mode.startswith("floor") and source != sources[0]:
                            continue  # no input: once per batch size is enough
                        job = {"mode": mode, "batch_size": bs, "records": records,
                               "source": source, "paths": parts,
                               "loader_options": loader_options or {}}
                        got = _run_fresh(job, whole, tmp, timeout)
                        key = f"{source}/bs{bs}/{mode}"
                        results.setdefault(key, []).append(got)
                        print(f"  round {rnd} {key}: {got['rate'] / 1e6:.3f}M rec/s, CPU us per"
                              f" batch {got['main_cpu_us']:.0f} here, {got['workers_cpu_us']:.0f}"
                              f" workers (load {_load()})", file=log or sys.stderr, flush=True)
    return results, modes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="streamio bench --workloads torch-workers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--batch-sizes", default="256",
                        help="comma-separated batch sizes (default 256)")
    parser.add_argument("--workers", default="2",
                        help="comma-separated DataLoader worker counts besides 0 (default 2)")
    parser.add_argument("--sources", default="files,fifo", help="files, fifo or both")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor measurement")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one measurement may take")
    parser.add_argument("--loader-options", default="{}",
                        help='more DataLoader arguments for the worker cases, as JSON'
                             ' (e.g. \'{"in_order": false, "prefetch_factor": 4}\')')
    parser.add_argument("--json", dest="json_path", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(json.loads(args.one))))
        return 0
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    sources = [s.strip() for s in args.sources.split(",")]
    print(f"{args.records} Examples (float32[32] + int64), second epoch, {args.rounds} rounds;"
          f" load average before: {_load()}", flush=True)
    results, modes = measure(args.records, args.rounds, sizes, workers, sources,
                             floor=not args.no_floor, timeout=args.timeout,
                             loader_options=json.loads(args.loader_options))
    report = _report(results, sources, sizes, modes)
    report["load_after"] = _load()
    print(f"load average after: {report['load_after']}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def _report(results: dict, sources: list, sizes: list, modes: list) -> dict:
    rows = []
    med = statistics.median
    print(f"{'case':32} {'median rec/s':>13} {'x numpy (median of rounds)':>27}"
          f" {'CPU us/batch: here':>19} {'workers':>8}")
    for source in sources:
        for bs in sizes:
            base = results[f"{source}/bs{bs}/numpy"] if f"{source}/bs{bs}/numpy" in results \
                else results[f"{sources[0]}/bs{bs}/numpy"]
            for mode in modes:
                key = f"{source}/bs{bs}/{mode}"
                if key not in results:
                    continue
                rates = [got["rate"] for got in results[key]]
                ratio = med(r / b["rate"] for r, b in zip(rates, base))
                main_cpu = med(got["main_cpu_us"] for got in results[key])
                workers_cpu = med(got["workers_cpu_us"] for got in results[key])
                rows.append({"case": key, "median": med(rates), "ratio": ratio, "rates": rates,
                             "main_cpu_us": main_cpu, "workers_cpu_us": workers_cpu})
                print(f"{key:32} {med(rates) / 1e6:11.3f}M {ratio:27.2f} {main_cpu:19.0f}"
                      f" {workers_cpu:8.0f}")
    return {"rows": rows}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

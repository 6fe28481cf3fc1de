"""The device check's sections and its table (run by ``benchmarks/device_check.sh``).

``python benchmarks/device_check.py [--dry-run] [--out DIR]`` runs each section in its own
process under its own time limit, and prints each row of the table as soon as it is known;
with ``--out`` the table also goes to ``DIR/device_table.md`` (rewritten after every row) and
everything printed to ``DIR/log.txt``, so a run cut short still leaves the rows it had.

Sections: ``env`` (versions, GPU, whether the C extension built), ``cuda-tests`` (``pytest -m
cuda``), ``overlap`` (to_device's hidden copy share), ``gpu-decode`` (nvJPEG against the CPU
path), ``scaling`` (one FIFO, 1..14 decoders, against the in-memory rate on as many threads),
``torch-workers`` (``to_torch()`` through ``DataLoader(num_workers=0, 2, 4, 8, 14)`` against
numpy iteration in one process; ``--only torch-workers`` runs it alone in ~90 s).
``--dry-run`` (a CPU machine, CI): small sizes, the CUDA rows reported as skipped, the GPU
decode row run through the same torch code on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Seconds per section at most on the GPU machine, and for all of them together (TOTAL, which
# cuts the last sections short if the first ones ran long): with the install (~30 s) the run
# fits the ~9 minutes the check gets (the torch-workers section last: cut short first). The dry
# run's are for 2 shared cores.
BUDGET = {"env": 30, "cuda-tests": 110, "overlap": 30, "gpu-decode": 60, "scaling": 170,
          "torch-workers": 90}
DRY_BUDGET = {"env": 30, "cuda-tests": 60, "overlap": 20, "gpu-decode": 40, "scaling": 60,
              "torch-workers": 60}
TOTAL, DRY_TOTAL = 490, 300
#: The torch-workers section: DataLoader worker counts on the GPU host, and its Examples.
TORCH_WORKERS = [2, 4, 8, 14]
TORCH_WORKERS_RECORDS = 1_000_000
IMAGES, DRY_IMAGES = 3000, 256
DECODERS = [1, 2, 4, 8, 14]
ROW = "ROW\t"


def row(item: str, result: str, target: str = "", verdict: str = "") -> None:
    """One table row, to the parent (which relays and files it)."""
    print(ROW + "\t".join(s.replace("\t", " ").replace("\n", " ")
                          for s in (item, result, target, verdict)), flush=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# -- sections (each runs in its own process) --------------------------------------------------------
def section_env(dry: bool) -> None:
    import platform

    import numpy

    row("python / numpy", f"{platform.python_version()} / {numpy.__version__}")
    try:
        import torch

        row("torch", f"{torch.__version__}, CUDA {torch.version.cuda}")
        if torch.cuda.is_available():
            row("GPU", torch.cuda.get_device_name(0))
        else:
            row("GPU", "none (CUDA rows are skipped)")
    except ImportError as exc:
        row("torch", f"missing: {exc}")
    for module in ("torchvision", "PIL", "simplejpeg", "crc32c", "smart_open", "torchdata"):
        try:
            mod = __import__(module)
            row(module, getattr(mod, "__version__", "present"))
        except Exception as exc:  # noqa: BLE001 - report, whatever it is
            row(module, f"missing: {type(exc).__name__}: {exc}")
    try:
        import streamio._speedups  # noqa: F401

        row("streamio C extension", "built")
    except ImportError as exc:
        row("streamio C extension", f"NOT built: the pure-Python fallback runs ({exc})")
    row("CPU cores", str(os.cpu_count()))


def section_cuda_tests(dry: bool) -> None:
    """``pytest -m cuda``: one row per test, with its outcome (skip reason on a CPU machine)."""
    # -v alone (with -q it cancels out): one "PASSED"/"FAILED" line per test, read below.
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "cuda", "-v",
           "-rs", "tests/decoders/test_image_gpu.py",
           "tests/adapters/test_torch_adapter.py"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    outcome = re.compile(r"^(tests/\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")
    skipped = re.compile(r"^SKIPPED \[(\d+)\] \S+: (.*)$")
    summary = re.compile(r"^=+ (\d+ \w+.*?) in [\d.]+s.*=+$")
    reasons: dict = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line.rstrip(), file=sys.stderr, flush=True)  # the log keeps pytest's own output
        m = outcome.match(line)
        if m and m.group(2) != "SKIPPED":
            row(f"cuda test {m.group(1).split('::', 1)[1]}", m.group(2), "PASSED",
                verdict(m.group(2) == "PASSED"))
        m = skipped.match(line.strip())
        if m:
            reasons[m.group(2)] = reasons.get(m.group(2), 0) + int(m.group(1))
        m = summary.match(line.strip())
        if m:
            row("pytest -m cuda", m.group(1), "every test passes",
                "SKIP" if dry else verdict(" failed" not in m.group(1)
                                           and " error" not in m.group(1)))
    proc.wait()
    for reason, count in reasons.items():
        row(f"cuda tests skipped: {count}", reason, "", "SKIP" if dry else "MISS")
    if proc.returncode not in (0, 5):  # 1: a test failed (its row says which); else broken
        row("pytest -m cuda", f"exit {proc.returncode}", "0", "MISS")
        if proc.returncode != 1:
            sys.exit(proc.returncode)


def section_overlap(dry: bool) -> None:
    if not has_cuda():
        row("to_device: copy hidden behind compute (256x3x224x224 uint8)", "skipped: no CUDA",
            ">= 80%", "SKIP")
        return
    from streamio.bench.device import measure_overlap

    for depth in (1, 2):
        r = measure_overlap(depth=depth)
        row(f"to_device depth={depth}: copy hidden behind compute (256x3x224x224 uint8, pinned)",
            f"{r['hidden']:.0%} (copy {r['copy_ms']:.1f} ms = {r['copy_GBps']:.1f} GB/s,"
            f" compute {r['compute_ms']:.1f} ms, both {r['together_ms']:.1f} ms,"
            f" {r['batches']} batches)", ">= 80%", verdict(r["hidden"] >= 0.8))


def _image_set(dry: bool) -> dict:
    from streamio.bench.images import make_image_set

    return make_image_set(DRY_IMAGES if dry else IMAGES, os.path.join(ROOT, "bench-images"),
                          lambda m: print(m, file=sys.stderr, flush=True))


def section_gpu_decode(dry: bool) -> None:
    from streamio.bench.device import decode_rates
    from streamio.decoders._torch_image import GPU_MAX_ABS_TOLERANCE, GPU_MEAN_ABS_TOLERANCE

    info = _image_set(dry)
    jpegs = []
    for path, _ in info["files"]:
        with open(path, "rb") as f:
            jpegs.append(f.read())
    cuda = has_cuda()
    device = "cuda" if cuda else None
    what = "nvJPEG (GPU)" if cuda else "torch path on the CPU (dry run: simplejpeg for nvJPEG)"
    for threads in ((1,) if dry else (1, os.cpu_count() or 1)):
        r = decode_rates(jpegs, device=device, threads=threads)
        row(f"JPEG decode+resize 256+crop 224: CPU path, {threads} thread(s)",
            f"{r['cpu_rate']:,.0f} images/s ({r['images']} images)")
    row(f"JPEG decode+resize 256+crop 224: {what}, batches of {r['batch']}",
        f"{r['torch_rate']:,.0f} images/s = {r['torch_rate'] / r['cpu_rate']:.1f}x the CPU path"
        f" on {r['cpu_threads']} thread(s)", "", "" if cuda else "SKIP")
    ok = r["mean_abs"] <= GPU_MEAN_ABS_TOLERANCE and r["max_abs"] <= GPU_MAX_ABS_TOLERANCE
    row(f"{what} vs CPU path (dct_scaling=False), uint8 levels",
        f"mean abs diff {r['mean_abs']:.2f}, max {r['max_abs']}",
        f"mean <= {GPU_MEAN_ABS_TOLERANCE}, max <= {GPU_MAX_ABS_TOLERANCE}", verdict(ok))


def section_scaling(dry: bool) -> None:
    from streamio.bench.device import scaling

    info = _image_set(dry)
    counts = [1, 2] if dry else DECODERS
    # The parent gives this section what is left of TOTAL (at most its budget): stop starting
    # decoder counts ~25 s before that (a count takes ~20 s at most), so that it ends cleanly.
    deadline = time.monotonic() + float(os.environ.get("DEVICE_CHECK_SECONDS", 60)) - 25
    last = None
    with tempfile.TemporaryDirectory(prefix="streamio-device-check-") as tmpdir:
        for r in scaling(info, counts, 1 if dry else 3, tmpdir, deadline):
            n = r["decoders"]
            for kind in ("threads", "processes"):
                if n == 1 and kind == "processes":
                    continue  # one decoder decodes in the reading thread: one case
                ratio = r[f"{kind}/in-memory"]
                name = "1 decoder (in the reading thread)" if n == 1 else f"{n} decoder {kind}"
                row(f"one FIFO, {name}", f"{r[kind]:,.0f} images/s = {ratio:.2f}x in-memory"
                    f" on {n} thread(s) ({r['in-memory']:,.0f}/s)", ">= 0.9x",
                    verdict(ratio >= 0.9))
                if last is not None:
                    # Per doubling: 8 -> 14 is 0.81 of a doubling; its ratio is raised to
                    # 1 / 0.81 before it meets the 1.8 target.
                    per = (r[kind] / last[kind]) ** (1 / math.log2(n / last["decoders"]))
                    row(f"one FIFO, {last['decoders']} -> {n} decoder {kind}",
                        f"{per:.2f}x per doubling", ">= 1.8x", verdict(per >= 1.8))
            last = r


def section_torch_workers(dry: bool) -> None:
    """to_torch() through DataLoader(num_workers=N) on a many-core host, from part files, against
    numpy iteration of the same Dataset in one process (streamio bench --workloads
    torch-workers, one round: the section's budget allows no more)."""
    import statistics

    from streamio.bench.torch_workers import measure

    records = 50_000 if dry else TORCH_WORKERS_RECORDS
    counts = [2] if dry else TORCH_WORKERS
    results, modes = measure(records, 1, [256], counts, ["files"], floor=False, timeout=60,
                             log=sys.stdout)
    base = statistics.median(r["rate"] for r in results["files/bs256/numpy"])
    for mode in modes[1:]:
        runs = results[f"files/bs256/{mode}"]
        rate = statistics.median(r["rate"] for r in runs)
        cpu = statistics.median(r.get("main_cpu_us") or 0.0 for r in runs), \
            statistics.median(r.get("workers_cpu_us") or 0.0 for r in runs)
        row(f"to_torch(), DataLoader(num_workers={mode[1:]}), {records:,} Examples, batch 256,"
            " part files", f"{rate:,.0f} rec/s = {rate / base:.2f}x numpy in one process"
            f" ({base:,.0f}/s); CPU us a batch: main {cpu[0]:.0f}, child processes {cpu[1]:.0f}",
            "workers add throughput" if mode != "w0" else ">= 0.9x",
            verdict(rate >= 0.9 * base) if mode == "w0" else "")


SECTIONS = {"env": section_env, "cuda-tests": section_cuda_tests, "overlap": section_overlap,
            "gpu-decode": section_gpu_decode, "scaling": section_scaling,
            "torch-workers": section_torch_workers}


# -- the parent: run the sections, relay and file the rows -------------------------------------------
class Table:
    def __init__(self, out: str | None, dry: bool) -> None:
        self.rows: list[tuple] = []
        self.out = out
        self.head = [f"# streamio device check{' (dry run)' if dry else ''}",
                     "", f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", "",
                     "| section | item | result | target | verdict |",
                     "| --- | --- | --- | --- | --- |"]
        self.log = open(os.path.join(out, "log.txt"), "a") if out else None
        print("| section | item | result | target | verdict |", flush=True)

    def note(self, line: str) -> None:
        if self.log:
            self.log.write(line + "\n")
            self.log.flush()

    def add(self, section: str, cells: list) -> None:
        cells = (cells + ["", "", "", ""])[:4]
        self.rows.append((section, *cells))
        line = "| " + " | ".join((section, *cells)) + " |"
        print(line, flush=True)
        self.note(line)
        if self.out:
            tmp = os.path.join(self.out, "device_table.md.tmp")
            with open(tmp, "w") as f:
                f.write("\n".join(self.head + ["| " + " | ".join(r) + " |" for r in self.rows])
                        + "\n")
            os.replace(tmp, os.path.join(self.out, "device_table.md"))


def run_section(name: str, dry: bool, budget: float, table: Table) -> None:
    cmd = [sys.executable, os.path.abspath(__file__), "--section", name]
    if dry:
        cmd.append("--dry-run")
    env = dict(os.environ, PYTHONUNBUFFERED="1", DEVICE_CHECK_SECONDS=str(budget))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    assert proc.stdout is not None
    timer = threading.Timer(budget, lambda: os.killpg(proc.pid, 9))
    timer.start()
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(ROW):
                table.add(name, line[len(ROW):].split("\t"))
            else:
                table.note(f"[{name}] {line}")
        proc.wait()
    finally:
        timer.cancel()
    took = time.monotonic() - t0
    if proc.returncode == -9:
        table.add(name, ["section", f"TIMED OUT after {budget:.0f} s (rows above are what it"
                                    " measured)", f"<= {budget:.0f} s", "MISS"])
    elif proc.returncode != 0:
        table.add(name, ["section", f"failed, exit {proc.returncode} (see log.txt)", "exit 0",
                         "MISS"])
    else:
        table.note(f"[{name}] done in {took:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="a CPU machine: small, CUDA skipped")
    p.add_argument("--out", default=os.environ.get("OUT") or None,
                   help="folder for device_table.md and log.txt (default: $OUT if set)")
    p.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)
    p.add_argument("--only", action="append", choices=sorted(SECTIONS),
                   help="run only these sections (repeatable)")
    p.add_argument("--total", type=float, default=None,
                   help="seconds for all sections together (default: %d; the GPU machine's"
                        " lease may leave less): each section's budget shrinks in proportion"
                        % TOTAL)
    args = p.parse_args(argv)
    if args.section:
        SECTIONS[args.section](args.dry_run)
        return 0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    table = Table(args.out, args.dry_run)
    budget = DRY_BUDGET if args.dry_run else BUDGET
    t0 = time.monotonic()
    total = DRY_TOTAL if args.dry_run else TOTAL
    if args.total is not None:
        scale = min(1.0, args.total / total)
        budget = {name: max(10.0, seconds * scale) for name, seconds in budget.items()}
        total = args.total
    for name in SECTIONS:
        if args.only and name not in args.only:
            continue
        left = total - (time.monotonic() - t0)
        if left < 10:
            table.add(name, ["section", f"not run: the {total} s of the check are spent", "",
                             "MISS"])
            continue
        run_section(name, args.dry_run, min(budget[name], left), table)
    table.note(f"all sections: {time.monotonic() - t0:.0f} s")
    print(f"all sections: {time.monotonic() - t0:.0f} s", flush=True)
    if args.out:
        with open(os.path.join(args.out, "device_table.json"), "w") as f:
            json.dump(table.rows, f, indent=1)
    failed = [r for r in table.rows if r[4] == "MISS" and r[1] == "section"]
    # CI (the dry run): a section that breaks fails it; a missed target on 2 cores does not.
    return 1 if args.dry_run and failed else 0


if __name__ == "__main__":
    sys.exit(main())

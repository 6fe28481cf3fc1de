"""Run every fuzz target for a while under ASan/UBSan; fail on any crash or C-vs-Python mismatch.

    python tests/fuzz/run.py --time 30                  # the CI smoke: 30 s per target
    python tests/fuzz/run.py --time 3600 --parallel 2   # a campaign: two targets at a time
    python tests/fuzz/run.py --targets scan_recordio,crc32c --runs 100000

Builds the sanitizer variant first if there is none (``--build`` rebuilds), writes the seeds
(make_corpus.py) and keeps each target's growing corpus in ``build/fuzz/corpus/<target>`` (so a
later run starts where this one stopped). A crashing input is saved as
``build/fuzz/artifacts/<target>/crash-<sha1>`` (``timeout-``/``oom-`` for a hang or a memory
blow-up), with the fuzzer's log beside it; the summary prints the command that replays it.
Exits 1 if any target crashed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = ROOT / "build" / "fuzz"
sys.path.insert(0, str(HERE))

import make_corpus  # noqa: E402
import sanitized  # noqa: E402
import targets  # noqa: E402

# Inputs stay small (libFuzzer's default -max_len): the kernels' loops are reached within a few
# frames, and a short input runs the Python reference many more times per second.
MAX_LEN = 4096
TIMEOUT_S = 30  # one input taking longer is a hang: a finding (saved as timeout-<sha1>)
RSS_LIMIT_MB = 3072  # ASan's shadow and quarantine on top of Python + numpy (~0.6 GB at start)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def run_target(name: str, args: argparse.Namespace) -> dict:
    corpus = BUILD / "corpus" / name
    seeds = BUILD / "seeds" / name
    artifacts = BUILD / "artifacts" / name
    for folder in (corpus, artifacts):
        folder.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    log = artifacts / "fuzz.log"
    budget = (["-runs=%d" % args.runs] if args.runs else []) + (
        ["-max_total_time=%d" % args.time] if args.time else [])
    cmd = [sys.executable, str(HERE / "fuzz.py"), name, *budget, "-print_final_stats=1",
           f"-artifact_prefix={artifacts}/", f"-max_len={args.max_len}",
           f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}", *args.libfuzzer,
           str(corpus), str(seeds)]
    env = dict(os.environ)
    env["STREAMIO_FUZZ_PYTHON_COVERAGE"] = "1" if args.python_coverage else "0"
    if args.suppress_known:
        suppressions = HERE / "known-issues.supp"
        env["UBSAN_OPTIONS"] = f"{sanitized.UBSAN_OPTIONS}:suppressions={suppressions}"
    if args.nice:
        cmd = ["nice", "-n", str(args.nice)] + cmd
    started, started_wall = time.monotonic(), time.time()
    with open(log, "wb") as f:
        # A budget past the per-target time means a hang that libFuzzer did not catch.
        limit = (args.time or 0) + 300 if args.time else None
        try:
            # in the artifacts folder: with -jobs, libFuzzer writes fuzz-<job>.log to the cwd
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=artifacts,
                                timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    elapsed = time.monotonic() - started
    text = log.read_text(errors="replace")
    # new files, and any the log names (an input found again has the same name as before)
    written = {Path(p) for p in re.findall(r"Test unit written to (\S+)", text)}
    found = sorted((set(artifacts.iterdir()) - before | written) & set(artifacts.iterdir()))
    found = [p for p in found if p.name.startswith(("crash-", "timeout-", "oom-", "leak-"))]
    # with -jobs, each job reports in its own fuzz-<job>.log
    job_logs = [p for p in artifacts.glob("fuzz-*.log") if p.stat().st_mtime >= started_wall]
    units = [u for t in ([p.read_text(errors="replace") for p in job_logs] or [text])
             for u in re.findall(r"stat::number_of_executed_units:\s*(\d+)", t)[-1:]]
    skipped = text.startswith("SKIP") or "\nSKIP " in text
    return {"name": name, "rc": rc, "elapsed": elapsed, "log": log, "found": found,
            "execs": sum(map(int, units)) if units else None, "skipped": skipped, "text": text}


def report(result: dict) -> bool:
    """Print one target's line (and, on failure, the end of its log); True if it passed."""
    name, rc = result["name"], result["rc"]
    if result["skipped"]:
        print(f"SKIP {name}: no such kernel in this build", flush=True)
        return True
    execs = result["execs"]
    ok = rc == 0 and not result["found"]
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {execs if execs is not None else '?'} executions "
          f"in {result['elapsed']:.0f} s (exit status {rc})", flush=True)
    if not ok:
        tail = result["text"][-6000:]
        print("  --- end of " + rel(result["log"]) + " ---\n" + tail, flush=True)
        causes = re.findall(r"^.*(?:runtime error|==ERROR|SUMMARY:|^\w*(?:Error|Mismatch)\b).*$",
                            result["text"], flags=re.M)
        for line in dict.fromkeys(causes[:6]):
            print(f"  cause: {line.strip()[:300]}", flush=True)
        for path in result["found"] or []:
            print(f"  reproducer: {rel(path)}\n  replay: python tests/fuzz/fuzz.py {name} "
                  f"{rel(path)}", flush=True)
    return ok


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time", type=int, default=30, help="seconds per target (default 30)")
    parser.add_argument("--runs", type=int, default=0, help="executions per target (0: no cap)")
    parser.add_argument("--targets", default="", help="comma-separated names (default: all)")
    parser.add_argument("--parallel", type=int, default=1, help="targets run at the same time")
    parser.add_argument("--max-len", type=int, default=MAX_LEN)
    parser.add_argument("--nice", type=int, default=0, help="run the fuzzers under nice -n N")
    parser.add_argument("--build", action="store_true", help="rebuild the sanitizer variant")
    parser.add_argument("--python-coverage", action="store_true",
                        help="also guide by the Python references' coverage (~10x slower)")
    parser.add_argument("--suppress-known", action="store_true",
                        help="skip the UBSan findings listed in known-issues.supp")
    parser.add_argument("libfuzzer", nargs="*", help="extra libFuzzer flags, after --")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n] or list(targets.TARGETS)
    unknown = [n for n in names if n not in targets.TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; targets: {', '.join(targets.TARGETS)}")
    if args.build or not (BUILD / "modules.json").exists():
        subprocess.run([sys.executable, str(HERE / "build.py")], check=True)
    make_corpus.write_corpus(BUILD / "seeds", names)
    started = time.monotonic()
    passed = []
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:  # a line as each target ends
        futures = [pool.submit(run_target, name, args) for name in names]
        results = []
        for future in as_completed(futures):
            results.append(future.result())
            passed.append(report(results[-1]))
    total = sum(r["execs"] or 0 for r in results)
    print(f"{sum(passed)}/{len(passed)} targets passed, {total} executions in "
          f"{time.monotonic() - started:.0f} s; artifacts in {rel(BUILD / 'artifacts')}",
          flush=True)
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Running the benchmark: every case for several rounds, alternating, in one temporary directory."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from typing import Any

from .cases import _Skip, streamio_cases
from .config import BenchConfig, CaseResult, Measurement
from .measure import FifoFeed, measure_here, rss_mib
from .peers import PeerWorker, peer_cases
from .report import build_report
from .workloads import make_workloads


def _log(cfg: BenchConfig, message: str) -> None:
    if cfg.verbose:
        print(message, file=sys.stderr, flush=True)


def _probe_fifo(worker: PeerWorker, src: str, tmpdir: str, timeout: float) -> str:
    """Try a peer on a FIFO once; return what happened (normally the error text)."""
    feed = FifoFeed(src, tmpdir)
    try:
        reply = worker.call({"kind": "probe-fifo", "path": feed.path}, timeout=timeout)
    finally:
        feed.unblock()
        feed.proc.kill()
        feed.close()
    if reply.get("ok"):
        return f"read {reply.get('records')} records from the FIFO (no error)"
    return reply.get("error", "?")


#: What the printed table's notes say about how every figure was taken.
NOTES = (
    "TensorFlow, torch and the tfrecord package run in their own worker processes;"
    " streamio and pandas run in the main process, which never imports TensorFlow or"
    " torch. The adapters' to_tf() and to_torch() cases run in the TensorFlow and torch"
    " workers (to_tf() reading a FIFO fed as the main process's are).",
    "FIFO inputs are fed by a separate writer process (os.open on the FIFO, then"
    " sendfile of the file) started fresh for every measurement.",
    "Each round runs every case once, in alternating order (reversed on odd rounds);"
    " figures are medians over the rounds. A target's ratio is the median of the rounds'"
    " own ratios (both sides run in the same round), which a drift in the machine's"
    " speed does not skew; the ratio of the medians is shown beside it.",
    "peak_rss_mib is the process's VmHWM, reset before each measurement (for workers:"
    " the worker process, TensorFlow's runtime included).",
)


def _plan_cases(cfg: BenchConfig, work: dict) -> tuple:
    """``(results, runnable)``: a :class:`CaseResult` per case by name (skipped ones say why),
    and the ``(name, workload, input kind, how)`` of the cases to run."""
    results: dict = {}
    runnable = []
    for name, w, runner, kind, how in streamio_cases(cfg, work) + peer_cases(cfg, work):
        where = how[0] if isinstance(how, tuple) else "streamio"
        res = CaseResult(name, name.split("/")[0], runner, kind, where)
        results[name] = res
        if isinstance(how, _Skip):
            res.skipped = str(how)
            _log(cfg, f"skip {name}: {how}")
        else:
            runnable.append((name, w, kind, how))
    return results, runnable


def _start_workers(cfg: BenchConfig, work: dict, runnable: list, workers: dict,
                   tmpdir: str) -> tuple:
    """Start a worker per peer the cases need (into ``workers``); return ``(versions,
    fifo_errors)``: each peer's version, and what each peer does when given a FIFO."""
    versions: dict = {}
    fifo_errors: dict = {}
    for which in sorted({how[0] for _, _, _, how in runnable if isinstance(how, tuple)}):
        workers[which] = PeerWorker(which, cfg.peer_timeout)
        reply = workers[which].call({"kind": "version", "path": ""})
        versions[which] = reply.get("version") or reply.get("error")
    if "examples" in work:
        for which, label in (("tf", "tf.data TFRecordDataset"), ("tfrecord", "tfrecord package")):
            if which in workers:
                fifo_errors[label] = _probe_fifo(workers[which], work["examples"].path, tmpdir,
                                                 timeout=60)
                _log(cfg, f"{label} on a FIFO: {fifo_errors[label]}")
    return versions, fifo_errors


def _measure_peer(cfg: BenchConfig, worker: PeerWorker, op: dict, w: Any, kind: str,
                  tmpdir: str) -> Any:
    """One measurement in a peer's worker: a :class:`Measurement`, or the error text."""
    # Peers read files (they cannot read a FIFO); streamio's adapters, which run in the same
    # workers, read a FIFO fed as for this process's cases.
    feed = FifoFeed(w.path, tmpdir) if kind == "fifo" else None
    reply: dict = {}
    try:
        reply = worker.call(dict(op, path=feed.path if feed else w.path,
                                 batch_size=cfg.batch_size))
    finally:
        if feed:
            if not reply.get("ok"):
                feed.unblock()  # a writer still waiting in open() can finish
            feed.close()
    if not reply.get("ok"):
        return reply.get("error")
    return Measurement(reply["records"], reply["seconds"], w.nbytes, reply.get("peak_rss_mib"))


def _measure(cfg: BenchConfig, w: Any, kind: str, how: Any, workers: dict, tmpdir: str) -> Any:
    """One measurement of a case: a :class:`Measurement`, or the error text."""
    if isinstance(how, tuple):
        which, op = how
        return _measure_peer(cfg, workers[which], op, w, kind, tmpdir)
    try:
        return measure_here(how, w.path, w.nbytes, w.path if kind == "fifo" else None, tmpdir)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        if cfg.verbose:
            traceback.print_exc()
        return f"{type(exc).__name__}: {exc}"


def _run_round(cfg: BenchConfig, rnd: int, runnable: list, results: dict, workers: dict,
               tmpdir: str) -> None:
    """Every case once (in reverse order on odd rounds), each result added to its case."""
    order = runnable if rnd % 2 == 0 else runnable[::-1]
    for name, w, kind, how in order:
        res = results[name]
        if res.error:
            continue
        m = _measure(cfg, w, kind, how, workers, tmpdir)
        if not isinstance(m, Measurement):
            res.error = m
            _log(cfg, f"round {rnd + 1}: {name} failed: {res.error}")
            continue
        if m.records != w.records:
            res.error = f"counted {m.records} records, expected {w.records}"
        res.rounds.append(asdict(m))
        _log(cfg, f"round {rnd + 1}: {name:34s} {m.seconds:7.3f} s"
                  f" {m.records / m.seconds:>13,.0f} rec/s {m.nbytes / m.seconds / 1e6:9,.1f} MB/s")


def run_benchmark(cfg: BenchConfig) -> dict:
    """Run every case for ``cfg.rounds`` rounds, alternating; return the results as a dict."""
    own_tmp = cfg.tmpdir is None
    tmpdir = tempfile.mkdtemp(prefix="streamio-bench-") if own_tmp else cfg.tmpdir
    os.makedirs(tmpdir, exist_ok=True)
    workers: dict = {}
    try:
        t0 = time.perf_counter()
        work = make_workloads(cfg, tmpdir)
        _log(cfg, f"generated {', '.join(f'{w.name} ({w.records} records, {w.nbytes / 1e6:.1f} MB)' for w in work.values())}"
                  f" in {time.perf_counter() - t0:.1f} s under {tmpdir}")
        results, runnable = _plan_cases(cfg, work)
        versions, fifo_errors = _start_workers(cfg, work, runnable, workers, tmpdir)
        baseline_rss = rss_mib()  # this process before any measurement: the fixed part
        for rnd in range(cfg.rounds):
            _run_round(cfg, rnd, runnable, results, workers, tmpdir)
        report = build_report(cfg, work, results, fifo_errors, versions, list(NOTES))
        report["baseline_rss_mib"] = baseline_rss
        return report
    finally:
        for worker in workers.values():
            worker.close()
        if own_tmp and not cfg.keep:
            shutil.rmtree(tmpdir, ignore_errors=True)

"""The report: medians, the targets' paired ratios, the machine, and the printed table."""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import asdict
from typing import Optional

import numpy as np

from .config import (BenchConfig, DEFAULT_ADAPTER_RECORDS, DEFAULT_CSV_ROWS, DEFAULT_EXAMPLES,
                     DEFAULT_LARGE_RECORDS, DEFAULT_PIPELINE_RECORDS, DEFAULT_RECORDIO_ROWS,
                     TARGETS)


# -- running ------------------------------------------------------------------------------------------
def _machine() -> dict:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"nproc": os.cpu_count(), "cpu": model, "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            info["pipe_max_size"] = int(f.read())
    except (OSError, ValueError):
        pass
    try:
        from .. import _speedups  # type: ignore

        info["speedups"] = True
        info["hardware_crc32c"] = bool(_speedups.HARDWARE_CRC32C)
    except ImportError:
        info["speedups"] = False
    try:
        import pandas

        info["pandas"] = pandas.__version__
    except ImportError:
        pass
    return info

#: The workload sizes the targets are set for (a run with any of them smaller is not judged).
_FULL_SIZES = {"examples": DEFAULT_EXAMPLES, "pipeline_records": DEFAULT_PIPELINE_RECORDS,
               "adapter_records": DEFAULT_ADAPTER_RECORDS,
               "large_records": DEFAULT_LARGE_RECORDS, "csv_rows": DEFAULT_CSV_ROWS,
               "recordio_rows": DEFAULT_RECORDIO_ROWS}


def full_scale(cfg: BenchConfig) -> bool:
    """Whether every workload is at least its default size, so the targets apply."""
    return all(getattr(cfg, name) >= size for name, size in _FULL_SIZES.items())


def build_report(cfg: BenchConfig, work: dict, results: dict, fifo_errors: dict, versions: dict,
            notes: list) -> dict:
    cases = []
    for res in results.values():
        entry = {"case": res.case, "workload": res.workload, "runner": res.runner,
                 "input": res.input, "process": res.process, "rounds": res.rounds}
        entry.update(res.medians())
        if res.skipped:
            entry["skipped"] = res.skipped
        if res.error:
            entry["error"] = res.error
        cases.append(entry)
    by_name = {c["case"]: c for c in cases}
    ratios = []
    for label, num, den, target, unit in TARGETS:
        a = by_name.get(num, {})
        if den is None:
            value = a.get("records_per_s")
            of_medians = None
        else:
            b = by_name.get(den, {})
            by_bytes = num.endswith("read_records") and den.endswith("raw-read")  # bytes/s
            key = "mb_per_s" if by_bytes else "records_per_s"
            va, vb = a.get(key), b.get(key)
            of_medians = va / vb if va and vb else None
            # The median of the rounds' own ratios: each round runs both sides back to back, so
            # a drift in the machine's speed (a noisy neighbour on a VM) cancels out.
            value = _paired_ratio(a.get("rounds"), b.get("rounds"), by_bytes) if of_medians else None
        met = None if value is None or target is None or not full_scale(cfg) else value >= target
        ratios.append({"name": label, "value": value, "target": target, "unit": unit, "met": met,
                       "ratio_of_medians": of_medians})
    return {
        "machine": _machine(),
        "peers": versions,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("verbose",)},
        "workloads": {k: asdict(v) for k, v in work.items()},
        "cases": cases,
        "ratios": ratios,
        "full_scale": full_scale(cfg),
        "fifo_errors": fifo_errors,
        "notes": notes,
    }


def _paired_ratio(rounds_a: Optional[list], rounds_b: Optional[list], by_bytes: bool
                  ) -> Optional[float]:
    """The median over rounds of side a's rate divided by side b's in the same round."""
    if not rounds_a or not rounds_b:
        return None
    key = "nbytes" if by_bytes else "records"
    pairs = [(ra[key] / ra["seconds"]) / (rb[key] / rb["seconds"])
             for ra, rb in zip(rounds_a, rounds_b) if ra["seconds"] > 0 and rb["seconds"] > 0]
    return statistics.median(pairs) if pairs else None


def format_table(report: dict) -> str:
    m = report["machine"]
    lines = [f"machine: {m.get('cpu')}, {m.get('nproc')} CPUs, Python {m.get('python')},"
             f" numpy {m.get('numpy')}, C speedups: {m.get('speedups')}"
             f" (hardware CRC-32C: {m.get('hardware_crc32c')})"]
    if report.get("peers"):
        lines.append("peers: " + ", ".join(f"{k} {v}" for k, v in report["peers"].items()))
    if report.get("baseline_rss_mib"):
        lines.append(f"streamio process RSS before the measurements: {report['baseline_rss_mib']:.0f} MiB"
                     " (peak RSS below includes it)")
    lines.append("")
    head = f"{'case':34s} {'input':5s} {'median s':>9s} {'records/s':>13s} {'MB/s':>9s} {'peak RSS':>9s}  runner"
    lines.append(head)
    lines.append("-" * len(head))
    for c in report["cases"]:
        if c.get("skipped"):
            lines.append(f"{c['case']:34s} {c['input']:5s} skipped: {c['skipped']}")
            continue
        if "median_s" not in c:
            lines.append(f"{c['case']:34s} {c['input']:5s} failed: {c.get('error')}")
            continue
        rss = f"{c['peak_rss_mib']:7.0f}Mi" if c.get("peak_rss_mib") else "        ?"
        lines.append(f"{c['case']:34s} {c['input']:5s} {c['median_s']:9.3f} {c['records_per_s']:13,.0f}"
                     f" {c['mb_per_s']:9,.1f} {rss}  {c['runner']}"
                     + (f"  [error: {c['error']}]" if c.get("error") else ""))
    lines.append("")
    if report.get("full_scale", True):
        lines.append("targets:")
    else:
        lines.append("targets (they apply at full scale; this run is scaled down, so none is"
                     " judged):")
    for r in report["ratios"]:
        if r["value"] is None:
            lines.append(f"  {r['name']:52s} n/a (a side was skipped or failed)")
            continue
        if r["unit"] == "rec/s":
            value = f"{r['value']:,.0f} rec/s"
            target = f">= {r['target']:,.0f} rec/s" if r["target"] else ""
        else:
            value = f"{r['value']:.3f}x"  # 3 places: 1/1.1 is 0.909, not 0.91
            target = f">= {r['target']:.3f}x" if r["target"] else "(no target)"
        verdict = "" if r["met"] is None else ("  MET" if r["met"] else "  NOT MET")
        also = (f"  (ratio of medians {r['ratio_of_medians']:.2f}x)"
                if r.get("ratio_of_medians") else "")
        lines.append(f"  {r['name']:52s} {value:>16s}  {target}{verdict}{also}")
    if report.get("fifo_errors"):
        lines.append("")
        lines.append("peers on a FIFO (tried once):")
        for k, v in report["fifo_errors"].items():
            lines.append(f"  {k}: {v}")
    lines.append("")
    lines.extend(f"note: {n}" for n in report["notes"])
    return "\n".join(lines)

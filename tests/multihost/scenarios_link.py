"""The link scenarios of the multi-host harness: streamio's rate over the storage host's shaped
link beside curl's, and a host whose link goes down for 5 s mid-object."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import driver
import streamio

BIG = "big.tfrecord"
#: 200 MB: records of 64 KiB, each starting with its index (big-endian u64).
BIG_RECORDS = 3052
RECORD = 64 * 1024
DOWN_S = 5.0


def write_big(directory: Path) -> str:
    import os
    block = os.urandom(RECORD - 8)
    streamio.write_records(str(directory / BIG), "tfrecord",
                           (i.to_bytes(8, "big") + block for i in range(BIG_RECORDS)))
    return BIG


def link_rate(h: driver.Harness) -> dict:
    """Host 0 reads the object over HTTP and S3, with curl and with streamio, alternating."""
    out = h.hosts[0].python(str(driver.HERE / "link_reader.py"), "rate", h.http(BIG), h.s3(BIG),
                            str(h.rounds), timeout=600)
    return {"rate": h.net.rate, "records": BIG_RECORDS, "runs": json.loads(out)}


def _down_once(h: driver.Harness, host, timeouts, down_s=DOWN_S, side="cable") -> dict:
    before = len(json.loads(host.run_ok(["curl", "-sSf", h.request_log(BIG)])))
    argv = [sys.executable, str(driver.HERE / "link_reader.py"), "read", h.http(BIG)]
    if timeouts is not None:
        argv += map(str, timeouts)
    proc = host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    time.sleep(0.5)  # a few MB in: mid-object
    host.set_link(False, side=side)
    down_at = time.monotonic()
    time.sleep(down_s)
    host.set_link(True, side=side)
    try:
        so, se = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.kill()
        so, se = proc.communicate()
    ranges = json.loads(host.run_ok(["curl", "-sSf", h.request_log(BIG)]))
    lines = [first, *so.splitlines()]  # "first", then the JSON; only the JSON if it failed early
    result = json.loads(lines[-1]) if proc.returncode == 0 else {"stdout": so}
    first = lines[0] == "first"
    ended = result.get("ended_at")
    return dict(result, ranges=ranges[before:], first=first, rc=proc.returncode, stderr=se[-2000:],
                after_down_s=None if ended is None else round(ended - down_at, 1),
                timeouts=timeouts, down_s=down_s, side=side)


#: A host interface down this long outlasts streamio's retries with read_timeout=1: the silent
#: connection is dropped after 1 s, and each reconnect fails at once (no route) until
#: max_retries (5) failures in a row, with the backoff between them (0.25 s doubling: 7.75 s).
LONG_DOWN_S = 20.0
RETRY_BOUND_S = 1.0 + 7.75


def link_down(h: driver.Harness) -> dict:
    """Host 1 streams the object over HTTP; 0.5 s in, its cable is pulled for 5 s: with the
    default timeouts (TCP rides it out) and with read_timeout=2 (streamio reconnects); then
    its interface goes down for 20 s with read_timeout=1 (streamio gives up within its retry
    budget). open_timeout 30 s: the server hashes the object before it answers."""
    host = h.hosts[1]
    return {"records": BIG_RECORDS, "retry_bound_s": RETRY_BOUND_S,
            "runs": [_down_once(h, host, None), _down_once(h, host, (30, 2)),
                     _down_once(h, host, (30, 1), LONG_DOWN_S, side="host")]}


SCENARIOS = {"link_rate": link_rate, "link_down": link_down}


def table(result: dict) -> str:
    """The link-rate runs as a table (benchmarks/multihost.sh): per protocol, the median
    transfer rate of curl and of streamio, the median of the per-round ratios, and streamio's
    rate over the link's."""
    import statistics
    link = float(result["rate"].rstrip("mbit"))
    mbit = {}
    for run in result["runs"]:
        rate = run["transfer_bytes"] * 8 / run["transfer_seconds"] / 1e6
        mbit.setdefault(run["proto"], {}).setdefault(run["round"], {})[run["tool"]] = rate
    n_rounds = len(next(iter(mbit.values())))
    lines = [f"link: tbf rate {result['rate']} on the storage host's veth; 200 MB TFRecord"
             f" object, {n_rounds} rounds (alternating), medians; Mbit/s of payload after the"
             " first byte",
             f"{'protocol':<9}{'curl':>8}{'streamio':>10}{'streamio/curl':>15}"
             f"{'streamio/link':>15}"]
    for proto, rounds in mbit.items():
        curl = statistics.median(r["curl"] for r in rounds.values())
        sio = statistics.median(r["streamio"] for r in rounds.values())
        ratio = statistics.median(r["streamio"] / r["curl"] for r in rounds.values())
        lines.append(f"{proto:<9}{curl:>8.0f}{sio:>10.0f}{ratio:>15.3f}{sio / link:>15.3f}")
    return "\n".join(lines)


if __name__ == "__main__":  # python scenarios_link.py table OUT.json
    with open(sys.argv[2]) as f:
        print(table(json.load(f)["link_rate"]))

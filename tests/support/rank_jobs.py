"""Jobs of real rank processes (tests/scripts/elastic_torch.py, shared_elastic_ranks.py): started
inside a private network namespace where permitted (torch's store listens on every interface),
each under a timeout, and the checks their results share."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def script_env() -> dict:
    """The scripts import the streamio the tests import (this checkout's)."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))


def private_network() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "sh", "-c", "ip link set lo up"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def run_job(script, args, timeout: float) -> subprocess.CompletedProcess:
    """``python script *args`` (a job starting rank processes), in a private network namespace
    with only loopback up where ``unshare --net`` is permitted; killed after ``timeout`` s."""
    command = [sys.executable, str(script), *map(str, args)]
    if private_network():  # the c10d store listens on every interface: keep it private
        command = ["unshare", "--net", "sh", "-c",
                   "ip link set lo up && exec " + " ".join(map(repr, command))]
    return subprocess.run(command, capture_output=True, timeout=timeout, env=script_env())


def assert_exactly_once(runs: list, expected: set, what: str) -> None:
    """Every id of ``expected`` once over ``runs`` (lists of ids), nothing else."""
    seen = collections.Counter(i for ids in runs for i in ids)
    missing, extra = expected - set(seen), set(seen) - expected
    twice = sorted(i for i, n in seen.items() if n > 1)
    assert not missing and not extra and not twice, \
        f"{what}: {len(missing)} missing, {len(extra)} foreign, {len(twice)} twice {twice[:10]}"

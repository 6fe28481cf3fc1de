"""streamio.ray on real Ray: each scenario of tests/ray_scenarios/ runs inside a private network
namespace with only loopback up (``unshare --net``; Ray listens on every interface and probes
8.8.8.8 to find its address), one pytest process and one Ray per file, and each scenario comes
back here as its own test, failing with the inner failure's text.

Skipped, with the reason, where Ray is not installed or ``unshare --net`` is not permitted (CI
runs as root and installs Ray: it runs them).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "ray_scenarios"
FILES = ("scenarios.py", "cluster.py")
_UNSHARE = ("unshare", "--net", "--pid", "--fork", "--mount-proc")
#: The whole inner run (Ray start, ~15 scenarios, a TorchTrainer) on a busy 2-core machine.
INNER_TIMEOUT_S = 600


def _scenarios(name: str) -> list:
    tree = ast.parse((HERE / name).read_text())
    return [node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def _why_not() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install 'streamio[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) not found"
    probe = subprocess.run([*_UNSHARE, "sh", "-c", "ip link set lo up"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --net is not permitted here: {probe.stderr.strip()[:200]}"
    return None


_SKIP = _why_not()
_results: dict = {}


def _run(name: str, tmp: Path) -> dict:
    """Run one scenario file in its own namespace; ``{test name: failure text or None}``."""
    report = tmp / f"{name}.xml"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # A PID namespace too (with its own /proc): pytest is its process 1, so when it ends the
    # kernel kills every process left in it (Ray's raylet, GCS, workers): nothing outlives it.
    inner = (f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider"
             f" --junitxml={report} {HERE / name}")
    try:
        proc = subprocess.run([*_UNSHARE, "--kill-child", "sh", "-c", inner], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=INNER_TIMEOUT_S)
        log = proc.stdout[-6000:] + proc.stderr[-3000:]
    except subprocess.TimeoutExpired as exc:
        log = f"timed out after {INNER_TIMEOUT_S} s\n{(exc.stdout or b'')[-6000:]!r}"
    results: dict = {test: f"did not run (no result):\n{log}" for test in _scenarios(name)}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            skipped = case.find("skipped")
            if bad is not None:
                results[case.get("name")] = (bad.get("message", "") + "\n" + (bad.text or ""))
            elif skipped is not None:
                results[case.get("name")] = "SKIP " + skipped.get("message", "")
            else:
                results[case.get("name")] = None
    return results


@pytest.fixture(scope="module")
def inner_results(tmp_path_factory):
    if _SKIP:
        pytest.skip(_SKIP)
    if not _results:
        tmp = tmp_path_factory.mktemp("ray")
        for name in FILES:
            _results[name] = _run(name, tmp)
    return _results


@pytest.mark.parametrize("scenario", [(f, t) for f in FILES for t in _scenarios(f)],
                         ids=lambda s: f"{s[0][:-3]}::{s[1]}")
def test_ray_scenario(inner_results, scenario):
    name, test = scenario
    outcome = inner_results[name][test]
    if outcome is not None and outcome.startswith("SKIP "):
        pytest.skip(outcome[5:])
    assert outcome is None, f"{name}::{test} failed inside the namespace:\n{outcome}"


def test_import_streamio_does_not_import_ray():
    code = "import sys, streamio; print('ray' in sys.modules, 'pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_without_ray_the_error_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"
            "try:\n    import streamio.ray\nexcept ImportError as exc:\n"
            "    print(type(exc).__name__, exc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert "MissingDependencyError" in out.stdout and "streamio[ray]" in out.stdout, out.stderr

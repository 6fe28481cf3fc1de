"""``streamio demo``: the README's first command trains from an emulated Pipe mode channel."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from streamio.tools.demo import DEFAULT_RECORDS, run_demo
from streamio.errors import StreamioError

DEMO_TIMEOUT = 120  # the demo takes seconds; this only stops a hang from stalling CI
EPOCH_LINE = re.compile(r"^epoch (\d+): loss ([0-9.]+)\s+(\d+) records\s+([0-9,]+) records/s"
                        r"\s+waited for data (\d+) ms", re.M)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(not _has("torch"), reason="needs torch")
def test_run_demo_torch_trains_from_the_fifo(tmp_path):
    result = run_demo(framework="torch", epochs=2, workdir=str(tmp_path), records=2048,
                      verbose=False)
    epochs = result["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1]
    assert all(e["records"] == 2048 for e in epochs)  # both epochs, the whole stream each
    assert epochs[1]["loss"] < epochs[0]["loss"]  # it learns
    assert all(e["records_per_s"] > 0 and e["data_wait_s"] >= 0 for e in epochs)
    # The emulator removed its FIFOs (only the container config is left of the emulated
    # /opt/ml); the bundled data file stays in the given workdir.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opt_ml", "train.tfrecord"]
    assert os.listdir(tmp_path / "opt_ml" / "input" / "data") == []
    assert (tmp_path / "opt_ml" / "input" / "config" / "inputdataconfig.json").exists()


def _cli_demo(*args: str) -> list:
    proc = subprocess.run([sys.executable, "-m", "streamio", "demo", *args], capture_output=True,
                          text=True, timeout=DEMO_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(int(e), float(loss), int(n)) for e, loss, n, *_ in EPOCH_LINE.findall(proc.stdout)]


@pytest.mark.skipif(not _has("torch"), reason="needs torch")
def test_cli_demo_prints_per_epoch_figures():
    epochs = _cli_demo()
    assert [e for e, _, _ in epochs] == [0, 1]
    assert all(n == DEFAULT_RECORDS for _, _, n in epochs)
    assert epochs[1][1] < epochs[0][1]


@pytest.mark.skipif(not _has("tensorflow"), reason="needs tensorflow")
def test_cli_demo_with_keras():
    epochs = _cli_demo("--framework", "tf")
    assert [e for e, _, _ in epochs] == [0, 1]
    assert epochs[1][1] < epochs[0][1]


def test_run_demo_numpy_trains_without_any_framework(tmp_path):
    result = run_demo(framework="numpy", epochs=2, workdir=str(tmp_path), records=2048,
                      verbose=False)
    epochs = result["epochs"]
    assert result["framework"] == "numpy"
    assert [e["records"] for e in epochs] == [2048, 2048]
    assert epochs[1]["loss"] < epochs[0]["loss"] < 0.6931  # it learns: below chance's log(2)
    # the emulated /opt/ml keeps only its config: the FIFOs are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opt_ml", "train.tfrecord"]
    assert os.listdir(tmp_path / "opt_ml" / "input" / "data") == []


def test_cli_demo_runs_where_torch_is_not_installed():
    """`streamio demo` (framework auto) in an interpreter where torch cannot be imported."""
    code = ("import sys\n"
            "sys.modules['torch'] = None  # `import torch` fails\n"
            "from streamio.cli import main\n"
            "sys.exit(main(['demo', '--records', '1024']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training with numpy" in proc.stdout
    epochs = EPOCH_LINE.findall(proc.stdout)
    assert [int(e[0]) for e in epochs] == [0, 1] and float(epochs[1][1]) < float(epochs[0][1])


def test_run_demo_checks_its_arguments():
    with pytest.raises(ValueError):
        run_demo(framework="jax")
    with pytest.raises(ValueError):
        run_demo(epochs=0)
    with pytest.raises(StreamioError):
        run_demo(framework="jax")

"""``map(backend="process")`` from a plain script: no ``__main__`` guard, lambdas, closures.

The map's children start from a forkserver; multiprocessing would run the user's main script
again in each of them, which kills a child of a script without a guard. The function travels
by value (cloudpickle) and the children never import ``__main__``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

import streamio
from conftest import ROOT
from streamio import Dataset

# The script runs top to bottom in one process: if a child imported it, it would write a second
# line to ran.txt (and die trying to start processes of its own).
SCRIPT = """
import numpy as np
import streamio

with open("ran.txt", "a") as f:
    f.write("top level ran\\n")

def double(record):
    return record + record

scale = 3
streamio.write_records("x.tfrecord", "tfrecord", [b"a", b"bc", b"def"])
ds = streamio.Dataset("x.tfrecord", "tfrecord")
print(list(ds.map(double, num_parallel=2, backend="process")))
print(list(ds.map(lambda r: len(r) * scale, num_parallel=2, backend="process")))
print([b["n"].tolist() for b in ds.batch(2).map(
    lambda b: {"n": np.array([len(r) for r in b])}, num_parallel=2, backend="process")])
"""


def test_process_map_from_a_script_without_main_guard(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[b'aa', b'bcbc', b'defdef']", "[3, 6, 9]",
                                        "[[1, 2], [3]]"]
    assert (tmp_path / "ran.txt").read_text() == "top level ran\n"


def test_lambdas_and_closures_run_in_map_processes(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    streamio.write_records(path, "tfrecord", [bytes([i]) * i for i in range(1, 40)])
    suffix = b"!"

    def closure(record: bytes) -> bytes:
        return record + suffix

    ds = Dataset(path, "tfrecord")
    assert list(ds.map(lambda r: len(r), num_parallel=2, backend="process")) == list(range(1, 40))
    assert list(ds.map(closure, num_parallel=2, backend="process")) == [
        bytes([i]) * i + b"!" for i in range(1, 40)]


def test_a_function_that_does_not_pickle_is_refused_at_construction(tmp_path):
    lock = threading.Lock()
    ds = Dataset(str(tmp_path / "r.tfrecord"), "tfrecord")
    with pytest.raises(TypeError, match="does not: .*lock"):
        ds.map(lambda r: (lock, r), num_parallel=2, backend="process")

"""How DataLoader workers hand batches to the main process: small batches cross as one buffer in
the pickle (cheaper than torch's shared-memory segment per tensor), large ones go torch's way;
either way the main process gets a plain dict of writable tensors equal to what the worker had.

The DataLoader scenarios run in a fresh interpreter (tests/scripts/): this pytest process may
have imported TensorFlow, and forking workers from it can deadlock.
"""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.multiprocessing  # noqa: E402,F401,F811 - registers torch's tensor reducers

from streamio.adapters import _torch_transport as adapter  # noqa: E402

from conftest import SCRIPTS  # noqa: E402

SUBPROCESS_TIMEOUT = 180


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("transport")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "torch_transport_check.py"),
                           str(workdir)], capture_output=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", ["small", "wide", "collate"])
def test_workers_batches_arrive_as_plain_dicts_equal_to_the_workers(report, case):
    """small: the buffer path; wide: ~5 MB batches, torch's shared memory; collate: a user's
    collate_fn in the worker sees a dict of tensors. Every record once, every row equal to what
    num_workers=0 gives, int16/float64/empty columns and a list of bytes included."""
    result = report[case]
    assert result["ids"] == list(range(report["records"]))
    assert result["well_formed"] and result["same_rows"]


def _batch(rows: int, width: int) -> dict:
    return {"x": torch.arange(rows * width, dtype=torch.float32).reshape(rows, width),
            "id": torch.arange(rows), "flag": torch.ones(rows, dtype=torch.bool),
            "half": torch.zeros(rows, 2, dtype=torch.bfloat16) + 1.5,
            "scalar": torch.tensor(3), "empty": torch.zeros(rows, 0),
            "names": [b"a"] * rows}


def test_a_small_batch_pickles_as_one_buffer_and_unpickles_as_a_plain_dict():
    from multiprocessing.reduction import ForkingPickler  # torch registers its reducers here

    batch = _batch(256, 32)
    packed = adapter._PipeBatch(batch)
    assert type(copy.copy(packed)) is adapter._PipeBatch  # what DataLoader's default_convert does
    data = bytes(ForkingPickler.dumps(packed))
    assert len(data) > 256 * 32 * 4  # the tensors' bytes travel inside the pickle
    out = pickle.loads(data)
    assert type(out) is dict and list(out) == list(batch)
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert out[name].dtype == value.dtype and out[name].shape == value.shape
            assert torch.equal(out[name], value)
        else:
            assert out[name] == value
    out["x"].add_(1)  # writable, and its own memory
    assert torch.equal(batch["x"] + 1, out["x"])


def test_a_large_batch_goes_through_torchs_shared_memory():
    from multiprocessing.reduction import ForkingPickler  # torch registers its reducers here

    batch = _batch(64, (adapter.PIPE_BATCH_BYTES // 4) // 64 + 1)  # just over the limit
    data = bytes(ForkingPickler.dumps(adapter._PipeBatch(batch)))
    assert len(data) < adapter.PIPE_BATCH_BYTES // 8  # only handles: the data is in shm
    out = pickle.loads(data)
    assert type(out) is dict and torch.equal(out["x"], batch["x"])


def test_non_contiguous_and_grad_tensors_still_arrive():
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    batch = {"t": base.t(), "grad": torch.ones(3, requires_grad=True)}
    out = pickle.loads(pickle.dumps(adapter._PipeBatch(batch)))
    assert torch.equal(out["t"], base.t())
    assert out["grad"].requires_grad and torch.equal(out["grad"].detach(), torch.ones(3))

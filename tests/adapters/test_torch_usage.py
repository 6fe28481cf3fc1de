"""DataLoader set-ups that ran without a word and did the wrong thing now say so, once, with
the fix (streamio.adapters._torch_usage): a batched Dataset collated again by the DataLoader's
default batch_size=1, and a memory cache() lost with each epoch's non-persistent workers.

Each set-up runs in a fresh interpreter with real DataLoader workers; the warnings are read
from its stderr (the workers' included).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import SCRIPTS  # noqa: E402
from support.examples import write_id_parts  # noqa: E402

from streamio import Dataset  # noqa: E402

TIMEOUT = 180


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return write_id_parts(str(tmp_path_factory.mktemp("usage")), [100, 100, 100, 100])


def run(parts, mode, workers, persistent=False):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "torch_usage_check.py"), mode,
                           str(workers), "persistent" if persistent else "-", *parts],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("workers", [0, 2])
def test_collating_the_batches_again_is_said_once_with_the_fix(parts, workers):
    epochs, err = run(parts, "collate", workers)
    assert [1, 64, 4] in epochs[0]["shapes"]  # what it does: an extra leading dimension
    assert err.count("StreamioWarning") == 1, err
    assert "batch_size=None" in err and "(1, 64," in err


def test_batch_size_none_says_nothing(parts):
    epochs, err = run(parts, "none", 2)
    assert epochs[0]["shapes"][-1] == [64, 4]
    assert "StreamioWarning" not in err


def test_stats_of_epochs_read_by_workers_are_plain_numbers(parts):
    epochs, _ = run(parts, "none", 2)
    for epoch in epochs:
        assert set(epoch["types"]) <= {"int", "float", "bool", "dict", "list", "str",
                                       "NoneType"}, epoch
        assert "np." not in epoch["repr"] and "numpy" not in epoch["repr"]


def test_to_torch_docstring_lists_every_option():
    import inspect

    from streamio.adapters.torch import to_torch

    doc = Dataset.to_torch.__doc__
    options = [name for name in inspect.signature(to_torch).parameters if name != "dataset"]
    assert options and all(f"``{name}" in doc for name in options), (options, doc)


def test_a_memory_cache_lost_with_each_epochs_workers_is_said_once(parts):
    epochs, err = run(parts, "cache", 2)
    assert [e["sources_opened"] for e in epochs] == [4, 4, 4]  # read again every epoch
    assert err.count("StreamioWarning") == 1, err
    assert "persistent_workers=True" in err and "cache(directory)" in err


@pytest.mark.parametrize("workers, persistent", [(2, True), (0, False)])
def test_a_memory_cache_that_serves_later_epochs_says_nothing(parts, workers, persistent):
    epochs, err = run(parts, "cache", workers, persistent)
    assert [e["sources_opened"] for e in epochs] == [4, 0, 0]
    assert "StreamioWarning" not in err

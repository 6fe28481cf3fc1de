"""Resuming a StatefulDataLoader's state on another layout (issue #41, item 9): its state
passed to ``to_torch().load_state_dict`` without a list is taken as the list form (was: "not a
StreamDataset state"); one worker's state alone, or a 2-worker loader's state loaded into a
3-worker loader, is refused with an error that names both layouts and says what to do (was: an
error inside a worker, "the state is another shard's", with no hint). Real DataLoader worker
processes, in a script (tests/scripts/torch_resume_layout.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import SCRIPTS
from support.examples import write_id_parts
from support.rank_jobs import assert_exactly_once, script_env

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

SCRIPT = str(SCRIPTS / "torch_resume_layout.py")
FILE_SIZES = [37, 50, 13, 41, 29, 30]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch-layout")
    os.makedirs(root / "files")
    write_id_parts(str(root / "files"), FILE_SIZES)
    proc = subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, timeout=400,
                          env=script_env())
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    out = json.loads((root / "result.json").read_text())
    assert out["tensorflow_imported"] is False
    return out


@pytest.mark.parametrize("case", ["bare-3", "bare-2", "bare-0", "loader-2"])
def test_a_loader_state_resumes_the_rest_of_the_epoch_exactly_once(result, case):
    assert "error" not in result[case], result[case]
    assert_exactly_once([result["before"], result[case]["ids"]], set(range(sum(FILE_SIZES))),
                        case)


def test_one_workers_state_alone_is_refused_at_load_state_dict(result):
    got = result["worker0-3"]
    assert got.get("at") == "load", got
    assert "worker 0 of 2" in got["error"] and "list of every rank's state" in got["error"], got
    assert "ds.load_state_dict(loader_state)" in got["error"], got


def test_a_two_worker_state_in_a_three_worker_loader_names_both_layouts(result):
    got = result["loader-3"]
    assert "error" in got, got
    # torchdata loads each worker's state when the workers start: the error reaches the user
    # from the first iter()/next(), before any batch, as a streamio UsageError.
    assert got["usage_error"] and got["ids_before"] == 0, got
    assert got["stage"] in ("iter", "next"), got
    # Whichever of the three workers fails first reports it: each names both layouts.
    assert re.search(r"worker \d of 2 loaded into worker \d of 3", got["error"]), got
    # ... and the fix: the old loader's state into the dataset, before making the loader.
    assert "ds.load_state_dict(loader_state)" in got["error"], got
    assert "before making the loader" in got["error"], got
    assert "list of every rank's state" in got["error"], got

"""Sources bound to the main process under DataLoader workers: stdin, file objects,
ByteSources (streamio.adapters._torch_bound).

stdin reached a worker as /dev/null (multiprocessing's doing): ``cat parts | python train.py``
with ``DataLoader(num_workers=k)`` delivered no record and said the epoch had finished. Each
scenario runs in a fresh interpreter whose stdin is a real pipe fed by another process (cat).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import SCRIPTS  # noqa: E402
from support.examples import write_id_parts  # noqa: E402

TIMEOUT = 180
SIZES = [300, 250, 350, 100]  # 1000 records over four files


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return write_id_parts(str(tmp_path_factory.mktemp("bound")), SIZES)


def run(parts, *args, stdin_parts=True):
    """The script's report, its stdin a pipe that `cat` (another process) writes the parts
    into."""
    cat = subprocess.Popen(["cat", *parts], stdout=subprocess.PIPE) if stdin_parts else None
    try:
        proc = subprocess.run([sys.executable, str(SCRIPTS / "torch_bound_sources.py"), *args],
                              stdin=cat.stdout if cat else subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        if cat is not None:
            cat.stdout.close()
            cat.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["epochs"]


@pytest.mark.parametrize("workers, context", [(1, "fork"), (2, "fork"), (3, "fork"),
                                              (2, "spawn"), (2, "forkserver")])
def test_stdin_reaches_the_workers_once_and_a_second_epoch_says_why(parts, workers, context):
    first, second = run(parts, "-", str(workers), context)
    assert sorted(first["ids"]) == list(range(sum(SIZES)))  # every record, once
    assert first["records"] == sum(SIZES) and first["finished"] is True
    # The stream is spent: the next epoch is an error that says so, not an empty epoch.
    assert second["error"] == "UsageError", second
    assert "<stdin> was read by epoch 0" in second["message"]
    assert "cache(directory)" in second["message"]


def test_stdin_without_workers_is_unchanged(parts):
    first, second = run(parts, "-", "0", "fork")
    assert sorted(first["ids"]) == list(range(sum(SIZES)))
    assert second["error"] == "UsageError" and "stdin" in second["message"]


def test_a_directory_cache_serves_later_epochs_of_stdin(parts, tmp_path):
    first, second = run(parts, "-", "2", "fork", "cache", str(tmp_path / "cache"))
    assert sorted(first["ids"]) == sorted(second["ids"]) == list(range(sum(SIZES)))


def test_a_memory_cache_with_persistent_workers_serves_later_epochs_of_stdin(parts):
    first, second = run(parts, "-", "2", "fork", "cache", "memory", "persistent")
    assert sorted(first["ids"]) == sorted(second["ids"]) == list(range(sum(SIZES)))


def test_a_file_object_is_read_once_by_forked_workers(parts):
    first, second = run(parts, f"fileobj:{parts[0]}", "2", "fork", stdin_parts=False)
    assert sorted(first["ids"]) == list(range(SIZES[0]))
    assert second["error"] == "UsageError" and "was read by epoch 0" in second["message"]


def test_a_file_object_cannot_go_to_spawned_workers_and_the_error_says_so(parts):
    first, _ = run(parts, f"fileobj:{parts[0]}", "2", "spawn", stdin_parts=False)
    assert first["error"] == "UsageError"
    assert "spawned DataLoader worker cannot receive" in first["message"]
    assert "pass its path" in first["message"]

"""map(backend="process") in a /dev/shm that another user writes to: the names of its shared
memory segments cannot be taken ahead of it, and a name that is taken anyway is survived (a
fresh random name), never attached or unlinked."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

import streamio
from streamio import Dataset
from streamio.pipeline import parallel

from test_map import assert_clean, shm_names

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.isdir("/dev/shm"),
    reason="needs root (to act as another user with setpriv) and /dev/shm")

OTHER_USER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def plant_as_other_user(names):
    """Create each ``/dev/shm/<name>`` as user nobody, exclusively, as a hostile local user
    would (names already there are left alone). Returns the names it created."""
    script = 'set -C; for n; do printf planted > "/dev/shm/$n" 2>/dev/null && echo "$n"; done'
    proc = subprocess.run([*OTHER_USER, "sh", "-c", script, "sh", *names], capture_output=True,
                          text=True, timeout=60)
    return proc.stdout.split()


def assert_untouched(planted):
    for name in planted:
        path = f"/dev/shm/{name}"
        assert os.stat(path).st_uid == 65534, name
        with open(path, "rb") as f:
            assert f.read() == b"planted", name


def remove(planted):
    for name in planted:
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass


def wait_then_copy(flag: str, batch: list) -> np.ndarray:
    """Hold the first tasks until the other user has planted its names; then a result as
    large as the record (out of band: through a result segment)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.005)
    return np.frombuffer(batch[0], np.uint8).copy()


@pytest.fixture
def growing(tmp_path):
    """Records of growing size: input and result segments must be created again and again."""
    records = [bytes([i]) * ((1 + i) * 120_000) for i in range(16)]
    path = str(tmp_path / "grow.tfrecord")
    streamio.write_records(path, "tfrecord", records)
    return path, records


def _check(results, records):
    assert [(int(r[0]), r.nbytes) for r in results] == [(rec[0], len(rec)) for rec in records]


def test_another_user_cannot_take_the_next_segment_names(growing, tmp_path):
    """The other user sees the map's first segment in /dev/shm and creates the names that
    follow it (a counter per new segment, the task id for results, as they were): the map must
    deliver every result, and leave the other user's files alone."""
    path, records = growing
    flag = tmp_path / "planted"
    before = shm_names()
    planted: list = []

    def attacker():
        deadline = time.monotonic() + 60
        mine = f"{parallel.SEGMENT_PREFIX}{os.getpid()}-"
        while time.monotonic() < deadline:
            seen = sorted(shm_names() - before)
            if seen:
                break
            time.sleep(0.002)
        else:
            return
        prefix = seen[0][:len(mine) + 9]  # streamio-map-<pid>-<8 hex>-
        guesses = [f"{prefix}{child}-{kind}{slot}-{n}" for child in range(2)
                   for slot in range(2) for kind in ("", "r") for n in range(48)]
        planted.extend(plant_as_other_user(guesses))
        flag.write_text("go")

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        fn = functools.partial(wait_then_copy, str(flag))
        results = list(Dataset(path, "tfrecord").batch(1).map(fn, num_parallel=2,
                                                              backend="process"))
        thread.join(60)
        assert len(planted) > 100  # the guesses were made while the map ran
        _check(results, records)
        assert_untouched(planted)
        del results
        assert_clean(before | set(planted))  # the map's own segments are all gone
    finally:
        flag.write_text("go")
        thread.join(60)
        remove(planted)


def test_a_taken_name_is_retried_under_a_fresh_random_name(growing, tmp_path, monkeypatch):
    """Force the collision the random names make improbable: the other user creates every
    name just before the map asks for it (input segments and the names children are told to
    give their result segments). Each creation then retries under a fresh name; stopping early
    (results in flight) unlinks only the map's own segments."""
    path, records = growing
    (tmp_path / "go").write_text("go")
    fn = functools.partial(wait_then_copy, str(tmp_path / "go"))
    real = parallel.new_segment_name
    planted: list = []

    def taken_first(stem):
        name = real(stem)
        planted.extend(plant_as_other_user([name]))
        return name

    monkeypatch.setattr(parallel, "new_segment_name", taken_first)
    before = shm_names()
    try:
        results = list(Dataset(path, "tfrecord").batch(1).map(fn, num_parallel=2,
                                                              backend="process"))
        _check(results, records)
        del results
        assert len(planted) >= len(records) + 4  # every task's names, every input segment
        assert_untouched(planted)
        assert_clean(before | set(planted))
        # Stop after two results: tasks in flight, whose result names are the other user's.
        it = iter(Dataset(path, "tfrecord").batch(1).map(fn, num_parallel=2, backend="process"))
        first = [next(it), next(it)]
        it.close()
        _check(first, records[:2])
        assert_untouched(planted)
        del first
        assert_clean(before | set(planted))
    finally:
        remove(planted)


def test_closing_unlinks_a_segment_a_child_created_but_never_sized():
    """A child stopped between creating its result segment and sizing it leaves an empty
    segment: closing the map must unlink it, not fail on it (mapping an empty file is a
    ValueError; seen when a map was closed with tasks in flight on a loaded machine)."""
    import _posixshmem

    from streamio.pipeline.parallel.shm_results import ParentResults

    name = f"{parallel.SEGMENT_PREFIX}{os.getpid()}-empty-{os.urandom(4).hex()}"
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    os.close(fd)
    try:
        ParentResults().close([name])
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")

"""``Dataset.cache(directory)`` in a directory someone else could write: another user (uid 65534,
``setpriv`` inside ``unshare --net``) who made the victim's cache directory first, or a link
there to a folder of theirs, or a directory others may write, is refused with a UsageError
naming it, before any cache file in it is written or served; a fresh directory is made 0700."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

import streamio
from streamio import Dataset
from streamio.errors import UsageError

NOBODY = ["unshare", "--net", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
RECORDS = [b"v1-record-%d" % i for i in range(20)]


def _data() -> bytes:
    return b"".join(streamio.formats.encode_tfrecord(r) for r in RECORDS)


def _as_nobody(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, "sh", "-c", script, "sh", *args], capture_output=True,
                          timeout=60)


@pytest.fixture
def sticky_tmp():
    """A fresh folder like /tmp (world-writable, sticky): both users may make names in it."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("needs Linux and root (to act as uid 65534)")
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("setpriv/unshare not installed")
    try:
        if subprocess.run([*NOBODY, "true"], capture_output=True, timeout=60).returncode:
            pytest.skip("unshare --net / setpriv not permitted here")
    except OSError:
        pytest.skip("unshare --net / setpriv not permitted here")
    base = tempfile.mkdtemp(prefix="streamio-cachedir-", dir="/tmp")
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base)


def _no_cache_files_in(folder: str) -> bool:
    return not any("streamio-cache" in n for n in os.listdir(folder))


def test_a_cache_directory_another_user_made_first_is_refused(sticky_tmp):
    victim = os.path.join(sticky_tmp, "mycache")
    proc = _as_nobody('mkdir "$1" && chmod 777 "$1"', victim)
    assert proc.returncode == 0, proc.stderr
    ds = Dataset(_data(), "tfrecord").cache(victim)
    # The old cache wrote into it without a word (then the owner could swap cache files).
    with pytest.raises(UsageError, match=f"{victim} refused: it belongs to uid 65534"):
        list(ds)
    assert _no_cache_files_in(victim)


def test_a_link_to_another_users_folder_is_refused(sticky_tmp):
    theirs = os.path.join(sticky_tmp, "theirs")
    victim = os.path.join(sticky_tmp, "mycache")
    proc = _as_nobody('mkdir "$1" && chmod 777 "$1" && ln -s "$1" "$2"', theirs, victim)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(UsageError, match=f"{victim} refused: it is a symbolic link"):
        list(Dataset(_data(), "tfrecord").cache(victim))
    assert _no_cache_files_in(theirs)


def test_a_directory_others_may_write_or_that_others_can_replace_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    with pytest.raises(UsageError, match="others may write it"):
        list(Dataset(_data(), "tfrecord").cache(str(open_dir)))
    os.chmod(open_dir, 0o777)  # a world-writable parent without the sticky bit
    with pytest.raises(UsageError, match="others may write its parent .*not sticky"):
        list(Dataset(_data(), "tfrecord").cache(str(open_dir / "inner")))


def test_a_new_cache_directory_is_private_and_serves(tmp_path):
    where = tmp_path / "fresh" / "cache"
    ds = Dataset(_data(), "tfrecord").cache(str(where))
    assert list(ds) == RECORDS
    assert stat.S_IMODE(os.stat(where).st_mode) & 0o077 == 0
    assert list(ds) == RECORDS  # served from the file
    assert not _no_cache_files_in(str(where))

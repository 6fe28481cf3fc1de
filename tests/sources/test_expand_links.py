"""``Dataset("dir/")`` and globs over a folder another user can write: a link that user (uid
65534, ``setpriv`` inside ``unshare --net``) plants, to a file or to a folder, is refused with a
UsageError naming it, where the old expansion read what it points at (root's secret records).
A path the user names is still opened as named, link or not."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

import streamio
from streamio import Dataset
from streamio.errors import UsageError
from support.other_user import as_nobody, require_nobody

SECRET = [b"root-only secret record"]
PUBLIC = [b"public record %d" % i for i in range(3)]


@pytest.fixture
def planted(tmp_path):
    """``shared/`` (world-writable) with ``a.tfrecord`` and ``sub/b.tfrecord``; uid 65534 then
    plants ``shared/zz.tfrecord -> secret.tfrecord`` or ``shared/zz -> private/`` (the folder
    holding root's 0600 ``b.tfrecord``). Returns ``(shared, plant)``."""
    require_nobody("to act as uid 65534")
    private = tmp_path / "private"  # under pytest's 0700 folder: only root gets in
    private.mkdir()
    for name in ("secret.tfrecord", "b.tfrecord"):
        streamio.write_records(str(private / name), "tfrecord", SECRET)
        os.chmod(private / name, 0o600)
    base = tempfile.mkdtemp(prefix="streamio-expand-", dir="/tmp")
    os.chmod(base, 0o755)
    shared = os.path.join(base, "shared")
    os.makedirs(os.path.join(shared, "sub"))
    streamio.write_records(os.path.join(shared, "a.tfrecord"), "tfrecord", PUBLIC)
    streamio.write_records(os.path.join(shared, "sub", "b.tfrecord"), "tfrecord", PUBLIC)
    os.chmod(shared, 0o777)

    def plant(target: str, name: str) -> str:
        link = os.path.join(shared, name)
        proc = as_nobody("ln", "-s", target, link)
        assert proc.returncode == 0, proc.stderr
        return link

    yield shared, plant, private
    shutil.rmtree(base)


def test_a_file_link_in_a_directory_or_glob_is_refused(planted):
    shared, plant, private = planted
    plant(str(private / "secret.tfrecord"), "zz.tfrecord")
    for given in (shared, shared + "/", os.path.join(shared, "*.tfrecord"),
                  os.path.join(shared, "**", "*.tfrecord")):
        # The old expansion read the secret: list(Dataset(given)) held it.
        with pytest.raises(UsageError, match=r"zz\.tfrecord is a symbolic link \(-> .*secret"):
            list(Dataset(given, "tfrecord"))
    # Named by the user, the link is followed: the user vouches for it.
    assert list(Dataset(os.path.join(shared, "zz.tfrecord"), "tfrecord")) == SECRET


def test_a_folder_link_a_glob_wildcard_reaches_is_refused(planted):
    shared, plant, private = planted
    plant(str(private), "zz")
    for pattern in ("*/b.tfrecord", "**/b.tfrecord", "z*/*.tfrecord"):
        with pytest.raises(UsageError, match=r"shared/zz is a symbolic link"):
            list(Dataset(os.path.join(shared, pattern), "tfrecord"))
    # The folder the user names may be a link; so may a literal part of a pattern.
    assert list(Dataset(os.path.join(shared, "zz", "*.tfrecord"), "tfrecord")) == SECRET * 2
    assert list(Dataset(os.path.join(shared, "sub", "*.tfrecord"), "tfrecord")) == PUBLIC

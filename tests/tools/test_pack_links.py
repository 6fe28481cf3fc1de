"""``streamio pack`` of a folder another local user can write: the links that user plants (a
file link, a folder link deep in a class, a class folder that is a link, a manifest entry
through a link, a folder swapped for a link while the pack runs) never bring a file from
outside SRC_DIR into the shards, which others can read. The attacker is uid 65534
(``setpriv``, inside ``unshare --net``); root packs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

import streamio
from streamio.tools.pack import PackResult
from support.other_user import as_nobody, require_nobody

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SECRET = b"TOP-SECRET-0600-root-only-bytes"


@pytest.fixture(scope="module")
def nobody_ok():
    require_nobody("to plant links as uid 65534")


@pytest.fixture
def scene(tmp_path, nobody_ok):
    """``shared/`` (world-writable, classes cat and dog, root's files), root's secret (0600, in
    a folder only root may enter) and an output folder others may read."""
    private = tmp_path / "private"  # under pytest's 0700 folder: only root gets in
    (private / "rootdir").mkdir(parents=True)
    for path in (private / "secret", private / "rootdir" / "secret"):
        path.write_bytes(SECRET)
        os.chmod(path, 0o600)
    base = tempfile.mkdtemp(prefix="streamio-links-", dir="/tmp")
    os.chmod(base, 0o755)
    shared = os.path.join(base, "shared")
    for cls in ("cat", "dog"):
        os.makedirs(os.path.join(shared, cls))
        with open(os.path.join(shared, cls, "1.bin"), "wb") as f:
            f.write(cls.encode() * 10)
    for folder in (shared, os.path.join(shared, "cat"), os.path.join(shared, "dog")):
        os.chmod(folder, 0o777)
    os.mkdir(os.path.join(base, "out"), 0o755)
    yield base, shared, str(private)
    shutil.rmtree(base)


def _plant(*pairs: str) -> None:
    """``ln -s TARGET LINK`` for each pair, as uid 65534."""
    script = "; ".join(f'ln -s "${i}" "${i + 1}" || exit 1' for i in range(1, len(pairs), 2))
    proc = as_nobody("sh", "-c", script, "sh", *pairs)
    assert proc.returncode == 0, proc.stderr


def _pack_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run(["sh", "-c", 'umask 022; exec "$@"', "sh", sys.executable, "-m",
                           "streamio", "pack", *args], capture_output=True, timeout=120,
                          env=env)


def _what_nobody_reads(out: str) -> bytes:
    """Every shard under ``out`` as uid 65534 reads it back."""
    names = sorted(n for n in os.listdir(out) if not n.startswith("."))
    got = b""
    for name in names:
        proc = as_nobody("cat", os.path.join(out, name))
        got += proc.stdout
    return got


CASES = {
    "file link": lambda shared, private: (os.path.join(private, "secret"),
                                          os.path.join(shared, "cat", "2.bin")),
    "folder link in a class": lambda shared, private: (os.path.join(private, "rootdir"),
                                                       os.path.join(shared, "dog", "rootdir")),
    "class folder link": lambda shared, private: (os.path.join(private, "rootdir"),
                                                  os.path.join(shared, "zz_rootclass")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_planted_link_is_refused_by_name_and_nothing_leaks(scene, case):
    base, shared, private = scene
    target, link = CASES[case](shared, private)
    _plant(target, link)
    out = os.path.join(base, "out")
    proc = _pack_cli(shared, os.path.join(out, "folders"))
    # The old pack packed the secret into a 0644 shard and exited 0.
    assert SECRET not in _what_nobody_reads(out)
    assert proc.returncode == 1, proc.stderr
    assert os.path.basename(link).encode() in proc.stderr
    assert b"symbolic link" in proc.stderr and b"--follow-links" in proc.stderr
    assert b"Traceback" not in proc.stderr
    # Asked explicitly, the link is followed (the user vouches for the folder).
    proc = _pack_cli(shared, os.path.join(out, "followed"), "--follow-links")
    assert proc.returncode == 0, proc.stderr
    shards = [os.path.join(out, n) for n in os.listdir(out) if n.startswith("followed-")]
    assert any(SECRET in open(p, "rb").read() for p in shards)


def test_a_manifest_entry_through_a_link_is_refused(scene):
    base, shared, private = scene
    _plant(os.path.join(private, "rootdir"), os.path.join(shared, "dog", "rootdir"))
    manifest = os.path.join(base, "m.csv")
    with open(manifest, "w") as f:
        f.write("path,label\ncat/1.bin,0\ndog/rootdir/secret,1\n")
    out = os.path.join(base, "out")
    proc = _pack_cli("--manifest", manifest, shared, os.path.join(out, "m"))
    assert SECRET not in _what_nobody_reads(out)
    assert proc.returncode == 1, proc.stderr
    assert b"dog/rootdir is a symbolic link" in proc.stderr
    # on_error="skip" does not turn a refused link into a skipped file.
    with pytest.raises(streamio.UsageError, match="rootdir is a symbolic link"):
        streamio.pack(shared, os.path.join(out, "m2"), manifest=manifest, on_error="skip")
    result = streamio.pack(shared, os.path.join(out, "m3"), manifest=manifest,
                           follow_links=True)
    assert result.files == 2


@pytest.mark.parametrize("opener", ["openat2", "per component"])
def test_a_folder_swapped_for_a_link_during_the_pack_is_not_followed(tmp_path, monkeypatch,
                                                                     opener):
    """The walk saw a real folder ``bb``; while the pack waits on an earlier file (a FIFO
    whose writer is late), ``bb`` becomes a link to a folder holding the secret under the same
    name. The open goes component by component with O_NOFOLLOW, so it fails and the file is
    reported; the old pack opened the path and packed the secret. Both ways of opening: the
    kernel's openat2 where it has it, one O_NOFOLLOW openat per component elsewhere."""
    from streamio.sources import local_tree

    if opener == "openat2" and local_tree.OPENAT2 is None:
        pytest.skip("this kernel (or its seccomp filter) has no openat2")
    if opener == "per component":
        monkeypatch.setattr(local_tree, "OPENAT2", None)
    tree = tmp_path / "tree"
    (tree / "aa").mkdir(parents=True)
    (tree / "bb").mkdir()
    (tree / "bb" / "y.bin").write_bytes(b"plain bytes")
    os.mkfifo(tree / "aa" / "x.bin")
    (tmp_path / "secretdir").mkdir()
    (tmp_path / "secretdir" / "y.bin").write_bytes(SECRET)
    out = tmp_path / "out" / "s"
    result: dict = {}

    def run():
        try:
            result["value"] = streamio.pack(str(tree), str(out), jobs=1, on_error="skip")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["value"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    writer = os.open(tree / "aa" / "x.bin", os.O_WRONLY)  # returns once the pack reads it
    os.rename(tree / "bb", tmp_path / "bb.old")
    os.symlink(tmp_path / "secretdir", tree / "bb")
    os.write(writer, b"fifo bytes")
    os.close(writer)
    thread.join(60)
    assert not thread.is_alive()
    packed = result["value"]
    assert isinstance(packed, PackResult), packed
    assert [os.path.basename(p) for p, _ in packed.skipped] == ["y.bin"]
    data = b"".join(open(p, "rb").read() for p in packed.shards)
    assert SECRET not in data and b"fifo bytes" in data

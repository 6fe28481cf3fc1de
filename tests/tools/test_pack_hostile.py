"""streamio pack against what users and other local users leave lying around: manifests that
point outside the tree, an earlier run under the same prefix, planted symlinks at temporary
names, file names that are not UTF-8, and images that will not decode."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

import streamio
from streamio import Dataset, Example, FixedLen
from streamio.errors import UsageError
from streamio.tools.pack import PackError

from test_pack import EXAMPLE, _image_tree, _read_examples

PIL = pytest.importorskip("PIL.Image")


def _png(seed=0, size=(20, 24)):
    pixels = np.random.default_rng(seed).integers(0, 255, size=(*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PIL.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "streamio", "pack", *map(str, args)],
                          capture_output=True, timeout=120)


def test_manifest_entries_outside_src_are_refused_unless_allowed(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=2)
    secret = tmp_path / "secret.png"  # beside the tree, not in it
    secret.write_bytes(_png(1))
    inside = sorted(files)
    for entry in (str(secret), os.path.join("..", "secret.png"),
                  os.path.join("cat", "..", "..", "secret.png")):
        manifest = tmp_path / "m.csv"
        manifest.write_text("path,label\n" + "".join(f"{n},0\n" for n in inside)
                            + f"{entry},1\n")
        out = tmp_path / "o" / "s"
        with pytest.raises(UsageError, match=f"line {len(inside) + 2}: .*outside|leaves"):
            streamio.pack(str(tmp_path / "tree"), str(out), manifest=str(manifest))
        assert not out.parent.exists() or not os.listdir(out.parent)  # nothing packed
        proc = _run_cli(tmp_path / "tree", tmp_path / "c" / "s", "--manifest", manifest)
        assert proc.returncode == 1 and b"SRC_DIR" in proc.stderr
        assert b"Traceback" not in proc.stderr
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "ok" / "s"),
                           manifest=str(manifest), allow_outside_src=True)
    assert result.files == len(inside) + 1
    proc = _run_cli(tmp_path / "tree", tmp_path / "ok2" / "s", "--manifest", manifest,
                    "--allow-outside-src")
    assert proc.returncode == 0, proc.stderr


def test_a_second_run_into_the_same_prefix_is_refused_or_replaces_everything(tmp_path):
    first = _image_tree(tmp_path / "a", per_class=30, seed=1)
    out = tmp_path / "out" / "train"
    one = streamio.pack(str(tmp_path / "a"), str(out), shard_size=40_000, index=True)
    assert len(one.shards) >= 4
    # Another tree: other labels, fewer shards (so replacing must remove the extra ones).
    (tmp_path / "b" / "zebra").mkdir(parents=True)
    for i in range(5):
        (tmp_path / "b" / "zebra" / f"z{i}.png").write_bytes(_png(i))
    before = {n: os.path.getmtime(out.parent / n) for n in os.listdir(out.parent)}
    with pytest.raises(PackError, match=r"train-00000\.tfrecord.*mix") as info:
        streamio.pack(str(tmp_path / "b"), str(out), shard_size=40_000)
    assert "--replace" in str(info.value)
    assert {n: os.path.getmtime(out.parent / n) for n in os.listdir(out.parent)} == before
    assert _read_examples(str(out) + "-*.tfrecord") == first  # untouched
    proc = _run_cli(tmp_path / "b", out, "--shard-size", "40KB")
    assert proc.returncode == 1 and b"earlier, different run" in proc.stderr
    # The same plan again is a resume (every shard is already there), not a mix.
    again = streamio.pack(str(tmp_path / "a"), str(out), shard_size=40_000, index=True)
    assert again.resumed_shards == len(one.shards)
    proc = _run_cli(tmp_path / "b", out, "--shard-size", "40KB", "--replace")
    assert proc.returncode == 0, proc.stderr
    left = sorted(n for n in os.listdir(out.parent) if not n.startswith("."))
    assert left == ["train-00000.tfrecord"]  # every old shard and index is gone
    got = _read_examples(str(out) + "-*.tfrecord")
    assert sorted(got) == [os.path.join("zebra", f"z{i}.png") for i in range(5)]


def test_planted_symlinks_at_temporary_names_are_not_followed(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=3)
    out = tmp_path / "out"
    out.mkdir()
    victims = []
    # Where the old code wrote its temporary files: the shard's and its index's name + .tmp.
    for name in ("train-00000.tfrecord.tmp", "train-00000.tfrecord.index.tmp"):
        victim = tmp_path / f"victim-{name}"
        victim.write_bytes(b"precious")
        os.symlink(victim, out / name)
        victims.append(victim)
    result = streamio.pack(str(tmp_path / "tree"), str(out / "train"), index=True)
    assert [v.read_bytes() for v in victims] == [b"precious", b"precious"]
    for path in (result.shards[0], result.shards[0] + ".index"):
        assert os.path.isfile(path) and not os.path.islink(path)
    assert oct(os.stat(result.shards[0]).st_mode & 0o777) == oct(0o666 & ~_umask())
    assert _read_examples(result.shards[0]) == files


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_file_names_that_are_not_utf8_are_packed_under_their_own_bytes(tmp_path):
    tree = os.fsencode(tmp_path / "tree")
    folder = os.path.join(tree, b"caf\xe9")  # Latin-1 class folder
    os.makedirs(folder)
    names = [b"img\xff.png", b"plain.png"]
    for i, name in enumerate(names):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(_png(i))
    proc = _run_cli(tmp_path / "tree", tmp_path / "o" / "s")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    assert b"0=caf\\xe9" in proc.stdout  # shown, escaped, on any terminal
    got = sorted(name for b in Dataset(str(tmp_path / "o" / "s-*.tfrecord"), "tfrecord",
                                       decoder=EXAMPLE).batch(10)
                 for name in b["filename"])
    assert got == sorted(b"caf\xe9/" + n for n in names)
    # The same names through a manifest (its bytes are not UTF-8 either).
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(b"".join(b"caf\xe9/" + n + b",1\n" for n in names))
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "m" / "s"),
                           manifest=str(manifest))
    assert result.files == 2


def test_images_that_will_not_decode_are_caught_when_packed(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=3)
    good_jpg = next(data for name, (data, _) in files.items() if name.endswith(".jpg"))
    good_png = next(data for name, (data, _) in files.items() if name.endswith(".png"))
    bad = {"cut.jpg": good_jpg[:len(good_jpg) // 2], "cut.png": good_png[:-20],
           "text.jpg": b"this is not an image", "empty.png": b"",
           "flipped.png": good_png[:60] + bytes([good_png[60] ^ 0xFF]) + good_png[61:]}
    for name, data in bad.items():
        (tmp_path / "tree" / "dog" / name).write_bytes(data)
    with pytest.raises(PackError, match="bad image") as info:
        streamio.pack(str(tmp_path / "tree"), str(tmp_path / "a" / "s"))
    assert os.path.basename(info.value.path) in bad
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "b" / "s"), on_error="skip")
    assert sorted(os.path.basename(p) for p, _ in result.skipped) == sorted(bad)
    # Every image that was packed decodes.
    decoder = Example({"image/encoded": streamio.Image(size=8),
                       "label": FixedLen([], "int64")})
    n = sum(len(b["label"]) for b in Dataset(result.shards, "tfrecord",
                                             decoder=decoder).batch(64))
    assert n == len(files)
    rec = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "r" / "s"), format="recordio",
                        on_error="skip")
    assert len(rec.skipped) == len(bad)


def test_streamio_index_does_not_follow_a_planted_temporary_name(tmp_path):
    shard = tmp_path / "a.tfrecord"
    streamio.write_records(str(shard), "tfrecord", [b"x" * i for i in range(1, 4)])
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "a.tfrecord.index.tmp")  # the old code's temporary name
    proc = subprocess.run([sys.executable, "-m", "streamio", "index", str(shard)],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_bytes() == b"precious"
    index = tmp_path / "a.tfrecord.index"
    assert not index.is_symlink() and index.read_text() == "0 17\n17 18\n35 19\n"

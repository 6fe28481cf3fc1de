"""streamio pack: an ImageFolder tree into shards, read back exactly once, byte-identical."""

from __future__ import annotations

import io
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import streamio
from streamio import Dataset, Example, FixedLen
from streamio.tools.pack import PackError

PIL = pytest.importorskip("PIL.Image")
CLASSES = ["cat", "dog", "emu", "yak"]


def _image_tree(root, per_class=60, seed=0):
    """A few hundred small JPEG and PNG files in class folders (one nested subfolder too)."""
    rng = np.random.default_rng(seed)
    files = {}
    for c, name in enumerate(CLASSES):
        for i in range(per_class):
            folder = root / name / ("sub" if i % 10 == 9 else "")
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 255, size=(24 + i % 7, 32, 3), dtype=np.uint8)
            buf = io.BytesIO()
            fmt = "PNG" if i % 3 == 0 else "JPEG"
            PIL.fromarray(pixels).save(buf, format=fmt)
            path = folder / f"{name}_{i:03d}.{fmt.lower().replace('jpeg', 'jpg')}"
            path.write_bytes(buf.getvalue())
            files[os.path.relpath(path, root)] = (buf.getvalue(), c)
    return files


EXAMPLE = Example({"image/encoded": FixedLen([], "bytes"), "label": FixedLen([], "int64"),
                   "filename": FixedLen([], "bytes")})


def _read_examples(pattern):
    got = {}
    for batch in Dataset(pattern, "tfrecord", decoder=EXAMPLE).batch(64):
        for data, label, name in zip(batch["image/encoded"], batch["label"], batch["filename"]):
            key = name.decode()
            assert key not in got, f"{key} packed twice"
            got[key] = (data, int(label))
    return got


def test_pack_tfrecord_round_trips_every_file_once(tmp_path):
    files = _image_tree(tmp_path / "tree")
    shard_size = 60_000
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "out" / "train"),
                           shard_size=shard_size, jobs=4, index=True)
    assert result.files == len(files) == 240
    assert result.classes == CLASSES and not result.skipped
    assert _read_examples(str(tmp_path / "out" / "train-*.tfrecord")) == files
    sizes = [os.path.getsize(p) for p in result.shards]
    assert len(sizes) > 3
    # Every shard but the last is about the target size (planned from file sizes).
    assert all(0.5 * shard_size <= s <= 1.5 * shard_size for s in sizes[:-1]), sizes
    assert 0 < sizes[-1] <= 1.5 * shard_size
    # The index gives each record's frame: offset and length, DALI / tfrecord-package style.
    shard = result.shards[0]
    blob = open(shard, "rb").read()
    entries = [tuple(map(int, line.split())) for line in open(shard + ".index")]
    assert entries[0][0] == 0 and sum(n for _, n in entries) == len(blob)
    for offset, length in entries:
        [record] = list(streamio.read_records(blob[offset:offset + length], "tfrecord"))
        assert record  # one whole, CRC-checked record per entry


def test_pack_recordio_im2rec_layout_and_gzip(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=20)
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "rec" / "train"),
                           format="recordio", shard_size=50_000, index=True)
    got = {}  # id -> (image bytes, label)
    for shard in result.shards:
        assert shard.endswith(".rec")
        offsets = [int(line.split("\t")[1]) for line in open(shard[:-4] + ".rec.idx")]
        blob = open(shard, "rb").read()
        records = list(streamio.read_records(shard, "recordio"))
        assert len(offsets) == len(records)
        for offset, record in zip(offsets, records):
            assert blob[offset:offset + 4] == struct.pack("<I", 0xCED7230A)
            flag, label, rid, rid2 = struct.unpack_from("<IfQQ", record)
            assert flag == 0 and rid2 == 0
            assert rid not in got
            got[rid] = (record[24:], int(label))
    assert sorted(got) == list(range(len(files)))
    assert sorted(got.values()) == sorted(files.values())
    gz = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "gz" / "train"),
                       compression="gzip", shard_size=50_000)
    assert all(p.endswith(".tfrecord.gz") for p in gz.shards)
    assert _read_examples(str(tmp_path / "gz" / "train-*.tfrecord.gz")) == files


def test_shuffled_pack_is_reproducible_and_complete(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=15)
    orders = []
    for run in range(2):
        out = tmp_path / f"out{run}" / "s"
        streamio.pack(str(tmp_path / "tree"), str(out), shuffle=True, seed=5, shard_size=10**9)
        names = [b.decode() for batch in Dataset(str(out) + "-*.tfrecord", "tfrecord",
                                                 decoder=EXAMPLE).batch(1000)
                 for b in batch["filename"]]
        orders.append(names)
    assert orders[0] == orders[1] and sorted(orders[0]) == sorted(files)
    assert orders[0] != sorted(orders[0])
    with pytest.raises(streamio.UsageError, match="seed"):
        streamio.pack(str(tmp_path / "tree"), str(tmp_path / "x"), shuffle=True)


def test_unreadable_files_are_reported_never_dropped_silently(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=5)
    # Root reads any file, so make one that fails for real: a read of /proc/self/mem at 0.
    # (Links are refused unless followed: test_pack_hostile.py; here they are followed.)
    os.symlink("/proc/self/mem", tmp_path / "tree" / "cat" / "broken.jpg")
    with pytest.raises(PackError, match="cannot read.*broken.jpg") as info:  # at read time
        streamio.pack(str(tmp_path / "tree"), str(tmp_path / "a" / "s"), follow_links=True)
    assert info.value.path.endswith("broken.jpg")
    # The shard being written was removed (the hidden plan record stays: it names no shard).
    assert os.listdir(tmp_path / "a") == [".s.streamio-pack.json"]
    os.symlink(tmp_path / "missing.png", tmp_path / "tree" / "dog" / "dangling.png")
    with pytest.raises(PackError, match="dangling.png"):  # found while planning
        streamio.pack(str(tmp_path / "tree"), str(tmp_path / "a" / "s"), follow_links=True)
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "b" / "s"), on_error="skip",
                           follow_links=True)
    assert sorted(os.path.basename(p) for p, _ in result.skipped) == ["broken.jpg",
                                                                      "dangling.png"]
    assert _read_examples(str(tmp_path / "b" / "s-*.tfrecord")) == files


def test_interrupted_pack_leaves_whole_shards_and_resumes(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=40)
    # A FIFO late in the tree blocks the pack there (no writer) after the first shards are
    # whole: Ctrl-C then arrives mid-shard, deterministically.
    fifo = tmp_path / "tree" / "yak" / "zz_slow.png"
    os.mkfifo(fifo)
    out = tmp_path / "out" / "train"
    cmd = [sys.executable, "-m", "streamio", "pack", str(tmp_path / "tree"), str(out),
           "--shard-size", "40KB", "--jobs", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Wait until the pack blocks on the FIFO: a shard in progress (.tmp) stops growing.
        deadline = time.monotonic() + 60
        last, still_since = None, None
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline
            tmps = [p for p in os.listdir(out.parent)] if out.parent.exists() else []
            tmps = [p for p in tmps if p.endswith(".tmp")]
            state = (tmps, [os.path.getsize(out.parent / p) for p in tmps]) if tmps else None
            if state is not None and state == last:
                if time.monotonic() - still_since > 0.5:
                    break
            else:
                last, still_since = state, time.monotonic()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    left = sorted(os.listdir(out.parent))
    assert not [p for p in left if p.endswith(".tmp")], left  # only whole shards remain
    whole = [p for p in left if p.endswith(".tfrecord")]
    assert whole
    before = {p: os.path.getmtime(out.parent / p) for p in whole}
    os.unlink(fifo)
    result = streamio.pack(str(tmp_path / "tree"), str(out), shard_size=40 << 10, jobs=1)
    assert result.resumed_shards == len(whole)
    assert all(os.path.getmtime(out.parent / p) == t for p, t in before.items())  # kept as is
    assert _read_examples(str(out) + "-*.tfrecord") == files


def test_cli_prints_a_summary_with_a_working_dataset_line(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=8)
    proc = subprocess.run([sys.executable, "-m", "streamio", "pack", str(tmp_path / "tree"),
                           str(tmp_path / "o" / "t"), "--shard-size", "30KB"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"packed {len(files)} files into" in proc.stdout
    assert "classes: 0=cat, 1=dog, 2=emu, 3=yak" in proc.stdout
    line = proc.stdout.split("read them with: ")[1].strip()
    ds = eval(line, {"Dataset": Dataset, "Example": Example, "FixedLen": FixedLen})
    assert sum(len(b["label"]) for b in ds.batch(50)) == len(files)
    bad = subprocess.run([sys.executable, "-m", "streamio", "pack", str(tmp_path / "nope"),
                          str(tmp_path / "o2" / "t")], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "not a directory" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_manifest_labels(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=3)
    manifest = tmp_path / "m.csv"
    names = sorted(files)
    manifest.write_text("path,label\n" + "".join(f"{n},{n.split(os.sep)[0]}\n" for n in names))
    result = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "m" / "s"),
                           manifest=str(manifest))
    assert result.classes == CLASSES
    assert _read_examples(str(tmp_path / "m" / "s-*.tfrecord")) == files


def test_shards_feed_the_image_decoders(tmp_path):
    files = _image_tree(tmp_path / "tree", per_class=4)
    rec = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "rec" / "s"), format="recordio")
    tfr = streamio.pack(str(tmp_path / "tree"), str(tmp_path / "tfr" / "s"))
    want = sorted(int(label) for _, label in files.values())
    batch = next(iter(Dataset(rec.shards, "recordio",
                              decoder=streamio.ImageRecord(size=16)).batch(100)))
    assert batch["image"].shape == (len(files), 16, 16, 3)
    assert sorted(batch["label"].astype(int).tolist()) == want
    decoder = Example({"image/encoded": streamio.Image(size=16),
                       "label": FixedLen([], "int64")})
    batch = next(iter(Dataset(tfr.shards, "tfrecord", decoder=decoder).batch(100)))
    assert batch["image/encoded"].shape == (len(files), 16, 16, 3)
    assert sorted(batch["label"].tolist()) == want

"""SageMaker channels: the container config, every input mode through the local emulator (real
FIFOs fed by another process), RecordIO wrapping, augmented manifests, and host/rank splits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamio
from streamio import sagemaker
from streamio.errors import CorruptRecordError, StreamioError, TruncatedStreamError, UsageError
from streamio.sagemaker.config import ConfigError
from streamio.sagemaker.emulator import _wrap
from streamio.sagemaker.wrapping import RecordIOUnwrapper


# -- helpers ----------------------------------------------------------------------------------
def _tfrecord_objects(folder, n_files=3, per_file=7):
    os.makedirs(folder, exist_ok=True)
    expected = []
    for f in range(n_files):
        records = [f"file{f}-record{i}".encode() * (1 + i % 3) for i in range(per_file)]
        streamio.write_records(os.path.join(folder, f"part-{f}.tfrecord"), "tfrecord", records)
        expected.extend(records)
    return expected


def _csv_objects(folder, trailing_newline=False):
    """Label-first CSV files, the last without a final newline (rows must not run together)."""
    os.makedirs(folder, exist_ok=True)
    rows = []
    for f in range(3):
        lines = [f"{(f + i) % 2},{f}.5,{i}.25" for i in range(4)]
        text = "\n".join(lines) + ("\n" if trailing_newline or f < 2 else "")
        with open(os.path.join(folder, f"part-{f}.csv"), "w") as fh:
            fh.write(text)
        rows.extend(lines)
    return rows


def _emulate(root, *args, epochs=1, wait=True):
    cmd = [sys.executable, "-m", "streamio", "sagemaker-local", "--root", str(root),
           "--epochs", str(epochs), "--open-timeout", "60", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if wait:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    return proc


def _finish(proc):
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()


def _wait_for_config(root, proc):
    """A container has its config before the script starts: wait for the emulator's."""
    path = os.path.join(root, "input", "config", "inputdataconfig.json")
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()[1].decode()
        assert time.monotonic() < deadline, "the emulator wrote no config"
        time.sleep(0.01)


def _pipe_epochs(root, args, epochs, read):
    """Run the emulator in Pipe mode in another process and ``read(epoch)`` each epoch."""
    proc = _emulate(root, "--mode", "Pipe", *args, epochs=epochs, wait=False)
    try:
        _wait_for_config(root, proc)
        results = [read(e) for e in range(epochs)]
    except BaseException:
        proc.kill()
        raise
    _finish(proc)
    return results


# -- configuration ------------------------------------------------------------------------------
def _write_config(root, data, resource=None):
    cfg = root / "input" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "inputdataconfig.json").write_text(json.dumps(data))
    if resource is not None:
        (cfg / "resourceconfig.json").write_text(json.dumps(resource))


def test_channels_read_from_the_config_file_with_defaults(tmp_path):
    _write_config(tmp_path, {
        "train": {"TrainingInputMode": "Pipe", "ContentType": "text/csv",
                  "S3DistributionType": "ShardedByS3Key", "RecordWrapperType": "RecordIO",
                  "CompressionType": "Gzip", "ShuffleConfig": {"Seed": 7}},
        "validation": {}})
    configs = sagemaker.channels(root=tmp_path)
    train, val = configs["train"], configs["validation"]
    assert (train.input_mode, train.content_type, train.distribution, train.record_wrapper,
            train.compression, train.shuffle_seed) == (
        "Pipe", "text/csv", "ShardedByS3Key", "RecordIO", "Gzip", 7)
    assert train.data_path == str(tmp_path / "input" / "data" / "train")
    assert (val.input_mode, val.distribution, val.record_wrapper, val.compression) == (
        "File", "FullyReplicated", "None", "None")
    assert sagemaker.resources(root=tmp_path).num_hosts == 1  # no resourceconfig: one host


def test_toolkit_variables_are_read_where_set(tmp_path):
    data_dir = tmp_path / "elsewhere"
    env = {"SM_INPUT_DATA_CONFIG": json.dumps({"train": {"TrainingInputMode": "File"}}),
           "SM_CHANNEL_TRAIN": str(data_dir), "SM_HOSTS": '["algo-1", "algo-2"]',
           "SM_CURRENT_HOST": "algo-2"}
    configs = sagemaker.channels(env=env)
    assert configs["train"].data_path == str(data_dir)
    hosts = sagemaker.resources(env=env)
    assert (hosts.host_index, hosts.num_hosts) == (1, 2)


@pytest.mark.parametrize("data, key", [
    ({"train": {"TrainingInputMode": "Stream"}}, "TrainingInputMode"),
    ({"train": {"S3DistributionType": "Sharded"}}, "S3DistributionType"),
    ({"train": {"RecordWrapperType": "Protobuf"}}, "RecordWrapperType"),
    ({"train": {"CompressionType": "Bzip2"}}, "CompressionType"),
    ({"train": {"ShuffleConfig": {"Seed": "x"}}}, "ShuffleConfig"),
    ({"train": {"AttributeNames": []}}, "AttributeNames"),
    ({"train": "File"}, "train"),
])
def test_bad_config_names_the_file_and_the_key(tmp_path, data, key):
    _write_config(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        sagemaker.channels(root=tmp_path)
    assert info.value.key == key
    assert "inputdataconfig.json" in str(info.value) and repr(key) in str(info.value)
    assert isinstance(info.value, StreamioError) and isinstance(info.value, UsageError)


def test_missing_or_broken_config_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found.*inputdataconfig.json"):
        sagemaker.channel("train", root=tmp_path)
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "inputdataconfig.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not valid JSON"):
        sagemaker.channels(root=tmp_path)
    _write_config(tmp_path, {"train": {}}, {"current_host": "algo-3", "hosts": ["algo-1"]})
    with pytest.raises(ConfigError, match="current_host") as info:
        sagemaker.resources(root=tmp_path)
    assert info.value.key == "current_host"


def test_unknown_channel_content_type_and_missing_directory(tmp_path):
    _write_config(tmp_path, {"train": {"ContentType": "text/libsvm"}, "test": {}})
    with pytest.raises(ConfigError, match="no channel 'valid'.*channels: test, train"):
        sagemaker.channel("valid", root=tmp_path)
    with pytest.raises(ConfigError, match="text/libsvm.*format=") as info:
        sagemaker.channel("train", root=tmp_path)
    assert info.value.key == "ContentType"
    with pytest.raises(ConfigError, match="no directory"):
        sagemaker.channel("test", format="csv", root=tmp_path)


# -- the same script in every mode -----------------------------------------------------------
def _read_epoch(root, name="train", **kwargs):
    return list(sagemaker.channel(name, root=root, **kwargs))


def test_file_fastfile_and_pipe_mode_give_the_same_records(tmp_path):
    expected = _tfrecord_objects(tmp_path / "objects")
    seen = {}
    for mode in ("File", "FastFile"):
        root = tmp_path / mode
        _emulate(root, "--channel", f"train={tmp_path / 'objects'}", "--mode", mode)
        assert sagemaker.channels(root=root)["train"].content_type == "application/x-tfrecord"
        seen[mode] = _read_epoch(root)
    root = tmp_path / "Pipe"
    ds = None

    def read(epoch):
        nonlocal ds
        if ds is None:
            ds = sagemaker.channel("train", root=root)
        return list(ds)  # each iter() is the next epoch's FIFO

    seen["Pipe"] = _pipe_epochs(root, ["--channel", f"train={tmp_path / 'objects'}"], 2, read)
    assert seen["File"] == seen["FastFile"] == expected
    assert seen["Pipe"] == [expected, expected]


def test_csv_channel_uses_sagemakers_label_first_convention(tmp_path):
    rows = _csv_objects(tmp_path / "objects")
    expected = np.array([[float(x) for x in r.split(",")] for r in rows], dtype=np.float32)
    root = tmp_path / "file"
    _emulate(root, "--channel", f"train={tmp_path / 'objects'}")
    batch = next(iter(sagemaker.channel("train", root=root).batch(100)))
    np.testing.assert_array_equal(batch["label"], expected[:, 0])
    np.testing.assert_array_equal(batch["features"], expected[:, 1:])
    # Explicit arguments win over the ContentType's defaults.
    raw = next(iter(sagemaker.channel("train", decoder=None, root=root).batch(100)))
    assert [r.decode() for r in raw] == rows


@pytest.mark.parametrize("wrapper", ["None", "RecordIO"])
def test_pipe_mode_gzip_channels(tmp_path, wrapper):
    expected = _tfrecord_objects(tmp_path / "objects")
    root = tmp_path / "root"
    args = ["--channel", f"train={tmp_path / 'objects'}", "--gzip", "--record-wrapper", wrapper]
    [records] = _pipe_epochs(root, args, 1, lambda e: _read_epoch(root))
    assert sagemaker.channels(root=root)["train"].compression == "Gzip"
    assert records == expected


def test_file_mode_gzip_files_are_read_by_name(tmp_path):
    expected = _tfrecord_objects(tmp_path / "objects")
    root = tmp_path / "root"
    _emulate(root, "--channel", f"train={tmp_path / 'objects'}", "--gzip")
    names = sorted(os.listdir(root / "input" / "data" / "train"))
    assert names == ["part-0.tfrecord.gz", "part-1.tfrecord.gz", "part-2.tfrecord.gz"]
    assert _read_epoch(root) == expected


def test_recordio_wrapped_csv_objects_keep_rows_apart(tmp_path):
    rows = _csv_objects(tmp_path / "objects")  # the last object has no final newline
    file_root, pipe_root = tmp_path / "file", tmp_path / "pipe"
    _emulate(file_root, "--channel", f"train={tmp_path / 'objects'}")
    args = ["--channel", f"train={tmp_path / 'objects'}", "--record-wrapper", "RecordIO"]
    [piped] = _pipe_epochs(pipe_root, args, 1,
                           lambda e: _read_epoch(pipe_root, decoder=None))
    assert [r.decode() for r in piped] == rows
    assert _read_epoch(file_root, decoder=None) == piped


def test_shuffle_config_reorders_objects_each_epoch(tmp_path):
    expected = _tfrecord_objects(tmp_path / "objects", n_files=6, per_file=3)
    root = tmp_path / "root"
    holder = {}

    def read(epoch):
        if "ds" not in holder:
            holder["ds"] = sagemaker.channel("train", root=root)
        return list(holder["ds"])

    args = ["--channel", f"train={tmp_path / 'objects'}", "--shuffle-seed", "3"]
    epochs = _pipe_epochs(root, args, 3, read)
    for records in epochs:
        assert sorted(records) == sorted(expected)
    assert len({tuple(r) for r in epochs}) > 1  # the order changes between epochs
    assert sagemaker.channels(root=root)["train"].shuffle_seed == 3


# -- augmented manifests --------------------------------------------------------------------------
def _manifest(tmp_path, n=5):
    images = []
    lines = []
    for i in range(n):
        payload = bytes([i]) * (100 + 37 * i) + b"\x89PNG-ish"
        (tmp_path / f"img{i}.bin").write_bytes(payload)
        images.append(payload)
        lines.append(json.dumps({"source-ref": f"img{i}.bin", "class": str(i % 3),
                                 "meta": {"w": i}}))
    manifest = tmp_path / "train.manifest"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest, images


def test_augmented_manifest_regroups_attributes_per_line(tmp_path):
    manifest, images = _manifest(tmp_path)
    root = tmp_path / "root"
    args = ["--manifest", f"train={manifest}", "--attributes", "source-ref,class,meta",
            "--record-wrapper", "RecordIO"]

    def read(epoch):
        how = {"source-ref": None, "class": "int64", "meta": "json"}
        ds = sagemaker.channel("train", root=root, decoder=sagemaker.AugmentedManifest(how))
        return list(ds.batch(2))

    [batches] = _pipe_epochs(root, args, 1, read)
    assert [len(b["class"]) for b in batches] == [2, 2, 1]
    got_images = [img for b in batches for img in b["source-ref"]]
    assert got_images == images
    labels = np.concatenate([b["class"] for b in batches])
    assert labels.dtype == np.int64 and labels.tolist() == [i % 3 for i in range(5)]
    assert [m for b in batches for m in b["meta"]] == [{"w": i} for i in range(5)]
    assert sagemaker.channels(root=root)["train"].attribute_names == ("source-ref", "class",
                                                                      "meta")


def test_augmented_manifest_iterated_directly_yields_attribute_dicts(tmp_path):
    """Without batch(), the channel's decoder decodes each line: {attribute: value}, not the
    regrouped record's bytes."""
    manifest, images = _manifest(tmp_path)
    root = tmp_path / "root"
    args = ["--manifest", f"train={manifest}", "--attributes", "source-ref,class,meta",
            "--record-wrapper", "RecordIO"]

    def read_plain(epoch):  # the channel's default decoder: AugmentedManifest(its names)
        return list(sagemaker.channel("train", root=root))

    def read_typed(epoch):
        how = {"source-ref": None, "class": "int64", "meta": "json"}
        return list(sagemaker.channel("train", root=root,
                                      decoder=sagemaker.AugmentedManifest(how)))

    [plain] = _pipe_epochs(root, args, 1, read_plain)
    [typed] = _pipe_epochs(root, args, 1, read_typed)
    assert plain == [{"source-ref": images[i], "class": str(i % 3).encode(),
                      "meta": json.dumps({"w": i}, separators=(",", ":")).encode()}
                     for i in range(5)]
    assert [item["source-ref"] for item in typed] == images
    assert [int(item["class"]) for item in typed] == [i % 3 for i in range(5)]
    assert [item["meta"] for item in typed] == [{"w": i} for i in range(5)]


def test_manifest_cut_short_and_unwrapped_manifest_are_errors(tmp_path):
    manifest, _ = _manifest(tmp_path, n=2)
    root = tmp_path / "root"
    # Two attributes named to the emulator, three to the reader: the stream ends mid-line.
    args = ["--manifest", f"train={manifest}", "--attributes", "source-ref,class",
            "--record-wrapper", "RecordIO"]

    def read(epoch):
        ds = sagemaker.channel("train", root=root, attribute_names=["a", "b", "c"],
                               decoder=None)
        got = []
        with pytest.raises(TruncatedStreamError, match="1 of 3 attribute") as info:
            for record in ds:
                got.append(record)
        assert len(got) == 1  # the whole line before the fault is delivered
        assert "train_0" in str(info.value)
        return got

    _pipe_epochs(root, args, 1, read)
    _write_config(tmp_path / "plain", {"train": {"TrainingInputMode": "Pipe",
                                                 "AttributeNames": ["a", "b"]}})
    with pytest.raises(ConfigError, match="RecordWrapperType RecordIO"):
        sagemaker.channel("train", root=tmp_path / "plain")


# -- splits over hosts and local ranks ----------------------------------------------------------
@pytest.mark.parametrize("distribution", ["FullyReplicated", "ShardedByS3Key"])
def test_two_hosts_two_local_ranks_read_every_record_once(tmp_path, distribution):
    pytest.importorskip("torch")
    expected = _tfrecord_objects(tmp_path / "objects", n_files=8, per_file=5)
    seen = []
    for host in range(2):
        root = tmp_path / f"host{host}"
        _emulate(root, "--channel", f"train={tmp_path / 'objects'}", "--distribution",
                 distribution, "--hosts", "2", "--host-index", str(host))
        files = os.listdir(root / "input" / "data" / "train")
        assert len(files) == (8 if distribution == "FullyReplicated" else 4)
        for local_rank in range(2):
            torch_ds = sagemaker.channel("train", root=root).to_torch(rank=local_rank,
                                                                       world_size=2)
            seen.extend(bytes(r) for r in torch_ds)
    assert sorted(seen) == sorted(expected)


def test_to_torch_takes_the_local_rank_from_torchrun(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    expected = _tfrecord_objects(tmp_path / "objects", n_files=4, per_file=3)
    root = tmp_path / "root"
    _emulate(root, "--channel", f"train={tmp_path / 'objects'}")
    seen = []
    for local_rank in range(2):
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        torch_ds = sagemaker.channel("train", root=root).shuffle(4, seed=1).to_torch()
        assert (torch_ds.rank, torch_ds.world_size) == (local_rank, 2)
        part = [bytes(r) for r in torch_ds]
        assert 0 < len(part) < len(expected)
        seen.extend(part)
    assert sorted(seen) == sorted(expected)


def test_pipe_mode_fully_replicated_over_two_hosts(tmp_path):
    expected = _tfrecord_objects(tmp_path / "objects", n_files=3, per_file=9)
    procs, roots = [], []
    for host in range(2):
        root = tmp_path / f"host{host}"
        roots.append(root)
        procs.append(_emulate(root, "--mode", "Pipe", "--channel",
                              f"train={tmp_path / 'objects'}", "--hosts", "2",
                              "--host-index", str(host), wait=False))
    try:
        for root, proc in zip(roots, procs):
            _wait_for_config(root, proc)
        shares = [_read_epoch(root) for root in roots]
    finally:
        for p in procs:
            _finish(p)
    assert all(0 < len(s) < len(expected) for s in shares)
    assert sorted(shares[0] + shares[1]) == sorted(expected)


# -- the wrapping, sans-IO ------------------------------------------------------------------------
def _unwrap(stream: bytes, cuts) -> list:
    u = RecordIOUnwrapper(source="s")
    pieces = []
    pos = 0
    for cut in sorted(cuts) + [len(stream)]:
        pieces.extend(u.feed(stream[pos:cut]))
        pos = cut
    u.finish()
    objects, current = [], []
    for p in pieces:
        if p is None:
            objects.append(b"".join(current))
            current = []
        else:
            current.append(p)
    assert not current
    return objects


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6), st.data())
def test_unwrapper_is_chunking_invariant(objects, data):
    stream = b"".join(_wrap(o) for o in objects)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert _unwrap(stream, cuts) == objects
    assert _unwrap(stream, range(len(stream))) == objects  # one byte at a time


def test_unwrapper_joins_parts_and_reports_faults_with_offsets():
    import struct

    def frame(cflag, part):
        return struct.pack("<II", 0xCED7230A, (cflag << 29) | len(part)) + part + \
            b"\0" * (-len(part) & 3)

    stream = frame(1, b"abc") + frame(2, b"defgh") + frame(3, b"ij") + frame(0, b"k")
    assert _unwrap(stream, [5, 13]) == [b"abcdefghij", b"k"]
    bad = frame(0, b"good") + b"\x00" * 8
    u = RecordIOUnwrapper(source="fifo")
    with pytest.raises(CorruptRecordError, match="bad magic") as info:
        u.feed(bad)
    assert (info.value.offset, info.value.source) == (12, "fifo")
    u = RecordIOUnwrapper(source="fifo")
    u.feed(frame(0, b"whole") + frame(1, b"first"))
    with pytest.raises(TruncatedStreamError):
        u.finish()
    with pytest.raises(CorruptRecordError, match="outside a multi-part"):
        RecordIOUnwrapper().feed(frame(2, b"x"))


def test_cli_errors_are_one_line(tmp_path):
    manifest, _ = _manifest(tmp_path, n=1)
    proc = subprocess.run([sys.executable, "-m", "streamio", "sagemaker-local", "--root",
                           str(tmp_path / "r"), "--manifest", str(manifest), "--attributes",
                           "source-ref", "--mode", "File"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "Pipe mode only" in proc.stderr and "Traceback" not in proc.stderr


def test_gzip_wrapping_helper_matches_zlib():
    payload = b"x" * 1000
    from streamio.sagemaker.emulator import _gzip

    assert zlib.decompress(_gzip(payload), 31) == payload
    assert _gzip(_gzip(payload)) == _gzip(payload)  # already-compressed objects pass through


def test_image_and_label_manifest_feeds_the_image_decoder(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    import io

    rng = np.random.default_rng(1)
    lines, pixels = [], []
    for i in range(6):
        img = rng.integers(0, 255, size=(20 + i, 30, 3), dtype=np.uint8)
        buf = io.BytesIO()
        pil.fromarray(img).save(buf, format="PNG")  # lossless: pixels compare exactly
        (tmp_path / f"im{i}.png").write_bytes(buf.getvalue())
        pixels.append(img)
        lines.append(json.dumps({"image-ref": f"im{i}.png", "class": i % 2}))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines))
    root = tmp_path / "root"
    args = ["--manifest", f"train={manifest}", "--attributes", "image-ref,class",
            "--record-wrapper", "RecordIO"]

    def read(epoch):
        decoder = sagemaker.AugmentedManifest({"image-ref": streamio.Image(crop=(16, 24)),
                                               "class": "int64"})
        return list(sagemaker.channel("train", root=root, decoder=decoder).batch(4))

    [batches] = _pipe_epochs(root, args, 1, read)
    images = np.concatenate([b["image-ref"] for b in batches])
    assert images.shape == (6, 16, 24, 3) and images.dtype == np.uint8
    for k, (got, img) in enumerate(zip(images, pixels)):  # a centre crop of each original
        # torchvision's CenterCrop: int(round(margin / 2)), so odd margins round half to even
        top, left = int(round((img.shape[0] - 16) / 2)), int(round((img.shape[1] - 24) / 2))
        np.testing.assert_array_equal(got, img[top:top + 16, left:left + 24], err_msg=f"image {k} {img.shape}")
    assert np.concatenate([b["class"] for b in batches]).tolist() == [0, 1, 0, 1, 0, 1]

"""SageMaker channel directories and configs that are not what a clean container holds: symlink
loops, index files beside the shards, channel names that are paths, hosts named twice, and an
augmented manifest read without a decoder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import streamio
from streamio import sagemaker
from streamio.sagemaker.config import ConfigError

from test_sagemaker import _manifest, _pipe_epochs, _write_config


def _file_channel(root, name="train"):
    _write_config(root, {name: {"TrainingInputMode": "File",
                                "ContentType": "application/x-tfrecord"}})
    folder = root / "input" / "data" / name
    folder.mkdir(parents=True)
    return folder


def _write_shards(folder, n=3, per=5):
    expected = []
    for f in range(n):
        records = [f"shard{f}-record{i}".encode() for i in range(per)]
        streamio.write_records(str(folder / f"part-{f}.tfrecord"), "tfrecord", records)
        expected.extend(records)
    return expected


def test_symlink_loops_list_each_file_once_in_bounded_time(tmp_path):
    folder = _file_channel(tmp_path)
    expected = _write_shards(folder)
    (folder / "sub").mkdir()
    streamio.write_records(str(folder / "sub" / "z.tfrecord"), "tfrecord", [b"deep"])
    os.symlink(".", folder / "x")  # two links back up the tree: 2**40 paths to os.walk
    os.symlink(".", folder / "y")
    os.symlink("..", folder / "sub" / "up")
    os.symlink("part-0.tfrecord", folder / "again.tfrecord")  # the same file twice
    # In a child process: the old walk never ends and its memory grows.
    code = ("import sys; from streamio import sagemaker;"
            f"ds = sagemaker.channel('train', root={str(tmp_path)!r}, decoder=None,"
            " follow_links=True);"
            "print(repr([str(s) for s in ds.sources])); print(repr(list(ds)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    sources_line, records_line = proc.stdout.splitlines()
    sources = [os.path.relpath(p, folder) for p in eval(sources_line)]
    # "again.tfrecord" sorts first and is part-0's second name: listed once, under it.
    assert sources == ["again.tfrecord", "part-1.tfrecord", "part-2.tfrecord",
                       os.path.join("sub", "z.tfrecord")]
    assert sorted(eval(records_line)) == sorted(expected + [b"deep"])


def test_a_link_below_the_channel_folder_is_refused_unless_followed(tmp_path):
    """SageMaker puts objects, never links, in a File-mode channel: a link there was planted.
    It is refused by name (the old walk followed it: /etc/passwd would be read as records);
    the channel folder itself may be a link (set-ups that point it at another disk)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    streamio.write_records(str(outside / "secret.tfrecord"), "tfrecord", [b"secret"])
    for planted in ("file", "folder"):
        root = tmp_path / planted
        folder = _file_channel(root)
        expected = _write_shards(folder)
        if planted == "file":
            os.symlink(outside / "secret.tfrecord", folder / "zz.tfrecord")
        else:
            (folder / "deep").mkdir()
            os.symlink(outside, folder / "deep" / "more")
        link = "zz.tfrecord" if planted == "file" else os.path.join("deep", "more")
        with pytest.raises(streamio.UsageError, match=f"{link} is a symbolic link.*follow_links"):
            sagemaker.channel("train", root=str(root), decoder=None)
        ds = sagemaker.channel("train", root=str(root), decoder=None, follow_links=True)
        assert sorted(ds) == sorted(expected + [b"secret"])
    # The channel folder as a link to the data on another disk: read as named.
    root = tmp_path / "linked"
    folder = _file_channel(root)
    folder.rmdir()
    real = tmp_path / "real-data"
    real.mkdir()
    expected = _write_shards(real)
    os.symlink(real, folder)
    assert sorted(sagemaker.channel("train", root=str(root), decoder=None)) == sorted(expected)


@pytest.mark.parametrize("tool", ["index", "pack"])
def test_index_files_beside_the_shards_are_not_read_as_records(tmp_path, tool):
    folder = _file_channel(tmp_path)
    if tool == "index":
        expected = _write_shards(folder)
        subprocess.run([sys.executable, "-m", "streamio", "index",
                        *sorted(str(p) for p in folder.iterdir())], check=True,
                       capture_output=True, timeout=60)
    else:
        tree = tmp_path / "tree" / "cls"
        tree.mkdir(parents=True)
        for i in range(6):
            (tree / f"f{i}.bin").write_bytes(bytes([i]) * 100)
        streamio.pack(str(tmp_path / "tree"), str(folder / "s"), shard_size=250, index=True)
        expected = None
    names = sorted(os.listdir(folder))
    assert any(n.endswith(".index") for n in names), names
    ds = sagemaker.channel("train", root=tmp_path, decoder=None)
    assert not [s for s in ds.sources if str(s).endswith((".index", ".idx"))]
    records = list(ds)  # the old listing read the indexes as TFRecord: a CRC error
    if expected is not None:
        assert records == expected
    else:
        assert len(records) == 6
    # They still serve as indexes: two readers split each shard at its record starts.
    halves = [list(ds.shard(2, i)) for i in range(2)]
    assert sorted(halves[0] + halves[1]) == sorted(records)


@pytest.mark.parametrize("name", ["../../etc", "..", ".", "a/b", "", "x" * 65, "tr ain"])
def test_channel_names_outside_sagemakers_pattern_are_config_errors(tmp_path, name):
    _write_config(tmp_path, {name: {"TrainingInputMode": "File", "ContentType": "text/csv"}})
    with pytest.raises(ConfigError, match="not a SageMaker channel name"):
        sagemaker.channels(root=tmp_path)
    with pytest.raises(ConfigError, match="not a SageMaker channel name"):
        sagemaker.channel(name, root=tmp_path)
    env = {"SM_INPUT_DATA_CONFIG": json.dumps({name: {}})}
    with pytest.raises(ConfigError, match="not a SageMaker channel name"):
        sagemaker.channels(root=tmp_path, env=env)


def test_the_emulator_refuses_a_channel_name_that_is_a_path(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("1,2\n")
    root = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "streamio", "sagemaker-local", "--root",
                           str(root), "--channel", f"../../victim={tmp_path / 'data'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "not a SageMaker channel name" in proc.stderr
    assert (victim / "keep.txt").read_text() == "precious"  # not removed and rewritten


def test_a_host_named_twice_is_a_config_error(tmp_path):
    _write_config(tmp_path, {"train": {}}, resource={"current_host": "algo-1",
                                                     "hosts": ["algo-1", "algo-2", "algo-1"]})
    with pytest.raises(ConfigError, match="'algo-1' more than once"):
        sagemaker.resources(root=tmp_path)
    env = {"SM_HOSTS": json.dumps(["algo-2", "algo-2"]), "SM_CURRENT_HOST": "algo-2"}
    with pytest.raises(ConfigError, match="'algo-2' more than once"):
        sagemaker.resources(root=tmp_path, env=env)


def test_augmented_manifest_without_a_decoder_yields_attribute_dicts(tmp_path):
    manifest, images = _manifest(tmp_path, n=3)
    root = tmp_path / "root"
    args = ["--manifest", f"train={manifest}", "--attributes", "source-ref,class",
            "--record-wrapper", "RecordIO"]

    def read(epoch):
        return list(sagemaker.channel("train", root=root, decoder=None))

    [items] = _pipe_epochs(root, args, 1, read)
    assert items == [{"source-ref": images[i], "class": str(i % 3).encode()} for i in range(3)]


def test_the_emulator_refuses_a_link_inside_a_folder_it_copies(tmp_path):
    """``sagemaker-local`` copies a channel's folder into the fake container: a link in it
    (here to a file outside the folder) is refused, naming it; the old copy followed it."""
    from streamio.sagemaker.emulator import Emulator, LocalChannel

    data = tmp_path / "data"
    data.mkdir()
    expected = _write_shards(data)
    (tmp_path / "outside.tfrecord").write_bytes(b"not the channel's")
    os.symlink(tmp_path / "outside.tfrecord", data / "zz.tfrecord")
    emulator = Emulator(str(tmp_path / "ml"), [LocalChannel("train", [str(data)],
                                                            "application/x-tfrecord")])
    with pytest.raises(streamio.UsageError, match=r"zz\.tfrecord is a symbolic link"):
        emulator.prepare()
    os.unlink(data / "zz.tfrecord")
    emulator.prepare()
    assert sorted(sagemaker.channel("train", root=str(tmp_path / "ml"), decoder=None)) == \
        sorted(expected)

"""What an object says about itself in a REPL or a log line: epoch iterators, channels and the
SageMaker channel's Dataset name what they are and where they stand (not <... object at 0x>)."""

from __future__ import annotations

import streamio
from streamio.pipeline import Dataset
from streamio.sagemaker.wrapping import WrappedPipeChannel

from support.examples import write_id_examples


def test_an_epoch_iterator_says_its_dataset_epoch_and_progress(tmp_path):
    path = write_id_examples(tmp_path / "a.tfrecord", range(100))
    ds = Dataset(path, "tfrecord").batch(10)
    it = iter(ds)
    next(it), next(it)
    text = repr(it)
    assert text.startswith("<EpochIterator epoch 0 of Dataset(") and ".batch(10)" in text
    assert "2 batches delivered, running" in text
    it.close()
    assert repr(it).endswith("2 batches delivered, closed>")
    it = iter(ds)
    list(it)
    assert "epoch 1" in repr(it) and repr(it).endswith("10 batches delivered, finished>")


def test_channels_show_their_timeouts_and_their_class(tmp_path):
    channel = streamio.PipeChannel(str(tmp_path / "train"), open_timeout=30, read_timeout=5)
    assert repr(channel) == (f"PipeChannel({str(tmp_path / 'train')!r}, open_timeout=30.0,"
                             " read_timeout=5.0, next epoch 0)")
    wrapped = WrappedPipeChannel(str(tmp_path / "train"), read_timeout=7)
    assert repr(wrapped).startswith("WrappedPipeChannel(") and "read_timeout=7.0" in repr(wrapped)


def test_a_dataset_subclass_says_its_own_name(tmp_path):
    path = write_id_examples(tmp_path / "a.tfrecord", range(3))

    class Channel(Dataset):
        pass

    assert repr(Channel(path, "tfrecord").batch(2)).startswith("Channel(")

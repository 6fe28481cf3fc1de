"""``to_tf(batches=n)`` on an epoch of another length names ``batches=`` in its error (TensorFlow's
own "Input dataset was expected to contain 16 elements" does not say which argument)."""

from __future__ import annotations

import numpy as np
import pytest

import streamio
from streamio import Dataset, Example, FixedLen

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("tfb") / "x.tfrecord"
    streamio.write_records(str(p), "tfrecord", [
        streamio.encode_example({"x": np.float32([i, i]), "y": np.int64(i)}) for i in range(48)])
    return str(p)


DECODER = Example({"x": FixedLen([2], "float32"), "y": FixedLen([], "int64")})


@pytest.mark.parametrize("mapped", [False, True])  # the block path and the from_generator path
@pytest.mark.parametrize("batches,held", [(16, "12"), (10, "more than 10")])
def test_an_epoch_of_another_length_names_batches(path, mapped, batches, held):
    ds = Dataset(path, "tfrecord", decoder=DECODER).batch(4)  # 12 batches
    if mapped:
        ds = ds.map(lambda b: {"x": b["x"] * 2, "y": b["y"]})
    seen = 0
    with pytest.raises(Exception, match=rf"to_tf\(batches={batches}\): this epoch of the stream"
                                        rf" held {held} batches") as info:
        for _ in ds.to_tf(batches=batches):
            seen += 1
    assert "Input dataset was expected" not in str(info.value)
    # Every batch before the failure was delivered: all 12 of a short epoch; of a long one the
    # first 9, as the 10th fails once the stream shows an 11th (so a consumer taking exactly
    # 10, as Keras does, fails too).
    assert seen == (12 if batches > 12 else batches - 1)


def test_the_right_length_passes(path):
    ds = Dataset(path, "tfrecord", decoder=DECODER).batch(4)
    tfds = ds.to_tf(batches=12)
    for _ in range(2):
        assert sum(1 for _ in tfds) == 12


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("batches,held", [(10, "more than 10"), (16, "12")])
def test_keras_fit_fails_on_an_epoch_of_another_length(path, mapped, batches, held):
    """Keras takes exactly ``batches`` steps and never asks for more, so a longer epoch used to
    train on 10 of its 12 batches and return normally (the error only a log line)."""
    keras = pytest.importorskip("keras")
    ds = Dataset(path, "tfrecord", decoder=DECODER).batch(4)  # 12 batches
    if mapped:
        ds = ds.map(lambda b: {"x": b["x"] * 2, "y": b["y"]})
    tfds = ds.to_tf(batches=batches).map(lambda b: (b["x"], tf.cast(b["y"], tf.float32)))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(Exception, match=rf"to_tf\(batches={batches}\): this epoch of the"
                                        rf" stream held {held} batches"):
        model.fit(tfds, epochs=2, verbose=0)


def test_keras_fit_of_the_right_length_trains_every_batch(path):
    keras = pytest.importorskip("keras")
    ds = Dataset(path, "tfrecord", decoder=DECODER).batch(4)
    tfds = ds.to_tf(batches=12).map(lambda b: (b["x"], tf.cast(b["y"], tf.float32)))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    steps = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    model.fit(tfds, epochs=2, verbose=0, callbacks=[callback])
    assert steps == list(range(12)) * 2

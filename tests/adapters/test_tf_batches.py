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


def test_a_block_call_waiting_on_a_stuck_one_fails_naming_the_wait(tmp_path, fifo, monkeypatch):
    """TensorFlow calls one iterator's block function one call at a time, so a second call
    waiting for the first means the first is stuck: it fails after BLOCK_CALL_WAIT_S (naming
    what it waited for) instead of waiting with it, unbounded."""
    import threading
    import time

    from streamio.adapters import tf as tf_adapter

    monkeypatch.setattr(tf_adapter, "BLOCK_CALL_WAIT_S", 1.0, raising=False)
    records = [streamio.encode_example({"x": np.float32([i, i]), "y": np.int64(i)})
               for i in range(200)]
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in records)
    path = fifo.make(data, 4093, stall_after=len(data) // 2, stall=15)  # then silent for 15 s
    ds = Dataset(path, "tfrecord", decoder=DECODER, open_timeout=60).batch(4)
    _, source = tf_adapter._to_tf(ds)
    token = source.next_block(np.int64(-1))[0]  # the first block: 16 batches
    stuck = threading.Thread(target=source.next_block, args=(token,), daemon=True)
    stuck.start()  # the second block waits for the writer's stall
    time.sleep(0.5)
    started = time.monotonic()
    with pytest.raises(streamio.errors.UsageError, match=r"waited 1 s for another call still"
                                                         r" reading iteration \d+'s block"):
        source.next_block(token)
    assert time.monotonic() - started < 5  # not the 15 s the stuck call waits
    stuck.join(60)

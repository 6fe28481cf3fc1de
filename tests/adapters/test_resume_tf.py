"""Resume a Keras training run's input stream (issue #12): resume_callback saves the state of
the batches model.fit trained on; a restarted run gets the rest of that epoch exactly."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import streamio
from streamio.decoders import Example, FixedLen, encode_example

tf = pytest.importorskip("tensorflow")


def _dataset(path: str) -> streamio.Dataset:
    ds = streamio.Dataset(path, "tfrecord", decoder=Example({"x": FixedLen((), np.int64)}))
    # No prefetch(): model.fit is interrupted mid-epoch below, and tf.data keeps the
    # interrupted generator until TensorFlow lets it go; nothing of it should outlive the test.
    return ds.shuffle(40, seed=3).batch(10)


def _ids(tfds) -> list:
    return [batch["x"].numpy().tolist() for batch in tfds]


class _Crash(Exception):
    pass


# The resumed first epoch is shorter than the others, which Keras reports (its words).
@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_model_fit_interrupted_then_resumed_sees_each_record_once(tmp_path):
    from streamio.adapters.tf import resume_callback

    path = str(tmp_path / "train.tfrecord")
    streamio.write_records(path, "tfrecord", [encode_example({"x": [i]}) for i in range(300)])
    reference = _dataset(path).to_tf()
    epochs = [_ids(reference) for _ in range(3)]  # 30 batches an epoch, epochs 0, 1, 2

    state_file = str(tmp_path / "stream.json")
    resume = resume_callback(state_file, every=4)
    assert resume.initial_epoch == 0
    tfds = resume.to_tf(_dataset(path))

    class CrashAt(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.params is not None and self._epoch == 1 and batch == 13:
                raise _Crash()

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    def to_xy(b):
        return tf.cast(b["x"][:, None], tf.float32), tf.zeros_like(b["x"], tf.float32)

    with pytest.raises(_Crash):
        model.fit(tfds.map(to_xy), epochs=3, callbacks=[resume, CrashAt()], verbose=0,
                  shuffle=False)
    with open(state_file) as f:
        state = json.load(f)
    # Saved every 4 steps: the last save in epoch 1 was after step 12 (batches 0-11 trained).
    assert (state["epoch"], state["delivered"]) == (1, 12)

    again = resume_callback(state_file, every=4)
    assert again.initial_epoch == 1
    tfds2 = again.to_tf(_dataset(path))
    assert _ids(tfds2) == epochs[1][12:]  # the rest of epoch 1, in the same order
    assert _ids(tfds2) == epochs[2]  # then epoch 2
    assert sorted(i for b in epochs[1][:12] + epochs[1][12:] for i in b) == list(range(300))
    assert not os.path.exists(state_file + ".tmp")

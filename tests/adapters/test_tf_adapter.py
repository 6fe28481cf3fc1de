"""The tf.data adapter: exact element specs, the same batches as numpy, epochs, sharding by input
context, Keras.

The only test module that imports TensorFlow (the torch tests fork DataLoader workers only in
fresh interpreters, so this import cannot deadlock them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import streamio  # noqa: E402
from streamio.decoders import (Example, FixedLen, RecordIOProtobuf, SparseBatch,  # noqa: E402
                               VarLen, encode_recordio_protobuf)
from streamio.decoders import encode_example  # noqa: E402
from streamio.errors import UsageError  # noqa: E402
from streamio.pipeline import Dataset  # noqa: E402

DECODER = Example({"id": FixedLen([], "int64"), "x": FixedLen([4], "float32"),
                   "tags": VarLen("int64"), "name": FixedLen([], "bytes")})
RECORDS = 150


@pytest.fixture
def parts(tmp_path):
    paths, first = [], 0
    for k, n in enumerate([40, 25, 60, 25]):
        path = str(tmp_path / f"part-{k}.tfrecord")
        streamio.write_records(path, "tfrecord", (
            encode_example({"id": i, "x": np.full(4, i / 10, np.float32),
                            "tags": np.arange(i % 5, dtype=np.int64), "name": b"n%d" % i})
            for i in range(first, first + n)))
        paths.append(path)
        first += n
    return paths


def ids_of(tfds):
    return [int(i) for batch in tfds for i in batch["id"].numpy()]


def test_element_spec_comes_from_the_decoder(parts):
    tfds = Dataset(parts, "tfrecord", decoder=DECODER).batch(16).to_tf()
    assert tfds.element_spec == {
        "id": tf.TensorSpec((None,), tf.int64),
        "x": tf.TensorSpec((None, 4), tf.float32),
        "tags": tf.TensorSpec((None, None), tf.int64),
        "tags_len": tf.TensorSpec((None,), tf.int64),
        "name": tf.TensorSpec((None,), tf.string),
    }


def test_batches_equal_the_numpy_batches(parts):
    ds = Dataset(parts, "tfrecord", decoder=DECODER).shuffle(64, seed=3).batch(16)
    expected = list(ds)  # the Dataset's own epoch 0
    got = list(ds.to_tf())  # the tf.data Dataset's first iteration: epoch 0 too
    assert len(got) == len(expected) == 10
    for a, b in zip(got, expected):
        assert set(a) == set(b)
        for name in ("id", "x", "tags", "tags_len"):
            assert a[name].dtype.as_numpy_dtype == b[name].dtype
            np.testing.assert_array_equal(a[name].numpy(), b[name])
        assert a["name"].numpy().tolist() == b["name"].tolist()


def test_each_iteration_is_an_epoch(parts):
    tfds = Dataset(parts, "tfrecord", decoder=DECODER).shuffle(64, seed=3).batch(16).to_tf()
    first, second = ids_of(tfds), ids_of(tfds)
    assert sorted(first) == sorted(second) == list(range(RECORDS))
    assert first != second
    assert sorted(ids_of(tfds.repeat(2))) == sorted(list(range(RECORDS)) * 2)


def test_map_prefetch_and_keras_fit_end_epochs_without_the_ran_out_of_data_warning(parts):
    """Keras 3 learns the length of a dataset of unknown cardinality by running out of it, and
    warns "Your input ran out of data" then; to_tf(batches=) gives it the length."""
    ds = Dataset(parts, "tfrecord", decoder=DECODER).shuffle(64, seed=1).batch(10)
    tfds = (ds.to_tf(batches=15)
            .map(lambda b: (b["x"], tf.cast(b["id"] % 2, tf.float32)),
                 num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))
    assert tfds.element_spec == (tf.TensorSpec((None, 4), tf.float32),
                                 tf.TensorSpec((None,), tf.float32))
    assert int(tfds.cardinality()) == 15
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    seen = []

    class Count(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append(0)

        def on_train_batch_end(self, batch, logs=None):
            seen[-1] += 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(tfds, epochs=2, verbose=0, shuffle=False, callbacks=[Count()])
    assert not [w for w in caught if "ran out of data" in str(w.message)], caught
    losses = history.history["loss"]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert seen == [15, 15]  # each Keras epoch is one whole stream epoch
    assert ds.stats()["records"] == RECORDS and ds.stats()["epoch"] == 1


def test_without_batches_keras_does_warn(parts):
    """What batches= is for (if Keras stops warning here, the advice can go)."""
    tfds = (Dataset(parts, "tfrecord", decoder=DECODER).batch(50).to_tf()
            .map(lambda b: (b["x"], tf.cast(b["id"] % 2, tf.float32))))
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(tfds, epochs=1, verbose=0)
    assert [w for w in caught if "ran out of data" in str(w.message)]


def test_an_epoch_of_another_length_than_batches_fails(parts):
    tfds = Dataset(parts, "tfrecord", decoder=DECODER).batch(10).to_tf(batches=16)
    # streamio's error, naming the argument, through TensorFlow's (an OpError holding its text)
    with pytest.raises(tf.errors.OpError, match=r"to_tf\(batches=16\): this epoch of the"
                                                r" stream held 15 batches"):
        list(tfds)
    with pytest.raises(UsageError):
        Dataset(parts, "tfrecord").batch(10).to_tf(batches=0)


def test_stats_describe_the_epochs_read_through_to_tf(parts):
    ds = Dataset(parts, "tfrecord", decoder=DECODER).batch(16)
    assert ds.stats()["records"] == 0
    tfds = ds.to_tf()
    for _ in range(2):
        assert sum(int(tf.shape(b["id"])[0]) for b in tfds) == RECORDS
    stats = ds.stats()
    assert stats["epoch"] == 1 and stats["records"] == stats["records_read"] == RECORDS
    assert stats["batches"] == 10 and stats["sources_opened"] == 4
    assert stats["bytes"] == sum(os.path.getsize(p) for p in parts)
    assert stats["first_batch_s"] is not None and stats["source_wait_s"] > 0
    assert stats["finished"]


def test_sparse_recordio_protobuf_learns_its_spec_and_keeps_the_first_batch(tmp_path):
    """RecordIO-protobuf decoders learn their outputs from the first record: to_tf() peeks it
    from a Pipe mode channel without losing it and without taking an extra epoch."""
    rng = np.random.default_rng(1)
    dense = ((rng.random((100, 30)) < 0.15) * rng.random((100, 30))).astype(np.float32)
    rows, cols = np.nonzero(dense)
    sparse = SparseBatch(np.concatenate([[0], np.cumsum((dense != 0).sum(1))]), cols,
                         dense[rows, cols], dense.shape)
    path = str(tmp_path / "data.rec")
    streamio.write_records(path, "recordio",
                           encode_recordio_protobuf(sparse, np.arange(100, dtype=np.float32)))
    prefix = str(tmp_path / "train")
    writer = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel", prefix,
                               "--epochs", "2", "--open-timeout", "30", path])
    try:
        channel = streamio.PipeChannel(prefix, open_timeout=30, read_timeout=30)
        ds = Dataset(channel, "recordio", decoder=RecordIOProtobuf()).batch(32)
        tfds = ds.to_tf()
        assert tfds.element_spec == {"values": tf.SparseTensorSpec((None, 30), tf.float32),
                                     "label_values": tf.TensorSpec((None, 1), tf.float32)}
        for _ in range(2):  # two epochs: _0 (peeked) then _1
            batches = list(tfds)
            assert [b["values"].dense_shape.numpy()[0] for b in batches] == [32, 32, 32, 4]
            got = tf.concat([tf.sparse.to_dense(b["values"]) for b in batches], 0).numpy()
            np.testing.assert_array_equal(got, dense)
            labels = np.concatenate([b["label_values"].numpy()[:, 0] for b in batches])
            assert labels.tolist() == list(range(100))
    finally:
        assert writer.wait(timeout=30) == 0


def test_raw_records_are_strings(parts):
    batched = Dataset(parts[:1], "tfrecord").batch(16).to_tf()
    assert batched.element_spec == tf.TensorSpec((None,), tf.string)
    assert [len(b) for b in batched] == [16, 16, 8]
    single = Dataset(parts[:1], "tfrecord").to_tf()  # no batch(), no decoder: raw records
    assert single.element_spec == tf.TensorSpec((), tf.string)
    assert len(list(single)) == 40
    # With a decoder and no batch(): one decoded example per element (parse_single_example's).
    examples = Dataset(parts[:1], "tfrecord", decoder=DECODER).to_tf()
    spec = examples.element_spec
    assert (spec["id"].shape, spec["x"].shape, spec["tags"].shape) == ((), (4,), (None,))
    assert len(list(examples)) == 40


@pytest.mark.parametrize("sources", [4, 1])
def test_input_context_shards_exactly_once(parts, tmp_path, sources):
    if sources == 1:  # one regular file: records are dealt round-robin
        whole = tmp_path / "all.tfrecord"
        whole.write_bytes(b"".join(open(p, "rb").read() for p in parts))
        parts = [str(whole)]
    ds = Dataset(parts, "tfrecord", decoder=DECODER).shuffle(32, seed=2).batch(8)
    seen = []
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
        seen.append(ids_of(ds.to_tf(input_context=ctx)))
    assert seen[0] and seen[1] and set(seen[0]).isdisjoint(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(RECORDS))


def test_distribute_datasets_from_function(parts):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    ds = Dataset(parts, "tfrecord", decoder=DECODER).batch(25)
    dist = strategy.distribute_datasets_from_function(
        lambda ctx: ds.to_tf(input_context=ctx).map(lambda b: b["id"]))
    seen = []
    for batch in dist:
        seen.extend(strategy.experimental_local_results(batch)[0].numpy().tolist())
    assert sorted(seen) == list(range(RECORDS))


def test_one_fifo_cannot_feed_two_input_pipelines(tmp_path):
    path = str(tmp_path / "pipe")
    os.mkfifo(path)
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    with pytest.raises(UsageError, match="single stream"):
        Dataset(path, "tfrecord").batch(4).to_tf(input_context=ctx)


def test_empty_stream_with_a_learnt_spec_is_a_usage_error():
    with pytest.raises(UsageError, match="no records"):
        Dataset(b"", "recordio", decoder=RecordIOProtobuf()).batch(4).to_tf()


def test_bad_arguments(parts):
    ds = Dataset(parts, "tfrecord").batch(4)
    with pytest.raises(TypeError):
        ds.to_tf(input_context="pipeline 0")
    with pytest.raises(TypeError):
        ds.to_tf(shards=2)


def test_missing_tensorflow_names_the_pip_install():
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from streamio.errors import MissingDependencyError\n"
            "from streamio.pipeline import Dataset\n"
            "try:\n    Dataset(b'', 'tfrecord').batch(2).to_tf()\n"
            "except MissingDependencyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install" in out.stdout and "tf" in out.stdout


# -- the fast path: fixed-shape outputs go several batches per generator call ---------------------
FIXED = Example({"id": FixedLen([], "int64"), "x": FixedLen([4], "float32"),
                 "h": FixedLen([2, 3], "int32")})


def _write_fixed(path, n):
    streamio.write_records(path, "tfrecord", (
        encode_example({"id": i, "x": np.arange(4, dtype=np.float32) + i / 7,
                        "h": np.full((2, 3), i % 50, np.int32)}) for i in range(n)))


def assert_same_batches(got, expected):
    """tf batches equal numpy batches exactly: count, sizes, names, dtypes, values."""
    assert [len(b[next(iter(b))]) for b in got] == [len(b[next(iter(b))]) for b in expected]
    for a, b in zip(got, expected):
        assert set(a) == set(b)
        for name, value in b.items():
            if isinstance(value, SparseBatch):
                dense = np.zeros(value.shape, value.values.dtype)
                rows = np.repeat(np.arange(value.shape[0]), np.diff(value.indptr))
                dense[rows, value.indices] = value.values
                np.testing.assert_array_equal(tf.sparse.to_dense(a[name]).numpy(), dense)
            elif value.dtype.kind in "OSU":
                assert a[name].numpy().tolist() == value.tolist()
            else:
                assert a[name].dtype.as_numpy_dtype == value.dtype, name
                assert a[name].shape == value.shape, name
                np.testing.assert_array_equal(a[name].numpy(), value)


@pytest.mark.parametrize("records, batch_size", [(1000, 16), (1000, 10), (7, 16), (16 * 16, 16)])
def test_fixed_shape_outputs_take_the_block_path_and_equal_numpy(tmp_path, records, batch_size):
    """Several batches per call, split back inside TensorFlow: the same batches as numpy, the
    short last batch included (1000 % 16 = 8; 7 < 16: only a short batch), over two epochs."""
    import streamio.adapters.tf as adapter

    path = str(tmp_path / "fixed.tfrecord")
    _write_fixed(path, records)
    ds = Dataset(path, "tfrecord", decoder=FIXED).shuffle(100, seed=5).batch(batch_size)
    tfds = ds.to_tf()
    assert adapter._fixed_shape(FIXED.output_spec())  # this test is about the block path
    assert tfds.element_spec == {"id": tf.TensorSpec((None,), tf.int64),
                                 "x": tf.TensorSpec((None, 4), tf.float32),
                                 "h": tf.TensorSpec((None, 2, 3), tf.int32)}
    for epoch in range(2):
        expected = list(Dataset(path, "tfrecord", decoder=FIXED).shuffle(100, seed=5)
                        .batch(batch_size).with_context(epoch=epoch))
        got = list(tfds)
        assert_same_batches(got, expected)
        ids = [int(i) for b in got for i in b["id"].numpy()]
        assert sorted(ids) == list(range(records))
    assert ds.stats()["epoch"] == 1 and ds.stats()["records"] == records


def test_block_path_in_a_graph_mode_loop_with_batches_for_keras(tmp_path):
    """What model.fit does: a tf.function reading the iterator; batches= gives the cardinality."""
    path = str(tmp_path / "fixed.tfrecord")
    _write_fixed(path, 1000)
    tfds = Dataset(path, "tfrecord", decoder=FIXED).batch(64).to_tf(batches=16)
    assert int(tfds.cardinality()) == 16

    @tf.function
    def total(d):
        s = tf.constant(0, tf.int64)
        n = tf.constant(0, tf.int64)
        for b in d:
            s += tf.reduce_sum(b["id"])
            n += tf.cast(tf.shape(b["x"])[0], tf.int64)
        return s, n

    for _ in range(2):
        s, n = total(tfds)
        assert int(n) == 1000 and int(s) == sum(range(1000))
    with pytest.raises(tf.errors.OpError, match=r"to_tf\(batches=15\): this epoch of the"
                                                r" stream held more than 15 batches"):
        list(Dataset(path, "tfrecord", decoder=FIXED).batch(64).to_tf(batches=15))
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.001), loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(tfds.map(lambda b: (b["x"], tf.cast(b["id"] % 2, tf.float32))),
                            epochs=2, verbose=0)
    assert not [w for w in caught if "ran out of data" in str(w.message)], caught
    assert len(history.history["loss"]) == 2


def test_block_size_is_capped_by_bytes():
    import streamio.adapters.tf as adapter

    spec = Example({"x": FixedLen([1024], "float32")}).output_spec()
    assert adapter._block_batches(spec, 256) == 16  # 1 MiB batches: 16 fit in BLOCK_BYTES
    assert adapter._block_batches(spec, 4096) == 1  # 16 MiB batches: one per call
    assert not adapter._fixed_shape(DECODER.output_spec())  # VarLen and bytes: one per call


def test_fallback_outputs_equal_numpy_over_two_epochs(parts):
    """VarLen (padded + _len), bytes fields: one batch per call, exactly numpy's batches."""
    ds = Dataset(parts, "tfrecord", decoder=DECODER).shuffle(64, seed=9).batch(16)
    tfds = ds.to_tf()
    for epoch in range(2):
        expected = list(Dataset(parts, "tfrecord", decoder=DECODER).shuffle(64, seed=9)
                        .batch(16).with_context(epoch=epoch))
        assert_same_batches(list(tfds), expected)


def test_block_path_from_a_fifo_written_by_another_process(tmp_path):
    """The bytes come from serve-pipe through a PipeChannel, two epochs (FIFOs _0 and _1)."""
    path = str(tmp_path / "fixed.tfrecord")
    _write_fixed(path, 1000)
    expected = list(Dataset(path, "tfrecord", decoder=FIXED).batch(48))
    prefix = str(tmp_path / "train")
    writer = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel", prefix,
                               "--epochs", "2", "--open-timeout", "30", path])
    try:
        channel = streamio.PipeChannel(prefix, open_timeout=30, read_timeout=30)
        tfds = Dataset(channel, "tfrecord", decoder=FIXED).batch(48).to_tf(batches=21)
        for _ in range(2):
            got = list(tfds)
            assert len(got) == 21 and len(got[-1]["id"]) == 1000 - 20 * 48
            assert_same_batches(got, expected)
    finally:
        assert writer.wait(timeout=30) == 0


def test_block_path_delivers_the_batches_before_a_fault_then_the_error(tmp_path):
    path = tmp_path / "bad.tfrecord"
    _write_fixed(str(path), 1000)
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF  # a payload (or CRC) byte three quarters in
    path.write_bytes(bytes(data))
    expected = []
    with pytest.raises(streamio.StreamioError) as numpy_error:
        for batch in Dataset(str(path), "tfrecord", decoder=FIXED).batch(16):
            expected.append(batch)
    assert 0 < len(expected) < 1000 // 16  # some batches come before the fault
    got = []
    with pytest.raises(tf.errors.OpError) as tf_error:
        for batch in Dataset(str(path), "tfrecord", decoder=FIXED).batch(16).to_tf():
            got.append(batch)
    assert_same_batches(got, expected)
    assert str(numpy_error.value).splitlines()[0] in str(tf_error.value)


def test_a_learnt_dense_spec_takes_the_block_path_and_keeps_the_peeked_batch(tmp_path):
    """Dense RecordIO-protobuf: the spec is learnt from a peeked first batch, all fixed-shape."""
    rng = np.random.default_rng(3)
    x = rng.random((203, 6)).astype(np.float32)
    path = str(tmp_path / "dense.rec")
    streamio.write_records(path, "recordio",
                           encode_recordio_protobuf(x, np.arange(203, dtype=np.float32)))
    ds = Dataset(path, "recordio", decoder=RecordIOProtobuf()).batch(20)
    tfds = ds.to_tf()
    assert tfds.element_spec == {"values": tf.TensorSpec((None, 6), tf.float32),
                                 "label_values": tf.TensorSpec((None, 1), tf.float32)}
    for epoch in range(2):
        expected = list(Dataset(path, "recordio", decoder=RecordIOProtobuf()).batch(20))
        got = list(tfds)
        assert [len(b["values"]) for b in got] == [20] * 10 + [3]
        assert_same_batches(got, expected)
        np.testing.assert_array_equal(np.concatenate([b["values"].numpy() for b in got]), x)


_FIFO_WRITER = ("import sys\n"
                "data = open(sys.argv[2], 'rb').read()\n"
                "try:\n"
                "    with open(sys.argv[1], 'wb') as f:\n"
                "        f.write(data)\n"
                "except BrokenPipeError:\n"
                "    sys.exit(3)  # the reader closed the FIFO before the end\n")


def test_a_new_iteration_closes_the_epoch_a_break_left_open(tmp_path):
    """A break leaves epoch 0's FIFO half read (its writer blocked); the next iteration closes
    it (the writer sees the reader go) and reads epoch 1's FIFO whole."""
    path = str(tmp_path / "fixed.tfrecord")
    _write_fixed(path, 60_000)  # ~4 MB: more than the pipe and the reader's buffer hold
    prefix = str(tmp_path / "train")
    writers = []
    for epoch in range(2):
        os.mkfifo(f"{prefix}_{epoch}")
        writers.append(subprocess.Popen([sys.executable, "-c", _FIFO_WRITER,
                                         f"{prefix}_{epoch}", path]))
    try:
        channel = streamio.PipeChannel(prefix, open_timeout=30, read_timeout=30)
        tfds = Dataset(channel, "tfrecord", decoder=FIXED).batch(64).to_tf()
        for batch in tfds:
            assert len(batch["id"]) == 64
            break
        assert writers[0].poll() is None  # still blocked: epoch 0 is open
        ids = [int(i) for batch in tfds for i in batch["id"].numpy()]
        assert ids == list(range(60_000))
        assert writers[0].wait(timeout=30) == 3  # its reader went away mid-stream
        assert writers[1].wait(timeout=30) == 0
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()


def test_two_iterators_at_once_fail_loudly_rather_than_share_an_epoch(tmp_path):
    """The block path reads one iteration at a time: an iterator overtaken by a newer one
    raises (never hands out the newer one's batches), and the newer one gets a whole epoch."""
    path = str(tmp_path / "fixed.tfrecord")
    _write_fixed(path, 1000)
    tfds = Dataset(path, "tfrecord", decoder=FIXED).batch(16).to_tf()
    first = iter(tfds)
    next(first)
    second = iter(tfds)
    got = [next(second)]
    with pytest.raises(tf.errors.OpError, match="one iterator at a time"):
        for _ in first:
            pass
    got.extend(second)
    expected = list(Dataset(path, "tfrecord", decoder=FIXED).batch(16))
    assert_same_batches(got, expected)

"""write_records and write_recordio_protobuf: what we write, others (and we) read back exactly."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import streamio
from streamio.formats.recordio import MAGIC_BYTES


@pytest.mark.parametrize("compression,tf_type", [(None, ""), ("gzip", "GZIP"), ("zlib", "ZLIB")])
def test_tensorflow_reads_our_tfrecords(tmp_path, compression, tf_type):
    pytest.importorskip("tensorflow")
    records = [os.urandom(n) for n in (0, 1, 100, 70_000)] + [b"plain text"]
    path = str(tmp_path / "ours.tfrecord")
    streamio.write_records(path, "tfrecord", records, compression=compression)
    code = ("import json, sys, tensorflow as tf; ds = tf.data.TFRecordDataset([sys.argv[1]],"
            " compression_type=sys.argv[2]); print(json.dumps([r.numpy().hex() for r in ds]))")
    # TensorFlow runs in its own process: this test process may fork DataLoader workers later.
    out = subprocess.run([sys.executable, "-c", code, path, tf_type], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [bytes.fromhex(h) for h in json.loads(out.stdout.splitlines()[-1])] == records
    assert list(streamio.read_records(path, "tfrecord", compression=compression)) == records


def test_recordio_round_trip_with_embedded_magic_to_a_file_object():
    records = [b"", MAGIC_BYTES, b"abcd" + MAGIC_BYTES * 3 + b"z", os.urandom(1001)]
    buf = io.BytesIO()
    streamio.write_records(buf, "recordio", records)
    assert list(streamio.read_records(buf.getvalue(), "recordio")) == records


def test_write_rejects_unknown_formats_and_compressions(tmp_path):
    with pytest.raises(ValueError, match="tfrecord"):
        streamio.write_records(str(tmp_path / "x"), "csv", [b"a"])
    with pytest.raises(ValueError):
        streamio.write_records(str(tmp_path / "x"), "tfrecord", [b"a"], compression="lz4")


def test_write_recordio_protobuf_dense_round_trip(tmp_path):
    x = np.random.default_rng(0).random((7, 5), dtype=np.float32)
    y = np.arange(7, dtype=np.float32)
    path = str(tmp_path / "dense.pbr.gz")
    streamio.write_recordio_protobuf(path, x, y, compression="infer")
    (batch,) = list(streamio.Dataset(path, "recordio", decoder=streamio.RecordIOProtobuf())
                    .batch(100))
    np.testing.assert_array_equal(batch["values"], x)
    np.testing.assert_array_equal(batch["label_values"].ravel(), y)


def test_write_recordio_protobuf_sparse_round_trip(tmp_path):
    dense = np.zeros((4, 6), dtype=np.float32)
    dense[0, 1], dense[2, 5], dense[3, 0] = 1.5, -2.0, 3.0
    indptr = np.array([0, 1, 1, 2, 3])
    csr = streamio.SparseBatch(indptr=indptr, indices=np.array([1, 5, 0]),
                               values=np.array([1.5, -2.0, 3.0], dtype=np.float32), shape=(4, 6))
    path = str(tmp_path / "sparse.pbr")
    streamio.write_recordio_protobuf(path, csr)
    (batch,) = list(streamio.Dataset(path, "recordio", decoder=streamio.RecordIOProtobuf())
                    .batch(10))
    np.testing.assert_array_equal(batch["values"].to_dense(), dense)


def test_concat_writes_each_payload_as_one_whole_frame():
    payload = b"abcd" + MAGIC_BYTES + b"tail"
    buf = io.BytesIO()
    streamio.write_records(buf, "recordio", [payload], multipart="concat")
    data = buf.getvalue()
    assert int.from_bytes(data[4:8], "little") == len(payload)  # cflag 0, the whole length
    assert len(data) == 8 + len(payload)
    for multipart in ("dmlc", "concat"):
        assert list(streamio.read_records(data, "recordio", multipart=multipart)) == [payload]

"""Every peer file with RecordIO or TFRecord framing reads as its own project says
(../shared/peer-fixtures/README.md). Decoding their payloads is tested with the decoders."""

from __future__ import annotations

import struct

import pytest

import streamio
from streamio.errors import CorruptRecordError
from streamio.formats import make_framer

from conftest import peer


def read(path, fmt="recordio", **kw):
    return list(streamio.read_records(peer(path), fmt, **kw))


def test_tfrecords_from_sagemaker_tensorflow_extensions(fifo):
    path = peer("sagemaker-tensorflow-extensions/100.tfrecords")
    expected = [b"hello world %d" % i for i in range(100)]
    assert read("sagemaker-tensorflow-extensions/100.tfrecords", "tfrecord") == expected
    fed = fifo.make(open(path, "rb").read(), 5, 11)
    assert list(streamio.read_records(fed, "tfrecord")) == expected


def test_ml_io_complete_and_split_records_agree_under_concat():
    whole = read("ml-io/complete_records.pr")
    assert len(whole) == 5 and all(len(r) == 48 for r in whole)
    assert read("ml-io/split_records.pr", multipart="concat") == whole


def test_ml_io_split_records_do_not_parse_under_dmlc_semantics():
    split = read("ml-io/split_records.pr", multipart="dmlc")
    # dmlc re-inserts the magic between parts, so the payloads are no longer the records
    assert split != read("ml-io/complete_records.pr")
    assert all(struct.pack("<I", 0xCED7230A) in r for r in split)


def test_ml_io_corrupted_split_records_names_the_bad_part_every_time():
    for _ in range(2):  # asked again, the same answer
        got = []
        with pytest.raises(CorruptRecordError, match=r"part #13 is a last part \(cflag 3\)") as info:
            for r in streamio.read_records(peer("ml-io/corrupted_split_records.pr"), "recordio",
                                           multipart="concat"):
                got.append(r)
        assert len(got) == 3 and info.value.record_index == 3 and info.value.offset == 264
    framer = make_framer("recordio", source="c", multipart="concat")
    framer.feed(open(peer("ml-io/corrupted_split_records.pr"), "rb").read())
    for _ in range(2):
        with pytest.raises(CorruptRecordError, match="part #13"):
            framer.finish()


def test_ml_io_image_recordio():
    (record,) = read("ml-io/test_image_0.rec")
    flag, label, id1, id2 = struct.unpack_from("<IfQQ", record)
    assert (flag, label, id1, id2) == (0, 0.0, 1, 0)
    assert record[24:27] == b"\xff\xd8\xff"  # a JPEG follows the 24-byte IRHeader


@pytest.mark.parametrize("path,count", [
    ("ml-io/test.pbr", 3),
    ("sagemaker-python-sdk/matrix_0.pbr", 100),
    ("sagemaker-python-sdk/nips-train_1.pbr", 350),
    ("sagemaker-xgboost-container/train.pb", 5),
    ("sagemaker-xgboost-container/pb_files/train.pb", 5),
    ("sagemaker-xgboost-container/sparse/train.pb", 5),
    ("sagemaker-xgboost-container/single_feature_label.pb", 1),
])
def test_recordio_protobuf_files_frame(path, count):
    assert len(read(path)) == count


def test_first_10_rows_recordio_frames_to_ten_payloads():
    records = read("sagemaker-python-sdk/first_10_rows_recordio")
    assert [len(r) for r in records] == [3148] * 10


def test_sparse_edge_cases_frame_to_25_rows():
    import glob
    import os

    files = sorted(glob.glob(os.path.join(os.path.dirname(peer(
        "sagemaker-xgboost-container/sparse_edge_cases/diagonal.pbr")), "*.pbr")))
    assert len(files) == 8
    assert len(list(streamio.read_records(files, "recordio"))) == 25


def test_peer_text_files():
    assert read("ml-io/test.csv", "csv") == [b"1,0,0,0", b"1,0,0,0", b"0,1,1,1"]
    assert read("ml-io/test.txt", "lines") == [b"this is line %d" % i for i in (1, 2, 3)]
    rows = read("sagemaker-xgboost-container/train.csv", "csv")  # CRLF, no trailing newline
    assert rows == [b"0,1,0,0,0,0"] * 4 + [b"1,0,1,0,0,0"]

"""SageMaker RecordIO-protobuf decoding: every peer file reads as its project expects, our writer
round-trips, later records that differ are named, garbage ends in DecodeError."""

from __future__ import annotations

import glob
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio.decoders import FieldSpec, FixedLen, RecordIOProtobuf, SparseBatch, VarLen
from streamio.decoders.wire import _WireError
from streamio.decoders.recordio_protobuf import (encode_recordio_protobuf, parse_recordio_protobuf,
                                                 parse_recordio_protobuf_fast)
from streamio.errors import DecodeError

from conftest import peer
from support.protobuf import field, varints


def decode(path, decoder=None, **reader_options):
    records = list(streamio.read_records(path, "recordio", **reader_options))
    return (decoder or RecordIOProtobuf()).decode_batch(records, source=str(path))


def frame(payloads, tmp_path, name="data.pbr"):
    path = tmp_path / name
    streamio.write_records(str(path), "recordio", payloads)
    return path


# --- peer files ----------------------------------------------------------------------------------

ML_IO_FEATURES = [[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 2, 0], [0, 0, 0]]


def test_ml_io_complete_records():
    out = decode(peer("ml-io/complete_records.pr"))
    assert out["values"].dtype == np.float32
    np.testing.assert_array_equal(out["values"], ML_IO_FEATURES)
    np.testing.assert_array_equal(out["label_values"], [[1], [2], [3], [4], [5]])


def test_ml_io_split_records_under_concatenation():
    out = decode(peer("ml-io/split_records.pr"), multipart="concat")
    np.testing.assert_array_equal(out["values"], ML_IO_FEATURES)
    np.testing.assert_array_equal(out["label_values"].ravel(), [1, 2, 3, 4, 5])


def test_ml_io_int32_records():
    out = decode(peer("ml-io/test.pbr"))
    assert out["values"].dtype == np.int32
    np.testing.assert_array_equal(out["values"], [[0, 0, 0], [0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(out["label_values"].ravel(), [1, 1, 0])


def test_sagemaker_sdk_dense_matrix():
    out = decode(peer("sagemaker-python-sdk/matrix_0.pbr"))
    matrix = out["values"]
    assert matrix.shape == (100, 784) and matrix.dtype == np.float32
    assert (matrix.min(), matrix.max()) == (0.0, 0.99609375)
    assert matrix.astype(np.float64).sum() == pytest.approx(9886.277, abs=1e-3)
    assert set(out) == {"values"}


def test_sagemaker_sdk_sparse_matrix():
    out = decode(peer("sagemaker-python-sdk/nips-train_1.pbr"))
    batch = out["values"]
    assert isinstance(batch, SparseBatch)
    assert batch.shape == (350, 12419) and batch.nnz == 174198
    assert batch.indices.max() == 12417
    assert batch.values.astype(np.float64).sum() == 451275.0
    dense = batch.to_dense()
    assert dense.shape == (350, 12419) and dense.sum(dtype=np.float64) == 451275.0


def test_payloads_that_are_not_records_raise_a_clear_error():
    with pytest.raises(DecodeError, match="not a RecordIO-protobuf Record") as info:
        decode(peer("sagemaker-python-sdk/first_10_rows_recordio"))
    assert info.value.record_index == 0
    assert "first_10_rows_recordio" in str(info.value)


XGB_FEATURES = [[1, 0, 0, 0, 0]] * 4 + [[0, 1, 0, 0, 0]]


@pytest.mark.parametrize("path", ["train.pb", "pb_files/train.pb"])
def test_xgboost_dense_int32(path):
    out = decode(peer(f"sagemaker-xgboost-container/{path}"))
    np.testing.assert_array_equal(out["values"], XGB_FEATURES)
    np.testing.assert_array_equal(out["label_values"].ravel(), [0, 0, 0, 0, 1])


def test_xgboost_sparse_equals_dense():
    out = decode(peer("sagemaker-xgboost-container/sparse/train.pb"))
    assert isinstance(out["values"], SparseBatch)
    np.testing.assert_array_equal(out["values"].to_dense(), XGB_FEATURES)


def test_xgboost_feature_with_only_a_shape_is_an_all_zero_row():
    out = decode(peer("sagemaker-xgboost-container/single_feature_label.pb"))
    np.testing.assert_array_equal(out["values"].to_dense(), [[0.0]])
    assert out["values"].dtype == np.float64
    np.testing.assert_array_equal(out["label_values"], [[0.0]])


def test_xgboost_sparse_edge_cases_read_together():
    files = sorted(glob.glob(os.path.join(os.path.dirname(
        peer("sagemaker-xgboost-container/sparse_edge_cases/diagonal.pbr")), "*.pbr")))
    assert len(files) == 8
    records = [r for f in files for r in streamio.read_records(f, "recordio")]
    out = RecordIOProtobuf().decode_batch(records)
    dense = out["values"].to_dense()
    assert dense.shape == (25, 3)
    np.testing.assert_array_equal(out["label_values"].ravel(), np.ones(25))
    # Each file decodes on its own to the same rows (empty rows are all-zero rows).
    rows = [RecordIOProtobuf().decode_batch(list(streamio.read_records(f, "recordio")))["values"].to_dense()
            for f in files]
    np.testing.assert_array_equal(np.concatenate(rows), dense)
    assert (dense.sum(axis=1) == 0).any()


def test_peer_matrix_read_from_a_fifo(fifo):
    with open(peer("sagemaker-python-sdk/matrix_0.pbr"), "rb") as f:
        data = f.read()
    decoder = RecordIOProtobuf()
    records = list(streamio.read_records(fifo.make(data * 2, 5, 4099, 13), "recordio"))
    batches = [decoder.decode_batch(records[i:i + 64], source="fifo", first_index=i)
               for i in range(0, len(records), 64)]
    matrix = np.concatenate([b["values"] for b in batches])
    assert matrix.shape == (200, 784)
    np.testing.assert_array_equal(matrix[:100], matrix[100:])
    assert matrix[:100].astype(np.float64).sum() == pytest.approx(9886.277, abs=1e-3)


# --- our writer round-trips --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_dense_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(1)
    features = (rng.standard_normal((40, 6)) * 1000).astype(dtype)
    labels = np.arange(40, dtype=np.float32)
    path = frame(encode_recordio_protobuf(features, labels), tmp_path)
    out = decode(str(path))
    assert out["values"].dtype == dtype
    assert out["values"].flags.writeable  # torch.from_numpy takes it as it is
    np.testing.assert_array_equal(out["values"], features)
    np.testing.assert_array_equal(out["label_values"].ravel(), labels)


def test_sparse_and_named_round_trip(tmp_path):
    dense = np.zeros((30, 9), dtype=np.float32)
    dense[np.arange(30) % 4 == 0, 3] = 2.5
    dense[5, 8] = -1.0
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=30))))
    csr = SparseBatch(indptr, cols, dense[rows, cols], dense.shape)
    payloads = encode_recordio_protobuf({"x": csr, "id": np.arange(30)[:, None]},
                                        {"y": np.arange(30, dtype=np.float64)})
    out = decode(str(frame(payloads, tmp_path)))
    assert out["x"] == csr
    np.testing.assert_array_equal(out["id"].ravel(), np.arange(30))
    assert out["id"].dtype == np.int32
    np.testing.assert_array_equal(out["label_y"].ravel(), np.arange(30))


def test_scipy_sparse_input_if_available(tmp_path):
    sparse = pytest.importorskip("scipy.sparse")
    matrix = sparse.random(20, 50, density=0.1, format="csr", dtype=np.float32, random_state=3)
    out = decode(str(frame(encode_recordio_protobuf(matrix), tmp_path)))
    np.testing.assert_array_equal(out["values"].to_dense(), matrix.toarray())


def test_bytes_tensors_round_trip(tmp_path):
    images = np.array([[b"\x00jpeg" + bytes([i])] for i in range(10)], dtype=object)
    out = decode(str(frame(encode_recordio_protobuf({"image": images}, np.arange(10)), tmp_path)))
    assert out["image"].dtype == object
    assert out["image"][:, 0].tolist() == images[:, 0].tolist()


@pytest.mark.parametrize("features, labels, error", [
    (np.array([[2 ** 40]]), None, ValueError),
    (np.array([["a"]]), None, TypeError),
    (np.zeros((2, 2, 2)), None, ValueError),
    (np.zeros((3, 2), np.float32), np.zeros(4), ValueError),
    (np.zeros((3, 2), np.complex64), None, TypeError),
])
def test_writer_rejects_what_the_format_cannot_hold(features, labels, error):
    with pytest.raises(error):
        encode_recordio_protobuf(features, labels)


# --- options and errors ----------------------------------------------------------------------------------

def _payloads(*rows):
    """rows of (features array or None, label array or None) -> payloads, one record each."""
    out = []
    for features, label in rows:
        out.extend(encode_recordio_protobuf(features, label))
    return out


def test_later_record_with_another_length_dtype_or_missing_tensor_is_named():
    good = (np.ones((1, 3), np.float32), np.ones(1, np.float32))
    cases = [
        ((np.ones((1, 4), np.float32), np.ones(1, np.float32)), "4 values where the first record has 3", "values"),
        ((np.ones((1, 3), np.float64), np.ones(1, np.float32)), "float64_tensor where the first record", "values"),
        ((np.ones((1, 3), np.float32), None), "lacks the label tensor", "label_values"),
    ]
    for bad, message, name in cases:
        decoder = RecordIOProtobuf()
        with pytest.raises(DecodeError, match=message) as info:
            decoder.decode_batch(_payloads(good, good, bad), source="s3://b/k", first_index=1000)
        assert (info.value.record_index, info.value.field, info.value.source) == (1002, name, "s3://b/k")


def test_first_batch_primes_the_schema_and_fresh_forgets_it():
    decoder = RecordIOProtobuf()
    assert decoder.output_spec() is None
    decoder.decode_batch(_payloads((np.ones((2, 3), np.float32), np.ones(2, np.int32))))
    assert decoder.output_spec() == {"values": FieldSpec("dense", np.float32, (3,)),
                                     "label_values": FieldSpec("dense", np.int32, (1,))}
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.output_spec() == decoder.output_spec()
    with pytest.raises(DecodeError):  # the schema is kept: 4 values are an error
        clone.decode_batch(_payloads((np.ones((1, 4), np.float32), np.ones(1, np.int32))))
    fresh = decoder.fresh()
    assert fresh.output_spec() is None
    assert fresh.decode_batch(_payloads((np.ones((1, 4), np.float32), np.ones(1, np.int32))))["values"].shape == (1, 4)


def test_varlen_fixedlen_and_selection():
    records = _payloads((np.arange(3, dtype=np.float32)[None], np.ones(1, np.float32)),
                        (np.arange(3, dtype=np.float32)[None] + 1, np.zeros(1, np.float32)))
    records.append(encode_recordio_protobuf(np.arange(5, dtype=np.float32)[None], np.ones(1, np.float32))[0])
    out = RecordIOProtobuf(features={"values": VarLen("float64", pad_value=-1)}, label=[]).decode_batch(records)
    assert set(out) == {"values", "values_len"}
    np.testing.assert_array_equal(out["values_len"], [3, 3, 5])
    np.testing.assert_array_equal(out["values"][0], [0, 1, 2, -1, -1])
    assert out["values"].dtype == np.float64
    fixed = RecordIOProtobuf(features={"values": FixedLen((3, 1), "float32")}, label=["values"])
    batch = fixed.decode_batch(records[:2])
    assert batch["values"].shape == (2, 3, 1) and batch["label_values"].shape == (2, 1)


def test_sparse_row_in_a_dense_feature_is_named():
    dense = encode_recordio_protobuf(np.ones((1, 3), np.float32))
    sparse = encode_recordio_protobuf(SparseBatch([0, 1], [2], np.ones(1, np.float32), (1, 3)))
    with pytest.raises(DecodeError, match="sparse tensor where the first record has a dense") as info:
        RecordIOProtobuf().decode_batch(dense + sparse, first_index=5)
    assert info.value.record_index == 6


def test_sparse_key_outside_shape_is_named():
    from streamio.decoders.wire import encode_packed_varints

    good = encode_recordio_protobuf(SparseBatch([0, 1], [2], np.ones(1, np.float32), (1, 3)))[0]
    bad = good.replace(encode_packed_varints(np.array([2])) + b"\x1a\x01\x03",
                       encode_packed_varints(np.array([7])) + b"\x1a\x01\x03")
    assert bad != good
    with pytest.raises(DecodeError, match="outside the shape") as info:
        RecordIOProtobuf().decode_batch([good, bad])
    assert info.value.record_index == 1


@pytest.mark.parametrize("kwargs, error", [
    (dict(features="values"), TypeError),
    (dict(label=5), TypeError),
    (dict(features={"values": "float32"}), TypeError),
])
def test_bad_options_fail_at_construction(kwargs, error):
    with pytest.raises(error):
        RecordIOProtobuf(**kwargs)


# --- vectorised path equals reference; garbage -------------------------------------------------------------

@st.composite
def record_batches(draw):
    width = draw(st.integers(0, 5))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    sparse = draw(st.booleans())
    n = draw(st.integers(1, 30))
    elements = st.integers(-(2 ** 31), 2 ** 31 - 1) if dtype == np.int32 else st.floats(width=32, allow_nan=False)
    features = np.array(draw(st.lists(st.lists(elements, min_size=width, max_size=width), min_size=n, max_size=n)),
                        dtype=dtype).reshape(n, width)
    if sparse and width:
        rows, cols = np.nonzero(features)
        indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=n))))
        features = SparseBatch(indptr, cols, features[rows, cols], features.shape)
    labels = np.array(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)), dtype=np.float32)
    records = encode_recordio_protobuf(features, labels)
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, n - 1))
        rec = bytearray(records[i])
        if draw(st.booleans()) and rec:
            rec[draw(st.integers(0, len(rec) - 1))] ^= draw(st.integers(1, 255))
        else:
            del rec[draw(st.integers(0, len(rec))):]
        records[i] = bytes(rec)
    names = ((1, b"values"), (2, b"values"), (1, b"absent"))
    kinds = ({np.float32: 2, np.float64: 3, np.int32: 7}[dtype], 2, draw(st.sampled_from([2, 3, 7, 9])))
    return records, names, kinds


def _run(fn, records, names, kinds):
    try:
        return fn(records, names, kinds)
    except _WireError as exc:
        return ("error", exc.message, exc.index, exc.field)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(record_batches())
def test_vectorised_path_equals_reference_parser(batch):
    records, names, kinds = batch
    want = _run(parse_recordio_protobuf, records, names, kinds)
    got = _run(parse_recordio_protobuf_fast, records, names, kinds)
    if want[0] == "error":
        assert got == want
        return
    for mine, ref in zip(got, want):
        if isinstance(ref, list):
            for a, b in zip(mine, ref):
                if isinstance(b, list):
                    assert list(a) == b
                else:
                    assert a.dtype == b.dtype
                    np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_array_equal(mine, ref)


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=10), st.booleans())
def test_garbage_gives_values_or_decode_error(records, prime_with_valid):
    decoder = RecordIOProtobuf()
    if prime_with_valid:
        decoder.decode_batch(encode_recordio_protobuf(np.ones((1, 2), np.float32), np.ones(1)))
    try:
        out = decoder.decode_batch(records, source="junk", first_index=10)
    except DecodeError as err:
        assert err.source == "junk"
        assert err.record_index is None or 10 <= err.record_index < 10 + len(records)
    else:
        assert all(len(v) == len(records) for v in out.values())


@pytest.mark.parametrize("accelerate", [True, False])
def test_bad_keys_name_their_own_record_not_an_earlier_negative_float(accelerate, monkeypatch):
    # float32 -1.0 ends in byte 0xBF, which would look like an unfinished varint if float values
    # were (wrongly) checked as varints when looking for the faulty record.
    from streamio import SparseBatch, errors
    from streamio.decoders import RecordIOProtobuf, encode_recordio_protobuf
    from streamio.decoders import recordio_protobuf as rp

    if not accelerate:
        monkeypatch.setattr(rp, "_c_parse_recordio_protobuf", None)
    csr = SparseBatch(indptr=np.array([0, 1, 2]), indices=np.array([3, 300]),
                      values=np.array([-1.0, -1.0], dtype=np.float32), shape=(2, 400))
    good, bad = encode_recordio_protobuf(csr)
    assert bad.count(b"\xac\x02") == 1  # key 300 as a varint
    bad = bad.replace(b"\xac\x02", b"\xac\x82")  # now the varint runs past its piece
    with pytest.raises(errors.DecodeError) as info:
        RecordIOProtobuf().decode_batch([good, bad], source="s", first_index=10)
    assert info.value.record_index == 11 and info.value.field == "values"


# --- hostile shapes and keys (issue 10, finding 5) ---------------------------------------------------

def hand_record(values=None, keys=None, shape=None, key=b"values", section=1, kind=2):
    """One ``Record`` with a float32 (kind 2) tensor, written field by field so that any uint64
    shape or key can be put on the wire, as a hostile or broken writer could."""
    body = b""
    if values is not None:
        body += field(1, np.asarray(values, "<f4").tobytes())
    if keys is not None:
        body += field(2, varints(keys))
    if shape is not None:
        body += field(3, varints(shape))
    return field(section, field(1, key) + field(2, field(kind, body)))


GOOD_SPARSE = hand_record([1.0], [3], [10])
HOSTILE = {
    "dims whose product overflows int64": hand_record([1.0], [0], [2 ** 40, 2 ** 40]),
    "dims whose product overflows uint64": hand_record([1.0], [0], [2 ** 63 - 1, 4]),
    "a negative dimension (int64 -5 on the wire)": hand_record([1.0], [0], [2 ** 64 - 5]),
    "a dimension of 2**63": hand_record([1.0], [0], [2 ** 63]),
    "a key of 2**63": hand_record([1.0], [2 ** 63], [10]),
    "a key of 2**64 - 1": hand_record([1.0], [2 ** 64 - 1], [10]),
    "a key beyond the declared shape": hand_record([1.0], [10], [10]),
    "a key in a zero-width shape": hand_record([1.0], [0], [0]),
    "more values than keys": hand_record([1.0, 2.0], [1], [10]),
    "more keys than values": hand_record([1.0], [1, 2], [10]),
    "keys but no shape": hand_record([1.0], [1]),
    "a dense tensor whose shape disagrees with its values": hand_record([1.0, 2.0], None, [3]),
}


@pytest.mark.parametrize("accelerate", [True, False], ids=["c", "python"])
# A later row may leave out the shape (the first record's holds), so "keys but no shape" is
# only nonsense in the first record.
@pytest.mark.parametrize("case,position", [(case, position) for case in sorted(HOSTILE)
                                           for position in ("first", "later")
                                           if (case, position) != ("keys but no shape", "later")])
def test_hostile_shapes_and_keys_raise_decode_error(case, position, accelerate, monkeypatch):
    from streamio.decoders import recordio_protobuf as rp

    if not accelerate:
        monkeypatch.setattr(rp, "_c_parse_recordio_protobuf", None)
    elif rp._c_parse_recordio_protobuf is None:
        pytest.skip("the C extension is not built")
    records = [HOSTILE[case]] if position == "first" else [GOOD_SPARSE, GOOD_SPARSE, HOSTILE[case]]
    with pytest.raises(DecodeError) as info:
        RecordIOProtobuf().decode_batch(records, source="hostile.pbr", first_index=40)
    assert info.value.source == "hostile.pbr"
    assert info.value.record_index == 40 + len(records) - 1
    assert info.value.field == "values"


def test_widest_legal_shape_reads_and_converts_to_torch():
    torch = pytest.importorskip("torch")
    from streamio.torch import convert_batch

    out = RecordIOProtobuf().decode_batch([hand_record([2.0], [2 ** 63 - 2], [2 ** 63 - 1])])
    assert out["values"].shape == (1, 2 ** 63 - 1)
    tensor = convert_batch(out)["values"]
    assert tensor.layout == torch.sparse_csr and tensor.shape == (1, 2 ** 63 - 1)


def test_sparse_batch_beyond_int64_is_refused_and_to_torch_says_why(tmp_path):
    torch = pytest.importorskip("torch")
    from streamio.torch import convert_batch

    with pytest.raises(ValueError, match="2\\*\\*63"):
        SparseBatch([0, 1], [0], np.ones(1, np.float32), (1, 2 ** 64 - 5))
    # A stream with a negative dimension, read through to_torch: our error, no torch TypeError.
    path = frame([GOOD_SPARSE, HOSTILE["a negative dimension (int64 -5 on the wire)"]], tmp_path)
    ds = streamio.Dataset(str(path), "recordio", decoder=RecordIOProtobuf()).batch(2)
    with pytest.raises(DecodeError) as info:
        list(torch.utils.data.DataLoader(ds.to_torch(), batch_size=None))
    assert info.value.record_index == 1 and info.value.field == "values"
    # A SparseBatch altered after it was built (shape is a plain attribute) is named, too.
    batch = SparseBatch([0, 1], [0], np.ones(1, np.float32), (1, 4))
    batch.shape = (1, 2 ** 64 - 5)
    with pytest.raises(DecodeError, match="cannot become a torch sparse tensor"):
        convert_batch(batch)


# Any uint64, with the edges where int64 and uint64 arithmetic break drawn often.
_UINT64 = st.one_of(st.integers(0, 2 ** 64 - 1),
                    st.sampled_from([2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 5,
                                     2 ** 64 - 1]))


@st.composite
def mutated_records(draw):
    """Valid records (dense, sparse, labelled), then wire-level nonsense: arbitrary uint64 shapes
    and keys, flipped, inserted and deleted bytes, truncation."""
    records = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            width = draw(st.integers(1, 6))
            nnz = draw(st.integers(0, width))
            keys = draw(st.one_of(st.just(list(range(nnz))),
                                  st.lists(st.one_of(st.integers(0, 12), _UINT64), max_size=4)))
            shape = draw(st.one_of(st.just([width]), st.lists(st.one_of(st.integers(0, 8), _UINT64),
                                                              max_size=3)))
            values = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=len(keys),
                                   max_size=len(keys) + draw(st.integers(0, 1))))
            rec = hand_record(values, keys, shape)
        else:
            rec = encode_recordio_protobuf(np.ones((1, 3), np.float32), np.ones(1))[0]
        rec = bytearray(rec)
        for _ in range(draw(st.integers(0, 3))):
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            at = draw(st.integers(0, len(rec)))
            if op == "flip" and at < len(rec):
                rec[at] ^= draw(st.integers(1, 255))
            elif op == "insert":
                rec[at:at] = draw(st.binary(min_size=1, max_size=11))
            elif op == "delete":
                del rec[at:at + draw(st.integers(1, 4))]
            else:
                del rec[at:]
        records.append(bytes(rec))
    return records


@pytest.mark.parametrize("accelerate", [True, False], ids=["c", "python"])
def test_mutated_records_give_records_or_decode_error(accelerate, monkeypatch):
    pytest.importorskip("torch")
    from streamio.decoders import recordio_protobuf as rp
    from streamio.torch import convert_batch

    if not accelerate:
        monkeypatch.setattr(rp, "_c_parse_recordio_protobuf", None)
    elif rp._c_parse_recordio_protobuf is None:
        pytest.skip("the C extension is not built")

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mutated_records())
    def check(records):
        try:
            out = RecordIOProtobuf().decode_batch(records, source="m", first_index=5)
        except DecodeError as err:
            assert err.source == "m"
            assert err.record_index is None or 5 <= err.record_index < 5 + len(records)
            return
        for value in out.values():
            assert len(value) == len(records)
        converted = convert_batch(out)  # never a torch TypeError
        for name, value in out.items():
            if isinstance(value, SparseBatch):
                assert tuple(converted[name].shape) == value.shape
                assert value.shape[1] <= 2 ** 63 - 1

    check()


# --- to_dense sums duplicates (issue 15, item 3) -----------------------------------------------------

def test_to_dense_sums_duplicate_entries_as_scipy_and_torch_do():
    batch = SparseBatch([0, 3, 4], [1, 1, 2, 0], np.array([1.5, 2.0, 4.0, 7.0], np.float32), (2, 3))
    want = np.array([[0, 3.5, 4.0], [7.0, 0, 0]], np.float32)
    np.testing.assert_array_equal(batch.to_dense(), want)
    scipy_sparse = pytest.importorskip("scipy.sparse")
    csr = scipy_sparse.csr_matrix((batch.values, batch.indices, batch.indptr), shape=batch.shape)
    np.testing.assert_array_equal(batch.to_dense(), csr.toarray())
    pytest.importorskip("torch")
    from streamio.torch import convert_batch
    np.testing.assert_array_equal(batch.to_dense(), convert_batch(batch).to_dense().numpy())


def test_duplicate_keys_in_a_record_are_summed_like_scipy():
    out = RecordIOProtobuf().decode_batch([hand_record([1.0, 2.0, 5.0], [4, 4, 0], [6])])
    assert out["values"].to_dense().tolist() == [[5.0, 0, 0, 0, 3.0, 0]]
    fixed = RecordIOProtobuf(features={"values": FixedLen([6], "float32")})
    assert fixed.decode_batch([hand_record([1.0, 2.0], [4, 4], [6])])["values"].tolist() == [
        [0, 0, 0, 0, 3.0, 0]]


# --- label-only records (issue 15, item 6) -----------------------------------------------------------

def test_label_only_records_as_linear_learner_and_kmeans_write_them(tmp_path):
    # Linear Learner's RecordIO-protobuf output: label map {score, predicted_label}, no features;
    # KMeans': {closest_cluster, distance_to_cluster}.
    def output_record(**labels):
        return b"".join(field(2, field(1, k.encode()) + field(2, field(2, field(
            1, np.array([v], "<f4").tobytes())))) for k, v in labels.items())

    linear = [output_record(score=0.25 * i, predicted_label=float(i % 2)) for i in range(5)]
    path = frame(linear, tmp_path, "linear.out")
    out = decode(path)
    assert sorted(out) == ["label_predicted_label", "label_score"]
    np.testing.assert_array_equal(out["label_score"][:, 0], [0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(out["label_predicted_label"][:, 0], [0, 1, 0, 1, 0])
    kmeans = [output_record(closest_cluster=3.0, distance_to_cluster=1.5)]
    out = RecordIOProtobuf().decode_batch(kmeans)
    assert out["label_closest_cluster"].tolist() == [[3.0]]
    # Selecting only the label works too, and a record with no tensor at all is still refused.
    assert RecordIOProtobuf(label=["score"]).decode_batch(linear[:1])["label_score"].tolist() == [[0.0]]
    with pytest.raises(DecodeError, match="no features and no label"):
        RecordIOProtobuf().decode_batch([field(3, b"uid-only")])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(-50, 50)), max_size=8),
                min_size=1, max_size=6))
def test_to_dense_equals_scipy_for_any_order_and_duplicates(rows):
    scipy_sparse = pytest.importorskip("scipy.sparse")
    indptr = np.concatenate(([0], np.cumsum([len(r) for r in rows])))
    cols = np.array([c for r in rows for c, _ in r], dtype=np.int64)
    vals = np.array([v for r in rows for _, v in r], dtype=np.float32)
    batch = SparseBatch(indptr, cols, vals, (len(rows), 6))
    csr = scipy_sparse.csr_matrix((vals, cols, indptr), shape=(len(rows), 6))
    np.testing.assert_array_equal(batch.to_dense(), csr.toarray())

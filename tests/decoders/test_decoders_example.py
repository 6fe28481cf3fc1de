"""tf.train.Example / SequenceExample decoding: equal to TensorFlow's own parser, fast path equal
to the reference parser, garbage ends in DecodeError."""

from __future__ import annotations

import importlib.util
import json
import pickle
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio.decoders import Example, FieldSpec, FixedLen, SequenceExample, VarLen
from streamio.decoders.wire import _WireError, encode_packed_varints, encode_varint
from streamio.decoders.example import parse_examples, parse_examples_fast
from streamio.errors import DecodeError, FormatError

from conftest import FIXTURES, ROOT

EXAMPLES = FIXTURES / "examples"


# --- helpers -------------------------------------------------------------------------------------

def _len_field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def encode_feature(kind: int, values, packed: bool = True) -> bytes:
    """A serialized tf.train.Feature (kind 0: no list set), packed or not."""
    if kind == 0:
        return b""
    if kind == 1:
        body = b"".join(_len_field(1, v) for v in values)
    elif kind == 2:
        if packed:
            body = _len_field(1, struct.pack(f"<{len(values)}f", *values)) if values else b""
        else:
            body = b"".join(b"\x0d" + struct.pack("<f", v) for v in values)
    else:
        if packed:
            body = _len_field(1, encode_packed_varints(np.array(values, dtype=np.int64))) if values else b""
        else:
            body = b"".join(b"\x08" + encode_varint(v & (2 ** 64 - 1)) for v in values)
    return _len_field(kind, body)


def encode_example(features) -> bytes:
    """features: list of (key bytes, kind, values, packed); order and duplicates kept."""
    entries = b"".join(_len_field(1, _len_field(1, key) + _len_field(2, encode_feature(kind, values, packed)))
                       for key, kind, values, packed in features)
    return _len_field(1, entries)


def tfrecords(path) -> list:
    return list(streamio.read_records(str(path), "tfrecord"))


def _spec(entries: dict, sequence: bool = False) -> dict:
    # The fixture's sequence features were parsed by TF with allow_missing=True (make_examples.py).
    return {name: FixedLen(s["shape"], s["dtype"], s["default"], allow_missing=sequence)
            if s["kind"] == "fixed" else VarLen(s["dtype"]) for name, s in entries.items()}


def _expected(entry: dict) -> np.ndarray:
    if entry["dtype"] == "bytes":
        arr = np.empty(len(entry["values"]), dtype=object)
        arr[:] = [bytes.fromhex(v) for v in entry["values"]]
        return arr.reshape(entry["shape"])
    return np.array(entry["values"], dtype=entry["dtype"]).reshape(entry["shape"])


def assert_batches_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# --- equal to TensorFlow ---------------------------------------------------------------------------

def test_examples_written_by_tensorflow_decode_as_tensorflow_parses_them():
    doc = json.loads((EXAMPLES / "examples.json").read_text())
    records = tfrecords(EXAMPLES / "examples.tfrecord")
    decoder = Example(_spec(doc["features"]))
    want = {name: _expected(entry) for name, entry in doc["expected"].items()}
    assert_batches_equal(decoder.decode_batch(records), want)
    # Repeated so that records of one length are many enough for the vectorised path.
    many = decoder.decode_batch(records * 20)
    for name, arr in want.items():
        np.testing.assert_array_equal(many[name][len(records):2 * len(records)], arr, err_msg=name)
        assert many[name].flags.writeable, name  # torch.from_numpy takes it as it is


def test_sequence_examples_written_by_tensorflow_decode_as_tensorflow_parses_them():
    doc = json.loads((EXAMPLES / "sequence_examples.json").read_text())
    records = tfrecords(EXAMPLES / "sequence_examples.tfrecord")
    decoder = SequenceExample(_spec(doc["context"]), _spec(doc["sequence"], sequence=True))
    got = decoder.decode_batch(records)
    assert_batches_equal(got, {name: _expected(entry) for name, entry in doc["expected"].items()})
    assert set(decoder.output_spec()) == set(got)


def test_batch_size_does_not_change_fixed_features_and_varlen_rows():
    doc = json.loads((EXAMPLES / "examples.json").read_text())
    records = tfrecords(EXAMPLES / "examples.tfrecord") * 4
    decoder = Example(_spec(doc["features"]))
    whole = decoder.decode_batch(records)
    for size in (1, 3, 9, 16):
        parts = [decoder.decode_batch(records[i:i + size]) for i in range(0, len(records), size)]
        for name, spec in decoder.features.items():
            if isinstance(spec, FixedLen):
                np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), whole[name])
            else:  # padding width depends on the batch; the values of each row do not
                rows = [list(p[name][r, :p[name + "_len"][r]]) for p in parts for r in range(len(p[name]))]
                want = [list(whole[name][r, :whole[name + "_len"][r]]) for r in range(len(records))]
                assert rows == want


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_random_examples_decode_as_tensorflow_parses_them():
    # TensorFlow runs in its own process: a pytest process that imported it must not fork
    # DataLoader workers later.
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import tensorflow as tf
        from streamio.decoders import Example, FixedLen, VarLen

        rng = np.random.default_rng(5)
        records = []
        for i in range(300):
            f = {}
            if rng.random() < 0.9:
                f["x"] = tf.train.Feature(float_list=tf.train.FloatList(value=rng.standard_normal(4)))
            f["y"] = tf.train.Feature(int64_list=tf.train.Int64List(
                value=[int(v) for v in rng.integers(-2**62, 2**62, size=int(rng.integers(0, 4)))]))
            f["s"] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[rng.bytes(int(rng.integers(0, 6))) for _ in range(int(rng.integers(0, 3)))]))
            f["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 7]))
            records.append(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
        tf_spec = {"x": tf.io.FixedLenFeature([4], tf.float32, default_value=[0.5] * 4),
                   "y": tf.io.VarLenFeature(tf.int64), "s": tf.io.VarLenFeature(tf.string),
                   "label": tf.io.FixedLenFeature([], tf.int64)}
        ours = Example({"x": FixedLen(4, "float32", 0.5), "y": VarLen("int64"), "s": VarLen("bytes"),
                        "label": FixedLen((), "int64")})
        for start in range(0, 300, 64):
            batch = records[start:start + 64]
            want = tf.io.parse_example(batch, tf_spec)
            got = ours.decode_batch(batch)
            np.testing.assert_array_equal(got["x"], want["x"].numpy())
            np.testing.assert_array_equal(got["label"], want["label"].numpy())
            for name, pad in (("y", 0), ("s", b"")):
                dense = tf.sparse.to_dense(want[name], default_value=pad).numpy()
                assert got[name].shape == dense.shape, name
                assert (got[name] == dense).all(), name
                lengths = np.bincount(want[name].indices.numpy()[:, 0], minlength=len(batch))
                np.testing.assert_array_equal(got[name + "_len"], lengths)
        print("agree")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=str(ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "agree" in result.stdout


def test_examples_read_from_a_fifo_decode_like_the_file(fifo):
    doc = json.loads((EXAMPLES / "examples.json").read_text())
    data = (EXAMPLES / "examples.tfrecord").read_bytes() * 5
    decoder = Example(_spec(doc["features"]))
    records = list(streamio.read_records(fifo.make(data, 3, 101, 17), "tfrecord"))
    want = {name: _expected(entry) for name, entry in doc["expected"].items()}
    got = decoder.decode_batch(records, source="fifo")
    for name, arr in want.items():
        if arr.ndim == 2 and name.startswith("v"):  # VarLen: same width, repeated 5 times
            np.testing.assert_array_equal(got[name][:len(arr)], arr)
        else:
            np.testing.assert_array_equal(got[name], np.concatenate([arr] * 5))


# --- errors name the record and the feature ---------------------------------------------------------

def _records(*rows):
    return [encode_example(row) for row in rows]


GOOD = [(b"x", 2, [1.0, 2.0], True), (b"label", 3, [1], True)]


def test_missing_feature_without_default_names_the_record():
    records = _records(GOOD, GOOD, [(b"x", 2, [1.0, 2.0], True)])
    decoder = Example({"x": FixedLen(2, "float32"), "label": FixedLen((), "int64")})
    with pytest.raises(DecodeError) as info:
        decoder.decode_batch(records, source="train.tfrecord", first_index=40)
    err = info.value
    assert (err.source, err.record_index, err.field) == ("train.tfrecord", 42, "label")
    assert "missing" in str(err) and "record 42" in str(err)


def test_missing_feature_with_default_and_empty_feature_take_the_default():
    records = _records(GOOD, [(b"x", 2, [3.0, 4.0], True)], [(b"x", 2, [5.0, 6.0], True), (b"label", 0, [], True)])
    out = Example({"x": FixedLen(2, "float32"), "label": FixedLen((), "int64", default=-1)}).decode_batch(records)
    np.testing.assert_array_equal(out["label"], [1, -1, -1])


@pytest.mark.parametrize("row, message", [
    ([(b"x", 3, [1, 2], True), (b"label", 3, [1], True)], "int64_list, expected a float_list"),
    ([(b"x", 2, [1.0, 2.0, 3.0], True), (b"label", 3, [1], True)], "3 values, expected 2"),
])
def test_wrong_type_or_length_names_record_and_feature(row, message):
    records = _records(GOOD, GOOD, GOOD, row)
    decoder = Example({"x": FixedLen(2, "float32"), "label": FixedLen((), "int64")})
    with pytest.raises(DecodeError, match=message) as info:
        decoder.decode_batch(records, first_index=7)
    assert (info.value.record_index, info.value.field) == (10, "x")


def test_int32_cast_rejects_values_that_do_not_fit():
    records = _records([(b"n", 3, [5], True)], [(b"n", 3, [2 ** 31], True)])
    decoder = Example({"n": FixedLen((), "int32")})
    with pytest.raises(DecodeError, match="does not fit in int32") as info:
        decoder.decode_batch(records)
    assert info.value.record_index == 1


def test_casts_and_unpacked_encodings():
    records = _records([(b"f", 2, [1.5, 2.5], False), (b"i", 3, [-3, 2 ** 40], False)],
                       [(b"f", 2, [0.25], True), (b"f", 1, [b"ignored"], True), (b"f", 2, [7.0, 8.0], True),
                        (b"i", 3, [4, 5], True)])
    out = Example({"f": FixedLen(2, "float64"), "i": VarLen("int64", pad_value=-9)}).decode_batch(records)
    assert out["f"].dtype == np.float64
    np.testing.assert_array_equal(out["f"], [[1.5, 2.5], [7.0, 8.0]])  # last map entry wins
    np.testing.assert_array_equal(out["i"], [[-3, 2 ** 40], [4, 5]])


def test_output_spec_describes_the_batches():
    decoder = Example({"img": FixedLen((2, 2), "float32"), "tags": VarLen("bytes"), "id": FixedLen((), "int64")})
    spec = decoder.output_spec()
    assert spec == {"img": FieldSpec("dense", np.float32, (2, 2)), "tags": FieldSpec("object", object, (None,)),
                    "tags_len": FieldSpec("dense", np.int64, ()), "id": FieldSpec("dense", np.int64, ())}
    out = decoder.decode_batch(_records([(b"img", 2, [1, 2, 3, 4], True), (b"tags", 1, [b"a"], True),
                                         (b"id", 3, [9], True)]))
    for name, field in spec.items():
        assert out[name].dtype == field.dtype
        assert len(out[name].shape) == len(field.shape) + 1


def test_decoder_pickles_and_keeps_decoding():
    decoder = Example({"x": FixedLen(2, "float32", default=0), "s": VarLen("bytes")})
    clone = pickle.loads(pickle.dumps(decoder))
    records = _records(GOOD, [(b"s", 1, [b"q"], True)])
    assert_batches_equal(clone.decode_batch(records), decoder.decode_batch(records))


@pytest.mark.parametrize("make, error", [
    (lambda: FixedLen(3, "complex64"), ValueError),
    (lambda: FixedLen(-1, "float32"), ValueError),
    (lambda: FixedLen((2,), "float32", default=[1, 2, 3]), ValueError),
    (lambda: FixedLen((), "int64", default=1.5), ValueError),
    (lambda: VarLen("int64", pad_value="x"), TypeError),
    (lambda: Example([("x", FixedLen(1, "float32"))]), TypeError),
    (lambda: Example({"x": VarLen("float32"), "x_len": FixedLen((), "int64")}), ValueError),
    (lambda: SequenceExample({"a": FixedLen((), "int64")}, {"a": FixedLen((), "int64")}), ValueError),
])
def test_bad_specs_fail_at_construction(make, error):
    with pytest.raises(error):
        make()


def test_sequence_example_errors_name_record_and_feature():
    def seq(steps):
        lists = _len_field(1, _len_field(1, b"s") + _len_field(2, b"".join(
            _len_field(1, encode_feature(2, step)) for step in steps)))
        return _len_field(2, lists)

    decoder = SequenceExample({}, {"s": FixedLen(2, "float32")})
    with pytest.raises(DecodeError, match="a step has 1 values") as info:
        decoder.decode_batch([seq([[1.0, 2.0]]), seq([[1.0, 2.0], [3.0]])], source="s", first_index=3)
    assert (info.value.record_index, info.value.field) == (4, "s")
    out = decoder.decode_batch([seq([[1.0, 2.0]]), seq([])])
    np.testing.assert_array_equal(out["s_len"], [1, 0])
    assert out["s"].shape == (2, 1, 2)


# --- the vectorised path equals the reference parser ------------------------------------------------

FLOATS = st.floats(width=32, allow_nan=False)
INTS = st.integers(-(2 ** 63), 2 ** 63 - 1)


@st.composite
def example_batches(draw):
    """Batches in which most records share one layout (as one writer makes them), some not."""
    schema = draw(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"dd"]), st.integers(0, 3),
                                     st.integers(0, 4), st.booleans()), min_size=1, max_size=5))
    small_ints = draw(st.booleans())
    rows = []
    for _ in range(draw(st.integers(1, 40))):
        row = []
        for key, kind, n, packed in schema:
            if kind == 1:
                values = draw(st.lists(st.binary(min_size=2, max_size=2), min_size=n, max_size=n))
            elif kind == 2:
                values = draw(st.lists(FLOATS, min_size=n, max_size=n))
            elif kind == 3:
                values = draw(st.lists(st.integers(0, 127) if small_ints else INTS, min_size=n, max_size=n))
            else:
                values = []
            row.append((key, kind, values, packed))
        if draw(st.integers(0, 9)) == 0:  # an odd one out: different length, extra feature
            row.append((b"extra", 2, [1.0] * draw(st.integers(0, 3)), True))
        rows.append(encode_example(row))
    # A few damaged records: flipped or cut bytes.
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(rows) - 1))
        rec = bytearray(rows[i])
        if rec and draw(st.booleans()):
            rec[draw(st.integers(0, len(rec) - 1))] ^= draw(st.integers(1, 255))
        else:
            del rec[draw(st.integers(0, len(rec))):]
        rows[i] = bytes(rec)
    names = tuple(sorted({key for key, *_ in schema} | {b"zz"}))
    kinds = tuple(draw(st.sampled_from([1, 2, 3])) if name == b"zz" else
                  next(kind for key, kind, *_ in schema if key == name) or 2 for name in names)
    return rows, names, kinds


def _parse(fn, records, names, kinds):
    try:
        return fn(records, names, kinds)
    except _WireError as exc:
        return ("error", exc.message, exc.index, exc.field)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(example_batches())
def test_vectorised_path_equals_reference_parser(batch):
    records, names, kinds = batch
    want = _parse(parse_examples, records, names, kinds)
    got = _parse(parse_examples_fast, records, names, kinds)
    if isinstance(want, tuple) and want and want[0] == "error":
        assert got == want
        return
    values, counts = got
    np.testing.assert_array_equal(counts, want[1])
    for mine, ref in zip(values, want[0]):
        if isinstance(ref, list):
            assert list(mine) == ref
        else:
            assert mine.dtype == ref.dtype
            np.testing.assert_array_equal(mine, ref)


# --- the reference parser equals protobuf's own (upb), on random and damaged bytes ----------------------

def _protobuf_example_class():
    """tf.train.Example's schema in a private descriptor pool (never TensorFlow's names in the
    default pool: that breaks a later `import tensorflow`)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    T = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="streamio_test/example.proto",
                                             package="streamio_test", syntax="proto3")

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, typ, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=typ, label=label)
            if type_name:
                f.type_name = type_name
        return m

    message("BytesList", [("value", 1, T.TYPE_BYTES, T.LABEL_REPEATED, None)])
    message("FloatList", [("value", 1, T.TYPE_FLOAT, T.LABEL_REPEATED, None)])
    message("Int64List", [("value", 1, T.TYPE_INT64, T.LABEL_REPEATED, None)])
    feature = message("Feature", [
        ("bytes_list", 1, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".streamio_test.BytesList"),
        ("float_list", 2, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".streamio_test.FloatList"),
        ("int64_list", 3, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".streamio_test.Int64List")])
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", [("feature", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED,
                                     ".streamio_test.Features.FeatureEntry")])
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".streamio_test.Feature")
    message("Example", [("features", 1, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".streamio_test.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("streamio_test.Example"))


_ProtoExample = _protobuf_example_class()
_KIND_FIELDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}


@st.composite
def wire_records(draw):
    """Examples with protobuf's odd corners (duplicate keys, a oneof set twice, unpacked lists,
    unknown fields), then maybe damaged."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from([b"a", b"b", b""]))
        body = b""
        for _ in range(draw(st.integers(0, 2))):
            kind = draw(st.integers(1, 3))
            values = draw(st.lists({1: st.binary(max_size=3), 2: FLOATS, 3: INTS}[kind], max_size=3))
            body += encode_feature(kind, values, draw(st.booleans()))
        if draw(st.booleans()):
            body += b"\x20\x05"  # unknown field 4, varint
        parts.append(_len_field(1, _len_field(1, key) + _len_field(2, body)))
    record = _len_field(1, b"".join(parts))
    if draw(st.booleans()):
        record += _len_field(1, b"".join(parts[:1]))  # Features given twice: merged
    mutation = draw(st.integers(0, 3))
    data = bytearray(record)
    if mutation == 1 and data:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif mutation == 2:
        del data[draw(st.integers(0, len(data))):]
    elif mutation == 3:
        data[draw(st.integers(0, len(data))):0] = draw(st.binary(max_size=6))
    return bytes(data)


def _unknown_fields(message) -> int:
    try:
        from google.protobuf import unknown_fields
    except ImportError:  # older protobuf: the method on the message
        return len(message.UnknownFields())
    return len(unknown_fields.UnknownFieldSet(message))


@settings(max_examples=400)
@given(wire_records(), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3]))
def test_reference_parser_agrees_with_protobuf(record, kind_a, kind_b):
    names, kinds = (b"a", b"b"), (kind_a, kind_b)
    message = _ProtoExample()
    try:
        message.ParseFromString(record)
    except Exception:
        return  # protobuf rejects it (ours may be more lenient, e.g. about UTF-8 keys)
    if _unknown_fields(message.features):
        # upb keeps a map entry that holds an unknown field (a damaged key tag, say) as an
        # unknown field of the map's message instead of inserting it, so the oracle's map
        # misses an entry that protobuf's other runtimes, and we, take (the last one wins).
        return
    try:
        values, counts = parse_examples([record], names, kinds)
    except _WireError as exc:
        # Only a value list of the wrong kind may fail where protobuf parses.
        assert "expected a" in exc.message, exc.message
        return
    for j, name in enumerate(("a", "b")):
        feature = message.features.feature.get(name)
        kind = feature.WhichOneof("kind") if feature is not None else None
        if kind is None:
            assert counts[0, j] == -1
            continue
        want = list(getattr(feature, kind).value)
        assert counts[0, j] == len(want)
        got = values[j]
        if kinds[j] == 2:
            np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))
        else:
            assert list(got) == want


def test_a_map_entry_with_an_unknown_field_still_replaces_the_earlier_one():
    # features {a: {}, b: float_list [0, 0, 0]} then an entry for b whose second key tag has the
    # wrong wire type (an unknown field): it has no value, so b is an empty Feature (missing),
    # as protobuf's C++ runtime has it. (upb, the Python oracle above, keeps the 3 floats.)
    record = (b"\n'\n\x05\n\x01a\x12\x00\n\x17\n\x01b\x12\x12\x12\x0e\n\x0c" + bytes(12)
              + b" \x05\n\x05\n\x01b\x08\x00")
    _, counts = parse_examples([record], (b"a", b"b"), (2, 2))
    assert counts.tolist() == [[-1, -1]]


# --- garbage ends in DecodeError ----------------------------------------------------------------------

@settings(max_examples=300)
@given(st.lists(st.binary(max_size=60), min_size=1, max_size=12), st.integers(0, 10 ** 6))
def test_garbage_gives_values_or_decode_error(records, first_index):
    decoders = [Example({"a": VarLen("float32"), "b": FixedLen((), "int64", default=0), "c": VarLen("bytes")}),
                SequenceExample({"a": VarLen("int64")}, {"b": VarLen("float32"), "c": FixedLen((), "bytes", b"")})]
    for decoder in decoders:
        try:
            out = decoder.decode_batch(records, source="junk", first_index=first_index)
        except DecodeError as err:
            assert isinstance(err, FormatError)
            assert err.source == "junk"
            assert err.record_index is None or first_index <= err.record_index < first_index + len(records)
        else:
            assert all(len(v) == len(records) for v in out.values())


def test_encode_example_round_trips_every_feature_kind():
    from streamio import encode_example

    rows = [{"f": [1.5, -2.0], "i": [3, -4], "b": [b"x", "y"], "s": 7},
            {"f": np.array([0.25, 8.0], dtype=np.float64), "i": np.array([-1, 2**40]), "b": b"z",
             "s": True}]
    decoder = Example({"f": FixedLen([2], "float32"), "i": FixedLen([2], "int64"),
                       "b": VarLen("bytes"), "s": FixedLen([], "int64")})
    batch = decoder.decode_batch([encode_example(r) for r in rows])
    np.testing.assert_array_equal(batch["f"], [[1.5, -2.0], [0.25, 8.0]])
    np.testing.assert_array_equal(batch["i"], [[3, -4], [-1, 2**40]])
    assert batch["b"].tolist() == [[b"x", b"y"], [b"z", b""]]
    np.testing.assert_array_equal(batch["b_len"], [2, 1])
    np.testing.assert_array_equal(batch["s"], [7, 1])


# --- an absent FixedLen feature list is required, as in TF (issue 15, item 4) -------------------------

def _seq_record(lists):
    """A SequenceExample with the given ``{name: [step values]}`` feature lists (float steps)."""
    entries = b"".join(_len_field(1, _len_field(1, name) + _len_field(2, b"".join(
        _len_field(1, encode_feature(2, step)) for step in steps))) for name, steps in lists.items())
    return _len_field(2, entries)


def test_absent_fixedlen_feature_list_is_required_unless_allow_missing():
    records = [_seq_record({b"s": [[1.0], [2.0]], b"v": [[1.0]]}), _seq_record({b"v": []}),
               _seq_record({b"s": [], b"v": [[3.0]]})]
    strict = SequenceExample({}, {"s": FixedLen((), "float32"), "v": VarLen("float32")})
    with pytest.raises(DecodeError, match="feature list 's' is required") as info:
        strict.decode_batch(records, source="seq", first_index=7)
    assert (info.value.source, info.value.record_index, info.value.field) == ("seq", 8, "s")
    # Present but empty is 0 steps, and an absent VarLen list is 0 steps too (as in TF).
    out = strict.decode_batch([records[0], records[2], _seq_record({b"s": [[4.0]]})])
    assert out["s_len"].tolist() == [2, 0, 1] and out["v_len"].tolist() == [1, 1, 0]
    lenient = SequenceExample({}, {"s": FixedLen((), "float32", -1.0, allow_missing=True)})
    out = lenient.decode_batch(records)
    assert out["s_len"].tolist() == [2, 0, 0]
    assert out["s"].tolist() == [[1.0, 2.0], [-1.0, -1.0], [-1.0, -1.0]]


def test_allow_missing_is_kept_by_pickle_and_refused_outside_sequences():
    import pickle

    spec = FixedLen([2], "float32", 0.5, allow_missing=True)
    assert pickle.loads(pickle.dumps(spec)) == spec and "allow_missing=True" in repr(spec)
    assert spec != FixedLen([2], "float32", 0.5)
    with pytest.raises(ValueError, match="allow_missing is for SequenceExample sequence"):
        Example({"x": spec})
    with pytest.raises(ValueError, match="allow_missing"):
        SequenceExample({"x": spec}, {})
    with pytest.raises(ValueError, match="allow_missing"):
        streamio.decoders.RecordIOProtobuf(features={"x": spec})
    with pytest.raises(TypeError):
        FixedLen([2], "float32", allow_missing="yes")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_absent_feature_list_agrees_with_tf_parse_sequence_example():
    # TensorFlow runs in its own process (see test_random_examples_decode_as_tensorflow_parses_them).
    script = textwrap.dedent("""
        import numpy as np
        import tensorflow as tf
        from streamio.decoders import FixedLen, SequenceExample, VarLen
        from streamio.errors import DecodeError

        def record(lists):
            seq = tf.train.SequenceExample()
            seq.context.feature["c"].int64_list.value.append(1)
            for name, steps in lists.items():
                fl = seq.feature_lists.feature_list[name]
                for step in steps:
                    fl.feature.add().float_list.value.extend(step)
            return seq.SerializeToString()

        records = [record({"s": [[1.0, 2.0]], "v": [[1.0]]}), record({"v": [[2.0, 3.0]]}),
                   record({"s": [], "v": []})]
        context = {"c": tf.io.FixedLenFeature([], tf.int64)}
        for allow in (False, True):
            tf_seq = {"s": tf.io.FixedLenSequenceFeature([2], tf.float32, allow_missing=allow),
                      "v": tf.io.VarLenFeature(tf.float32)}
            ours = SequenceExample({"c": FixedLen((), "int64")},
                                   {"s": FixedLen([2], "float32", allow_missing=allow),
                                    "v": VarLen("float32")})
            try:
                _, want, lengths = tf.io.parse_sequence_example(records, context, tf_seq)
            except tf.errors.InvalidArgumentError as exc:
                assert not allow and "is required" in str(exc), exc
                try:
                    ours.decode_batch(records)
                except DecodeError as err:
                    assert "is required" in str(err) and err.record_index == 1, err
                    print("both refuse")
                else:
                    raise AssertionError("TF refused, streamio did not")
                # TF reads the two records that have the list (or an empty one) alike.
                _, want, lengths = tf.io.parse_sequence_example([records[0], records[2]],
                                                                context, tf_seq)
                got = ours.decode_batch([records[0], records[2]])
            else:
                assert allow
                got = ours.decode_batch(records)
                print("both read")
            np.testing.assert_array_equal(got["s"], want["s"].numpy())
            np.testing.assert_array_equal(got["s_len"], lengths["s"].numpy())
            dense = tf.sparse.to_dense(want["v"]).numpy()
            np.testing.assert_array_equal(got["v"][:, :dense.shape[1], :dense.shape[2]], dense)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=str(ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["both", "refuse", "both", "read"]


@pytest.mark.parametrize("dtype", ["float", float])
@pytest.mark.parametrize("feature", [lambda d: FixedLen([2], d), lambda d: VarLen(d)])
def test_the_ambiguous_float_is_refused(feature, dtype):
    # numpy reads "float" as float64, TensorFlow as float32: a guess silently doubled (or would
    # narrow) every value for one camp of users.
    from streamio.errors import UsageError

    with pytest.raises(UsageError, match="ambiguous.*float64.*float32.*write 'float32'"):
        feature(dtype)
    assert FixedLen([2], "float32").dtype == "float32"
    assert FixedLen([2], "double").dtype == "float64"  # unambiguous: float64 in both

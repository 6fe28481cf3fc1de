"""The protobuf kernels (streamio/_c/pb_example.c, pb_recordio.c: parse_examples, parse_sequence_examples,
parse_recordio_protobuf) against the pure-Python parsers they replace: the same arrays bit for
bit, or the same error naming the same record and feature.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

from support.kernels import Mutator, runs_beside  # noqa: E402
from support.protobuf import field, tagged, varint  # noqa: E402

from streamio.decoders.example import parse_examples as example_reference  # noqa: E402
from streamio.decoders.example import parse_sequence_examples as sequence_reference  # noqa: E402
from streamio.decoders.recordio_protobuf import encode_recordio_protobuf  # noqa: E402
from streamio.decoders.recordio_protobuf import parse_recordio_protobuf as protobuf_reference  # noqa: E402,E501

SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.data_too_large])


# --- decode kernels: tf.train.Example -------------------------------------------------------------

EXAMPLE_KEYS = [b"x", b"label", b"tags", b"", b"\xff\xfe"]
unknown_fields = st.lists(st.one_of(
    st.tuples(st.integers(4, 40), st.just(0), st.integers(0, 2 ** 64 - 1).map(varint)),
    st.tuples(st.integers(4, 40), st.just(2), st.binary(max_size=6)),
    st.tuples(st.integers(4, 40), st.just(5), st.binary(min_size=4, max_size=4)),
    st.tuples(st.integers(4, 40), st.just(1), st.binary(min_size=8, max_size=8)),
), max_size=2).map(lambda fs: b"".join(tagged(*f) for f in fs))


GROUP_START = varint(9 << 3 | 3)
BAD_VALUES = {
    1: [GROUP_START * 101, GROUP_START + varint(10 << 3 | 4)],  # too deep; mismatched end
    2: [field(1, b"\0\0\0"), varint(0x0D) + b"\0\0"],  # not 4-byte floats; truncated
    3: [field(1, b"\x01\x81"), field(1, b"\xff" * 10 + b"\x01"),  # cut; 11-byte varint
        varint(0x08) + b"\xff" * 10 + b"\x01", varint(0x08) + b"\xff\xff"],
}


@st.composite
def value_list(draw, kind: int) -> bytes:
    """A BytesList / FloatList / Int64List message, packed or not, maybe with unknown fields."""
    parts = []
    if draw(st.integers(0, 5)) == 0:  # a value list that is wrong inside
        parts.append(draw(st.sampled_from(BAD_VALUES[kind])))
    for _ in range(draw(st.integers(0, 3))):
        if kind == 1:
            parts.append(field(1, draw(st.binary(max_size=8))))
        elif kind == 2:
            floats = draw(st.lists(st.floats(width=32, allow_nan=True), max_size=5))
            packed = b"".join(struct.pack("<f", f) for f in floats)
            if draw(st.booleans()):
                parts.append(field(1, packed))
            else:
                parts.extend(tagged(1, 5, packed[k:k + 4]) for k in range(0, len(packed), 4))
        else:
            ints = draw(st.lists(st.integers(-2 ** 63, 2 ** 64 - 1), max_size=5))
            if draw(st.booleans()):
                parts.append(field(1, b"".join(map(varint, ints))))
            else:
                parts.extend(tagged(1, 0, varint(v)) for v in ints)
        if draw(st.booleans()):
            parts.append(draw(unknown_fields))
    return b"".join(parts)


@st.composite
def feature(draw) -> bytes:
    """A Feature: one value list (sometimes two, switching or repeating the oneof), or none."""
    out = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.integers(1, 3))
        out.append(field(kind, draw(value_list(kind))))
    return b"".join(out)


@st.composite
def example_record(draw) -> bytes:
    entries = []
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.sampled_from(EXAMPLE_KEYS))
        entry = field(1, key) + field(2, draw(feature()))
        if draw(st.integers(0, 9)) == 0:  # a value given twice in one entry: merged
            entry += field(2, draw(feature()))
        entries.append(field(1, entry))
    if draw(st.booleans()):
        entries.append(draw(unknown_fields))
    # Example.features, sometimes split in two occurrences (merged), plus unknown fields
    cut = draw(st.integers(0, len(entries)))
    body = [field(1, b"".join(entries[:cut]))]
    if cut < len(entries):
        body.append(field(1, b"".join(entries[cut:])))
    body.append(draw(unknown_fields))
    return b"".join(draw(st.permutations(body)))


@st.composite
def mutated_record(draw, records) -> bytes:
    data = bytearray(draw(records))
    for _ in range(draw(st.integers(1, 3))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()) and data:
        del data[draw(st.integers(0, len(data) - 1)):]
    return bytes(data)


example_batches = st.lists(st.one_of(example_record(), example_record(), example_record(),
                                     mutated_record(example_record()), st.binary(max_size=30)),
                           max_size=8)
example_specs = st.lists(st.tuples(st.sampled_from(EXAMPLE_KEYS), st.integers(1, 3)),
                         max_size=4)


# The fuzz harness's oracle: the arrays bit for bit (dtype, shape, writability) or the
# _WireError's message, index and field; one definition for both.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
from targets import _normalize, outcome as _outcome  # noqa: E402


def _example_reference():
    example = pytest.importorskip("streamio.decoders.example")
    if not hasattr(speedups, "parse_examples"):
        pytest.skip("this build has no parse_examples kernel")
    return example.parse_examples


@SLOW_OK
@given(records=example_batches, spec=example_specs)
def test_parse_examples_equals_reference(records, spec):
    reference = _example_reference()
    names = tuple(name for name, _ in spec)
    kinds = tuple(kind for _, kind in spec)
    assert _outcome(speedups.parse_examples, records, names, kinds) == \
        _outcome(reference, records, names, kinds)


@SLOW_OK
@given(records=st.lists(example_record(), max_size=8), spec=example_specs)
def test_parse_examples_equals_reference_on_valid_records(records, spec):
    reference = _example_reference()
    names = tuple(name for name, _ in spec)
    kinds = tuple(kind for _, kind in spec)
    assert _outcome(speedups.parse_examples, records, names, kinds) == \
        _outcome(reference, records, names, kinds)


def test_parse_examples_errors_name_the_record_and_feature():
    reference = _example_reference()
    good = field(1, field(1, field(1, b"v") + field(2, field(3, field(1, b"\x01")))))
    wrong_kind = field(1, field(1, field(1, b"v") + field(2, field(2, b""))))
    cutvarint = field(1, field(1, field(1, b"v") + field(2, field(3, field(1, b"\x81")))))
    for batch, expected in [
        ([good, wrong_kind], ("error", "feature holds a float_list, expected a int64_list", 1, "v")),
        ([good, good, cutvarint], ("error", "packed varints end inside a varint", 2, "v")),
        ([good, b"\x0a\x05ab"], ("error", "length-delimited field runs past the end of its message",
                                 1, None)),
    ]:
        got = _outcome(speedups.parse_examples, batch, (b"v",), (3,))
        assert got == _outcome(reference, batch, (b"v",), (3,)) == expected


def test_parse_examples_reads_what_tensorflow_writes():
    tf = pytest.importorskip("tensorflow")
    import numpy as np

    _example_reference()
    records = []
    for i in range(20):
        feats = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, -i / 3, 1e30])),
                 "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i - 10, 2 ** 40])),
                 "tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a" * i]))}
        records.append(tf.train.Example(features=tf.train.Features(feature=feats))
                       .SerializeToString())
    (x, label, tags), counts = speedups.parse_examples(records, (b"x", b"label", b"tags"), (2, 3, 1))
    assert counts.tolist() == [[3, 2, 1]] * 20
    np.testing.assert_array_equal(x.reshape(20, 3)[:, 1], np.float32([-i / 3 for i in range(20)]))
    assert label.reshape(20, 2)[:, 0].tolist() == [i - 10 for i in range(20)]
    assert tags == [b"a" * i for i in range(20)]


def test_parse_examples_accepts_any_bytes_like_records():
    reference = _example_reference()
    record = field(1, field(1, field(1, b"x") + field(2, field(2, field(1, b"\0\0\x80?")))))
    for wrap in (bytes, bytearray, memoryview):
        assert _outcome(speedups.parse_examples, [wrap(record)] * 3, (b"x",), (2,)) == \
            _outcome(reference, [record] * 3, (b"x",), (2,))
    with pytest.raises(ValueError):
        speedups.parse_examples([record], (b"x",), (4,))
    with pytest.raises(TypeError):
        speedups.parse_examples([record], ("x",), (2,))


# --- decode kernels: SageMaker RecordIO-protobuf --------------------------------------------------

RECORD_KEYS = [b"values", b"w", b""]
RECORD_KINDS = [2, 3, 7, 9]
BAD_TENSORS = {
    2: [field(1, b"\0\0"), varint(0x0D) + b"\0", field(2, b"\x05\x80")],  # keys cut
    3: [field(1, b"\0" * 12), varint(0x09) + b"\0" * 7, field(3, b"\xff" * 11)],
    7: [field(1, b"\x01\x80"), varint(0x08) + b"\xff" * 10 + b"\x01"],
    9: [GROUP_START * 101],
}


@st.composite
def tensor(draw, kind: int) -> bytes:
    """A Float32/Float64/Int32 tensor or a Bytes message: values, maybe keys and shape."""
    parts = []
    if draw(st.integers(0, 7)) == 0:
        parts.append(draw(st.sampled_from(BAD_TENSORS[kind])))
    for _ in range(draw(st.integers(0, 2))):
        if kind == 9:
            parts.append(field(1, draw(st.binary(max_size=6))))
            continue
        if kind == 7:
            ints = draw(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), max_size=4))
            if draw(st.booleans()):
                parts.append(field(1, b"".join(map(varint, ints))))
            else:
                parts.extend(tagged(1, 0, varint(v)) for v in ints)
        else:
            fmt = "<f" if kind == 2 else "<d"
            nums = draw(st.lists(st.floats(width=32 if kind == 2 else 64), max_size=4))
            packed = [struct.pack(fmt, v) for v in nums]
            if draw(st.booleans()):
                parts.append(field(1, b"".join(packed)))
            else:
                parts.extend(tagged(1, 5 if kind == 2 else 1, v) for v in packed)
        if draw(st.booleans()):  # keys (sparse), packed or not
            keys = draw(st.lists(st.integers(0, 2 ** 64 - 1), max_size=3))
            if draw(st.booleans()):
                parts.append(field(2, b"".join(map(varint, keys))))
            else:
                parts.extend(tagged(2, 0, varint(k)) for k in keys)
        if draw(st.booleans()):  # shape
            dims = draw(st.lists(st.integers(0, 300), max_size=2))
            if draw(st.booleans()):
                parts.append(field(3, b"".join(map(varint, dims))))
            else:
                parts.extend(tagged(3, 0, varint(d)) for d in dims)
        if draw(st.booleans()):
            parts.append(draw(unknown_fields))
    return b"".join(parts)


@st.composite
def value_message(draw) -> bytes:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(RECORD_KINDS))
        out.append(field(kind, draw(tensor(kind))))
    return b"".join(out)


@st.composite
def protobuf_record(draw) -> bytes:
    fields = []
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.integers(1, 2))
        entry = field(1, draw(st.sampled_from(RECORD_KEYS))) + field(2, draw(value_message()))
        fields.append(field(section, entry))
    if draw(st.booleans()):
        fields.append(draw(unknown_fields))
    return b"".join(fields)


protobuf_batches = st.lists(st.one_of(protobuf_record(), protobuf_record(), protobuf_record(),
                                      mutated_record(protobuf_record()), st.binary(max_size=30)),
                            max_size=8)
protobuf_specs = st.lists(st.tuples(st.tuples(st.integers(1, 2), st.sampled_from(RECORD_KEYS)),
                                    st.sampled_from(RECORD_KINDS)), max_size=4)


def _protobuf_reference():
    module = pytest.importorskip("streamio.decoders.recordio_protobuf")
    if not hasattr(speedups, "parse_recordio_protobuf"):
        pytest.skip("this build has no parse_recordio_protobuf kernel")
    return module.parse_recordio_protobuf


@SLOW_OK
@given(records=protobuf_batches, spec=protobuf_specs)
def test_parse_recordio_protobuf_equals_reference(records, spec):
    reference = _protobuf_reference()
    names = tuple(name for name, _ in spec)
    kinds = tuple(kind for _, kind in spec)
    assert _outcome(speedups.parse_recordio_protobuf, records, names, kinds) == \
        _outcome(reference, records, names, kinds)


@SLOW_OK
@given(records=st.lists(protobuf_record(), max_size=8), spec=protobuf_specs)
def test_parse_recordio_protobuf_equals_reference_on_valid_records(records, spec):
    reference = _protobuf_reference()
    names = tuple(name for name, _ in spec)
    kinds = tuple(kind for _, kind in spec)
    assert _outcome(speedups.parse_recordio_protobuf, records, names, kinds) == \
        _outcome(reference, records, names, kinds)


def test_parse_recordio_protobuf_reads_what_the_encoder_writes():
    import numpy as np

    reference = _protobuf_reference()
    from streamio.decoders.recordio_protobuf import encode_recordio_protobuf

    x = np.arange(24, dtype=np.float32).reshape(6, 4) - 3.5
    y = np.arange(6, dtype=np.float32)
    records = encode_recordio_protobuf(x, y)
    names, kinds = ((1, b"values"), (2, b"values")), (2, 2)
    got = speedups.parse_recordio_protobuf(records, names, kinds)
    assert _outcome(speedups.parse_recordio_protobuf, records, names, kinds) == \
        _outcome(reference, records, names, kinds)
    np.testing.assert_array_equal(got[0][0].reshape(6, 4), x)
    np.testing.assert_array_equal(got[0][1], y)
    assert got[1].tolist() == [[4, 1]] * 6


def test_parse_recordio_protobuf_errors_name_the_record_and_tensor():
    reference = _protobuf_reference()

    def record(kind, tensor_bytes, section=1):
        return field(section, field(1, b"v") + field(2, field(kind, tensor_bytes)))

    good = record(7, field(1, b"\x01\x02"))
    cases = [
        ([good, record(2, b"")], "holds a float32_tensor where the first record has a int32_tensor",
         1, "v"),
        ([good, good, record(7, field(1, b"\x80"))], "packed varints end inside a varint", 2, "v"),
        ([good, b"\x0a\x05ab"], "length-delimited field runs past the end of its message", 1, None),
    ]
    for batch, message, index, name in cases:
        expected = ("error", message, index, name)
        assert _outcome(speedups.parse_recordio_protobuf, batch, ((1, b"v"),), (7,)) == expected
        assert _outcome(reference, batch, ((1, b"v"),), (7,)) == expected
    label = [record(7, field(1, b"\x80"), section=2)]
    assert _outcome(speedups.parse_recordio_protobuf, label, ((2, b"v"),), (7,))[3] == "label_v"


# --- decode kernels without the GIL ---------------------------------------------------------------
def _example_of(i: int) -> bytes:
    x = struct.pack("<4f", i, -i, 0.5, 1e9)
    feature_x = field(1, b"x") + field(2, field(2, field(1, x)))
    feature_y = field(1, b"y") + field(2, field(3, field(1, bytes([i % 100]))))
    return field(1, field(1, feature_x) + field(1, feature_y))


def test_parse_examples_lets_other_threads_run_on_large_batches():
    reference = _example_reference()
    records = [_example_of(i) for i in range(20_000)]
    names, kinds = (b"x", b"y"), (2, 3)
    assert runs_beside(lambda: speedups.parse_examples(records, names, kinds))
    # the same results as the reference, and errors named the same way from inside that loop
    assert _outcome(speedups.parse_examples, records[:300], names, kinds) == \
        _outcome(reference, records[:300], names, kinds)
    bad = records[:300]
    bad[250] = b"\x0a\x05ab"
    expected = ("error", "length-delimited field runs past the end of its message", 250, None)
    assert _outcome(speedups.parse_examples, bad, names, kinds) == expected
    assert _outcome(reference, bad, names, kinds) == expected
    wrong = records[:300]
    wrong[299] = field(1, field(1, field(1, b"y") + field(2, field(2, b""))))
    got = _outcome(speedups.parse_examples, wrong, names, kinds)
    assert got == _outcome(reference, wrong, names, kinds)
    assert got[2:] == (299, "y")


def test_parse_recordio_protobuf_lets_other_threads_run_on_large_batches():
    import numpy as np

    reference = _protobuf_reference()
    from streamio.decoders.recordio_protobuf import encode_recordio_protobuf

    x = np.arange(20_000 * 8, dtype=np.float32).reshape(20_000, 8)
    records = list(encode_recordio_protobuf(x, np.arange(20_000, dtype=np.float32)))
    names, kinds = ((1, b"values"), (2, b"values")), (2, 2)
    assert runs_beside(lambda: speedups.parse_recordio_protobuf(records, names, kinds))
    got = speedups.parse_recordio_protobuf(records, names, kinds)
    np.testing.assert_array_equal(got[0][0].reshape(20_000, 8), x)
    bad = records[:300]
    bad[200] = b"\x0a\x05ab"
    expected = ("error", "length-delimited field runs past the end of its message", 200, None)
    assert _outcome(speedups.parse_recordio_protobuf, bad, names, kinds) == expected
    assert _outcome(reference, bad, names, kinds) == expected

def test_decode_kernels_read_a_list_another_thread_empties_meanwhile():
    """The kernels parse a snapshot of the list: records dropped from it by another thread
    while the GIL is released stay alive until the call returns."""
    import threading

    _example_reference()
    names, kinds = (b"x", b"y"), (2, 3)
    for _ in range(5):
        records = [_example_of(i) for i in range(20_000)]
        expected = speedups.parse_examples(list(records), names, kinds)
        emptier = threading.Thread(target=records.clear)
        results = []

        def parse():
            results.append(speedups.parse_examples(records, names, kinds))

        parser = threading.Thread(target=parse)
        parser.start()
        emptier.start()
        parser.join()
        emptier.join()
        got = results[0]
        if got[1].shape[0] == 20_000:  # the parser saw the full list (the usual case)
            assert got[1].tolist() == expected[1].tolist()
            assert got[0][0].tobytes() == expected[0][0].tobytes()
        else:  # the list was emptied before the call began
            assert got[1].shape[0] == 0

# -- parse_sequence_examples (issue #14, item 2) ----------------------------------------------------

@st.composite
def feature_list(draw) -> bytes:
    """A FeatureList: 0-4 steps (Features, some empty), maybe unknown fields between them."""
    parts = [field(1, draw(feature())) for _ in range(draw(st.integers(0, 4)))]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(unknown_fields))
    return b"".join(parts)


def _entries(draw, value) -> list:
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(EXAMPLE_KEYS))
        entry = field(1, key) + field(2, draw(value))
        if draw(st.integers(0, 9)) == 0:  # a value given twice in one entry: merged
            entry += field(2, draw(value))
        entries.append(field(1, entry))
    if draw(st.booleans()):
        entries.append(draw(unknown_fields))
    return entries


@st.composite
def sequence_record(draw) -> bytes:
    """A SequenceExample: context (Features) and feature_lists (FeatureLists), each sometimes
    split in two occurrences (merged) or absent, in any order with unknown fields."""
    body = []
    for number, value in ((1, feature()), (2, feature_list())):
        entries = _entries(draw, value)
        cut = draw(st.integers(0, len(entries)))
        if entries or draw(st.booleans()):
            body.append(field(number, b"".join(entries[:cut])))
        if cut < len(entries):
            body.append(field(number, b"".join(entries[cut:])))
    body.append(draw(unknown_fields))
    return b"".join(draw(st.permutations(body)))


sequence_batches = st.lists(st.one_of(sequence_record(), sequence_record(), sequence_record(),
                                      mutated_record(sequence_record()), st.binary(max_size=30)),
                            max_size=8)


def _sequence_reference():
    example = pytest.importorskip("streamio.decoders.example")
    if not hasattr(speedups, "parse_sequence_examples"):
        pytest.skip("this build has no parse_sequence_examples kernel")
    return example.parse_sequence_examples


def _sequence_args(context, sequence):
    return (tuple(n for n, _ in context), tuple(k for _, k in context),
            tuple(n for n, _ in sequence), tuple(k for _, k in sequence))


@SLOW_OK
@given(records=sequence_batches, context=example_specs, sequence=example_specs)
def test_parse_sequence_examples_equals_reference(records, context, sequence):
    reference = _sequence_reference()
    args = _sequence_args(context, sequence)
    assert _outcome(speedups.parse_sequence_examples, records, *args) == \
        _outcome(reference, records, *args)


@SLOW_OK
@given(records=st.lists(sequence_record(), max_size=8), context=example_specs,
       sequence=example_specs)
def test_parse_sequence_examples_equals_reference_on_valid_records(records, context, sequence):
    reference = _sequence_reference()
    args = _sequence_args(context, sequence)
    assert _outcome(speedups.parse_sequence_examples, records, *args) == \
        _outcome(reference, records, *args)


def _sequence_example_of(i: int, steps: int) -> bytes:
    """context: f (float32[2]), n (int64); feature lists: a (float32[3] a step), b (int64 a step)."""
    def entry(key, value):
        return field(1, field(1, key) + field(2, value))

    context = (entry(b"f", field(2, field(1, struct.pack("<2f", i, 0.5))))
               + entry(b"n", field(3, field(1, varint(i)))))
    a = b"".join(field(1, field(2, field(1, struct.pack("<3f", i, t, -t))))
                 for t in range(steps))
    b = b"".join(field(1, field(3, field(1, varint(i * 100 + t)))) for t in range(steps))
    return field(1, context) + field(2, entry(b"a", a) + entry(b"b", b))


def test_parse_sequence_examples_reads_what_tensorflow_writes_and_names_errors():
    import numpy as np

    reference = _sequence_reference()
    records = [_sequence_example_of(i, i % 5) for i in range(300)]
    args = ((b"f", b"n"), (2, 3), (b"a", b"b"), (2, 3))
    got = speedups.parse_sequence_examples(records, *args)
    assert _outcome(speedups.parse_sequence_examples, records, *args) == \
        _outcome(reference, records, *args)
    c_values, c_counts, s_values, s_steps, step_counts = got
    assert c_values[1].tolist() == list(range(300))
    assert s_steps[:, 0].tolist() == [i % 5 for i in range(300)]
    assert (step_counts[0] == 3).all() and (step_counts[1] == 1).all()
    np.testing.assert_array_equal(s_values[1], [i * 100 + t for i in range(300) for t in range(i % 5)])
    # errors from inside the GIL-free loop: the record and the feature (list) named
    bad = list(records)
    bad[250] = b"\x0a\x05ab"
    expected = ("error", "length-delimited field runs past the end of its message", 250, None)
    assert _outcome(speedups.parse_sequence_examples, bad, *args) == expected
    assert _outcome(reference, bad, *args) == expected
    wrong = list(records)  # record 299's list "b" holds floats
    wrong[299] = field(2, field(1, field(1, b"b") + field(2, field(
        1, field(2, b"")))))
    got = _outcome(speedups.parse_sequence_examples, wrong, *args)
    assert got == _outcome(reference, wrong, *args)
    assert got[2:] == (299, "b")
    cut = list(records)  # record 120's int64 list ends inside a varint: found after the loop
    cut[120] = field(2, field(1, field(1, b"b") + field(2, field(
        1, field(3, field(1, b"\x81"))))))
    got = _outcome(speedups.parse_sequence_examples, cut, *args)
    assert got == _outcome(reference, cut, *args)
    assert got[2:] == (120, "b")


def test_parse_sequence_examples_lets_other_threads_run_and_checks_arguments():
    _sequence_reference()
    records = [_sequence_example_of(i, 20) for i in range(5_000)]
    args = ((b"f", b"n"), (2, 3), (b"a", b"b"), (2, 3))
    assert runs_beside(lambda: speedups.parse_sequence_examples(records, *args))
    with pytest.raises(ValueError):
        speedups.parse_sequence_examples(records, (b"f",), (2, 3), (), ())
    with pytest.raises(ValueError):
        speedups.parse_sequence_examples(records, (), (), (b"a",), (4,))
    with pytest.raises(TypeError):
        speedups.parse_sequence_examples(records, (), (), ("a",), (2,))


@SLOW_OK
@given(steps=st.lists(st.integers(0, 5), max_size=7),
       spec=st.sampled_from([((), "float32"), ((2,), "int64"), ((2, 3), "float32"), ((2,), "bytes"),
                             ((0,), "float32"), ((3,), "int32")]),
       default=st.booleans(), kernel=st.booleans(), data=st.data())
def test_sequence_example_pads_fixed_len_steps_as_a_per_record_loop_does(steps, spec, default,
                                                                         kernel, data):
    """The whole-batch placement of FixedLen sequence steps (decode_batch, C kernel or not)
    against the obvious loop: record r's steps at out[r, :steps[r]], the rest the default."""
    import numpy as np

    from streamio.decoders import example

    shape, dtype = spec
    n = int(np.prod(shape))
    values = [[[data.draw(st.binary(max_size=3)) if dtype == "bytes" else
                data.draw(st.integers(-2 ** 31, 2 ** 31 - 1)) for _ in range(n)]
               for _ in range(k)] for k in steps]
    pad = ([b"p"] * n if dtype == "bytes" else [7] * n) if default else None

    def step(vals):
        if dtype == "bytes":
            return field(1, b"".join(field(1, v) for v in vals))
        if dtype == "float32":
            return field(2, field(1, struct.pack("<%df" % n, *vals)))
        return field(3, field(1, b"".join(varint(v) for v in vals)))

    records = [field(2, field(1, field(1, b"s") + field(2, b"".join(
        field(1, step(v)) for v in rec)))) for rec in values]
    spec_obj = example.FixedLen(shape, dtype, default=None if pad is None else
                                np.array(pad, dtype=object if dtype == "bytes" else dtype)
                                .reshape(shape), allow_missing=True)
    decoder = example.SequenceExample(sequence={"s": spec_obj})
    saved = example._c_parse_sequence_examples
    if not kernel:
        example._c_parse_sequence_examples = None
    try:
        got = decoder.decode_batch(records)
    finally:
        example._c_parse_sequence_examples = saved
    longest = max(steps, default=0)
    np_dtype = object if dtype == "bytes" else np.dtype(dtype)
    expected = np.empty((len(steps), longest, n), dtype=np_dtype)
    expected[...] = np.array(pad if pad is not None else ([b""] * n if dtype == "bytes" else [0] * n),
                             dtype=np_dtype)
    for r, rec in enumerate(values):
        for t, vals in enumerate(rec):
            expected[r, t] = np.array(vals, dtype=np_dtype) if n else expected[r, t]
    assert got["s"].dtype == np_dtype
    assert got["s"].shape == (len(steps), longest) + shape
    assert got["s"].reshape(len(steps), longest, n).tolist() == expected.tolist()
    assert got["s_len"].tolist() == steps


# -- sparse RecordIO-protobuf through decode_batch (issue #14, item 2) -------------------------------

HOSTILE_KEYS = [0, 1, 5, 9, 10, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]
HOSTILE_SHAPES = [None, [10], [10], [10], [2, 5], [], [0], [2 ** 64 - 1], [2 ** 32, 2 ** 32],
                  [2 ** 63], [11]]


@st.composite
def sparse_record(draw) -> bytes:
    """A Record whose features["x"] is a float32 tensor with keys and a shape, mostly sound
    (10 wide), sometimes hostile: keys beyond the shape or >= 2**63, dims that are negative on
    the wire or whose product overflows, as many keys as values or not; plus a dense label."""
    n = draw(st.integers(0, 4))
    keys = sorted(draw(st.lists(st.sampled_from(HOSTILE_KEYS[:5]), min_size=n, max_size=n)))
    if draw(st.integers(0, 4)) == 0:
        keys.append(draw(st.sampled_from(HOSTILE_KEYS)))
    nvalues = len(keys) if draw(st.integers(0, 5)) else draw(st.integers(0, 5))
    shape = draw(st.sampled_from(HOSTILE_SHAPES))
    tensor = field(1, struct.pack("<%df" % nvalues, *range(nvalues)))
    if keys or draw(st.booleans()):
        tensor += field(2, b"".join(varint(k) for k in keys))
    if shape is not None:
        tensor += field(3, b"".join(varint(d) for d in shape))
    value = field(2, tensor)  # Value.float32_tensor
    label = field(2, field(1, struct.pack("<f", 1.0)))
    return (field(1, field(1, b"x") + field(2, value))
            + field(2, field(1, b"y") + field(2, label)))


SOUND_SPARSE = (field(1, field(1, b"x") + field(2, field(2, field(
    1, struct.pack("<2f", 1, 2)) + field(2, b"\x01\x07") + field(3, b"\x0a"))))
    + field(2, field(1, b"y") + field(2, field(2, field(1, b"\0\0\x80?")))))


def _sparse_outcome(records, kernel: bool, shortcut: bool):
    from streamio.decoders import recordio_protobuf as rp
    from streamio.errors import DecodeError

    saved = rp._c_parse_recordio_protobuf, rp._plain_sparse_column
    if not kernel:
        rp._c_parse_recordio_protobuf = None
    if not shortcut:
        rp._plain_sparse_column = lambda *args: None
    try:
        decoder = rp.RecordIOProtobuf()
        try:
            out = decoder.decode_batch(records, source="s.rec", first_index=100)
        except DecodeError as exc:
            return ("error", str(exc), exc.record_index, exc.field)
    finally:
        rp._c_parse_recordio_protobuf, rp._plain_sparse_column = saved
    x = out["x"]
    return ("ok", type(x).__name__, x.shape, [_normalize(a) for a in
            ((x.indptr, x.indices, x.values) if hasattr(x, "indptr") else (x,))],
            _normalize(out["label_y"]))


@SLOW_OK
@given(records=st.lists(st.one_of(sparse_record(), st.just(SOUND_SPARSE)), min_size=1,
                        max_size=40).map(lambda rs: [SOUND_SPARSE] + rs))
def test_sparse_recordio_protobuf_same_batches_and_errors_on_every_path(records):
    """C kernel or reference parser, whole-batch shortcut or general assembly: the same CSR
    arrays, or the same DecodeError naming the source, record and tensor (hostile shapes and
    keys included: the first record is sound, so each fault is met in a later one)."""
    _protobuf_reference()
    outcomes = {(k, s): _sparse_outcome(records, k, s) for k in (True, False) for s in (True, False)}
    assert len(set(map(repr, outcomes.values()))) == 1, outcomes
    got = outcomes[(True, True)]
    if got[0] == "error":
        assert "s.rec" in got[1] and got[2] is not None and got[2] >= 100 and got[3] == "x"


# -- hostile arguments (issue #10, finding 9): these are internal functions, but a crash is a
# crash; a size that overflows, or an argument whose __index__ changes the caller's lists while the
# kernel still reads them, ends in a Python exception or a correct result (tests/run_sanitized.sh
# runs these under ASan/UBSan) ------------------------------------------------------------------


def _example(key: bytes, value: float) -> bytes:
    # Example{features=1: Features{feature=1: entry{key=1, value=2: Feature{float_list=2}}}}
    float_list = field(1, np.float32(value).tobytes())
    entry = field(1, key) + field(2, field(2, float_list))
    return field(1, field(1, entry))


def _same_arrays(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_arrays(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b

def test_parse_examples_kind_index_that_empties_names_and_records():
    records = [_example(b"x", 1.5), _example(b"x", -2.0)]
    expected = example_reference(list(records), (b"x",), (2,))
    names = [b"x"]
    kinds = [Mutator(2, names, records)]
    got = speedups.parse_examples(records, names, kinds)
    assert _same_arrays(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[1].tolist() == [[1], [1]]


def test_parse_sequence_examples_index_that_empties_both_pairs_and_records():
    # SequenceExample{context=1: Features{x: float}, feature_lists=2: {s: FeatureList{2 steps}}}
    def sequence(value: float) -> bytes:
        feature = field(2, field(1, np.float32(value).tobytes()))
        context = field(1, field(1, b"x") + field(2, feature))
        lists = field(1, field(1, b"s") + field(2, field(1, feature) * 2))
        return field(1, context) + field(2, lists)

    records = [sequence(1.5), sequence(-2.0)]
    expected = sequence_reference(list(records), (b"x",), (2,), (b"s",), (2,))
    context_names, sequence_names = [b"x"], [b"s"]
    context_kinds = [Mutator(2, context_names, sequence_names, records)]
    sequence_kinds: list = []
    sequence_kinds.append(Mutator(2, sequence_kinds, context_names, sequence_names, records))
    got = speedups.parse_sequence_examples(records, context_names, context_kinds, sequence_names,
                                           sequence_kinds)
    # every argument was copied before the first __index__ ran: the result is the reference's
    assert all(_same_arrays(g, e) for g, e in zip(got, expected))
    assert got[1].tolist() == [[1], [1]] and got[3].tolist() == [[2], [2]]


def test_parse_recordio_protobuf_index_that_empties_names_and_records():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    records = list(encode_recordio_protobuf(x))
    expected = protobuf_reference(list(records), ((1, b"values"),), (2,))
    names: list = []
    kinds: list = []
    names.append((Mutator(1, names, records), b"values"))
    kinds.append(Mutator(2, kinds, names, records))
    got = speedups.parse_recordio_protobuf(records, names, kinds)
    assert all(_same_arrays(g, e) for g, e in zip(got, expected))
    assert got[1].tolist() == [[3]] * 4


# -- a map entry with a key and no value (NULL + 0 in the C parser before) -------------------------

def test_parse_examples_feature_entry_without_a_value_is_a_missing_feature():
    entry_key_only = field(1, field(1, field(1, b"x")))
    records = [entry_key_only, _example(b"x", 3.0)]
    got = speedups.parse_examples(records, (b"x",), (2,))
    expected = example_reference(records, (b"x",), (2,))
    assert _same_arrays(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[1].tolist() == [[-1], [1]]


def test_parse_recordio_protobuf_entry_without_a_value_is_an_absent_tensor():
    entry_key_only = field(1, field(1, b"values"))
    records = [entry_key_only] + list(encode_recordio_protobuf(np.ones((1, 2), np.float32)))
    got = speedups.parse_recordio_protobuf(records, ((1, b"values"),), (2,))
    expected = protobuf_reference(records, ((1, b"values"),), (2,))
    assert all(_same_arrays(g, e) for g, e in zip(got, expected))

"""The C accelerator (streamio._speedups) against the pure-Python references it replaces.

The references are the specification: for every input (valid streams, mutated streams, random
garbage, any pos/end) the C kernels must return the same ``(pos, status)`` and the same records,
and a framer running on them must give the same records, errors, offsets and counters.
"""

from __future__ import annotations

import os
import random
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

import crc32c  # noqa: E402

from streamio.errors import FormatError  # noqa: E402
from streamio.formats import encode_recordio, encode_tfrecord  # noqa: E402
from streamio.formats import _framing  # noqa: E402
from streamio.formats.recordio import MAGIC_BYTES, RecordIOFramer, scan_recordio  # noqa: E402
from streamio.formats.tfrecord import TFRecordFramer, scan_tfrecords  # noqa: E402

SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.data_too_large])

payloads = st.lists(st.binary(max_size=200), max_size=12)
# RecordIO payloads that hold the magic number (dmlc splits them into multi-part records)
recordio_payloads = st.lists(
    st.one_of(st.binary(max_size=100),
              st.lists(st.sampled_from([b"", b"a", b"abcd", MAGIC_BYTES, b"xy" + MAGIC_BYTES]),
                       max_size=6).map(b"".join)),
    max_size=10)
buffer_types = st.sampled_from([bytes, bytearray, lambda b: memoryview(b),
                                lambda b: memoryview(bytearray(b))])
# mostly the default limit (so payload CRCs get checked), sometimes small, zero or beyond 64 bits
limits = st.one_of(st.just(1 << 28), st.sampled_from([150, 64, 0, 1, 1 << 70]))


def tfrecord_stream(records) -> bytes:
    return b"".join(encode_tfrecord(r) for r in records)


def recordio_stream(records, multipart="dmlc") -> bytes:
    return b"".join(encode_recordio(r, multipart=multipart) for r in records)


@st.composite
def mutated(draw, stream_strategy):
    """A stream with random byte flips, truncation and inserted garbage."""
    data = bytearray(draw(stream_strategy))
    for _ in range(draw(st.integers(0, 4))):
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
    if draw(st.booleans()) and data:
        del data[draw(st.integers(0, len(data))):]
    if draw(st.booleans()):
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@st.composite
def tfrecord_bad_payload(draw):
    """Valid frames, one payload byte flipped: the length is sound, the data CRC is not."""
    records = draw(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=8))
    k = draw(st.integers(0, len(records) - 1))
    data = bytearray(tfrecord_stream(records))
    at = len(tfrecord_stream(records[:k])) + 12 + draw(st.integers(0, len(records[k]) - 1))
    data[at] ^= draw(st.integers(1, 255))
    return bytes(data)


tfrecord_streams = payloads.map(tfrecord_stream)
recordio_streams = recordio_payloads.map(recordio_stream)
any_tfrecord = st.one_of(tfrecord_streams, mutated(tfrecord_streams), tfrecord_bad_payload(),
                         st.binary(max_size=400))
any_recordio = st.one_of(recordio_streams, mutated(recordio_streams), st.binary(max_size=400),
                         # garbage after the magic number: exercises lengths, cflags, limits
                         st.binary(max_size=200).map(lambda b: MAGIC_BYTES + b))


def pos_end(n: int):
    """(pos, end) in the buffer: mostly the whole of it (frames then line up), sometimes any."""
    return st.tuples(st.one_of(st.just(0), st.integers(0, n)),
                     st.one_of(st.just(n), st.integers(0, n)))


def both_tfrecord(buf, pos, end, verify, limit):
    ref_out, c_out = [], []
    ref = scan_tfrecords(buf, pos, end, verify, limit, ref_out)
    fast = speedups.scan_tfrecords(buf, pos, end, verify, limit, c_out)
    return ref, ref_out, fast, c_out


def both_recordio(buf, pos, end, limit):
    ref_out, c_out = [], []
    ref = scan_recordio(buf, pos, end, limit, ref_out)
    fast = speedups.scan_recordio(buf, pos, end, limit, c_out)
    return ref, ref_out, fast, c_out


# --- CRC-32C --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [speedups.crc32c, speedups.crc32c_portable, speedups.crc32c_sse42],
                         ids=["dispatched", "portable", "sse42"])
def test_crc32c_equals_the_crc32c_package_for_every_small_length_and_alignment(fn):
    rng = random.Random(1234)
    backing = bytes(rng.getrandbits(8) for _ in range(320))
    for length in range(301):
        for offset in (0, 1, 3, 7):  # unaligned starts take the byte-at-a-time prologue
            data = memoryview(backing)[offset:offset + length]
            start = rng.getrandbits(32)
            assert fn(data) == crc32c.crc32c(bytes(data)), (length, offset)
            assert fn(data, start) == crc32c.crc32c(bytes(data), start), (length, offset)


@pytest.mark.parametrize("fn", [speedups.crc32c, speedups.crc32c_portable, speedups.crc32c_sse42],
                         ids=["dispatched", "portable", "sse42"])
@pytest.mark.parametrize("length", [511, 512, 513, 575, 576, 577, 767, 768, 769, 1000, 24575, 24576,
                                    24577, 100_000, 3 * 8192 * 5 + 13, (1 << 20) + 5])
def test_crc32c_equals_the_crc32c_package_on_large_inputs(fn, length):
    # Lengths around 3*256 and 3*8192 cross the interleaved loops' block boundaries, those around
    # 512 (+64) the AVX-512 kernel's (it folds from 2 blocks of 256, then 64-byte steps); the
    # last ones are long enough to release the GIL.
    data = os.urandom(length + 1)[1:]
    assert fn(data) == crc32c.crc32c(data)
    assert fn(bytearray(data), 0xDEADBEEF) == crc32c.crc32c(data, 0xDEADBEEF)


def test_crc32c_check_value():
    # The CRC-32C check value from the catalogue of parametrised CRC algorithms.
    assert speedups.crc32c(b"123456789") == 0xE3069283
    assert speedups.crc32c_portable(b"123456789") == 0xE3069283
    assert speedups.crc32c_sse42(b"123456789") == 0xE3069283


# --- scan kernels ---------------------------------------------------------------------------------

@SLOW_OK
@given(data=any_tfrecord, verify=st.booleans(), limit=limits, wrap=buffer_types, draw=st.data())
def test_scan_tfrecords_equals_reference(data, verify, limit, wrap, draw):
    pos, end = draw.draw(pos_end(len(data)))
    ref, ref_out, fast, c_out = both_tfrecord(wrap(data), pos, end, verify, limit)
    assert fast == ref
    assert c_out == ref_out
    assert all(type(r) is bytes for r in c_out)


@SLOW_OK
@given(records=payloads, verify=st.booleans(), limit=limits)
def test_scan_tfrecords_on_whole_valid_streams(records, verify, limit):
    data = tfrecord_stream(records)
    ref, ref_out, fast, c_out = both_tfrecord(data, 0, len(data), verify, limit)
    assert (fast, c_out) == (ref, ref_out)
    if limit >= 200:
        assert fast == (len(data), _framing.OK) and c_out == records


@SLOW_OK
@given(data=any_recordio, limit=limits, wrap=buffer_types, draw=st.data())
def test_scan_recordio_equals_reference(data, limit, wrap, draw):
    pos, end = draw.draw(pos_end(len(data)))
    ref, ref_out, fast, c_out = both_recordio(wrap(data), pos, end, limit)
    assert fast == ref
    assert c_out == ref_out


def test_scan_tfrecords_reports_each_status_like_the_reference():
    good = encode_tfrecord(b"x" * 40)
    bad_header = bytearray(good)
    bad_header[9] ^= 1
    bad_data = bytearray(good)
    bad_data[20] ^= 1
    cases = {
        "ok": (good * 3, True, 1000, _framing.OK),
        "partial": (good * 2 + good[:30], True, 1000, _framing.OK),
        "bad header": (good + bytes(bad_header), True, 1000, _framing.BAD_HEADER),
        "bad data": (good + bytes(bad_data) + good, True, 1000, _framing.BAD_DATA),
        "bad data, unverified": (good + bytes(bad_data), False, 1000, _framing.OK),
        "too large": (good + good, True, 39, _framing.TOO_LARGE),
    }
    for name, (data, verify, limit, status) in cases.items():
        ref, ref_out, fast, c_out = both_tfrecord(data, 0, len(data), verify, limit)
        assert (fast, c_out) == (ref, ref_out), name
        assert fast[1] == status, name


def test_scan_tfrecords_large_records_and_a_corrupt_one():
    # Payloads this large are checked with the GIL released; a bad CRC must still stop the scan
    # exactly at its frame, after the good records before it.
    records = [os.urandom(300_000), os.urandom(120_000), os.urandom(200_000)]
    data = bytearray(tfrecord_stream(records))
    second = len(encode_tfrecord(records[0]))
    data[second + 12 + 5000] ^= 0x40
    ref, ref_out, fast, c_out = both_tfrecord(bytes(data), 0, len(data), True, 1 << 28)
    assert fast == ref == (second, _framing.BAD_DATA)
    assert c_out == ref_out == records[:1]


def test_scan_tfrecords_more_frames_than_one_internal_batch():
    records = [bytes([i % 256]) * (i % 7) for i in range(1000)]
    data = tfrecord_stream(records)
    bad = bytearray(data)
    at = sum(len(encode_tfrecord(r)) for r in records[:701])
    bad[at + 12] ^= 1  # the payload of record 701, in the third internal batch
    for buf in (data, bytes(bad)):
        ref, ref_out, fast, c_out = both_tfrecord(buf, 0, len(buf), True, 1 << 28)
        assert (fast, c_out) == (ref, ref_out)
    assert fast == (at, _framing.BAD_DATA) and c_out == records[:701]


def test_scan_recordio_reports_each_status_like_the_reference():
    whole = encode_recordio(b"abcdefg")
    multi = encode_recordio(b"ab" * 4 + MAGIC_BYTES + b"cd")
    cases = {
        "ok": (whole * 3 + whole[:9], 1000, _framing.OK),
        # the last frame: nothing follows it yet, so nothing confirms its length
        "ends the buffer": (whole * 3, 1000, _framing.UNCONFIRMED),
        "special": (whole + multi + whole, 1000, _framing.SPECIAL),
        "not followed by the magic": (whole + b"\0" * 12, 1000, _framing.UNCONFIRMED),
        "bad magic": (b"\0" * 12 + whole, 1000, _framing.BAD_HEADER),
        "too large": (whole, 6, _framing.TOO_LARGE),
        "partial": (whole + whole[:9], 1000, _framing.OK),
    }
    for name, (data, limit, status) in cases.items():
        ref, ref_out, fast, c_out = both_recordio(data, 0, len(data), limit)
        assert (fast, c_out) == (ref, ref_out), name
        assert fast[1] == status, name


def test_kernels_take_keywords_and_reject_bad_arguments():
    data = encode_tfrecord(b"abc")
    out: list = []
    assert speedups.scan_tfrecords(buf=data, pos=0, end=len(data), verify=True,
                                   max_record_size=10, out=out) == (len(data), 0)
    assert out == [b"abc"]
    with pytest.raises(TypeError):
        speedups.scan_tfrecords(data, 0, len(data), True, 10, ())  # out must be a list
    with pytest.raises(ValueError):
        speedups.scan_tfrecords(data, 0, len(data) + 1, True, 10, [])  # end past the buffer
    with pytest.raises(ValueError):
        speedups.scan_recordio(data, -1, len(data), 10, [])
    with pytest.raises(TypeError):
        speedups.scan_recordio("not bytes", 0, 0, 10, [])


# --- whole framers: accelerate=True vs False ------------------------------------------------------

def run_framer(make, data: bytes, cuts) -> list:
    """Feed ``data`` split at ``cuts``; record every result, error and counter a user can see."""
    framer = make()
    events: list = []
    pieces = [data[pos:cut] for pos, cut in zip([0] + cuts, cuts + [len(data)])]
    for piece in pieces + [None]:
        try:
            records = framer.feed(piece) if piece is not None else framer.finish()
        except FormatError as err:  # anything else is a bug and fails the test
            events.append(("error", type(err), err.offset, err.record_index, str(err)))
            break
        events.append(("records", records))
    events.append(("counters", framer.records, framer.skipped_records, framer.skipped_bytes))
    return events


def sorted_cuts(draw, data: bytes) -> list:
    return sorted(set(draw.draw(st.lists(st.integers(0, len(data)), max_size=8))))


def test_accelerate_selects_the_c_kernels():
    assert TFRecordFramer(accelerate=True)._kernel is speedups.scan_tfrecords
    assert TFRecordFramer(accelerate=False)._kernel is scan_tfrecords
    assert RecordIOFramer(accelerate=True)._kernel is speedups.scan_recordio
    assert RecordIOFramer(accelerate=False)._kernel is scan_recordio


@SLOW_OK
@given(data=any_tfrecord, on_error=st.sampled_from(["raise", "skip"]), verify=st.booleans(),
       limit=st.sampled_from([1 << 28, 100]), draw=st.data())
def test_tfrecord_framer_same_output_accelerated_or_not(data, on_error, verify, limit, draw):
    cuts = sorted_cuts(draw, data)
    runs = [run_framer(lambda: TFRecordFramer(verify=verify, on_error=on_error,
                                              max_record_size=limit, source="s",
                                              accelerate=accelerate), data, cuts)
            for accelerate in (True, False)]
    assert runs[0] == runs[1]


@SLOW_OK
@given(data=any_recordio, on_error=st.sampled_from(["raise", "skip"]),
       multipart=st.sampled_from(["dmlc", "concat"]), limit=st.sampled_from([1 << 28, 50]),
       draw=st.data())
def test_recordio_framer_same_output_accelerated_or_not(data, on_error, multipart, limit, draw):
    cuts = sorted_cuts(draw, data)
    runs = [run_framer(lambda: RecordIOFramer(multipart=multipart, on_error=on_error,
                                              max_record_size=limit, source="s",
                                              accelerate=accelerate), data, cuts)
            for accelerate in (True, False)]
    assert runs[0] == runs[1]


def test_framer_on_a_large_corrupt_stream_gives_the_same_errors():
    rng = random.Random(7)
    records = [rng.randbytes(rng.choice([10, 1000, 70_000])) for _ in range(60)]
    data = bytearray(tfrecord_stream(records))
    for _ in range(5):
        data[rng.randrange(len(data))] ^= 0x10
    cuts = sorted(rng.sample(range(len(data)), 20))
    for on_error in ("raise", "skip"):
        runs = [run_framer(lambda: TFRecordFramer(on_error=on_error, source="s",
                                                  accelerate=accelerate), bytes(data), cuts)
                for accelerate in (True, False)]
        assert runs[0] == runs[1]
        assert any(event[0] == "error" for event in runs[0]) or on_error == "skip"


def test_framers_read_a_valid_stream_the_same_with_the_header_split_anywhere():
    records = [b"", b"a", os.urandom(1000), b"b" * 37]
    data = tfrecord_stream(records)
    for cut in range(len(data)):
        runs = [run_framer(lambda: TFRecordFramer(accelerate=accelerate), data, [cut])
                for accelerate in (True, False)]
        assert runs[0] == runs[1]
        assert [r for kind, *rest in runs[0] if kind == "records" for r in rest[0]] == records


def test_struct_layouts_match_the_c_constants():
    # The C code hard-codes the formats' layouts and the statuses; keep them in step.
    assert (_framing.OK, _framing.BAD_HEADER, _framing.BAD_DATA, _framing.TOO_LARGE,
            _framing.SPECIAL, _framing.UNCONFIRMED) == (0, 1, 2, 3, 4, 5)
    assert struct.unpack("<I", MAGIC_BYTES)[0] == 0xCED7230A


# --- decode kernels: tf.train.Example -------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    if wire_type == 2:
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload
    return _varint(number << 3 | wire_type) + payload


EXAMPLE_KEYS = [b"x", b"label", b"tags", b"", b"\xff\xfe"]
unknown_fields = st.lists(st.one_of(
    st.tuples(st.integers(4, 40), st.just(0), st.integers(0, 2 ** 64 - 1).map(_varint)),
    st.tuples(st.integers(4, 40), st.just(2), st.binary(max_size=6)),
    st.tuples(st.integers(4, 40), st.just(5), st.binary(min_size=4, max_size=4)),
    st.tuples(st.integers(4, 40), st.just(1), st.binary(min_size=8, max_size=8)),
), max_size=2).map(lambda fs: b"".join(_field(*f) for f in fs))


GROUP_START = _varint(9 << 3 | 3)
BAD_VALUES = {
    1: [GROUP_START * 101, GROUP_START + _varint(10 << 3 | 4)],  # too deep; mismatched end
    2: [_field(1, 2, b"\0\0\0"), _varint(0x0D) + b"\0\0"],  # not 4-byte floats; truncated
    3: [_field(1, 2, b"\x01\x81"), _field(1, 2, b"\xff" * 10 + b"\x01"),  # cut; 11-byte varint
        _varint(0x08) + b"\xff" * 10 + b"\x01", _varint(0x08) + b"\xff\xff"],
}


@st.composite
def value_list(draw, kind: int) -> bytes:
    """A BytesList / FloatList / Int64List message, packed or not, maybe with unknown fields."""
    parts = []
    if draw(st.integers(0, 5)) == 0:  # a value list that is wrong inside
        parts.append(draw(st.sampled_from(BAD_VALUES[kind])))
    for _ in range(draw(st.integers(0, 3))):
        if kind == 1:
            parts.append(_field(1, 2, draw(st.binary(max_size=8))))
        elif kind == 2:
            floats = draw(st.lists(st.floats(width=32, allow_nan=True), max_size=5))
            packed = b"".join(struct.pack("<f", f) for f in floats)
            if draw(st.booleans()):
                parts.append(_field(1, 2, packed))
            else:
                parts.extend(_field(1, 5, packed[k:k + 4]) for k in range(0, len(packed), 4))
        else:
            ints = draw(st.lists(st.integers(-2 ** 63, 2 ** 64 - 1), max_size=5))
            if draw(st.booleans()):
                parts.append(_field(1, 2, b"".join(map(_varint, ints))))
            else:
                parts.extend(_field(1, 0, _varint(v)) for v in ints)
        if draw(st.booleans()):
            parts.append(draw(unknown_fields))
    return b"".join(parts)


@st.composite
def feature(draw) -> bytes:
    """A Feature: one value list (sometimes two, switching or repeating the oneof), or none."""
    out = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.integers(1, 3))
        out.append(_field(kind, 2, draw(value_list(kind))))
    return b"".join(out)


@st.composite
def example_record(draw) -> bytes:
    entries = []
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.sampled_from(EXAMPLE_KEYS))
        entry = _field(1, 2, key) + _field(2, 2, draw(feature()))
        if draw(st.integers(0, 9)) == 0:  # a value given twice in one entry: merged
            entry += _field(2, 2, draw(feature()))
        entries.append(_field(1, 2, entry))
    if draw(st.booleans()):
        entries.append(draw(unknown_fields))
    # Example.features, sometimes split in two occurrences (merged), plus unknown fields
    cut = draw(st.integers(0, len(entries)))
    body = [_field(1, 2, b"".join(entries[:cut]))]
    if cut < len(entries):
        body.append(_field(1, 2, b"".join(entries[cut:])))
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
# WireError's message, index and field; one definition for both.
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
    good = _field(1, 2, _field(1, 2, _field(1, 2, b"v") + _field(2, 2, _field(3, 2, _field(1, 2, b"\x01")))))
    wrong_kind = _field(1, 2, _field(1, 2, _field(1, 2, b"v") + _field(2, 2, _field(2, 2, b""))))
    cut_varint = _field(1, 2, _field(1, 2, _field(1, 2, b"v") + _field(2, 2, _field(3, 2, _field(1, 2, b"\x81")))))
    for batch, expected in [
        ([good, wrong_kind], ("error", "feature holds a float_list, expected a int64_list", 1, "v")),
        ([good, good, cut_varint], ("error", "packed varints end inside a varint", 2, "v")),
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
    record = _field(1, 2, _field(1, 2, _field(1, 2, b"x") + _field(2, 2, _field(2, 2, _field(1, 2, b"\0\0\x80?")))))
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
    2: [_field(1, 2, b"\0\0"), _varint(0x0D) + b"\0", _field(2, 2, b"\x05\x80")],  # keys cut
    3: [_field(1, 2, b"\0" * 12), _varint(0x09) + b"\0" * 7, _field(3, 2, b"\xff" * 11)],
    7: [_field(1, 2, b"\x01\x80"), _varint(0x08) + b"\xff" * 10 + b"\x01"],
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
            parts.append(_field(1, 2, draw(st.binary(max_size=6))))
            continue
        if kind == 7:
            ints = draw(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), max_size=4))
            if draw(st.booleans()):
                parts.append(_field(1, 2, b"".join(map(_varint, ints))))
            else:
                parts.extend(_field(1, 0, _varint(v)) for v in ints)
        else:
            fmt = "<f" if kind == 2 else "<d"
            nums = draw(st.lists(st.floats(width=32 if kind == 2 else 64), max_size=4))
            packed = [struct.pack(fmt, v) for v in nums]
            if draw(st.booleans()):
                parts.append(_field(1, 2, b"".join(packed)))
            else:
                parts.extend(_field(1, 5 if kind == 2 else 1, v) for v in packed)
        if draw(st.booleans()):  # keys (sparse), packed or not
            keys = draw(st.lists(st.integers(0, 2 ** 64 - 1), max_size=3))
            if draw(st.booleans()):
                parts.append(_field(2, 2, b"".join(map(_varint, keys))))
            else:
                parts.extend(_field(2, 0, _varint(k)) for k in keys)
        if draw(st.booleans()):  # shape
            dims = draw(st.lists(st.integers(0, 300), max_size=2))
            if draw(st.booleans()):
                parts.append(_field(3, 2, b"".join(map(_varint, dims))))
            else:
                parts.extend(_field(3, 0, _varint(d)) for d in dims)
        if draw(st.booleans()):
            parts.append(draw(unknown_fields))
    return b"".join(parts)


@st.composite
def value_message(draw) -> bytes:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(RECORD_KINDS))
        out.append(_field(kind, 2, draw(tensor(kind))))
    return b"".join(out)


@st.composite
def protobuf_record(draw) -> bytes:
    fields = []
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.integers(1, 2))
        entry = _field(1, 2, draw(st.sampled_from(RECORD_KEYS))) + _field(2, 2, draw(value_message()))
        fields.append(_field(section, 2, entry))
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
        return _field(section, 2, _field(1, 2, b"v") + _field(2, 2, _field(kind, 2, tensor_bytes)))

    good = record(7, _field(1, 2, b"\x01\x02"))
    cases = [
        ([good, record(2, b"")], "holds a float32_tensor where the first record has a int32_tensor",
         1, "v"),
        ([good, good, record(7, _field(1, 2, b"\x80"))], "packed varints end inside a varint", 2, "v"),
        ([good, b"\x0a\x05ab"], "length-delimited field runs past the end of its message", 1, None),
    ]
    for batch, message, index, field in cases:
        expected = ("error", message, index, field)
        assert _outcome(speedups.parse_recordio_protobuf, batch, ((1, b"v"),), (7,)) == expected
        assert _outcome(reference, batch, ((1, b"v"),), (7,)) == expected
    label = [record(7, _field(1, 2, b"\x80"), section=2)]
    assert _outcome(speedups.parse_recordio_protobuf, label, ((2, b"v"),), (7,))[3] == "label_v"


# --- decode kernels: CSV numbers ------------------------------------------------------------------

import re  # noqa: E402

SIMPLE_NUMBER = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

number_text = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: repr(v).encode()),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda v: b"%.5f" % v),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: b"%e" % v),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: b"%.17g" % v),
    st.integers(-10 ** 25, 10 ** 25).map(lambda v: str(v).encode()),
    st.tuples(st.integers(0, 10 ** 19), st.integers(-400, 400)).map(
        lambda t: b"%de%d" % t),
    st.text("0123456789.eE+-", min_size=1, max_size=12).map(str.encode),  # grammar edges
    st.sampled_from([b"-0", b"+.5", b"5.", b"0000.000", b"1e-400", b"1e400", b"nan", b"inf",
                     b" 1", b"", b".", b"1e", b"--1", b"9007199254740993", b"0.1e-22",
                     b"4.9406564584124654e-324", b"1.7976931348623157e308"]),
)


@st.composite
def csv_table(draw):
    ncols = draw(st.integers(1, 5))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        fields = draw(st.lists(number_text, min_size=ncols, max_size=ncols))
        if draw(st.integers(0, 20)) == 0:  # a row of another width
            fields = fields[:-1] if draw(st.booleans()) else fields + [b"1"]
        rows.append(b",".join(fields))
    usecols = draw(st.one_of(st.none(), st.lists(st.integers(0, ncols - 1), unique=True,
                                                 min_size=1)))
    return rows, ncols, usecols


def _loadtxt(rows, ncols, usecols, double):
    import numpy as np

    try:
        table = np.loadtxt(rows, dtype=np.float64 if double else np.float32, delimiter=",",
                           quotechar=None, comments=None, ndmin=2, usecols=usecols,
                           encoding="latin-1")
    except ValueError:
        return None
    return table


@SLOW_OK
@given(table=csv_table(), double=st.booleans())
def test_parse_csv_floats_equals_numpy_loadtxt(table, double):
    rows, ncols, usecols = table
    got = speedups.parse_csv_floats(rows, ncols, b",", usecols, double)
    simple = all(len(row.split(b",")) == ncols for row in rows) and all(
        SIMPLE_NUMBER.fullmatch(row.split(b",")[c])
        for row in rows for c in (range(ncols) if usecols is None else usecols))
    assert (got is not None) == simple
    if got is None:
        return
    if not rows:  # loadtxt cannot know the width of an empty table
        assert got.shape == (0, ncols if usecols is None else len(usecols))
        return
    expected = _loadtxt(rows, ncols, usecols, double)
    assert expected is not None
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()  # bit for bit: -0.0, rounding, overflow to inf
    assert got.flags.writeable


def test_parse_csv_floats_takes_the_correctly_rounded_path_for_hard_numbers():
    import numpy as np

    hard = [b"9007199254740993", b"0.1e-22", b"1234567890123456789012", b"2.2250738585072011e-308",
            b"7.038531e-26", b"123456789e-30"]
    got = speedups.parse_csv_floats([b",".join(hard)], len(hard), double=True)
    assert got.tolist() == [[float(v) for v in hard]]
    got32 = speedups.parse_csv_floats([b",".join(hard)], len(hard))
    assert got32.tolist() == [[float(np.float32(float(v))) for v in hard]]


def test_parse_csv_floats_rejects_what_it_cannot_read_exactly():
    assert speedups.parse_csv_floats([b"1,2", b"3"], 2) is None  # a short row
    assert speedups.parse_csv_floats([b'"1",2'], 2) is None  # quotes: the general path's job
    assert speedups.parse_csv_floats([b"1;2"], 2, b";").tolist() == [[1.0, 2.0]]
    with pytest.raises(ValueError):
        speedups.parse_csv_floats([b"1"], 1, usecols=[1])
    assert speedups.parse_csv_floats([bytearray(b"1")], 1) is None  # only bytes rows
    assert speedups.parse_csv_floats([b"1"], 0) is None


# --- the benchmark runs end to end ----------------------------------------------------------------

def test_benchmark_runs_in_one_command_and_writes_json(tmp_path):
    """A tiny run (no peers: no TensorFlow in this process) gives the table and the JSON."""
    import json

    from streamio.bench import main

    out = tmp_path / "bench.json"
    assert main(["--scale", "0.002", "--rounds", "1", "--no-peers", "--quiet",
                 "--tmpdir", str(tmp_path / "work"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cases = {c["case"]: c for c in report["cases"]}
    assert report["machine"]["nproc"] >= 1
    # Frames-only cases need no decoder, so they always run, and count every record.
    for name in ("examples/read_records", "large/streamio-read_records", "large/raw-read"):
        assert "error" not in cases[name], cases[name]
        assert cases[name]["records"] == report["workloads"][name.split("/")[0]]["records"]
    # The pipeline case has its own workload, and every variant delivers all of it.
    for name in ("pipeline/bare-decode", "pipeline/shuffle-batch-prefetch",
                 "pipeline/shuffle-batch-prefetch2", "pipeline/shuffle-batch"):
        assert "error" not in cases[name], cases[name]
        assert cases[name]["records"] == report["workloads"]["pipeline"]["records"]
    assert {r["name"] for r in report["ratios"]} >= {"examples: streamio / tf.data",
                                                     "csv: streamio / pandas"}
    assert not list((tmp_path / "work").glob("fifo-*"))  # every FIFO was removed


# --- shuffle kernel -------------------------------------------------------------------------------

@SLOW_OK
@given(n=st.integers(1, 40), data=st.data())
def test_shuffle_exchange_equals_the_reference_plan(n, data):
    import sys

    import numpy as np

    shuffle = pytest.importorskip("streamio.pipeline.shuffle")
    slots = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=60)), dtype=np.int64)
    items = [("new", j) for j in range(len(slots))]
    old = [("old", i) for i in range(n)]
    baseline = [sys.getrefcount(x) for x in items + old]
    ref_buf = np.empty(n, dtype=object)
    ref_buf[:] = old
    c_buf = ref_buf.copy()
    expected = shuffle._ExchangePlan(slots % n, n).apply(
        ref_buf, np.fromiter(items, dtype=object, count=len(items))).tolist()
    got = speedups.shuffle_exchange(c_buf, slots, items)
    assert got == expected
    assert c_buf.tolist() == ref_buf.tolist()
    del got, expected, ref_buf, c_buf
    assert [sys.getrefcount(x) for x in items + old] == baseline  # no reference leaked or lost


def test_shuffle_exchange_rejects_bad_arguments_without_touching_the_buffer():
    import numpy as np

    buf = np.empty(3, dtype=object)
    buf[:] = ["a", "b", "c"]
    with pytest.raises(IndexError):
        speedups.shuffle_exchange(buf, np.array([0, 3]), ["x", "y"])
    assert buf.tolist() == ["a", "b", "c"]
    with pytest.raises(ValueError):
        speedups.shuffle_exchange(buf, np.array([0]), ["x", "y"])
    with pytest.raises(TypeError):
        speedups.shuffle_exchange(np.zeros(3), np.array([0]), ["x"])
    with pytest.raises(TypeError):
        speedups.shuffle_exchange(buf, np.array([0], dtype=np.int32), ["x"])


@SLOW_OK
@given(n=st.integers(1, 40), data=st.data())
def test_shuffle_exchange_int64_equals_the_reference_plan(n, data):
    import numpy as np

    shuffle = pytest.importorskip("streamio.pipeline.shuffle")
    if not hasattr(speedups, "shuffle_exchange_int64"):
        pytest.skip("this build has no shuffle_exchange_int64 kernel")
    slots = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=60)), dtype=np.int64)
    new = np.arange(1000, 1000 + len(slots), dtype=np.int64)
    ref_buf = np.arange(n, dtype=np.int64)
    c_buf = ref_buf.copy()
    expected = shuffle._ExchangePlan(slots % n, n).apply(ref_buf, new)
    out = np.full(len(slots), -1, dtype=np.int64)
    assert speedups.shuffle_exchange_int64(c_buf, slots, new, out) is None
    assert out.tolist() == expected.tolist()
    assert c_buf.tolist() == ref_buf.tolist()


def test_shuffle_exchange_int64_rejects_bad_arguments_without_touching_the_buffer():
    import numpy as np

    if not hasattr(speedups, "shuffle_exchange_int64"):
        pytest.skip("this build has no shuffle_exchange_int64 kernel")
    buf = np.arange(3, dtype=np.int64)
    out = np.zeros(2, dtype=np.int64)
    with pytest.raises(IndexError):
        speedups.shuffle_exchange_int64(buf, np.array([0, 3]), np.array([7, 8]), out)
    assert buf.tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        speedups.shuffle_exchange_int64(buf, np.array([0]), np.array([7, 8]), out)
    with pytest.raises(TypeError):
        speedups.shuffle_exchange_int64(buf, np.array([0, 1], dtype=np.int32), np.array([7, 8]),
                                        out)
    ro = np.arange(3, dtype=np.int64)
    ro.flags.writeable = False
    with pytest.raises(ValueError):  # the buffer is written: numpy refuses a read-only one
        speedups.shuffle_exchange_int64(ro, np.array([0, 1]), np.array([7, 8]), out)
    assert buf.tolist() == [0, 1, 2]


# --- decode kernels without the GIL ---------------------------------------------------------------

def _runs_beside(call):
    """Whether another Python thread got to run while ``call()`` was inside the C kernel.

    The switch interval is raised so that the interpreter itself never takes the GIL from this
    thread: the helper thread can only run if the kernel releases the GIL. The helper gives the
    GIL back after each step (a short sleep), so the kernel can always take it again.
    """
    import sys
    import threading
    import time

    steps = [0]
    stop = threading.Event()

    def helper():
        while not stop.is_set():
            steps[0] += 1
            time.sleep(0.0002)

    old = sys.getswitchinterval()
    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    sys.setswitchinterval(30.0)
    try:
        for _ in range(20):  # the helper may be asleep during one call: it cannot be in all
            before = steps[0]
            call()
            if steps[0] != before:
                return True
        return False
    finally:
        sys.setswitchinterval(old)
        stop.set()
        thread.join()


def _example_of(i: int) -> bytes:
    x = struct.pack("<4f", i, -i, 0.5, 1e9)
    feature_x = _field(1, 2, b"x") + _field(2, 2, _field(2, 2, _field(1, 2, x)))
    feature_y = _field(1, 2, b"y") + _field(2, 2, _field(3, 2, _field(1, 2, bytes([i % 100]))))
    return _field(1, 2, _field(1, 2, feature_x) + _field(1, 2, feature_y))


def test_parse_examples_lets_other_threads_run_on_large_batches():
    reference = _example_reference()
    records = [_example_of(i) for i in range(20_000)]
    names, kinds = (b"x", b"y"), (2, 3)
    assert _runs_beside(lambda: speedups.parse_examples(records, names, kinds))
    # the same results as the reference, and errors named the same way from inside that loop
    assert _outcome(speedups.parse_examples, records[:300], names, kinds) == \
        _outcome(reference, records[:300], names, kinds)
    bad = records[:300]
    bad[250] = b"\x0a\x05ab"
    expected = ("error", "length-delimited field runs past the end of its message", 250, None)
    assert _outcome(speedups.parse_examples, bad, names, kinds) == expected
    assert _outcome(reference, bad, names, kinds) == expected
    wrong = records[:300]
    wrong[299] = _field(1, 2, _field(1, 2, _field(1, 2, b"y") + _field(2, 2, _field(2, 2, b""))))
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
    assert _runs_beside(lambda: speedups.parse_recordio_protobuf(records, names, kinds))
    got = speedups.parse_recordio_protobuf(records, names, kinds)
    np.testing.assert_array_equal(got[0][0].reshape(20_000, 8), x)
    bad = records[:300]
    bad[200] = b"\x0a\x05ab"
    expected = ("error", "length-delimited field runs past the end of its message", 200, None)
    assert _outcome(speedups.parse_recordio_protobuf, bad, names, kinds) == expected
    assert _outcome(reference, bad, names, kinds) == expected


def test_parse_csv_floats_lets_other_threads_run_on_large_batches():
    rows = [b"%d,%d.25,-%d.5e3" % (i, i, i) for i in range(50_000)]
    assert _runs_beside(lambda: speedups.parse_csv_floats(rows, 3))
    got = speedups.parse_csv_floats(rows, 3, double=True)
    assert got[12345].tolist() == [12345.0, 12345.25, -12345.5e3]


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


# -- resynchronisation kernels (issue #10, finding 7) ----------------------------------------------

import numpy as np  # noqa: E402

from streamio.formats import masked_crc32c  # noqa: E402
from streamio.formats.recordio import _find_recordio_sync_loop, find_recordio_sync  # noqa: E402
from streamio.formats.tfrecord import _find_tfrecord_sync_loop, find_tfrecord_sync  # noqa: E402
from streamio.formats._tfrecord_sync import find_tfrecord_sync_numpy  # noqa: E402


@st.composite
def garbage_with_headers(draw, stream_strategy):
    """Garbage (random bytes, runs of one byte) with whole or cut valid frames planted in it."""
    pieces = draw(st.lists(st.one_of(
        st.binary(max_size=40),
        st.tuples(st.sampled_from([0, 0xFF, 0x0A]), st.integers(1, 60)).map(
            lambda t: bytes([t[0]]) * t[1]),
        stream_strategy,
        stream_strategy.map(lambda s: s[:len(s) // 2])), max_size=6))
    return b"".join(pieces)


sync_limits = st.one_of(st.just(1 << 28), st.sampled_from([0, 5, 64, -1, 1 << 60, 1 << 70]))


@SLOW_OK
@given(data=garbage_with_headers(tfrecord_streams), limit=sync_limits, wrap=buffer_types,
       draw=st.data())
def test_find_tfrecord_sync_equals_reference(data, limit, wrap, draw):
    pos, end = draw.draw(pos_end(len(data)))
    buf = wrap(data)
    # the C kernel, the specification (the loop) and the numpy search used without C agree
    expected = _find_tfrecord_sync_loop(buf, pos, end, limit)
    assert speedups.find_tfrecord_sync(buf, pos, end, limit) == expected
    assert speedups._find_tfrecord_sync_portable(buf, pos, end, limit) == expected
    assert find_tfrecord_sync_numpy(buf, pos, end, limit) == expected
    assert find_tfrecord_sync(buf, pos, end, limit) == expected


# Garbage where nearly every offset passes the C search's first filter (the length's top bytes
# are zero), so its exact test runs offset after offset: small integers (u64 and u32), mostly-zero
# bytes; frames whole and cut planted in it.
@st.composite
def dense_tfrecord_garbage(draw):
    small = st.lists(st.integers(0, draw(st.sampled_from([1000, 1 << 20]))), min_size=1,
                     max_size=30)
    pieces = draw(st.lists(st.one_of(
        small.map(lambda vs: struct.pack(f"<{len(vs)}Q", *vs)),
        small.map(lambda vs: struct.pack(f"<{len(vs)}I", *vs)),
        st.lists(st.sampled_from([0, 0, 0, 0, 0, 0, 0, 0, 1, 0x80]), max_size=120).map(bytes),
        st.binary(max_size=20),
        tfrecord_streams,
        tfrecord_streams.map(lambda s: s[:len(s) // 2])), min_size=1, max_size=8))
    return b"".join(pieces)


dense_limits = st.one_of(st.just(1 << 28), st.sampled_from(
    [0, 255, 256, 1 << 16, (1 << 32) - 1, 1 << 40, (1 << 56) - 1, 1 << 56, (1 << 64) - 1]))
tfrecord_sync_kernels = [speedups.find_tfrecord_sync, speedups._find_tfrecord_sync_portable]


@SLOW_OK
@given(data=dense_tfrecord_garbage(), limit=dense_limits, draw=st.data())
def test_find_tfrecord_sync_on_dense_candidates_equals_reference(data, limit, draw):
    pos, end = draw.draw(pos_end(len(data)))
    expected = _find_tfrecord_sync_loop(data, pos, end, limit)
    for kernel in tfrecord_sync_kernels:
        assert kernel(data, pos, end, limit) == expected, kernel


@pytest.mark.parametrize("kernel", tfrecord_sync_kernels)
def test_find_tfrecord_sync_never_takes_a_header_cut_by_the_end(kernel):
    # The C search tests 56 offsets per block: whatever offset it starts from, a header that the
    # end cuts short is not sound, and the whole one is found, after small-integer garbage.
    garbage = np.random.default_rng(3).integers(0, 1000, 40, "<u8").tobytes()
    data = garbage + encode_tfrecord(b"payload")
    for pos in range(0, 64):
        for end in range(len(garbage), len(garbage) + 14):
            assert kernel(data, pos, end, 1 << 28) == \
                _find_tfrecord_sync_loop(data, pos, end, 1 << 28), (pos, end)


def test_find_tfrecord_sync_finds_the_header_after_dense_garbage():
    rng = np.random.default_rng(5)
    frame = encode_tfrecord(b"payload")
    garbages = {
        "u64 < 1000": rng.integers(0, 1000, 8_000, "<u8").tobytes(),
        "u32 < 1000": rng.integers(0, 1000, 16_000, "<u4").tobytes(),
        "90% zero bytes": (rng.integers(1, 256, 64_000) * (rng.random(64_000) < 0.1))
        .astype(np.uint8).tobytes(),
    }
    for name, garbage in garbages.items():
        data = garbage + frame
        # a limit that every small integer passes, and one of 2**56 - 1 (any top byte zero)
        for start, limit in [(0, 1 << 28), (1, 1 << 28), (7, 1 << 28), (4095, 1 << 28),
                             (0, (1 << 64) - 1), (0, (1 << 56) - 1)]:
            want = _find_tfrecord_sync_loop(data, start, len(data), limit)
            assert limit > 1 << 28 or want <= len(garbage), name
            for kernel in tfrecord_sync_kernels:
                assert kernel(data, start, len(data), limit) == want, (name, start, limit, kernel)


@pytest.mark.parametrize("kernel", tfrecord_sync_kernels)
def test_find_tfrecord_sync_finds_headers_of_every_length_width_after_zero_free_garbage(kernel):
    # A stretch without zero bytes is passed over to the next zero byte (memchr); the header
    # after it is found whether its length uses 1 or 7 bytes (the limit lets it), also as the
    # last 12 bytes of the span.
    rng = np.random.default_rng(11)
    for width in range(1, 8):
        length = int.from_bytes(bytes(range(1, width + 1)), "little")
        header = struct.pack("<Q", length)
        header += struct.pack("<I", masked_crc32c(header))
        for size in (100, 131, 1000):
            garbage = rng.integers(1, 256, size, np.uint8).tobytes()
            for tail in (b"", b"\x01" * 5):
                data = garbage + header + tail
                for limit in (length, (1 << 8 * width) - 1, (1 << 56) - 1):
                    # from the start, and from each of the 64 offsets before the header (the
                    # header's top zero byte at every place in the search's first block)
                    for pos in (0, *range(size - 64, size + 1)):
                        want = _find_tfrecord_sync_loop(data, pos, len(data), limit)
                        assert want == size, (width, size, limit, pos)
                        assert kernel(data, pos, len(data), limit) == want, (width, size, pos)
                    assert kernel(data, 0, len(data) - len(tail) - 1, limit) == -1


@pytest.mark.parametrize("garbage", [bytes(1000), b"\x01\x02\x03\x04" * 250], ids=["zeros", "words"])
def test_find_recordio_sync_finds_a_header_in_the_last_bytes_after_magic_free_garbage(garbage):
    # Past 16 words without the magic the next 0x0A byte is looked for (memchr): a header that
    # is the span's last 8 bytes is found, at every alignment of the record and the search.
    header = encode_recordio(b"")
    for shift in range(8):
        data = garbage[:len(garbage) - shift] + header
        for base in range(4):
            for pos in (0, 1, 2, 3):
                want = _find_recordio_sync_loop(data, pos, len(data), base, 1000)
                assert (want == len(data) - 8) == ((base + len(data)) % 4 == 0), (shift, base)
                assert speedups.find_recordio_sync(data, pos, len(data), base, 1000) == want
                assert speedups.find_recordio_sync(data, pos, len(data) - 1, base, 1000) == -1


@pytest.mark.parametrize("shape", ["aligned magics", "middle parts", "too large"])
def test_find_recordio_sync_finds_the_header_after_magic_garbage(shape):
    # Every aligned word a magic number that cannot start a record: the C search tests 16 words
    # at a time; it must stop at the record, whatever the alignment of pos, base and end.
    unit = {"aligned magics": MAGIC_BYTES, "middle parts": MAGIC_BYTES + struct.pack("<I", 2 << 29),
            "too large": MAGIC_BYTES + struct.pack("<I", 5000)}[shape]
    garbage = unit * (1000 // len(unit))
    data = garbage + encode_recordio(b"payload") + MAGIC_BYTES
    for base in range(4):
        for pos in range(64):  # groups of 16 words starting at every offset mod 64
            for end in (len(data), len(garbage) + 8, len(garbage) + 7):
                want = find_recordio_sync(data, pos, end, base, 1000)
                assert speedups.find_recordio_sync(data, pos, end, base, 1000) == want, \
                    (base, pos, end)
                if base == 0 and end > len(garbage) + 7:
                    assert want == len(garbage)


@SLOW_OK
@given(data=garbage_with_headers(recordio_payloads.map(recordio_stream)), limit=sync_limits,
       base=st.integers(0, 7), wrap=buffer_types, draw=st.data())
def test_find_recordio_sync_equals_reference(data, limit, base, wrap, draw):
    pos, end = draw.draw(pos_end(len(data)))
    buf = wrap(data)
    expected = _find_recordio_sync_loop(buf, pos, end, base, limit)
    assert speedups.find_recordio_sync(buf, pos, end, base, limit) == expected
    assert find_recordio_sync(buf, pos, end, base, limit) == expected


def test_find_sync_kernels_find_the_planted_header_after_long_garbage():
    frame = encode_tfrecord(b"payload")
    for garbage in (bytes(300_000), os.urandom(300_000), b"\xff" * 300_001):
        data = garbage + frame
        for fn in (speedups.find_tfrecord_sync, find_tfrecord_sync, _find_tfrecord_sync_loop):
            assert fn(data, 0, len(data), 1 << 28) == len(garbage)
            assert fn(data, 0, len(data) - 1, 1 << 28) in (len(garbage), -1)
        rec = encode_recordio(b"payload")
        data = garbage[:len(garbage) & ~3] + rec
        for base in (0, 1, 4):
            expect = len(garbage) & ~3 if base % 4 == 0 else -1
            got = speedups.find_recordio_sync(data, 0, len(data), base, 1 << 28)
            assert got == find_recordio_sync(data, 0, len(data), base, 1 << 28)
            assert got == expect or (base % 4 and got < len(garbage))


def test_find_sync_kernels_reject_bad_arguments():
    with pytest.raises(ValueError):
        speedups.find_tfrecord_sync(b"x" * 20, -1, 20, 100)
    with pytest.raises(ValueError):
        speedups.find_recordio_sync(b"x" * 20, 0, 21, 0, 100)
    with pytest.raises(TypeError):
        speedups.find_recordio_sync(b"x" * 20, 0, 20, 100)


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@pytest.mark.parametrize("accelerate", [True, False])
def test_garbage_between_records_is_skipped_and_counted_across_chunks(fmt, accelerate):
    cls = TFRecordFramer if fmt == "tfrecord" else RecordIOFramer
    encode_one = encode_tfrecord if fmt == "tfrecord" else encode_recordio
    garbage = bytes(50_000) + os.urandom(50_000) + b"\xff" * 10_000  # RecordIO: 4-aligned
    data = encode_one(b"before") + garbage + encode_one(b"after")
    for chunk in (1 << 20, 4096, 7):
        framer = cls(source="g", on_error="skip", accelerate=accelerate)
        out = []
        for at in range(0, len(data), chunk):
            out += framer.feed(data[at:at + chunk])
        out += framer.finish()
        assert out == [b"before", b"after"], chunk
        assert framer.skipped_bytes == len(garbage) and framer.skipped_records == 1, chunk


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
def test_a_gzip_of_zeros_read_under_skip_ends_with_every_byte_skipped(tmp_path, fmt):
    import gzip

    import streamio
    from streamio.reader import RecordReader

    path = tmp_path / f"zeros.{fmt}.gz"
    path.write_bytes(gzip.compress(bytes(10 * 1024 * 1024), compresslevel=1))
    assert path.stat().st_size < 100_000
    reader = RecordReader(str(path), fmt, on_error="skip")
    assert list(reader) == []
    assert reader.stats.skipped_bytes == 10 * 1024 * 1024
    assert list(streamio.read_records(str(path), fmt, on_error="skip")) == []


# -- parse_sequence_examples (issue #14, item 2) ----------------------------------------------------

@st.composite
def feature_list(draw) -> bytes:
    """A FeatureList: 0-4 steps (Features, some empty), maybe unknown fields between them."""
    parts = [_field(1, 2, draw(feature())) for _ in range(draw(st.integers(0, 4)))]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(unknown_fields))
    return b"".join(parts)


def _entries(draw, value) -> list:
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(EXAMPLE_KEYS))
        entry = _field(1, 2, key) + _field(2, 2, draw(value))
        if draw(st.integers(0, 9)) == 0:  # a value given twice in one entry: merged
            entry += _field(2, 2, draw(value))
        entries.append(_field(1, 2, entry))
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
            body.append(_field(number, 2, b"".join(entries[:cut])))
        if cut < len(entries):
            body.append(_field(number, 2, b"".join(entries[cut:])))
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
        return _field(1, 2, _field(1, 2, key) + _field(2, 2, value))

    context = (entry(b"f", _field(2, 2, _field(1, 2, struct.pack("<2f", i, 0.5))))
               + entry(b"n", _field(3, 2, _field(1, 2, _varint(i)))))
    a = b"".join(_field(1, 2, _field(2, 2, _field(1, 2, struct.pack("<3f", i, t, -t))))
                 for t in range(steps))
    b = b"".join(_field(1, 2, _field(3, 2, _field(1, 2, _varint(i * 100 + t)))) for t in range(steps))
    return _field(1, 2, context) + _field(2, 2, entry(b"a", a) + entry(b"b", b))


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
    wrong[299] = _field(2, 2, _field(1, 2, _field(1, 2, b"b") + _field(2, 2, _field(
        1, 2, _field(2, 2, b"")))))
    got = _outcome(speedups.parse_sequence_examples, wrong, *args)
    assert got == _outcome(reference, wrong, *args)
    assert got[2:] == (299, "b")
    cut = list(records)  # record 120's int64 list ends inside a varint: found after the loop
    cut[120] = _field(2, 2, _field(1, 2, _field(1, 2, b"b") + _field(2, 2, _field(
        1, 2, _field(3, 2, _field(1, 2, b"\x81"))))))
    got = _outcome(speedups.parse_sequence_examples, cut, *args)
    assert got == _outcome(reference, cut, *args)
    assert got[2:] == (120, "b")


def test_parse_sequence_examples_lets_other_threads_run_and_checks_arguments():
    _sequence_reference()
    records = [_sequence_example_of(i, 20) for i in range(5_000)]
    args = ((b"f", b"n"), (2, 3), (b"a", b"b"), (2, 3))
    assert _runs_beside(lambda: speedups.parse_sequence_examples(records, *args))
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
            return _field(1, 2, b"".join(_field(1, 2, v) for v in vals))
        if dtype == "float32":
            return _field(2, 2, _field(1, 2, struct.pack("<%df" % n, *vals)))
        return _field(3, 2, _field(1, 2, b"".join(_varint(v) for v in vals)))

    records = [_field(2, 2, _field(1, 2, _field(1, 2, b"s") + _field(2, 2, b"".join(
        _field(1, 2, step(v)) for v in rec)))) for rec in values]
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
    tensor = _field(1, 2, struct.pack("<%df" % nvalues, *range(nvalues)))
    if keys or draw(st.booleans()):
        tensor += _field(2, 2, b"".join(_varint(k) for k in keys))
    if shape is not None:
        tensor += _field(3, 2, b"".join(_varint(d) for d in shape))
    value = _field(2, 2, tensor)  # Value.float32_tensor
    label = _field(2, 2, _field(1, 2, struct.pack("<f", 1.0)))
    return (_field(1, 2, _field(1, 2, b"x") + _field(2, 2, value))
            + _field(2, 2, _field(1, 2, b"y") + _field(2, 2, label)))


SOUND_SPARSE = (_field(1, 2, _field(1, 2, b"x") + _field(2, 2, _field(2, 2, _field(
    1, 2, struct.pack("<2f", 1, 2)) + _field(2, 2, b"\x01\x07") + _field(3, 2, b"\x0a"))))
    + _field(2, 2, _field(1, 2, b"y") + _field(2, 2, _field(2, 2, _field(1, 2, b"\0\0\x80?")))))


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

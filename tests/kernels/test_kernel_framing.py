"""The framing kernels (streamio/_c/framing.c: scan_tfrecords, scan_recordio, the sync searches)
against the pure-Python references they replace.

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

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

from streamio.formats import encode_recordio, encode_tfrecord, masked_crc32c  # noqa: E402
from streamio.formats import _framing  # noqa: E402
from streamio.formats.recordio import (MAGIC_BYTES, RecordIOFramer,  # noqa: E402
                                       _find_recordio_sync_loop, find_recordio_sync, scan_recordio)
from streamio.formats.tfrecord import (TFRecordFramer, _find_tfrecord_sync_loop,  # noqa: E402
                                       find_tfrecord_sync, scan_tfrecord_spans, scan_tfrecords)
from streamio.formats._tfrecord_sync import find_tfrecord_sync_numpy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
# Every result, error and counter a user can see, from data fed in pieces: the fuzz harness's.
from targets import run_framer  # noqa: E402

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
@given(data=any_tfrecord, verify=st.booleans(), limit=limits, wrap=buffer_types,
       room=st.one_of(st.integers(0, 4), st.just(1000)), draw=st.data())
def test_scan_tfrecord_spans_equals_reference_and_frames_what_scan_tfrecords_frames(
        data, verify, limit, wrap, room, draw):
    """The span kernel and its reference agree; with room to spare they frame the records,
    pos and status of scan_tfrecords; once full they stop there with OK."""
    pos, end = draw.draw(pos_end(len(data)))
    spans = [np.full(2 * room, -1, np.int64) for _ in range(2)]
    fast = speedups.scan_tfrecord_spans(wrap(data), pos, end, verify, limit, spans[0])
    ref = scan_tfrecord_spans(wrap(data), pos, end, verify, limit, spans[1])
    assert fast == ref
    assert spans[0].tolist() == spans[1].tolist()
    n, after, status = fast
    made = [data[o:o + size] for o, size in spans[0][:2 * n].reshape(-1, 2).tolist()]
    listed: list = []
    scanned = scan_tfrecords(data, pos, end, verify, limit, listed)
    if n < room:
        assert (made, (after, status)) == (listed, scanned)
    else:
        assert (made, status) == (listed[:room], _framing.OK)


def test_scan_tfrecord_spans_checks_its_arguments():
    stream = tfrecord_stream([b"abc", b"de"])
    for fn in (speedups.scan_tfrecord_spans, scan_tfrecord_spans):
        assert fn(stream, 0, len(stream), True, 100, np.zeros(8, np.int64)) == (
            2, len(stream), _framing.OK)
        with pytest.raises(BufferError):
            fn(stream, 0, len(stream), True, 100, b"\0" * 16)
        with pytest.raises(ValueError, match="int64"):
            fn(stream, 0, len(stream), True, 100, np.zeros(4, np.int32))
        with pytest.raises(ValueError, match="past the end"):
            fn(stream, 0, len(stream) + 1, True, 100, np.zeros(8, np.int64))
        shared = bytearray(stream + bytes(64))
        with pytest.raises(ValueError, match="spans overlaps buf"):
            fn(shared, 0, len(stream), True, 100, memoryview(shared)[len(stream):].cast("q"))


@SLOW_OK
@given(data=any_tfrecord, on_error=st.sampled_from(["raise", "skip"]), verify=st.booleans(),
       limit=st.sampled_from([1 << 28, 100]), room=st.one_of(st.integers(1, 3), st.just(4096)),
       accelerate=st.booleans(), draw=st.data())
def test_tfrecord_framer_through_feed_spans_gives_what_feed_gives(data, on_error, verify, limit,
                                                                 room, accelerate, draw):
    """The same records in the same order, the same errors and counters, whichever way the
    records of each chunk come (completed from earlier chunks, left in the chunk as spans, or
    after a fault or a full span buffer), and whether the spans' payload CRCs are checked by the
    scan or left to the consumer (who reports the first mismatch to ``span_fault``): the chunk
    buffer is overwritten between feeds."""
    cuts = sorted_cuts(draw, data)

    def make():
        return TFRecordFramer(verify=verify, on_error=on_error, max_record_size=limit,
                              source="s", accelerate=accelerate)

    fed = run_framer(make, data, cuts)
    assert run_framer(make, data, cuts, room) == fed
    assert run_framer(make, data, cuts, room, crcs=True) == fed


def test_feed_spans_leaves_a_chunks_whole_records_in_it():
    records = [bytes([i]) * (i * 7) for i in range(30)]
    stream = tfrecord_stream(records)
    framer = TFRecordFramer()
    pairs = np.zeros(200, np.int64)
    cut = len(tfrecord_stream(records[:10])) + 5  # inside record 10
    first, buffer, n, at = framer.feed_spans(stream[:cut], pairs)
    assert (first, n, at) == ([], 10, 0)
    assert [bytes(buffer[o:o + size]) for o, size in pairs[:20].reshape(-1, 2)] == records[:10]
    rest, buffer, n, at = framer.feed_spans(stream[cut:], pairs)
    assert rest[:at] == records[10:11] and rest[at:] == [] and n == 19  # record 10 completed
    assert [bytes(buffer[o:o + size]) for o, size in pairs[:38].reshape(-1, 2)] == records[11:]
    assert framer.finish() == [] and framer.records == 30
    # A format without a span kernel frames everything into the list.
    recordio = RecordIOFramer()
    stream = recordio_stream(records)
    got, buffer, n, at = recordio.feed_spans(stream, pairs)
    assert (buffer, n, at) == (None, 0, len(got)) and got + recordio.finish() == records


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


# -- resynchronisation kernels (issue #10, finding 7) ----------------------------------------------


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

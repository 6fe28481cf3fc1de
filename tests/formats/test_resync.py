"""The pure-Python resynchronisation searches (used where the C extension did not build)
against their specifications, the loops; no C needed, so these run everywhere.

``find_tfrecord_sync_numpy`` tests a block of offsets at once; it must give the loop's answer on
any buffer, limit and span: garbage, runs of one byte, dense small integers (many plausible
lengths, so the vector CRC path runs), whole and cut frames planted anywhere, blocks cut small
so a header straddles a block boundary. ``find_recordio_sync_numpy`` likewise, on garbage made
of magic numbers (aligned or not, before an lrec that is sound or not).
"""

from __future__ import annotations

import os
import struct
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.errors import CorruptRecordError
from streamio.formats import _recordio_sync, _tfrecord_sync, encode_recordio, encode_tfrecord
from streamio.formats import masked_crc32c
from streamio.formats._recordio_sync import find_recordio_sync_numpy
from streamio.formats._tfrecord_sync import _masked_crcs, find_tfrecord_sync_numpy
from streamio.formats.recordio import (MAGIC_BYTES, RecordIOFramer, _find_recordio_sync_loop,
                                       find_recordio_sync)
from streamio.formats.tfrecord import (TFRecordFramer, _find_tfrecord_sync_loop,
                                       find_tfrecord_sync)

SLOW_OK = settings(deadline=None, max_examples=300,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

frames = st.lists(st.binary(max_size=60), min_size=1, max_size=4).map(
    lambda rs: b"".join(encode_tfrecord(r) for r in rs))
# u64 values a header's length field could hold (small ones are plausible lengths; many of them
# in a row is the "dense" case: more than 1/8 of the offsets pass the length check)
small_u64s = st.lists(st.integers(0, 1 << 20), min_size=1, max_size=40).map(
    lambda vs: struct.pack(f"<{len(vs)}Q", *vs))


@st.composite
def damaged_streams(draw):
    """Garbage, byte runs, dense small integers and frames (whole, cut, bit-flipped), joined."""
    pieces = draw(st.lists(st.one_of(
        st.binary(max_size=80),
        st.tuples(st.sampled_from([0, 0xFF, 0x0A, 0x01]), st.integers(1, 300)).map(
            lambda t: bytes([t[0]]) * t[1]),
        small_u64s,
        frames,
        frames.map(lambda s: s[:len(s) // 2]),
        frames.map(lambda s: s[1:])), max_size=8))
    data = bytearray(b"".join(pieces))
    for _ in range(draw(st.integers(0, 3))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


limits = st.one_of(st.just(1 << 28), st.sampled_from([0, 1, 5, 64, 1 << 20, -1, (1 << 64) - 1,
                                                      1 << 64, 1 << 70]))
buffer_types = st.sampled_from([bytes, bytearray, memoryview, lambda b: memoryview(bytearray(b))])
blocks = st.sampled_from([(4096, 1 << 16), (1, 1), (3, 7), (16, 64)])


@SLOW_OK
@given(data=damaged_streams(), limit=limits, wrap=buffer_types, block=blocks, draw=st.data())
def test_numpy_search_gives_the_loops_answer(data, limit, wrap, block, draw):
    n = len(data)
    pos = draw.draw(st.one_of(st.just(0), st.integers(0, n)))
    end = draw.draw(st.one_of(st.just(n), st.integers(0, n)))
    buf = wrap(data)
    expected = _find_tfrecord_sync_loop(buf, pos, end, limit)
    with mock.patch.multiple(_tfrecord_sync, FIRST_BLOCK=block[0], MAX_BLOCK=block[1]):
        assert find_tfrecord_sync_numpy(buf, pos, end, limit) == expected
    assert find_tfrecord_sync(buf, pos, end, limit) == expected


def test_no_run_of_one_byte_holds_a_sound_header():
    # The numpy search skips a block of one repeated byte without a CRC on this ground.
    for b in range(256):
        run = bytes([b]) * 12
        assert _find_tfrecord_sync_loop(run, 0, 12, (1 << 64) - 1) == -1, b
        assert find_tfrecord_sync_numpy(bytes([b]) * 5000, 0, 5000, (1 << 64) - 1) == -1


def test_the_numpy_search_leaves_no_export_behind():
    # The framer searches a memoryview of a bytearray it then releases and resizes.
    data = bytearray(bytes(5000) + encode_tfrecord(b"x"))
    view = memoryview(data)
    assert find_tfrecord_sync_numpy(view, 0, len(data), 1 << 28) == 5000
    view.release()
    data += b"more"  # raises BufferError if a numpy array still held the buffer


@given(values=st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=50))
def test_vector_crc_equals_masked_crc32c(values):
    got = _masked_crcs(np.array(values, np.uint64)).tolist()
    assert got == [masked_crc32c(struct.pack("<Q", v)) for v in values]


def test_long_searches_find_the_planted_header():
    frame = encode_tfrecord(b"payload")
    rng = np.random.default_rng(7)
    garbages = {
        "zeros": bytes(700_000),
        "random": os.urandom(700_000),
        "ff": b"\xff" * 700_001,
        # every 8th offset a plausible length: the vector CRC path over whole blocks
        "small int64": rng.integers(0, 1000, 90_000).astype("<u8").tobytes(),
        "90% zero bytes": (rng.integers(1, 256, 700_000) * (rng.random(700_000) < 0.1))
        .astype(np.uint8).tobytes(),
    }
    for name, garbage in garbages.items():
        data = garbage + frame
        expected = _find_tfrecord_sync_loop(data, 0, len(data), 1 << 28)
        assert expected <= len(garbage), name
        for start in (0, 1, 4095, 4097, 65_537):
            want = _find_tfrecord_sync_loop(data, start, len(data), 1 << 28)
            assert find_tfrecord_sync(data, start, len(data), 1 << 28) == want, (name, start)
        assert find_tfrecord_sync(data, 0, len(data), 1 << 28) == expected, name
        assert find_tfrecord_sync(data, 0, len(data) - 1, 1 << 28) in (expected, -1), name


def feed_in_chunks(framer, data: bytes, chunk: int) -> list:
    """Every record ``framer`` gives for ``data`` fed ``chunk`` bytes at a time, as a reader
    feeds it, then finished."""
    out = []
    for at in range(0, len(data), chunk):
        out += framer.feed(memoryview(data)[at:at + chunk])
    return out + framer.finish()


def test_pure_python_framer_skips_megabytes_of_garbage_and_counts_them():
    # What a user on a platform without the C extension sees: a damaged header, then 6 MB of
    # zeros and random bytes, then good records; fed in 1 MiB chunks as a reader does.
    before = [b"rec%d" % i for i in range(3)]
    after = [os.urandom(100) for _ in range(3)]
    damaged = bytearray(encode_tfrecord(b"lost"))
    damaged[3] ^= 0x40  # the length field: its CRC no longer checks out
    garbage = bytes(3_000_000) + os.urandom(3_000_000)
    data = b"".join(map(encode_tfrecord, before)) + damaged + garbage + \
        b"".join(map(encode_tfrecord, after))
    framer = TFRecordFramer(source="damaged", on_error="skip", accelerate=False)
    assert framer._sync_kernel is find_tfrecord_sync
    out = feed_in_chunks(framer, data, 1 << 20)
    assert out == before + after
    assert framer.skipped_records == 1
    assert framer.skipped_bytes == len(damaged) + len(garbage)


def test_pure_python_framer_under_raise_names_the_damaged_header():
    data = encode_tfrecord(b"ok") + bytes(20) + encode_tfrecord(b"next")
    framer = TFRecordFramer(source="s", on_error="raise", accelerate=False)
    assert framer.feed(data) == [b"ok"]
    try:
        framer.finish()
    except CorruptRecordError as err:
        assert (err.source, err.offset, err.record_index) == ("s", len(encode_tfrecord(b"ok")), 1)
    else:
        raise AssertionError("the zeros after the first record were taken for a record")


# -- RecordIO ----------------------------------------------------------------------------------

def _lrec(cflag: int, length: int) -> bytes:
    return struct.pack("<I", cflag << 29 | length)


# The hostile shapes: each magic number found costs the loop a Python iteration.
magic_runs = st.one_of(
    st.integers(1, 40).map(lambda n: MAGIC_BYTES * n),  # every word the magic (cflag 6 after it)
    st.tuples(st.integers(0, 3), st.integers(0, 300), st.integers(1, 20)).map(  # magic | lrec
        lambda t: (MAGIC_BYTES + _lrec(*t[:2])) * t[2]),
    st.tuples(st.integers(1, 3), st.integers(1, 20)).map(  # magics off the 4-byte grid
        lambda t: (b"\0" * t[0] + MAGIC_BYTES + _lrec(0, 8)) * t[1]))


@st.composite
def damaged_recordio(draw):
    """Garbage, byte runs, runs of magic numbers and frames (whole, cut, bit-flipped), joined."""
    pieces = draw(st.lists(st.one_of(
        st.binary(max_size=60),
        st.tuples(st.sampled_from([0, 0x0A, 0xCE]), st.integers(1, 100)).map(
            lambda t: bytes([t[0]]) * t[1]),
        magic_runs,
        st.binary(max_size=60).map(encode_recordio),
        st.binary(max_size=60).map(lambda b: encode_recordio(b)[1:])), max_size=8))
    data = bytearray(b"".join(pieces))
    for _ in range(draw(st.integers(0, 2))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


recordio_limits = st.one_of(st.just(1 << 28), st.sampled_from([0, 1, 8, 100, 299, (1 << 29) - 1,
                                                               -1, 1 << 70]))
recordio_blocks = st.sampled_from([(256, 1 << 14), (1, 1), (3, 7), (16, 64)])


@SLOW_OK
@given(data=damaged_recordio(), limit=recordio_limits, base=st.integers(0, 7),
       wrap=buffer_types, block=recordio_blocks, draw=st.data())
def test_recordio_numpy_search_gives_the_loops_answer(data, limit, base, wrap, block, draw):
    n = len(data)
    pos = draw.draw(st.one_of(st.just(0), st.integers(0, n)))
    end = draw.draw(st.one_of(st.just(n), st.integers(0, n)))
    buf = wrap(data)
    expected = _find_recordio_sync_loop(buf, pos, end, base, limit)
    with mock.patch.multiple(_recordio_sync, FIRST_BLOCK=block[0], MAX_BLOCK=block[1]):
        assert find_recordio_sync_numpy(buf, pos, end, base, limit) == expected
        assert find_recordio_sync(buf, pos, end, base, limit) == expected


def test_recordio_search_through_magic_numbers_finds_the_planted_header():
    # 60-200 KB of each hostile shape, then one record: the loop rejects every magic number
    # before it, the numpy search takes over after a few; both must stop at the record (or, where
    # base puts it off the grid, at the same later offset or none).
    hostile = {
        "aligned magics": MAGIC_BYTES * 20_000,
        "middle parts": (MAGIC_BYTES + _lrec(2, 100)) * 10_000,
        "last parts": (MAGIC_BYTES + _lrec(3, 0)) * 10_000,
        "too large": (MAGIC_BYTES + _lrec(0, 5000)) * 10_000,
        "off the grid": (b"\0\0" + MAGIC_BYTES + _lrec(0, 8) + b"\0\0") * 15_000,
    }
    record = encode_recordio(b"payload")
    for name, garbage in hostile.items():
        data = garbage + record + MAGIC_BYTES * 3
        for base in (0, 2):
            for start in (0, 1, 4, 4097):
                want = _find_recordio_sync_loop(data, start, len(data), base, 1000)
                if base == 0:
                    assert want == len(garbage), name
                assert find_recordio_sync(data, start, len(data), base, 1000) == want, (name, base)
                assert find_recordio_sync_numpy(data, start, len(data), base, 1000) == want
            # the record's header cut by the end: not a header
            for cut in range(1, 9):
                end = len(garbage) + 8 - cut
                want = _find_recordio_sync_loop(data, 0, end, base, 1000)
                assert find_recordio_sync(data, 0, end, base, 1000) == want, (name, base, cut)


def test_pure_python_recordio_framer_skips_magic_garbage():
    # What a user without the C extension sees: a damaged record, then 400 KB of magic numbers
    # before middle-part lrecs (nothing can start there), then good records, in 64 KiB chunks.
    before = [b"rec%d" % i for i in range(3)]
    after = [os.urandom(100) for _ in range(3)]
    damaged = bytearray(encode_recordio(b"lost-record"))
    damaged[0] ^= 1  # the magic number
    garbage = (MAGIC_BYTES + _lrec(2, 100)) * 50_000
    data = b"".join(map(encode_recordio, before)) + damaged + garbage + \
        b"".join(map(encode_recordio, after))
    framer = RecordIOFramer(source="damaged", on_error="skip", accelerate=False)
    assert framer._sync_kernel is find_recordio_sync
    out = feed_in_chunks(framer, data, 1 << 16)
    assert out == before + after
    assert framer.skipped_bytes == len(damaged) + len(garbage)

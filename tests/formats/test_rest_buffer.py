"""Large TFRecords completed in place: a frame cut by the end of a chunk is finished in a buffer
of its own size, which the reader fills straight from the source (``rest_buffer`` /
``rest_filled``). Whatever mix of chunks and rest-buffer reads delivers the stream, the records
and the errors (class, offset, record index, source) are those of feeding it whole, with the C
kernels and with the pure-Python reference."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.errors import CorruptRecordError, FormatError, TruncatedStreamError, UsageError
from streamio.formats import encode_tfrecord
from streamio.formats._framing import LengthPrefixedFramer
from streamio.formats.tfrecord import TFRecordFramer
from streamio.reader import read_records

MIN = LengthPrefixedFramer.REST_BUFFER_MIN


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def feed_as_reader(framer, stream: bytes, chunk_sizes, rest_sizes):
    """Deliver ``stream`` the way RecordReader does: a chunk, or, whenever the framer offers a
    rest buffer, a read of at most the next ``rest_sizes`` bytes into it. Returns (records,
    rest reads made, error tuple or None)."""
    out, pos, rest_reads = [], 0, 0
    chunks, rests = iter(chunk_sizes), iter(rest_sizes)
    try:
        while pos < len(stream):
            rest = framer.rest_buffer()
            if rest is not None:
                n = min(len(rest), next(rests, len(rest)), len(stream) - pos)
                rest[:n] = stream[pos:pos + n]
                rest.release()
                pos += n
                rest_reads += 1
                out += framer.rest_filled(n)
                continue
            n = max(1, next(chunks, 1 << 20))
            out += framer.feed(stream[pos:pos + n])
            pos += n
        out += framer.finish()
    except FormatError as err:
        return out, rest_reads, (type(err), err.offset, err.record_index, err.source)
    return out, rest_reads, None


def whole(stream: bytes, accelerate: bool, **options):
    framer = TFRecordFramer(source="s", accelerate=accelerate, **options)
    out = []
    try:
        out += framer.feed(stream)
        out += framer.finish()
    except FormatError as err:
        return out, (type(err), err.offset, err.record_index, err.source)
    return out, None


sizes = st.lists(st.sampled_from([0, 5, 1000, MIN - 1, MIN + 7, 3 * MIN, 70_000]), min_size=1,
                 max_size=6)
cut_sizes = st.lists(st.integers(1, 90_000), max_size=8)


@pytest.mark.parametrize("accelerate", [True, False])
@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(record_sizes=sizes, chunks=cut_sizes, rests=cut_sizes, seed=st.integers(0, 3))
def test_records_are_the_written_ones_at_any_mix_of_chunks_and_rest_reads(
        accelerate, record_sizes, chunks, rests, seed):
    records = [payload(n, seed + i) for i, n in enumerate(record_sizes)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    framer = TFRecordFramer(source="s", accelerate=accelerate)
    out, _, err = feed_as_reader(framer, stream, chunks, rests)
    assert err is None
    assert out == records
    assert framer.offset == len(stream)


@pytest.mark.parametrize("accelerate", [True, False])
@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(record_sizes=sizes, chunks=cut_sizes, rests=cut_sizes,
       flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1,
                      max_size=2),
       cut_end=st.integers(0, 200_000), on_error=st.sampled_from(["raise", "skip"]))
def test_damage_gives_the_same_records_and_error_as_the_whole_stream(
        accelerate, record_sizes, chunks, rests, flips, cut_end, on_error):
    records = [payload(n, i) for i, n in enumerate(record_sizes)]
    stream = bytearray(b"".join(encode_tfrecord(r) for r in records))
    for where, xor in flips:
        stream[where % len(stream)] ^= xor
    stream = bytes(stream[:max(1, len(stream) - cut_end % 50_000)])  # maybe truncated too
    expected = whole(stream, accelerate, on_error=on_error)
    framer = TFRecordFramer(source="s", accelerate=accelerate, on_error=on_error)
    out, _, err = feed_as_reader(framer, stream, chunks, rests)
    assert (out, err) == expected
    if on_error == "raise":
        assert out == records[:len(out)]  # the records before a fault are delivered


def test_a_large_frame_cut_by_a_chunk_is_offered_and_a_bad_crc_in_it_is_reported():
    records = [payload(100_000, i) for i in range(4)]
    frames = [encode_tfrecord(r) for r in records]
    stream = bytearray(b"".join(frames))
    bad = len(frames[0]) + len(frames[1])  # record 2's frame
    stream[bad + 12 + 90_000] ^= 0x40  # a payload byte that arrives by a rest read
    framer = TFRecordFramer(source="pipe")
    out, rest_reads, err = feed_as_reader(framer, bytes(stream), [150_000] * 10, [30_000] * 10)
    assert rest_reads > 0  # the path under test was taken
    assert out == records[:2]
    assert err == (CorruptRecordError, bad, 2, "pipe")


def test_a_stream_cut_inside_a_frame_being_completed_is_truncation_at_its_start():
    records = [payload(100_000, i) for i in range(2)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    start = len(encode_tfrecord(records[0]))
    framer = TFRecordFramer(source="pipe")
    out, rest_reads, err = feed_as_reader(framer, stream[:start + 60_000], [start + 20_000],
                                          [10_000] * 10)
    assert rest_reads > 0
    assert out == records[:1]
    assert err == (TruncatedStreamError, start, 1, "pipe")


def test_rest_filled_checks_its_argument():
    framer = TFRecordFramer(source="s")
    with pytest.raises(UsageError):
        framer.rest_filled(5)  # nothing was offered
    stream = encode_tfrecord(payload(100_000, 0))
    assert framer.feed(stream[:1000]) == []
    rest = framer.rest_buffer()
    assert len(rest) == len(stream) - 1000
    for bad in (0, -1, len(rest) + 1, True):
        with pytest.raises(UsageError):
            framer.rest_filled(bad)
    rest[:] = stream[1000:]
    assert framer.rest_filled(len(rest)) == [stream[12:-4]]
    assert framer.rest_buffer() is None


def test_recordio_and_text_framers_offer_no_rest_buffer():
    from streamio.formats import make_framer

    for fmt in ("recordio", "csv", "lines"):
        assert make_framer(fmt, source="s").rest_buffer() is None


@pytest.mark.parametrize("verify", [True, False])
def test_fifo_of_large_records_with_a_corrupt_one(fifo, verify):
    """A real FIFO fed by another process in odd-sized pieces: the reader takes the rest-buffer
    path (small reads leave most of each 100 KB frame to it) and delivers the records before a
    bad one, then names the source, offset and record."""
    records = [payload(100_000 + 13 * i, i) for i in range(12)]
    frames = [encode_tfrecord(r) for r in records]
    stream = bytearray(b"".join(frames))
    bad = sum(map(len, frames[:7]))
    stream[bad + 12 + 77_777] ^= 1
    path = fifo.make(bytes(stream), 4093, 65536, 1 << 20)
    got = []
    reader = read_records(path, "tfrecord", verify=verify, read_size=40_000, read_timeout=30)
    if not verify:
        got = list(reader)
        assert len(got) == len(records) and got[:7] == records[:7] and got[8:] == records[8:]
        assert got[7] != records[7]
        return
    with pytest.raises(CorruptRecordError) as info:
        for record in reader:
            got.append(record)
    assert got == records[:7]
    assert (info.value.source, info.value.offset, info.value.record_index) == (path, bad, 7)


def test_fifo_records_match_a_regular_file_read(fifo, tmp_path):
    records = [payload(n, n) for n in (100_000, 17, 250_000, 40_000, 100_000, 3)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    path = fifo.make(stream, 1, 50_000, 7)
    assert list(read_records(path, "tfrecord", read_size=65536, read_timeout=30)) == records
    plain = tmp_path / "plain.tfrecord"
    plain.write_bytes(stream)
    assert list(read_records(str(plain), "tfrecord", read_size=65536)) == records

"""``RecordReader.record_lists(large_read_size=...)``: a reader that finds its records large
reads larger chunks after its first (what a mix asks of its inputs, see
``streamio.pipeline.mix``).

What a user cares about: the records are exactly those of a plain read whatever the chunk
sizes; large records are read in the larger chunks, small ones keep the reader's own; a byte
range and a user's own read size are left alone; a bad value is a clear error. The reads are
seen as the source sees them: a binary file object (a real source a user may pass) that
notes the size of each buffer it is asked to fill (``support.recording``).
"""

from __future__ import annotations

import gzip
import random

import pytest

from streamio import _read_buffers as read_buffers
from streamio.errors import UsageError
from streamio.formats import encode_tfrecord
from streamio.formats.tfrecord import CONFIRM_BYTES
from streamio.reader import PROBE_READ_SIZE, SPAN_MEAN_MAX, RecordReader

from support.recording import RecordingStream

KIB = 1024


def _records(n: int, size: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(size // 2, size + size // 2)) for _ in range(n)]


def _read(data: bytes, *, read_size: int, large: int | None, compression="infer", spans=False):
    source = RecordingStream(data)
    reader = RecordReader(source, "tfrecord", read_size=read_size, compression=compression)
    records = [bytes(r) for block in reader.record_lists(spans=spans, large_read_size=large)
               for r in block]
    return records, source.sizes


@pytest.fixture(autouse=True)
def _empty_pool():
    read_buffers.clear()
    yield
    read_buffers.clear()


@pytest.mark.parametrize("spans", [False, True], ids=["lists", "spans"])
def test_large_records_are_read_in_the_larger_chunks_after_a_small_first_read(spans):
    records = _records(300, 8 * KIB)  # 8 KiB on average: large (over SPAN_MEAN_MAX)
    data = b"".join(encode_tfrecord(r) for r in records)
    got, sizes = _read(data, read_size=128 * KIB, large=512 * KIB, spans=spans)
    assert got == records
    # A first read of PROBE_READ_SIZE tells the records' size; every later read is larger.
    assert sizes[0] == PROBE_READ_SIZE
    assert set(sizes[1:]) == {512 * KIB}
    # Each byte read once, in as few reads as those sizes allow (the last read finds the end).
    assert len(sizes) == 2 + -(-(len(data) - PROBE_READ_SIZE) // (512 * KIB))


@pytest.mark.parametrize("spans", [False, True], ids=["lists", "spans"])
def test_small_records_keep_the_readers_own_read_size(spans):
    records = _records(4000, 200)
    data = b"".join(encode_tfrecord(r) for r in records)
    got, sizes = _read(data, read_size=128 * KIB, large=512 * KIB, spans=spans)
    assert got == records
    assert sizes[0] == PROBE_READ_SIZE and set(sizes[1:]) == {128 * KIB}


def test_a_record_larger_than_the_first_read_counts_as_large():
    records = _records(20, 160 * KIB)  # none whole in the first 64 KiB
    data = b"".join(encode_tfrecord(r) for r in records)
    got, sizes = _read(data, read_size=128 * KIB, large=1024 * KIB)
    assert got == records
    # Chunks after the first are 1 MiB; the reader also reads the rest of a large frame
    # straight into the frame (its own, smaller reads).
    assert sizes[0] == PROBE_READ_SIZE and 1024 * KIB in sizes[1:]
    assert all(size <= 1024 * KIB for size in sizes)


def test_a_compressed_source_grows_its_compressed_reads():
    records = _records(400, 8 * KIB)
    data = gzip.compress(b"".join(encode_tfrecord(r) for r in records), compresslevel=1)
    got, sizes = _read(data, read_size=128 * KIB, large=512 * KIB, compression="gzip")
    assert got == records
    assert sizes[0] == PROBE_READ_SIZE and set(sizes[1:]) == {512 * KIB}


def test_without_large_read_size_or_with_a_smaller_one_nothing_changes():
    records = _records(300, 8 * KIB)
    data = b"".join(encode_tfrecord(r) for r in records)
    for large in (None, 64 * KIB, 128 * KIB):
        got, sizes = _read(data, read_size=128 * KIB, large=large)
        assert got == records
        assert set(sizes) == {128 * KIB}


def test_a_byte_range_keeps_its_read_size(tmp_path):
    records = _records(300, 8 * KIB)
    path = tmp_path / "r.tfrecord"
    path.write_bytes(b"".join(encode_tfrecord(r) for r in records))
    size = path.stat().st_size
    halves = []
    for byte_range in ((0, size // 2), (size // 2, None)):
        reader = RecordReader(str(path), "tfrecord", read_size=64 * KIB, byte_range=byte_range)
        halves.append([bytes(r) for block in reader.record_lists(large_read_size=512 * KIB)
                       for r in block])
        # The reads of a range are never above its read size: the stats count them (its
        # range, the confirmation window past its end, one read).
        assert reader.stats.bytes_read <= ((byte_range[1] or size) - byte_range[0]
                                           + CONFIRM_BYTES + 8 * KIB + 64 * KIB)
    assert halves[0] + halves[1] == records


def test_the_first_read_decides_once():
    """Large records first, then small ones: the reader keeps the larger chunks."""
    large, small = _records(40, 8 * KIB, 1), _records(6000, 100, 2)
    data = b"".join(encode_tfrecord(r) for r in large + small)
    got, sizes = _read(data, read_size=128 * KIB, large=256 * KIB)
    assert got == large + small
    assert sizes[0] == PROBE_READ_SIZE and set(sizes[1:]) == {256 * KIB}
    # Small first, then large: the reader's own size throughout.
    data = b"".join(encode_tfrecord(r) for r in small + large)
    got, sizes = _read(data, read_size=128 * KIB, large=256 * KIB)
    assert got == small + large
    assert sizes[0] == PROBE_READ_SIZE and set(sizes[1:]) == {128 * KIB}
    assert SPAN_MEAN_MAX < 8 * KIB // 2 and SPAN_MEAN_MAX > 100 + 16  # what the data assume


def test_the_buffers_go_back_to_the_pool_for_the_next_reader():
    records = _records(300, 8 * KIB)
    data = b"".join(encode_tfrecord(r) for r in records)
    _read(data, read_size=128 * KIB, large=512 * KIB)
    # The probe's buffer and the larger one, kept; not the reader's own size (never made).
    assert read_buffers.kept_bytes() == PROBE_READ_SIZE + 512 * KIB
    _read(data, read_size=128 * KIB, large=512 * KIB)  # the next reader takes the same two
    assert read_buffers.kept_bytes() == PROBE_READ_SIZE + 512 * KIB


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1"])
def test_a_bad_large_read_size_is_a_clear_error(bad):
    reader = RecordReader(RecordingStream(b""), "tfrecord")
    with pytest.raises(UsageError, match="large_read_size"):
        next(reader.record_lists(large_read_size=bad))

"""Records left in the read buffer: ``RecordReader.record_lists(spans=True)``.

A consumer that makes each block's records before it asks for the next (``streamio.mix``)
gets the records that lie whole in a chunk as a ``RecordSpans`` instead of a list. Whatever
the source (a file, a gzip file, a FIFO fed by another process), the record sizes (some
completed in place from the source, some cut by the end of a read) and the damage (skipped or
raised), the records, their order, the errors and the counters are those of the list path; a
span block kept past the next block refuses to give bytes rather than give other ones.
"""

from __future__ import annotations

import gzip
import random

import numpy as np
import pytest

from streamio.errors import FormatError
from streamio.formats import encode_tfrecord
from streamio.formats._framing import RecordSpans
from streamio.reader import RecordReader


def _records(seed: int, n: int = 3000) -> list:
    rng = random.Random(seed)
    # Mostly small (spans are given while a chunk's records average at most SPAN_MEAN_MAX
    # bytes), some empty, a few large: past a read (completed in place, REST_BUFFER_MIN =
    # 16 KiB), or cut by the end of one.
    sizes = [rng.choice([0, 1, 50, 178, 178, 178, 178, 178, 178, 178]) for _ in range(n)]
    for i in rng.sample(range(n), n // 150):
        sizes[i] = rng.choice([900, 5000, 40_000])
    return [rng.randbytes(size) for size in sizes]


def _read(source, spans: bool, span_crcs: bool = False, **options) -> tuple:
    """(records, kinds of block, error, records counted) of one pass; each block made into
    bytes as soon as it comes (as the mix does), before the next is asked for (records whose
    CRCs are left to the consumer are checked as they are made: RecordSpans.__getitem__)."""
    reader = RecordReader(source, "tfrecord", **options)
    records, kinds, error = [], set(), None
    try:
        for block in reader.record_lists(spans=spans, span_crcs=span_crcs):
            kinds.add(type(block).__name__ + ("+crcs" if getattr(block, "crcs", False) else ""))
            records.extend(bytes(r) for r in block)
    except FormatError as exc:
        error = (type(exc), exc.source, exc.offset, exc.record_index, str(exc))
    return records, kinds, error, reader.stats.records


def _both(source, **options) -> tuple:
    """The list path's pass and the span path's (scan-checked CRCs), which must agree; and
    the span path with the CRCs left to the consumer, which must agree too."""
    listed = _read(source, False, **options)
    spanned = _read(source, True, **options)
    unchecked = _read(source, True, True, **options)
    for other in (spanned, unchecked):
        assert other[0] == listed[0]
        assert other[2] == listed[2]
        assert other[3] == listed[3] == len(listed[0])
    assert listed[1] <= {"list"} and "RecordSpans+crcs" not in spanned[1]
    # Left to the consumer only where a damaged record ends the pass (on_error="raise") and
    # CRCs are checked at all.
    deferred = options.get("on_error", "raise") == "raise" and options.get("verify", True)
    # (Where the scan stops at a damaged record, the kinds of block may differ.)
    if not deferred:
        assert "RecordSpans+crcs" not in unchecked[1]
    elif "RecordSpans" in spanned[1]:
        assert "RecordSpans+crcs" in unchecked[1]
    return listed, spanned


@pytest.mark.parametrize("read_size", [4096, 65536, 1 << 20])
def test_spans_give_the_records_of_the_list_path_from_a_file(tmp_path, read_size):
    records = _records(read_size, max(3000, read_size // 50))  # several reads (the first
    path = tmp_path / "a.tfrecord"                              # comes as a list)
    path.write_bytes(b"".join(encode_tfrecord(r) for r in records))
    listed, spanned = _both(str(path), read_size=read_size)
    assert listed[0] == records
    assert "RecordSpans" in spanned[1]  # the spans were used, not the list path again


def test_spans_from_a_gzip_file_and_from_a_fifo(tmp_path, fifo):
    records = _records(1)
    stream = b"".join(encode_tfrecord(r) for r in records)
    path = tmp_path / "a.tfrecord.gz"
    path.write_bytes(gzip.compress(stream))
    listed, spanned = _both(str(path), read_size=65536)
    assert listed[0] == records and "RecordSpans" in spanned[1]
    # A FIFO: pieces of odd sizes, as another process writes them.
    for spans in (False, True):
        pipe = fifo.make(stream, 1000, 7, 70_000, 3, name=f"pipe{spans}")
        got, kinds, error, _ = _read(pipe, spans, read_size=65536)
        assert (got, error) == (records, None)
        assert ("RecordSpans" in kinds) == spans


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_spans_on_damaged_streams_give_the_list_paths_records_and_errors(tmp_path, on_error):
    rng = random.Random(5)
    records = _records(2, 300)
    stream = bytearray(b"".join(encode_tfrecord(r) for r in records))
    for trial in range(12):
        damaged = bytearray(stream)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= rng.randint(1, 255)
        if trial % 3 == 0:
            del damaged[rng.randrange(len(damaged)):]  # truncated too
        path = tmp_path / f"d{trial}.tfrecord"
        path.write_bytes(bytes(damaged))
        listed, _ = _both(str(path), read_size=rng.choice([1000, 8192, 65536]),
                          on_error=on_error)
        if on_error == "raise":
            assert listed[2] is not None


def test_a_damaged_payload_found_by_the_consumer_raises_the_list_paths_error_there(tmp_path):
    """Records whose CRCs are left to the consumer: a damaged payload anywhere in a span block
    (its first record, its last, one between) gives the records before it, then the error the
    list path gives (the same offset and record index), with the same count of records; a
    consumer that asks for the next block hears the same error again; verify=False leaves no
    CRC to check."""
    records = [bytes([i % 251]) * (40 + i % 90) for i in range(3000)]
    frames = [encode_tfrecord(r) for r in records]
    starts = np.cumsum([0] + [len(f) for f in frames])
    stream = b"".join(frames)
    spanned = [i for i, block in _blocks(stream, tmp_path) if block == "RecordSpans+crcs"]
    assert len(spanned) > 2000
    rng = random.Random(9)
    for k in sorted({spanned[0], spanned[-1], *rng.sample(spanned, 12)}):
        damaged = bytearray(stream)
        damaged[int(starts[k]) + 12 + rng.randrange(len(records[k]) + 4)] ^= 0x20
        path = tmp_path / f"bad{k}.tfrecord"
        path.write_bytes(bytes(damaged))
        listed, _ = _both(str(path), read_size=4096)
        assert listed[0] == records[:k] and listed[3] == k
        assert listed[2][2:4] == (starts[k], k)
        blocks = RecordReader(str(path), "tfrecord", read_size=4096).record_lists(True, True)
        with pytest.raises(FormatError) as first:
            for block in blocks:
                list(block)
        with pytest.raises(FormatError) as again:
            next(blocks)
        assert again.value is first.value or str(again.value) == str(first.value)
    got, kinds, error, _ = _read(str(path), True, True, verify=False, read_size=4096)
    assert "RecordSpans" in kinds and "RecordSpans+crcs" not in kinds
    assert error is None and len(got) == len(records) and got != records  # damage unseen


def _blocks(stream: bytes, tmp_path) -> list:
    """(record index, kind of block) for each record of ``stream`` read in 4 KiB pieces with
    its CRCs left to the consumer."""
    path = tmp_path / "whole.tfrecord"
    path.write_bytes(stream)
    out = []
    for block in RecordReader(str(path), "tfrecord", read_size=4096).record_lists(True, True):
        kind = type(block).__name__ + ("+crcs" if getattr(block, "crcs", False) else "")
        out += [(len(out) + i, kind) for i in range(len(block))]
    return out


def test_a_span_block_kept_past_the_next_block_refuses_to_give_bytes(tmp_path):
    records = [bytes([i % 251]) * 100 for i in range(2000)]
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(encode_tfrecord(r) for r in records))
    blocks = RecordReader(str(path), "tfrecord", read_size=8192).record_lists(spans=True)
    before = 0
    for first in blocks:  # the first read comes as a list (it tells the records are small)
        if isinstance(first, RecordSpans):
            break
        before += len(first)
    assert before == 8192 // 116 + 1 and len(first) == (2 * 8192 - 116 * before) // 116
    assert first[0] == records[before] and first[-1] == records[before + len(first) - 1]
    assert first[1:3] == records[before + 1:before + 3]
    kept = (first.buffer, first.spans)  # as the mix holds a block
    next(blocks)  # the reader reads into its buffer again
    with pytest.raises(ValueError, match="released"):
        first[0]
    from streamio.pipeline.mix import mix_take_reference

    for take in _takes(mix_take_reference):
        with pytest.raises(ValueError, match="released"):
            take(np.zeros(2, "<u4"), 0, 2, np.array([1 << 32], np.uint64), [kept], [0], None,
                 None)
    blocks.close()


def _takes(reference):
    try:
        from streamio import _speedups
    except ImportError:
        return [reference]
    return [reference, _speedups.mix_take]


def test_spans_only_while_a_chunks_records_are_small(tmp_path):
    """Making a record from its span is a second pass over its bytes: large records come in
    lists (reader.SPAN_MEAN_MAX), and spans come back when the records are small again."""
    from streamio.reader import SPAN_MEAN_MAX

    small = [b"s" * 100] * 3000
    large = [b"L" * (4 * SPAN_MEAN_MAX)] * 300
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(encode_tfrecord(r) for r in small + large + small))
    kinds, got = [], []
    for block in RecordReader(str(path), "tfrecord", read_size=16384).record_lists(spans=True):
        kinds.append(type(block).__name__)
        got.extend(bytes(r) for r in block)
    assert got == small + large + small
    chunks = sum(len(r) + 16 for r in small) // 16384  # before the large records
    runs = "".join("S" if kind == "RecordSpans" else "l" for kind in kinds)
    # Each later chunk of small records: the one completed from the chunk before, the spans;
    # lists alone through the large ones; spans again after them.
    assert runs[:2 * chunks].count("S") == chunks - 1  # all but the first read (a list)
    large_chunks = sum(len(r) + 16 for r in large) // 16384
    assert "l" * (large_chunks - 2) in runs and runs[-2 * chunks:].count("S") >= chunks - 2


def test_recordio_and_byte_ranges_give_lists(tmp_path):
    from streamio.formats import encode_recordio

    records = _records(3, 50)
    path = tmp_path / "a.rec"
    path.write_bytes(b"".join(encode_recordio(r) for r in records))
    reader = RecordReader(str(path), "recordio")
    blocks = list(reader.record_lists(spans=True))
    assert all(type(b) is list for b in blocks) and sum(blocks, []) == records
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(encode_tfrecord(r) for r in records))
    reader = RecordReader(str(path), "tfrecord", byte_range=(0, path.stat().st_size // 2))
    got = [bytes(r) for block in reader.record_lists(spans=True) for r in block]
    assert got and got == records[:len(got)]


def test_a_read_of_more_records_than_the_span_buffer_holds_gives_the_rest_in_a_list(tmp_path):
    from streamio.reader import SPAN_PAIRS_FRAME

    records = [b""] * 20000 + [b"x"] * 5  # 16-byte frames: four times what the room assumes
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(encode_tfrecord(r) for r in records))
    listed, spanned = _both(str(path), read_size=65536)
    assert listed[0] == records
    sizes = []
    for block in RecordReader(str(path), "tfrecord", read_size=65536).record_lists(spans=True):
        sizes.append((type(block).__name__, len(block)))
    assert ("RecordSpans", 65536 // SPAN_PAIRS_FRAME + 1) in sizes  # full, the rest listed

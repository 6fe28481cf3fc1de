"""The framers alone (sans-IO): chunking invariance, garbage in -> our errors out, recovery."""

from __future__ import annotations

import os
import struct
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio.errors import (CorruptRecordError, FormatError, RecordTooLargeError, StreamioWarning,
                             TruncatedStreamError, UsageError)
from streamio.formats import encode_recordio, encode_tfrecord, make_framer
from streamio.formats.recordio import MAGIC_BYTES

payload = st.binary(max_size=300)
payload_lists = st.lists(payload, max_size=20)
# payloads that embed the RecordIO magic number at aligned and unaligned offsets
magic_payload = st.lists(st.sampled_from([b"", b"a", b"abcd", MAGIC_BYTES, b"xy" + MAGIC_BYTES]),
                         max_size=8).map(b"".join)


def frame_all(fmt, data, cuts=(), **options):
    framer = make_framer(fmt, source="test", **options)
    out, pos = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out += framer.feed(data[pos:cut])
        pos = cut
    out += framer.finish()
    return out, framer


def encode(fmt, records):
    enc = encode_tfrecord if fmt == "tfrecord" else encode_recordio
    return b"".join(enc(r) for r in records)


def cuts_for(data):
    return st.lists(st.integers(0, max(0, len(data))), max_size=12)


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=payload_lists, data=st.data())
def test_any_chunking_gives_the_written_records(fmt, records, data):
    stream = encode(fmt, records)
    cuts = data.draw(cuts_for(stream))
    out, framer = frame_all(fmt, stream, cuts)
    assert out == records
    assert all(type(r) is bytes for r in out)
    assert framer.records == len(records)


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
def test_one_byte_at_a_time(fmt):
    records = [os.urandom(n) for n in (0, 1, 3, 4, 5, 100, 1000)] + [b"ab" + MAGIC_BYTES * 3]
    stream = encode(fmt, records)
    out, _ = frame_all(fmt, stream, range(len(stream)))
    assert out == records


@settings(deadline=None)
@given(records=st.lists(magic_payload, max_size=10), data=st.data())
def test_recordio_payloads_with_magic_round_trip_dmlc(records, data):
    stream = encode("recordio", records)
    out, _ = frame_all("recordio", stream, data.draw(cuts_for(stream)))
    assert out == records


def test_recordio_writer_splits_at_aligned_magic_only():
    payload_ = b"abcd" + MAGIC_BYTES + b"ef" + MAGIC_BYTES + b"gh"  # aligned at 4, not at 10
    stream = encode_recordio(payload_)
    cflags = []
    pos = 0
    while pos < len(stream):
        magic, lrec = struct.unpack_from("<II", stream, pos)
        cflags.append(lrec >> 29)
        n = lrec & ((1 << 29) - 1)
        pos += 8 + n + (-n & 3)
    assert cflags == [1, 3]
    assert frame_all("recordio", stream)[0] == [payload_]
    # concat semantics would not restore the dropped magic: the payload differs
    assert frame_all("recordio", stream, multipart="concat")[0] != [payload_]


csv_field = st.one_of(
    st.text(alphabet="abc 1.5-", max_size=6),
    st.text(alphabet='ab,"\n\r x', max_size=6).map(lambda s: '"' + s.replace('"', '""') + '"'),
)
csv_row = st.lists(csv_field, min_size=1, max_size=4).map(",".join).filter(lambda r: r != "")


@settings(deadline=None)
@given(rows=st.lists(csv_row, max_size=12), crlf=st.booleans(), trailing=st.booleans(),
       data=st.data())
def test_csv_rows_survive_any_chunking(rows, crlf, trailing, data):
    eol = "\r\n" if crlf else "\n"
    text = eol.join(rows) + (eol if trailing and rows else "")
    stream = text.encode()
    out, _ = frame_all("csv", stream, data.draw(cuts_for(stream)))
    # rows of only spaces are skipped, as pandas skips blank lines
    assert out == [r.encode() for r in rows if r.strip(" ")]


@settings(deadline=None)
@given(lines=st.lists(st.text(alphabet='ab "\r', max_size=5).filter(lambda s: not s.endswith("\r")),
                      max_size=10), data=st.data())
def test_lines_keep_blank_lines_and_last_line_without_newline(lines, data):
    stream = "\n".join(lines).encode()
    out, _ = frame_all("lines", stream, data.draw(cuts_for(stream)))
    expected = [s.encode() for s in lines]
    if expected and expected[-1] == b"":
        expected.pop()  # the stream ends with a newline (or is empty): no last partial line
    assert out == expected


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "csv", "lines"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage=st.binary(max_size=400), data=st.data())
def test_garbage_gives_records_or_format_error(fmt, garbage, data):
    framer = make_framer(fmt, source="junk", max_record_size=1 << 16)
    cuts = sorted(data.draw(cuts_for(garbage)))
    pos = 0
    try:
        for cut in cuts + [len(garbage)]:
            assert all(type(r) is bytes for r in framer.feed(garbage[pos:cut]))
            pos = cut
        framer.finish()
    except FormatError as err:
        assert err.source == "junk" and err.offset is not None and err.record_index is not None
        assert 0 <= err.offset <= len(garbage)


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=8),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1,
                      max_size=3),
       data=st.data())
def test_mutated_streams_deliver_a_prefix_then_raise_the_same_error_at_any_chunking(
        fmt, records, flips, data):
    stream = bytearray(encode(fmt, records))
    for where, xor in flips:
        stream[where % len(stream)] ^= xor
    stream = bytes(stream)
    whole = _outcome(fmt, stream, [])
    chunked = _outcome(fmt, stream, data.draw(cuts_for(stream)))
    assert whole == chunked  # same records, same error class, offset and record index
    good, err = whole
    assert good == records[:len(good)] or fmt == "recordio" or err is None


def _outcome(fmt, stream, cuts):
    framer = make_framer(fmt, source="m")
    out, pos = [], 0
    try:
        for cut in sorted(set(cuts)) + [len(stream)]:
            out += framer.feed(stream[pos:cut])
            pos = cut
        out += framer.finish()
    except FormatError as err:
        return out, (type(err), err.offset, err.record_index)
    return out, None


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "csv", "lines"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage=st.binary(max_size=300), data=st.data())
def test_skip_mode_never_raises_on_garbage_and_counts_what_it_drops(fmt, garbage, data):
    out, framer = frame_all(fmt, garbage, data.draw(cuts_for(garbage)), on_error="skip",
                            max_record_size=1 << 12)
    assert framer.skipped_bytes <= len(garbage)
    assert sum(map(len, out)) <= len(garbage)


def test_tfrecord_bad_data_crc_raises_after_delivering_earlier_records():
    records = [b"one", b"two", b"three"]
    stream = bytearray(encode("tfrecord", records))
    second = len(encode_tfrecord(b"one"))
    stream[second + 12] ^= 1  # first payload byte of record 1
    framer = make_framer("tfrecord", source="s")
    assert framer.feed(bytes(stream)) == [b"one"]
    with pytest.raises(CorruptRecordError) as info:
        framer.finish()
    assert (info.value.offset, info.value.record_index, info.value.source) == (second, 1, "s")
    assert "data CRC" in str(info.value) and "byte offset 19" in str(info.value)
    with pytest.raises(CorruptRecordError):  # asked again, the same answer
        framer.feed(b"")


def test_tfrecord_skip_after_bad_data_crc_loses_only_that_record():
    records = [b"one", b"two", b"three"]
    stream = bytearray(encode("tfrecord", records))
    stream[len(encode_tfrecord(b"one")) + 12] ^= 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, framer = frame_all("tfrecord", bytes(stream), on_error="warn")
    assert out == [b"one", b"three"]
    assert (framer.skipped_records, framer.skipped_bytes) == (1, len(encode_tfrecord(b"two")))
    assert any(issubclass(w.category, StreamioWarning) for w in caught)


def test_tfrecord_resynchronises_after_a_bad_length():
    records = [os.urandom(50) for _ in range(5)]
    stream = bytearray(encode("tfrecord", records))
    frame = len(encode_tfrecord(records[0]))
    stream[2 * frame + 3] ^= 0x40  # corrupt record 2's length field
    for cuts in ([], list(range(0, len(stream), 7))):
        out, framer = frame_all("tfrecord", bytes(stream), cuts, on_error="skip")
        assert out == records[:2] + records[3:]
        assert framer.skipped_records == 1 and framer.skipped_bytes == frame


def test_recordio_resynchronises_on_the_next_aligned_magic():
    records = [os.urandom(37) for _ in range(5)]
    stream = bytearray(encode("recordio", records))
    frame = len(encode_recordio(records[0]))
    stream[frame + 1] ^= 0xFF  # break record 1's magic
    out, framer = frame_all("recordio", bytes(stream), list(range(0, len(stream), 5)),
                            on_error="skip")
    assert out == records[:1] + records[2:]
    assert framer.skipped_records == 1 and framer.skipped_bytes == frame


def test_huge_length_fails_at_once_without_allocating():
    header = struct.pack("<Q", 1 << 40)
    from streamio.formats.tfrecord import masked_crc32c
    stream = header + struct.pack("<I", masked_crc32c(header))
    framer = make_framer("tfrecord", source="big")
    assert framer.feed(stream) == []
    with pytest.raises(RecordTooLargeError) as info:
        framer.finish()
    assert info.value.offset == 0 and "1099511627776" in str(info.value)


def test_oversized_record_is_streamed_past_in_skip_mode():
    big, small = os.urandom(5000), b"after"
    stream = encode("tfrecord", [b"before", big, small])
    out, framer = frame_all("tfrecord", stream, list(range(0, len(stream), 1000)),
                            on_error="skip", max_record_size=1000)
    assert out == [b"before", small]
    assert framer.skipped_records == 1 and framer.skipped_bytes == len(encode_tfrecord(big))


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
def test_truncated_stream_names_the_record_it_cut(fmt):
    stream = encode(fmt, [b"a" * 10, b"b" * 10])
    cut = stream[:-3]
    framer = make_framer(fmt, source="t")
    assert framer.feed(cut) == [b"a" * 10]
    with pytest.raises(TruncatedStreamError) as info:
        framer.finish()
    assert info.value.record_index == 1 and info.value.offset == len(stream) // 2


def test_csv_open_quote_at_end_is_truncation():
    framer = make_framer("csv", source="c")
    assert framer.feed(b'a,b\n1,"unterminated\n2,3\n') == [b"a,b"]
    with pytest.raises(TruncatedStreamError) as info:
        framer.finish()
    assert info.value.offset == 4 and info.value.record_index == 1


def test_csv_row_over_the_limit_is_refused_before_it_is_buffered():
    framer = make_framer("csv", source="c", max_record_size=100)
    out = framer.feed(b"ok\n")
    assert out == [b"ok"]
    framer.feed(b"x" * 60)
    framer.feed(b"x" * 60)
    with pytest.raises(RecordTooLargeError):
        framer.feed(b"\n")


def test_csv_quotechar_option_and_unknown_options():
    out, _ = frame_all("csv", b"'a\nb',1\nc,2\n", quotechar="'")
    assert out == [b"'a\nb',1", b"c,2"]
    with pytest.raises(TypeError, match="quotechar"):
        make_framer("tfrecord", source="x", quotechar="'")
    with pytest.raises(ValueError, match="unknown format"):
        make_framer("parquet", source="x")
    with pytest.raises(ValueError):
        make_framer("recordio", source="x", multipart="weird")
    with pytest.raises(ValueError):
        make_framer("tfrecord", source="x", on_error="ignore")


@pytest.mark.parametrize("cflag", [4, 5, 6, 7])
def test_recordio_invalid_cflag_is_a_corrupt_header(cflag):
    stream = encode("recordio", [b"good"]) + struct.pack("<II", 0xCED7230A, cflag << 29 | 4) + b"abcd"
    framer = make_framer("recordio", source="c")
    assert framer.feed(stream) == [b"good"]
    with pytest.raises(CorruptRecordError, match=f"invalid cflag {cflag}") as info:
        framer.finish()
    assert info.value.offset == 12 and info.value.record_index == 1
    stream += encode("recordio", [b"next"])
    assert frame_all("recordio", stream, on_error="skip")[0] == [b"good", b"next"]


def _inflate_length(stream: bytearray, at: int, bit: int) -> None:
    """Flip one bit of the RecordIO length field of the frame at ``at``."""
    lrec = struct.unpack_from("<I", stream, at + 4)[0] ^ (1 << bit)
    struct.pack_into("<I", stream, at + 4, lrec)


@pytest.mark.parametrize("bit", [9, 16, 27, 28])  # a few KiB, 64 KiB, 128 MiB, over the limit
@pytest.mark.parametrize("multipart", ["dmlc", "concat"])
def test_recordio_damaged_length_loses_only_its_record(bit, multipart):
    # 48-byte frames: a length grown by 2**bit never ends exactly on another frame's start (that
    # coincidence, about 1 length flip in 12 here, is one no check without a checksum can see)
    records = [os.urandom(40) for i in range(200)]
    stream = bytearray(b"".join(encode_recordio(r, multipart=multipart) for r in records))
    at = sum(len(encode_recordio(r)) for r in records[:50])
    _inflate_length(stream, at, bit)
    for cuts in ([], list(range(0, len(stream), 4096)), list(range(0, len(stream), 61))):
        out, framer = frame_all("recordio", bytes(stream), cuts, on_error="skip",
                                multipart=multipart)
        assert out == records[:50] + records[51:]
        assert framer.skipped_records == 1
        assert framer.skipped_bytes == len(encode_recordio(records[50]))


def test_recordio_damaged_length_raises_at_its_record_with_the_records_before_delivered():
    records = [b"r%03d" % i * 10 for i in range(20)]
    stream = bytearray(encode("recordio", records))
    at = len(encode("recordio", records[:5]))
    _inflate_length(stream, at, 12)  # the frame now reaches past the end of the stream
    framer = make_framer("recordio", source="s")
    assert framer.feed(bytes(stream)) == records[:5]
    with pytest.raises(FormatError) as info:
        framer.finish()
    assert info.value.offset == at and info.value.record_index == 5
    _inflate_length(stream, at, 12)
    _inflate_length(stream, at, 4)  # now it ends inside the stream, inside the next frame
    framer = make_framer("recordio", source="s")
    assert framer.feed(bytes(stream)) == records[:5]
    with pytest.raises(CorruptRecordError, match="corrupt length") as info:
        framer.finish()
    assert info.value.offset == at and info.value.record_index == 5


def test_recordio_last_record_and_a_record_at_a_chunk_end_are_not_held_back():
    records = [b"a" * 12, b"b" * 7, b"c" * 30]
    stream = encode("recordio", records)
    framer = make_framer("recordio", source="s")
    first = len(encode_recordio(records[0]))
    # a frame that ends exactly where the bytes so far end is delivered at once
    assert framer.feed(stream[:first]) == records[:1]
    assert framer.feed(stream[first:]) == records[1:]
    assert framer.finish() == []


def test_recordio_damaged_length_gives_the_same_verdict_at_every_cut():
    # Found by Hypothesis: the first length grows from 1 to 5, so the frame ends inside the next
    # header. Fed whole, the record start inside the frame shows the length is corrupt; fed with
    # the frame completed from a held tail, that start's header ran past the bytes so far and
    # the frame used to be taken. Now the framer waits for those bytes, whatever the cut.
    stream = bytearray(encode("recordio", [b"\x00"] * 4 + [b"\x00" * 29]))
    stream[4] ^= 4
    stream = bytes(stream)
    whole = _outcome("recordio", stream, [])
    assert whole == ([], (CorruptRecordError, 0, 0))
    for cut in range(len(stream) + 1):
        assert _outcome("recordio", stream, [cut]) == whole, cut


def test_a_registered_framer_needs_only_feed_and_finish(tmp_path, fifo):
    """``rest_buffer``/``rest_filled`` (reading a large frame's rest in place) are optional: a
    framer with just feed/finish and the counters reads a file and a FIFO, plain and gzip."""
    import gzip as _gzip

    from streamio.formats import FORMATS, register_format

    class NullSeparated:  # records end at b"\0"
        def __init__(self, **_: object) -> None:
            self.records = self.skipped_records = self.skipped_bytes = 0
            self._tail = b""

        def feed(self, chunk) -> list:
            *out, self._tail = (self._tail + bytes(chunk)).split(b"\0")
            self.records += len(out)
            return out

        def finish(self) -> list:
            out = [self._tail] if self._tail else []
            self.records += len(out)
            return out

    want = [b"record-%d" % i * (i % 5 + 1) for i in range(3000)]
    data = b"\0".join(want)
    register_format("null-separated", lambda **kw: NullSeparated(**kw))
    try:
        path = tmp_path / "records.bin"
        path.write_bytes(data)
        zipped = tmp_path / "records.bin.gz"
        zipped.write_bytes(_gzip.compress(data))
        for source in (str(path), str(zipped), fifo.make(data, 7, 4096, 1 << 20)):
            assert list(streamio.read_records(source, "null-separated")) == want
    finally:
        FORMATS.pop("null-separated", None)


@pytest.mark.parametrize("name,meant", [("tfrecords", "tfrecord"), ("TFRecord", "tfrecord"),
                                        ("RecordIO", "recordio"), ("text", None)])
def test_a_misspelt_format_name_gets_a_suggestion(tmp_path, name, meant):
    # As a misspelt keyword does; Dataset() names the format before any source is opened.
    with pytest.raises(UsageError, match="unknown format") as info:
        streamio.Dataset(str(tmp_path / "x.tfrecord"), name)
    if meant is None:
        assert "did you mean" not in str(info.value)
    else:
        assert f"did you mean {meant!r}?" in str(info.value)

"""Byte-range splits of a valid file never fail and never invent records (issue #40, item 6),
also when payloads are themselves TFRecord or RecordIO data (TFRecords packed as records, a
frame inside a frame, a .rec file inside a RecordIO record): at every split point, the ranges
together deliver exactly the file's records, each once, in order, with no error and nothing
skipped, under on_error="raise" and "skip", fed whole or in pieces.

The one exception, made loud: a payload holding TFRecord frames that chain over
``CONFIRM_BYTES`` (a TFRecord file stored as one record) can fool the reader of the range that
starts inside it. The reader of the range before then raises ``SplitError`` naming the record,
whatever ``on_error`` says: the ranges deliver the file's records exactly, or one of them says
so; never invented records in silence. An index beside the file makes such splits exact.

Framer level (``start_range``, the rule both readers of a boundary apply), so every byte of a
file can be a split point; and through ``Dataset.shard`` on a real file.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import streamio
from streamio import Dataset
from streamio.errors import SplitError, StreamioWarning
from streamio.formats import encode_recordio, encode_tfrecord, make_framer, tfrecord
from streamio.sources.ranged import split_range

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

ENCODE = {"tfrecord": encode_tfrecord, "recordio": encode_recordio}


def _nested(encode):
    """Payloads that hold valid frames of the same format: one frame, a stream of frames,
    frames with bytes around them, a frame of a frame, and plain bytes."""
    plain = st.binary(max_size=40)
    stream = st.lists(plain, min_size=1, max_size=4).map(
        lambda rs: b"".join(encode(r) for r in rs))
    return st.one_of(
        plain,
        plain.map(encode),
        stream,
        st.tuples(plain, stream, plain).map(lambda t: b"".join(t)),
        plain.map(lambda r: encode(encode(r))),
        stream.map(lambda s: encode(s) + encode(s[:len(s) // 2])),
    )


def _file(fmt, payloads):
    return b"".join(ENCODE[fmt](p) for p in payloads)


def _read(fmt, data, start, stop, on_error, pieces):
    """The records a range reader of ``data`` delivers (``stop`` None: to the end), fed in
    pieces of ``pieces`` bytes (0: whole); and how many it skipped."""
    framer = make_framer(fmt, source="nested", on_error=on_error)
    origin = framer.start_range(start, stop)
    out = []
    rest = data[origin:]
    step = pieces or max(1, len(rest))
    for at in range(0, len(rest), step):
        out += framer.feed(rest[at:at + step])
        if framer.done:
            break
    out += framer.finish()
    assert framer.finish() == []  # a fault met in finish() would be raised here
    return out, framer.skipped_records


def _split(fmt, data, cuts, on_error="raise", pieces=0):
    bounds = [0] + list(cuts) + [len(data)]
    got, skipped = [], 0
    for a, b in zip(bounds, bounds[1:]):
        out, s = _read(fmt, data, a, None if b >= len(data) else b, on_error, pieces)
        got += out
        skipped += s
    return got, skipped


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@SETTINGS
@given(data=st.data())
def test_two_ranges_at_every_split_point(fmt, data):
    payloads = data.draw(st.lists(_nested(ENCODE[fmt]), min_size=1, max_size=6))
    whole = _file(fmt, payloads)
    on_error = data.draw(st.sampled_from(["raise", "skip"]))
    for cut in range(len(whole) + 1):
        got, skipped = _split(fmt, whole, [cut], on_error)
        assert (got, skipped) == (payloads, 0), (cut, on_error)


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@SETTINGS
@given(data=st.data())
def test_n_ranges_fed_in_pieces(fmt, data):
    payloads = data.draw(st.lists(_nested(ENCODE[fmt]), min_size=1, max_size=12))
    whole = _file(fmt, payloads)
    n = data.draw(st.integers(2, 9))
    cuts = [split_range(len(whole), ((n, i),))[0] for i in range(1, n)]
    pieces = data.draw(st.sampled_from([1, 3, 7, 64, 0]))
    got, skipped = _split(fmt, whole, cuts, data.draw(st.sampled_from(["raise", "skip"])),
                          pieces)
    assert (got, skipped) == (payloads, 0)


def _packed_file(path) -> tuple:
    """1000 records, record 500's payload a whole TFRecord frame, record 0 sized so that
    ``shard(2, 1)``'s split offset falls in record 500's payload just before that frame."""
    records = [b"record %d " % i + b"x" * (i % 50) for i in range(1000)]
    records[500] = encode_tfrecord(b"a whole TFRecord frame as a payload" * 3)
    for _ in range(4):
        start500 = sum(len(encode_tfrecord(r)) for r in records[:500])
        size = len(_file("tfrecord", records))
        cut = split_range(size, ((2, 1),))[0]
        if start500 < cut <= start500 + 12:
            break
        records[0] = b"r" * max(0, len(records[0]) + size - 2 * start500 - 16)
    assert start500 < cut <= start500 + 12  # in the outer header: the search meets the inner
    streamio.write_records(path, "tfrecord", records)
    return records, cut


def test_the_issues_example_tfrecords_packed_as_records(tmp_path):
    """A valid TFRecord file whose record 500's payload is a whole TFRecord frame, read as
    ``shard(2, i)`` (the split lands in record 500) and ``shard(n, i)`` up to n = 8: every
    record once, no error, no warning (was: a CRC error with on_error="raise", a phantom
    record with "skip")."""
    path = str(tmp_path / "packed.tfrecord")
    records, cut = _packed_file(path)
    for n in range(2, 9):
        for on_error in ("raise", "skip"):
            got = []
            for i in range(n):
                ds = Dataset(path, "tfrecord", on_error=on_error).shard(n, i)
                with warnings.catch_warnings():
                    warnings.simplefilter("error", StreamioWarning)
                    got += list(ds)
            assert got == records, (n, on_error)


# -- a payload whose frames chain over CONFIRM_BYTES: the split fails loudly ------------------

def _frame_size(payload: bytes) -> int:
    return len(encode_tfrecord(payload))


def _long_nested_file(path, after: int) -> tuple:
    """Records ``0..100`` small but record 0 (padded), record 101's payload a whole TFRecord
    stream of 300 frames of 1 KiB (312,000 bytes: chains over CONFIRM_BYTES), then ``after``
    small records. Record 0 is sized so that the split offset of ``shard(2, 1)`` falls in
    record 100, 20 bytes before record 101 (an index's cut there is probed at 101's start).
    Returns the records and record 101's ``(start, end)``."""
    k = 101
    inner = b"".join(encode_tfrecord(bytes([i % 251]) * 1024) for i in range(300))
    assert len(inner) > tfrecord.CONFIRM_BYTES
    records = [b"record %d " % i + b"x" * (i % 50) for i in range(k + 1 + after)]
    records[k] = inner
    for _ in range(4):
        start = sum(_frame_size(r) for r in records[:k])
        size = sum(_frame_size(r) for r in records)
        cut = split_range(size, ((2, 1),))[0]
        if cut == start - 20:
            break
        records[0] = b"r" * (len(records[0]) + 2 * (cut - start + 20))
    assert cut == start - 20 and start - _frame_size(records[k - 1]) < cut
    streamio.write_records(path, "tfrecord", records)
    return records, (start, start + _frame_size(inner))


def _shards(path, n, on_error):
    """What each of ``shard(n, i)`` delivers: ``(records, error or None)``."""
    outs = []
    for i in range(n):
        got = []
        try:
            for record in Dataset(path, "tfrecord", on_error=on_error).shard(n, i):
                got.append(record)
        except streamio.StreamioError as exc:
            outs.append((got, exc))
        else:
            outs.append((got, None))
    return outs


@pytest.mark.parametrize("after", [100, 0], ids=["middle", "last"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_record_holding_a_long_tfrecord_stream_fails_the_split_loudly(tmp_path, after,
                                                                        on_error):
    """Record 101 holds a TFRecord stream chaining over 256 KiB; ``shard(n, i)`` for n up to
    12 puts split offsets all over it. The shards together deliver exactly the file's records,
    or the shard whose range ends in record 101 raises SplitError after its records, naming
    the source, the split offset, where the next range would start and record 101 (was: the
    next shard delivered the inner frames as records, in silence under "skip")."""
    path = str(tmp_path / "nested.tfrecord")
    records, (start, end) = _long_nested_file(path, after)
    size = end + sum(_frame_size(r) for r in records[102:])
    loud = exact = 0
    for n in range(2, 13):
        outs = _shards(path, n, on_error)
        split_errors = [(i, err) for i, (_, err) in enumerate(outs)
                        if isinstance(err, SplitError)]
        got = [r for out, _ in outs for r in out]
        if not split_errors:
            assert got == records and all(err is None for _, err in outs), n
            exact += 1
            continue
        loud += 1
        i, err = split_errors[0]  # the first: the shards before it were exact
        stop = split_range(size, ((n, i + 1),))[0]
        assert start < stop < end - tfrecord.CONFIRM_BYTES, n  # its range ends in record 101
        assert (err.source, err.split_offset, err.offset) == (path, stop, start)
        assert stop <= err.next_start < end
        assert f"byte {stop}" in str(err) and f"byte {err.next_start}" in str(err)
        assert "streamio index" in str(err)
        # It delivered its records, record 101 last, before the error.
        assert outs[i][0] and outs[i][0][-1] == records[101]
        assert [r for out, _ in outs[:i + 1] for r in out] == records[:102]
    assert loud and exact  # both happen among these splits


def test_split_error_keeps_its_attributes_across_pickling():
    err = SplitError("cannot split", source="f", offset=7, record_index=1, split_offset=9,
                     next_start=11)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is SplitError and str(back) == str(err)
    assert (back.offset, back.record_index, back.split_offset, back.next_start) == (7, 1, 9, 11)
    assert isinstance(back, streamio.FormatError) and streamio.SplitError is SplitError


def test_an_index_makes_the_long_nested_split_exact(tmp_path):
    """The same file with `streamio index` beside it: every shard(n, i) for n up to 12, under
    both policies, delivers exactly the file's records, without a warning (shard(2, 1)'s cut
    is confirmed at record 101's start, whose payload chains on past the probe's range)."""
    path = str(tmp_path / "nested.tfrecord")
    records, _ = _long_nested_file(path, 100)
    run = subprocess.run([sys.executable, "-m", "streamio", "index", path],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for n in range(2, 13):
        for on_error in ("raise", "skip"):
            with warnings.catch_warnings():
                warnings.simplefilter("error", StreamioWarning)
                outs = _shards(path, n, on_error)
            assert [r for out, _ in outs for r in out] == records, (n, on_error)
            assert all(err is None for _, err in outs), (n, on_error)


def _split_loud(data, cuts, on_error, pieces):
    """``_split``, each range's error kept: ``(records, skipped, errors)``."""
    bounds = [0] + list(cuts) + [len(data)]
    got, skipped, errors = [], 0, []
    for a, b in zip(bounds, bounds[1:]):
        framer = make_framer("tfrecord", source="nested", on_error=on_error)
        rest = data[framer.start_range(a, None if b >= len(data) else b):]
        step = pieces or max(1, len(rest))
        try:
            for at in range(0, len(rest), step):
                got += framer.feed(rest[at:at + step])
                if framer.done:
                    break
            got += framer.finish()
            got += framer.finish()  # a fault finish() met is raised here
        except streamio.FormatError as exc:
            errors.append(exc)
        skipped += framer.skipped_records
    return got, skipped, errors


@SETTINGS
@given(data=st.data())
def test_exact_or_a_split_error_whatever_the_chains(monkeypatch, data):
    """With CONFIRM_BYTES made small (64), payloads holding frames often chain past it: at
    any cuts, fed in any pieces, under both policies, the ranges deliver exactly the file's
    records, or a range raised SplitError naming a record whose frame holds where the next
    range starts; whether the search for the next range's start runs as bytes come or only
    when the reader asks where its range ends (WATCH_HELD)."""
    monkeypatch.setattr(tfrecord, "CONFIRM_BYTES", 64)
    monkeypatch.setattr(tfrecord.TFRecordFramer, "WATCH_HELD",
                        data.draw(st.sampled_from([0, 100, 1 << 22])))
    payloads = data.draw(st.lists(_nested(encode_tfrecord), min_size=1, max_size=8))
    whole = _file("tfrecord", payloads)
    starts = [0]
    for p in payloads:
        starts.append(starts[-1] + _frame_size(p))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(whole) - 1), max_size=4))))
    on_error = data.draw(st.sampled_from(["raise", "skip"]))
    pieces = data.draw(st.sampled_from([1, 5, 64, 0]))
    got, skipped, errors = _split_loud(whole, cuts, on_error, pieces)
    split_errors = [e for e in errors if isinstance(e, SplitError)]
    if not split_errors:
        assert (got, skipped, errors) == (payloads, 0, [])
        return
    # The first names a record of the file (the ranges after it may read phantoms).
    err = split_errors[0]
    assert err.offset in starts and err.split_offset in cuts
    frame_end = starts[starts.index(err.offset) + 1]
    assert err.split_offset <= err.next_start < frame_end


def _forged_across_records() -> tuple:
    """A valid file whose record 5's payload holds TFRecord frames, the last of which runs on
    through record 5's CRC and record 6's header into record 6's payload (its own CRC there,
    computed by whoever wrote the file), where 300 frames of 1 KiB chain on: frames chaining
    across a record boundary, over CONFIRM_BYTES. Returns the file, its payloads and the
    records' start offsets."""
    inner = [encode_tfrecord(bytes([i % 251]) * 1024) for i in range(300)]
    d1, d2 = b"d" * 50, b"e" * 30
    crossing_length = len(d1) + 4 + 12 + len(d2)
    length = crossing_length.to_bytes(8, "little")  # u64 length | u32 masked CRC
    crossing_header = length + tfrecord.masked_crc32c(length).to_bytes(4, "little")
    p5 = b"x" * 100 + b"".join(inner[:5]) + crossing_header + d1
    p6_size = len(d2) + 4 + sum(map(len, inner))
    r5 = encode_tfrecord(p5)
    r6_header = encode_tfrecord(b"\0" * p6_size)[:12]
    crossing_data = d1 + r5[-4:] + r6_header + d2
    p6 = (d2 + tfrecord.masked_crc32c(crossing_data).to_bytes(4, "little")
          + b"".join(inner))
    assert len(p6) == p6_size
    payloads = [b"a%d" % i for i in range(5)] + [p5, p6] + [b"z%d" % i for i in range(5)]
    whole = _file("tfrecord", payloads)
    starts = [0]
    for p in payloads:
        starts.append(starts[-1] + _frame_size(p))
    return whole, payloads, starts


def test_frames_chaining_across_records_fail_the_split_loudly():
    """Frames forged to chain from inside record 5 across its end into record 6, over
    CONFIRM_BYTES: a range reader starting in record 5 takes them for records, but the reader
    of the range before, which reads the file's own frames, raises SplitError; at every cut,
    fed whole or in pieces, the two ranges deliver exactly the file's records or one of them
    raises it."""
    whole, payloads, starts = _forged_across_records()
    loud = []
    for cut in list(range(starts[5], starts[7], 997)) + list(range(1, len(whole), 40_009)):
        for on_error, pieces in (("raise", 0), ("skip", 65536)):
            got, skipped, errors = _split_loud(whole, [cut], on_error, pieces)
            split_errors = [e for e in errors if isinstance(e, SplitError)]
            if not split_errors:
                assert (got, skipped, errors) == (payloads, 0, []), (cut, on_error)
                continue
            err = split_errors[0]
            k = starts.index(err.offset)
            assert err.split_offset == cut and cut <= err.next_start < starts[k + 1]
            loud.append(k)
    assert 5 in loud and 6 in loud  # cuts in both records are caught

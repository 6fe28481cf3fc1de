"""Byte-range splits of a valid file never fail and never invent records (issue #40, item 6),
also when payloads are themselves TFRecord or RecordIO data (TFRecords packed as records, a
frame inside a frame, a .rec file inside a RecordIO record): at every split point, the ranges
together deliver exactly the file's records, each once, in order, with no error and nothing
skipped, under on_error="raise" and "skip", fed whole or in pieces.

Framer level (``start_range``, the rule both readers of a boundary apply), so every byte of a
file can be a split point; and through ``Dataset.shard`` on a real file.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import streamio
from streamio import Dataset
from streamio.errors import StreamioWarning
from streamio.formats import encode_recordio, encode_tfrecord, make_framer
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

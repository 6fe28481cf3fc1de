"""Index files that lie (issue #21, item 3): an index beside a data file is a hint. Whatever it
says, ``shard(n, i)`` over all ``i`` delivers every record exactly once, and an index that does
not fit the file is dropped with one warning.

Real parts: data files written by streamio, index files as DALI / the ``tfrecord`` package
(``offset length``) and MXNet (``key<TAB>offset``) write them, the real ``Dataset.shard``.
"""

from __future__ import annotations

import os
import random
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from streamio import Dataset, RecordReader, write_records
from streamio.errors import CorruptRecordError, FormatError, StreamioWarning, UsageError
from streamio.formats.index_file import (RecordIndex, encode_index, index_misfit, index_suffix,
                                         parse_index)
from streamio.pipeline.ranges import plan_range
from streamio.sources.ranged import open_at
from streamio.tools.index import iter_record_spans, write_index

FORMATS = ["tfrecord", "recordio", "lines"]
SHARDS = (2, 3, 5, 8)


def _records(count: int, seed: int, fmt: str) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        body = rng.randbytes(rng.randint(10, 300))
        if fmt == "lines":
            body = body.replace(b"\n", b"").replace(b"\r", b"")
        elif i % 9 == 4:  # RecordIO's magic inside a payload: MXNet splits it, a multi-part record
            body = body[:8] + b"\x0a\x23\xd7\xce" + body[8:]
        out.append(body + b"#%d" % i)
    return out


def _data_file(tmp_path, fmt: str, count: int = 3000, seed: int = 1):
    """(path, records, spans): ``spans`` the true ``(offset, length)`` of each record."""
    path = tmp_path / f"data.{fmt}"
    records = _records(count, seed, fmt)
    if fmt == "lines":
        path.write_bytes(b"".join(r + b"\n" for r in records))
    else:
        write_records(str(path), fmt, records)
    return str(path), records, list(iter_record_spans(str(path), fmt))


def _write_index(path: str, fmt: str, entries) -> None:
    """``entries``: ``(offset, length)`` pairs, written in the order given (keys count up)."""
    text = "".join(encode_index(fmt, ((k, o, n) for k, (o, n) in enumerate(entries))))
    with open(path + index_suffix(fmt), "w") as f:
        f.write(text)


def _every_shard(path: str, fmt: str, shards=SHARDS) -> tuple:
    """(records of shard(n, 0..n-1) joined, for each n; the StreamioWarnings issued)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = {n: [r for i in range(n) for r in Dataset(path, fmt).shard(n, i)] for n in shards}
    return got, [w for w in caught if issubclass(w.category, StreamioWarning)]


def _cut_entries(spans: list, size: int) -> set:
    """Indexes of the entries the shards in SHARDS cut at (the first at or after each split)."""
    offsets = [o for o, _ in spans]
    picked = set()
    for n in SHARDS:
        for i in range(1, n):
            x = size * i // n
            picked.add(next(k for k, o in enumerate(offsets) if o >= x))
    return picked


def _lie(kind: str, spans: list, size: int, fmt: str):
    """The index text (bytes) of one kind of lie about a file whose records are ``spans``."""
    if kind == "empty":
        return b""
    if kind == "garbage":
        return random.Random(3).randbytes(5000)
    if kind == "10**30":
        entries = spans[:10] + [(10**30, spans[10][1])] + spans[11:]
    elif kind == "past the end":
        entries = [(o + size, n) for o, n in spans]
    elif kind == "mid-record":  # every offset a few bytes into its record
        entries = [(o + 4, n) for o, n in spans]
    elif kind == "one cut mid-record":  # right but where the shards cut
        moved = _cut_entries(spans, size)
        entries = [(o + 4 if k in moved else o, n) for k, (o, n) in enumerate(spans)]
    elif kind == "decreasing":
        entries = spans[::-1]
    elif kind == "stale half":  # written before the second half of the records was appended
        entries = spans[:len(spans) // 2]
    else:
        raise AssertionError(kind)
    return "".join(encode_index(fmt, ((k, o, n) for k, (o, n) in enumerate(entries)))).encode()


LIES = ["empty", "past the end", "mid-record", "one cut mid-record", "decreasing", "stale half",
        "10**30", "garbage"]


@pytest.mark.parametrize("kind", LIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_index_that_lies_loses_no_record_and_warns_once(tmp_path, fmt, kind):
    path, records, spans = _data_file(tmp_path, fmt)
    size = os.path.getsize(path)
    with open(path + index_suffix(fmt), "wb") as f:
        f.write(_lie(kind, spans, size, fmt))
    got, warned = _every_shard(path, fmt)
    for n, delivered in got.items():
        assert delivered == records, f"shard({n}, i): {len(delivered)} of {len(records)} records"
    assert len(warned) == 1, [str(w.message) for w in warned]
    assert f"ignoring the index {path}{index_suffix(fmt)}" in str(warned[0].message)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_true_index_is_used_without_a_word(tmp_path, fmt):
    path, records, spans = _data_file(tmp_path, fmt)
    write_index(path, fmt)
    got, warned = _every_shard(path, fmt)
    assert all(delivered == records for delivered in got.values()) and not warned
    starts = {o for o, _ in spans}
    for n in SHARDS:
        for i in range(n):
            plan = plan_range(path, fmt, {}, ((n, i),))
            assert plan.exact and plan.byte_range[0] in starts


def test_an_index_missing_its_first_entries_still_reads_them(tmp_path):
    # "the first at 0 or the records before it read": the first cut is always byte 0.
    path, records, spans = _data_file(tmp_path, "tfrecord")
    _write_index(path, "tfrecord", spans[5:])
    got, warned = _every_shard(path, "tfrecord")
    assert all(delivered == records for delivered in got.values()) and not warned


def test_mxnet_keys_in_any_order_are_fine(tmp_path):
    path, records, spans = _data_file(tmp_path, "recordio")
    keys = list(range(len(spans)))
    random.Random(2).shuffle(keys)  # im2rec writes the image ids of a shuffled list
    with open(path + ".idx", "w") as f:
        f.write("".join(f"{k}\t{o}\n" for k, (o, _) in zip(keys, spans)))
    got, warned = _every_shard(path, "recordio")
    assert all(delivered == records for delivered in got.values()) and not warned
    assert plan_range(path, "recordio", {}, ((3, 1),)).exact


def test_writing_an_index_of_a_damaged_file_leaves_nothing_behind(tmp_path):
    path, _, spans = _data_file(tmp_path, "tfrecord", count=50)
    data = bytearray(open(path, "rb").read())
    data[spans[30][0] + 9] ^= 0x40  # a length CRC
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError):
        write_index(path, "tfrecord")
    assert os.listdir(tmp_path) == ["data.tfrecord"]


def test_a_changed_index_is_checked_again(tmp_path):
    # Verdicts are kept per process, keyed by both files' stat: a rewritten index is read anew.
    path, records, spans = _data_file(tmp_path, "recordio", count=300)
    write_index(path, "recordio")
    assert plan_range(path, "recordio", {}, ((2, 1),)).exact
    with open(path + ".idx", "w") as f:
        f.write("0\t0\n")  # now it covers one record of 300
    with pytest.warns(StreamioWarning, match="covers only part of the file"):
        assert not plan_range(path, "recordio", {}, ((2, 1),)).exact


def test_a_byte_range_past_any_file_is_a_usage_error(tmp_path):
    # What 10**30 from an index used to reach: os.pread's bare OverflowError.
    path, _, _ = _data_file(tmp_path, "tfrecord", count=3)
    with pytest.raises(UsageError, match="2\\*\\*63"):
        RecordReader(path, "tfrecord", byte_range=(10**30, None))
    with pytest.raises(UsageError, match="2\\*\\*63"):
        open_at(path, 10**30)


# -- any index at all: the shards tile the file -----------------------------------------------
@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_whatever_the_index_says_every_record_comes_once(tmp_path_factory, fmt, data):
    tmp_path = tmp_path_factory.mktemp("idx")
    path, records, spans = _data_file(tmp_path, fmt, count=60,
                                      seed=data.draw(st.integers(0, 2**16)))
    size = os.path.getsize(path)
    near = st.sampled_from([o for o, _ in spans]) | st.integers(0, size + 8)
    offsets = data.draw(st.lists(near, max_size=80) | st.lists(
        st.sampled_from([o for o, _ in spans]), unique=True).map(sorted))
    lengths = data.draw(st.lists(st.integers(0, 400), min_size=len(offsets),
                                 max_size=len(offsets)))
    _write_index(path, fmt, list(zip(offsets, lengths)))
    n = data.draw(st.integers(1, 7))
    got, warned = _every_shard(path, fmt, shards=(n,))
    assert got[n] == records
    assert len(warned) <= 1


# -- the parser of index files: untrusted bytes ------------------------------------------------
def test_parse_index_reads_both_dialects():
    assert parse_index(b"0 26\r\n26 46\n\n").offsets == [0, 26]
    assert parse_index(b"0 26\n26 46\n").lengths == [26, 46]
    index = parse_index(b"\n7\t0\n3\t20\n5\t60")
    assert index.offsets == [0, 20, 60] and index.lengths is None


@pytest.mark.parametrize("text,line", [
    (b"0 26\nnope\n", 2), (b"0\t0\n20 40\n", 2), (b"0 26\n26\t1\n", 2), (b"1" * 31 + b" 5\n", 1),
    (b"0 1 2\n", 1), (b"\xb2 1\n", 1), (b"a b\t1\n", 1), (b"0\t-5\n", 1), (b"\x00" * 9, 1),
])
def test_parse_index_names_the_bad_line(text, line):
    with pytest.raises(FormatError, match=f"index line {line} ") as info:
        parse_index(text, source="x.index")
    assert info.value.source == "x.index"


def test_index_misfit_says_why():
    assert index_misfit(RecordIndex([], []), 0) is None
    assert "no records" in index_misfit(RecordIndex([], []), 10)
    assert "past the file" in index_misfit(RecordIndex([0, 10], None), 10)
    assert "do not increase" in index_misfit(RecordIndex([0, 6, 6], None), 10)
    assert "does not end at byte 6" in index_misfit(RecordIndex([0, 6], [5, 4]), 10)
    assert "end of the file" in index_misfit(RecordIndex([0, 6], [6, 3]), 10)
    assert index_misfit(RecordIndex([0, 6], [6, 4]), 10) is None


_entries = st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                              st.integers(0, 2**40)), max_size=30)


@given(entries=_entries, fmt=st.sampled_from(["tfrecord", "recordio"]),
       crlf=st.booleans(), blank=st.booleans())
def test_parse_index_reads_what_encode_index_writes(entries, fmt, crlf, blank):
    text = "".join(encode_index(fmt, entries))
    if crlf:
        text = text.replace("\n", "\r\n")
    if blank:
        text = "\n" + text + "\n\n"
    index = parse_index(text.encode())
    assert index.offsets == [o for _, o, _ in entries]
    if entries:  # an empty file has no dialect: no lengths
        assert index.lengths == (None if fmt == "recordio" else [n for _, _, n in entries])


@settings(max_examples=300)
@given(data=st.binary(max_size=300) | st.lists(st.sampled_from(
    [b"0", b"12", b" ", b"\t", b"\n", b"\r", b"9" * 19, b"9" * 20, b"x", b"\xff", b"-"]),
    max_size=40).map(b"".join), size=st.integers(0, 10**20))
def test_parse_index_on_any_bytes_gives_an_index_or_a_format_error(data, size):
    try:
        index = parse_index(data, source="i")
    except FormatError as exc:
        assert exc.source == "i"
        return
    assert all(isinstance(o, int) and 0 <= o < 10**19 for o in index.offsets)
    assert index.lengths is None or len(index.lengths) == len(index.offsets)
    why = index_misfit(index, size)
    assert why is None or isinstance(why, str)

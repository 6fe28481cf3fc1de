"""plan_parts: the read-task plan behind streamio.ray (no Ray needed): every record in exactly one
part, whole files when there are enough, byte ranges of splittable files otherwise, compressed
files and single streams whole."""

from __future__ import annotations

import gzip
import os

import pytest

from streamio import Dataset, write_records
from streamio.adapters import is_single_stream
from streamio.errors import UsageError
from streamio.pipeline.splits import plan_parts


def _records(part) -> list:
    return [r for batch in part.dataset.batch(1000) for r in batch]


def _write(path, ids) -> str:
    write_records(path, "tfrecord", [b"rec-%06d" % i for i in ids])
    return str(path)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_whole_files_exactly_once(tmp_path, n):
    paths = [_write(tmp_path / f"p{f}.tfrecord", range(f * 100, f * 100 + 100 * (f + 1)))
             for f in range(6)]
    parts = plan_parts(Dataset(paths, "tfrecord"), n)
    assert len(parts) == n  # whole files up to 6 parts; past that, byte ranges too
    got = sorted(r for p in parts for r in _records(p))
    want = sorted(b"rec-%06d" % i for f in range(6)
                  for i in range(f * 100, f * 100 + 100 * (f + 1)))
    assert got == want


def test_whole_files_balanced_by_size(tmp_path):
    big = _write(tmp_path / "a.tfrecord", range(5000))
    small = [_write(tmp_path / f"s{i}.tfrecord", range(10)) for i in range(3)]
    parts = plan_parts(Dataset([big] + small, "tfrecord"), 2)
    assert [p.names for p in parts] == [(big,), tuple(small)]


def test_one_file_byte_ranges_exactly_once(tmp_path):
    path = _write(tmp_path / "big.tfrecord", range(20000))
    parts = plan_parts(Dataset(path, "tfrecord"), 7)
    assert len(parts) == 7
    got = [r for p in parts for r in _records(p)]
    assert sorted(got) == [b"rec-%06d" % i for i in range(20000)]
    assert all(_records(p) for p in parts)  # each range holds records


def test_compressed_and_stream_sources_are_whole(tmp_path):
    plain = _write(tmp_path / "a.tfrecord", range(3000))
    gz = tmp_path / "b.tfrecord.gz"
    gz.write_bytes(gzip.compress(open(plain, "rb").read()))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    ds = Dataset([plain, str(gz), str(fifo)], "tfrecord")
    parts = plan_parts(ds, 8, single_stream=is_single_stream)
    by_name = {}
    for part in parts:
        by_name.setdefault(part.names, 0)
        by_name[part.names] += 1
    assert by_name[(str(gz),)] == 1 and by_name[(str(fifo),)] == 1
    assert by_name[(plain,)] == 6  # the rest of the budget goes to the splittable file
    ranged = [p for p in parts if p.names == (plain,)]
    assert sorted(r for p in ranged for r in _records(p)) == [b"rec-%06d" % i for i in range(3000)]


def test_bad_part_count():
    with pytest.raises(UsageError):
        plan_parts(Dataset(b"", "tfrecord"), 0)


@pytest.mark.parametrize("n", [2, 7, 60, 99, 150])
def test_truncated_last_record_is_reported_by_a_range(tmp_path, n):
    """A file cut inside its last record: one byte-range reader reports the truncation (the
    reader that would start at that sound header used to skip it: silent loss)."""
    from streamio import TruncatedStreamError

    path = _write(tmp_path / "t.tfrecord", range(100))
    data = open(path, "rb").read()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(data[:len(data) - 5])
    errors, records = 0, 0
    for part in plan_parts(Dataset(str(cut), "tfrecord"), n):
        try:
            for _ in part.dataset:
                records += 1  # every whole record before the fault is delivered
        except TruncatedStreamError as exc:
            assert exc.offset is not None
            errors += 1
    assert errors == 1 and records == 99


def test_csv_with_header_split_by_range(tmp_path):
    """CSV with the existing promise (no quoted line breaks): byte ranges, each part primed with
    the header read apart; every row once."""
    from streamio import Csv

    path = tmp_path / "rows.csv"
    path.write_text("id,value\n" + "".join(f"{i},{i * 0.5}\n" for i in range(5000)))
    ds = Dataset(str(path), "csv", decoder=Csv(header=True), csv_quoted_newlines=False)
    parts = plan_parts(ds, 4)
    assert len(parts) == 4
    ids = sorted(int(v) for p in parts for b in p.dataset.batch(512) for v in b["features"][:, 0])
    assert ids == list(range(5000))
    quoted = plan_parts(Dataset(str(path), "csv", decoder=Csv(header=True)), 4)
    assert len(quoted) == 1  # rows may quote line breaks: one whole part

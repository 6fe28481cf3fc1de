"""A bad CSV row names its byte offset in its source (issue 41, item 10): raised, warned and
listed in ``stats()["decoder_skips"]``, from a file and from a FIFO fed by another process.

The file has a byte-order mark, CRLF row ends, quoted line breaks and blank rows before the bad
row, so its offset is not its index times a row's length; small reads put it many reads in, and
batches of 64 are decoded a block at a time first (the path that used to warn a second time,
naming no source)."""

from __future__ import annotations

import warnings

import pytest

from streamio import Dataset
from streamio.decoders import Csv
from streamio.errors import DecodeError, StreamioWarning

ROWS = 3000
BAD = 2345  # the data row that is ragged


def _stream(quoted_newlines: bool = True) -> tuple:
    """(bytes, offset of the bad row, its record index: the header is record 0)."""
    out = bytearray(b"\xef\xbb\xbfid,note,v\r\n")
    offset = None
    for i in range(ROWS):
        if i % 97 == 0:
            out += b"\r\n  \r\n"  # a blank row and a row of blanks: neither is a record
        if i == BAD:
            offset = len(out)
            out += b"%d,short\r\n" % i
        elif quoted_newlines and i % 5 == 0:
            out += b'%d,"two\r\nlines",%d.5\r\n' % (i, i)
        else:
            out += b"%d,plain,%d\r\n" % (i, i)
    return bytes(out), offset, BAD + 1


def _dataset(source, on_error: str, batch: int = 64, **options) -> Dataset:
    decoder = Csv(header=True, label_column="id", as_columns=True, dtype={"note": "str"},
                  on_error=on_error)
    return Dataset(source, "csv", decoder=decoder, read_size=4096, **options).batch(batch)


def _ids(ds) -> list:
    return [int(x) for batch in ds for x in batch["label"]]


@pytest.mark.parametrize("batch", [16, 64])
def test_raise_names_the_offset(tmp_path, batch):
    data, offset, index = _stream()
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    with pytest.raises(DecodeError) as info:
        _ids(_dataset(str(path), "raise", batch))
    err = info.value
    assert (err.source, err.offset, err.record_index, err.field) == (str(path), offset, index, "v")
    assert f"byte offset {offset}" in str(err) and f"record {index}" in str(err)
    assert data[err.offset:].startswith(b"%d,short\r\n" % BAD)


@pytest.mark.parametrize("through", ["file", "fifo"])
def test_warn_names_the_offset_once(tmp_path, fifo, through):
    data, offset, index = _stream()
    source = fifo.make(data, 1000, 333) if through == "fifo" else str(tmp_path / "rows.csv")
    if through == "file":
        (tmp_path / "rows.csv").write_bytes(data)
    ds = _dataset(source, "warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _ids(ds) == [i for i in range(ROWS) if i != BAD]
    texts = [str(w.message) for w in caught if issubclass(w.category, StreamioWarning)]
    assert len(texts) == 1, texts
    assert f"source {source}, byte offset {offset}, record {index}, field 'v'" in texts[0]


@pytest.mark.parametrize("through", ["file", "fifo"])
def test_skip_lists_the_offset_in_stats(tmp_path, fifo, through):
    data, offset, index = _stream()
    source = fifo.make(data, 4096, 77) if through == "fifo" else str(tmp_path / "rows.csv")
    if through == "file":
        (tmp_path / "rows.csv").write_bytes(data)
    ds = _dataset(source, "skip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ids(ds) == [i for i in range(ROWS) if i != BAD]
    stats = ds.stats()
    assert (stats["skipped_records"], stats["decoder_skipped"]) == (1, 1)
    [entry] = stats["decoder_skips"]
    assert entry == {"source": source, "offset": offset, "record_index": index, "field": "v",
                     "reason": "row has 2 fields, expected 3"}


def test_a_byte_range_shard_names_the_offset_in_the_file(tmp_path):
    data, offset, _ = _stream(quoted_newlines=False)
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    ds = _dataset(str(path), "skip", csv_quoted_newlines=False).shard(2, 1)  # the second half
    assert BAD not in _ids(ds)
    [entry] = ds.stats()["decoder_skips"]
    assert entry["offset"] == offset  # in the file, not in the range


def test_shuffled_rows_have_no_offset(tmp_path):
    """Documented: once rows are shuffled before batch(), the error names the source and record
    but no offset."""
    data, _, index = _stream()
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    decoder = Csv(header=True, label_column="id", as_columns=True, dtype={"note": "str"})
    ds = Dataset(str(path), "csv", decoder=decoder).shuffle(100, seed=1).batch(64)
    with pytest.raises(DecodeError) as info:
        _ids(ds)
    assert (info.value.source, info.value.record_index, info.value.offset) == (str(path), index,
                                                                               None)


class _CountingCsv(Csv):
    calls = 0

    def fresh(self):
        return _CountingCsv(**self._options)

    def decode_batch(self, records, **naming):
        _CountingCsv.calls += 1
        return super().decode_batch(records, **naming)


def test_rows_dropped_from_a_block_decoded_at_once_leave_their_own_batch(tmp_path):
    """A block of batches decoded in one call, bad rows dropped: each batch is what decoding it
    alone gives (its own rows, fewer), every bad row counted once and listed with its offset,
    in one call a block (no second pass)."""
    rows = [b"%d,%d" % (i, i) for i in range(400)]
    bad = {3, 17, 40, 41, 42, 43, 44, 45, 46, 47, 399}  # 40-47: a whole batch of 8
    for i in bad:
        rows[i] = b"%d" % i
    data = b"".join(row + b"\n" for row in rows)
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    _CountingCsv.calls = 0
    ds = Dataset(str(path), "csv", decoder=_CountingCsv(label_column=0, on_error="skip"),
                 read_size=1024).batch(8)
    got = [batch["label"].astype(int).tolist() for batch in ds]
    assert got == [[i for i in range(s, s + 8) if i not in bad] for s in range(0, 400, 8)]
    assert _CountingCsv.calls < 400 // 8  # blocks of batches were decoded at once
    stats = ds.stats()
    assert stats["decoder_skipped"] == len(bad)
    assert [(e["record_index"], e["offset"]) for e in stats["decoder_skips"]] == [
        (i, data.index(b"\n%d\n" % i) + 1 if i else 0) for i in sorted(bad)]

"""CSV bad rows under ``Csv(on_error=...)`` (issue 41, item 10) and wide or long rows in bounded
memory (issue 40, item 5).

A ragged row used to stop every epoch; with ``on_error="skip"``/``"warn"`` it is dropped, counted
in ``stats()`` and named (source, record, column), on every path a batch can take. A row of N
one-byte columns used to cost the decoder ~200 bytes a column (4M columns: over 1 GB) and one long
field among many columns padded every cell to its length: peak memory is measured in a fresh
process (VmHWM), reading a real file through a Dataset.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio import Dataset
from streamio.errors import StreamioWarning
from streamio.decoders import Csv
from streamio.errors import DecodeError

MB = 1 << 20


def _labels(ds) -> list:
    return [int(x) for batch in ds for x in batch["label"]]


def _file(tmp_path, rows: list) -> str:
    path = tmp_path / "rows.csv"
    path.write_bytes(b"".join(row + b"\n" for row in rows))
    return str(path)


ROWS = [b"%d,%d.5,%d" % (i, i, i) for i in range(40)]


@pytest.mark.parametrize("bad, field", [
    (b"7,8", "c2"),                             # ragged: too few fields
    (b"7,8.5,9,10", "c3 (beyond the last column)"),  # ragged: too many
    (b"7,x,9", "c1"),                           # a value that does not parse
    (b'7,"8"x,9', None),                        # text after a closing quote
])
@pytest.mark.parametrize("batch", [4, 64])  # batch by batch, and a block decoded at once
def test_a_bad_row_is_skipped_counted_and_named(tmp_path, fifo, bad, field, batch):
    rows = list(ROWS)
    rows[7] = bad
    data = b"".join(row + b"\n" for row in rows)
    ds = Dataset(fifo.make(data, 1000, 333), "csv",
                 decoder=Csv(label_column=0, on_error="warn")).batch(batch)
    with pytest.warns(StreamioWarning) as caught:
        assert _labels(ds) == [i for i in range(40) if i != 7]
    stats = ds.stats()
    assert (stats["skipped_records"], stats["decoder_skipped"]) == (1, 1)
    assert stats["decoder_skipped_fields"] == {field or "row": 1}
    text = " ".join(str(w.message) for w in caught)
    assert "record 7" in text and "source" in text, text
    # raise (the default) still stops there, naming the row
    with pytest.raises(DecodeError) as info:
        _labels(Dataset(_file(tmp_path, rows), "csv", decoder=Csv(label_column=0)).batch(batch))
    assert (info.value.record_index, info.value.field) == (7, field)


def test_skip_is_silent_and_drops_every_bad_row_of_a_batch(tmp_path):
    rows = list(ROWS)
    for k in (3, 4, 20, 39):
        rows[k] = b"%d,1" % k
    ds = Dataset(_file(tmp_path, rows), "csv", decoder=Csv(label_column=0, on_error="skip")).batch(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _labels(ds) == [i for i in range(40) if i not in (3, 4, 20, 39)]
    assert ds.stats()["decoder_skipped"] == 4


def test_a_bad_header_raises_whatever_on_error_says():
    with pytest.raises(DecodeError, match="names a column twice"):
        Csv(header=True, on_error="skip").decode_batch([b"a,a", b"1,2"])
    with pytest.raises(DecodeError, match="max_columns=2"):
        Csv(header=True, max_columns=2, on_error="skip").decode_batch([b"a,b,c", b"1,2,3"])


@pytest.mark.parametrize("kwargs, error", [({"on_error": "ignore"}, ValueError),
                                           ({"max_columns": 0}, ValueError),
                                           ({"max_columns": 1.5}, TypeError)])
def test_bad_options_fail_at_construction(kwargs, error):
    with pytest.raises(error):
        Csv(**kwargs)


# Rows of three columns from a small alphabet: good, ragged, bad numbers, quotes, bytes that are
# not UTF-8, missing values.
_field = st.sampled_from(["1", "-2.5", "", "x", '"3"', '"4,5"', '"6', "\xff", "1e3", " 7 "])
_row = st.lists(_field, min_size=1, max_size=5).map(lambda fs: ",".join(fs).encode("latin-1"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_row, min_size=1, max_size=12), as_columns=st.booleans(),
       dtype=st.sampled_from(["float32", "int64", "str"]))
def test_skip_equals_decoding_the_good_rows_alone(rows, as_columns, dtype):
    """Whatever the batch holds, ``skip`` gives exactly the rows that decode on their own, and
    counts the others."""
    options = dict(as_columns=as_columns, dtype={1: dtype} if as_columns else "float32")

    def primed(**more):
        decoder = Csv(**options, **more)
        decoder.decode_batch([b"0,0,0"])  # the plan: three columns
        return decoder

    good = []
    for row in rows:
        try:
            primed().decode_batch([row])
        except DecodeError:
            continue
        good.append(row)
    from streamio.decoders.skips import counting_skips

    with counting_skips() as skipped:
        got = primed(on_error="skip").decode_batch(rows)
    want = primed().decode_batch(good)
    assert sum(skipped.values()) == len(rows) - len(good)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        if want[name].dtype == object:
            assert got[name].tolist() == want[name].tolist()
        else:
            np.testing.assert_array_equal(got[name], want[name])


# --- wide rows and long fields, in bounded memory ----------------------------------------------------

# Decodes a file through a Dataset in a fresh process; prints the rows, the error and the peak growth.
DECODE = r"""
import json, sys
import streamio
from streamio.decoders import Csv

def vm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
path, options = sys.argv[1], json.loads(sys.argv[2])
before = vm()
rows, error, index = 0, None, None
try:
    for batch in streamio.Dataset(path, "csv", decoder=Csv(**options)).batch(4):
        rows += len(next(iter(batch.values())))
except streamio.StreamioError as err:
    error, index = type(err).__name__, err.record_index
print(json.dumps({"rows": rows, "error": error, "index": index, "growth": vm() - before}))
"""


def _decode_in_subprocess(path: str, **options) -> dict:
    out = subprocess.run([sys.executable, "-c", DECODE, path, json.dumps(options)],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def test_a_row_of_millions_of_columns_is_refused_in_bounded_memory(tmp_path):
    wide = b",".join([b"1"] * (3 * MB))  # 3M one-byte columns: a 6 MB row
    path = _file(tmp_path, [b"1,2,3", wide, b"4,5,6"])
    got = _decode_in_subprocess(path)
    assert (got["error"], got["index"]) == ("DecodeError", 1), got
    assert got["growth"] < 48 * MB, got  # ~600 MB before max_columns
    got = _decode_in_subprocess(path, on_error="skip")
    assert (got["rows"], got["error"]) == (2, None), got


def test_a_long_field_among_many_columns_costs_its_length_once(tmp_path):
    # 2,000 columns, one field of 2 MB: a fixed-width table of every field was 16 GB of text
    fields = [b"a"] * 2000
    fields[5] = b"b" * (2 * MB)
    path = _file(tmp_path, [b",".join(fields), b",".join([b"c"] * 2000)])
    got = _decode_in_subprocess(path, dtype="str")
    assert (got["rows"], got["error"]) == (2, None), got
    assert got["growth"] < 64 * MB, got
    out = Csv(dtype="str", as_columns=True, columns=[1, 5, 7]).decode_batch(
        [b",".join(fields), b",".join([b"1"] * 2000)])
    assert out["c5"].tolist() == ["b" * (2 * MB), "1"] and out["c1"].tolist() == ["a", "1"]
    with pytest.raises(DecodeError) as info:  # a long bad number is named as a short one is
        Csv().decode_batch([b"1,2,3", b"1," + b"9" * (2 * MB) + b"x,3"])
    assert (info.value.record_index, info.value.field) == (1, "c1")


@settings(max_examples=300, deadline=None)
@given(row=st.text(alphabet=',"ab\n', max_size=40), limit=st.integers(1, 8))
def test_more_fields_than_agrees_with_the_csv_module(row, limit):
    from streamio.decoders._csv_rows import more_fields_than

    try:
        parsed = list(csv.reader([row], strict=True))
    except csv.Error:
        return  # not a valid row: the split reports it, whatever the count said
    if len(parsed) != 1:
        return
    assert more_fields_than(row.encode(), b",", b'"', limit) == (len(parsed[0]) > limit)

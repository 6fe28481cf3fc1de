"""CSV decoding: peer files, RFC 4180 quoting, CRLF, BOM, repeated headers from concatenated
files, encodings, missing and bad values; the fast path equals the general one."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamio
from streamio.decoders import Csv, FieldSpec
from streamio.errors import DecodeError

from conftest import peer


def rows_of(source) -> list:
    return list(streamio.read_records(source, "csv"))


# --- peer files --------------------------------------------------------------------------------------

def test_ml_io_csv():
    out = Csv().decode_batch(rows_of(peer("ml-io/test.csv")))
    np.testing.assert_array_equal(out["features"], [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 1]])
    assert out["features"].dtype == np.float32 and set(out) == {"features"}


def test_sagemaker_convention_is_label_column_0():
    # CRLF line ends, no trailing newline, no header, label first
    out = Csv(label_column=0).decode_batch(rows_of(peer("sagemaker-xgboost-container/train.csv")))
    np.testing.assert_array_equal(out["label"], [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(out["features"], [[1, 0, 0, 0, 0]] * 4 + [[0, 1, 0, 0, 0]])


def test_iso_8859_5_file_fails_as_utf8_and_reads_with_its_encoding():
    rows = rows_of(peer("ml-io/test_iso8859_5.csv"))
    options = dict(header=True, as_columns=True, dtype={"col_3": "str"}, label_column="label")
    with pytest.raises(DecodeError, match="not valid utf-8") as info:
        Csv(**options).decode_batch(rows, source="test_iso8859_5.csv")
    assert (info.value.record_index, info.value.field) == (1, "col_3")
    out = Csv(encoding="iso-8859-5", **options).decode_batch(rows)
    assert out["col_3"].tolist() == ["Д", "Д"]
    np.testing.assert_array_equal(out["col_1"], [1, 2])
    np.testing.assert_array_equal(out["label"], [1, 0])


# --- quoting, line ends, BOM, headers ------------------------------------------------------------------

def test_rfc4180_quoting_through_the_framer():
    data = (b'id,text,score\r\n1,"a, b",0.5\r\n2,"say ""hi""",1.5\r\n'
            b'3,"two\r\nlines",2.5\n4,plain,"3.5"')  # mixed CRLF/LF, no final newline
    out = Csv(header=True, as_columns=True, dtype={"id": "int64", "text": "str"}).decode_batch(rows_of(data))
    assert out["text"].tolist() == ["a, b", 'say "hi"', "two\r\nlines", "plain"]
    np.testing.assert_array_equal(out["id"], [1, 2, 3, 4])
    np.testing.assert_array_equal(out["score"], [0.5, 1.5, 2.5, 3.5])
    assert out["id"].dtype == np.int64 and out["score"].dtype == np.float32


def test_quoted_numbers_and_other_delimiters():
    out = Csv(delimiter=";", label_column=-1).decode_batch([b'"1.5";2;"3"', b'4;"5";6'])
    np.testing.assert_array_equal(out["features"], [[1.5, 2], [4, 5]])
    np.testing.assert_array_equal(out["label"], [3, 6])


def test_bom_is_stripped_and_repeated_headers_from_concatenated_files_are_dropped(fifo):
    part = b"\xef\xbb\xbfa,b,label\r\n1,2,0\r\n3,4,1\r\n"
    path = fifo.make(part * 3, 7, 3, 101)  # Pipe mode: three files back to back, odd pieces
    decoder = Csv(header=True, label_column="label")
    records = rows_of(path)
    batches = [decoder.decode_batch(records[i:i + 4], first_index=i) for i in range(0, len(records), 4)]
    features = np.concatenate([b["features"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    np.testing.assert_array_equal(features, [[1, 2], [3, 4]] * 3)
    np.testing.assert_array_equal(labels, [0, 1] * 3)
    assert decoder.output_spec() == {"features": FieldSpec("dense", np.float32, (2,)),
                                     "label": FieldSpec("dense", np.float32, ())}


def test_fresh_decoder_takes_a_new_header():
    decoder = Csv(header=True, as_columns=True)
    assert set(decoder.decode_batch([b"x,y", b"1,2"])) == {"x", "y"}
    fresh = decoder.fresh()
    assert fresh.output_spec() is None
    assert set(fresh.decode_batch([b"u,v,w", b"1,2,3"])) == {"u", "v", "w"}
    # The primed decoder kept its header (and pickles with it).
    clone = pickle.loads(pickle.dumps(decoder))
    np.testing.assert_array_equal(clone.decode_batch([b"5,6", b"x,y"])["y"], [6])


def test_columns_selection_and_dtypes():
    rows = [b"k,a,b,c", b"7,1,2,3", b"8,4,5,6"]
    out = Csv(header=True, columns=["c", "a"], label_column="k", dtype={"k": "int64"}).decode_batch(rows)
    np.testing.assert_array_equal(out["features"], [[3, 1], [6, 4]])
    assert out["label"].dtype == np.int64
    out = Csv(columns=[2, 0], as_columns=True, dtype={0: "float64", "c2": "bytes"}).decode_batch(rows[1:])
    assert list(out) == ["c2", "c0"]
    assert out["c2"].tolist() == [b"2", b"5"] and out["c0"].dtype == np.float64


# --- missing and bad values ------------------------------------------------------------------------------

def test_missing_values_become_nan():
    out = Csv(na_values=("", "NA", "?")).decode_batch([b",1,NA", b"2,,3", b"?,4,"])
    np.testing.assert_array_equal(np.isnan(out["features"]), [[1, 0, 1], [0, 1, 0], [1, 0, 1]])
    np.testing.assert_array_equal(out["features"][1], [2, np.nan, 3])


def test_missing_value_in_an_integer_column_is_an_error():
    with pytest.raises(DecodeError, match="missing value") as info:
        Csv(dtype="int64").decode_batch([b"1,2", b"3,"], first_index=4)
    assert (info.value.record_index, info.value.field) == (5, "c1")


@pytest.mark.parametrize("rows, index, field, message", [
    ([b"1,2,3", b"4,x,6"], 11, "c1", "'x' is not a valid float32"),
    ([b"1,2,3", b"4,5"], 11, "c2", "2 fields, expected 3"),
    ([b"1,2,3", b"4,5,6,7"], 11, "c3 (beyond the last column)", "4 fields, expected 3"),
    ([b"1,2,3", b'4,"5,6'], 11, None, "quoted field is not closed"),
])
def test_bad_rows_are_named_by_record_and_column(rows, index, field, message):
    with pytest.raises(DecodeError, match=message) as info:
        Csv().decode_batch(rows, source="train.csv", first_index=10)
    assert (info.value.source, info.value.record_index, info.value.field) == ("train.csv", index, field)


def test_record_index_counts_dropped_header_rows():
    with pytest.raises(DecodeError) as info:
        Csv(header=True).decode_batch([b"a,b", b"1,2", b"a,b", b"3,oops"], first_index=0)
    assert (info.value.record_index, info.value.field) == (3, "b")


@pytest.mark.parametrize("kwargs, error", [
    (dict(delimiter=",,"), ValueError),
    (dict(delimiter=",", quotechar=","), ValueError),
    (dict(encoding="utf-16"), ValueError),
    (dict(encoding="no-such-codec"), ValueError),
    (dict(dtype="complex64"), ValueError),
    (dict(label_column=1.5), TypeError),
    (dict(columns="abc"), TypeError),
    (dict(na_values=""), TypeError),
    (dict(header="yes"), TypeError),
])
def test_bad_options_fail_at_construction(kwargs, error):
    with pytest.raises(error):
        Csv(**kwargs)


def test_unknown_column_name_is_named():
    with pytest.raises(DecodeError, match="no column named 'nope'"):
        Csv(header=True, label_column="nope").decode_batch([b"a,b", b"1,2"])


# --- the fast path equals the general path; garbage ---------------------------------------------------------

FIELDS = st.sampled_from(["1", "-2.5", " 3 ", "+4", "1e3", "nan", "inf", "", "NA", "1_0", "0x1", "abc",
                          '"7"', '"8,9"', '""', "١", "1.5e400", "-0", '"1"2', 'a"b', ' "3"', '"""4"'])


@settings(max_examples=300)
@given(st.integers(1, 4), st.data())
def test_fast_path_equals_general_path(width, data):
    rows = [",".join(data.draw(st.lists(FIELDS, min_size=width, max_size=width))).encode()
            for _ in range(data.draw(st.integers(1, 8)))]
    dtype = data.draw(st.sampled_from(["float32", "float64", {0: "int64"}]))
    options = dict(na_values=("", "NA"), dtype=dtype, as_columns=isinstance(dtype, dict),
                   label_column=data.draw(st.sampled_from([None, 0])))
    fast, general = Csv(**options), Csv(**options)
    general._fast_ok = False  # force the general path

    def run(decoder):
        try:
            return decoder.decode_batch(rows, first_index=3)
        except DecodeError as err:
            return (err.record_index, err.field)

    got, want = run(fast), run(general)
    if isinstance(want, tuple):
        assert got == want
    else:
        assert set(got) == set(want)
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=30), min_size=1, max_size=8), st.booleans(), st.booleans())
def test_garbage_gives_values_or_decode_error(rows, header, as_columns):
    decoder = Csv(header=header, as_columns=as_columns, dtype={"c0": "str"} if as_columns else "float32")
    try:
        out = decoder.decode_batch(rows, source="junk", first_index=2)
    except DecodeError as err:
        assert err.source == "junk"
        assert err.record_index is None or 2 <= err.record_index < 2 + len(rows)
    else:
        assert all(len(v) <= len(rows) for v in out.values())

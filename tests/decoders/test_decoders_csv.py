"""CSV decoding: peer files, RFC 4180 quoting, CRLF, BOM, repeated headers from concatenated
files, encodings, missing and bad values; the fast path equals the general one."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
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


# --- issue 15: reading what pandas and the csv module write, as they read it ---------------------------

import csv as _csv_module  # noqa: E402
import io  # noqa: E402
import warnings  # noqa: E402

import pandas as pd  # noqa: E402

import streamio.decoders.csv as csv_decoder  # noqa: E402
from streamio import Dataset  # noqa: E402


@pytest.fixture(params=["c", "python", "general"])
def path(request, monkeypatch):
    """Which decoding path a batch takes: the C kernel (when built), numpy's loadtxt without
    it, or the general (csv module) path; results must not depend on it."""
    if request.param == "c" and csv_decoder._c_parse_csv_floats is None:
        pytest.skip("C accelerator not built (python setup.py build_ext --inplace)")
    if request.param != "c":
        monkeypatch.setattr(csv_decoder, "_c_parse_csv_floats", None)
    return request.param


def make_csv(path_, **options):
    decoder = Csv(**options)
    if path_ == "general":
        decoder._fast_ok = False
    return decoder


def pandas_csv(arr) -> bytes:
    return pd.DataFrame(arr).to_csv(index=False).encode()


def test_data_rows_equal_to_the_header_are_kept(path, tmp_path):
    # pandas writes the header "0,1,2" for a plain array; rows "0,1,2" are data
    arr = np.array([[0, 1, 2], [3, 4, 5], [0, 1, 2], [0, 1, 2]])
    data = pandas_csv(arr)
    assert data.splitlines()[0] == b"0,1,2"
    want = pd.read_csv(io.BytesIO(data)).to_numpy()
    assert want.shape == (4, 3)
    rows = rows_of(data)
    decoder = make_csv(path, header=True)
    got = np.concatenate([decoder.decode_batch(rows[:2])["features"],
                          decoder.decode_batch(rows[2:])["features"]])
    np.testing.assert_array_equal(got, want)
    file = tmp_path / "a.csv"
    file.write_bytes(data)
    batches = list(Dataset([str(file), str(file)], "csv", decoder=make_csv(path, header=True)).batch(3))
    np.testing.assert_array_equal(np.concatenate([b["features"] for b in batches]),
                                  np.concatenate([want, want]))


def test_repeated_header_in_one_stream_is_dropped_only_where_it_cannot_be_data(path):
    # files concatenated into one stream (SageMaker Pipe mode): a header that names columns
    # cannot be a float row, so where it comes again it is a file's header
    named = b"a,b\n1,2\n" * 3
    out = make_csv(path, header=True).decode_batch(rows_of(named))
    np.testing.assert_array_equal(out["features"], [[1, 2]] * 3)
    # A numeric header repeated without a mark is data, as pandas reads the same bytes.
    numeric = pandas_csv([[5, 6, 7]]) * 2
    want = pd.read_csv(io.BytesIO(numeric)).to_numpy()
    np.testing.assert_array_equal(make_csv(path, header=True).decode_batch(rows_of(numeric))["features"], want)
    # A BOM marks the start of each file written with encoding="utf-8-sig": dropped there.
    marked = (b"\xef\xbb\xbf" + pandas_csv([[0, 1, 2], [5, 6, 7]])) * 2
    out = make_csv(path, header=True).decode_batch(rows_of(marked))
    np.testing.assert_array_equal(out["features"], [[0, 1, 2], [5, 6, 7]] * 2)


def test_a_bom_in_only_one_file_does_not_make_the_headers_differ(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_bytes(b"\xef\xbb\xbfx,y\r\n1,2\r\n")  # Excel's "CSV UTF-8"
    b.write_bytes(b"x,y\n3,4\n")
    for order in ([a, b], [b, a]):
        batches = list(Dataset([str(p) for p in order], "csv",
                               decoder=Csv(header=True, as_columns=True)).batch(4))
        assert sorted(np.concatenate([batch["x"] for batch in batches]).tolist()) == [1, 3]


FULL_WIDTH = "１２".encode()  # U+FF11 U+FF12


@pytest.mark.parametrize("batch, index", [
    ([FULL_WIDTH + b",3"], 0),
    ([b"1,2", FULL_WIDTH + b",3"], 1),  # an otherwise plain batch (C kernel, loadtxt)
    ([b'"1",2', FULL_WIDTH + b",3"], 1),  # a quoted batch (csv module, Python's float())
    ([b"1,x y", FULL_WIDTH + b",3"], 1),
])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_a_full_width_number_fails_alike_in_every_batch(path, batch, index, dtype):
    # np.loadtxt and pandas' C parser do not read "１２" as a number (pandas keeps it as text);
    # Python's float() does. Numbers are ASCII here, whatever else is in the batch.
    assert not pd.api.types.is_numeric_dtype(pd.read_csv(io.BytesIO("a\n１２\n".encode()))["a"])
    with pytest.raises(ValueError):
        np.loadtxt(["１２"], dtype=np.float64)
    with pytest.raises(DecodeError, match="not a valid") as info:
        make_csv(path, dtype=dtype).decode_batch(batch, first_index=10)
    assert (info.value.record_index, info.value.field) == (10 + index, "c0")
    # as text it is kept as written
    out = make_csv(path, as_columns=True, dtype={0: "str", 1: "str"}).decode_batch(batch)
    assert out["c0"].tolist()[index] == "１２"


@pytest.mark.parametrize("value", ["١", "1_0", "\u00a01", "٣.٥"])
def test_other_numbers_that_only_python_float_reads_fail_alike(path, value):
    for batch in ([value.encode()], [b'"1"', value.encode()]):
        with pytest.raises(DecodeError, match="not a valid"):
            make_csv(path).decode_batch(batch)


def test_fields_over_the_csv_modules_field_size_limit(path):
    limit = _csv_module.field_size_limit()
    long_text = "x, \"y\"\n" * (limit // 7 + 10)  # quoted: commas, quotes and line breaks
    quoted = '"' + long_text.replace('"', '""') + '"'
    plain = "z" * (limit + 1)
    data = f"id,text,other\n1,{quoted},{plain}\n2,short,{plain}\n".encode()
    rows = rows_of(data)
    assert len(rows) == 3
    out = make_csv(path, header=True, as_columns=True, dtype={"text": "str", "other": "str"},
                   label_column="id").decode_batch(rows)
    assert out["text"].tolist() == [long_text, "short"]
    assert out["other"].tolist() == [plain, plain]
    np.testing.assert_array_equal(out["label"], [1, 2])
    assert _csv_module.field_size_limit() == limit  # the user's process setting is untouched
    want = pd.read_csv(io.BytesIO(data), dtype=str)
    assert want["text"].tolist() == out["text"].tolist()
    # a long row that is not valid CSV is still named
    bad = rows[1].replace(b'"x,', b'"x"q', 1)
    with pytest.raises(DecodeError, match="not valid CSV") as info:
        Csv(as_columns=True, dtype="str").decode_batch([rows[2], bad], first_index=5)
    assert info.value.record_index == 6


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='ab,"\r\n ', max_size=30), st.sampled_from(['"', None]))
def test_long_row_splitter_equals_the_csv_module(text, quotechar):
    decoder = Csv(quotechar=quotechar)
    try:
        want = list(_csv_module.reader([text], **decoder._csv_options))
    except _csv_module.Error:
        want = None
    try:
        got = [decoder._split_long_row(text)]
    except _csv_module.Error:
        got = None
    if want is not None and len(want) == 1 and not any(c in text for c in "\r\n"):
        assert got == want
    elif want is None:
        assert got is None


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # one path per test
@given(st.lists(st.sampled_from([b"1,2", b"\r", b"\r\r", b"", b" ", b"3.5e38,1", b'"3.5e38",1',
                                 b"1e400,-1e400", b"nan,inf", b"\t,\t", b"a,b", b"\n", b"1,2\n3,4",
                                 "１２,3".encode(), b"\xff,1", b"99999999999999999999,1"]),
                min_size=1, max_size=6),
       st.sampled_from(["float32", "float64", "int64", "int8", "bool", {0: "str"}]))
def test_decoding_emits_no_warning(path, rows, dtype):
    # numpy's "loadtxt: input contained no data" and "overflow encountered in cast" used to leak
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for header in (False, True):
            try:
                make_csv(path, header=header, dtype=dtype,
                         as_columns=isinstance(dtype, dict)).decode_batch(rows)
            except DecodeError:
                pass


def test_csv_through_a_dataset_emits_no_warning(tmp_path):
    file = tmp_path / "w.csv"
    file.write_bytes(b"a,b\n1,2\r\r\n\r  \n3.5e38,4\n" + b"5,6\n" * 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = list(Dataset(str(file), "csv", decoder=Csv(header=True)).batch(7))
    assert sum(len(b["features"]) for b in batches) == 102


def test_a_dataset_frames_with_the_decoders_delimiter(tmp_path):
    # a quote opens a quoted field only after the delimiter, so the framer must know it
    file = tmp_path / "semi.csv"
    file.write_bytes(b'id;note\n1;"two\nlines; and ""quotes"""\n2;5 ft 3"\n')
    decoder = Csv(header=True, delimiter=";", as_columns=True, dtype={"note": "str"})
    ds = Dataset(str(file), "csv", decoder=decoder)
    assert ds.reader_options == {"delimiter": ";"}
    (batch,) = list(ds.batch(8))
    assert batch["note"].tolist() == ['two\nlines; and "quotes"', '5 ft 3"']
    np.testing.assert_array_equal(batch["id"], [1, 2])
    want = pd.read_csv(io.BytesIO(file.read_bytes()), sep=";")
    assert want["note"].tolist() == batch["note"].tolist()
    # options given to the Dataset win; a decoder with default options adds none
    assert Dataset(str(file), "csv", decoder=decoder, delimiter=",").reader_options == {"delimiter": ","}
    assert Dataset(str(file), "csv", decoder=Csv()).reader_options == {}

"""CSV row framing as the csv module and pandas read the same bytes (issue 15, item 2; item 7's
blank lines and BOM): LF, CRLF and lone-CR row ends; a quote is special only at the start of a
field; any split of the stream into chunks gives the same rows."""

from __future__ import annotations

import csv
import io

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio.decoders import Csv
from streamio.errors import TruncatedStreamError
from streamio.formats import TextRowFramer, make_framer


def frame(framer, data: bytes, cuts=()) -> list:
    out, pos = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out += framer.feed(data[pos:cut])
        pos = cut
    return out + framer.finish()


def csv_module_rows(text: str, delimiter: str = ",") -> list:
    """The rows the csv module reads from a file opened with newline="" (its documented way)."""
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


def fields(record: bytes, delimiter: str = ",") -> list:
    rows = list(csv.reader([record.decode()], delimiter=delimiter))
    assert len(rows) == 1, f"{record!r} is not one csv-module row"
    return rows[0]


# Anything the csv module reads: quotes anywhere (opening, closing, doubled, literal), every
# kind of line end, blanks, the delimiter.
csv_text = st.one_of(
    st.text(alphabet='a1 \t,;"\r\n', max_size=60),
    # quote-heavy: runs of quotes long and short (the framer measures long runs at once)
    st.lists(st.sampled_from(['"', '""', '"' * 9, '"' * 16, "a", ",", ";", "\n", "\r"]),
             max_size=30).map("".join),
)


def frame_until_error(framer, data: bytes, cuts=()):
    """(records delivered, the TruncatedStreamError or None)."""
    out, pos = [], 0
    try:
        for cut in sorted(set(cuts)) + [len(data)]:
            out += framer.feed(data[pos:cut])
            pos = cut
        out += framer.finish()
    except TruncatedStreamError as err:
        return out, err
    return out, None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=csv_text, delimiter=st.sampled_from([",", ";"]), data=st.data())
def test_rows_are_the_csv_modules_rows_for_any_chunking(text, delimiter, data):
    stream = text.encode()
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    # keep_blank: compare the raw framing (the csv module yields [] for a blank line)
    framer = TextRowFramer(delimiter=delimiter, keep_blank=True, source="t")
    got, err = frame_until_error(framer, stream, cuts)
    want = csv_module_rows(text, delimiter)
    if err is not None:
        # The text ends inside a quoted field: the csv module (not strict) keeps the partial
        # row as its last; we deliver every row before it and name where that row starts.
        want, partial = want[:-1], want[-1]
        assert stream[err.offset:].startswith(b'"') or (delimiter + '"').encode() in stream[err.offset:]
        assert partial
    assert [fields(r, delimiter) for r in got] == want
    whole, _ = frame_until_error(TextRowFramer(delimiter=delimiter, keep_blank=True), stream)
    assert got == whole


@settings(max_examples=300, deadline=None)
@given(text=csv_text, data=st.data())
def test_the_csv_format_skips_blank_and_whitespace_only_rows(text, data):
    stream = text.encode()
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    try:
        raw = frame(TextRowFramer(keep_blank=True, source="t"), stream)
    except TruncatedStreamError:
        return
    got = frame(make_framer("csv", source="t"), stream, cuts)
    assert got == [r for r in raw if r.strip(b" \t")]  # as pandas' skip_blank_lines


def test_one_byte_at_a_time_equals_whole():
    stream = (b'\xef\xbb\xbfid,"te""xt",h\r\n1,"a,\r\nb",5 ft 3"\r2,"""",x\n\n  \n3,"c"d"e,x\r'
              b'4,,"\n"\r\n')
    whole = frame(make_framer("csv", source="t"), stream)
    assert whole == [b'id,"te""xt",h', b'1,"a,\r\nb",5 ft 3"', b'2,"""",x', b'3,"c"d"e,x',
                     b'4,,"\n"']
    assert frame(make_framer("csv", source="t"), stream, range(len(stream))) == whole


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_lf_crlf_and_lone_cr_end_rows_as_in_pandas(eol):
    # classic Mac OS / old Excel "CSV (Macintosh)" files end rows with a lone CR
    stream = eol.join([b"a,b,c", b"1,2,3", b"4,5,6", b"7,8,9"]) + eol
    rows = list(streamio.read_records(stream, "csv"))
    assert rows == [b"a,b,c", b"1,2,3", b"4,5,6", b"7,8,9"]
    want = pd.read_csv(io.BytesIO(stream)).to_numpy()
    got = Csv(header=True).decode_batch(rows)["features"]
    np.testing.assert_array_equal(got, want)


def test_a_quote_inside_an_unquoted_field_is_a_literal_as_in_pandas():
    stream = b'name,height,n\nann,5 ft 3",1\nbob,6 ft,2\ncy,"x""y",3\n'
    rows = list(streamio.read_records(stream, "csv"))
    assert rows == [b"name,height,n", b'ann,5 ft 3",1', b"bob,6 ft,2", b'cy,"x""y",3']
    out = Csv(header=True, as_columns=True, dtype={"name": "str", "height": "str"}).decode_batch(rows)
    want = pd.read_csv(io.BytesIO(stream), dtype={"name": str, "height": str})
    assert out["height"].tolist() == want["height"].tolist() == ['5 ft 3"', "6 ft", 'x"y']
    np.testing.assert_array_equal(out["n"], want["n"])


def test_whitespace_only_lines_are_skipped_as_in_pandas():
    stream = b"a,b\n1,2\n   \n\t\n \t \r\n3,4\n"
    rows = list(streamio.read_records(stream, "csv"))
    assert rows == [b"a,b", b"1,2", b"3,4"]
    np.testing.assert_array_equal(Csv(header=True).decode_batch(rows)["features"],
                                  pd.read_csv(io.BytesIO(stream)).to_numpy())


def test_the_delimiter_option_decides_where_a_field_starts():
    stream = b'x;"a\nb";"c"\n1;2;3\n'
    assert list(streamio.read_records(stream, "csv", delimiter=";")) == [b'x;"a\nb";"c"', b"1;2;3"]
    # read with "," as the delimiter, the quote after ";" is a literal: the row ends at the LF
    assert list(streamio.read_records(stream, "csv"))[0] == b'x;"a'
    with pytest.raises(ValueError):
        make_framer("csv", source="x", delimiter="\n")
    with pytest.raises(ValueError):
        make_framer("csv", source="x", delimiter='"')
    with pytest.raises(ValueError):
        make_framer("csv", source="x", quotechar="é")


def test_a_bom_is_dropped_at_the_start_of_the_stream_only():
    assert frame(make_framer("csv", source="t"), b"\xef\xbb\xbf\"a\nb\",1\n") == [b'"a\nb",1']
    for cuts in ([1], [2], [1, 2], [3]):
        assert frame(make_framer("csv", source="t"), b"\xef\xbb\xbfa,b\n", cuts) == [b"a,b"]
    assert frame(make_framer("csv", source="t"), b"\xef\xbb") == [b"\xef\xbb"]
    # lines keep every byte
    assert frame(make_framer("lines", source="t"), b"\xef\xbb\xbfa\n") == [b"\xef\xbb\xbfa"]


def test_lines_format_is_unchanged_lf_only():
    stream = b"a\rb\r\nc\n\nd\r"
    assert frame(make_framer("lines", source="t"), stream) == [b"a\rb", b"c", b"", b"d"]
    assert frame(make_framer("lines", source="t"), stream, range(len(stream))) == [
        b"a\rb", b"c", b"", b"d"]

"""Where a CSV row starts (``TextRowFramer.row_offset``, issue 41 item 10): the framer keeps its
last bytes and frames them again when asked. Streams are built row by row, so each row's start
is known by construction: LF, CRLF and lone-CR row ends, blank rows and rows of blanks between
rows, quoted line breaks, a byte-order mark at the start (skipped) and in the middle (a row's
own bytes), a last row without a line break; any split into chunks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.formats import TextRowFramer

_ROWS = st.sampled_from([
    b'1,"two\r\nlines",3',      # a quoted CRLF
    b'4,"a ""quoted"" word"',
    b' 5,"six"',                 # a leading blank: the quote is a literal
    b'7,5 ft 3",8',              # a literal quote
    b"\xef\xbb\xbf9,10",         # a BOM inside the stream is a row's own bytes
    b"11,12",
    b"13,\t14 ",
])
_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
_BETWEEN = st.lists(st.sampled_from([b"\n", b"\r\n", b"  \n", b"\t\r\n", b"\r"]), max_size=2)


@st.composite
def streams(draw):
    """(stream bytes, rows, each row's start offset)."""
    out = bytearray(b"\xef\xbb\xbf" if draw(st.booleans()) else b"")
    rows, starts = [], []
    for k in range(draw(st.integers(1, 25))):
        out += b"".join(draw(_BETWEEN))
        row = draw(_ROWS)
        if not out and row.startswith(b"\xef\xbb\xbf"):
            row = row[3:]  # a BOM that opens the stream is not the row's
        starts.append(len(out))
        rows.append(row)
        out += row + draw(_ENDS)
    if draw(st.booleans()):
        out = out.rstrip(b"\r\n")  # the last row without a line break
    return bytes(out), rows, starts


def _feed(framer, data: bytes, cuts: list, ask) -> list:
    rows, pos = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        rows += framer.feed(data[pos:cut])
        pos = cut
        ask(len(rows))
    rows += framer.finish()
    ask(len(rows))
    return rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), cuts=st.lists(st.integers(0, 2000), max_size=12),
       keep=st.sampled_from([1 << 30, 48, 200]))
def test_a_row_offset_is_exact_or_none(stream, cuts, keep):
    data, rows, starts = stream
    framer = TextRowFramer()
    framer.keep_row_offsets(keep)
    found: dict = {}

    def ask(delivered: int) -> None:  # as a decoder would, while the stream goes on
        for i in range(delivered):
            offset = framer.row_offset(i)
            if offset is not None:
                assert offset == starts[i], (i, data)
                found[i] = offset
        assert framer.row_offset(delivered) is None  # not delivered yet

    assert _feed(framer, data, [c % (len(data) + 1) for c in cuts], ask) == rows
    if keep == 1 << 30:
        assert sorted(found) == list(range(len(rows)))  # everything kept: every row found


def test_only_the_last_bytes_are_kept():
    rows = [b"%06d,x" % i for i in range(2000)]  # 9 bytes a line
    data = b"".join(row + b"\n" for row in rows)
    framer = TextRowFramer()
    framer.keep_row_offsets(900)
    for pos in range(0, len(data), 300):
        framer.feed(data[pos:pos + 300])
    assert framer.row_offset(1999) == 1999 * 9
    assert framer.row_offset(1900) == 1900 * 9
    assert framer.row_offset(100) is None  # long gone
    assert sum(len(chunk) for _, chunk in framer._recent.chunks) <= 900 + 300


def test_a_byte_range_gives_stream_offsets():
    rows = [b"%d,%s" % (i, b"y" * (i % 7)) for i in range(300)]
    data = b"".join(row + b"\r\n" for row in rows)
    starts = [sum(len(r) + 2 for r in rows[:i]) for i in range(len(rows))]
    start, stop = 1000, 2500
    framer = TextRowFramer()
    framer.keep_row_offsets()
    origin = framer.start_range(start, stop)
    got = _feed(framer, data[origin:], list(range(0, len(data), 97)), lambda n: None)
    first = next(i for i, s in enumerate(starts) if s >= start)
    assert got == rows[first:first + len(got)]
    assert [framer.row_offset(i) for i in range(len(got))] == starts[first:first + len(got)]


def test_nothing_is_kept_unless_asked():
    framer = TextRowFramer()
    framer.feed(b"1,2\n3,4\n")
    assert framer.row_offset(1) is None and framer._recent is None
    lines = TextRowFramer(quotechar=None, keep_blank=True, csv_rows=False)
    lines.keep_row_offsets()  # CSV only
    lines.feed(b"a\n\nb\n")
    assert lines.row_offset(2) is None

"""Hostile CSV input in bounded memory and time (issue 10, finding 1).

A quoted field made of line breaks used to cost ~88 bytes of RAM per input byte (one list entry
per line piece): a 100 MB field peaked near 8.7 GB. Peak memory must stay within a small constant
times ``max_record_size`` plus the read buffers, for any input, and a field over
``max_record_size`` must fail before it is buffered whole. Peak RSS is read from
``/proc/self/status`` (VmHWM) in a fresh subprocess that reads a real gzip file or FIFO.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

import streamio
from streamio.errors import RecordTooLargeError, TruncatedStreamError
from streamio.formats import make_framer

MB = 1 << 20

# Reads a source to the end in a fresh process; prints the error and the peak RSS growth.
READER = r"""
import json, sys
import streamio

def vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
source, compression, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
before = vm("VmHWM")
rows, error, offset, sizes = 0, None, None, []
try:
    for row in streamio.read_records(source, "csv", compression=compression or None,
                                     max_record_size=limit):
        rows += 1
        sizes.append(len(row))
        del row
except streamio.StreamioError as err:
    error, offset = type(err).__name__, err.offset
print(json.dumps({"rows": rows, "sizes": sizes, "error": error, "offset": offset,
                  "growth": vm("VmHWM") - before}))
"""


def read_in_subprocess(source: str, compression: str = "", limit: int = 256 * MB) -> dict:
    out = subprocess.run([sys.executable, "-c", READER, source, compression, str(limit)],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def gzip_of_newline_field(path, field_bytes: int, tail: bytes = b"") -> str:
    """A gzip file of b'"' + b'\\n' * field_bytes + tail, written in pieces (never whole)."""
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'"')
        piece = b"\n" * (4 * MB)
        left = field_bytes
        while left:
            f.write(piece[:min(left, len(piece))])
            left -= min(left, len(piece))
        f.write(tail)
    return str(path)


@pytest.mark.parametrize("limit, error", [(256 * MB, "TruncatedStreamError"),
                                          (4 * MB, "RecordTooLargeError")])
def test_a_100_mb_field_of_line_breaks_is_read_in_bounded_memory(tmp_path, limit, error):
    path = gzip_of_newline_field(tmp_path / "field.csv.gz", 100 * MB)
    assert os.path.getsize(path) < MB  # a small file: the bomb is in the decompression
    got = read_in_subprocess(path, "gzip", limit)
    assert (got["rows"], got["error"], got["offset"]) == (0, error, 0)
    held = min(limit, 100 * MB)  # what the framer may hold: the field, or up to the limit
    assert got["growth"] < 2 * held + 32 * MB, got  # was ~88 bytes per input byte


def test_gzip_bomb_field_over_the_limit_fails_before_it_is_buffered(tmp_path):
    # ~179 KB of gzip holding one 184 MB field (issue 10's bomb); the limit is 1 MiB
    path = gzip_of_newline_field(tmp_path / "bomb.gz", 184 * 1000 * 1000)
    got = read_in_subprocess(path, "gzip", MB)
    assert (got["rows"], got["error"], got["offset"]) == (0, "RecordTooLargeError", 0)
    assert got["growth"] < 32 * MB, got


def test_a_long_multiline_field_from_a_fifo_is_delivered_whole(fifo, tmp_path):
    field = b'"' + b"\r\n" * (10 * MB) + b'""x"'
    stream = b"a,b\n" + field + b",1\n2,3"
    path = fifo.make(stream, 1, 65537, 4093, MB + 3)
    got = read_in_subprocess(path, "", 64 * MB)
    assert (got["rows"], got["error"], got["sizes"]) == (3, None, [3, len(field) + 2, 3])
    # the row is held once in the buffer, then once as the record (bytes)
    assert got["growth"] < 3 * len(field) + 32 * MB, got


def test_the_row_over_the_limit_is_named_and_earlier_rows_delivered(fifo):
    stream = b"h,i\n1,2\n3," + b'"' + b"\n" * (8 * MB) + b'"\n4,5\n'
    path = fifo.make(stream, 65537, 3)
    reader = streamio.read_records(path, "csv", max_record_size=MB)
    assert [next(reader), next(reader)] == [b"h,i", b"1,2"]
    with pytest.raises(RecordTooLargeError) as info:
        next(reader)
    assert (info.value.offset, info.value.record_index, info.value.source) == (8, 2, path)
    # skip mode drops only that row
    rows = list(streamio.read_records(stream, "csv", max_record_size=MB, on_error="skip"))
    assert rows == [b"h,i", b"1,2", b"4,5"]


@pytest.mark.parametrize("field", [b"\n", b"\r\n", b"\r", b'""', b'"",\n', b"a,b\n"])
def test_pathological_fields_frame_in_linear_time(field):
    # Each of these is a piece the old framer paid per-piece Python work for; 4 MB of it in a
    # quoted field must frame with a handful of searches per chunk, so at C speed. A quadratic
    # or per-line framer would take minutes here (no timing is asserted: the size says it).
    body = field * (4 * MB // len(field))
    stream = b'x,"' + body + b'",y\n1,2,3\n'
    framer = make_framer("csv", source="t")
    out = []
    for k in range(0, len(stream), MB):
        out += framer.feed(stream[k:k + MB])
    out += framer.finish()
    assert out == [b'x,"' + body + b'",y', b"1,2,3"]


def test_many_small_literal_quotes_are_no_slower_than_linear():
    # literal quotes (not at a field start) are searched past one by one, never rescanned
    stream = b"".join(b'%d,5 ft %d",x"y"z\n' % (i, i) for i in range(200_000))
    rows = list(streamio.read_records(stream, "csv"))
    assert len(rows) == 200_000 and rows[7] == b'7,5 ft 7",x"y"z'


def test_truncated_quote_at_the_end_of_a_gzip_member_names_the_row(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b'a,b\n1,"open\n' + b"\n" * 1000))
    rows = []
    with pytest.raises(TruncatedStreamError) as info:
        for row in streamio.read_records(str(path), "csv"):
            rows.append(row)
    assert rows == [b"a,b"] and info.value.offset == 4 and info.value.record_index == 1

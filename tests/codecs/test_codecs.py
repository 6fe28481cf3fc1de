"""Codecs: gzip members and zero padding, concatenated zlib streams, compression sniffed from the
first bytes when the name says nothing, and errors that say what the bytes look like."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio.codecs import SniffingCodec, ZlibCodec, make_codec
from streamio.errors import CorruptRecordError, FormatError, TruncatedStreamError

RECORDS = [b"record %d " % i * (1 + i % 7) for i in range(300)]


def tfrecord_bytes(records=RECORDS) -> bytes:
    buf = io.BytesIO()
    streamio.write_records(buf, "tfrecord", records)
    return buf.getvalue()


PLAIN = tfrecord_bytes()


def gzip_cli(data: bytes) -> bytes:
    """A gzip member written by the gzip program itself (as a user's shard would be)."""
    if shutil.which("gzip") is None:
        return gzip.compress(data)
    return subprocess.run(["gzip", "-c", "-n"], input=data, stdout=subprocess.PIPE,
                          check=True).stdout


def decode_in_pieces(codec, data: bytes, cuts) -> bytes:
    out = []
    last = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out.extend(bytes(p) for p in codec.decode(memoryview(data)[last:cut]))
        last = cut
    out.extend(bytes(p) for p in codec.finish())
    return b"".join(out)


# --- gzip: zero padding after the last member (issue 10, finding 10) ------------------------------

@pytest.mark.parametrize("padding", [1, 511, 512 - 0, 10240, 3 * 1024 * 1024])
def test_gzip_with_trailing_zero_padding_reads_like_gzip_does(tmp_path, padding):
    data = gzip_cli(PLAIN) + b"\0" * padding
    path = tmp_path / "padded.tfrecord.gz"
    path.write_bytes(data)
    if shutil.which("gzip"):  # the reference: gzip -dc reads the same bytes, exit status 0
        done = subprocess.run(["gzip", "-dc", str(path)], stdout=subprocess.PIPE)
        assert done.returncode == 0 and done.stdout == PLAIN
    assert list(streamio.read_records(str(path), "tfrecord")) == RECORDS


def test_padded_gzip_from_a_fifo_in_odd_pieces(fifo):
    data = gzip_cli(PLAIN) + gzip_cli(PLAIN) + b"\0" * 10000
    path = fifo.make(data, 1, 7, 4099, 13)  # the name says nothing: sniffed as gzip, too
    assert list(streamio.read_records(path, "tfrecord")) == RECORDS * 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 10 ** 6), max_size=6), st.integers(0, 2000),
       st.sampled_from(["gzip", "zlib"]))
def test_members_and_padding_decode_the_same_for_any_split(cuts, padding, kind):
    compress = gzip.compress if kind == "gzip" else zlib.compress
    data = compress(PLAIN[:5000]) + b"\0" * padding + compress(PLAIN[5000:]) + b"\0" * padding
    cuts = [c % (len(data) + 1) for c in cuts]
    assert decode_in_pieces(ZlibCodec(kind, source="s"), data, cuts) == PLAIN


def test_gzip_one_byte_at_a_time_with_padding():
    data = gzip.compress(PLAIN[:3000]) + b"\0" * 600
    assert decode_in_pieces(ZlibCodec("gzip", source="s"), data, range(len(data))) == PLAIN[:3000]


@pytest.mark.parametrize("garbage", [b"garbage", b"\0\0\0\x01", b"\x1f\x00junk", b"PK\x03\x04"],
                         ids=["text", "zeros-then-1", "half-magic", "zip"])
def test_other_trailing_garbage_still_raises_naming_its_offset(garbage):
    member = gzip_cli(PLAIN)
    padding = b"\0" * 100
    data = member + padding + garbage
    reader = streamio.read_records(data, "tfrecord", compression="gzip")
    got = []
    with pytest.raises(CorruptRecordError) as info:
        for record in reader:
            got.append(record)
    assert got == RECORDS  # every record before the garbage is delivered
    at = len(member) + len(padding) + len(garbage) - len(garbage.lstrip(b"\0"))
    assert f"compressed offset {at}" in str(info.value)
    assert info.value.offset == len(PLAIN) and info.value.source == "<bytes>"


def test_truncated_member_after_padding_is_still_truncation():
    member = gzip.compress(PLAIN)
    with pytest.raises(TruncatedStreamError):
        list(streamio.read_records(member + b"\0" * 10 + member[:100], "tfrecord",
                                   compression="gzip"))


# --- zlib: concatenated streams (issue 15, item 8) -------------------------------------------------

def test_concatenated_zlib_streams_read_all_of_them(tmp_path):
    a, b = tmp_path / "a.zz", tmp_path / "b.zz"
    a.write_bytes(zlib.compress(tfrecord_bytes(RECORDS[:100])))
    b.write_bytes(zlib.compress(tfrecord_bytes(RECORDS[100:]), 9))
    both = tmp_path / "ab.tfrecord.zz"
    with open(both, "wb") as out:  # cat a.zz b.zz > ab.zz
        subprocess.run(["cat", str(a), str(b)], stdout=out, check=True)
    assert list(streamio.read_records(str(both), "tfrecord")) == RECORDS
    assert list(streamio.read_records(both.read_bytes(), "tfrecord", compression="zlib")) == RECORDS


def test_garbage_after_a_zlib_stream_raises():
    data = zlib.compress(PLAIN) + b"not zlib"
    with pytest.raises(CorruptRecordError, match="trailing garbage at compressed offset"):
        list(streamio.read_records(data, "tfrecord", compression="zlib"))


# --- infer: sniff the first bytes when the name says nothing (issue 15, item 9) --------------------

@pytest.mark.parametrize("kind", ["gzip", "zlib", None])
def test_infer_sniffs_gzip_and_zlib_from_a_fifo(fifo, kind):
    data = {"gzip": gzip.compress, "zlib": zlib.compress, None: bytes}[kind](PLAIN)
    path = fifo.make(data, 1, 1, 3, 4099, name=f"pipe-{kind}")  # no suffix, no seeking possible
    assert list(streamio.read_records(path, "tfrecord")) == RECORDS


def test_sniffing_holds_back_no_more_than_needed_and_never_misreads_plain_data():
    # A TFRecord whose first record is 376 bytes starts 78 01: a valid zlib header. The trial
    # inflate refuses it, so it is read as plain.
    records = [b"x" * 376, b"y" * 3]
    data = tfrecord_bytes(records)
    assert data[:2] == b"\x78\x01"
    assert list(streamio.read_records(data, "tfrecord")) == records
    for cut in range(0, len(data), 97):
        codec = SniffingCodec(source="s", make=lambda kind: ZlibCodec(kind, source="s"))
        assert decode_in_pieces(codec, data, [cut]) == data and codec.kind is None
    # CSV that begins with a zlib-looking pair ("HK": 0x48 0x4b passes the header check).
    text = b"HK,1,2\n" + b"3,4,5\n" * 10
    assert list(streamio.read_records(text, "lines")) == [b"HK,1,2"] + [b"3,4,5"] * 10


def test_sniffed_zlib_shorter_than_the_trial_window_is_read():
    records = [b"a", b"b"]
    data = zlib.compress(tfrecord_bytes(records))
    assert len(data) < 100
    assert list(streamio.read_records(data, "tfrecord")) == records
    codec = make_codec("infer", "pipe")
    assert decode_in_pieces(codec, data, range(len(data))) == tfrecord_bytes(records)
    assert codec.kind == "zlib"


# --- what the bytes look like, when the first record fails ----------------------------------------

@pytest.mark.parametrize("data,format,compression,says", [
    (gzip.compress(PLAIN), "tfrecord", None, "looks like gzip-compressed data: pass compression='gzip'"),
    (zlib.compress(PLAIN), "tfrecord", None, "looks like zlib-compressed data: pass compression='zlib'"),
    (b"\x28\xb5\x2f\xfd" + bytes(40), "tfrecord", None, "looks like zstd-compressed data"),
    (b"a,b,c\n1,2,3\n" * 3, "tfrecord", None, "looks like text: pass format='csv' or format='lines'"),
    (PLAIN, "recordio", None, "looks like TFRecord data: pass format='tfrecord'"),
    (b"\x0a\x23\xd7\xce" + bytes(20), "tfrecord", None, "looks like RecordIO data: pass format='recordio'"),
    (PLAIN, "tfrecord", "gzip", "does not look gzip-compressed (it looks like TFRecord data)"),
    (PLAIN, "tfrecord", "zlib", "does not look zlib-compressed"),
], ids=["gzip", "zlib", "zstd", "csv", "tfrecord-as-recordio", "recordio-as-tfrecord",
        "plain-as-gzip", "plain-as-zlib"])
def test_first_record_failure_says_what_the_bytes_look_like(data, format, compression, says):
    with pytest.raises(FormatError) as info:
        list(streamio.read_records(data, format, compression=compression))
    assert says in str(info.value)
    assert info.value.source == "<bytes>"


def test_no_hint_once_records_were_delivered_or_when_the_bytes_look_right():
    bad = bytearray(PLAIN)
    bad[-1] ^= 1  # last record's data CRC
    with pytest.raises(CorruptRecordError) as info:
        list(streamio.read_records(bytes(bad), "tfrecord"))
    assert "looks like" not in str(info.value)
    bad = bytearray(PLAIN)
    bad[14] ^= 1  # the first record's payload: still looks like TFRecord, nothing to suggest
    with pytest.raises(CorruptRecordError) as info:
        list(streamio.read_records(bytes(bad), "tfrecord"))
    assert "looks like" not in str(info.value) and info.value.record_index == 0


# --- faster inflaters give zlib's bytes (issue 14, item 3) ------------------------------------------

from streamio.codecs import _inflate  # noqa: E402
from streamio.errors import MissingDependencyError  # noqa: E402


def need_backend(name):
    """The inflate module, or a skip: optional for users; CI installs streamio[dev] (all of them)."""
    try:
        return _inflate.backend(name)
    except MissingDependencyError:
        pytest.skip(f"{name} is not installed")


def need_zstd():
    from streamio.codecs.zstd import zstd_module
    try:
        return zstd_module()
    except MissingDependencyError:
        pytest.skip("backports.zstd is not installed")


@pytest.mark.parametrize("name", ["isal", "zlib-ng"])
def test_fast_inflater_gives_zlibs_bytes_for_any_split(name):
    fast = need_backend(name)

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.integers(0, 10 ** 6), max_size=8), st.integers(0, 700),
           st.sampled_from(["gzip", "zlib"]), st.integers(0, 9))
    def check(cuts, padding, kind, level):
        compress = (lambda d: gzip.compress(d, level)) if kind == "gzip" else (
            lambda d: zlib.compress(d, level))
        data = compress(PLAIN[:7000]) + b"\0" * padding + compress(PLAIN[7000:])
        cuts = [c % (len(data) + 1) for c in cuts]
        want = decode_in_pieces(ZlibCodec(kind, source="s", backend=zlib), data, cuts)
        assert want == PLAIN
        assert decode_in_pieces(ZlibCodec(kind, source="s", backend=fast), data, cuts) == want

    check()


@pytest.mark.parametrize("name", ["isal", "zlib-ng", "zlib"])
def test_every_inflater_reads_gzip_cli_headers_and_reports_damage_alike(tmp_path, name):
    module = need_backend(name)
    src = tmp_path / "shard.tfrecord"
    src.write_bytes(PLAIN)
    if shutil.which("gzip"):  # a header with the file name and mtime in it (FNAME flag)
        subprocess.run(["gzip", "-k", str(src)], check=True)
        data = (tmp_path / "shard.tfrecord.gz").read_bytes()
    else:
        data = gzip.compress(PLAIN)
    assert decode_in_pieces(ZlibCodec("gzip", source="s", backend=module), data, [1, 2, 9]) == PLAIN
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(FormatError) as info:  # CorruptRecordError, or a CRC-level error
        decode_in_pieces(ZlibCodec("gzip", source="s", backend=module), bytes(bad), [])
    assert info.value.source == "s"
    for at in (-8, -2):  # the trailer's CRC-32 and ISIZE are checked by every backend
        bad = bytearray(data)
        bad[at] ^= 1
        with pytest.raises(CorruptRecordError):
            decode_in_pieces(ZlibCodec("gzip", source="s", backend=module), bytes(bad), [])


def test_the_fastest_installed_inflater_is_the_default():
    assert _inflate.available()[-1] == "zlib"
    first = _inflate.available()[0]
    assert _inflate.backend_name(_inflate.default_backend()) == first
    if "isal" in _inflate.available():
        assert first == "isal"  # the fastest, measured by benchmarks/inflate.py
    with pytest.raises(ValueError):
        _inflate.backend("lz4")


# --- zstd (issue 14, item 3) ---------------------------------------------------------------------------

zstd_cli = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


def write_zst(path, records):
    need_zstd()
    streamio.write_records(str(path), "tfrecord", records, compression="infer")
    return path


@zstd_cli
def test_zstd_written_by_streamio_reads_back_and_zstd_agrees(tmp_path):
    a = write_zst(tmp_path / "a.tfrecord.zst", RECORDS[:120])
    b = write_zst(tmp_path / "b.tfrecord.zst", RECORDS[120:])
    both = tmp_path / "ab.tfrecord.zst"  # cat a.zst b.zst: two frames
    both.write_bytes(a.read_bytes() + b.read_bytes())
    done = subprocess.run(["zstd", "-dc", str(both)], stdout=subprocess.PIPE, check=True)
    assert done.stdout == PLAIN  # the reference decoder reads our frames
    assert list(streamio.read_records(str(both), "tfrecord")) == RECORDS
    assert list(streamio.read_records(both.read_bytes(), "tfrecord", compression="zstd")) == RECORDS


@zstd_cli
def test_zstd_cli_output_from_a_fifo_sniffed_by_magic(tmp_path, fifo):
    need_zstd()
    src = tmp_path / "plain.tfrecord"
    src.write_bytes(PLAIN)
    one = subprocess.run(["zstd", "-c", "-19", str(src)], stdout=subprocess.PIPE, check=True).stdout
    assert one[:4] == b"\x28\xb5\x2f\xfd"
    path = fifo.make(one + one, 1, 5, 4099, name="zpipe")  # no suffix: sniffed from 28 b5 2f fd
    assert list(streamio.read_records(path, "tfrecord")) == RECORDS * 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 10 ** 6), max_size=6))
def test_zstd_frames_decode_the_same_for_any_split(cuts):
    from streamio.codecs.zstd import ZstdCodec

    zstd = need_zstd()
    data = zstd.compress(PLAIN[:3000]) + zstd.compress(PLAIN[3000:], 9)
    cuts = [c % (len(data) + 1) for c in cuts]
    assert decode_in_pieces(ZstdCodec(source="s"), data, cuts) == PLAIN
    assert zstd.decompress(data) == PLAIN  # the library's one-shot reader agrees


def test_zstd_damage_truncation_and_bombs():
    from streamio.codecs.deflate import MAX_PIECE
    from streamio.codecs.zstd import ZstdCodec

    zstd = need_zstd()
    data = zstd.compress(PLAIN)
    with pytest.raises(TruncatedStreamError):
        list(streamio.read_records(data[:-7], "tfrecord", compression="zstd"))
    with pytest.raises(CorruptRecordError, match="zstd stream"):
        list(streamio.read_records(data + b"junk-after-the-frame", "tfrecord", compression="zstd"))
    # 256 MiB of zeros in a few KiB: handed out in bounded pieces, never all at once.
    comp = zstd.ZstdCompressor()
    zeros = bytes(1 << 20)
    bomb = b"".join(comp.compress(zeros) for _ in range(256)) + comp.flush()
    assert len(bomb) < 64 * 1024
    codec = ZstdCodec(source="bomb")
    total = 0
    for piece in codec.decode(bomb):
        assert len(piece) <= MAX_PIECE
        total += len(piece)
    list(codec.finish())
    assert total == 256 << 20


def test_zstd_missing_says_which_pip_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "compression", None)
    monkeypatch.setitem(sys.modules, "backports.zstd", None)
    monkeypatch.setitem(sys.modules, "backports", None)
    with pytest.raises(MissingDependencyError, match=r"streamio\[zstd\]"):
        list(streamio.read_records(b"\x28\xb5\x2f\xfd" + bytes(20), "tfrecord"))


def test_hint_after_decompression_describes_the_records_only():
    # A gzip-compressed CSV read as TFRecord: the gzip part was right, the format was not.
    data = gzip.compress(b"a,b,c\n1,2,3\n" * 50)
    with pytest.raises(FormatError) as info:
        list(streamio.read_records(data, "tfrecord"))
    assert "looks like text: pass format='csv'" in str(info.value)
    assert "compress" not in str(info.value)


# --- many small members in one large chunk ---------------------------------------------------------
# A member's end makes the inflater copy the rest of its input; the codec feeds it INPUT_WINDOW
# bytes at a time so that copy stays bounded. These check the windows are seamless: members cut
# by a window boundary, padding across one, and offsets of garbage far into a chunk.

def _tiny_members(compress, count: int):
    parts = [bytes([i % 251]) * (i % 7) for i in range(count)]
    return b"".join(compress(p) for p in parts), b"".join(parts)


@pytest.mark.parametrize("name", ["zlib", "isal", "zlib-ng"])
@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_thousands_of_members_in_one_chunk_for_every_inflater(name, kind):
    from streamio.codecs.deflate import INPUT_WINDOW
    module = zlib if name == "zlib" else need_backend(name)
    compress = gzip.compress if kind == "gzip" else zlib.compress
    data, plain = _tiny_members(compress, 30000)
    assert len(data) > 3 * INPUT_WINDOW  # several windows, members cut at their boundaries
    codec = ZlibCodec(kind, source="s", backend=module)
    assert decode_in_pieces(codec, data, []) == plain
    at = len(data)
    with pytest.raises(CorruptRecordError) as info:
        decode_in_pieces(ZlibCodec(kind, source="s", backend=module), data + b"junk", [])
    assert f"compressed offset {at}" in str(info.value)
    assert info.value.offset == len(plain)


def test_zero_padding_between_members_across_a_window_boundary():
    from streamio.codecs.deflate import INPUT_WINDOW
    first = gzip.compress(PLAIN[:2000])
    filler = gzip.compress(b"x" * 10)
    count = (INPUT_WINDOW - 10) // len(filler) - len(first) // len(filler)
    head = first + filler * count
    data = head + b"\0" * (INPUT_WINDOW - len(head) + 30) + gzip.compress(PLAIN[2000:4000])
    assert len(head) < INPUT_WINDOW < len(head) + (INPUT_WINDOW - len(head) + 30)
    want = PLAIN[:2000] + b"x" * 10 * count + PLAIN[2000:4000]
    assert decode_in_pieces(ZlibCodec("gzip", source="s"), data, []) == want


def test_thousands_of_zstd_frames_in_one_chunk():
    zstd = need_zstd()
    from streamio.codecs.deflate import INPUT_WINDOW
    from streamio.codecs.zstd import ZstdCodec
    data, plain = _tiny_members(zstd.compress, 30000)
    assert len(data) > 3 * INPUT_WINDOW
    assert decode_in_pieces(ZstdCodec(source="s"), data, []) == plain
    with pytest.raises(CorruptRecordError):
        decode_in_pieces(ZstdCodec(source="s"), data + b"junk-junk-junk", [])


def test_a_first_chunk_whose_head_tells_is_handed_on_without_a_copy():
    """Plain data goes on as the very chunk the reader gave (a reader's first read of every
    stream was copied twice before); a compressed one goes to its codec whole; a first chunk
    too short to tell is held with what follows, and nothing is lost either way."""
    data = tfrecord_bytes([b"x" * 5000, b"y" * 3])
    chunk = memoryview(bytearray(data))
    codec = SniffingCodec(source="s", make=lambda kind: ZlibCodec(kind, source="s"))
    out = list(codec.decode(chunk))
    assert len(out) == 1 and out[0] is chunk and codec.kind is None
    packed = gzip.compress(data)
    codec = make_codec("infer", "pipe")
    assert b"".join(bytes(p) for p in codec.decode(memoryview(packed))) + b"".join(
        bytes(p) for p in codec.finish()) == data and codec.kind == "gzip"
    for cut in (1, 3, 100, 4095, 4096, 4097):
        codec = make_codec("infer", "pipe")
        assert decode_in_pieces(codec, packed, [cut]) == data and codec.kind == "gzip"
        codec = make_codec("infer", "pipe")
        assert decode_in_pieces(codec, data, [cut]) == data and codec.kind is None

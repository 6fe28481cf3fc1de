"""Byte-range splits (issue #12, part 2): N readers share one source, each reading about 1/N of
its bytes, and together they deliver every record exactly once.

Real parts: files on disk, a real HTTP server on 127.0.0.1 that honours Range, the real
`streamio index` command, a real DataLoader with worker processes.
"""

from __future__ import annotations

import gzip
import os
import pathlib
import random
import re
import struct
import subprocess
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import streamio
from streamio import Dataset, RecordReader, write_records
from streamio.errors import CorruptRecordError, StreamioWarning, UsageError
from streamio.formats.recordio import MAGIC_BYTES
from streamio.formats.tfrecord import CONFIRM_BYTES
from streamio.pipeline.ranges import plan_range, read_index
from streamio.reader import PAST_END_READ_SIZE
from streamio.sources.ranged import split_range

from hostile_http import HostileHTTPServer
from support.clean_workers import CONTEXT
from support.s3 import moto_endpoint, s3_client

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORMATS = [("tfrecord", {}), ("recordio", {}), ("recordio", {"multipart": "concat"}),
           ("lines", {})]
IDS = ["tfrecord", "recordio-dmlc", "recordio-concat", "lines"]


def _frame_overhead(fmt: str) -> int:
    return {"tfrecord": 16, "recordio": 8 + 3, "lines": 2}[fmt]


def _confirm(fmt: str) -> int:
    """Bytes a range reader reads past its end to confirm where the next range starts (a
    TFRecord chain: tfrecord.CONFIRM_BYTES, and the frame that crosses it)."""
    return CONFIRM_BYTES if fmt == "tfrecord" else 0


def _write(path, fmt: str, records: list, **extra) -> list:
    """Write ``records``; returns the records as they read back (lines: no line breaks)."""
    if fmt == "lines":
        records = [r.replace(b"\n", b"").replace(b"\r", b"") for r in records]
        pathlib.Path(path).write_bytes(b"".join(r + b"\n" for r in records))
        return records
    write_records(str(path), fmt, records, **extra)
    return records


def _payloads(rng: random.Random, n: int, max_len: int) -> list:
    out = []
    for i in range(n):
        body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, max_len)))
        if i % 7 == 3:  # RecordIO's magic inside a payload (dmlc splits it, concat keeps it)
            body = body[:4 * (len(body) // 8)] + MAGIC_BYTES + body[4 * (len(body) // 8):]
        out.append(body + b"#%d" % i)
    return out


def _read_split(path, fmt, n, **options):
    """Each of ``n`` readers' records and bytes read, reading the ranges split_range gives."""
    size = os.stat(path).st_size
    outs, read = [], []
    for i in range(n):
        start, end = split_range(size, ((n, i),))
        reader = RecordReader(str(path), fmt, byte_range=(start, end if end < size else None),
                              **options)
        outs.append(list(reader))
        read.append(reader.stats.bytes_read)
    return outs, read, size


# -- the reader: every record once, in order, about 1/N of the bytes each ---------------------
@pytest.mark.parametrize("fmt,extra", FORMATS, ids=IDS)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 8), count=st.integers(0, 60),
       read_size=st.sampled_from([7, 64, 1000, 1 << 20]))
def test_ranges_tile_the_records(tmp_path, fmt, extra, seed, n, count, read_size):
    rng = random.Random(seed)
    path = tmp_path / f"data.{fmt}"
    records = _write(path, fmt, _payloads(rng, count, 300), **extra)
    outs, read, size = _read_split(path, fmt, n, read_size=read_size, **extra)
    # Concatenated in range order they are the file's records in file order: each reader
    # delivered a contiguous run, none twice, none lost.
    assert [r for out in outs for r in out] == records
    biggest = max((len(r) for r in records), default=0) + _frame_overhead(fmt) + 8
    for i, got in enumerate(read):
        start, end = split_range(size, ((n, i),))
        assert got <= (end - start + biggest + _confirm(fmt) + biggest
                       + max(read_size, PAST_END_READ_SIZE) + 1)


@pytest.mark.parametrize("fmt,extra", FORMATS, ids=IDS)
@pytest.mark.parametrize("n", range(1, 9))
def test_shards_of_one_large_file_read_a_share_each(tmp_path, fmt, extra, n):
    rng = random.Random(n)
    path = tmp_path / f"big.{fmt}"
    records = _write(path, fmt, [rng.randbytes(rng.randint(100, 5000)) for _ in range(1500)],
                     **extra)
    biggest = max(len(r) for r in records) + _frame_overhead(fmt) + 8
    size = os.stat(path).st_size
    if extra.get("multipart") == "concat" and n > 1:
        # Split only with an index (a concat payload may be RecordIO data: issue #40, item 6).
        subprocess.run([sys.executable, "-m", "streamio", "index", str(path), "--format",
                        "recordio"], check=True, capture_output=True)
    outs = []
    for i in range(n):
        ds = Dataset(str(path), fmt, **extra).shard(n, i)
        with warnings.catch_warnings():
            warnings.simplefilter("error", StreamioWarning)  # no fallback to round-robin
            outs.append(list(ds))
        # bytes_read, an I/O count: this reader's share plus at most one record and one small
        # read past its end (round-robin would read `size` bytes here).
        assert ds.stats()["bytes"] <= (size / n + biggest + _confirm(fmt) + biggest
                                       + PAST_END_READ_SIZE + 1)
        assert ds.stats()["bytes"] >= size / n - biggest - 1 or n == 1
    assert [r for out in outs for r in out] == records


def test_reader_checks_its_byte_range(tmp_path):
    path = tmp_path / "a.tfrecord"
    write_records(str(path), "tfrecord", [b"x"])
    with pytest.raises(UsageError):
        RecordReader(str(path), "tfrecord", byte_range=(5, 2))
    with pytest.raises(TypeError):
        RecordReader(str(path), "tfrecord", byte_range=[0, 2])
    with pytest.raises(UsageError, match="compressed"):
        RecordReader(str(path) , "tfrecord", compression="gzip", byte_range=(0, 2))
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="byte range"):
        RecordReader(str(fifo), "tfrecord", byte_range=(0, 2))


# -- damage at a range boundary: reported (or skipped) exactly once ----------------------------
def _corrupt(data: bytearray, offset: int, fmt: str, where: str) -> None:
    if where == "header":  # TFRecord: the length CRC; RecordIO: the magic number
        data[offset + (8 if fmt == "tfrecord" else 0)] ^= 0xFF
    else:  # the payload (TFRecord's data CRC catches it)
        data[offset + 12 if fmt == "tfrecord" else offset + 8] ^= 0xFF


@pytest.mark.parametrize("fmt,where", [("tfrecord", "header"), ("tfrecord", "data"),
                                       ("recordio", "header")])
@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_damage_at_a_boundary_is_reported_once(tmp_path, fmt, where, policy):
    rng = random.Random(7)
    records = [rng.randbytes(rng.randint(50, 400)) for _ in range(60)]
    frames = [(streamio.formats.encode_tfrecord(r) if fmt == "tfrecord"
               else streamio.formats.encode_recordio(r)) for r in records]
    starts, at = [], 0
    for f in frames:
        starts.append(at)
        at += len(f)
    clean = b"".join(frames)
    n = 4
    boundaries = [split_range(len(clean), ((n, i),))[0] for i in range(1, n)]
    # Each record whose frame starts near a boundary, before and after it.
    victims = sorted({k for b in boundaries for k, s in enumerate(starts) if abs(s - b) < 900})
    assert len(victims) >= 6
    for k in victims:
        data = bytearray(clean)
        _corrupt(data, starts[k], fmt, where)
        path = tmp_path / f"v{k}.{fmt}"
        path.write_bytes(bytes(data))
        delivered, skipped, raised = [], 0, 0
        for i in range(n):
            start, end = split_range(len(data), ((n, i),))
            reader = RecordReader(str(path), fmt, on_error=policy,
                                  byte_range=(start, end if end < len(data) else None))
            try:
                delivered += list(reader)
            except CorruptRecordError:
                raised += 1
            skipped += reader.stats.skipped_records
        if policy == "skip":
            assert skipped == 1, (k, skipped)
            assert delivered == records[:k] + records[k + 1:], k
        else:
            assert raised == 1, (k, raised)
            assert set(delivered) <= set(records) and len(delivered) == len(set(delivered))


# -- HTTP: a Range request per reader -------------------------------------------------------
@pytest.mark.parametrize("n", [1, 3, 4])
def test_http_ranges(n):
    rng = random.Random(3)
    records = [rng.randbytes(rng.randint(100, 3000)) for _ in range(400)]
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in records)
    with HostileHTTPServer() as server:
        url = server.add("/big.tfrecord", data)
        outs = []
        for i in range(n):
            ds = Dataset(url, "tfrecord").shard(n, i)
            with warnings.catch_warnings():
                warnings.simplefilter("error", StreamioWarning)
                outs.append(list(ds))
            assert ds.stats()["bytes"] <= (len(data) / n + 3016 + CONFIRM_BYTES + 3016
                                       + PAST_END_READ_SIZE + 1)
        ranges = [h.get("Range") for _, h in server.requests if h.get("Range")]
    assert [r for out in outs for r in out] == records
    if n > 1:
        assert any(re.fullmatch(r"bytes=[1-9][0-9]*-", r) for r in ranges)


def test_http_server_without_ranges_still_gives_the_range():
    records = [b"r%d" % i * 50 for i in range(300)]
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in records)
    with HostileHTTPServer() as server:
        url = server.add("/x.tfrecord", data, ranges=False)
        got = []
        for i in range(3):
            got += list(Dataset(url, "tfrecord").shard(3, i))
    assert got == records


# -- index files --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["tfrecord", "recordio", "lines"])
def test_index_command_and_exact_splits(tmp_path, fmt):
    rng = random.Random(11)
    suffix = {"tfrecord": ".tfrecord", "recordio": ".rec", "lines": ".txt"}[fmt]
    path = tmp_path / ("data" + suffix)
    records = _write(path, fmt, _payloads(rng, 500, 2000))
    run = subprocess.run([sys.executable, "-m", "streamio", "index", str(path)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    index = run.stdout.strip()
    assert os.path.exists(index)
    starts = read_index(index)
    assert len(starts) == len(records)
    # The index's offsets are where the records start: reading from each gives that record.
    for k in (0, 1, len(records) // 2, len(records) - 1):
        end = starts[k + 1] if k + 1 < len(starts) else None
        assert list(RecordReader(str(path), fmt, byte_range=(starts[k], end))) == [records[k]]
    for n in (2, 5):
        outs = []
        for i in range(n):
            plan = plan_range(str(path), fmt, {}, ((n, i),))
            assert plan.exact and (plan.byte_range[0] in starts)
            outs.append(list(Dataset(str(path), fmt).shard(n, i)))
        assert [r for out in outs for r in out] == records


def test_mxnet_idx_and_dali_index_are_read(tmp_path):
    records = [b"a" * 10, b"b" * 30, b"c" * 5]
    rec = tmp_path / "train.rec"
    write_records(str(rec), "recordio", records)
    # MXNet (im2rec): the lines in file order, the keys (image ids) in any order.
    (tmp_path / "train.idx").write_text("7\t0\n3\t20\n5\t60\n")
    assert plan_range(str(rec), "recordio", {}, ((2, 1),)).byte_range == (60, None)
    assert plan_range(str(rec), "recordio", {}, ((2, 1),)).exact
    assert read_index(str(tmp_path / "train.idx")) == [0, 20, 60]
    (tmp_path / "x.index").write_text("0 26\n26 46\n")
    assert read_index(str(tmp_path / "x.index")) == [0, 26]
    (tmp_path / "bad.index").write_text("0 26\nnope\n")
    with pytest.raises(streamio.errors.FormatError, match="line 2"):
        read_index(str(tmp_path / "bad.index"))


def test_a_broken_index_falls_back_to_resync(tmp_path):
    path = tmp_path / "d.tfrecord"
    records = [b"%d" % i * 40 for i in range(200)]
    write_records(str(path), "tfrecord", records)
    (tmp_path / "d.tfrecord.index").write_text("garbage\n")
    with pytest.warns(StreamioWarning, match="ignoring the index"):
        first = list(Dataset(str(path), "tfrecord").shard(2, 0))
    second = list(Dataset(str(path), "tfrecord").shard(2, 1))
    assert first + second == records


# -- what cannot be split: round-robin, said once ---------------------------------------------
def test_gzip_falls_back_to_round_robin_with_a_warning(tmp_path):
    records = [b"%d" % i * 20 for i in range(300)]
    plain = b"".join(streamio.formats.encode_tfrecord(r) for r in records)
    for name in ("d.tfrecord.gz", "d-without-suffix"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(plain))
        got = []
        with pytest.warns(StreamioWarning, match="compressed.*round-robin"):
            got += list(Dataset(str(path), "tfrecord").shard(3, 0))
        with warnings.catch_warnings():
            warnings.simplefilter("error", StreamioWarning)  # said once, not per reader
            for i in (1, 2):
                ds = Dataset(str(path), "tfrecord").shard(3, i)
                got += list(ds)
                assert ds.stats()["bytes"] == path.stat().st_size  # every reader reads it all
        assert sorted(got) == sorted(records)


def test_csv_needs_the_users_word(tmp_path):
    path = tmp_path / "t.csv"
    rows = [b"%d,%s" % (i, b"v" * (i % 13)) for i in range(2000)]
    path.write_bytes(b"".join(r + b"\n" for r in rows))
    with pytest.warns(StreamioWarning, match="quoted line break.*round-robin"):
        list(Dataset(str(path), "csv").shard(2, 0))
    outs = []
    for i in range(4):
        ds = Dataset(str(path), "csv", csv_quoted_newlines=False).shard(4, i)
        with warnings.catch_warnings():
            warnings.simplefilter("error", StreamioWarning)
            outs.append(list(ds))
        assert ds.stats()["bytes"] <= path.stat().st_size / 4 + PAST_END_READ_SIZE + 100
    assert [r for out in outs for r in out] == rows


def test_csv_header_reaches_every_range(tmp_path):
    path = tmp_path / "h.csv"
    rows = [b"%d,%d" % (i, 2 * i) for i in range(3000)]
    path.write_bytes(b"a,b\n" + b"".join(r + b"\n" for r in rows))
    decoder = streamio.Csv(header=True, as_columns=True)
    total = 0
    for i in range(3):
        ds = Dataset(str(path), "csv", decoder=decoder, csv_quoted_newlines=False).shard(3, i)
        for batch in ds.batch(100):
            total += len(batch["a"])
    assert total == len(rows)


def test_single_streams_stay_round_robin(tmp_path):
    path = tmp_path / "x.tfrecord"
    write_records(str(path), "tfrecord", [b"a", b"b", b"c"])
    with open(path, "rb") as f:
        assert plan_range(f, "tfrecord", {}, ((2, 0),)) is None
    assert plan_range("-", "tfrecord", {}, ((2, 0),)) is None


# -- DataLoader workers split one file by range -----------------------------------------------
def test_dataloader_workers_split_one_file_by_range(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "one.tfrecord"
    records = [b"%06d" % i + b"x" * 500 for i in range(2000)]
    write_records(str(path), "tfrecord", records)
    ds = Dataset(str(path), "tfrecord")
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                                         multiprocessing_context=CONTEXT)
    got = [bytes(r) if not isinstance(r, bytes) else r for r in loader]
    assert sorted(got) == sorted(records)
    # Both workers together read the file about once (round-robin would read it twice), plus
    # the confirmation window past the boundary.
    assert ds.stats()["bytes"] <= (path.stat().st_size + CONFIRM_BYTES
                                   + 2 * (PAST_END_READ_SIZE + 600))


# -- the one place that positions a source ------------------------------------------------------
def test_only_sources_ranged_positions_a_source():
    pattern = re.compile(r"\bos\.(pread|preadv|lseek)\(")
    users = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "streamio").rglob("*.py")
                   if pattern.search(p.read_text()))
    # The other users read no source: the benchmark's FIFO writer feeds raw file bytes, and the
    # cache reads back the files it wrote itself (checked block by block).
    assert users == [os.path.join("streamio", "bench", "measure.py"),
                     os.path.join("streamio", "pipeline", "cache", "__init__.py"),
                     os.path.join("streamio", "sources", "ranged.py")]


# -- a chance header inside a payload is not taken for a record start --------------------------
def test_a_sound_looking_header_inside_a_payload_is_not_a_record_start(tmp_path):
    from streamio.formats.tfrecord import masked_crc32c

    length = struct.pack("<Q", 20)
    fake = length + struct.pack("<I", masked_crc32c(length)) + b"\x01" * 40  # wrong data CRC
    records = [b"a" * 100, b"b" * 50 + fake + b"c" * 50, b"d" * 100, b"e" * 10]
    path = tmp_path / "fake.tfrecord"
    write_records(str(path), "tfrecord", records)
    at = path.read_bytes().index(fake)
    for start in (at - 3, at):  # a range that starts just before, or right at, the fake header
        first = list(RecordReader(str(path), "tfrecord", byte_range=(0, start)))
        second = list(RecordReader(str(path), "tfrecord", byte_range=(start, None)))
        assert first == records[:2] and second == records[2:]


def test_recordio_concat_payload_holding_a_frame_header(tmp_path):
    fake = MAGIC_BYTES + struct.pack("<I", 8) + b"\x02" * 16  # aligned magic, cflag 0, len 8
    records = [b"a" * 100, b"b" * 48 + fake + b"c" * 48, b"d" * 100]
    path = tmp_path / "fake.rec"
    write_records(str(path), "recordio", records, multipart="concat")
    at = path.read_bytes().index(fake)
    assert at % 4 == 0
    first = list(RecordReader(str(path), "recordio", multipart="concat", byte_range=(0, at)))
    second = list(RecordReader(str(path), "recordio", multipart="concat", byte_range=(at, None)))
    assert first == records[:2] and second == records[2:]


# -- S3 through smart_open (a real S3-protocol server on 127.0.0.1: moto's server mode) --------
@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_endpoint() as url:
        yield url


def test_s3_object_split_by_range(s3_endpoint, monkeypatch):
    pytest.importorskip("smart_open")
    client = s3_client(s3_endpoint, monkeypatch, "ranges")
    rng = random.Random(5)
    records = [rng.randbytes(rng.randint(100, 3000)) for _ in range(600)]
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in records)
    client.put_object(Bucket="ranges", Key="big.tfrecord", Body=data)
    outs = []
    for i in range(3):
        ds = Dataset("s3://ranges/big.tfrecord", "tfrecord").shard(3, i)
        with warnings.catch_warnings():
            warnings.simplefilter("error", StreamioWarning)
            outs.append(list(ds))
        assert ds.stats()["bytes"] <= (len(data) / 3 + 3016 + CONFIRM_BYTES + 3016
                                       + PAST_END_READ_SIZE + 1)
    assert [r for out in outs for r in out] == records


def test_http_range_reader_resumes_a_dropped_connection():
    rng = random.Random(9)
    records = [rng.randbytes(rng.randint(100, 2000)) for _ in range(300)]
    frames = [streamio.formats.encode_tfrecord(r) for r in records]
    data = b"".join(frames)
    start, end = len(data) // 3, 2 * len(data) // 3
    offsets = [sum(len(f) for f in frames[:k]) for k in range(len(frames))]
    expected = [r for r, at in zip(records, offsets) if start <= at < end]
    with HostileHTTPServer() as server:
        url = server.add("/drop.tfrecord", data, drop_after=[7000, 5000])
        got = list(RecordReader(url, "tfrecord", byte_range=(start, end)))
        asked = [h.get("Range") for _, h in server.requests]
    assert got == expected
    # The first request asked for the range's start; each resume went on where the last broke.
    assert asked[0] == f"bytes={start}-"
    assert len(asked) == 3 and all(r and int(r[6:-1]) > start for r in asked[1:])


@pytest.mark.parametrize("fmt", ["tfrecord", "recordio"])
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 8), flips=st.integers(1, 3))
def test_damage_anywhere_ranges_deliver_what_one_reader_delivers(tmp_path, fmt, seed, n, flips):
    """Bit flips anywhere, on_error="skip": the ranges together deliver exactly the records one
    reader of the whole file delivers, in the same order (none twice, none lost at a cut)."""
    rng = random.Random(seed)
    encode = (streamio.formats.encode_tfrecord if fmt == "tfrecord"
              else streamio.formats.encode_recordio)
    records = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 40))]
    data = bytearray(b"".join(encode(r) for r in records))
    for _ in range(flips):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path = tmp_path / f"damaged.{fmt}"
    path.write_bytes(bytes(data))
    # One framer fed the file cut where the ranges meet: RecordIO's answer to a length damaged
    # so that its frame swallows the next header depends on whether the bytes after the frame
    # have arrived (a frame that ends where the bytes end is taken at once, by design), and a
    # range reader's reads end at its range's end.
    framer = streamio.formats.make_framer(fmt, source="whole", on_error="skip")
    whole, at = [], 0
    for i in range(1, n + 1):
        cut = split_range(len(data), ((n, i),))[0] if i < n else len(data)
        whole += framer.feed(bytes(data[at:cut]))
        at = cut
    whole += framer.finish()
    outs, _, _ = _read_split(path, fmt, n, on_error="skip")
    assert [r for out in outs for r in out] == whole


def test_index_command_refuses_damage_and_unknown_names(tmp_path):
    path = tmp_path / "d.tfrecord"
    write_records(str(path), "tfrecord", [b"a" * 100, b"b" * 100, b"c" * 100])
    data = bytearray(path.read_bytes())
    data[116 + 9] ^= 0x40  # the second frame's length CRC
    path.write_bytes(bytes(data))
    run = subprocess.run([sys.executable, "-m", "streamio", "index", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "byte offset 116" in run.stderr
    assert not os.path.exists(str(path) + ".index")  # no half index left behind
    other = tmp_path / "data.bin"
    other.write_bytes(b"")
    run = subprocess.run([sys.executable, "-m", "streamio", "index", str(other)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "--format" in run.stderr

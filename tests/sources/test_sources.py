"""Reading files written by TensorFlow through every kind of source, with real pipes and servers."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
import time

import pytest

import streamio
from streamio.errors import SourceError, TruncatedStreamError, UsageError
from streamio.sources import HttpSource, PipeChannel
from streamio.sources.local import FileSource

from conftest import FIXTURES
from fixtures.make_fixtures import payloads

EXPECTED = payloads()
TF_FILES = {  # name -> compression argument that must read it back exactly
    "plain.tfrecord": "infer",
    "gzip.tfrecord.gz": "infer",
    "zlib.tfrecord.zz": "infer",
    "gzip_noext.tfrecord": "gzip",
}


def tf_file(name: str) -> str:
    return str(FIXTURES / "tf" / name)


@pytest.mark.parametrize("name", sorted(TF_FILES))
def test_tensorflow_written_files_from_a_path(name):
    records = list(streamio.read_records(tf_file(name), "tfrecord", compression=TF_FILES[name]))
    assert records == EXPECTED


@pytest.mark.parametrize("name", sorted(TF_FILES))
def test_tensorflow_written_files_from_a_fifo_fed_in_odd_pieces(fifo, name):
    path = fifo.make(open(tf_file(name), "rb").read(), 1, 7, 4093, 65537, 3)
    compression = "gzip" if "gzip" in name else "zlib" if "zlib" in name else None
    reader = streamio.RecordReader(path, "tfrecord", compression=compression, read_size=65536)
    assert list(reader) == EXPECTED
    assert reader.stats.records == len(EXPECTED)


def test_fifo_pipe_buffer_is_enlarged(tmp_path):
    path = str(tmp_path / "p")
    os.mkfifo(path)
    source = FileSource(path)  # opening a FIFO never blocks, even with no writer yet
    try:
        assert source.is_fifo
        assert source.pipe_size is not None and source.pipe_size > 65536
    finally:
        source.close()


def test_stdin():
    code = ("import streamio, sys; n = sum(1 for _ in streamio.read_records('-', 'tfrecord',"
            " compression='gzip')); print(n)")
    with open(tf_file("gzip.tfrecord.gz"), "rb") as f:
        out = subprocess.run([sys.executable, "-c", code], stdin=f, capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(EXPECTED)


def test_non_seekable_file_object_and_bytes():
    data = open(tf_file("zlib.tfrecord.zz"), "rb").read()
    r, w = os.pipe()

    def writer():
        with os.fdopen(w, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=writer)
    thread.start()
    with os.fdopen(r, "rb") as f:  # a pipe: seek() and tell() fail on it
        assert list(streamio.read_records(f, "tfrecord", compression="zlib")) == EXPECTED
        with pytest.raises(UsageError, match="earlier pass"):
            list(streamio.read_records(f, "tfrecord", compression="zlib"))
    thread.join()
    assert list(streamio.read_records(data, "tfrecord", compression="zlib")) == EXPECTED


def test_a_list_of_sources_is_read_in_order():
    out = list(streamio.read_records([tf_file("plain.tfrecord"), tf_file("gzip.tfrecord.gz")],
                                     "tfrecord"))
    assert out == EXPECTED + EXPECTED


def test_truncated_gzip_names_the_source():
    data = open(tf_file("gzip.tfrecord.gz"), "rb").read()
    with pytest.raises(TruncatedStreamError) as info:
        list(streamio.read_records(data[:-20], "tfrecord", compression="gzip"))
    assert info.value.source == "<bytes>"


def test_missing_file_is_a_source_error():
    with pytest.raises(SourceError, match="cannot open") as info:
        list(streamio.read_records("/nonexistent/x.tfrecord", "tfrecord"))
    assert isinstance(info.value.__cause__, OSError)


def test_arguments_are_checked_before_reading():
    with pytest.raises(ValueError):
        streamio.read_records("/nonexistent", "tfrecord", compression="bz2")
    with pytest.raises(TypeError):
        streamio.read_records("/nonexistent", "tfrecord", bogus_option=1)
    with pytest.raises(TypeError):
        streamio.read_records(12345, "tfrecord")


# -- HTTP ---------------------------------------------------------------------------------------
def _http(url, **kw):
    return HttpSource(url, backoff=0.01, **kw)


def test_http_resumes_after_several_drops(http_server):
    data = open(tf_file("plain.tfrecord"), "rb").read()
    url = http_server.put("/data.tfrecord", data, drops=[1000, 5000, 17, 40000])
    source = _http(url)
    assert list(streamio.read_records(source, "tfrecord")) == EXPECTED
    assert source.retries == 4
    resumed = [h for p, h in http_server.requests if "Range" in h]
    assert [h["Range"] for h in resumed][0] == "bytes=1000-"
    assert all(h["If-Range"].startswith('"') for h in resumed)


def test_http_gzip_object_through_open_source(http_server):
    url = http_server.put("/d.tfrecord.gz", open(tf_file("gzip.tfrecord.gz"), "rb").read())
    assert list(streamio.read_records(url, "tfrecord")) == EXPECTED


def test_http_gives_up_after_bounded_retries(http_server):
    data = open(tf_file("plain.tfrecord"), "rb").read()
    url = http_server.put("/flaky", data, drops=[10, 0, 0, 0])
    with pytest.raises(SourceError, match="gave up after 2 retries") as info:
        list(streamio.read_records(_http(url, max_retries=2), "tfrecord"))
    assert "at byte 10 of" in str(info.value)


def test_http_refuses_to_mix_two_versions(http_server):
    data = open(tf_file("plain.tfrecord"), "rb").read()
    url = http_server.put("/v", data, drops=[3000], replace_after_first=data[::-1])
    with pytest.raises(SourceError, match="instead of 206"):
        list(streamio.read_records(_http(url), "tfrecord"))


def test_http_status_errors(http_server):
    url = http_server.put("/present", b"")
    with pytest.raises(SourceError, match="HTTP 404"):
        list(streamio.read_records(url.replace("present", "absent"), "tfrecord"))


def test_http_server_without_ranges_resumes_by_skipping_the_same_object(http_server):
    # The server answers 200 (whole object) to the Range request; its strong ETag is unchanged,
    # so the bytes already delivered are the same: skip them, deliver the rest once.
    # (Issue 10: this used to be a SourceError "cannot resume at byte 2000".)
    data = open(tf_file("plain.tfrecord"), "rb").read()
    url = http_server.put("/noranges", data, drops=[2000], ranges=False)
    source = _http(url)
    assert list(streamio.read_records(source, "tfrecord")) == EXPECTED
    assert source.retries == 1


# -- PipeChannel (SageMaker Pipe mode) ------------------------------------------------------------
def test_pipe_channel_reads_one_fifo_per_epoch(fifo, tmp_path):
    prefix = str(tmp_path / "train")
    first = gzip.decompress(open(tf_file("gzip.tfrecord.gz"), "rb").read())
    second = streamio.formats.encode_tfrecord(b"epoch one")
    for epoch, data in enumerate([first, second]):
        os.mkfifo(f"{prefix}_{epoch}")
        (tmp_path / f"e{epoch}").write_bytes(data)
        fifo.start(f"{prefix}_{epoch}", str(tmp_path / f"e{epoch}"), 999)
    channel = PipeChannel(prefix, open_timeout=20, read_timeout=20)
    assert list(streamio.read_records(channel, "tfrecord")) == EXPECTED
    assert list(streamio.read_records(channel, "tfrecord")) == [b"epoch one"]
    assert channel.epoch == 2


def test_pipe_channel_waits_for_the_fifo_to_appear(fifo, tmp_path):
    prefix = str(tmp_path / "late")
    (tmp_path / "src").write_bytes(streamio.formats.encode_tfrecord(b"x"))

    def create_later():
        time.sleep(0.3)
        os.mkfifo(f"{prefix}_0")
        fifo.start(f"{prefix}_0", str(tmp_path / "src"))

    thread = threading.Thread(target=create_later)
    thread.start()
    assert list(streamio.read_records(PipeChannel(prefix, open_timeout=20), "tfrecord")) == [b"x"]
    thread.join()


def test_pipe_channel_open_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(SourceError, match="did not appear within 0.2 s"):
        list(streamio.read_records(PipeChannel(str(tmp_path / "never"), open_timeout=0.2),
                                   "tfrecord"))
    assert time.monotonic() - start < 5


def test_silent_writer_ends_in_a_source_error_not_a_hang(fifo, tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(b"r%d" % i) for i in range(100))
    prefix = str(tmp_path / "stall")
    os.mkfifo(prefix + "_0")
    (tmp_path / "s").write_bytes(data)
    fifo.start(prefix + "_0", str(tmp_path / "s"), 10_000, stall_after=500, stall=3)
    got = []
    with pytest.raises(SourceError, match="went silent for 0.5 s"):
        for record in streamio.read_records(PipeChannel(prefix, read_timeout=0.5,
                                                        open_timeout=10), "tfrecord"):
            got.append(record)
    assert got == [b"r%d" % i for i in range(len(got))] and len(got) == 500 // 19  # every whole record before the stall


def test_leaving_early_closes_the_fifo(fifo, tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(os.urandom(1000)) for _ in range(5000))
    path = fifo.make(data, 65536)
    before = len(os.listdir("/proc/self/fd"))
    records = streamio.read_records(path, "tfrecord")
    next(records)
    records.close()
    assert len(os.listdir("/proc/self/fd")) == before

"""Plain FIFO paths, stdin and PipeChannels never wait without bound when a timeout is given.

Real ``os.mkfifo`` pipes; writers are other processes (tests/scripts/fifo_writer.py) that connect
late, write slowly, or never come.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

import streamio
from streamio.errors import SourceError, UsageError
from streamio.formats import encode_tfrecord
from streamio.sources import PipeChannel
from hang_guard import bounded

RECORDS = [b"r%03d" % i for i in range(200)]
DATA = b"".join(encode_tfrecord(r) for r in RECORDS)


def _unblock(path):
    """Open the FIFO for writing and close it: a reader stuck waiting for a writer wakes (EOF)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.fixture
def lonely_fifo(tmp_path):
    path = str(tmp_path / "nobody_writes")
    os.mkfifo(path)
    yield path
    _unblock(path)


# -- no writer ever comes ------------------------------------------------------------------------
def test_open_timeout_on_a_fifo_with_no_writer(lonely_fifo):
    with pytest.raises(SourceError, match="no writer connected and sent data for 1 s") as info:
        bounded(lambda: list(streamio.read_records(lonely_fifo, "tfrecord", open_timeout=1)))
    assert lonely_fifo in str(info.value)


def test_read_timeout_alone_also_bounds_the_wait_for_a_writer(lonely_fifo):
    with pytest.raises(SourceError, match="no writer"):
        bounded(lambda: list(streamio.read_records(lonely_fifo, "tfrecord", read_timeout=1)))


def test_dataset_second_epoch_without_a_writer_raises(fifo):
    path = fifo.make(DATA, 4093)
    ds = streamio.Dataset(path, "tfrecord", open_timeout=1)
    assert bounded(lambda: list(ds)) == RECORDS  # epoch 0: the writer is there
    with pytest.raises(SourceError, match="no writer"):
        bounded(lambda: list(ds))  # nobody writes epoch 1
    # The issue's own case: read_timeout alone bounds that wait too.
    with pytest.raises(SourceError, match="no writer"):
        bounded(lambda: list(streamio.Dataset(path, "tfrecord", read_timeout=1)))


# -- writers that are late, slow, or silent ---------------------------------------------------
def test_a_late_writer_within_open_timeout_is_waited_for(fifo):
    path = fifo.make(DATA, 999, delay_first=0.5)
    assert bounded(lambda: list(streamio.read_records(path, "tfrecord", open_timeout=20,
                                                      read_timeout=20))) == RECORDS


def test_a_writer_that_goes_silent_ends_in_a_source_error(fifo):
    path = fifo.make(DATA, 50, stall_after=500, stall=5)
    got = []

    def consume():
        for record in streamio.read_records(path, "tfrecord", read_timeout=0.5, open_timeout=20):
            got.append(record)

    with pytest.raises(SourceError, match="went silent for 0.5 s"):
        bounded(consume)
    assert got == RECORDS[:25]  # every whole 20-byte record before the stall at byte 500


def test_a_slow_writer_within_read_timeout_is_fine(fifo):
    path = fifo.make(DATA, 700, stall_after=1400, stall=0.3)
    assert bounded(lambda: list(streamio.read_records(path, "tfrecord", read_timeout=10))) \
        == RECORDS


def test_a_writer_that_closes_without_writing_is_an_empty_stream(fifo):
    path = fifo.make(b"")
    assert bounded(lambda: list(streamio.read_records(path, "tfrecord", open_timeout=20))) == []


def test_pipe_channel_takes_a_readers_timeouts(fifo, tmp_path):
    prefix = str(tmp_path / "ch")
    os.mkfifo(prefix + "_0")
    (tmp_path / "s").write_bytes(DATA)
    fifo.start(prefix + "_0", str(tmp_path / "s"), 50, stall_after=500, stall=5)
    channel = PipeChannel(prefix)  # default read_timeout: 120 s; the reader's 0.5 s wins
    with pytest.raises(SourceError, match="went silent for 0.5 s"):
        bounded(lambda: list(streamio.read_records(channel, "tfrecord", read_timeout=0.5)))
    with pytest.raises(SourceError, match="did not appear within 0.3 s"):
        bounded(lambda: list(streamio.read_records(channel, "tfrecord", open_timeout=0.3)))


# -- where a timeout cannot apply, say so ------------------------------------------------------
def test_timeouts_on_a_file_object_are_refused_naming_option_and_kind():
    with pytest.raises(UsageError, match=r"read_timeout cannot apply to .*file object"):
        streamio.read_records(io.BytesIO(DATA), "tfrecord", read_timeout=1)
    with pytest.raises(UsageError, match=r"open_timeout cannot apply to s3://b/k.*smart_open"):
        streamio.read_records("s3://b/k", "tfrecord", open_timeout=1)


def test_timeouts_are_accepted_where_nothing_waits(tmp_path):
    path = tmp_path / "f.tfrecord"
    path.write_bytes(DATA)
    assert list(streamio.read_records(str(path), "tfrecord", open_timeout=1,
                                      read_timeout=1)) == RECORDS
    assert list(streamio.read_records(DATA, "tfrecord", read_timeout=1)) == RECORDS


def test_an_unknown_option_is_named_as_such():
    with pytest.raises(TypeError, match=r"unknown keyword argument open_timout=; did you mean"
                       r" open_timeout=\?") as info:
        streamio.read_records("x", "tfrecord", open_timout=1)
    assert "format 'tfrecord' takes no" not in str(info.value)  # not blamed on the format


# -- stdin and the CLI ---------------------------------------------------------------------------
def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "streamio", *args], capture_output=True,
                          text=True, timeout=60, **kw)


def test_cli_timeout_on_a_fifo_with_no_writer(lonely_fifo):
    proc = _cli("count", lonely_fifo, "--format", "tfrecord", "--timeout", "1")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "no writer" in proc.stderr and lonely_fifo in proc.stderr


def test_cli_timeout_on_stdin_whose_writer_is_silent():
    # stdin is a pipe whose writer (this test) holds it open and writes nothing.
    proc = subprocess.Popen([sys.executable, "-m", "streamio", "count", "-", "--format",
                             "tfrecord", "--timeout", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.wait(timeout=60)  # stdin stays open (communicate() would close it: EOF)
        err = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
    assert proc.returncode == 1 and "no writer" in err and "Traceback" not in err


def test_cli_timeout_on_stdin_with_data():
    proc = subprocess.run([sys.executable, "-m", "streamio", "count", "-", "--format",
                           "tfrecord", "--timeout", "5"], input=DATA, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.decode().strip() == str(len(RECORDS))

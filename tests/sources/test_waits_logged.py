"""A wait of more than a few seconds on a source says what it waits for (logger ``streamio``):
a FIFO no writer has opened (``Dataset``, ``streamio count``), stdin with nothing written, a
``PipeChannel`` epoch whose FIFO never appears. Each logs after ``WAIT_LOG_AFTER_S`` (shortened
here) and again every ``WAIT_LOG_INTERVAL_S`` (``streamio._util.WaitLog``, the one policy of
every wait), naming the path, how long, and what would end it.

Real ``os.mkfifo`` pipes; writers are other processes (tests/scripts/fifo_writer.py).
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time

import pytest

import streamio
from streamio.errors import SourceError
from streamio.formats import encode_tfrecord
from streamio.sources import PipeChannel
from streamio import _util
from hang_guard import bounded

RECORDS = [b"r%03d" % i for i in range(50)]
DATA = b"".join(encode_tfrecord(r) for r in RECORDS)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def quick_log(monkeypatch, caplog):
    monkeypatch.setattr(_util, "WAIT_LOG_AFTER_S", 0.3)
    monkeypatch.setattr(_util, "WAIT_LOG_INTERVAL_S", 0.4)
    caplog.set_level(logging.WARNING, logger="streamio")
    return caplog


def _messages(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "streamio"]


@pytest.fixture
def lonely_fifo(tmp_path):
    path = str(tmp_path / "nobody_writes")
    os.mkfifo(path)
    yield path
    try:  # a reader still waiting wakes (EOF)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_with_no_writer_logs_what_it_waits_for_then_times_out(quick_log, lonely_fifo):
    ds = streamio.Dataset(lonely_fifo, "tfrecord", open_timeout=1.5)
    with pytest.raises(SourceError, match="no writer connected"):
        bounded(lambda: list(ds))
    logs = _messages(quick_log)
    assert len(logs) >= 2, logs  # after WAIT_LOG_AFTER_S, and again periodically
    assert all(m.startswith(f"{lonely_fifo}: waiting for its first data: no writer has opened"
                            " it yet") for m in logs), logs
    assert "open_timeout=1.5 s ends it" in logs[0]


def test_the_default_wait_goes_on_and_says_how_to_bound_it(quick_log, fifo):
    path = fifo.make(DATA, 4093, delay_first=2.0)  # a writer that opens the FIFO 2 s late
    ds = streamio.Dataset(path, "tfrecord")  # no timeout: waits as long as it takes
    assert bounded(lambda: list(ds)) == RECORDS
    logs = _messages(quick_log)
    assert len(logs) >= 2, logs
    assert "no writer has opened it yet" in logs[0]
    assert "nothing ends it (no open_timeout): pass open_timeout= (--open-timeout)" in logs[0]
    assert logs[0].startswith(path)


def test_a_silent_writer_logs_the_read_wait(quick_log, fifo):
    path = fifo.make(DATA, 4093, stall_after=100, stall=1.5)  # writes, then goes silent
    assert bounded(lambda: list(streamio.Dataset(path, "tfrecord", read_timeout=30))) == RECORDS
    # (the writer's process may start late enough for the wait for its first data to log too)
    logs = [m for m in _messages(quick_log) if "waiting for more data" in m]
    assert logs and "the writer has sent nothing since its last data" in logs[0], logs
    assert "read_timeout=30 s ends it" in logs[0]


def test_a_pipe_channel_logs_the_epoch_it_waits_for(quick_log, tmp_path):
    channel = PipeChannel(str(tmp_path / "train"), open_timeout=1.5)
    with pytest.raises(SourceError, match="did not appear"):
        bounded(lambda: list(streamio.Dataset(channel, "tfrecord")))
    logs = _messages(quick_log)
    assert len(logs) >= 2, logs
    assert logs[0].startswith(f"{tmp_path / 'train'}_0: waiting for the FIFO of epoch 0 to"
                              " appear"), logs
    assert "open_timeout=1.5 s ends it" in logs[0]


def test_streamio_count_on_a_fifo_with_no_writer_says_what_it_waits_for(lonely_fifo):
    code = ("import sys; from streamio import _util; _util.WAIT_LOG_AFTER_S = 0.3;"
            " from streamio.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "count", "--format", "tfrecord",
                           "--open-timeout", "2", lonely_fifo], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"streamio: {lonely_fifo}: waiting for its first data: no writer"
                            " has opened it yet"), done.stderr
    assert "open_timeout=2 s ends it" in first
    assert "no writer connected and sent data for 2 s" in done.stderr


def test_stdin_with_nothing_written_logs_too():
    code = ("import sys; from streamio import _util; _util.WAIT_LOG_AFTER_S = 0.3;"
            " from streamio.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "count", "--format", "tfrecord", "-"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT})
    try:
        # Before anything is written to stdin (bounded: nothing was logged before).
        assert select.select([proc.stderr], [], [], 30)[0], "nothing logged in 30 s"
        line = proc.stderr.readline().decode()
        assert line.startswith("streamio: <stdin>: waiting for its first data"), line
        assert "pass open_timeout= (--open-timeout)" in line
        proc.stdin.write(DATA)
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read().decode().strip() == str(len(RECORDS))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_every_wait_logs_alike_and_a_new_wait_starts_the_count_again(caplog):
    """One policy for every wait (streamio._util.WaitLog): silent for WAIT_LOG_AFTER_S, then a
    WARNING and another every WAIT_LOG_INTERVAL_S; a wait that ends and comes back (a reader's
    next block) is a new wait, not logged until it too has lasted WAIT_LOG_AFTER_S."""
    caplog.set_level(logging.DEBUG, logger="streamio")
    after, every = _util.WAIT_LOG_AFTER_S, _util.WAIT_LOG_INTERVAL_S
    wait = _util.WaitLog(lambda waited: f"waits for the thing, for {waited:.0f} s so far",
                         waiting=False)
    for now in (100.0, 100.0 + after - 0.1):
        wait.tick(now)
    assert _messages(caplog) == []
    for now in (100.0 + after, 100.0 + after + every - 0.1, 100.0 + after + every):
        wait.tick(now)
    assert _messages(caplog) == [f"waits for the thing, for {after:.0f} s so far",
                                 f"waits for the thing, for {after + every:.0f} s so far"]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
    wait.end()
    wait.tick(500.0)
    wait.tick(500.0 + after - 0.1)
    assert len(_messages(caplog)) == 2
    wait.tick(500.0 + after)
    assert _messages(caplog)[-1] == f"waits for the thing, for {after:.0f} s so far"

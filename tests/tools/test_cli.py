"""The command line, run as a user would: in a subprocess."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import numpy as np
import pytest

import streamio
from streamio import cli

from conftest import FIXTURES, SCRIPTS, peer


def run(*args, stdin=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "streamio", *args], capture_output=True,
                          text=True, stdin=stdin, timeout=timeout)


def test_count_and_head():
    out = run("count", str(FIXTURES / "tf" / "gzip.tfrecord.gz"), "--format", "tfrecord")
    assert out.returncode == 0 and out.stdout.strip() == "64"
    out = run("head", peer("sagemaker-tensorflow-extensions/100.tfrecords"), "-f", "tfrecord",
              "-n", "2")
    assert out.stdout.splitlines() == ["0\t13 bytes\t'hello world 0'", "1\t13 bytes\t'hello world 1'"]


def test_count_from_stdin_with_explicit_compression():
    with open(FIXTURES / "tf" / "gzip_noext.tfrecord", "rb") as f:
        out = run("count", "-", "-f", "tfrecord", "-c", "gzip", stdin=f)
    assert out.stdout.strip() == "64"


def test_errors_are_one_clear_line_and_exit_1():
    out = run("count", peer("ml-io/corrupted_split_records.pr"), "-f", "recordio",
              "--multipart", "concat")
    assert out.returncode == 1
    assert out.stderr.startswith("streamio: CorruptRecordError: RecordIO part #13")
    assert "Traceback" not in out.stderr


def test_serve_pipe_feeds_two_epochs_to_a_pipe_channel(tmp_path):
    data = tmp_path / "d.tfrecord"
    streamio.write_records(str(data), "tfrecord", [b"a", b"b", b"c"])
    prefix = str(tmp_path / "train")
    server = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel", prefix,
                               "--epochs", "2", str(data), str(data)], stderr=subprocess.PIPE,
                              text=True)
    try:
        channel = streamio.PipeChannel(prefix, open_timeout=30, read_timeout=30)
        for _ in range(2):
            assert list(streamio.read_records(channel, "tfrecord")) == [b"a", b"b", b"c"] * 2
        assert server.wait(timeout=30) == 0
        assert "epoch 1: served" in server.stderr.read()
    finally:
        server.kill()


def test_python_dash_m_equals_the_console_script():
    out = run("--help")
    assert out.returncode == 0 and "serve-pipe" in out.stdout


# -- several sources, version, progress ------------------------------------------------------------
def test_count_and_head_take_several_sources_globs_and_directories(tmp_path):
    for k in range(3):
        streamio.write_records(str(tmp_path / f"p{k}.tfrecord"), "tfrecord", [b"r%d" % k] * (k + 1))
    out = run("count", str(tmp_path / "p*.tfrecord"), "-f", "tfrecord")
    assert out.returncode == 0 and out.stdout.strip() == "6"
    out = run("count", str(tmp_path), str(tmp_path / "p0.tfrecord"), "-f", "tfrecord")
    assert out.stdout.strip() == "7"
    out = run("head", str(tmp_path), "-f", "tfrecord", "-n", "3")
    assert [line.split("\t")[2] for line in out.stdout.splitlines()] == ["'r0'", "'r1'", "'r1'"]
    out = run("count", str(tmp_path / "*.rec"), "-f", "recordio")
    assert out.returncode == 1 and "no files match" in out.stderr


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"streamio {streamio.__version__}"


def _count_through_a_stalling_fifo(tmp_path, stderr_is_a_terminal):
    data = tmp_path / "data.tfrecord"
    streamio.write_records(str(data), "tfrecord", [b"x" * 100] * 2000)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    size = data.stat().st_size
    # The writer stalls halfway for longer than the display's delay: the records that come
    # after the stall must be shown in progress.
    writer = subprocess.Popen([sys.executable, str(SCRIPTS / "fifo_writer.py"), str(fifo),
                               str(data), "4096", "--stall-after", str(size // 2), "--stall",
                               str(cli.PROGRESS_DELAY_S * 1.5)])
    master = None
    try:
        if stderr_is_a_terminal:
            master, slave = pty.openpty()
            proc = subprocess.run([sys.executable, "-m", "streamio", "count", str(fifo), "-f",
                                   "tfrecord"], stdout=subprocess.PIPE, stderr=slave,
                                  timeout=60)
            os.close(slave)
            err = b""
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the terminal's other end is closed
                    break
                if not chunk:
                    break
                err += chunk
        else:
            proc = subprocess.run([sys.executable, "-m", "streamio", "count", str(fifo), "-f",
                                   "tfrecord"], capture_output=True, timeout=60)
            err = proc.stderr
    finally:
        writer.wait(timeout=30)
        if master is not None:
            os.close(master)
    assert proc.returncode == 0 and proc.stdout.strip() == b"2000"
    return err.decode()


def test_count_shows_progress_on_a_terminal(tmp_path):
    err = _count_through_a_stalling_fifo(tmp_path, True)
    assert re.search(r"\r[\d,]+ records  [\d.,]+ MB  [\d.,]+ MB/s", err), repr(err)
    assert err.endswith("\r\x1b[K")  # the line is cleared before the count is printed


def test_count_shows_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    assert _count_through_a_stalling_fifo(tmp_path, False) == ""


# -- polish ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["count"], ["head"], ["serve-pipe"], ["demo"]])
def test_help_has_no_restructuredtext(command):
    out = run(*command, "--help")
    assert out.returncode == 0 and out.stdout.strip()
    assert "``" not in out.stdout and ":class:" not in out.stdout


def test_bench_help_and_table_do_not_cite_issues_or_judge_a_scaled_run():
    out = run("bench", "--help")
    assert out.returncode == 0 and "issue" not in out.stdout
    from streamio import bench

    assert bench.full_scale(bench.BenchConfig())
    scaled = bench.BenchConfig(examples=bench.DEFAULT_EXAMPLES // 10)
    assert not bench.full_scale(scaled)
    ratio = {"name": "csv: streamio / pandas", "value": 1.2, "target": 1.5, "unit": "x",
             "met": None, "ratio_of_medians": None}
    report = {"machine": {}, "cases": [], "ratios": [ratio], "notes": [], "full_scale": False}
    table = bench.format_table(report)
    assert "NOT MET" not in table and "issue" not in table
    assert "they apply at full scale" in table
    report.update(full_scale=True, ratios=[dict(ratio, met=False)])
    assert "NOT MET" in bench.format_table(report)


def test_on_error_warn_prints_one_line_without_internal_paths(tmp_path):
    path = tmp_path / "bad.tfrecord"
    streamio.write_records(str(path), "tfrecord", [b"abc" * 10] * 5)
    data = bytearray(path.read_bytes())
    data[60] ^= 1  # in the payload of record 1
    path.write_bytes(bytes(data))
    out = run("count", str(path), "-f", "tfrecord", "--on-error", "warn")
    assert out.returncode == 0 and out.stdout.strip() == "4"
    lines = out.stderr.splitlines()
    assert lines[0].startswith("streamio: warning: skipped 46 bytes: TFRecord data CRC mismatch")
    assert lines[1] == "skipped 1 damaged records (46 bytes)"
    assert ".py" not in out.stderr and "Warning" not in out.stderr


def test_serve_pipe_into_a_missing_directory_names_it(tmp_path):
    data = tmp_path / "d.tfrecord"
    streamio.write_records(str(data), "tfrecord", [b"a"])
    missing = tmp_path / "no" / "such"
    out = run("serve-pipe", "--channel", str(missing / "train"), str(data))
    assert out.returncode == 1 and str(missing) in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("n", ["-1", "x"])
def test_head_with_a_bad_count_is_an_argument_error(n):
    out = run("head", str(FIXTURES / "tf" / "plain.tfrecord"), "-f", "tfrecord", "-n", n)
    assert out.returncode == 2 and "argument -n" in out.stderr and not out.stdout


def test_head_decodes_examples_and_shows_text_rows_as_text(tmp_path):
    path = tmp_path / "ex.tfrecord"
    streamio.write_records(str(path), "tfrecord", [streamio.encode_example(
        {"x": np.array([0.5, -1.25, 2.0], np.float32), "y": 7, "name": b"cat"})])
    out = run("head", str(path), "-f", "tfrecord")
    assert out.stdout.split("\t")[2].strip() == (
        "{x: float[3] [0.5, -1.25, 2], y: int64 [7], name: bytes [b'cat']}")
    csv_path = tmp_path / "t.csv"
    csv_path.write_bytes(b"label,text\n1,\"two\nlines\"\n0,caf\xc3\xa9\n")
    out = run("head", str(csv_path), "-f", "csv")
    assert [line.split("\t")[2] for line in out.stdout.splitlines()] == [
        "label,text", '1,"two\\nlines"', "0,café"]
    opaque = tmp_path / "opaque.tfrecord"
    streamio.write_records(str(opaque), "tfrecord", [bytes([0xFF, 0x00, 0x81])])
    out = run("head", str(opaque), "-f", "tfrecord")
    assert out.stdout.split("\t")[2].strip() == "ff 00 81"

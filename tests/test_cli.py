"""The command line, run as a user would: in a subprocess."""

from __future__ import annotations

import subprocess
import sys


import streamio

from conftest import FIXTURES, peer


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

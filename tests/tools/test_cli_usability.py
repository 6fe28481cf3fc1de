"""Command-line usability (#41.12): ``count``/``head`` take the format from the names, ``head
--n``, a mistake in a command's options shows that command's usage, ``pack`` on a bad image says
how to skip it, ``--shard-size`` takes binary units. Run as a user would: in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import streamio

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "streamio", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    streamio.write_records(str(d / "a.tfrecord"), "tfrecord", [b"a%d" % i for i in range(5)])
    streamio.write_records(str(d / "b.tfrecords.gz"), "tfrecord", [b"b%d" % i for i in range(3)],
                           compression="gzip")
    streamio.write_records(str(d / "c.rec"), "recordio", [b"c%d" % i for i in range(4)])
    (d / "d.csv").write_text("x,y\n1,2\n3,4\n")
    os.mkfifo(d / "pipe")
    return d


def test_count_and_head_take_the_format_from_the_names(files):
    assert run("count", str(files / "a.tfrecord")).stdout.strip() == "5"
    assert run("count", str(files / "a.tfrecord"), str(files / "b.tfrecords.gz")
               ).stdout.strip() == "8"
    assert run("count", str(files / "c.rec")).stdout.strip() == "4"
    out = run("head", str(files / "a.tfrecord"), "-n", "2")
    assert out.returncode == 0 and out.stdout.splitlines() == ["0\t2 bytes\t'a0'",
                                                               "1\t2 bytes\t'a1'"], out
    assert run("count", str(files / "d.csv")).stdout.strip() == "3"  # csv: header and 2 rows


@pytest.mark.parametrize("names,says", [
    (["pipe"], "cannot tell the format of .*pipe from its name: pass --format"),
    (["a.tfrecord", "c.rec"], r"different formats \(.*a.tfrecord \(tfrecord\), .*c.rec"
                              r" \(recordio\)\): pass --format")])
def test_names_that_do_not_say_the_format_need_format(files, names, says):
    out = run("count", *(str(files / n) for n in names), timeout=30)  # the FIFO is not opened
    assert out.returncode == 1
    assert pytest.importorskip("re").search(says, out.stderr), out.stderr


def test_head_takes_double_dash_n(files):
    out = run("head", "--n", "2", str(files / "a.tfrecord"))
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2, out


def test_a_wrong_option_shows_the_commands_usage_not_the_top_level_one(files):
    out = run("head", "--lines", "2", str(files / "a.tfrecord"))
    assert out.returncode == 2
    assert out.stderr.startswith("usage: streamio head "), out.stderr
    assert "streamio head: error: unrecognized arguments: --lines" in out.stderr


def _bad_tree(tmp_path):
    (tmp_path / "tree" / "cat").mkdir(parents=True, exist_ok=True)
    (tmp_path / "tree" / "cat" / "text.jpg").write_bytes(b"this is not an image")
    return str(tmp_path / "tree")


def test_pack_on_a_broken_image_says_how_to_skip_it(tmp_path):
    pytest.importorskip("PIL")
    out = run("pack", _bad_tree(tmp_path), str(tmp_path / "out" / "s"))
    assert out.returncode == 1
    assert "bad image" in out.stderr and "text.jpg" in out.stderr
    assert "pass --on-error skip to skip such files" in out.stderr, out.stderr
    out = run("pack", _bad_tree(tmp_path), str(tmp_path / "out2" / "s"), "--on-error", "skip")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("size", ["1GiB", "1gib", "1Gi", "1G", "1GB", "1073741824"])
def test_shard_size_takes_binary_units(tmp_path, size):
    (tmp_path / "tree" / "a").mkdir(parents=True)
    (tmp_path / "tree" / "a" / "x.txt").write_bytes(b"hello")
    out = run("pack", str(tmp_path / "tree"), str(tmp_path / "out" / "s"), "--shard-size", size)
    assert out.returncode == 0, out.stderr
    assert "packed 1 files into 1 shards" in out.stdout

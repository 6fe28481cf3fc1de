"""The README's snippets run as written.

Each test takes a fenced block from a README section (by its heading) and runs it in a fresh
interpreter, in a temporary directory holding the files the snippet names; FIFOs are fed by
other processes (``streamio serve-pipe``, or a writer script). What a snippet leaves to the
reader is given to it, and nothing else: ``train_step`` (a step that does nothing), and the
SageMaker root ``/opt/ml/input/data``, replaced by the temporary directory (each replacement is
counted, so a snippet that changes fails here rather than silently running something else).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest

import streamio
from conftest import ROOT, SCRIPTS

README = ROOT / "README.md"
PRELUDE = "def train_step(*args):\n    pass\n\n"


def section_blocks(heading: str, lang: str) -> list:
    """The ``lang`` blocks of the README section whose heading starts with ``heading``."""
    blocks: list = []
    inside = False
    fence = None
    for line in README.read_text(encoding="utf-8").splitlines():
        if fence is None and line.startswith("#"):
            inside = line.lstrip("#").strip().startswith(heading)
            continue
        if line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
                if inside and fence == lang:
                    blocks.append([])
            else:
                fence = None
            continue
        if inside and fence == lang:
            blocks[-1].append(line)
    assert blocks, f"no {lang} block under a README heading {heading!r}"
    return ["\n".join(b) + "\n" for b in blocks]


def replaced(code: str, old: str, new: str, count: int) -> str:
    assert code.count(old) == count, f"the snippet should say {old!r} {count} times"
    return code.replace(old, new)


def run_snippet(code: str, cwd, *, timeout: float = 120, epilogue: str = "") -> str:
    script = cwd / "snippet.py"
    script.write_text(PRELUDE + code + epilogue)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout


def examples(path, n: int) -> None:
    streamio.write_records(str(path), "tfrecord", [
        streamio.encode_example({"x": np.full(16, i, np.float32), "y": i % 3})
        for i in range(n)])


def test_records_from_any_byte_stream(tmp_path):
    code = section_blocks("Records from any byte stream", "python")[0]
    assert "://host/" not in code and "://bucket/" not in code  # placeholders read as such
    streamio.write_records(str(tmp_path / "a.tfrecord"), "tfrecord", [b"a"])
    for folder in ("data", "more"):
        (tmp_path / folder).mkdir()
        streamio.write_records(str(tmp_path / folder / "p.tfrecord"), "tfrecord", [b"b"])
    streamio.write_records(str(tmp_path / "x.pbr"), "recordio", [b"c"])
    streamio.write_records(str(tmp_path / "src"), "tfrecord", [b"r"] * 50)
    fifo = tmp_path / "train_0"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, str(SCRIPTS / "fifo_writer.py"), str(fifo),
                               str(tmp_path / "src"), "7"])
    try:
        code = replaced(code, "/opt/ml/input/data/train_0", str(fifo), 1)
        run_snippet(code, tmp_path, epilogue="print(sum(1 for _ in streamio.read_records("
                                              "'out.tfrecord.gz', 'tfrecord')))\n")
        assert writer.wait(timeout=30) == 0  # the loop read the FIFO to its end
    finally:
        writer.kill()
        writer.wait()


def test_parallel_map_snippet(tmp_path):
    code = section_blocks("Parallel map", "python")[0]
    # A process map inside DataLoader workers is a UsageError; no snippet may combine them.
    for block in (b for h in ("Parallel map", "Images", "PyTorch") for b in
                  section_blocks(h, "python")):
        for chain in re.split(r"\n\s*\n", block):
            assert not ('backend="process"' in chain and "num_workers=" in chain
                        and "num_workers=0" not in chain), chain
    n = 1000
    streamio.write_records(str(tmp_path / "records.tfrecord"), "tfrecord",
                           [zlib.compress(b"%05d" % i * (1 + i % 5)) for i in range(n)])
    server = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel",
                               str(tmp_path / "train"), "--epochs", "2", "--open-timeout", "60",
                               str(tmp_path / "records.tfrecord")],
                              stderr=subprocess.PIPE, text=True)
    try:
        code = replaced(code, 'PipeChannel.sagemaker("train"',
                        f'PipeChannel.sagemaker("train", root={str(tmp_path)!r}', 2)
        out = run_snippet(code, tmp_path, timeout=180,
                          epilogue="print(ds.stats()['records'])\n")
        assert out.split() == [str(n)]  # epoch 1, read by the 3 DataLoader workers together
        _, log = server.communicate(timeout=30)
        assert server.returncode == 0, log
        assert "epoch 0: served" in log and "epoch 1: served" in log and "early" not in log
    finally:
        server.kill()
        server.wait()


def test_encode_example_snippet_and_the_cli_spec(tmp_path):
    code = section_blocks("Datasets", "python")[1]
    (tmp_path / "data").mkdir()
    assert run_snippet(code, tmp_path).split() == ["[1", "2", "3", "1]"]
    (tmp_path / "spec.json").write_text(section_blocks("Datasets", "json")[0])
    done = subprocess.run([sys.executable, "-m", "streamio", "diagnose", "data/part-0.tfrecord",
                           "--format", "tfrecord", "--decoder", "example:spec.json", "--batch",
                           "64", "--seconds", "1", "--step-ms", "0"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "records/s" in done.stdout and "bottleneck:" in done.stdout


def test_diagnose_snippet_prints_the_report(tmp_path):
    pytest.importorskip("torch")  # the snippet also tries DataLoader(num_workers=2)
    code = section_blocks("Tools", "python")[0]
    (tmp_path / "data").mkdir()
    for part in range(2):
        examples(tmp_path / "data" / f"part-{part}.tfrecord", 5_000)
    out = run_snippet(code, tmp_path, timeout=120)
    assert "RunFigures(" not in out
    lines = out.splitlines()
    assert lines[0].split() == ["input", "alone", "with", "step", "2", "workers"]
    mb = next(line for line in lines if line.startswith("MB/s read")).split()[2:]
    assert len(mb) == 3 and all(float(v.replace(",", "")) > 0 for v in mb)
    assert lines[-2].startswith("bottleneck:") and lines[-1].startswith("suggestion:")


def test_command_line_examples(tmp_path):
    block = section_blocks("Command line", "bash")[0]
    commands = {line.split("#")[0].split()[1]: line.split("#")[0].split()
                for line in block.splitlines() if line.startswith("streamio ")}
    assert "--epochs" in commands["sagemaker-local"]
    tf, rec = tmp_path / "big.tfrecord", tmp_path / "big.rec"
    streamio.write_records(str(tf), "tfrecord", [b"x" * 100] * 10)
    streamio.write_records(str(rec), "recordio", [b"y" * 100] * 10)
    done = subprocess.run([sys.executable, "-m", "streamio", *commands["index"][1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "big.tfrecord.index").exists() and (tmp_path / "big.rec.idx").exists()

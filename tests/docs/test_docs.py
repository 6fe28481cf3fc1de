"""Every Python snippet in README.md and docs/**/*.md runs, and every relative link resolves.

The collector finds every fenced ```python block and runs each in a fresh interpreter, in a
temporary directory, after a minimal prelude (``train_step``, a step that does nothing). A block
that needs more says so in an HTML comment on the line just before its fence, which rendered
Markdown does not show::

    <!-- snippet: skip (needs an S3 bucket) -->
    <!-- snippet: setup examples x=16; cuda-on-cpu -->

``skip`` needs a reason in parentheses. ``tested-by tests/FILE.py::TEST`` names the test that
runs the block another way (with the blocks before it in one session, say); that test must
exist. ``setup`` names one or more of the fixtures in ``SETUPS`` below (separated by ``;``,
each with ``key=value`` arguments), which prepare the files, FIFOs and variables the block
names, and may check what it printed. A fixture that stands in for something the block names
(a FIFO path under /opt/ml, a GPU) replaces that text and fails when the block no longer says
it, so a snippet that changes fails here rather than silently running something else. An
unknown marker or setup, a skip without a reason, or a marker that is not right above a python
fence fails; a test counts the python fences of each file independently of the collector, so
no block goes uncollected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import pytest

import streamio
from conftest import ROOT, SCRIPTS

PRELUDE = "def train_step(*args):\n    pass\n\n"
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
MARKER = re.compile(r"^\s*<!--\s*snippet:(?P<body>.*?)-->\s*$")
PYTHON = ("python", "py", "python3")


def doc_files() -> List[Path]:
    """README.md and every Markdown file under docs/, whoever added it."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclasses.dataclass
class Block:
    path: Path
    line: int               # 1-based line of the opening fence
    lang: str
    code: str
    marker: Optional[str]   # the text after "snippet:" in the comment above the fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> List[Block]:
    """Every fenced block of a Markdown file, with the snippet marker right above it."""
    blocks: List[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    opening = None
    body: List[str] = []
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if opening is None:
            if fence:
                opening, body = (number, fence), []
            continue
        start, open_fence = opening
        if (fence and not fence["info"] and fence["ticks"][0] == open_fence["ticks"][0]
                and len(fence["ticks"]) >= len(open_fence["ticks"])):
            above = MARKER.match(lines[start - 2]) if start >= 2 else None
            indent = len(open_fence["indent"])
            code = "\n".join(b[indent:] if b[:indent].isspace() else b for b in body) + "\n"
            blocks.append(Block(path, start, open_fence["info"].lower(), code,
                                above["body"].strip() if above else None))
            opening = None
        else:
            body.append(line)
    assert opening is None, f"{path.relative_to(ROOT)}:{opening[0]}: a fence is never closed"
    return blocks


def python_blocks() -> List[Block]:
    return [b for path in doc_files() for b in fenced_blocks(path) if b.lang in PYTHON]


# -- the run ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """What a fixture prepares for a snippet, and (after the run) what the snippet printed."""
    tmp: Path
    code: str
    prelude: str = PRELUDE
    epilogue: str = ""
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    timeout: float = 120
    stdout: str = ""
    wrapper: List[str] = dataclasses.field(default_factory=list)   # runs the interpreter

    def replace(self, old: str, new: str) -> None:
        """Stand ``new`` in for ``old`` wherever the snippet says it (at least once)."""
        assert old in self.code, f"the snippet no longer says {old!r}"
        self.code = self.code.replace(old, new)

    def execute(self) -> None:
        script = self.tmp / "snippet.py"
        script.write_text(self.prelude + self.code + self.epilogue)
        env = dict(os.environ, PYTHONPATH=str(ROOT), **self.env)
        done = subprocess.run([*self.wrapper, sys.executable, str(script)], cwd=self.tmp, env=env,
                              capture_output=True, text=True, timeout=self.timeout,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-4000:]
        self.stdout = done.stdout


Setup = Callable[..., "contextlib.AbstractContextManager[None]"]
SETUPS: Dict[str, Setup] = {}


def setup(name: str) -> Callable[[Callable[..., Iterator[None]]], Setup]:
    def register(fn: Callable[..., Iterator[None]]) -> Setup:
        SETUPS[name] = contextlib.contextmanager(fn)
        return SETUPS[name]
    return register


def parse_marker(marker: Optional[str]) -> tuple:
    """("run", [(setup, {key: value}), ...]) or ("skip", reason); anything else fails."""
    if marker is None:
        return "run", []
    skip = re.fullmatch(r"skip\s*\((?P<reason>.*\S.*)\)", marker)
    if skip:
        return "skip", skip["reason"].strip()
    elsewhere = re.fullmatch(r"tested-by\s+(?P<file>tests/\S+\.py)::(?P<test>\w+)", marker)
    if elsewhere:
        source = ROOT / elsewhere["file"]
        assert source.is_file() and re.search(rf"^\s*def {elsewhere['test']}\(",
                                              source.read_text(), re.M), (
            f"snippet marker {marker!r}: no such test")
        return "skip", f"runs in {elsewhere['file']}::{elsewhere['test']}"
    assert marker.startswith("setup "), (
        f"unknown snippet marker {marker!r}: use 'skip (why it cannot run here)', "
        f"'tested-by tests/FILE.py::TEST' or 'setup NAME [key=value ...][; NAME ...]'")
    setups = []
    for part in marker[len("setup "):].split(";"):
        name, *args = part.split()
        assert name in SETUPS, f"unknown snippet setup {name!r}; known: {sorted(SETUPS)}"
        assert all("=" in a for a in args), f"setup {name}: arguments are key=value: {args}"
        setups.append((name, dict(a.split("=", 1) for a in args)))
    return "run", setups


def run_block(block: Block, tmp: Path) -> Run:
    kind, detail = parse_marker(block.marker)
    if kind == "skip":
        pytest.skip(f"{block.where}: {detail}")
    for module in re.findall(r"^\s*(?:import|from)\s+(torch|tensorflow|keras)\b", block.code,
                             re.M):
        if importlib.util.find_spec(module) is None:   # optional dependencies, as elsewhere
            pytest.skip(f"{block.where}: {module} is not installed")
    run = Run(tmp, block.code)
    with contextlib.ExitStack() as stack:
        for name, args in detail:
            stack.enter_context(SETUPS[name](run, **args))
        run.execute()
    return run


BLOCKS = python_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_python_snippet_runs(block, tmp_path):
    run_block(block, tmp_path)


# -- fixtures --------------------------------------------------------------------------------------
def write_examples(path: Path, n: int, x: int, start: int = 0) -> None:
    streamio.write_records(str(path), "tfrecord", (
        streamio.encode_example({"x": np.full(x, i, np.float32), "y": i % 3,
                                 "tokens": [i % 7] * (1 + i % 3)})
        for i in range(start, start + n)))


@setup("examples")
def _examples(run: Run, x: str = "16", n: str = "2000", files: str = "2") -> Iterator[None]:
    """data/part-<i>.tfrecord: Examples with x (float32 [x]), y (int64) and tokens (varlen)."""
    (run.tmp / "data").mkdir(exist_ok=True)
    for part in range(int(files)):
        write_examples(run.tmp / "data" / f"part-{part}.tfrecord", int(n), int(x), part * int(n))
    yield


@setup("data-dir")
def _data_dir(run: Run) -> Iterator[None]:
    """An empty ./data for a snippet that writes there."""
    (run.tmp / "data").mkdir()
    yield


@setup("private-network")
def _private_network(run: Run) -> Iterator[None]:
    """The snippet runs in a network namespace of its own, with only a loopback interface: for
    code that binds every interface or probes outside addresses (Ray does both)."""
    run.wrapper = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
    yield


@setup("import-streamio")
def _import_streamio(run: Run) -> Iterator[None]:
    """For a block that goes on from one above it, which imported streamio."""
    run.prelude += "import streamio\n"
    yield


@setup("prints-as-commented")
def _prints_as_commented(run: Run) -> Iterator[None]:
    """The output is what the comments after the snippet's print() calls say, line by line."""
    expected = re.findall(r"^\s*print\(.*\)\s*#\s*(.*?)\s*$", run.code, re.M)
    assert expected, "no commented print() in the snippet"
    yield
    assert run.stdout.splitlines() == expected


@setup("byte-stream-sources")
def _byte_stream_sources(run: Run) -> Iterator[None]:
    """The local sources "Records from any byte stream" names, and its FIFO fed by a writer
    process; the http and s3 lines are placeholders a lazy read_records never opens."""
    assert "://host/" not in run.code and "://bucket/" not in run.code  # read as placeholders
    tmp = run.tmp
    streamio.write_records(str(tmp / "a.tfrecord"), "tfrecord", [b"a"])
    for folder in ("data", "more"):
        (tmp / folder).mkdir()
        streamio.write_records(str(tmp / folder / "p.tfrecord"), "tfrecord", [b"b"])
    streamio.write_records(str(tmp / "x.pbr"), "recordio", [b"c"])
    streamio.write_records(str(tmp / "src"), "tfrecord", [b"r"] * 50)
    fifo = tmp / "train_0"
    os.mkfifo(fifo)
    run.replace("/opt/ml/input/data/train_0", str(fifo))
    run.epilogue += ("print(list(streamio.read_records('out.tfrecord.gz', 'tfrecord')))\n")
    writer = subprocess.Popen([sys.executable, str(SCRIPTS / "fifo_writer.py"), str(fifo),
                               str(tmp / "src"), "7"])
    try:
        yield
        assert writer.wait(timeout=30) == 0  # the loop read the FIFO to its end
        assert run.stdout.splitlines()[-1] == "[b'a', b'b']"
    finally:
        writer.kill()
        writer.wait()


def jpeg(i: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    pixels = np.full((48, 64, 3), (i * 37 % 256, i * 11 % 256, 128), np.uint8)
    Image.fromarray(pixels).save(buf, "JPEG", quality=80)
    return buf.getvalue()


CHANNEL_RECORDS = {
    "zlib": lambda i: zlib.compress(b"%05d" % i * (1 + i % 5)),
    "examples": lambda i: streamio.encode_example({"x": np.full(16, i, np.float32), "y": i % 3}),
    "images": lambda i: streamio.encode_example({"image/encoded": jpeg(i),
                                                 "image/class/label": i % 10}),
}


@setup("pipe-channel")
def _pipe_channel(run: Run, epochs: str, records: str, n: str = "1000") -> Iterator[None]:
    """SageMaker Pipe mode's channel "train" (FIFOs train_<epoch>) served by ``streamio
    serve-pipe`` for ``epochs`` epochs of ``n`` records (zlib-compressed bytes, Examples of x
    [16] and y, or JPEG Examples), rooted in the temp dir instead of /opt/ml/input/data. Checks
    that every epoch was read to its end and that ``ds.stats()`` counted the last one whole."""
    if records == "images":
        pytest.importorskip("PIL")
    source = run.tmp / "channel.tfrecord"
    streamio.write_records(str(source), "tfrecord", map(CHANNEL_RECORDS[records], range(int(n))))
    run.replace('PipeChannel.sagemaker("train"', f'PipeChannel.sagemaker("train", '
                                                 f'root={str(run.tmp)!r}')
    run.epilogue += "print('records in the last epoch:', ds.stats()['records'])\n"
    server = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel",
                               str(run.tmp / "train"), "--epochs", epochs, "--open-timeout",
                               "60", str(source)], stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        yield
        _, log = server.communicate(timeout=30)
        assert server.returncode == 0, log
        assert all(f"epoch {e}: served" in log for e in range(int(epochs))), log
        assert "early" not in log, log
        assert run.stdout.splitlines()[-1] == f"records in the last epoch: {n}"
    finally:
        server.kill()
        server.wait()


@setup("cuda-on-cpu")
def _cuda_on_cpu(run: Run) -> Iterator[None]:
    """Without a CUDA device the snippet's "cuda" becomes "cpu" and ``Tensor.cuda()`` returns
    the tensor; with one it runs as written."""
    torch = pytest.importorskip("torch")
    assert '"cuda"' in run.code or ".cuda(" in run.code, "the snippet no longer uses CUDA"
    if not torch.cuda.is_available():
        run.code = run.code.replace('"cuda"', '"cpu"')
        run.prelude += ("import torch\n"
                        "torch.Tensor.cuda = lambda self, *args, **kwargs: self  # no GPU here\n")
    yield


@setup("keras-model")
def _keras_model(run: Run) -> Iterator[None]:
    """``model``: the smallest compiled Keras model for (x [16], y) batches."""
    pytest.importorskip("tensorflow")
    run.prelude += ("import keras\n"
                    "model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(3)])\n"
                    "model.compile('sgd', keras.losses.SparseCategoricalCrossentropy("
                    "from_logits=True))\n")
    yield


@setup("fewer")
def _fewer(run: Run, **values: str) -> Iterator[None]:
    """Smaller values for the snippet's ``name = value`` lines (each said exactly once)."""
    for name, value in values.items():
        lines = re.findall(rf"^{name} = \S+", run.code, re.M)
        assert len(lines) == 1, f"the snippet should assign {name} once"
        run.replace(lines[0], f"{name} = {value}")
    yield


@setup("sagemaker-file-channel")
def _sagemaker_file_channel(run: Run, n: str = "1000") -> Iterator[None]:
    """A File-mode channel "train" of Examples (x [16], y), set up as the SageMaker training
    toolkit describes it (SM_INPUT_DATA_CONFIG, SM_CHANNEL_TRAIN)."""
    (run.tmp / "train").mkdir()
    write_examples(run.tmp / "train" / "part-0.tfrecord", int(n), 16)
    run.env.update(SM_INPUT_DATA_CONFIG='{"train": {"TrainingInputMode": "File", '
                                       '"ContentType": "application/x-tfrecord"}}',
                   SM_CHANNEL_TRAIN=str(run.tmp / "train"))
    yield


@setup("diagnose-report")
def _diagnose_report(run: Run) -> Iterator[None]:
    """The snippet prints streamio.diagnose's report (as the README shows it)."""
    pytest.importorskip("torch")  # the report includes DataLoader(num_workers=2)
    yield
    lines = run.stdout.splitlines()
    assert "RunFigures(" not in run.stdout
    assert lines[0].split() == ["input", "alone", "with", "step", "2", "workers"]
    mb = next(line for line in lines if line.startswith("MB/s read")).split()[2:]
    assert len(mb) == 3 and all(float(v.replace(",", "")) > 0 for v in mb)
    assert lines[-2].startswith("bottleneck:") and lines[-1].startswith("suggestion:")


# -- the collector is complete and strict ----------------------------------------------------------
@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_fence_is_collected(path):
    text = path.read_text(encoding="utf-8")
    fences = re.findall(r"^ {0,3}(?:```|~~~)[`~]*\s*(?:python3?|py)\b", text, re.M | re.I)
    collected = [b for b in BLOCKS if b.path == path]
    assert len(collected) == len(fences), (path, [b.where for b in collected])
    markers = re.findall(r"<!--\s*snippet:", text)
    assert len(markers) == sum(b.marker is not None for b in collected), (
        "a snippet marker is not on the line right above a python fence")
    for block in collected:   # markers parse and name known setups (runs report the rest)
        parse_marker(block.marker)


def test_the_collector_rejects_bad_markers():
    assert parse_marker("skip (needs an S3 bucket)") == ("skip", "needs an S3 bucket")
    assert parse_marker("setup examples x=32; data-dir") == (
        "run", [("examples", {"x": "32"}), ("data-dir", {})])
    assert parse_marker("tested-by tests/docs/test_docs.py::test_python_snippet_runs") == (
        "skip", "runs in tests/docs/test_docs.py::test_python_snippet_runs")
    for bad in ("skip", "skip ()", "skip ( )", "skipped (why)", "setup no-such-fixture",
                "setup examples 32", "run", "tested-by tests/docs/test_docs.py::no_such_test",
                "tested-by tests/no_such_file.py::test_x"):
        with pytest.raises(AssertionError):
            parse_marker(bad)


def test_the_collector_reads_markers_indents_and_tildes(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n<!-- snippet: skip (needs a GPU) -->\n```python\nx = 1\n```\n"
                   "- item\n\n   ~~~py\n   y = 2\n   ~~~\n````markdown\n```python\n````\n")
    blocks = fenced_blocks(doc)
    assert [(b.line, b.lang, b.code, b.marker) for b in blocks] == [
        (3, "python", "x = 1\n", "skip (needs a GPU)"), (8, "py", "y = 2\n", None),
        (11, "markdown", "```python\n", None)]


def test_a_private_network_snippet_reaches_only_loopback(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- snippet: setup private-network -->\n```python\nimport socket\n"
                   "print(sorted({name for _, name in socket.if_nameindex()}))\n```\n")
    [block] = fenced_blocks(doc)
    assert run_block(block, tmp_path).stdout.split() == ["['lo']"]


def test_no_snippet_combines_a_process_map_with_dataloader_workers():
    """A process map inside DataLoader workers is a UsageError; no example may combine them."""
    for block in BLOCKS:
        for chain in re.split(r"\n\s*\n", block.code):
            assert not ('backend="process"' in chain and "num_workers=" in chain
                        and "num_workers=0" not in chain), (block.where, chain)


# -- links -----------------------------------------------------------------------------------------
LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)|"
                  r"!\[[^\]]*\]\((?P<image>[^)\s]+)[^)]*\)|"
                  r"^\s*\[[^\]]+\]:\s*(?P<ref>\S+)", re.M)


def without_code(text: str, *, spans: bool = True) -> str:
    """The Markdown outside fenced blocks and (unless ``spans`` is false) inline code spans:
    links there are not links."""
    out, fenced = [], None
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fenced is None and fence:
            fenced = fence["ticks"]
            continue
        if fenced is not None:
            if fence and line.strip().startswith(fenced):
                fenced = None
            continue
        out.append(re.sub(r"`[^`]*`", "", line) if spans else line)
    return "\n".join(out)


def anchors(path: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats
    numbered; plus explicit ``<a name=...>`` / ``id=...``."""
    text = without_code(path.read_text(encoding="utf-8"), spans=False)
    seen: Dict[str, int] = {}
    found = set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(path: Path) -> List[str]:
    return [m["target"] or m["image"] or m["ref"]
            for m in LINK.finditer(without_code(path.read_text(encoding="utf-8")))]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):   # http(s), mailto: not fetched
            assert re.fullmatch(r"(https?://[^\s/]+\.[^\s/]+\S*|mailto:\S+@\S+)", target), target
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or ROOT.resolve() not in dest.parents and dest != ROOT.resolve():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to nothing: {broken}"


def test_the_link_check_finds_broken_links(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Two words: here!\n## Two words: here!\n"
                                            "### Tools: `streamio pack`\n")
    doc = tmp_path / "README.md"
    doc.write_text("[ok](docs/a.md#two-words-here-1) [t](docs/a.md#tools-streamio-pack) "
                   "[x](docs/b.md) [y](docs/a.md#nope) [z](#top) `[code](nowhere.md)` "
                   "![img](docs/a.md) [w](https://example.com/a)\n"
                   "# Top\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert links(doc) == ["docs/a.md#two-words-here-1", "docs/a.md#tools-streamio-pack",
                          "docs/b.md", "docs/a.md#nope", "#top", "docs/a.md",
                          "https://example.com/a"]
    with pytest.raises(AssertionError, match=r"\['docs/b.md', 'docs/a.md#nope'\]"):
        test_relative_links_resolve(doc)


# -- shell blocks ----------------------------------------------------------------------------------
def commands(line: str) -> List[str]:
    """A ``&&`` chain as its commands, written the one way (``python -m pip install -q`` is
    ``pip install``)."""
    out = []
    for cmd in line.split("&&"):
        words = cmd.split()
        if words[:3] == ["python", "-m", "pip"]:
            words = words[2:]
        out.append(" ".join(w for w in words if not (words[0] == "pip" and w == "-q")))
    return out


def test_readme_test_command_is_what_ci_runs():
    """README's second command (install everything, run the tests) is what .ci/run does: its
    torch pin first, and the README's test command as its last line."""
    first = next(b for b in fenced_blocks(ROOT / "README.md") if b.lang == "bash")
    demo, test = first.code.splitlines()[:2]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    pin = next(line for line in ci if "torch==" in line)
    assert commands(test) == commands(pin) + commands(ci[-1])
    assert commands(demo)[0] == commands(pin)[0] and commands(demo)[-1] == "streamio demo"


def test_every_streamio_command_in_the_docs_exists():
    done = subprocess.run([sys.executable, "-m", "streamio", "--help"], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    listed = set(re.findall(r"\{([^}]*)\}", done.stdout)[0].split(","))
    used = {line.split()[1] for path in doc_files() for b in fenced_blocks(path)
            if b.lang in ("bash", "sh", "shell", "console", "text")
            for line in (lin.lstrip("$ ").strip() for lin in b.code.splitlines())
            if line.startswith("streamio ") and not line.split()[1].startswith("-")}
    assert used and used <= listed, used - listed


def doc_block(lang: str, says: str) -> Block:
    """The one ``lang`` block of README.md and docs/ that says ``says``."""
    found = [b for path in doc_files() for b in fenced_blocks(path)
             if b.lang == lang and says in b.code]
    assert len(found) == 1, f"{[b.where for b in found]}: {len(found)} {lang} blocks say {says!r}"
    return found[0]


def test_the_cli_spec_reads_what_the_encode_example_snippet_wrote(tmp_path):
    """The JSON spec (``diagnose --decoder example:spec.json``) fits the Python snippet's data."""
    run_block(doc_block("python", 'print(next(iter(ds))["tokens_len"]'), tmp_path)
    (tmp_path / "spec.json").write_text(doc_block("json", '"varlen": true').code)
    done = subprocess.run([sys.executable, "-m", "streamio", "diagnose", "data/part-0.tfrecord",
                           "--format", "tfrecord", "--decoder", "example:spec.json", "--batch",
                           "64", "--seconds", "1", "--step-ms", "0"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "records/s" in done.stdout and "bottleneck:" in done.stdout


def test_command_line_examples(tmp_path):
    block = doc_block("bash", "streamio index ")
    commands = {line.split("#")[0].split()[1]: line.split("#")[0].split()
                for line in block.code.splitlines() if line.startswith("streamio ")}
    assert "--epochs" in commands["sagemaker-local"]
    tf, rec = tmp_path / "big.tfrecord", tmp_path / "big.rec"
    streamio.write_records(str(tf), "tfrecord", [b"x" * 100] * 10)
    streamio.write_records(str(rec), "recordio", [b"y" * 100] * 10)
    done = subprocess.run([sys.executable, "-m", "streamio", *commands["index"][1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "big.tfrecord.index").exists() and (tmp_path / "big.rec.idx").exists()


# -- the site --------------------------------------------------------------------------------------
def nav_pages(mkdocs_yml: Path) -> List[str]:
    """The pages mkdocs.yml's nav lists (``  - Title: page.md`` lines; no YAML parser needed)."""
    text = mkdocs_yml.read_text(encoding="utf-8")
    nav = text[text.index("\nnav:\n"):]
    return re.findall(r"^\s+-\s+[^:\n]+:\s*(\S+\.md)\s*$", nav, re.M)


def test_the_site_nav_lists_every_docs_page_once():
    """mkdocs.yml (``mkdocs build``) shows every page of docs/ and no page that is not there;
    the README links every page too, so the guide is reachable from the landing page."""
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    listed = nav_pages(ROOT / "mkdocs.yml")
    assert sorted(listed) == pages and len(set(listed)) == len(listed), (listed, pages)
    linked = {target.partition("#")[0] for target in links(ROOT / "README.md")}
    assert {f"docs/{p}" for p in pages if p != "index.md"} <= linked


def test_the_readme_is_a_landing_page():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250

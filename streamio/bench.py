"""The streamio benchmark: streamio against its peers on the same bytes, in one run.

``python benchmarks/run.py`` (or ``streamio bench``) generates the workloads in a temporary
directory, streams each through a named pipe fed by a writer *process* (``os.open`` on the FIFO,
then the file's bytes), and runs streamio and its peers on the same bytes, alternating, for
several rounds. It prints the medians, the ratios against streamio's targets, and writes the
same facts as JSON (``--json PATH``).

Workloads (sizes adjustable; the defaults finish in a few minutes on a 2-core machine):

1. ``examples``: ``tf.train.Example`` records (float32[32] ``x`` + int64 ``label``, ~178 bytes
   framed) into batches of 256. streamio reads the FIFO; ``tf.data`` and the ``tfrecord``
   package read the regular file (neither can read a FIFO: the run tries once and records the
   error).
2. ``large``: 100 KB TFRecords, raw bytes, CRCs verified: ``read_records`` vs a plain
   ``os.read(fd, 1 MiB)`` loop on the same FIFO.
3. ``csv``: rows of 17 numeric columns, label first, into float32 batches: streamio and
   ``pandas.read_csv(chunksize=...)`` on the FIFO, ``tf.data`` TextLine + ``decode_csv`` on the file.
4. ``recordio``: SageMaker RecordIO-protobuf dense float32 rows (128 features + label) in batches.
5. ``pipeline``: ``shuffle(10k) + batch + prefetch`` vs the bare decode loop, on 600k Examples of
   its own (an epoch of 150k is short enough for a drift in the machine's speed to show).
6. ``adapters``: what users run end to end, on 200k Examples of its own (one file, and the same
   records in 4 part files), next to the numpy rate. ``to_tf()`` reading the FIFO against
   ``tf.data`` (``TFRecordDataset.batch.map(parse_example, AUTOTUNE).prefetch(AUTOTUNE)``) on
   the file, both read by two graph-mode consumers that sum ``reduce_sum(x)`` over each batch:
   ``step``, a Python loop calling a ``tf.function`` step that takes the next batch from the
   iterator (``model.fit`` with its default ``steps_per_execution=1``), and ``graph``, the
   whole epoch iterated inside one ``tf.function`` (a custom training loop; ``model.fit`` with
   a large ``steps_per_execution`` comes close). And ``to_torch()`` through a ``DataLoader``
   (``batch_size=None``) with ``num_workers`` 0 and 2 over the part files, against the numpy
   rate on the same files. These run in their own TensorFlow and torch worker processes.

Also: ``read_records`` alone on the examples FIFO (records/s) next to a raw ``read()`` of the
same pipe, and the peak RSS of every measurement (the kernel's high-water mark, reset before
each one).

TensorFlow runs in a separate worker process, and so do torch and the ``tfrecord`` package (it
registers protobuf messages under TensorFlow's names): the streamio measurements never share a
process with them (except the adapters' own cases, which need them). pandas runs in the
streamio process (it shares nothing with streamio's hot path). Workloads whose streamio decoder
or pipeline is not importable are skipped with the reason, so the benchmark runs at every stage
of the project.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .decoders._wire import len_field

__all__ = ["BenchConfig", "main", "run_benchmark"]

# -- defaults: a few minutes in all on a 2-core machine ------------------------------------------
DEFAULT_ROUNDS = 9  # the medians and per-round ratios need several: this VM's speed drifts
DEFAULT_EXAMPLES = 150_000
# The pipeline case's own Examples: an epoch of 150k takes ~40 ms, short enough for this VM's
# second-to-second drift to move single figures by tens of percent; 600k average it out.
DEFAULT_PIPELINE_RECORDS = 600_000
DEFAULT_LARGE_RECORDS = 3_000  # of LARGE_RECORD_SIZE bytes: ~300 MB
DEFAULT_CSV_ROWS = 300_000
DEFAULT_RECORDIO_ROWS = 200_000
DEFAULT_BATCH_SIZE = 256
DEFAULT_SHUFFLE_BUFFER = 10_000
DEFAULT_PREFETCH: Optional[int] = None  # prefetch(): the self-sizing queue (like tf.data.AUTOTUNE)
FIXED_PREFETCH = 2  # reported beside it: a small fixed queue, one wake-up per two batches
DEFAULT_PANDAS_CHUNKSIZE = 8_192  # pandas' per-chunk overhead is large; a small chunk would cripple it
DEFAULT_PEER_TIMEOUT = 600.0  # seconds one peer measurement may take before it is abandoned
LARGE_RECORD_SIZE = 100_000
EXAMPLE_FLOATS = 32
CSV_FEATURES = 16  # plus the label column
RECORDIO_FEATURES = 128
READ_SIZE = 1024 * 1024  # the raw read() loop's request size (a pipe buffer's worth)
DEFAULT_ADAPTER_RECORDS = 200_000
ADAPTER_PARTS = 4  # the part files to_torch's DataLoader workers split between them
WORKLOADS = ("examples", "large", "csv", "recordio", "pipeline", "adapters")
SEED = 20240611

# streamio's targets: (name, numerator case, denominator case or None, target, unit). They
# are judged only at full scale (see full_scale()): small workloads measure start-up costs.
TARGETS = (
    ("examples: streamio / tf.data", "examples/streamio", "examples/tf.data", 2.0, "x"),
    ("examples: streamio / tfrecord pkg", "examples/streamio", "examples/tfrecord-pkg", None, "x"),
    ("examples: streamio / tf.data (AUTOTUNE)", "examples/streamio", "examples/tf.data-autotune",
     None, "x"),
    ("large records: read_records / read()", "large/streamio-read_records", "large/raw-read", 1.5,
     "x"),
    # the pipe's physical limit: the best raw read of the same FIFO
    ("large records: read_records / best readinto", "large/streamio-read_records",
     "large/raw-readinto", 0.95, "x"),
    ("csv: streamio / pandas", "csv/streamio", "csv/pandas", 1.5, "x"),
    ("csv: streamio / tf.data", "csv/streamio", "csv/tf.data", 4.0, "x"),
    ("recordio-protobuf dense: records/s", "recordio/streamio", None, 1_000_000, "rec/s"),
    # overhead <= 10%: the full pipeline keeps >= 1/1.1 of the bare decode loop's records/s
    ("pipeline: shuffle+batch+prefetch / bare decode", "pipeline/shuffle-batch-prefetch",
     "pipeline/bare-decode", 1.0 / 1.10, "x"),
    ("pipeline: same with prefetch(2) / bare decode", "pipeline/shuffle-batch-prefetch2",
     "pipeline/bare-decode", None, "x"),
    ("pipeline: shuffle+batch, no prefetch / bare decode", "pipeline/shuffle-batch",
     "pipeline/bare-decode", None, "x"),
    ("examples FIFO: read_records / raw read() (bytes/s)", "examples/read_records",
     "examples/raw-read", None, "x"),
    ("adapters: to_tf() / tf.data, graph loop", "adapters/to_tf-graph", "adapters/tf.data-graph",
     2.0, "x"),
    ("adapters: to_tf() / tf.data, step loop (fit)", "adapters/to_tf-step",
     "adapters/tf.data-step", None, "x"),
    ("adapters: to_tf() graph loop / numpy", "adapters/to_tf-graph", "adapters/numpy", None,
     "x"),
    ("adapters: to_torch() DataLoader(0) / numpy", "adapters/to_torch-w0",
     "adapters/numpy-files", None, "x"),
    ("adapters: to_torch() DataLoader(2) / numpy", "adapters/to_torch-w2",
     "adapters/numpy-files", None, "x"),
)


@dataclass
class BenchConfig:
    """What to run, and how big (the command-line options of ``main``)."""

    rounds: int = DEFAULT_ROUNDS
    examples: int = DEFAULT_EXAMPLES
    pipeline_records: int = DEFAULT_PIPELINE_RECORDS
    adapter_records: int = DEFAULT_ADAPTER_RECORDS
    large_records: int = DEFAULT_LARGE_RECORDS
    csv_rows: int = DEFAULT_CSV_ROWS
    recordio_rows: int = DEFAULT_RECORDIO_ROWS
    batch_size: int = DEFAULT_BATCH_SIZE
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    prefetch: Optional[int] = DEFAULT_PREFETCH
    pandas_chunksize: int = DEFAULT_PANDAS_CHUNKSIZE
    workloads: tuple = WORKLOADS
    peers: bool = True
    tmpdir: Optional[str] = None
    keep: bool = False
    json_path: Optional[str] = None
    peer_timeout: float = DEFAULT_PEER_TIMEOUT
    verbose: bool = True


@dataclass
class Measurement:
    records: int
    seconds: float
    nbytes: int
    peak_rss_mib: Optional[float]


@dataclass
class CaseResult:
    case: str  # "workload/runner"
    workload: str
    runner: str
    input: str  # "fifo" or "file"
    process: str  # "streamio" (this process) or the worker that ran it
    rounds: list = field(default_factory=list)  # list[Measurement as dict]
    skipped: Optional[str] = None
    error: Optional[str] = None

    def medians(self) -> dict:
        if not self.rounds:
            return {}
        secs = statistics.median(r["seconds"] for r in self.rounds)
        recs = self.rounds[0]["records"]
        nbytes = self.rounds[0]["nbytes"]
        rss = [r["peak_rss_mib"] for r in self.rounds if r["peak_rss_mib"] is not None]
        return {
            "median_s": secs,
            "records": recs,
            "records_per_s": recs / secs if secs > 0 else None,
            "mb_per_s": nbytes / secs / 1e6 if secs > 0 else None,
            "peak_rss_mib": max(rss) if rss else None,
        }


# -- measuring --------------------------------------------------------------------------------------
def _reset_peak_rss() -> None:
    # Linux: writing 5 to clear_refs resets the VmHWM high-water mark, so each measurement gets
    # its own peak in one long-lived process.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _status_mib(field: str) -> Optional[float]:
    """A memory figure of this process from /proc/self/status (``VmHWM``, ``VmRSS``), in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_rss_mib() -> Optional[float]:
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except (ImportError, OSError):  # pragma: no cover - not Unix
        return None


def _rss_mib() -> Optional[float]:
    return _status_mib("VmRSS")


# The writer process: says "ready", opens the FIFO (blocking until the reader opens it), writes
# the whole file (sendfile where the kernel allows it), and exits quietly if the reader leaves.
_WRITER = r"""
import os, sys
src, fifo = sys.argv[1], sys.argv[2]
sys.stdout.write("ready\n"); sys.stdout.flush()
try:
    out = os.open(fifo, os.O_WRONLY)
    with open(src, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        try:
            while offset < size:
                n = os.sendfile(out, f.fileno(), offset, min(size - offset, 1 << 24))
                if n == 0:
                    break
                offset += n
        except OSError as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            while offset < size:  # no sendfile here: plain reads and writes
                view = memoryview(os.pread(f.fileno(), 1 << 20, offset))
                offset += len(view)
                while view:
                    view = view[os.write(out, view):]
    os.close(out)
except BrokenPipeError:
    pass
"""


class FifoFeed:
    """A fresh FIFO in ``tmpdir`` with a writer process ready to stream ``src`` into it."""

    def __init__(self, src: str, tmpdir: str) -> None:
        fd, path = tempfile.mkstemp(prefix="fifo-", dir=tmpdir)
        os.close(fd)
        os.unlink(path)
        os.mkfifo(path)
        self.path = path
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, src, path],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read().decode(errors="replace")
            raise RuntimeError(f"FIFO writer failed to start: {err}")

    def close(self, timeout: float = 60.0) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def unblock(self) -> None:
        """Open and close the read end, so a writer still waiting in open() can finish."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass


def _measure_here(consume: Callable[[str], int], path: str, nbytes: int,
                  fifo_src: Optional[str], tmpdir: str) -> Measurement:
    """Time ``consume(path)`` (-> records) in this process; through a fresh FIFO if ``fifo_src``."""
    feed = FifoFeed(fifo_src, tmpdir) if fifo_src else None
    target = feed.path if feed else path
    try:
        _reset_peak_rss()
        t0 = time.perf_counter()
        records = consume(target)
        seconds = time.perf_counter() - t0
        peak = _peak_rss_mib()
    except BaseException:
        if feed:
            feed.unblock()
        raise
    finally:
        if feed:
            feed.close()
    return Measurement(records, seconds, nbytes, peak)


# -- workloads ----------------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    path: str
    records: int
    nbytes: int
    meta: dict = field(default_factory=dict)


def _template_rows(n: int, parts: list, fills: dict) -> np.ndarray:
    """Rows of identical layout: ``parts`` (bytes, or a fill name) joined; ``fills`` (n, k) uint8."""
    width = sum(len(p) if isinstance(p, bytes) else fills[p].shape[1] for p in parts)
    rows = np.empty((n, width), dtype=np.uint8)
    at = 0
    for part in parts:
        if isinstance(part, bytes):
            rows[:, at:at + len(part)] = np.frombuffer(part, dtype=np.uint8)
            at += len(part)
        else:
            block = fills[part]
            rows[:, at:at + block.shape[1]] = block
            at += block.shape[1]
    return rows


def _tfrecord_frames(payloads: np.ndarray) -> np.ndarray:
    """TFRecord frames of equal-length payloads: u64 length | u32 masked crc | data | u32 masked crc."""
    from .formats.tfrecord import masked_crc32c

    n, length = payloads.shape
    head = np.frombuffer(length.to_bytes(8, "little"), dtype=np.uint8)
    head_crc = np.frombuffer(masked_crc32c(head.tobytes()).to_bytes(4, "little"), dtype=np.uint8)
    crcs = np.fromiter((masked_crc32c(row) for row in payloads), dtype="<u4", count=n)
    frames = np.empty((n, 12 + length + 4), dtype=np.uint8)
    frames[:, :8] = head
    frames[:, 8:12] = head_crc
    frames[:, 12:12 + length] = payloads
    frames[:, 12 + length:] = crcs.view(np.uint8).reshape(n, 4)
    return frames


def example_payloads(n: int, rng: np.random.Generator) -> tuple:
    """``n`` serialized tf.train.Example: ``x`` float32[32], ``label`` int64 in [0, 10).

    Every record has the same layout (the label fits one varint byte), so the batch is built as
    rows of a template with numpy rather than serialised one by one. Returns (payloads, x, label).
    """
    x = rng.standard_normal((n, EXAMPLE_FLOATS), dtype=np.float32)
    label = rng.integers(0, 10, n, dtype=np.int64)
    marker = b"\0" * (4 * EXAMPLE_FLOATS)  # the only run of 128 zero bytes in the message
    float_list = len_field(1, marker)  # FloatList { repeated float value = 1 [packed] }
    int64_list = len_field(1, b"\0")  # Int64List { repeated int64 value = 1 [packed] }
    entry_x = len_field(1, b"x") + len_field(2, len_field(2, float_list))  # Feature.float_list = 2
    entry_label = len_field(1, b"label") + len_field(2, len_field(3, int64_list))  # Feature.int64_list = 3
    example = len_field(1, len_field(1, entry_x) + len_field(1, entry_label))  # Example.features, Features.feature
    i = example.index(marker)
    # The label's one varint byte is the last byte of the message (its entry comes last).
    parts = [example[:i], "x", example[i + len(marker):-1], "label"]
    fills = {"x": x.view(np.uint8).reshape(n, -1), "label": label.astype(np.uint8).reshape(n, 1)}
    return _template_rows(n, parts, fills), x, label


def recordio_protobuf_payloads(n: int, rng: np.random.Generator) -> tuple:
    """``n`` SageMaker Records: features["values"] float32[128], label["values"] float32[1].

    The layout SageMaker's ``write_numpy_to_dense_tensor`` produces:
    Record { features = 1: map<string, Value>; label = 2 }, Value.float32_tensor = 2,
    Float32Tensor.values = 1 (packed).
    """
    x = rng.standard_normal((n, RECORDIO_FEATURES), dtype=np.float32)
    label = rng.integers(0, 2, n).astype(np.float32)
    mx, ml = b"\1" * (4 * RECORDIO_FEATURES), b"\2" * 4
    feat = len_field(1, len_field(1, b"values") + len_field(2, len_field(2, len_field(1, mx))))
    lab = len_field(2, len_field(1, b"values") + len_field(2, len_field(2, len_field(1, ml))))
    record = feat + lab
    i = record.index(mx)
    j = record.index(ml)
    parts = [record[:i], "x", record[i + len(mx):j], "label", record[j + 4:]]
    fills = {"x": x.view(np.uint8).reshape(n, -1), "label": label.view(np.uint8).reshape(n, 4)}
    return _template_rows(n, parts, fills), x, label


def _recordio_frames(payloads: np.ndarray) -> np.ndarray:
    """RecordIO frames of equal-length payloads: u32 magic | u32 length (cflag 0) | data | pad."""
    n, length = payloads.shape
    pad = -length & 3
    head = np.frombuffer((0xCED7230A).to_bytes(4, "little") + length.to_bytes(4, "little"),
                         dtype=np.uint8)
    frames = np.zeros((n, 8 + length + pad), dtype=np.uint8)
    frames[:, :8] = head
    frames[:, 8:8 + length] = payloads
    return frames


def make_workloads(cfg: BenchConfig, tmpdir: str) -> dict:
    rng = np.random.default_rng(SEED)
    out: dict = {}
    wanted = set(cfg.workloads)
    for name, count in (("examples", cfg.examples), ("pipeline", cfg.pipeline_records),
                        ("adapters", cfg.adapter_records)):
        if name not in wanted:
            continue
        payloads, _, _ = example_payloads(count, rng)
        frames = _tfrecord_frames(payloads)
        path = os.path.join(tmpdir, f"{name}.tfrecord")
        frames.tofile(path)
        meta = {"payload_bytes": payloads.shape[1], "framed_bytes": frames.shape[1]}
        if name == "adapters":  # the same records again, in part files
            bounds = np.linspace(0, count, ADAPTER_PARTS + 1).astype(int)
            meta["parts"] = []
            for k in range(ADAPTER_PARTS):
                part = os.path.join(tmpdir, f"{name}-part-{k}.tfrecord")
                frames[bounds[k]:bounds[k + 1]].tofile(part)
                meta["parts"].append(part)
        out[name] = Workload(name, path, count, frames.nbytes, meta)
    if "large" in wanted:
        from .formats.tfrecord import encode_tfrecord

        path = os.path.join(tmpdir, "large.tfrecord")
        block = rng.integers(0, 256, LARGE_RECORD_SIZE + 4096, dtype=np.uint8).tobytes()
        nbytes = 0
        with open(path, "wb") as f:
            for i in range(cfg.large_records):
                start = (i * 97) % 4096  # distinct records without generating 100 MB of randomness
                frame = encode_tfrecord(block[start:start + LARGE_RECORD_SIZE])
                f.write(frame)
                nbytes += len(frame)
        out["large"] = Workload("large", path, cfg.large_records, nbytes,
                                {"record_bytes": LARGE_RECORD_SIZE})
    if "csv" in wanted:
        path = os.path.join(tmpdir, "rows.csv")
        label = rng.integers(0, 10, cfg.csv_rows)
        feats = rng.standard_normal((cfg.csv_rows, CSV_FEATURES)).round(5)
        table = np.column_stack([label, feats])
        np.savetxt(path, table, fmt=["%d"] + ["%.5f"] * CSV_FEATURES, delimiter=",")
        out["csv"] = Workload("csv", path, cfg.csv_rows, os.stat(path).st_size,
                              {"columns": CSV_FEATURES + 1, "header": False})
    if "recordio" in wanted:
        payloads, _, _ = recordio_protobuf_payloads(cfg.recordio_rows, rng)
        frames = _recordio_frames(payloads)
        path = os.path.join(tmpdir, "dense.recordio")
        frames.tofile(path)
        out["recordio"] = Workload("recordio", path, cfg.recordio_rows, frames.nbytes,
                                   {"payload_bytes": payloads.shape[1],
                                    "features": RECORDIO_FEATURES})
    return out


# -- the streamio side ------------------------------------------------------------------------------
def _dataset_class():
    try:
        from .pipeline import Dataset
    except ImportError as exc:
        raise _Skip(f"streamio.pipeline.Dataset is not importable yet ({exc})") from None
    return Dataset


class _Skip(Exception):
    """A case cannot run at this stage of the project; the message says why."""


def _example_decoder():
    try:
        from .decoders import Example, FixedLen
    except ImportError as exc:
        raise _Skip(f"the Example decoder is not importable yet ({exc})") from None
    return Example({"x": FixedLen((EXAMPLE_FLOATS,), "float32"), "label": FixedLen((), "int64")})


def _csv_decoder():
    try:
        from .decoders import Csv
    except ImportError as exc:
        raise _Skip(f"the Csv decoder is not importable yet ({exc})") from None
    try:  # SageMaker's CSV convention: no header, label first; float32 features
        return Csv(label_column=0, dtype="float32")
    except (TypeError, ValueError) as exc:
        raise _Skip(f"could not build Csv(label_column=0, dtype='float32'): {exc}") from None


def _recordio_decoder():
    try:
        from .decoders import RecordIOProtobuf
    except ImportError as exc:
        raise _Skip(f"the RecordIOProtobuf decoder is not importable yet ({exc})") from None
    try:
        return RecordIOProtobuf()
    except TypeError as exc:
        raise _Skip(f"could not build a RecordIOProtobuf decoder: {exc}") from None


def _check_decoder(decoder: Any, workload: Workload, expect: Callable[[dict], int]) -> None:
    """Decode the first records of the workload once; skip the case if that does not work yet."""
    from .reader import read_records

    records = []
    for record in read_records(workload.path, _format_of(workload.name)):
        records.append(record)
        if len(records) == 8:
            break
    try:
        if callable(getattr(decoder, "fresh", None)):
            decoder = decoder.fresh()
        batch = decoder.decode_batch(records)
        rows = expect(batch)
    except Exception as exc:  # noqa: BLE001 - a decoder in progress may fail in any way
        raise _Skip(f"the decoder does not decode this workload yet: {type(exc).__name__}: {exc}")
    if rows != len(records):
        raise _Skip(f"the decoder returned {rows} rows for {len(records)} records")


def _format_of(workload: str) -> str:
    return {"examples": "tfrecord", "pipeline": "tfrecord", "adapters": "tfrecord",
            "large": "tfrecord", "csv": "csv", "recordio": "recordio"}[workload]


def _rows_of(batch: Any) -> int:
    if isinstance(batch, dict):
        first = next(iter(batch.values()))
        return len(first)
    if isinstance(batch, tuple):
        return len(batch[0])
    return len(batch)


def _count_batches(dataset: Any) -> int:
    n = 0
    for batch in dataset:
        n += _rows_of(batch)
    return n


def streamio_cases(cfg: BenchConfig, work: dict) -> list:
    """(case name, workload, runner name, input, consume(path) -> records, or a _Skip)."""
    from .reader import RecordReader, read_records

    cases: list = []
    bs = cfg.batch_size

    def skip_or(make: Callable[[], Callable[[str], int]]) -> Any:
        try:
            return make()
        except _Skip as exc:
            return exc

    def raw_reader(w: Workload) -> Callable[[str], int]:
        def run(path: str) -> int:
            fd = os.open(path, os.O_RDONLY)
            total = 0
            try:
                while True:
                    chunk = os.read(fd, READ_SIZE)
                    if not chunk:
                        break
                    total += len(chunk)
            finally:
                os.close(fd)
            if total != w.nbytes:
                raise RuntimeError(f"raw read got {total} bytes, expected {w.nbytes}")
            return w.records  # bytes only: counted as the workload's records for the table
        return run

    def raw_readinto(w: Workload) -> Callable[[str], int]:
        """The best raw read of a FIFO: readinto one reused 1 MiB buffer, the pipe grown to
        1 MiB (F_SETPIPE_SZ), as streamio's FIFO source does."""
        def run(path: str) -> int:
            import fcntl

            fd = os.open(path, os.O_RDONLY)
            total = 0
            view = memoryview(bytearray(READ_SIZE))
            try:
                try:
                    fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), READ_SIZE)
                except OSError:  # over /proc/sys/fs/pipe-max-size: read as the pipe is
                    pass
                while True:
                    n = os.readv(fd, [view])
                    if not n:
                        break
                    total += n
            finally:
                os.close(fd)
            if total != w.nbytes:
                raise RuntimeError(f"raw readinto got {total} bytes, expected {w.nbytes}")
            return w.records
        return run

    def count_read_records(path: str) -> int:
        n = 0
        for _ in read_records(path, "tfrecord"):
            n += 1
        return n

    if "examples" in work and "examples" in cfg.workloads:
        w = work["examples"]

        def examples_dataset():
            Dataset = _dataset_class()
            decoder = _example_decoder()
            _check_decoder(decoder, w, _rows_of)
            return lambda path: _count_batches(Dataset(path, "tfrecord", decoder=decoder).batch(bs))

        cases.append(("examples/streamio", w, "streamio Dataset.batch(256)", "fifo",
                      skip_or(examples_dataset)))
        cases.append(("examples/read_records", w, "streamio read_records (frames only)", "fifo",
                      count_read_records))
        cases.append(("examples/raw-read", w, "raw os.read(1 MiB) loop (bytes only)", "fifo",
                      raw_reader(w)))
    if "pipeline" in work:
        w = work["pipeline"]

        def bare():
            decoder = _example_decoder()
            _check_decoder(decoder, w, _rows_of)

            def run(path: str) -> int:
                n = 0
                pending: list = []
                for records in RecordReader(path, "tfrecord").record_lists():
                    if pending:
                        records = pending + records
                    stop = len(records) - len(records) % bs
                    for s in range(0, stop, bs):
                        n += _rows_of(decoder.decode_batch(records[s:s + bs]))
                    pending = records[stop:]
                if pending:
                    n += _rows_of(decoder.decode_batch(pending))
                return n
            return run

        def pipeline(prefetch: Any):
            def make():
                Dataset = _dataset_class()
                decoder = _example_decoder()
                _check_decoder(decoder, w, _rows_of)

                def run(path: str) -> int:
                    ds = Dataset(path, "tfrecord", decoder=decoder).shuffle(cfg.shuffle_buffer,
                                                                            seed=0).batch(bs)
                    return _count_batches(ds if prefetch is False else ds.prefetch(prefetch))
                return run
            return make

        def label(prefetch: Any) -> str:
            text = f"Dataset.shuffle({cfg.shuffle_buffer}).batch({bs})"
            if prefetch is False:
                return text
            return text + (".prefetch()" if prefetch is None else f".prefetch({prefetch})")

        cases.append(("pipeline/bare-decode", w, "RecordReader + decode_batch loop", "fifo",
                      skip_or(bare)))
        cases.append(("pipeline/shuffle-batch-prefetch", w, label(cfg.prefetch), "fifo",
                      skip_or(pipeline(cfg.prefetch))))
        cases.append(("pipeline/shuffle-batch-prefetch2", w, label(FIXED_PREFETCH), "fifo",
                      skip_or(pipeline(FIXED_PREFETCH))))
        cases.append(("pipeline/shuffle-batch", w, label(False), "fifo",
                      skip_or(pipeline(False))))
    if "adapters" in work:
        w = work["adapters"]

        def numpy_rate(parts: bool):
            def make():
                Dataset = _dataset_class()
                decoder = _example_decoder()
                _check_decoder(decoder, w, _rows_of)

                def run(path: str) -> int:
                    sources = w.meta["parts"] if parts else path
                    return _count_batches(Dataset(sources, "tfrecord", decoder=decoder).batch(bs))
                return run
            return make

        cases.append(("adapters/numpy", w, f"streamio Dataset.batch({bs}), numpy", "fifo",
                      skip_or(numpy_rate(False))))
        cases.append(("adapters/numpy-files", w,
                      f"streamio Dataset({ADAPTER_PARTS} files).batch({bs}), numpy", "file",
                      skip_or(numpy_rate(True))))
    if "large" in work:
        w = work["large"]
        cases.append(("large/streamio-read_records", w, "streamio read_records (CRCs verified)",
                      "fifo", count_read_records))
        cases.append(("large/raw-read", w, "raw os.read(1 MiB) loop", "fifo",
                      raw_reader(w)))
        cases.append(("large/raw-readinto", w, "raw readinto(1 MiB buffer), pipe 1 MiB", "fifo",
                      raw_readinto(w)))
    if "csv" in work:
        w = work["csv"]

        def csv_dataset():
            Dataset = _dataset_class()
            decoder = _csv_decoder()
            _check_decoder(decoder, w, _rows_of)
            return lambda path: _count_batches(Dataset(path, "csv", decoder=decoder).batch(bs))

        def pandas_reader():
            try:
                import pandas as pd
            except ImportError:
                raise _Skip("pandas is not installed (pip install pandas)") from None

            def run(path: str) -> int:
                n = 0
                for chunk in pd.read_csv(path, header=None, chunksize=cfg.pandas_chunksize,
                                         dtype=np.float32, engine="c"):
                    n += len(chunk.to_numpy(dtype=np.float32))
                return n
            return run

        cases.append(("csv/streamio", w, f"streamio Dataset(csv).batch({bs})", "fifo",
                      skip_or(csv_dataset)))
        cases.append(("csv/pandas", w, f"pandas.read_csv(chunksize={cfg.pandas_chunksize})",
                      "fifo", skip_or(pandas_reader)))
    if "recordio" in work:
        w = work["recordio"]

        def recordio_dataset():
            Dataset = _dataset_class()
            decoder = _recordio_decoder()
            _check_decoder(decoder, w, _rows_of)
            return lambda path: _count_batches(
                Dataset(path, "recordio", decoder=decoder).batch(bs))

        cases.append(("recordio/streamio", w, f"streamio Dataset(recordio protobuf).batch({bs})",
                      "fifo", skip_or(recordio_dataset)))
        cases.append(("recordio/read_records", w, "streamio read_records (frames only)", "fifo",
                      lambda path: sum(1 for _ in read_records(path, "recordio"))))
    return cases


# -- the peers' worker processes --------------------------------------------------------------------
def _peer_tf(op: dict) -> dict:
    import tensorflow as tf

    kind, path, bs = op["kind"], op["path"], op.get("batch_size", DEFAULT_BATCH_SIZE)
    if kind == "version":
        return {"version": tf.__version__}
    if kind in ("examples", "examples-autotune", "probe-fifo"):
        spec = {"x": tf.io.FixedLenFeature([EXAMPLE_FLOATS], tf.float32),
                "label": tf.io.FixedLenFeature([], tf.int64)}
        ds = tf.data.TFRecordDataset(path).batch(bs)
        if kind == "examples-autotune":
            ds = ds.map(lambda s: tf.io.parse_example(s, spec),
                        num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        else:
            ds = ds.map(lambda s: tf.io.parse_example(s, spec))
        n = 0
        for batch in ds:
            n += int(batch["label"].shape[0])
        return {"records": n}
    if kind in ("to_tf-step", "to_tf-graph", "native-step", "native-graph"):
        source, loop = kind.split("-")
        if source == "to_tf":
            from .pipeline import Dataset

            ds = Dataset(path, "tfrecord", decoder=_example_decoder()).batch(bs).to_tf()
        else:
            spec = {"x": tf.io.FixedLenFeature([EXAMPLE_FLOATS], tf.float32),
                    "label": tf.io.FixedLenFeature([], tf.int64)}
            ds = (tf.data.TFRecordDataset(path).batch(bs)
                  .map(lambda s: tf.io.parse_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE)
                  .prefetch(tf.data.AUTOTUNE))
        return {"records": _graph_loops(tf)[loop](ds)}
    if kind == "csv":
        defaults = [[0.0]] * op["columns"]
        ds = tf.data.TextLineDataset(path).batch(bs).map(
            lambda lines: tf.stack(tf.io.decode_csv(lines, record_defaults=defaults), axis=1))
        n = 0
        for batch in ds:
            n += int(batch.shape[0])
        return {"records": n}
    raise ValueError(f"unknown tf op {kind!r}")


_LOOPS: dict = {}


def _graph_loops(tf: Any) -> dict:
    """The two graph-mode consumers (see the module doc), traced once per worker process."""
    if _LOOPS:
        return _LOOPS

    @tf.function
    def step(iterator: Any) -> Any:  # what model.fit runs per step (steps_per_execution=1)
        batch = next(iterator)
        return tf.shape(batch["label"], out_type=tf.int64)[0], tf.reduce_sum(batch["x"])

    def step_loop(ds: Any) -> int:
        iterator, counts = iter(ds), []
        while True:
            try:
                n, _ = step(iterator)
            except (tf.errors.OutOfRangeError, StopIteration):
                break
            counts.append(n)  # no sync per step, as fit without per-batch callbacks
        return int(tf.add_n(counts)) if counts else 0

    @tf.function
    def graph_loop(ds: Any) -> Any:  # the whole epoch inside one tf.function
        n = tf.constant(0, tf.int64)
        total = tf.constant(0.0)
        for batch in ds:
            n += tf.shape(batch["label"], out_type=tf.int64)[0]
            total += tf.reduce_sum(batch["x"])
        return n

    _LOOPS.update(step=step_loop, graph=lambda ds: int(graph_loop(ds)))
    return _LOOPS


def _peer_tfrecord(op: dict) -> dict:
    from tfrecord.reader import tfrecord_loader

    kind, path, bs = op["kind"], op["path"], op.get("batch_size", DEFAULT_BATCH_SIZE)
    if kind == "version":
        import tfrecord

        return {"version": getattr(tfrecord, "__version__", "?")}
    if kind in ("examples", "probe-fifo"):
        n = 0
        xs: list = []
        labels: list = []
        for ex in tfrecord_loader(path, None, {"x": "float", "label": "int"}):
            xs.append(ex["x"])
            labels.append(ex["label"])
            if len(xs) == bs:  # batches of bs, as float32 / int64 arrays
                np.stack(xs), np.concatenate(labels)
                n += bs
                xs, labels = [], []
        if xs:
            np.stack(xs), np.concatenate(labels)
            n += len(xs)
        return {"records": n}
    raise ValueError(f"unknown tfrecord op {kind!r}")


def _peer_torch(op: dict) -> dict:
    import torch

    from .pipeline import Dataset

    kind, bs = op["kind"], op.get("batch_size", DEFAULT_BATCH_SIZE)
    if kind == "version":
        return {"version": torch.__version__}
    if kind == "to_torch":
        ds = Dataset(op["parts"], "tfrecord", decoder=_example_decoder()).batch(bs)
        loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None,
                                             num_workers=op["num_workers"])
        n = 0
        for batch in loader:
            n += int(batch["label"].shape[0])
        return {"records": n}
    raise ValueError(f"unknown torch op {kind!r}")


_PEERS = {"tf": _peer_tf, "tfrecord": _peer_tfrecord, "torch": _peer_torch}


def _worker_main() -> None:
    """A peer worker: one JSON command per line on stdin, one JSON reply per line."""
    which = sys.argv[1]
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # anything the peer prints goes to stderr, never into the replies
    replies = os.fdopen(reply_fd, "w", buffering=1)
    run = _PEERS[which]
    for line in sys.stdin:
        op = json.loads(line)
        _reset_peak_rss()
        t0 = time.perf_counter()
        try:
            out = run(op)
            out["seconds"] = time.perf_counter() - t0
            out["peak_rss_mib"] = _peak_rss_mib()
            out["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which prints it
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()[:2000],
                   "seconds": time.perf_counter() - t0}
        replies.write(json.dumps(out) + "\n")


class PeerWorker:
    """A long-lived worker process for one peer (``tf`` or ``tfrecord``)."""

    def __init__(self, which: str, timeout: float) -> None:
        self.which = which
        self.timeout = timeout
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        code = "import sys; from streamio.bench import _worker_main; _worker_main()"
        fd, self.stderr_path = tempfile.mkstemp(prefix=f"streamio-bench-{which}-", suffix=".log")
        with os.fdopen(fd, "wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-c", code, which],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=env)

    def call(self, op: dict, timeout: Optional[float] = None) -> dict:
        if self.proc.poll() is not None:
            return {"ok": False, "error": f"{self.which} worker exited: {self._stderr_tail()}"}
        try:
            self.proc.stdin.write((json.dumps(op) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"ok": False, "error": f"{self.which} worker exited: {self._stderr_tail()}"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout or self.timeout)
        if not ready:
            self.restart()
            return {"ok": False, "error": f"no answer within {timeout or self.timeout:g} s"
                                          " (worker restarted)"}
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"{self.which} worker died: {self._stderr_tail()}"}
        return json.loads(line)

    def _stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode(errors="replace")[-1500:].strip()
        except OSError:
            return "(no stderr)"

    def restart(self) -> None:
        self.close()
        self.__init__(self.which, self.timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


def _module_available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def peer_cases(cfg: BenchConfig, work: dict) -> list:
    """(case name, workload, runner, input, (worker, op) or a _Skip)."""
    cases: list = []
    if not cfg.peers:
        return cases
    tf_ok = _module_available("tensorflow") or _Skip("tensorflow is not installed")
    tfr_ok = _module_available("tfrecord") or _Skip("the tfrecord package is not installed")
    bs = cfg.batch_size
    if "examples" in work and "examples" in cfg.workloads:
        w = work["examples"]
        cases.append(("examples/tf.data", w, f"tf.data TFRecordDataset.batch({bs}).map(parse_example)",
                      "file", ("tf", {"kind": "examples"}) if tf_ok is True else tf_ok))
        cases.append(("examples/tf.data-autotune", w,
                      "tf.data ... .map(parse_example, AUTOTUNE).prefetch(AUTOTUNE)", "file",
                      ("tf", {"kind": "examples-autotune"}) if tf_ok is True else tf_ok))
        cases.append(("examples/tfrecord-pkg", w, f"tfrecord package loader + np.stack({bs})",
                      "file", ("tfrecord", {"kind": "examples"}) if tfr_ok is True else tfr_ok))
    if "adapters" in work:
        w = work["adapters"]
        torch_ok = _module_available("torch") or _Skip("torch is not installed")
        tf_or = (lambda op: ("tf", op)) if tf_ok is True else (lambda op: tf_ok)
        native = f"tf.data TFRecordDataset.batch({bs}).map(parse_example, AUTOTUNE).prefetch"
        for loop in ("graph", "step"):
            cases.append((f"adapters/to_tf-{loop}", w, f"streamio to_tf(), {loop} loop", "fifo",
                          tf_or({"kind": f"to_tf-{loop}"})))
            cases.append((f"adapters/tf.data-{loop}", w, f"{native}, {loop} loop", "file",
                          tf_or({"kind": f"native-{loop}"})))
        for workers in (0, 2):
            op = {"kind": "to_torch", "num_workers": workers, "parts": w.meta["parts"]}
            cases.append((f"adapters/to_torch-w{workers}", w,
                          f"streamio to_torch(), DataLoader(num_workers={workers}),"
                          f" {ADAPTER_PARTS} files", "file",
                          ("torch", op) if torch_ok is True else torch_ok))
    if "csv" in work:
        w = work["csv"]
        cases.append(("csv/tf.data", w, f"tf.data TextLineDataset.batch({bs}).map(decode_csv)",
                      "file", ("tf", {"kind": "csv", "columns": CSV_FEATURES + 1})
                      if tf_ok is True else tf_ok))
    return cases


# -- running ------------------------------------------------------------------------------------------
def _machine() -> dict:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"nproc": os.cpu_count(), "cpu": model, "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            info["pipe_max_size"] = int(f.read())
    except (OSError, ValueError):
        pass
    try:
        from . import _speedups  # type: ignore

        info["speedups"] = True
        info["hardware_crc32c"] = bool(_speedups.HARDWARE_CRC32C)
    except ImportError:
        info["speedups"] = False
    try:
        import pandas

        info["pandas"] = pandas.__version__
    except ImportError:
        pass
    return info


def _log(cfg: BenchConfig, message: str) -> None:
    if cfg.verbose:
        print(message, file=sys.stderr, flush=True)


def _probe_fifo(worker: PeerWorker, src: str, tmpdir: str, timeout: float) -> str:
    """Try a peer on a FIFO once; return what happened (normally the error text)."""
    feed = FifoFeed(src, tmpdir)
    try:
        reply = worker.call({"kind": "probe-fifo", "path": feed.path}, timeout=timeout)
    finally:
        feed.unblock()
        feed.proc.kill()
        feed.close()
    if reply.get("ok"):
        return f"read {reply.get('records')} records from the FIFO (no error)"
    return reply.get("error", "?")


def run_benchmark(cfg: BenchConfig) -> dict:
    """Run every case for ``cfg.rounds`` rounds, alternating; return the results as a dict."""
    own_tmp = cfg.tmpdir is None
    tmpdir = tempfile.mkdtemp(prefix="streamio-bench-") if own_tmp else cfg.tmpdir
    os.makedirs(tmpdir, exist_ok=True)
    workers: dict = {}
    try:
        t0 = time.perf_counter()
        work = make_workloads(cfg, tmpdir)
        _log(cfg, f"generated {', '.join(f'{w.name} ({w.records} records, {w.nbytes / 1e6:.1f} MB)' for w in work.values())}"
                  f" in {time.perf_counter() - t0:.1f} s under {tmpdir}")
        specs = streamio_cases(cfg, work) + peer_cases(cfg, work)
        results: dict = {}
        runnable = []
        for name, w, runner, kind, how in specs:
            where = how[0] if isinstance(how, tuple) else "streamio"
            res = CaseResult(name, name.split("/")[0], runner, kind, where)
            results[name] = res
            if isinstance(how, _Skip):
                res.skipped = str(how)
                _log(cfg, f"skip {name}: {how}")
            else:
                runnable.append((name, w, kind, how))
        notes = [
            "TensorFlow, torch and the tfrecord package run in their own worker processes;"
            " streamio and pandas run in the main process, which never imports TensorFlow or"
            " torch. The adapters' to_tf() and to_torch() cases run in the TensorFlow and torch"
            " workers (to_tf() reading a FIFO fed as the main process's are).",
            "FIFO inputs are fed by a separate writer process (os.open on the FIFO, then"
            " sendfile of the file) started fresh for every measurement.",
            "Each round runs every case once, in alternating order (reversed on odd rounds);"
            " figures are medians over the rounds. A target's ratio is the median of the rounds'"
            " own ratios (both sides run in the same round), which a drift in the machine's"
            " speed does not skew; the ratio of the medians is shown beside it.",
            "peak_rss_mib is the process's VmHWM, reset before each measurement (for workers:"
            " the worker process, TensorFlow's runtime included).",
        ]
        versions: dict = {}
        fifo_errors: dict = {}
        for which in sorted({how[0] for _, _, _, how in runnable if isinstance(how, tuple)}):
            workers[which] = PeerWorker(which, cfg.peer_timeout)
            reply = workers[which].call({"kind": "version", "path": ""})
            versions[which] = reply.get("version") or reply.get("error")
        if "examples" in work:
            for which, label in (("tf", "tf.data TFRecordDataset"), ("tfrecord", "tfrecord package")):
                if which in workers:
                    fifo_errors[label] = _probe_fifo(workers[which], work["examples"].path, tmpdir,
                                                     timeout=60)
                    _log(cfg, f"{label} on a FIFO: {fifo_errors[label]}")
        baseline_rss = _rss_mib()  # this process before any measurement: the fixed part
        for rnd in range(cfg.rounds):
            order = runnable if rnd % 2 == 0 else runnable[::-1]
            for name, w, kind, how in order:
                res = results[name]
                if res.error:
                    continue
                if isinstance(how, tuple):
                    which, op = how
                    # Peers read files (they cannot read a FIFO); streamio's adapters, which
                    # run in the same workers, read a FIFO fed as for this process's cases.
                    feed = FifoFeed(w.path, tmpdir) if kind == "fifo" else None
                    reply: dict = {}
                    try:
                        reply = workers[which].call(dict(op, path=feed.path if feed else w.path,
                                                         batch_size=cfg.batch_size))
                    finally:
                        if feed:
                            if not reply.get("ok"):
                                feed.unblock()  # a writer still waiting in open() can finish
                            feed.close()
                    if not reply.get("ok"):
                        res.error = reply.get("error")
                        _log(cfg, f"round {rnd + 1}: {name} failed: {res.error}")
                        continue
                    m = Measurement(reply["records"], reply["seconds"], w.nbytes,
                                    reply.get("peak_rss_mib"))
                else:
                    try:
                        m = _measure_here(how, w.path, w.nbytes,
                                          w.path if kind == "fifo" else None, tmpdir)
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        res.error = f"{type(exc).__name__}: {exc}"
                        _log(cfg, f"round {rnd + 1}: {name} failed: {res.error}")
                        if cfg.verbose:
                            traceback.print_exc()
                        continue
                if m.records != w.records:
                    res.error = f"counted {m.records} records, expected {w.records}"
                res.rounds.append(asdict(m))
                _log(cfg, f"round {rnd + 1}: {name:34s} {m.seconds:7.3f} s"
                          f" {m.records / m.seconds:>13,.0f} rec/s {m.nbytes / m.seconds / 1e6:9,.1f} MB/s")
        report = _report(cfg, work, results, fifo_errors, versions, notes)
        report["baseline_rss_mib"] = baseline_rss
        return report
    finally:
        for worker in workers.values():
            worker.close()
        if own_tmp and not cfg.keep:
            shutil.rmtree(tmpdir, ignore_errors=True)


#: The workload sizes the targets are set for (a run with any of them smaller is not judged).
_FULL_SIZES = {"examples": DEFAULT_EXAMPLES, "pipeline_records": DEFAULT_PIPELINE_RECORDS,
               "adapter_records": DEFAULT_ADAPTER_RECORDS,
               "large_records": DEFAULT_LARGE_RECORDS, "csv_rows": DEFAULT_CSV_ROWS,
               "recordio_rows": DEFAULT_RECORDIO_ROWS}


def full_scale(cfg: BenchConfig) -> bool:
    """Whether every workload is at least its default size, so the targets apply."""
    return all(getattr(cfg, name) >= size for name, size in _FULL_SIZES.items())


def _report(cfg: BenchConfig, work: dict, results: dict, fifo_errors: dict, versions: dict,
            notes: list) -> dict:
    cases = []
    for res in results.values():
        entry = {"case": res.case, "workload": res.workload, "runner": res.runner,
                 "input": res.input, "process": res.process, "rounds": res.rounds}
        entry.update(res.medians())
        if res.skipped:
            entry["skipped"] = res.skipped
        if res.error:
            entry["error"] = res.error
        cases.append(entry)
    by_name = {c["case"]: c for c in cases}
    ratios = []
    for label, num, den, target, unit in TARGETS:
        a = by_name.get(num, {})
        if den is None:
            value = a.get("records_per_s")
            of_medians = None
        else:
            b = by_name.get(den, {})
            by_bytes = num.endswith("read_records") and den.endswith("raw-read")  # bytes/s
            key = "mb_per_s" if by_bytes else "records_per_s"
            va, vb = a.get(key), b.get(key)
            of_medians = va / vb if va and vb else None
            # The median of the rounds' own ratios: each round runs both sides back to back, so
            # a drift in the machine's speed (a noisy neighbour on a VM) cancels out.
            value = _paired_ratio(a.get("rounds"), b.get("rounds"), by_bytes) if of_medians else None
        met = None if value is None or target is None or not full_scale(cfg) else value >= target
        ratios.append({"name": label, "value": value, "target": target, "unit": unit, "met": met,
                       "ratio_of_medians": of_medians})
    return {
        "machine": _machine(),
        "peers": versions,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("verbose",)},
        "workloads": {k: asdict(v) for k, v in work.items()},
        "cases": cases,
        "ratios": ratios,
        "full_scale": full_scale(cfg),
        "fifo_errors": fifo_errors,
        "notes": notes,
    }


def _paired_ratio(rounds_a: Optional[list], rounds_b: Optional[list], by_bytes: bool
                  ) -> Optional[float]:
    """The median over rounds of side a's rate divided by side b's in the same round."""
    if not rounds_a or not rounds_b:
        return None
    key = "nbytes" if by_bytes else "records"
    pairs = [(ra[key] / ra["seconds"]) / (rb[key] / rb["seconds"])
             for ra, rb in zip(rounds_a, rounds_b) if ra["seconds"] > 0 and rb["seconds"] > 0]
    return statistics.median(pairs) if pairs else None


def format_table(report: dict) -> str:
    m = report["machine"]
    lines = [f"machine: {m.get('cpu')}, {m.get('nproc')} CPUs, Python {m.get('python')},"
             f" numpy {m.get('numpy')}, C speedups: {m.get('speedups')}"
             f" (hardware CRC-32C: {m.get('hardware_crc32c')})"]
    if report.get("peers"):
        lines.append("peers: " + ", ".join(f"{k} {v}" for k, v in report["peers"].items()))
    if report.get("baseline_rss_mib"):
        lines.append(f"streamio process RSS before the measurements: {report['baseline_rss_mib']:.0f} MiB"
                     " (peak RSS below includes it)")
    lines.append("")
    head = f"{'case':34s} {'input':5s} {'median s':>9s} {'records/s':>13s} {'MB/s':>9s} {'peak RSS':>9s}  runner"
    lines.append(head)
    lines.append("-" * len(head))
    for c in report["cases"]:
        if c.get("skipped"):
            lines.append(f"{c['case']:34s} {c['input']:5s} skipped: {c['skipped']}")
            continue
        if "median_s" not in c:
            lines.append(f"{c['case']:34s} {c['input']:5s} failed: {c.get('error')}")
            continue
        rss = f"{c['peak_rss_mib']:7.0f}Mi" if c.get("peak_rss_mib") else "        ?"
        lines.append(f"{c['case']:34s} {c['input']:5s} {c['median_s']:9.3f} {c['records_per_s']:13,.0f}"
                     f" {c['mb_per_s']:9,.1f} {rss}  {c['runner']}"
                     + (f"  [error: {c['error']}]" if c.get("error") else ""))
    lines.append("")
    if report.get("full_scale", True):
        lines.append("targets:")
    else:
        lines.append("targets (they apply at full scale; this run is scaled down, so none is"
                     " judged):")
    for r in report["ratios"]:
        if r["value"] is None:
            lines.append(f"  {r['name']:52s} n/a (a side was skipped or failed)")
            continue
        if r["unit"] == "rec/s":
            value = f"{r['value']:,.0f} rec/s"
            target = f">= {r['target']:,.0f} rec/s" if r["target"] else ""
        else:
            value = f"{r['value']:.3f}x"  # 3 places: 1/1.1 is 0.909, not 0.91
            target = f">= {r['target']:.3f}x" if r["target"] else "(no target)"
        verdict = "" if r["met"] is None else ("  MET" if r["met"] else "  NOT MET")
        also = (f"  (ratio of medians {r['ratio_of_medians']:.2f}x)"
                if r.get("ratio_of_medians") else "")
        lines.append(f"  {r['name']:52s} {value:>16s}  {target}{verdict}{also}")
    if report.get("fifo_errors"):
        lines.append("")
        lines.append("peers on a FIFO (tried once):")
        for k, v in report["fifo_errors"].items():
            lines.append(f"  {k}: {v}")
    lines.append("")
    lines.extend(f"note: {n}" for n in report["notes"])
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamio bench",
        description="Benchmark streamio against tf.data, the tfrecord package, pandas and raw"
                    " read() on the same bytes streamed through named pipes.")
    p.add_argument("--rounds", type=_positive, default=DEFAULT_ROUNDS,
                   help=f"rounds per case; medians are reported (default {DEFAULT_ROUNDS})")
    p.add_argument("--pipeline-records", type=_positive, default=DEFAULT_PIPELINE_RECORDS,
                   help=f"tf.train.Example records of the pipeline case (default {DEFAULT_PIPELINE_RECORDS})")
    p.add_argument("--adapter-records", type=_positive, default=DEFAULT_ADAPTER_RECORDS,
                   help="tf.train.Example records of the adapters case"
                        f" (default {DEFAULT_ADAPTER_RECORDS})")
    p.add_argument("--examples", type=_positive, default=DEFAULT_EXAMPLES,
                   help=f"tf.train.Example records (default {DEFAULT_EXAMPLES})")
    p.add_argument("--large-records", type=_positive, default=DEFAULT_LARGE_RECORDS,
                   help=f"100 KB TFRecords (default {DEFAULT_LARGE_RECORDS})")
    p.add_argument("--csv-rows", type=_positive, default=DEFAULT_CSV_ROWS,
                   help=f"CSV rows of 17 columns (default {DEFAULT_CSV_ROWS})")
    p.add_argument("--recordio-rows", type=_positive, default=DEFAULT_RECORDIO_ROWS,
                   help=f"RecordIO-protobuf rows of 128 floats (default {DEFAULT_RECORDIO_ROWS})")
    p.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--shuffle-buffer", type=_positive, default=DEFAULT_SHUFFLE_BUFFER)
    p.add_argument("--pandas-chunksize", type=_positive, default=DEFAULT_PANDAS_CHUNKSIZE)
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}; or 'images', 'ranges' or 'resume' alone for"
                        " those benchmarks (their options: --workloads NAME --help)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every workload size (0.1 for a quick smoke run)")
    p.add_argument("--no-peers", action="store_true", help="run only the streamio side")
    p.add_argument("--peer-timeout", type=float, default=DEFAULT_PEER_TIMEOUT,
                   help="seconds one peer measurement may take")
    p.add_argument("--tmpdir", help="where to write the workloads (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


#: Workloads with options of their own, run alone: ``--workloads images|ranges|resume --help``
#: (and ``ray``: streamio on Ray Data, in a private network namespace).
SEPARATE_WORKLOADS = ("images", "ranges", "resume", "ray")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark from command-line arguments; print the table; 0 on success."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        name = (arg.split("=", 1)[1] if arg.startswith("--workloads=")
                else argv[i + 1] if arg == "--workloads" and i + 1 < len(argv) else None)
        if name in SEPARATE_WORKLOADS:
            # These benchmarks have options of their own: each is its own module.
            import importlib

            module = importlib.import_module(f"streamio.bench_{name}")
            return module.main(argv[:i] + argv[i + (1 if "=" in arg else 2):])
    args = build_parser().parse_args(argv)
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        build_parser().error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.scale <= 0:
        build_parser().error("--scale must be positive")

    def scaled(n: int) -> int:
        return max(1, int(n * args.scale))

    cfg = BenchConfig(rounds=args.rounds, examples=scaled(args.examples),
                      pipeline_records=scaled(args.pipeline_records),
                      adapter_records=scaled(args.adapter_records),
                      large_records=scaled(args.large_records), csv_rows=scaled(args.csv_rows),
                      recordio_rows=scaled(args.recordio_rows), batch_size=args.batch_size,
                      shuffle_buffer=args.shuffle_buffer, pandas_chunksize=args.pandas_chunksize,
                      workloads=workloads, peers=not args.no_peers, tmpdir=args.tmpdir,
                      keep=args.keep, json_path=args.json_path, peer_timeout=args.peer_timeout,
                      verbose=not args.quiet)
    report = run_benchmark(cfg)
    print(format_table(report))
    if cfg.json_path:
        with open(cfg.json_path, "w") as f:
            json.dump(report, f, indent=2, default=str)
            f.write("\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

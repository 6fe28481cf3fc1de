"""The benchmark's defaults, its targets, and the records of a configuration and a result."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional


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
# pandas' per-chunk overhead is large: 65,536 rows a chunk ran faster than 8,192 on the CSV
# workload (0.203 s against 0.222 s), and is what the CSV target is judged by.
DEFAULT_PANDAS_CHUNKSIZE = 65_536
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

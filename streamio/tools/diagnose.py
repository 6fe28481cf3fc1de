"""``streamio diagnose``: where does the input time go, and what would help?

:func:`diagnose` runs a Dataset twice, each run bounded in time: once alone (how fast can the
input go?) and once under a training step (the user's ``step``, or a GIL-releasing sleep of
``step_ms`` per batch), and, for a PyTorch user, again through ``DataLoader(num_workers=k)`` for
each ``k`` asked. From the pipeline's own counters (``Dataset.stats()``), the clock around each
``next()``, the process's CPU time and the machine's per-core busy time, it reports per stage:
time to first batch, source wait (I/O), decode, the rest of the pipeline (framing, shuffle, batch,
together), how long the step waited for data, CPU use; and names the bottleneck in the terms of
the input-pipeline guides:

* **start-up-bound**: the first batch takes most of the run (downloading, opening, filling a
  shuffle buffer);
* **consumer-bound**: the step rarely waits (< 10% of the time): the input is fine;
* **I/O-bound**: the source cannot deliver faster (source wait dominates the input time);
* **decode-bound** (CPU-bound): framing and decoding dominate: add parallel decoders or
  DataLoader workers; the report estimates the gain.

Each run reads at most ``seconds / 2`` of data (a long epoch is cut short, which is fine for
rates). The Dataset must be re-iterable (files, URLs, a :class:`~streamio.PipeChannel`, whose
every run reads the next epoch's FIFO): a plain FIFO, stdin or a file object cannot be read twice,
and is refused with a :class:`~streamio.errors.UsageError` before anything is read.

CPU use is the process's CPU time (``time.process_time``, all its threads) over the same span as
the run's wall time, so it never exceeds the cores the process may use (``os.times``, in clock
ticks of 10 ms, reported 9.95 cores for a 1 ms run on 2 cores).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..errors import UsageError

#: Below this share of the time spent waiting for data, the input keeps up.
CONSUMER_BOUND_WAIT = 0.10
#: A first batch that takes this share of a run (and at least START_UP_MIN_S) dominates it.
START_UP_SHARE = 0.5
START_UP_MIN_S = 1.0


@dataclass
class RunFigures:
    """One timed pass over the input. Times in seconds; ``timeline`` is (wait, step) per batch."""

    name: str
    seconds: float = 0.0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    first_batch_s: Optional[float] = None
    first_batch_decode_s: float = 0.0  # decode time spent before the first batch arrived
    source_wait_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0
    step_s: float = 0.0
    cpu_process: float = 0.0  # process CPU seconds / wall seconds (1.0 = one core busy)
    cpu_per_core: list = field(default_factory=list)  # machine busy share per core
    timeline: list = field(default_factory=list)
    #: Processes that read the input (DataLoader workers): source wait and decode are their
    #: sums, shown as a share of ``readers * seconds``.
    readers: int = 1
    #: Whether the pipeline's counters (bytes, source wait, decode) were reported for this run;
    #: the table shows n/a where they were not.
    counted: bool = True

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Diagnosis:
    """The runs, the verdict (``bottleneck``: ``"start-up"``, ``"consumer"``, ``"io"`` or
    ``"decode"``), the reasons and the suggested change."""

    alone: RunFigures
    with_step: RunFigures
    workers: list = field(default_factory=list)
    bottleneck: str = ""
    explanation: str = ""
    suggestion: str = ""
    source_limit_mb_s: Optional[float] = None
    #: The most threads or processes a ``map()`` of the pipeline already runs on (1: none).
    map_parallelism: int = 1
    #: The DataLoader ``num_workers`` that delivered the most under the step, when worker counts
    #: were measured (0: the main process itself), and why.
    num_workers: Optional[int] = None
    num_workers_reason: str = ""

    def __str__(self) -> str:
        """The report: :meth:`table` (``print(streamio.diagnose(ds))``)."""
        return self.table()

    def to_dict(self) -> dict:
        out = asdict(self)
        for run in [out["alone"], out["with_step"], *out["workers"]]:
            run.pop("timeline", None)
        return out

    def table(self) -> str:
        runs = [self.alone, self.with_step, *self.workers]
        rows = [
            ("records/s", lambda r: f"{r.records_per_s:,.0f}"),
            ("MB/s read", lambda r: "n/a" if not r.counted else
             f"{r.bytes / r.seconds / 1e6:,.1f}" if r.seconds else "-"),
            ("first batch", lambda r: "-" if r.first_batch_s is None
             else f"{r.first_batch_s * 1000:,.0f} ms"),
            ("source wait (I/O)", lambda r: _counted(r, r.source_wait_s)),
            ("decode", lambda r: _counted(r, r.decode_s)),
            # Alone, the whole pipeline runs inside next(): what is neither I/O nor decode.
            ("framing+shuffle+batch", lambda r: _share(
                max(0.0, r.seconds - r.source_wait_s - r.decode_s), r.seconds)
             if r.name == "input alone" else "-"),
            ("consumer waited for data", lambda r: _share(r.wait_s, r.seconds)),
            ("process CPU (cores)", lambda r: f"{r.cpu_process:.2f}"),
            ("per-core busy", lambda r: " ".join(f"{c:.0%}" for c in r.cpu_per_core) or "-"),
        ]
        width = max(len(name) for name, _ in rows) + 2
        cols = [r.name for r in runs]
        colw = max(14, *(len(c) + 2 for c in cols))
        lines = [" " * width + "".join(c.rjust(colw) for c in cols)]
        for name, fmt in rows:
            lines.append(name.ljust(width) + "".join(fmt(r).rjust(colw) for r in runs))
        if self.source_limit_mb_s is not None:
            lines.append(f"raw read of the same files: {self.source_limit_mb_s:,.1f} MB/s")
        if self.num_workers is not None:
            lines.append(f"DataLoader: num_workers={self.num_workers} ({self.num_workers_reason})")
        lines.append("")
        lines.append(f"bottleneck: {self.bottleneck}-bound. {self.explanation}")
        lines.append(f"suggestion: {self.suggestion}")
        return "\n".join(lines)

    def plot(self, path: str) -> bool:
        """A PNG timeline of wait vs step per batch (needs matplotlib); False without it."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return False
        waits = [w * 1000 for w, _ in self.with_step.timeline]
        steps = [s * 1000 for _, s in self.with_step.timeline]
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.bar(range(len(steps)), steps, label="step", color="tab:green")
        ax.bar(range(len(waits)), waits, bottom=steps, label="waited for data", color="tab:red")
        ax.set_xlabel("batch")
        ax.set_ylabel("ms")
        ax.set_title(f"{self.bottleneck}-bound")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return True


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%} ({part:,.2f} s)" if whole > 0 else "-"


def _counted(run: RunFigures, part: float) -> str:
    """``part`` (summed over the run's readers) as a share of their time, or n/a."""
    return _share(part, run.seconds * run.readers) if run.counted else "n/a"


def _cpu_ticks() -> list:
    """[(busy, total)] per core from /proc/stat (empty where there is none)."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3] != " "]
    except OSError:
        return []
    out = []
    for parts in lines:
        values = [int(v) for v in parts[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        out.append((sum(values) - idle, sum(values)))
    return out


def _rows(item: Any) -> int:
    if isinstance(item, dict):
        for value in item.values():
            return int(getattr(value, "shape", [len(value)])[0])
        return 0
    if isinstance(item, (list, tuple)):
        return len(item)
    return 1


def _timed_run(name: str, iterable: Any, *, seconds: float, step: Optional[Callable],
               stats: Optional[Callable[[], dict]], readers: int = 1) -> RunFigures:
    """``stats()`` gives the counters of the run's epoch, or None when it has none to give."""
    fig = RunFigures(name, readers=readers)
    clock = time.perf_counter
    ticks0 = _cpu_ticks()
    start = clock()
    cpu0 = time.process_time()  # inside the wall span: CPU / wall <= the cores used
    it = iter(iterable)
    try:
        while True:
            before = clock()
            try:
                item = next(it)
            except StopIteration:
                break
            got = clock()
            fig.wait_s += got - before
            if fig.first_batch_s is None:
                fig.first_batch_s = got - start
                if stats is not None:  # a first batch can wait on a whole block's decoding
                    fig.first_batch_decode_s = float((stats() or {}).get("decode_s", 0.0))
            fig.batches += 1
            fig.records += _rows(item)
            spent = 0.0
            if step is not None:
                step(item)
                spent = clock() - got
                fig.step_s += spent
            fig.timeline.append((got - before, spent))
            elapsed = clock() - start
            # Past the time asked, stop once the run has counters to show (DataLoader workers
            # publish theirs every second: a slow start must not leave the run without them).
            if elapsed >= seconds and (stats is None or elapsed >= 3 * seconds
                                       or stats() is not None):
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    cpu1 = time.process_time()
    fig.seconds = clock() - start
    ticks1 = _cpu_ticks()
    fig.cpu_process = (cpu1 - cpu0) / fig.seconds
    fig.cpu_per_core = [(b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
                        for (b0, t0), (b1, t1) in zip(ticks0, ticks1)]
    s = None if stats is None else stats()
    fig.counted = s is not None
    if s is not None:
        fig.bytes = int(s.get("bytes", 0))
        fig.source_wait_s = float(s.get("source_wait_s", 0.0))
        fig.decode_s = float(s.get("decode_s", 0.0)) + float(s.get("map_s", 0.0) or 0.0)
    return fig


def _raw_read_rate(ds: Any, seconds: float) -> Optional[float]:
    """MB/s of plain reads of the Dataset's files, where they are regular files."""
    paths = []
    for source in getattr(ds, "sources", ()):
        if not isinstance(source, (str, os.PathLike)):
            return None
        path = os.fspath(source)
        if "://" in path or not os.path.isfile(path):
            return None
        paths.append(path)
    if not paths:
        return None
    buf = bytearray(1 << 20)
    total = 0
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
                if time.perf_counter() - start > seconds:
                    break
    elapsed = time.perf_counter() - start
    return total / elapsed / 1e6 if elapsed > 0 else None


def _verdict(d: Diagnosis, step_per_batch: float, cores: Optional[int] = None) -> None:
    alone, loaded = d.alone, d.with_step
    if not alone.batches:
        d.bottleneck, d.explanation = "start-up", "no batch arrived within the time allowed."
        d.suggestion = "check that the source delivers data (run `streamio count` on it)."
        return
    # Decoding before the first batch is decode time, not start-up.
    first = max(0.0, (alone.first_batch_s or 0.0) - alone.first_batch_decode_s)
    if first >= START_UP_MIN_S and first >= START_UP_SHARE * alone.seconds:
        d.bottleneck = "start-up"
        d.explanation = (f"the first batch took {first:,.1f} s of a {alone.seconds:,.1f} s run"
                         " (opening, downloading or filling a shuffle buffer).")
        d.suggestion = ("start reading sooner: a smaller shuffle buffer or shuffle(initial=...),"
                        " stream instead of downloading (Pipe/FastFile mode, HTTP), or"
                        " prefetch() so the first batches overlap start-up.")
        return
    if loaded.wait_share < CONSUMER_BOUND_WAIT:
        d.bottleneck = "consumer"
        d.explanation = (f"the step waited for data {loaded.wait_share:.0%} of the time: the"
                         " input keeps up.")
        d.suggestion = ("nothing to gain in the input pipeline; speed up the step (a larger"
                        " batch, mixed precision, a faster model or device).")
        return
    input_per_batch = alone.seconds / alone.batches
    io = alone.source_wait_s / alone.seconds
    cpu_share = 1.0 - io
    if io >= 0.5 or (io > 0.25 and alone.source_wait_s > alone.decode_s):
        d.bottleneck = "io"
        rate = alone.bytes / alone.seconds / 1e6
        limit = ("" if d.source_limit_mb_s is None
                 else f"; plain reads of the same files give {d.source_limit_mb_s:,.1f} MB/s")
        d.explanation = (f"the pipeline waited on the source {io:.0%} of its time; it delivered"
                         f" {rate:,.1f} MB/s{limit}.")
        d.suggestion = ("read several sources at once (more shards, DataLoader workers over"
                        " different files), move the data closer (local disk, FastFile/Pipe"
                        " from S3 in the same region), or store it compressed (gzip reads fewer"
                        " bytes when the link, not the CPU, is the limit).")
        return
    cores = max(1, cores or os.cpu_count() or 1)
    have = max(1, d.map_parallelism)  # the measured run already had this many
    d.bottleneck = "decode"
    d.explanation = (f"framing and decoding take {cpu_share:.0%} of the input time"
                     f" ({input_per_batch * 1000:,.1f} ms per batch against a"
                     f" {step_per_batch * 1000:,.1f} ms step).")
    if have > 1 and have >= cores:
        d.suggestion = (f"the pipeline already maps with num_parallel={have} on {cores} cores:"
                        " more parallel decoders cannot help here; make decoding cheaper"
                        " (smaller stored images, fewer fields) or give the input more cores.")
        return
    k = min(2 * have, cores) if cores > 1 else 2
    predicted = input_per_batch * (io + cpu_share * have / k)
    now_wait = loaded.wait_share
    new_wait = max(0.0, predicted - step_per_batch) / max(predicted, step_per_batch)
    how = (f"ds.map(..., num_parallel={k}) or DataLoader(num_workers={k})" if have == 1 else
           f"num_parallel={k} instead of the map's {have}")
    if new_wait < now_wait:
        gain = f"cut the input wait from {now_wait:.0%} to ~{new_wait:.0%} of a step"
    else:  # a step too short to hide any input: say what the input rate would become
        gain = (f"take the input from {1 / input_per_batch:,.0f} to"
                f" ~{1 / predicted:,.0f} batches/s")
    d.suggestion = f"{k} parallel decoders ({how}) would {gain} ({cores} cores here)."


def diagnose(ds: Any, *, step: Optional[Callable[[Any], Any]] = None, step_ms: float = 5.0,
             seconds: float = 30.0, workers: Sequence[int] = ()) -> Diagnosis:
    """Measure ``ds`` alone and under a training step; name the bottleneck (module docstring).

    ``step``: your training step (called with each batch); default a GIL-releasing sleep of
    ``step_ms``. ``seconds``: the time for the first two runs together (each reads at most half).
    ``workers``: DataLoader worker counts to try as well (PyTorch; ``ds`` must be batched).
    """
    if not callable(getattr(ds, "stats", None)):
        raise UsageError("diagnose() takes a streamio Dataset")
    _check_readable_twice(ds)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise UsageError(f"seconds must be positive, not {seconds!r}")
    if step is None:
        if step_ms < 0:
            raise UsageError(f"step_ms must not be negative, not {step_ms!r}")
        delay = step_ms / 1000.0

        def step(_batch, _delay=delay):  # time.sleep releases the GIL, as a GPU step would
            time.sleep(_delay)
    half = seconds / 2
    alone = _timed_run("input alone", ds, seconds=half, step=None, stats=ds.stats)
    with_step = _timed_run("with step", ds, seconds=half, step=step, stats=ds.stats)
    d = Diagnosis(alone=alone, with_step=with_step,
                  source_limit_mb_s=_raw_read_rate(ds, min(5.0, half)),
                  map_parallelism=int(getattr(ds, "map_parallelism", 1)))
    step_per_batch = with_step.step_s / with_step.batches if with_step.batches else 0.0
    _verdict(d, step_per_batch)
    for k in workers:
        if k == 0:
            continue
        import torch.utils.data

        torch_ds = ds.to_torch()
        loader = torch.utils.data.DataLoader(torch_ds, batch_size=None, num_workers=k)
        d.workers.append(_timed_run(f"{k} workers", loader, seconds=half, step=step,
                                    stats=_epoch_stats_since(torch_ds, time.time()),
                                    readers=k))
    if d.workers:
        _recommend_workers(d)
    return d


def _check_readable_twice(ds: Any) -> None:
    """Refuse sources the two runs cannot both read (module docstring), before reading any."""
    from ..sources import ByteSource, PipeChannel

    groups = getattr(ds, "inputs", None)  # a mix: its inputs' sources
    sources = [s for inp in groups for s in getattr(inp, "sources", ())] if groups else list(
        getattr(ds, "sources", ()))
    for source in sources:
        if isinstance(source, PipeChannel):
            continue
        why = None
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if path == "-":
                why = "stdin"
            else:
                try:
                    why = "a FIFO" if stat.S_ISFIFO(os.stat(path).st_mode) else None
                except OSError:
                    why = None  # a URL, or missing: the reader says what is wrong with it
        elif isinstance(source, ByteSource) or callable(getattr(source, "read", None)):
            why = "a stream object"
        if why is not None:
            raise UsageError(
                f"diagnose reads the input twice (alone, then under a step), and {source!s} is"
                f" {why}, which cannot be read twice: diagnose a file with the same data, or a"
                " PipeChannel (each run reads the next epoch's FIFO; on the command line"
                " --channel PREFIX)")


#: Workers must beat the main process by this much to be recommended: they cost memory, start-up
#: and a copy of every batch, and on a loaded machine a few percent is noise.
WORKERS_MARGIN = 1.10


def _steady_rate(run: RunFigures) -> float:
    """Records/s after the first batch (a DataLoader's workers take a second or more to start,
    which a short run would otherwise count against them)."""
    seconds = run.seconds - (run.first_batch_s or 0.0)
    if run.batches < 2 or seconds <= 0:
        return run.records_per_s
    return run.records / run.batches * (run.batches - 1) / seconds


def _recommend_workers(d: Diagnosis) -> None:
    """``num_workers`` from the measured runs under the step: the fastest, and 0 (the main
    process, as in the run "with step") unless workers deliver ``WORKERS_MARGIN`` times more."""
    base = _steady_rate(d.with_step)
    best, best_rate = 0, base
    for run in d.workers:
        rate = _steady_rate(run)
        if rate > best_rate and rate >= base * WORKERS_MARGIN:
            best, best_rate = run.readers, rate
    rates = ", ".join(f"{run.readers}: {_steady_rate(run):,.0f}" for run in d.workers)
    d.num_workers = best
    d.num_workers_reason = (f"measured records/s under the step: 0 (in the main process):"
                            f" {base:,.0f}, {rates}"
                            + ("; decoding is cheap next to moving batches between processes"
                               if best == 0 else ""))


def _epoch_stats_since(torch_ds: Any, started: float) -> Callable[[], Optional[dict]]:
    """The counters the DataLoader workers published for an epoch that began after ``started``
    (they publish every ``STATS_INTERVAL_S`` and at the end), or None: never an earlier run's."""
    def stats() -> Optional[dict]:
        found = torch_ds.latest_stats()
        return found[1] if found is not None and found[0] >= started else None
    return stats


# -- the command line -----------------------------------------------------------------------------
def _decoder(spec: Optional[str]) -> Any:
    """``example:SPEC.json`` ({name: {"shape": [...], "dtype": ..., "varlen": bool}}),
    ``csv`` / ``csv:LABEL_COLUMN``, ``recordio-protobuf`` or ``none``."""
    from ..decoders import Csv, Example, FixedLen, RecordIOProtobuf, VarLen

    if spec is None or spec == "none":
        return None
    kind, _, arg = spec.partition(":")
    if kind == "example":
        try:
            with open(arg) as f:
                fields = json.load(f)
            return Example({name: (VarLen(f["dtype"]) if f.get("varlen")
                                   else FixedLen(f.get("shape", []), f["dtype"]))
                            for name, f in fields.items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"--decoder example:{arg}: expected a JSON file of"
                             ' {name: {"shape": [...], "dtype": "float32"}} ('
                             f"{type(exc).__name__}: {exc})") from None
    if kind == "csv":
        return Csv(label_column=int(arg)) if arg else Csv()
    if kind == "recordio-protobuf":
        return RecordIOProtobuf()
    raise UsageError(f"--decoder {spec!r}: use example:SPEC.json, csv[:LABEL], recordio-protobuf"
                     " or none")


def add_cli(sub) -> None:
    p = sub.add_parser("diagnose", help="find where the input time goes (I/O, decode, consumer)",
                       description="Run the input pipeline alone and under a simulated training"
                                   " step, and name the bottleneck.")
    p.add_argument("sources", nargs="*", metavar="SOURCE",
                   help="files, globs, directories or URLs (read twice: not a FIFO or stdin)")
    p.add_argument("--channel", metavar="PREFIX",
                   help="a Pipe mode channel instead: PREFIX_0, PREFIX_1, ... one FIFO per run")
    p.add_argument("--format", "-f", help="default: from the names (as count)")
    p.add_argument("--open-timeout", type=float, metavar="SECONDS", default=None,
                   help="fail if the first data does not come within this (default: --channel"
                        " 300, else --read-timeout)")
    p.add_argument("--read-timeout", type=float, metavar="SECONDS", default=None,
                   help="fail if the source then goes silent this long (default: --channel"
                        " 120, else none)")
    p.add_argument("--decoder", default=None,
                   help="example:SPEC.json (a JSON object {feature: {\"dtype\": \"float32\","
                        " \"shape\": [16]}}; \"varlen\": true for a VarLen; see docs/pipeline.md),"
                        " csv[:LABEL_COLUMN], recordio-protobuf or none")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--shuffle", type=int, default=0, help="shuffle buffer size (0: none)")
    p.add_argument("--workers", default=None,
                   help="DataLoader worker counts to try, e.g. 0,2 (default: 0,2 where torch is"
                        " installed and SOURCEs are given, and the report recommends num_workers; else 0:"
                        " each run of a --channel reads one more epoch)")
    p.add_argument("--step-ms", type=float, default=5.0, help="simulated step per batch")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--plot", metavar="PNG", help="save a wait-vs-step timeline (matplotlib)")
    p.set_defaults(func=cmd_diagnose)


def _cli_sources(args) -> Any:
    """The SOURCEs, or the ``--channel`` (one of them)."""
    from ..sources import PipeChannel

    if bool(args.sources) == (args.channel is not None):
        raise UsageError("diagnose takes SOURCEs or --channel PREFIX (one of them)")
    if args.channel is not None:
        timeouts = {k: v for k, v in (("open_timeout", args.open_timeout),
                                      ("read_timeout", args.read_timeout)) if v is not None}
        return PipeChannel(args.channel, **timeouts)
    return args.sources if len(args.sources) > 1 else args.sources[0]


def _cli_format(args) -> str:
    if args.format is not None:
        return args.format
    if args.channel is not None:
        raise UsageError("--channel needs --format (a FIFO's name does not say it)")
    from ..cli import format_from_names
    from ..reader import expand_sources

    return format_from_names(expand_sources(list(args.sources)))


def _cli_timeouts(args) -> dict:
    """The reader's timeouts for SOURCEs (a --channel carries its own)."""
    if args.channel is not None:
        return {}
    return {k: v for k, v in (("open_timeout", args.open_timeout),
                              ("read_timeout", args.read_timeout)) if v is not None}


def cmd_diagnose(args) -> int:
    from ..pipeline import Dataset

    if args.workers is None:
        import importlib.util

        # A channel gives each run one epoch: measuring workers by default would read one
        # more epoch than a writer serving "alone, then with the step" provides.
        args.workers = ("0,2" if importlib.util.find_spec("torch") is not None
                        and not args.channel else "0")
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        raise UsageError(f"--workers takes counts like 0,2, not {args.workers!r}") from None
    ds = Dataset(_cli_sources(args), _cli_format(args), decoder=_decoder(args.decoder),
                 **_cli_timeouts(args))
    if args.shuffle:
        ds = ds.shuffle(args.shuffle, seed=0)
    ds = ds.batch(args.batch).prefetch()
    d = diagnose(ds, step_ms=args.step_ms, seconds=args.seconds, workers=workers)
    if args.json:
        print(json.dumps(d.to_dict(), indent=2))
    else:
        print(d.table())
    if args.plot:
        if d.plot(args.plot):
            print(f"timeline saved to {args.plot}", file=sys.stderr)
        else:
            print("--plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
    return 0


__all__ = ["Diagnosis", "RunFigures", "add_cli", "diagnose"]

"""The streamio side of the benchmark: one case per (workload, runner), run in this process."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .._util import batch_rows
from .config import ADAPTER_PARTS, BenchConfig, EXAMPLE_FLOATS, FIXED_PREFETCH, READ_SIZE
from .workloads import Workload


# -- the streamio side ------------------------------------------------------------------------------
def _dataset_class():
    try:
        from ..pipeline import Dataset
    except ImportError as exc:
        raise _Skip(f"streamio.pipeline.Dataset is not importable yet ({exc})") from None
    return Dataset


class _Skip(Exception):
    """A case cannot run at this stage of the project; the message says why."""


def example_decoder():
    try:
        from ..decoders import Example, FixedLen
    except ImportError as exc:
        raise _Skip(f"the Example decoder is not importable yet ({exc})") from None
    return Example({"x": FixedLen((EXAMPLE_FLOATS,), "float32"), "label": FixedLen((), "int64")})


def _csv_decoder():
    try:
        from ..decoders import Csv
    except ImportError as exc:
        raise _Skip(f"the Csv decoder is not importable yet ({exc})") from None
    try:  # SageMaker's CSV convention: no header, label first; float32 features
        return Csv(label_column=0, dtype="float32")
    except (TypeError, ValueError) as exc:
        raise _Skip(f"could not build Csv(label_column=0, dtype='float32'): {exc}") from None


def _recordio_decoder():
    try:
        from ..decoders import RecordIOProtobuf
    except ImportError as exc:
        raise _Skip(f"the RecordIOProtobuf decoder is not importable yet ({exc})") from None
    try:
        return RecordIOProtobuf()
    except TypeError as exc:
        raise _Skip(f"could not build a RecordIOProtobuf decoder: {exc}") from None


def _check_decoder(decoder: Any, workload: Workload, expect: Callable[[dict], int]) -> None:
    """Decode the first records of the workload once; skip the case if that does not work yet."""
    from ..reader import read_records

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


def _count_batches(dataset: Any) -> int:
    n = 0
    for batch in dataset:
        n += batch_rows(batch)
    return n


def _skip_or(make: Callable[[], Callable[[str], int]]) -> Any:
    """``make()``, or the :class:`_Skip` it raised (the table prints why the case did not run)."""
    try:
        return make()
    except _Skip as exc:
        return exc


def _raw_reader(w: Workload) -> Callable[[str], int]:
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


def _raw_readinto(w: Workload) -> Callable[[str], int]:
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


def _count_read_records(path: str) -> int:
    from ..reader import read_records

    n = 0
    for _ in read_records(path, "tfrecord"):
        n += 1
    return n


def _dataset_case(w: Workload, format: str, make_decoder: Callable[[], Any], bs: int,
                  sources: Any = None) -> Callable[[], Callable[[str], int]]:
    """A maker of ``Dataset(path, format, decoder=...).batch(bs)`` counting rows (``sources``
    instead of the path if given); the decoder is checked on the workload's first records."""
    def make() -> Callable[[str], int]:
        Dataset = _dataset_class()
        decoder = make_decoder()
        _check_decoder(decoder, w, batch_rows)
        return lambda path: _count_batches(
            Dataset(path if sources is None else sources, format, decoder=decoder).batch(bs))
    return make


def _examples_cases(cfg: BenchConfig, w: Workload) -> list:
    bs = cfg.batch_size
    return [
        ("examples/streamio", w, "streamio Dataset.batch(256)", "fifo",
         _skip_or(_dataset_case(w, "tfrecord", example_decoder, bs))),
        ("examples/read_records", w, "streamio read_records (frames only)", "fifo",
         _count_read_records),
        ("examples/raw-read", w, "raw os.read(1 MiB) loop (bytes only)", "fifo", _raw_reader(w)),
    ]


def _bare_decode(w: Workload, bs: int) -> Callable[[str], int]:
    """The bare decode loop the pipeline's stages are measured against: RecordReader's record
    lists, cut into batches of ``bs``, each decoded."""
    from ..reader import RecordReader

    decoder = example_decoder()
    _check_decoder(decoder, w, batch_rows)

    def run(path: str) -> int:
        n = 0
        pending: list = []
        for records in RecordReader(path, "tfrecord").record_lists():
            if pending:
                records = pending + records
            stop = len(records) - len(records) % bs
            for s in range(0, stop, bs):
                n += batch_rows(decoder.decode_batch(records[s:s + bs]))
            pending = records[stop:]
        if pending:
            n += batch_rows(decoder.decode_batch(pending))
        return n
    return run


def _pipeline_cases(cfg: BenchConfig, w: Workload) -> list:
    bs = cfg.batch_size

    def pipeline(prefetch: Any):
        def make():
            Dataset = _dataset_class()
            decoder = example_decoder()
            _check_decoder(decoder, w, batch_rows)

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

    return [
        ("pipeline/bare-decode", w, "RecordReader + decode_batch loop", "fifo",
         _skip_or(lambda: _bare_decode(w, bs))),
        ("pipeline/shuffle-batch-prefetch", w, label(cfg.prefetch), "fifo",
         _skip_or(pipeline(cfg.prefetch))),
        ("pipeline/shuffle-batch-prefetch2", w, label(FIXED_PREFETCH), "fifo",
         _skip_or(pipeline(FIXED_PREFETCH))),
        ("pipeline/shuffle-batch", w, label(False), "fifo", _skip_or(pipeline(False))),
    ]


def _adapter_cases(cfg: BenchConfig, w: Workload) -> list:
    bs = cfg.batch_size
    return [
        ("adapters/numpy", w, f"streamio Dataset.batch({bs}), numpy", "fifo",
         _skip_or(_dataset_case(w, "tfrecord", example_decoder, bs))),
        ("adapters/numpy-files", w, f"streamio Dataset({ADAPTER_PARTS} files).batch({bs}), numpy",
         "file", _skip_or(_dataset_case(w, "tfrecord", example_decoder, bs,
                                        sources=w.meta["parts"]))),
    ]


def _large_cases(cfg: BenchConfig, w: Workload) -> list:
    return [
        ("large/streamio-read_records", w, "streamio read_records (CRCs verified)", "fifo",
         _count_read_records),
        ("large/raw-read", w, "raw os.read(1 MiB) loop", "fifo", _raw_reader(w)),
        ("large/raw-readinto", w, "raw readinto(1 MiB buffer), pipe 1 MiB", "fifo",
         _raw_readinto(w)),
    ]


def _pandas_reader(chunksize: int) -> Callable[[str], int]:
    try:
        import pandas as pd
    except ImportError:
        raise _Skip("pandas is not installed (pip install pandas)") from None

    def run(path: str) -> int:
        n = 0
        for chunk in pd.read_csv(path, header=None, chunksize=chunksize, dtype=np.float32,
                                 engine="c"):
            n += len(chunk.to_numpy(dtype=np.float32))
        return n
    return run


def _csv_cases(cfg: BenchConfig, w: Workload) -> list:
    bs = cfg.batch_size
    return [
        ("csv/streamio", w, f"streamio Dataset(csv).batch({bs})", "fifo",
         _skip_or(_dataset_case(w, "csv", _csv_decoder, bs))),
        ("csv/pandas", w, f"pandas.read_csv(chunksize={cfg.pandas_chunksize})", "fifo",
         _skip_or(lambda: _pandas_reader(cfg.pandas_chunksize))),
    ]


def _recordio_cases(cfg: BenchConfig, w: Workload) -> list:
    from ..reader import read_records

    bs = cfg.batch_size
    return [
        ("recordio/streamio", w, f"streamio Dataset(recordio protobuf).batch({bs})", "fifo",
         _skip_or(_dataset_case(w, "recordio", _recordio_decoder, bs))),
        ("recordio/read_records", w, "streamio read_records (frames only)", "fifo",
         lambda path: sum(1 for _ in read_records(path, "recordio"))),
    ]


#: The streamio cases of each workload, in the order they run (and are printed).
_CASES_OF = {"examples": _examples_cases, "pipeline": _pipeline_cases,
             "adapters": _adapter_cases, "large": _large_cases, "csv": _csv_cases,
             "recordio": _recordio_cases}


def streamio_cases(cfg: BenchConfig, work: dict) -> list:
    """(case name, workload, runner name, input, consume(path) -> records, or a _Skip)."""
    cases: list = []
    for name, cases_of in _CASES_OF.items():
        # The examples workload is also generated for the peers' FIFO probe alone.
        if name in work and (name != "examples" or "examples" in cfg.workloads):
            cases.extend(cases_of(cfg, work[name]))
    return cases

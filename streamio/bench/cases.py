"""The streamio side of the benchmark: one case per (workload, runner), run in this process."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .config import ADAPTER_PARTS, BenchConfig, EXAMPLE_FLOATS, FIXED_PREFETCH, READ_SIZE
from .workloads import Workload


# -- the streamio side ------------------------------------------------------------------------------
def _dataset_class():
    try:
        from ..pipeline import Dataset
    except ImportError as exc:
        raise Skip(f"streamio.pipeline.Dataset is not importable yet ({exc})") from None
    return Dataset


class Skip(Exception):
    """A case cannot run at this stage of the project; the message says why."""


def example_decoder():
    try:
        from ..decoders import Example, FixedLen
    except ImportError as exc:
        raise Skip(f"the Example decoder is not importable yet ({exc})") from None
    return Example({"x": FixedLen((EXAMPLE_FLOATS,), "float32"), "label": FixedLen((), "int64")})


def _csv_decoder():
    try:
        from ..decoders import Csv
    except ImportError as exc:
        raise Skip(f"the Csv decoder is not importable yet ({exc})") from None
    try:  # SageMaker's CSV convention: no header, label first; float32 features
        return Csv(label_column=0, dtype="float32")
    except (TypeError, ValueError) as exc:
        raise Skip(f"could not build Csv(label_column=0, dtype='float32'): {exc}") from None


def _recordio_decoder():
    try:
        from ..decoders import RecordIOProtobuf
    except ImportError as exc:
        raise Skip(f"the RecordIOProtobuf decoder is not importable yet ({exc})") from None
    try:
        return RecordIOProtobuf()
    except TypeError as exc:
        raise Skip(f"could not build a RecordIOProtobuf decoder: {exc}") from None


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
        raise Skip(f"the decoder does not decode this workload yet: {type(exc).__name__}: {exc}")
    if rows != len(records):
        raise Skip(f"the decoder returned {rows} rows for {len(records)} records")


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
    """(case name, workload, runner name, input, consume(path) -> records, or a Skip)."""
    from ..reader import RecordReader, read_records

    cases: list = []
    bs = cfg.batch_size

    def skip_or(make: Callable[[], Callable[[str], int]]) -> Any:
        try:
            return make()
        except Skip as exc:
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
            decoder = example_decoder()
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
            decoder = example_decoder()
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
                decoder = example_decoder()
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
                decoder = example_decoder()
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
                raise Skip("pandas is not installed (pip install pandas)") from None

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

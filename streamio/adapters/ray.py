"""Ray Data adapter: streamio as a ``ray.data`` source (:func:`read`, :class:`Datasource`) and
sink (:func:`write`, :class:`Datasink`). Guide: docs/ray.md.

Reading: :meth:`Datasource.get_read_tasks` asks :func:`streamio.pipeline.splits.plan_parts` for
``parallelism`` parts (whole files when there are enough, byte ranges of big files otherwise,
index files honoured; a compressed file or a single stream whole). Each task iterates its part
as an ordinary Dataset and turns the numpy batches into Arrow with whole-column operations,
never per-record Python: numeric columns over the same memory, fixed shapes as Ray tensor
columns, ``VarLen`` as list columns beside ``name_len``, a ``SparseBatch`` as ``name`` and
``name_indices`` list columns, bytes/str as binary/string, no decoder as one binary ``record``.
Blocks grow to ``target_max_block_size`` (:func:`read` sets :data:`READ_BLOCK_BYTES`, so that
consuming overlaps reading) or ``rows_per_block``.

Contract:
- Every record of the Dataset once per execution of the Ray Dataset; errors are streamio's,
  raised in the task and re-raised in the driver as an instance of the same streamio class.
- Single streams (a FIFO, a ``PipeChannel``, ``"-"``, a pipe file object) are one task each on
  the driver's node (``supports_distributed_reads = False``); stdin and pipe file objects are
  opened there as ``/proc/<driver pid>/fd/<n>``; other file objects raise ``UsageError``. Each
  execution reads the stream again (a FIFO needs a new writer).
- Writing: each write task's rows go to ``<path_prefix>-<task>-<n>.tfrecord`` (``.rec``,
  ``.gz``/``.zst``), made under a ``mkstemp`` name in the destination and renamed into place
  (an index beside it with ``index=True``); a local prefix must be shared between nodes. A URL
  prefix (:data:`URL_WRITERS`) is written through smart_open: made in the task's temporary
  directory, then uploaded, so a reader never sees half a shard.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import weakref
from typing import Any, Iterable, Iterator, Optional

import numpy as np

from .._util import batch_rows as _rows, check_int
from ..decoders.example import encode_example
from ..decoders.sparse import SparseBatch
from ..errors import SourceError, UsageError, UsageTypeError, require
from ..pipeline.dataset import Dataset
from ..pipeline.splits import plan_parts
from ..reader import write_records
from ..sources import ByteSource, PipeChannel
from ..tools.index import index_path, write_index
from . import is_single_stream

ray = require("ray", "ray")
pa = require("pyarrow", "ray")
require("ray.data", "ray")
from ray.data.block import BlockMetadata  # noqa: E402 - after the friendly check above
from ray.data.context import DataContext  # noqa: E402
from ray.data.datasource import ReadTask  # noqa: E402
from ray.data.extensions import ArrowTensorArray  # noqa: E402

__all__ = ["Datasink", "Datasource", "batch_to_arrow", "read", "write"]

#: URL schemes a Datasink writes through smart_open (its writable transports); any other
#: ``scheme://`` prefix is refused at once, never taken for a local directory named ``scheme:``.
URL_WRITERS = ("s3", "s3a", "s3n", "gs", "gcs", "azure", "hdfs", "webhdfs", "sftp", "ssh", "scp")

#: Records decoded per call inside a read task: large enough that the decoder's per-call cost
#: vanishes, small enough that its records and arrays stay in the caches.
DECODE_ROWS = 16384
#: Raw records (no decoder) are gathered in smaller lists: they may be large (images).
RAW_ROWS = 256
#: At most this many rows per block, whatever Ray's target size allows: a task holds a block's
#: records (as bytes) while it decodes them, and the first block is the consumer's first wait.
MAX_BLOCK_ROWS = 65536
#: ``read()`` without ``parallelism``: one read task per this many bytes (and at least one per
#: CPU). Ray's own default asks for 200 tasks, which cut 10 files of 35 MB into 200 ranges of
#: 1.8 MB: task start-up then costs more than the reading.
TASK_BYTES = 512 << 20
#: The Ray Dataset :func:`read` returns targets blocks of at most this many bytes (its
#: ``context.target_max_block_size``, where Ray's is larger). With Ray's default (128 MiB) each
#: read task merged its blocks into ~1M-row ones (a 140 MB concatenation) before the consumer
#: saw the first: no overlap between reading and consuming. Set ``ds.context.
#: target_max_block_size`` on the returned Dataset for larger blocks downstream.
READ_BLOCK_BYTES = 8 << 20
_SUFFIX = {"tfrecord": ".tfrecord", "recordio": ".rec"}
_COMPRESSED_SUFFIX = {None: "", "gzip": ".gz", "zlib": ".zz", "zstd": ".zst"}


# -- numpy batches -> Arrow ---------------------------------------------------------------------
def _column(name: str, value: Any, lengths: Optional[np.ndarray]) -> list:
    """``[(name, arrow array), ...]`` for one decoded field."""
    if isinstance(value, SparseBatch):
        offsets = pa.array(value.indptr.astype(np.int64, copy=False))
        return [(name, pa.LargeListArray.from_arrays(offsets, pa.array(value.values))),
                (name + "_indices", pa.LargeListArray.from_arrays(offsets,
                                                                  pa.array(value.indices)))]
    if isinstance(value, list):  # raw records
        return [(name, pa.array(value, type=pa.binary()))]
    array = np.asarray(value)
    if lengths is not None and array.ndim == 2 and array.dtype.kind not in "OSU":
        # VarLen: a padded (B, longest) array; the list holds each row's first len values.
        lengths = lengths.astype(np.int64, copy=False)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        keep = np.arange(array.shape[1]) < lengths[:, None]
        return [(name, pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(array[keep])))]
    if array.dtype.kind in "OSU":
        if array.ndim == 1:
            kind = pa.string() if array.dtype.kind == "U" else pa.binary()
            if array.dtype.kind == "O" and len(array) and isinstance(array[0], str):
                kind = pa.string()
            return [(name, pa.array(array.tolist(), type=kind))]
        return [(name, pa.array(array.tolist()))]  # lists of bytes per row: rare
    if array.ndim == 1:
        return [(name, pa.array(array))]
    return [(name, ArrowTensorArray.from_numpy(np.ascontiguousarray(array)))]


def batch_to_arrow(batch: Any, *, column: str = "record") -> "pa.Table":
    """One decoded batch (a dict of numpy arrays / :class:`~streamio.SparseBatch`, or a list of
    raw records, which becomes the binary column ``column``) as an Arrow table, with the column
    types the module docstring lists."""
    if isinstance(batch, list):
        return pa.table({column: pa.array(batch, type=pa.binary())})
    if not isinstance(batch, dict):
        raise UsageTypeError(f"a batch must be a dict of arrays or a list of records, not"
                             f" {type(batch).__name__}")
    names, arrays = [], []
    for name, value in batch.items():
        companion = batch.get(name + "_len")
        lengths = companion if isinstance(companion, np.ndarray) and companion.ndim == 1 else None
        for out_name, out in _column(name, value, lengths):
            names.append(out_name)
            arrays.append(out)
    return pa.Table.from_arrays(arrays, names=names)


def _nbytes(batch: Any) -> int:
    if isinstance(batch, list):
        return sum(map(len, batch)) + 16 * len(batch)
    total = 0
    for value in batch.values():
        if isinstance(value, SparseBatch):
            total += value.values.nbytes + value.indices.nbytes + value.indptr.nbytes
        else:
            total += getattr(value, "nbytes", 0)
    return total


def _join(batches: list) -> Any:
    """Several decoded batches as one (one copy per column, so a block is contiguous)."""
    if len(batches) == 1:
        return batches[0]
    if isinstance(batches[0], list):
        return [record for batch in batches for record in batch]
    out = {}
    for name, first in batches[0].items():
        values = [b[name] for b in batches]
        if isinstance(first, SparseBatch):
            indptr = [values[0].indptr]
            base = values[0].indptr[-1]
            for v in values[1:]:
                indptr.append(v.indptr[1:] + base)
                base += v.indptr[-1]
            out[name] = SparseBatch._checked(
                np.concatenate(indptr), np.concatenate([v.indices for v in values]),
                np.concatenate([v.values for v in values]),
                (sum(v.shape[0] for v in values), max(v.shape[1] for v in values)))
        elif first.ndim == 2 and first.dtype.kind not in "OSU" and name + "_len" in batches[0]:
            width = max(v.shape[1] for v in values)  # VarLen: pad to the widest
            out[name] = np.concatenate([np.pad(v, ((0, 0), (0, width - v.shape[1])))
                                        for v in values])
        else:
            out[name] = np.concatenate(values)
    return out


def _read_part(part: Dataset, target_bytes: int, rows_per_block: Optional[int]) -> Iterator:
    """A read task's body: the part's decoded batches as Arrow tables of at most
    ``target_bytes`` and :data:`MAX_BLOCK_ROWS` rows (or ``rows_per_block`` rows). Records
    are decoded :data:`DECODE_ROWS` at a time (larger calls ran slower: their records and
    arrays no longer fit the caches), each batch a chunk of its block (:func:`_block`)."""
    raw = part.decoder is None
    limit = rows_per_block or MAX_BLOCK_ROWS
    step = min(limit, RAW_ROWS if raw else DECODE_ROWS)
    pending: list = []
    rows = size = 0
    for batch in part.batch(step):
        pending.append(batch)
        rows += len(batch) if raw else _rows(batch)
        size += _nbytes(batch)
        if rows >= limit or size >= target_bytes:
            yield _block(pending)
            pending, rows, size = [], 0, 0
    if pending:
        yield _block(pending)


def _block(batches: list) -> "pa.Table":
    """Decoded batches as one Arrow block: each batch's columns become a chunk, over the
    batch's own memory (no copy: Ray copies the block into its object store anyway, and a
    consumer's batches that fall within a chunk are slices of it). Batches whose Arrow types
    differ (inferred from their values: text or nested objects) are joined into one first."""
    tables = [batch_to_arrow(batch) for batch in batches]
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return batch_to_arrow(_join(batches))


# -- sources that cannot leave this process -----------------------------------------------------
def _portable(source: Any) -> Any:
    """``source`` as something a read task in another process can open: stdin and pipe file
    objects become ``/proc/<pid>/fd/<n>`` (the same pipe, opened again)."""
    if isinstance(source, ByteSource):
        raise UsageError(f"{source.name} is an open ByteSource: a Ray read task runs in another"
                         " process and cannot use it; pass its path or URL")
    if isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-":
        text = os.fspath(source)
        # A task's working directory is not the driver's: a relative path becomes absolute here.
        return text if isinstance(text, bytes) or "://" in text else os.path.abspath(text)
    if isinstance(source, (bytes, bytearray, memoryview, PipeChannel)):
        return source
    if isinstance(source, str):  # "-"
        fd = 0
        name = "<stdin>"
    else:  # a file object
        name = getattr(source, "name", repr(source))
        try:
            fd = source.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is None:
            raise UsageError(f"{name} is a file object that a Ray read task (another process)"
                             " cannot read: pass its path, or a pipe")
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        raise UsageError(f"{name} is not a pipe: a Ray read task (another process) cannot read"
                         " it; pass its path instead")
    return f"/proc/{os.getpid()}/fd/{fd}"


# -- the Datasource -----------------------------------------------------------------------------
class Datasource(ray.data.Datasource):
    """streamio sources as a ``ray.data.Datasource``: ``ray.data.read_datasource(
    Datasource(sources, format, decoder=..., **dataset_options))``, or :func:`read`.

    Takes what :class:`~streamio.Dataset` takes (checked now). ``rows_per_block``: rows per
    Arrow block (default: up to :data:`MAX_BLOCK_ROWS`, within Ray's
    ``DataContext.target_max_block_size``).
    """

    def __init__(self, sources: Any, format: str, *, decoder: Any = None,
                 rows_per_block: Optional[int] = None, **dataset_options: Any) -> None:
        super().__init__()
        if isinstance(sources, (list, tuple)):
            sources = [_portable(s) for s in sources]
        else:
            sources = _portable(sources)
        if rows_per_block is not None:
            rows_per_block = check_int("rows_per_block", rows_per_block, 1)
        self._dataset = Dataset(sources, format, decoder=decoder, **dataset_options)
        self._rows_per_block = rows_per_block
        self._streams = any(is_single_stream(s) for s in self._dataset.sources)

    @property
    def dataset(self) -> Dataset:
        """The streamio Dataset this source reads."""
        return self._dataset

    def get_name(self) -> str:
        return f"streamio.{self._dataset.format}"

    def columns(self) -> Optional[tuple]:
        """The columns its blocks hold, where known before reading: ``record`` without a
        decoder, else the decoder's outputs (None: it learns them from the data)."""
        decoder = self._dataset.decoder
        if decoder is None:
            return ("record",)
        spec = decoder.output_spec() if callable(getattr(decoder, "output_spec", None)) else None
        return None if spec is None else tuple(spec)

    @property
    def supports_distributed_reads(self) -> bool:
        """False when a source is a single stream: its task must run on the driver's node."""
        return not self._streams

    def suggested_parallelism(self) -> int:
        """Read tasks worth starting: one per :data:`TASK_BYTES` of the input (its local files'
        sizes; one per source when they are unknown), at least one per CPU of the cluster."""
        cpus = int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1
        size = self.estimate_inmemory_data_size()
        wanted = len(self._dataset.sources) if size is None else -(-size // TASK_BYTES)
        return max(1, cpus, wanted)

    def estimate_inmemory_data_size(self) -> Optional[int]:
        sizes = []
        for source in self._dataset.sources:
            if not isinstance(source, (str, os.PathLike)) or "://" in os.fspath(source):
                return None
            try:
                st = os.stat(source)
            except OSError:
                return None
            if not stat.S_ISREG(st.st_mode):
                return None
            sizes.append(st.st_size)
        return sum(sizes)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context: Optional[Any] = None) -> list:
        context = data_context or DataContext.get_current()
        target = context.target_max_block_size or (128 << 20)
        parts = plan_parts(self._dataset, max(1, int(parallelism)),
                           single_stream=is_single_stream)
        tasks = []
        for part in parts:
            metadata = BlockMetadata(num_rows=None, size_bytes=part.nbytes, exec_stats=None,
                                     input_files=part.names)
            tasks.append(ReadTask(_ReadFn(part.dataset, target, self._rows_per_block),
                                  metadata, per_task_row_limit=per_task_row_limit))
        return tasks


class _ReadFn:
    """A read task's function (a class, so it pickles without closures)."""

    def __init__(self, part: Dataset, target: int, rows_per_block: Optional[int]) -> None:
        self.part, self.target, self.rows_per_block = part, target, rows_per_block

    def __call__(self) -> Iterator:
        return _read_part(self.part, self.target, self.rows_per_block)


def read(sources: Any, format: str, *, decoder: Any = None, parallelism: int = -1,
         rows_per_block: Optional[int] = None, ray_remote_args: Optional[dict] = None,
         **dataset_options: Any) -> "ray.data.Dataset":
    """A ``ray.data.Dataset`` of streamio ``sources``: the sources, formats, decoders and
    options of :class:`~streamio.Dataset` (``compression``, ``on_error``, ``max_record_size``,
    CSV options...). Without a decoder, one binary column ``record``. ``parallelism``: read
    tasks (-1: one per :data:`TASK_BYTES` of input, at least one per CPU of the cluster, see
    :meth:`Datasource.suggested_parallelism`). See :mod:`streamio.adapters.ray`."""
    source = Datasource(sources, format, decoder=decoder, rows_per_block=rows_per_block,
                        **dataset_options)
    if parallelism == -1:
        parallelism = source.suggested_parallelism()
    kwargs: dict = {}
    if ray_remote_args:
        kwargs["ray_remote_args"] = ray_remote_args
    ds = ray.data.read_datasource(source, override_num_blocks=parallelism, **kwargs)
    # This Dataset's own context (a copy Ray made for it): the read tasks cut their blocks to
    # it, and Ray's read operator passes blocks of about that size through unmerged.
    target = ds.context.target_max_block_size
    if target is None or target > READ_BLOCK_BYTES:
        ds.context.target_max_block_size = READ_BLOCK_BYTES
    columns = source.columns()
    if columns is not None:
        _READ_COLUMNS[ds] = columns  # for write()'s check on the driver
    return ds


#: The columns of the Ray Datasets read() made (while they live): write() checks them on the
#: driver, before any task runs.
_READ_COLUMNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _known_columns(ds: Any) -> Optional[tuple]:
    """``ds``'s columns if known without running it: Ray's schema where it has one, else
    what :func:`read` knew of the Dataset it made; None otherwise."""
    try:
        schema = ds.schema(fetch_if_missing=False)
    except Exception:  # noqa: BLE001 - only a shortcut; the sink checks again
        schema = None
    if schema is not None and getattr(schema, "names", None):
        return tuple(schema.names)
    try:
        return _READ_COLUMNS.get(ds)
    except TypeError:  # not weak-referenceable
        return None


# -- the Datasink -------------------------------------------------------------------------------
class Datasink(ray.data.Datasink):
    """Writes a Ray Dataset as TFRecord / RecordIO shards: ``ds.write_datasink(Datasink(...))``
    or :func:`write`. ``encode=None`` writes the binary ``column`` (default ``record``) as it
    is; ``encode="example"`` encodes each row's columns as a ``tf.train.Example``. After the
    write, ``shards`` lists the files written (sorted)."""

    def __init__(self, path_prefix: str, format: str = "tfrecord", *,
                 compression: Optional[str] = None, index: bool = False,
                 records_per_shard: Optional[int] = None, encode: Optional[str] = None,
                 column: str = "record") -> None:
        if format not in _SUFFIX:
            raise UsageError(f"format must be one of {sorted(_SUFFIX)}, not {format!r}")
        if compression not in _COMPRESSED_SUFFIX:
            raise UsageError(f"compression must be one of {list(_COMPRESSED_SUFFIX)}, not"
                             f" {compression!r}")
        if index and compression is not None:
            raise UsageError("index=True needs uncompressed shards (a compressed shard cannot be"
                             " read from an offset)")
        if records_per_shard is not None:
            records_per_shard = check_int("records_per_shard", records_per_shard, 1)
        if encode not in (None, "example"):
            raise UsageError(f"encode must be None or 'example', not {encode!r}")
        prefix = os.fspath(path_prefix)
        scheme = prefix.split("://", 1)[0] if "://" in prefix else None
        if scheme == "file":
            prefix, scheme = prefix[len("file://"):], None
        if scheme is not None and scheme not in URL_WRITERS:
            raise UsageError(f"cannot write shards to {prefix!r}: URLs of {list(URL_WRITERS)}"
                             " or a local path")
        self.url = scheme is not None
        self.path_prefix = prefix if self.url else os.path.abspath(prefix)
        self.format = format
        self.compression = compression
        self.index = index
        self.records_per_shard = records_per_shard
        self.encode = encode
        self.column = column
        self.shards: list = []

    def get_name(self) -> str:
        return f"streamio.{self.format}"

    def on_write_start(self, schema: Any = None) -> None:
        if self.url:
            require("smart_open", "s3")  # the missing extra named here, not in every task
        else:
            os.makedirs(os.path.dirname(self.path_prefix) or ".", exist_ok=True)
        if self.encode is None and schema is not None and self.column not in schema.names:
            raise UsageError(f"the Dataset has no column {self.column!r} (columns:"
                             f" {schema.names}); pass encode='example' to encode its columns")

    def write(self, blocks: Iterable[Any], ctx: Any) -> list:
        written: list = []
        shard: list = []
        for block in blocks:
            for records in self._records(block):
                while records:
                    room = (self.records_per_shard - len(shard) if self.records_per_shard
                            else len(records))
                    shard.extend(records[:room])
                    records = records[room:]
                    if self.records_per_shard and len(shard) >= self.records_per_shard:
                        written.append(self._write_shard(ctx.task_idx, len(written), shard))
                        shard = []
        if shard:
            written.append(self._write_shard(ctx.task_idx, len(written), shard))
        return written

    def on_write_complete(self, write_result: Any) -> None:
        self.shards = sorted(p for paths in write_result.write_returns for p in paths)

    def _records(self, block: Any) -> Iterator[list]:
        table = block if isinstance(block, pa.Table) else pa.Table.from_pandas(block)
        if self.encode is None:
            if self.column not in table.column_names:
                raise UsageError(f"the Dataset has no column {self.column!r}")
            yield table.column(self.column).to_pylist()
            return
        columns = {name: _numpy_column(table.column(name)) for name in table.column_names}
        rows = table.num_rows
        yield [encode_example({name: values[i] for name, values in columns.items()})
               for i in range(rows)]

    def _write_shard(self, task: int, number: int, records: list) -> str:
        suffix = _SUFFIX[self.format] + _COMPRESSED_SUFFIX[self.compression]
        path = f"{self.path_prefix}-{task:05d}-{number:05d}{suffix}"
        directory = None if self.url else os.path.dirname(path)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".streamio-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write_records(f, self.format, records, compression=self.compression)
            if self.url:
                _upload(tmp, path)
                if self.index:
                    made = write_index(tmp, self.format)
                    _upload(made, index_path(path, self.format))
                    os.unlink(made)
                os.unlink(tmp)
                return path
            if self.index:
                os.replace(write_index(tmp, self.format), index_path(path, self.format))
            os.replace(tmp, path)
        except BaseException:
            for leftover in (tmp, tmp + ".index", tmp + ".idx"):
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass
            raise
        return path


def _upload(local: str, url: str) -> None:
    """Copy the file ``local`` to ``url`` (smart_open: an S3 multipart upload, completed at
    close and aborted on error)."""
    smart_open = require("smart_open", "s3")
    try:
        with open(local, "rb") as src, smart_open.open(url, "wb", compression="disable") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    except Exception as exc:  # smart_open raises many transport-specific types
        raise SourceError(f"cannot write: {exc}", source=url) from exc


def _numpy_column(column: Any) -> Any:
    """A column as something indexable per row for ``encode_example``."""
    kind = column.type
    if isinstance(kind, pa.ExtensionType):
        return column.combine_chunks().to_numpy() if hasattr(column, "combine_chunks") \
            else column.to_numpy()
    if pa.types.is_binary(kind) or pa.types.is_string(kind) or pa.types.is_large_binary(kind):
        return column.to_pylist()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [np.asarray(v) for v in column.to_pylist()]
    return column.to_numpy()


def write(ds: Any, path_prefix: str, format: str = "tfrecord", *,
          compression: Optional[str] = None, index: bool = False,
          records_per_shard: Optional[int] = None, encode: Optional[str] = None,
          column: str = "record") -> list:
    """Write the Ray Dataset ``ds`` as shards ``<path_prefix>-<task>-<n>.tfrecord`` (or
    ``.rec``) with a :class:`Datasink` (``streamio pack`` at cluster scale); returns the shard
    paths, sorted. ``index=True`` writes an index file beside each shard. ``path_prefix``: a
    local path (shared by the nodes of a cluster) or a URL such as ``s3://bucket/out/part``.
    Without ``encode``, ``column`` must hold the encoded records: where the columns are known
    before running (a Dataset of :func:`read`, or one whose schema Ray knows), that is checked
    here, on the driver."""
    sink = Datasink(path_prefix, format, compression=compression, index=index,
                    records_per_shard=records_per_shard, encode=encode, column=column)
    columns = _known_columns(ds) if encode is None else None
    if columns is not None and column not in columns:
        # On the driver, before a task runs: inside one it is a long traceback, after reading.
        raise UsageError(
            f"the Dataset has no column {column!r} to write as records (its columns:"
            f" {', '.join(columns[:8])}{', ...' if len(columns) > 8 else ''}): a decoded"
            " Dataset needs encode='example' (each row's columns as a tf.train.Example), or"
            " column= naming its column of encoded records")
    ds.write_datasink(sink)
    return sink.shards

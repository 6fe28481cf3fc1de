"""Running one epoch of a :class:`~streamio.Dataset`: reading, the stages, decoding.

:class:`EpochRun` is the state of one epoch while its chain of block generators is built and
run. Building is a loop over the stages (each applies itself: :mod:`streamio.pipeline.stages`);
this module owns the two ends every stage sits between: the source end (reading, byte ranges,
round-robin shards, CSV headers, record origins) and the decoder (batches decoded together or
one by one, errors renamed to the record's place in its stream).

The seam for consumers that feed an epoch themselves (the shared stream of DataLoader
workers, :mod:`streamio.sharing`):

- **record origins**: a record's origin is one int, :func:`record_origin` ``(ordinal, index)``:
  the source's position in the Dataset's source list in the high bits (:data:`INDEX_BITS`
  below them) and the record's index in that source; :func:`origin_source` and
  :func:`origin_index` take it apart.
- **a feed** (:meth:`Dataset.with_feed`) is a callable ``feed(run) -> Iterator[(records,
  ids)]`` that an epoch reads instead of opening its sources: ``records`` a list of
  ``bytes``, ``ids`` their origins (an int64 array) when ``run.track_ids``, else None; it
  names each source it delivers with ``run.name_source(ordinal, name)`` and may count into
  ``run.stats`` (an :class:`~streamio.pipeline.EpochStats`); ``run.epoch`` is the epoch. A
  Dataset with a feed resumes mid-epoch only if the feed says that an epoch gives the same
  records again (a ``replayable = True`` attribute); otherwise a mid-epoch state is refused.
  A feed that reads a share of a stream dealt to several readers
  (:mod:`streamio.pipeline.dealing`) also has ``dealt`` (``(readers, index)``: the state's
  ``stream`` field), ``every_block(stats)`` (every block of the epoch, for an elastic resume
  replaying the old readers' shares) and ``drain(stats, broadcast=False)`` (take part in the
  epoch without reading, for a reader whose share was delivered before a resume).
- **reading the sources** without stages or decoder: :meth:`EpochRun.for_sources` (every
  record with its origin, after the Dataset's ``shard()`` layers); iterate its
  :meth:`~EpochRun.read_blocks` and read :attr:`~EpochRun.names`.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import time
from typing import Any, Iterator, Optional

import numpy as np

from ..decoders.skips import counting_skips
from ..errors import DecodeError, FormatError
from ..reader import RecordReader
from ..sources import source_name
from . import parallel
from . import resume as _resume
from .ranges import plan_range
from .items import decode_items
from .stages import close_blocks
from .stats import EpochStats

__all__ = ["INDEX_BITS", "INDEX_MASK", "EpochRun", "origin_index", "origin_source",
           "record_origin"]

# 2**40 records per source is far beyond any stream.
INDEX_BITS = 40
INDEX_MASK = (1 << INDEX_BITS) - 1


def record_origin(ordinal: int, index: int) -> int:
    """The origin of record ``index`` of source ``ordinal`` (its place in the source list)."""
    return (ordinal << INDEX_BITS) | index


def origin_source(origin: int) -> int:
    """The source ordinal of a record origin."""
    return int(origin) >> INDEX_BITS


def origin_index(origin: int) -> int:
    """The record's index in its source, from a record origin."""
    return int(origin) & INDEX_MASK


def takes_header(decoder: Any) -> bool:
    """Whether the decoder reads column names from each stream's first record (CSV header)."""
    return getattr(decoder, "header", False) is True


def _first_record(source: Any, ds: Any) -> bytes:
    """The first record of ``source`` (a CSV header, for a reader whose byte range starts past
    it); read apart from the epoch's counters, in small reads."""
    options = {**ds._reader_options, "read_size": 64 * 1024}
    reader = RecordReader(source, ds._format, **options)
    with reader:
        for records in reader.record_lists():
            if records:
                return records[0]
    raise DecodeError("the source holds no header row", source=source_name(source),
                      record_index=0)



class EpochRun:
    """The state of one epoch while its generator chain is built and run."""

    def __init__(self, ds: Any, epoch: int, stats: EpochStats, *,
                 decode_items: bool = True) -> None:
        self.ds = ds
        self.epoch = epoch
        self.stats = stats
        decoder = ds._decoder
        if decoder is not None and callable(getattr(decoder, "fresh", None)):
            decoder = decoder.fresh()  # an un-primed decoder per epoch (a CSV header again)
        self.decoder = decoder
        # Without batch(), a decoder decodes each item at the end of the chain (the consumer
        # gets decoded items, :mod:`.items`); ``decode_items=False``: a consumer that takes the
        # records themselves (a mix's inputs, which the mix's own decoder decodes).
        record_stages = list(itertools.takewhile(lambda s: not s.makes_batches, ds._stages))
        batched = len(record_stages) < len(ds._stages)
        self.decode_items = decode_items and decoder is not None and not batched
        # Origins are tracked only where an error could need them: a decode error, or a map or
        # filter over records (which also keys a map's seeds on the record).
        self.track_ids = ((decoder is not None and (batched or self.decode_items))
                          or any(s.needs_record_ids for s in record_stages))
        self.names: dict[int, str] = {}
        # Whether records reach batch() out of stream order (a record-level shuffle before it,
        # or a map that hands results out as they finish).
        self.reordered = any(s.reorders_records for s in record_stages)
        self.batched = False  # whether items are batches at the stage being applied
        self.header: Optional[bytes] = None
        self.header_source: Optional[str] = None
        self.fast_forward: Optional[_resume.FastForward] = None  # set by Dataset.iter_from
        # The read size for sources not given one (a mix's share for an input, see
        # streamio.pipeline.mix); None: the reader's default. It never changes the records.
        self.read_size: Optional[int] = None
        # The read size for those sources once their first read shows large records (a mix
        # input's larger share, see RecordReader.record_lists); None: read_size throughout.
        self.large_read_size: Optional[int] = None
        # Whether the blocks of read_sources() may be RecordSpans (records left in the read
        # buffer, valid until the next block is asked for): only a consumer that makes or
        # drops each block's records before asking for the next sets it (streamio.mix, for an
        # input without stages). Sources read whole, without a CSV header, give them.
        self.spans = False
        # Whether their records' CRCs may be left to that consumer (RecordSpans.crcs), which
        # checks each as it makes the record (RecordReader.record_lists(span_crcs=True)).
        self.span_crcs = False
        # Readers that keep their last bytes, by source ordinal (the last two), where this run
        # decodes rows in order with a decoder that names a bad row's byte offset (Csv).
        self.row_readers: Optional[dict] = (
            {} if getattr(decoder, "takes_row_offsets", False) and (batched or self.decode_items)
            and not self.reordered else None)

    @classmethod
    def for_sources(cls, ds: Any, epoch: int, stats: EpochStats) -> "EpochRun":
        """A run that reads ``ds``'s sources only: no feed, stages or decoder; every record
        with its origin, after the Dataset's ``shard()`` layers (:meth:`read_blocks`)."""
        run = cls(ds._derive(_feed=None, _stages=(), _decoder=None), epoch, stats)
        run.track_ids = True
        return run

    def name_source(self, ordinal: int, name: str) -> None:
        """Record the name of source ``ordinal`` (for errors): what a feed calls."""
        self.names[ordinal] = name

    def build(self) -> Iterator[tuple]:
        """The epoch's chain: the source end, then each stage applied in turn."""
        blocks: Iterator[tuple] = self.read_blocks()
        self.batched = False
        ff = self.fast_forward
        first = self.first_stage(len(self.ds._stages))
        for position, stage in enumerate(self.ds._stages):
            if position < first:
                continue  # a stage that builds_upstream builds these itself, if it needs them
            blocks = stage.apply(blocks, self, position)
            if ff is not None and ff.mode == "lazy" and ff.position == position:
                blocks = _resume.mark_and_decode(blocks, ff, self.decode)
        if ff is not None and ff.mode == "end":
            blocks = _resume.select_items(blocks, ff)  # the consumer has the others
        elif ff is not None and ff.mode == "lazy":
            blocks = _resume.drop_skipped(blocks, ff)
        if self.decode_items:
            blocks = decode_items(self, blocks)  # after a resume's selection: skipped never
        return blocks

    def first_stage(self, stop: int) -> int:
        """Where the chain of the stages before ``stop`` starts: at the last one that
        ``builds_upstream`` (a cache that may serve the epoch without reading anything), which
        gets the source end unstarted and builds the stages before it itself (:meth:`upstream`)
        only if it reads them, so that nothing before it starts (a source, a prefetch thread);
        else 0. Sets :attr:`batched` for the stages it leaves out."""
        stages = self.ds._stages[:stop]
        first = max((p for p, s in enumerate(stages) if getattr(s, "builds_upstream", False)),
                    default=0)
        self.batched = any(s.makes_batches for s in stages[:first])
        return first

    def upstream(self, position: int, epoch: int, *, track_ids: bool = False
                 ) -> tuple["EpochRun", Iterator[tuple]]:
        """``(view, blocks)``: the chain of the stages before ``position``, run as epoch
        ``epoch``, for a stage that ``builds_upstream``. ``view`` is this run as that epoch
        (it shares the stats, the source names and the decoder); ``track_ids``: carry record
        origins even where this run would not. No fast-forward applies before such a stage
        (its ``item_flow`` is None: a resume skips after it)."""
        view = copy.copy(self)
        view.epoch = epoch
        view.fast_forward = None
        view.track_ids = self.track_ids or track_ids
        blocks: Iterator[tuple] = view.read_blocks()
        for p in range(view.first_stage(position), position):
            blocks = self.ds._stages[p].apply(blocks, view, p)
        return view, blocks

    def decode_stage(self, blocks: Iterator[tuple], together: bool) -> Iterator[tuple]:
        """The decoder after ``batch()``; a resume's fast-forward skips batches or defers
        decoding here (see :func:`streamio.pipeline.resume.plan_fast_forward`)."""
        ff = self.fast_forward
        if ff is not None and ff.mode == "before_decode":
            blocks = _resume.select_batches(blocks, ff)  # the others are never decoded
        if ff is not None and ff.mode == "lazy":
            return _resume.defer_decode(blocks)
        return self.decode_blocks(blocks, together)

    def place(self, position: int) -> "parallel.MapPlace":
        ctx = self.ds._context
        return parallel.MapPlace(self.epoch, position, ctx.rank, ctx.worker, self.names,
                                 INDEX_BITS, self.stats)

    # -- the source end -------------------------------------------------------------------------
    def read_blocks(self) -> Iterator[tuple]:
        ds = self.ds
        if ds._feed is not None:
            yield from ds._feed(self)
            return
        yield from self.read_sources()

    def read_sources(self) -> Iterator[tuple]:
        """Blocks ``(records, ids)`` of the Dataset's sources, in order, after its shards."""
        ds = self.ds
        stats = self.stats
        layers = ds._round_robin
        header_first = self.decoder is not None and takes_header(self.decoder)
        options = ds._reader_options
        if self.read_size is not None and "read_size" not in options:
            options = {**options, "read_size": self.read_size}
        # Sources given their own read size keep it; others may read larger once large.
        large = self.large_read_size if "read_size" not in ds._reader_options else None
        for ordinal in ds._selection:
            source = ds._all_sources[ordinal]
            # Fewer sources than readers: a byte range of the source where it allows one, else
            # every record of it, dealt round-robin below.
            plan = plan_range(source, ds._format, ds._reader_options, layers) if layers else None
            shares = () if plan is not None else layers
            if plan is not None:
                start, end = plan.byte_range
                if end is not None and start >= end:
                    continue  # no record starts in this reader's range
                reader = RecordReader(source, ds._format, byte_range=plan.byte_range,
                                      **options)
                if header_first and start > 0:
                    self.use_header(_first_record(source, ds), source_name(source))
            else:
                reader = RecordReader(source, ds._format, **options)
            stats.reader_opened(reader.stats)
            if self.row_readers is not None:
                reader.keep_row_offsets()
                self.row_readers.pop(ordinal, None)
                self.row_readers[ordinal] = reader
                if len(self.row_readers) > 2:
                    del self.row_readers[next(iter(self.row_readers))]
            spans = self.spans and plan is None and not shares and not header_first
            try:
                seen = 0  # records of this source so far
                counters = [0] * len(shares)
                base = ordinal << INDEX_BITS
                for records in reader.record_lists(spans=spans, span_crcs=self.span_crcs,
                                                   large_read_size=large):
                    self.names[ordinal] = reader.source_name
                    if header_first and seen == 0 and (plan is None or plan.byte_range[0] == 0):
                        self.use_header(records[0], reader.source_name)
                        records = records[1:]
                        seen = 1
                    ids = (np.arange(base + seen, base + seen + len(records), dtype=np.int64)
                           if self.track_ids else None)
                    seen += len(records)
                    for layer, (num_shards, index) in enumerate(shares):
                        # Shard (source position + record position) % num_shards: every record
                        # of the layer's input goes to exactly one shard, and short sources
                        # do not all favour shard 0.
                        start = (index - ordinal - counters[layer]) % num_shards
                        counters[layer] += len(records)
                        records = records[start::num_shards]
                        if ids is not None:
                            ids = ids[start::num_shards]
                    if records:
                        # Handed over: the frame keeps no reference to the list it yields (see
                        # RecordReader.record_lists).
                        block = [(records, ids)]
                        del records, ids
                        yield block.pop()
            finally:
                reader.close()
                stats.reader_closed(reader.stats)

    def use_header(self, header: bytes, source: str) -> None:
        """Prime the epoch's decoder with the first header; later streams must repeat it."""
        if header.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM is no part of the header
            header = header[3:]
        if self.header is None:
            self.header = header
            self.header_source = source
            self.decoder.decode_batch([header], source=source, first_index=0)
        elif header != self.header:
            raise DecodeError(f"the header differs from that of {self.header_source}",
                              source=source, record_index=0)

    # -- batching and decoding -------------------------------------------------------------
    def batch(self, blocks: Iterator[tuple], size: int, drop_last: bool) -> Iterator[tuple]:
        """Cut blocks of records into blocks of batches (lists of records). With a decoder the
        blocks are ``(batches, ids)``, ``ids`` the records' origins in the batches' order (one
        array for the block, or None), for :meth:`decode_blocks`; without one, ``(batches,
        None)``."""
        keep_ids = self.decoder is not None
        pending: list = []
        pending_ids: list = []
        try:
            for items, ids in blocks:
                out: list = []
                out_ids: list = []
                pos = 0
                if pending:
                    pos = size - len(pending)
                    pending.extend(items[:pos])
                    if ids is not None:
                        pending_ids.append(ids[:pos])
                    if len(pending) < size:
                        continue
                    out.append(pending)
                    out_ids = pending_ids
                    pending, pending_ids = [], []
                end = pos + (len(items) - pos) // size * size
                # Unshuffled batching is list slicing: no per-record Python work.
                out.extend([items[s:s + size] for s in range(pos, end, size)])
                if ids is not None and end > pos:
                    out_ids.append(ids[pos:end])
                if end < len(items):
                    pending = items[end:]
                    if ids is not None:
                        pending_ids = [ids[end:]]
                if out:
                    yield out, (_join_ids(out_ids) if keep_ids else None)
            if pending and not drop_last:
                yield [pending], (_join_ids(pending_ids) if keep_ids else None)
        finally:
            close_blocks(blocks)

    def decode_blocks(self, blocks: Iterator[tuple], together: bool) -> Iterator[tuple]:
        """Decode blocks of batches; a batch that fails is raised after the ones before it.

        ``together``: a decoder whose outputs are all fixed-shape rows (``output_spec()``: no
        sparse field, no varying dimension) decodes a block's batches in one call, and each
        batch is a slice of the result: one decoder call per chunk of input instead of one per
        batch.
        """
        split: Optional[bool] = None if together else False  # known once the decoder knows
        try:
            for batches, ids in blocks:
                if split is None:
                    split = _rows_split(self.decoder)
                if len(batches) > 1 and split:
                    out = self.decode_together(batches, ids)
                    if out is not None:
                        yield out, None
                        continue
                out = []
                start = 0
                try:
                    for records in batches:
                        stop = start + len(records)
                        out.append(self.decode(records, None if ids is None else ids[start:stop]))
                        start = stop
                except BaseException:
                    if out:
                        yield out, None  # every whole batch before the fault is delivered
                    raise
                yield out, None
        finally:
            close_blocks(blocks)

    def decode_together(self, batches: list, ids: Optional[np.ndarray] = None
                        ) -> Optional[list]:
        """Decode ``batches`` in one decoder call and slice the result back into batches; None
        if that cannot stand for decoding them one by one (an error, whose batch and record
        the caller finds by doing so, or rows that did not come out one per record). Rows the
        decoder drops are placed by the errors that name them (stream order, one source)."""
        first = self._in_order(ids)
        if first is None and getattr(self.decoder, "on_error", None) == "warn":
            return None  # its warnings would name batch positions, then each batch's records
        clock = time.perf_counter
        t0 = clock()
        try:
            records = list(itertools.chain.from_iterable(batches))
            try:
                with counting_skips() as skipped:
                    table = self.decoder.decode_batch(
                        records, **({} if first is None else self._naming(first)))
            except FormatError:
                return None
            dropped = _dropped_rows(skipped, None if first is None else first & INDEX_MASK,
                                    len(records))
            if dropped is None:
                return None  # rows dropped, not all placed: decoded again batch by batch
            total = len(records) - len(dropped)
            # numpy arrays, or torch tensors (an Image(device="cuda") column): sliced alike
            if not table or not all(getattr(v, "ndim", 0) and len(v) == total
                                    for v in table.values()):
                return None  # e.g. a CSV block that held a repeated header row
            out = []
            start = row = 0
            for batch in batches:
                size = len(batch)
                stop, end = start + size, row + size
                if dropped:  # the batch's own rows that came out
                    end -= bisect.bisect_left(dropped, stop) - bisect.bisect_left(dropped, start)
                out.append({name: column[row:end] for name, column in table.items()})
                start, row = stop, end
            self.stats.note_decoder_skips(skipped)
            return out
        finally:
            self.stats.decode_s += clock() - t0

    def decode(self, records: list, ids: Optional[np.ndarray]) -> Any:
        clock = time.perf_counter
        t0 = clock()
        try:
            with counting_skips() as skipped:
                return self._decode(records, ids)
        finally:
            self.stats.note_decoder_skips(skipped)
            self.stats.decode_s += clock() - t0

    def _in_order(self, ids: Optional[np.ndarray]) -> Optional[int]:
        """The first record's origin where ``ids`` are a run of consecutive records of one
        source in stream order (no round-robin stride), so that the decoder can name a bad
        record itself; else None."""
        if ids is None or not len(ids) or self.reordered:
            return None
        first, last = int(ids[0]), int(ids[-1])
        if first >> INDEX_BITS == last >> INDEX_BITS and last - first == len(ids) - 1:
            return first
        return None

    def _naming(self, first: int) -> dict:
        """The decoder's keywords that name the records from origin ``first`` on: source,
        first index and, where the source's reader keeps its last bytes, row offsets."""
        ordinal = first >> INDEX_BITS
        naming: dict[str, Any] = dict(source=self.names.get(ordinal),
                                      first_index=first & INDEX_MASK)
        reader = self.row_readers.get(ordinal) if self.row_readers else None
        if reader is not None:
            naming["row_offset"] = reader.row_offset
        return naming

    def _decode(self, records: list, ids: Optional[np.ndarray]) -> Any:
        if ids is None or not len(ids):
            return self.decoder.decode_batch(records)
        first = self._in_order(ids)
        if first is not None:
            return self.decoder.decode_batch(records, **self._naming(first))
        source = self.names.get(self.ds._selection[0]) if len(self.ds._selection) == 1 else None
        try:
            return self.decoder.decode_batch(records, source=source, first_index=0)
        except FormatError as exc:
            renamed = self.rename_error(exc, ids)
            if renamed is exc:
                raise
            raise renamed from exc

    def rename_error(self, exc: FormatError, ids: np.ndarray) -> FormatError:
        """The same error, naming the record by its stream position, not its batch position."""
        position = exc.record_index
        if position is None or not 0 <= position < len(ids):
            return exc
        origin = int(ids[position])
        source = self.names.get(origin >> INDEX_BITS)
        kwargs: dict[str, Any] = dict(source=source, offset=None,
                                      record_index=origin & INDEX_MASK)
        if isinstance(exc, DecodeError):
            kwargs["field"] = exc.field
        try:
            return type(exc)(exc.reason, **kwargs)
        except Exception:  # noqa: BLE001 - a subclass with another signature: keep the original
            return exc


def _rows_split(decoder: Any) -> Optional[bool]:
    """Whether a batch of the decoder's output is a row slice of a larger batch's output: every
    field dense (or object) with a fixed shape. None while the decoder cannot tell (its
    ``output_spec()`` is None until it has seen a batch)."""
    if not callable(getattr(decoder, "output_spec", None)):
        return False
    spec = decoder.output_spec()
    if spec is None:
        return None
    return bool(spec) and all(f.kind != "sparse" and None not in f.shape for f in spec.values())


def _dropped_rows(skipped: Any, first_index: Optional[int], count: int) -> Optional[list]:
    """The block positions of the records a decoder dropped, sorted, from the errors that
    named them (``decoders.skips.Skips.errors``); None unless every one is placed."""
    if not skipped:
        return []
    errors = getattr(skipped, "errors", ())
    if first_index is None or len(errors) != sum(skipped.values()):
        return None
    rows = sorted({-1 if e.record_index is None else e.record_index - first_index
                   for e in errors})
    if len(rows) != len(errors) or not (0 <= rows[0] and rows[-1] < count):
        return None
    return rows


def _join_ids(parts: list) -> Optional[np.ndarray]:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts)



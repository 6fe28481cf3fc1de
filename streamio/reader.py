"""The one place where I/O meets parsing: read a chunk, decompress it, feed the framer, hand out
records. Everything below this module is pure (codecs, formats); everything above it sees records.

``write_records`` is the inverse loop, for TFRecord and RecordIO.
"""

from __future__ import annotations

import difflib
import functools
import glob
import inspect
import itertools
import os
import stat
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

from .codecs import (check_compression, describe_head, infer_compression, make_codec,
                     make_compressor)
from .errors import DecodeError, FormatError, SourceError, UsageError, UsageTypeError
from .formats import (DEFAULT_MAX_RECORD_SIZE, FORMATS, RecordSpans, check_common,
                      encode_recordio, encode_tfrecord, make_framer)
from .formats.index_file import without_index_files
from .formats.recordio import MULTIPART_CHOICES
from .formats.text import ROW_OFFSET_BYTES
from . import _read_buffers as read_buffers
from ._util import ItemChain, exhaust_iterator
from .sources import (ByteSource, PipeChannel, check_source, check_timeouts_apply, open_source,
                      source_name)
from .sources.base import check_timeout
from .sources.local_tree import LocalTree, check_glob_match
from .sources.ranged import MAX_OFFSET, open_at, range_capable

#: Span blocks (``record_lists(spans=True)``) are given for a chunk only while the chunk before
#: it framed records of at most this many bytes on average (frames included): a mix made its
#: records from spans no slower than from lists up to 1 KiB a record (0.93x at 400 bytes,
#: 1.00x at 1 KiB), and slower past it (1.06x at 16 KiB; docs/performance.md, "History from
#: reader.py and _read_buffers.py").
SPAN_MEAN_MAX = 1024
#: The span buffer has room for a read of frames this long on average (a read of smaller ones
#: gives the records past its room in a list).
SPAN_PAIRS_FRAME = 64
#: 1 MiB reads: large enough that per-read overhead vanishes, and a pipe buffer's worth.
DEFAULT_READ_SIZE = 1024 * 1024
#: A reader given ``large_read_size`` reads this much first (at most its ``read_size``), to
#: learn whether its records are large before it picks the size of the reads after.
PROBE_READ_SIZE = 64 * 1024
#: Past the end of its byte range a reader needs only the rest of its last record and the next
#: record's header: it reads in pieces this small, so it takes little of the next range's bytes.
PAST_END_READ_SIZE = 64 * 1024
READER_OPTIONS = frozenset({"compression", "verify", "on_error", "multipart", "max_record_size",
                            "read_size", "open_timeout", "read_timeout"})

# File objects (and stdin) are one-shot: a second pass would silently read nothing.
_consumed_files: "weakref.WeakSet[Any]" = weakref.WeakSet()
_stdin_consumed = False


@dataclass
class ReaderStats:
    """What one reader did: bytes from the source, records out, damage skipped, time waiting."""

    bytes_read: int = 0  # bytes taken from the source (compressed, if it is)
    bytes_decoded: int = 0  # bytes after decompression
    records: int = 0
    skipped_records: int = 0
    skipped_bytes: int = 0
    source_wait_s: float = 0.0  # time blocked in the source's reads (plus opening it)

    def add(self, other: "ReaderStats") -> None:
        for field in self.__dataclass_fields__:
            setattr(self, field, getattr(self, field) + getattr(other, field))


@functools.lru_cache(maxsize=None)
def _reader_keywords() -> frozenset:
    """The keywords RecordReader itself takes (read from its signature, so it stays true; read
    once: reading a signature took a fifth of the time to open a reader)."""
    params = inspect.signature(RecordReader.__init__).parameters
    return frozenset(name for name, p in params.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY) | READER_OPTIONS


def check_keywords(format: Any, options: Iterable[str], *, also: Iterable[str] = ()) -> None:
    """Raise :class:`UsageTypeError` naming the first keyword in ``options`` that neither the
    readers nor ``format`` take, with the closest known keyword as a suggestion (a typo such as
    ``compresion=`` would otherwise be blamed on the format). ``also``: the caller's own
    keywords, which are known too. An unknown format is left to :func:`make_framer` to name."""
    entry = FORMATS.get(format) if isinstance(format, str) else None
    if entry is None or not options:
        return
    known = _reader_keywords() | entry[1] | frozenset(also)
    unknown = [name for name in options if name not in known]
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}=?" if close else ""
    raise UsageTypeError(f"unknown keyword argument {name}={hint} (with format {format!r} the"
                         f" keywords are: {', '.join(sorted(known))})")


def _is_glob(text: str) -> bool:
    return glob.has_magic(text) and not os.path.exists(text)


#: What a link refused in a directory or glob tells the user to do instead.
_LINK_HINT = ("name the file itself (a path you give is followed), or pass the list of paths"
              " (e.g. sorted(glob.glob(...)))")


def _readable(mode: int) -> bool:
    # Regular files and FIFOs; directories are not descended into and hidden files are skipped.
    return stat.S_ISREG(mode) or stat.S_ISFIFO(mode)


def _glob_matches(text: str) -> list:
    """The files a glob matches, sorted; a match reached through a link that a wildcard (or a
    ``**``) met is refused (:func:`~streamio.sources.local_tree.check_glob_match`)."""
    matches = []
    for path in sorted(glob.glob(text, recursive=True)):
        if os.path.basename(path).startswith("."):
            continue
        check_glob_match(text, path, _LINK_HINT)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if _readable(mode):
            matches.append(path)
    return matches


def _directory_files(text: str) -> list:
    """A directory's files (not its subdirectories), sorted; a link in it is refused."""
    try:
        with LocalTree(text, hint=_LINK_HINT) as tree:
            found = tree.files(recursive=False)
    except OSError as exc:
        raise SourceError(f"cannot list the directory: {exc.strerror or exc}",
                          source=text) from exc
    return [os.path.join(text, rel) for rel, st in found if _readable(st.st_mode)]


def _expand(source: Any) -> list:
    """One user-given source -> the sources it names (a glob or directory names several)."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, bytes) or text == "-" or "://" in text:
            return [source]
        if _is_glob(text):
            matches = _glob_matches(text)
            if not matches:
                raise UsageError(f"no files match {text!r}")
            return without_index_files(matches)
        if os.path.isdir(text):
            files = _directory_files(text)
            if not files:
                raise UsageError(f"directory {text!r} holds no files to read")
            return without_index_files(files)
    return [source]


def expand_sources(source_or_list: Any) -> tuple:
    """The sources a user's ``source_or_list`` names, in order: a list or tuple is read item by
    item; a glob (``"data/*.tfrecord"``) gives its matches, sorted; a directory its files, sorted
    (hidden ones and subdirectories skipped); from both, the index files of data files among
    them are left out (:func:`~streamio.formats.index_file.without_index_files`); anything else
    is one source. A symbolic link that a directory holds, or that a glob's wildcards reach, is
    refused with a :class:`UsageError` naming it (someone who can write the folder could point it
    at a file they may not read); a path given as such is opened as named, links and all."""
    items = list(source_or_list) if isinstance(source_or_list, (list, tuple)) else [source_or_list]
    if not items:
        raise UsageError("no source given (an empty list)")
    out: list = []
    for item in items:
        out.extend(_expand(item))
    return tuple(out)


def _is_file_object(source: Any) -> bool:
    return not isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview, PipeChannel,
                                   ByteSource))


class RecordReader:
    """Reads one source front to back and yields its records.

    Arguments are checked here, at construction; the source is opened only when iteration starts.
    ``record_lists()`` yields the records completed by each chunk as a list (the pipeline consumes
    these, avoiding per-record generator overhead); iterating the reader yields single records.

    ``byte_range=(start, end)``: read only the records that *start* in bytes ``[start, end)`` of
    the source (``end`` None: to its end). The reader opens the source at ``start`` (a regular
    file, an http(s) URL or an s3:// object; uncompressed), finds the first record start there
    (TFRecord: a header whose length and data CRCs check out; RecordIO: an aligned magic number;
    lines and CSV: the next line feed), and reads past ``end`` only to finish its last record.
    Readers given ranges that tile a source deliver each of its records exactly once.
    """

    def __init__(self, source: Any, format: str, *, compression: Optional[str] = "infer",
                 verify: bool = True, on_error: str = "raise", multipart: str = "dmlc",
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
                 read_size: int = DEFAULT_READ_SIZE, open_timeout: Optional[float] = None,
                 read_timeout: Optional[float] = None,
                 byte_range: Optional[tuple] = None, **format_options: Any) -> None:
        check_keywords(format, format_options)
        check_source(source)
        check_compression(compression)
        check_common(on_error, max_record_size)
        check_timeout("open_timeout", open_timeout)
        check_timeout("read_timeout", read_timeout)
        check_timeouts_apply(source, open_timeout=open_timeout, read_timeout=read_timeout)
        if isinstance(read_size, bool) or not isinstance(read_size, int) or read_size <= 0:
            raise UsageError(f"read_size must be a positive int, not {read_size!r}")
        self.source = source
        self.source_name = source_name(source)
        self.format = format
        self._framer_options = dict(verify=verify, on_error=on_error, multipart=multipart,
                                    max_record_size=max_record_size, **format_options)
        make_framer(format, source=self.source_name, **self._framer_options)  # validate now
        self.compression = compression
        self.read_size = read_size
        self.open_timeout = open_timeout
        self.read_timeout = read_timeout
        self.byte_range = _check_byte_range(byte_range, source, compression)
        self.stats = ReaderStats()
        self._src: Optional[ByteSource] = None
        self._started = False
        # The size _pieces turns to after its first read, when record_lists decides one.
        self._grow_to: Optional[int] = None
        self._closed = False
        self._row_offsets = False  # keep_row_offsets() was called
        self._framer: Any = None  # kept for row_offset()

    def _open(self) -> ByteSource:
        global _stdin_consumed
        source = self.source
        if _is_file_object(source):
            try:
                if source in _consumed_files:
                    raise UsageError(f"{self.source_name} was read to the end by an earlier pass;"
                                     " pass a path, URL or PipeChannel to read several epochs")
            except TypeError:  # not weak-referenceable: cannot tell
                pass
        if isinstance(source, str) and source == "-" and _stdin_consumed:
            raise UsageError("stdin was read to the end by an earlier pass")
        if self.byte_range is not None:
            return open_at(source, self._origin, open_timeout=self.open_timeout,
                           read_timeout=self.read_timeout)
        return open_source(source, open_timeout=self.open_timeout, read_timeout=self.read_timeout)

    def _mark_consumed(self) -> None:
        global _stdin_consumed
        if isinstance(self.source, str) and self.source == "-":
            _stdin_consumed = True
        elif _is_file_object(self.source):
            try:
                _consumed_files.add(self.source)
            except TypeError:
                pass

    def record_lists(self, spans: bool = False, span_crcs: bool = False,
                     large_read_size: Optional[int] = None) -> Iterator[Any]:
        """Yield, per chunk read, the list of records it completed. One pass only.

        ``spans=True``: where the format frames records where they lie (TFRecord), the records
        of a chunk that lie whole in it come as a
        :class:`~streamio.formats._framing.RecordSpans` (a sequence of ``bytes`` made on
        demand) rather than a list, valid only until the next block is asked for: the consumer
        makes or drops them before then (``streamio.mix``, which makes each record when it
        hands it out). A chunk may then give up to three blocks (records completed from the
        previous chunk, the spans, the records after a fault).

        ``span_crcs=True`` (with ``spans``): where the framer allows it (TFRecord read with
        ``verify`` and ``on_error="raise"``), a span block's payload CRCs are left to the
        consumer (``RecordSpans.crcs``), who checks each as it makes the record, in one pass
        over its bytes, and reports a mismatch with ``RecordSpans.fault(i)``: the error the
        list path raises at that record, raised by the consumer after the records before it,
        and by this generator if asked for more.

        ``large_read_size`` (larger than ``read_size``; whole sources only, a byte range keeps
        its ``read_size``): the first read takes :data:`PROBE_READ_SIZE` bytes (at most
        ``read_size``); if its records prove large (over :data:`SPAN_MEAN_MAX` bytes on
        average, frames included, or none whole in it) the reads after it take
        ``large_read_size`` bytes, else ``read_size``. A mix reads each input a share of one
        reader's size, and its inputs of large records a larger share (see
        :mod:`streamio.pipeline.mix`): small records keep the smaller reads (fewer objects
        made at once), large ones take fewer, larger reads, as a Dataset read alone does. The
        records are the same either way."""
        _check_large_read_size(large_read_size)
        if self._started:
            raise UsageError("a RecordReader reads its source once; make a new one for another"
                             " pass")
        self._started = True
        src, framer, codec, end = self._start()
        # The read size after the first read, from its records (see above): decided once.
        grow = (large_read_size if large_read_size is not None and end is None
                and large_read_size > self.read_size else None)
        first_read = self.read_size if grow is None else min(PROBE_READ_SIZE, self.read_size)
        # The framer sees one stream of pieces, whether they came straight from the source or
        # out of the codec (its tail included); finish() then ends the stream.
        pieces = (self._pieces(src, codec, framer, first_read) if end is None else
                  self._range_pieces(src, self._origin, end))
        blocks = (_SpanBlocks(framer, self.stats, self.read_size, span_crcs)
                  if spans and getattr(framer, "_scan_spans", None) is not None else None)
        try:
            yield from self._framed(pieces, framer, codec, blocks, grow, end)
        finally:
            if blocks is not None:
                blocks.release()
            self.stats.skipped_records = framer.skipped_records
            self.stats.skipped_bytes = framer.skipped_bytes
            self.close()

    def _start(self) -> tuple:
        """Open the source and make its framer and codec: ``(src, framer, codec, end)``, ``end``
        the end of the byte range (None: the whole source)."""
        stats = self.stats
        clock = time.perf_counter
        end = None
        if self.byte_range is not None:
            # The framer says where the bytes it needs begin (a line reader wants the byte
            # before the range, to tell whether a line starts at its first byte).
            framer = make_framer(self.format, source=self.source_name, **self._framer_options)
            start, end = self.byte_range
            self._origin = framer.start_range(start, end)
        t0 = clock()
        src = self._src = self._open()
        stats.source_wait_s += clock() - t0
        name = src.name or self.source_name
        self.source_name = name
        try:
            if self.byte_range is None:
                framer = make_framer(self.format, source=name, **self._framer_options)
                # "infer": by the name's suffix, else by the first bytes (a sniffing codec).
                codec = make_codec(self.compression, name)
            else:
                codec = None  # checked at construction: a byte range is read as it is
        except BaseException:
            self.close()
            raise
        if self._row_offsets and hasattr(framer, "keep_row_offsets"):
            framer.keep_row_offsets(max(ROW_OFFSET_BYTES, 2 * self.read_size))
            self._framer = framer
        return src, framer, codec, end

    def keep_row_offsets(self) -> None:
        """Before reading: have the framer keep the last bytes it framed (CSV: a few MiB, see
        :data:`~streamio.formats.text.ROW_OFFSET_BYTES`), so that :meth:`row_offset` can say
        where a recent record starts. Other formats keep nothing."""
        self._row_offsets = True

    def row_offset(self, index: int) -> Optional[int]:
        """The byte offset (in the decompressed stream) where record ``index`` of this reader
        starts, if its framer still holds its bytes (:meth:`keep_row_offsets`); else None."""
        locate = getattr(self._framer, "row_offset", None)
        return None if locate is None else locate(index)

    def _framed(self, pieces: Iterator[Any], framer: Any, codec: Any,
                blocks: Optional["_SpanBlocks"], grow: Optional[int],
                end: Optional[int]) -> Iterator[Any]:
        """The blocks of records the framer makes of ``pieces`` and then of its ``finish()``
        (see :meth:`record_lists`). Python runs here once per read, never once per record. A
        framing error at the very first record says what the bytes look like
        (:func:`_with_hint`)."""
        stats = self.stats
        feed = framer.feed
        head = bytearray()  # the first bytes the framer saw, to say what they look like
        framing = False  # a FormatError while True came from the framer, else from the codec
        # Whether the last chunk's records were small (SPAN_MEAN_MAX): the next chunk then comes
        # as spans, if the format gives them (blocks); the first chunk comes as a list and tells.
        small = False
        try:
            for piece in pieces:
                framing = True
                if blocks is not None:
                    blocks.end_lent()
                if piece.__class__ is int:  # read into the framer's rest_buffer()
                    records = framer.rest_filled(piece)
                    small = False  # a large frame completed in place (for spans)
                else:
                    if len(head) < _HEAD_BYTES:
                        head += piece[:_HEAD_BYTES - len(head)]
                    if not small:
                        records = feed(piece)
                        framed = len(records)
                    else:
                        records, framed = yield from blocks.feed(piece)
                    # Whether this chunk's records were small: spans for the next chunk,
                    # and (the first chunk, once) the reader's own read size after it.
                    small_records = framed > 0 and len(piece) <= SPAN_MEAN_MAX * framed
                    if blocks is not None:
                        small = small_records
                    if grow is not None:
                        self._grow_to = self.read_size if small_records else grow
                        grow = None
                framing = False
                stats.skipped_records = framer.skipped_records
                stats.skipped_bytes = framer.skipped_bytes
                if records:
                    stats.records += len(records)
                    # Handed over: this frame keeps no reference to a list it yielded, so a
                    # consumer holding the only one may move its items out (streamio.mix).
                    records = [records]
                    yield records.pop()
                if end is not None and framer.done:
                    break
            framing = True
            if blocks is not None:
                blocks.end_lent()
            yield from _finished(framer, stats)
        except FormatError as exc:
            hinted = _with_hint(exc, framer, bytes(head), self.format, codec) if framing else exc
            if hinted is exc:
                raise
            raise hinted from exc

    def _pieces(self, src: ByteSource, codec: Any, framer: Any, size: int) -> Iterator[Any]:
        """The decompressed bytes of ``src``, chunk by chunk (views into one reused buffer of
        ``size`` bytes, or of the size record_lists then sets in ``_grow_to``); or, where the
        stream is plain and the framer offers the rest of a large frame (``rest_buffer``), the
        number of bytes read straight into it."""
        stats = self.stats
        clock = time.perf_counter
        readinto = src.readinto
        # Optional in the framer protocol: framers that keep no frame of their own (the
        # SageMaker manifest grouper, "object", a user's registered framer) are fed chunks.
        rest_buffer = getattr(framer, "rest_buffer", None)
        # A sniffing codec says "plain" only once it has seen the first bytes; from then on its
        # decode() would hand each chunk on as it is, so the chunks skip it.
        plain = codec is None or getattr(codec, "plain", False)
        while size:  # one size, or the first read's and then the size it decided
            with read_buffers.borrowed(size) as view:  # kept for the next reader
                size = 0
                while True:
                    if self._grow_to is not None:  # the size of the reads from here on
                        grown, self._grow_to = self._grow_to, None
                        if grown != len(view):
                            size = grown
                            break
                    rest = rest_buffer() if rest_buffer is not None and plain else None
                    t0 = clock()
                    n = readinto(view if rest is None else rest)
                    stats.source_wait_s += clock() - t0
                    if not n:
                        break
                    stats.bytes_read += n
                    if rest is not None:
                        rest.release()
                        stats.bytes_decoded += n
                        yield n
                        continue
                    if plain:
                        stats.bytes_decoded += n
                        yield view[:n]
                        continue
                    for piece in codec.decode(view[:n]):
                        stats.bytes_decoded += len(piece)
                        yield piece
                    plain = getattr(codec, "plain", False)  # decided while decoding
        self._mark_consumed()
        if codec is not None:
            for piece in codec.finish():
                stats.bytes_decoded += len(piece)
                yield piece

    def _range_pieces(self, src: ByteSource, offset: int, end: int) -> Iterator[Any]:
        """The bytes of ``src`` from stream ``offset`` on: whole reads up to ``end``, then small
        ones (the framer stops the loop once its last record is whole)."""
        stats = self.stats
        clock = time.perf_counter
        readinto = src.readinto
        with read_buffers.borrowed(self.read_size) as view:
            while True:
                left = end - offset
                want = min(self.read_size, left if left > 0 else PAST_END_READ_SIZE)
                t0 = clock()
                n = readinto(view[:want])
                stats.source_wait_s += clock() - t0
                if not n:
                    return
                offset += n
                stats.bytes_read += n
                stats.bytes_decoded += n
                yield view[:n]

    def __iter__(self) -> Iterator[bytes]:
        # Each read's list handed out by C code, not a record at a time by a generator.
        return itertools.chain.from_iterable(self.record_lists())

    def close(self) -> None:
        """Close the source (safe to call more than once, and before or after iterating)."""
        self._closed = True
        if self._src is not None:
            src, self._src = self._src, None
            try:
                src.close()
            except OSError as exc:  # pragma: no cover - closing a read end rarely fails
                raise SourceError(f"close failed: {exc}", source=self.source_name) from exc

    def __enter__(self) -> "RecordReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _finished(framer: Any, stats: ReaderStats) -> Iterator[list]:
    """The records the framer's ``finish()`` completes (the end of the stream)."""
    records = framer.finish()
    if records:
        stats.records += len(records)
        records = [records]  # handed over, as a read's list is
        yield records.pop()
    # A fault finish() met after the records it returned (the rule: raised by the next call,
    # and there is none).
    pending = getattr(framer, "pending_error", None)
    if pending is not None:
        raise pending


def _check_large_read_size(large_read_size: Any) -> None:
    if large_read_size is not None and (isinstance(large_read_size, bool) or not (
            isinstance(large_read_size, int) and large_read_size > 0)):
        raise UsageError(f"large_read_size must be a positive int or None, not"
                         f" {large_read_size!r}")


class _SpanBlocks:
    """The span blocks of one pass (``record_lists(spans=True)``): the pairs' buffer, lent when
    first needed (room for a chunk of frames of :data:`SPAN_PAIRS_FRAME` bytes on average: more
    records go to the list) and reused; the block last handed out, ended before the next read."""

    def __init__(self, framer: Any, stats: ReaderStats, read_size: int, span_crcs: bool) -> None:
        self._framer = framer
        self._stats = stats
        self._read_size = read_size
        self._span_crcs = span_crcs
        self._pairs_buffer: Optional[bytearray] = None
        self._pairs: Optional[memoryview] = None
        self.lent: Optional[RecordSpans] = None

    def feed(self, piece: Any) -> Iterator[Any]:
        """Frame ``piece`` as spans: yield the records it completed from the chunk before (a
        list), then its span block (raising the error its consumer found in it, if asked for
        more); return the records after the spans (a list) and how many records it framed."""
        if self._pairs is None:
            self._pairs_buffer = read_buffers.lend(16 * (self._read_size // SPAN_PAIRS_FRAME + 1))
            self._pairs = memoryview(self._pairs_buffer).cast("q")
        pairs = self._pairs
        framer = self._framer
        records, buffer, n, at = framer.feed_spans(piece, pairs, self._span_crcs)
        framed = n + len(records)
        if n:
            lent = self.lent = RecordSpans(buffer, pairs[:2 * n],
                                           self._on_fault if framer.span_crcs else None)
            del buffer
            self._stats.records += n
            if at:
                self._stats.records += at
                first = [records[:at]]
                del records[:at]
                yield first.pop()  # handed over, as a list is
            yield lent
            if lent.error is not None:  # the consumer found a record damaged
                raise lent.error
        return records, framed

    def _on_fault(self, index: int) -> FormatError:
        # Record `index` of the block lent out failed its consumer's CRC check: the framer's
        # error at that frame; the records after it are not delivered.
        lent = self.lent
        self._stats.records -= len(lent) - index
        return self._framer.span_fault(index, lent.spans[2 * index])

    def end_lent(self) -> None:
        """End the block handed out last (its buffer is about to hold other bytes)."""
        if self.lent is not None:
            self.lent.release()
            self.lent = None

    def release(self) -> None:
        """The pass is over: end the last block, give the pairs' buffer back."""
        if self.lent is not None:
            self.lent.release()
        if self._pairs is not None:
            self._pairs.release()
            read_buffers.give_back(self._pairs_buffer)


def _check_byte_range(byte_range: Any, source: Any, compression: Any) -> Optional[tuple]:
    if byte_range is None:
        return None
    if (not isinstance(byte_range, tuple) or len(byte_range) != 2
            or any(isinstance(v, bool) for v in byte_range)
            or not isinstance(byte_range[0], int)
            or not (byte_range[1] is None or isinstance(byte_range[1], int))):
        raise UsageTypeError(f"byte_range must be a (start, end) tuple of ints (end may be None),"
                             f" not {byte_range!r}")
    start, end = byte_range
    if start < 0 or (end is not None and end < start):
        raise UsageError(f"byte_range must have 0 <= start <= end, not {byte_range!r}")
    if start > MAX_OFFSET:
        raise UsageError(f"byte_range starts past any file (2**63 - 1): {byte_range!r}")
    if not range_capable(source):
        raise UsageError(f"{source_name(source)} cannot be read by byte range: only regular files,"
                         " http(s) URLs and s3:// objects can (FIFOs, stdin, file objects and"
                         " other URLs are read front to back)")
    kind = infer_compression(source_name(source)) if compression == "infer" else compression
    if kind:
        raise UsageError(f"{source_name(source)} is {kind}-compressed: a compressed stream cannot"
                         " be read from the middle, so it cannot be split by byte range")
    return (start, end)


#: Bytes kept from the start of the stream: enough for every magic number and a TFRecord header.
_HEAD_BYTES = 16


def _with_hint(exc: FormatError, framer: Any, head: bytes, format: str, codec: Any) -> FormatError:
    """``exc``, or, when the very first record failed to frame, the same error that also says what
    the bytes look like ("... looks like gzip-compressed data: pass compression='gzip'"): a wrong
    format or compression otherwise shows as a bare CRC or magic mismatch at byte offset 0."""
    if (type(exc) is DecodeError or framer.records or framer.skipped_records
            or exc.record_index not in (0, None) or exc.offset not in (0, None)):
        return exc
    # ``head`` is what the framer saw: after the codec, if one decompressed the stream.
    hint = describe_head(head, format=format, decompressed=getattr(codec, "kind", None) is not None)
    if not hint:
        return exc
    return type(exc)(f"{exc.reason}; {hint}", source=exc.source, offset=exc.offset,
                     record_index=exc.record_index)


def read_records(source: Any, format: str, *, compression: Optional[str] = "infer",
                 verify: bool = True, on_error: str = "raise", multipart: str = "dmlc",
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
                 **format_options: Any) -> Iterator[bytes]:
    """Yield the records of ``source`` as ``bytes``; several sources are read in order, one
    open at a time.

    ``source``: a path (regular file or named pipe), ``"-"`` for stdin, an http(s) URL, an
    ``s3://``/``gs://``... URL (smart_open), a binary file object, bytes, a PipeChannel, a glob
    (``"data/*.tfrecord"``: its matches, sorted), a directory (its files, sorted, hidden ones
    skipped), or a list of these (as :class:`~streamio.Dataset` takes them).
    ``format``: ``"tfrecord"``, ``"recordio"``, ``"csv"`` or ``"lines"``. Arguments are checked
    now; reading starts with the first ``next()``. Errors are :class:`StreamioError` subclasses
    that name the source, byte offset and record; every whole record before a fault is delivered.
    Extra keywords: ``read_size``, ``open_timeout``, ``read_timeout`` (seconds; see
    :func:`streamio.sources.open_source`) and format options (``quotechar`` for csv).
    """
    sources = expand_sources(source)
    readers = [RecordReader(s, format, compression=compression, verify=verify, on_error=on_error,
                            multipart=multipart, max_record_size=max_record_size,
                            **format_options) for s in sources]
    return _Records(readers)


class _Records(ItemChain):
    """What :func:`read_records` returns: the readers' records in order, handed out by C code
    (a chain over each read's list of records; Python runs once per read, not per record: a
    fifth less time an epoch of 178-byte records than a generator's ``yield from``). As a
    generator's, ``close()`` closes the reader being read, as does dropping it."""

    _MADE_BY = "read_records()"

    def __new__(cls, readers: list) -> "_Records":
        # The list being handed out, kept here (not on the chain: no reference cycle).
        current: list = [iter(())]
        lists = _record_lists(readers, current)
        self = super().__new__(cls, lists)
        self._lists, self._current = lists, current
        return self

    def close(self) -> None:
        """Stop: nothing more is handed out and the reader being read is closed."""
        exhaust_iterator(self._current[0])
        self._lists.close()


def _record_lists(readers: list, current: list) -> Iterator[Iterator[bytes]]:
    for reader in readers:
        with reader:
            for records in reader.record_lists():
                current[0] = items = iter(records)
                yield items


# -- writing ----------------------------------------------------------------------------------
_ENCODERS = {"tfrecord": encode_tfrecord, "recordio": encode_recordio}


def write_records(dest: Any, format: str, records: Iterable[bytes], *,
                  compression: Optional[str] = None, multipart: str = "dmlc") -> None:
    """Write ``records`` to ``dest`` (a path, a FIFO, ``"-"`` or a binary file object).

    ``format``: ``"tfrecord"`` (readable by TensorFlow, with both CRCs) or ``"recordio"`` (the
    dmlc way: payloads holding the magic number at an aligned offset are split so they
    round-trip; ``multipart="concat"`` writes every payload as one whole frame, as the SageMaker
    SDK does). ``compression``: None, ``"gzip"``, ``"zlib"``, ``"zstd"`` or ``"infer"`` (from the
    name).
    """
    try:
        encode = _ENCODERS[format]
    except (KeyError, TypeError):
        raise UsageError(f"write_records supports {sorted(_ENCODERS)}, not {format!r}") from None
    if multipart not in MULTIPART_CHOICES:
        raise UsageError(f"multipart must be one of {MULTIPART_CHOICES}, not {multipart!r}")
    if format == "recordio":
        encode = functools.partial(encode_recordio, multipart=multipart)
    check_compression(compression)
    name = os.fspath(dest) if isinstance(dest, (str, os.PathLike)) else source_name(dest)
    if compression == "infer":
        compression = infer_compression(name)
    owned = isinstance(dest, (str, os.PathLike))
    try:
        if owned:
            f = sys.stdout.buffer if name == "-" else open(name, "wb")
        else:
            f = dest
        compressor = make_compressor(compression) if compression else None
        pending: list = []
        size = 0
        for record in records:
            frame = encode(record)
            pending.append(compressor.compress(frame) if compressor else frame)
            size += len(frame)
            if size >= DEFAULT_READ_SIZE:
                f.write(b"".join(pending))
                pending, size = [], 0
        if compressor:
            pending.append(compressor.flush())
        f.write(b"".join(pending))
        f.flush()
    except OSError as exc:
        raise SourceError(f"write failed: {exc}", source=name) from exc
    finally:
        if owned and name != "-" and "f" in locals():
            f.close()


def write_recordio_protobuf(dest: Any, features: Any, labels: Any = None, *,
                            compression: Optional[str] = None) -> None:
    """Write rows as SageMaker RecordIO-protobuf (``aialgs.data.Record`` in RecordIO frames).

    ``features``: a dense 2-D numpy array, a CSR matrix (:class:`~streamio.SparseBatch` or
    ``scipy.sparse``), or ``{key: array}``; a bare array is stored under the key ``values`` as the
    SageMaker SDK does. ``labels``: the same or None (a 1-D array: one label per row).
    """
    from .decoders.recordio_protobuf import encode_recordio_protobuf

    # Framed whole (one cflag-0 frame per record), as the SageMaker SDK writes them, so that
    # Amazon's readers, which join parts without restoring a magic number, read them too.
    write_records(dest, "recordio", encode_recordio_protobuf(features, labels),
                  compression=compression, multipart="concat")


__all__ = ["DEFAULT_READ_SIZE", "PAST_END_READ_SIZE", "READER_OPTIONS", "ReaderStats",
           "RecordReader", "check_keywords",
           "expand_sources", "read_records", "write_recordio_protobuf", "write_records"]

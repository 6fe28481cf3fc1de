"""Byte-range splits: how :meth:`Dataset.shard` shares one big source between readers.

With fewer sources than readers, a shard reads a byte range of each source instead of every
record of it: a record belongs to the reader whose range holds its first byte (see
:class:`~streamio.RecordReader`'s ``byte_range``). That needs a source that can be read from an
offset (a regular file, an http(s) URL, an s3:// object: :mod:`streamio.sources.ranged`), not
compressed, in a
format whose record starts can be found from anywhere (TFRecord, RecordIO ``"dmlc"``, lines; CSV
only when the user says rows hold no quoted line breaks: ``csv_quoted_newlines=False``; RecordIO
``"concat"`` only with an index, since its payloads may be RecordIO data). Anything else is
dealt round-robin, as before, with a warning saying so once per source.

An index beside the file (``x.tfrecord.index``: DALI's and the ``tfrecord`` package's "offset
length" lines; ``x.idx`` / ``x.rec.idx``: MXNet's "key<TAB>offset" lines; ``streamio index`` and
``streamio pack --index`` write them; the format is :mod:`streamio.formats.index_file`'s) moves
each cut to a record start, so no reader resyncs. An index is a hint, checked against the file
before it is used, and dropped with one warning when it does not fit:

- as a whole (the same verdict in every reader, so all cut the file alike): it parses; it lists
  records (a non-empty file); its offsets lie inside the file and increase; ``offset length``
  frames follow one another to the end of the file; a record starts at its last entry (confirmed
  by a range reader, as below) and none after it (the framer reads the rest: a stale index
  written before records were appended fails here). Records before its first entry are read
  anyway: the first cut is always byte 0.
- each cut it gives (the first entry at or after a split offset) is confirmed the way a range
  reader confirms a record start (TFRecord: length and data CRCs; RecordIO: an aligned magic
  with a first-part flag; lines: a line feed before it), by reading that record. A cut that
  fails falls back to the split offset itself: both readers that share a cut decide it from
  the same bytes, so the ranges still tile the file, and no record is lost or read twice.
"""

from __future__ import annotations

import bisect
import os
import warnings
from typing import Any, Optional

from ..codecs import infer_compression, make_codec
from ..errors import FormatError, SplitError, StreamioError, StreamioWarning
from ..formats.index_file import index_misfit, parse_index
from ..reader import RecordReader
from ..sources import source_name
from ..sources.ranged import probe, range_capable, split_range
from ..sources.schemes import local_path

__all__ = ["RangePlan", "find_index", "plan_range", "read_index", "splittable_size"]

_SPLITTABLE = ("tfrecord", "recordio", "lines")
_warned: set = set()  # (source name, reason): say each fallback once per process


class RangePlan:
    """One reader's share of one source: ``byte_range`` and whether it starts at a known record
    start (from an index: no resync needed)."""

    __slots__ = ("byte_range", "exact")

    def __init__(self, byte_range: tuple, exact: bool) -> None:
        self.byte_range = byte_range
        self.exact = exact

    def __repr__(self) -> str:
        return f"RangePlan({self.byte_range}, exact={self.exact})"


def _fallback(source: Any, reason: str) -> None:
    key = (source_name(source), reason)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"{source_name(source)} is not split by byte range ({reason}): its records"
                      " are dealt round-robin and every reader reads all of its bytes",
                      StreamioWarning, stacklevel=5)


def _local(source: Any) -> Optional[str]:
    return local_path(source)


def find_index(path: str) -> Optional[str]:
    """The index file beside ``path``, if one exists: ``path.index``, ``path.idx``, or the name
    without its extension plus ``.idx`` / ``.index`` (MXNet's ``train.rec`` + ``train.idx``)."""
    stem = os.path.splitext(path)[0]
    for candidate in (path + ".index", path + ".idx", stem + ".idx", stem + ".index"):
        if candidate != path and os.path.isfile(candidate):
            return candidate
    return None


def read_index(path: str) -> list:
    """The record start offsets an index file lists, in the order listed (see
    :mod:`streamio.formats.index_file`). Raises :class:`FormatError` on a line that is neither
    ``offset length`` nor ``key<TAB>offset``."""
    with open(path, "rb") as f:
        return parse_index(f.read(), source=path).offsets


def _splittable_format(format: str, options: dict) -> Optional[str]:
    """Why ``format`` cannot be split by range, or None if it can."""
    if format in _SPLITTABLE:
        return None
    if format == "csv":
        if options.get("csv_quoted_newlines", True) is False:
            return None
        return ("a CSV row may hold a quoted line break, so a row start cannot be found from the"
                " middle (pass csv_quoted_newlines=False if rows never do)")
    return f"format {format!r} has no known way to find a record start"


def splittable_size(source: Any, format: str, options: dict, *, warn: bool = True
                    ) -> Optional[int]:
    """The size of ``source`` if readers can share it by byte range (a regular file, an http(s)
    or s3:// URL, uncompressed, of a known size, in a format whose record starts can be found),
    else None; ``warn``: say why not, once per source (the round-robin fallback of
    :meth:`Dataset.shard`). One probe (a stat, or one request)."""
    fallback = _fallback if warn else (lambda source, reason: None)
    why = _splittable_format(format, options)
    if why is None and not range_capable(source):
        text = source if isinstance(source, str) else ""
        if "://" in text and local_path(text) is None:
            fallback(source, "only http(s) and s3:// URLs can be read from a byte offset")
        return None  # a FIFO, stdin, a PipeChannel...: one stream, round-robin as always
    compression = options.get("compression", "infer")
    name = source_name(source)
    if why is None and (compression not in (None, "infer") or
                        (compression == "infer" and infer_compression(name))):
        why = "it is compressed (a compressed stream cannot be read from the middle)"
    if why is not None:
        fallback(source, why)
        return None
    try:
        # The head is needed only to sniff a name that does not tell the compression.
        size, head = probe(source, head=compression == "infer",
                           open_timeout=options.get("open_timeout"),
                           read_timeout=options.get("read_timeout"))
    except StreamioError as exc:
        fallback(source, f"it could not be probed ({exc})")
        return None
    if size is None:
        fallback(source, "its size is unknown (no Content-Length)")
        return None
    if compression == "infer" and _sniffed(head, name):
        fallback(source, "it is compressed (a compressed stream cannot be read from the middle)")
        return None
    return size


def plan_range(source: Any, format: str, options: dict, layers: tuple) -> Optional[RangePlan]:
    """The byte range of ``source`` that the shard ``layers`` (``((num_shards, index), ...)``)
    give this reader, or None to deal the records round-robin (warned once per source)."""
    size = splittable_size(source, format, options)
    if size is None:
        return None
    start, end = split_range(size, layers)
    path = _local(source)
    index = find_index(path) if path is not None else None
    starts = _checked_index(source, index, format, options, size) if index is not None else None
    if starts is None and format == "recordio" and options.get("multipart") == "concat":
        # A concat payload may be RecordIO data itself (parts joined as they are, magic
        # numbers kept): its frames chain on into the file's, so no rule read from the middle
        # can tell them from records. Only an index places the cuts.
        _fallback(source, "a concat RecordIO payload may hold RecordIO frames, so a record start"
                  " cannot be found from the middle; `streamio index` writes an index that"
                  " splits it exactly")
        return None
    if starts is None:
        return RangePlan((start, end if end < size else None), exact=False)
    # Cut at the first record start at or after each split offset: exact, no resync.
    first, exact_first = _cut(source, index, starts, start, format, options, size)
    last, exact_last = _cut(source, index, starts, end, format, options, size)
    return RangePlan((first, None if last >= size else last), exact=exact_first and exact_last)


#: An index line per record needs at most this many bytes per byte of data (a 1-byte line's
#: "offset length" line, with 19-digit numbers): a larger "index" is not one, and is not read.
_INDEX_BYTES_PER_BYTE = 48
#: Verdicts on whole indexes: (index path, its stat, the data file's stat, format options) ->
#: the verified offsets or None. A process plans the same sources every epoch: each index is
#: read and checked once (a changed file has another stat), its cuts confirmed on every plan.
_verified: dict = {}
_VERIFIED_MAX = 64


def _checked_index(source: Any, index: str, format: str, options: dict,
                   size: int) -> Optional[list]:
    """The record starts the index at ``index`` lists, if it fits the ``size``-byte ``source``
    as a whole (module doc); else None, warned once."""
    try:
        ist, dst = os.stat(index), os.stat(_local(source))
    except OSError as exc:
        _fallback_index(index, f"cannot stat it ({exc.strerror})")
        return None
    key = (index, ist.st_ino, ist.st_size, ist.st_mtime_ns, dst.st_ino, dst.st_mtime_ns, size,
           format, options.get("multipart"), options.get("max_record_size"),
           options.get("verify"))
    if key in _verified:
        return _verified[key]
    starts = None
    try:
        why = None
        if ist.st_size > _INDEX_BYTES_PER_BYTE * size + 4096:
            why = f"its {ist.st_size} bytes are more than an index of a {size}-byte file takes"
        else:
            with open(index, "rb") as f:
                listed = parse_index(f.read(), source=index)
            why = index_misfit(listed, size) or _tail_misfit(source, listed.offsets, format,
                                                             options)
    except OSError as exc:
        why = f"cannot read it ({exc.strerror})"
    except FormatError as exc:
        why = str(exc)
    if why is None:
        starts = listed.offsets
    else:
        _fallback_index(index, why)
    if len(_verified) >= _VERIFIED_MAX:
        _verified.clear()  # start over (atomic, unlike evicting one while another thread plans)
    _verified[key] = starts
    return starts


def _tail_misfit(source: Any, starts: list, format: str, options: dict) -> Optional[str]:
    """Why the index's last entry does not hold the file's last record, or None."""
    if not starts:
        return None
    last = starts[-1]
    if _records_from(source, format, options, last, last + 1) != 1:
        return f"no record starts at byte {last}, its last entry"
    if _records_from(source, format, options, last + 1, None):
        return (f"records follow the one at byte {last}, its last entry: it covers only part of"
                " the file (written before records were added?)")
    return None


def _cut(source: Any, index: str, starts: list, x: int, format: str, options: dict,
         size: int) -> tuple:
    """``(cut, exact)``: where a range boundary at split offset ``x`` goes. The first record
    start the index lists at or after ``x``, if a range reader confirms it; else ``x`` itself
    (its readers resynchronise there). A function of ``x`` and the file's bytes only, so the
    two readers that share the boundary agree."""
    if x <= 0 or x >= size:
        return min(max(x, 0), size), True
    at = bisect.bisect_left(starts, x)
    if at == len(starts):
        return size, True  # verified: no record starts after the last entry's
    cut = starts[at]
    if _records_from(source, format, options, cut, cut + 1) == 1:
        return cut, True
    _fallback_index(f"{index} at byte {cut}", "no record starts there, where it says one does",
                    key=index)
    return x, False


def _records_from(source: Any, format: str, options: dict, start: int,
                  stop: Optional[int]) -> int:
    """How many records a range reader finds starting in ``[start, stop)`` (0, 1, or 2 meaning
    "more than one": it stops there). Damage there counts as none. A split at ``stop`` that
    cannot be made (a record there holds TFRecord frames chaining on: ``SplitError``, after
    the records) says nothing about where records start: the records found count."""
    reader = RecordReader(source, format, byte_range=(start, stop),
                          **dict(options, on_error="raise"))
    found = 0
    try:
        for records in reader.record_lists():
            found += len(records)
            if found > 1:
                return 2
    except SplitError:
        return found
    except StreamioError:
        return 0
    finally:
        reader.close()
    return found


def _fallback_index(index: str, why: str, key: Optional[str] = None) -> None:
    key = (key or index, "index")  # one warning per index file, whatever the reason
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"ignoring the index {index}: {why}; readers find record starts by"
                      " resynchronising instead", StreamioWarning, stacklevel=4)


def _sniffed(head: bytes, name: str) -> bool:
    """Whether ``head`` (a source's first bytes) is compressed data, as ``compression="infer"``
    would decide for a name without a telling suffix."""
    codec = make_codec("infer", name)
    try:
        for _ in codec.decode(head):
            break
        if getattr(codec, "kind", None) is None:
            for _ in codec.finish():
                break
    except StreamioError:
        return True  # it looked compressed enough to be tried, and failed: not plain data
    return getattr(codec, "kind", None) is not None

"""Byte-range splits: how :meth:`Dataset.shard` shares one big source between readers.

With fewer sources than readers, a shard reads a byte range of each source instead of every
record of it: a record belongs to the reader whose range holds its first byte (see
:class:`~streamio.RecordReader`'s ``byte_range``). That needs a source that can be read from an
offset (a regular file, an http(s) URL, an s3:// object: :mod:`streamio.sources.ranged`), not
compressed, in a
format whose record starts can be found from anywhere (TFRecord, RecordIO, lines; CSV only when
the user says rows hold no quoted line breaks: ``csv_quoted_newlines=False``). Anything else is
dealt round-robin, as before, with a warning saying so once per source.

An index beside the file (``x.tfrecord.index``: DALI's and the ``tfrecord`` package's "offset
length" lines; ``x.idx`` / ``x.rec.idx``: MXNet's "key<TAB>offset" lines; ``streamio index`` and
``streamio pack --index`` write them) moves each cut to a record start, so no reader resyncs.
"""

from __future__ import annotations

import bisect
import os
import warnings
from typing import Any, Optional

from ..codecs import infer_compression, make_codec
from ..errors import FormatError, StreamioError, StreamioWarning
from ..sources import source_name
from ..sources.ranged import probe, range_capable, split_range

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
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, str) and "://" not in text:
            return text
        if isinstance(text, str) and text.startswith("file://"):
            return text[len("file://"):]
    return None


def find_index(path: str) -> Optional[str]:
    """The index file beside ``path``, if one exists: ``path.index``, ``path.idx``, or the name
    without its extension plus ``.idx`` / ``.index`` (MXNet's ``train.rec`` + ``train.idx``)."""
    stem = os.path.splitext(path)[0]
    for candidate in (path + ".index", path + ".idx", stem + ".idx", stem + ".index"):
        if candidate != path and os.path.isfile(candidate):
            return candidate
    return None


def read_index(path: str) -> list:
    """The sorted record start offsets an index file lists. Lines are ``offset length`` (DALI,
    the ``tfrecord`` package) or ``key<TAB>offset`` (MXNet ``.idx``); blank lines are ignored.
    Raises :class:`FormatError` on a line that is neither."""
    offsets = []
    with open(path, "r", encoding="ascii") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if "\t" in line:
                fields = line.split("\t")
                value = fields[1] if len(fields) == 2 else ""
            else:
                fields = line.split()
                value = fields[0] if len(fields) == 2 else ""
            if not value.strip().isdigit():
                raise FormatError(f"index line {number} is not 'offset length' nor"
                                  f" 'key<TAB>offset': {line.strip()[:60]!r}", source=path)
            offsets.append(int(value))
    offsets.sort()
    return offsets


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
        if "://" in text and not text.startswith("file://"):
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
    if index is not None:
        try:
            starts = read_index(index)
        except (OSError, UnicodeError, FormatError) as exc:
            _fallback_index(index, exc)
        else:
            # Cut at the first record start at or after each offset: exact, no resync.
            at = bisect.bisect_left(starts, start)
            first = starts[at] if at < len(starts) else size
            at = bisect.bisect_left(starts, end)
            last = starts[at] if at < len(starts) and end < size else size
            return RangePlan((first, None if last >= size else last), exact=True)
    return RangePlan((start, end if end < size else None), exact=False)


def _fallback_index(index: str, exc: BaseException) -> None:
    key = (index, "index")
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"ignoring the index {index}: {exc}; readers find record starts by"
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

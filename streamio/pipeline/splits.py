"""Cut a Dataset into parts that independent readers (Ray read tasks) read in any order, on any
machine: together the parts hold every record once.

The same rules as :meth:`Dataset.shard`, planned up front instead of by each reader:

- enough sources: whole sources, spread so the parts hold about the same number of bytes;
- fewer sources than parts: each source readers can share by byte range
  (:func:`~streamio.pipeline.ranges.splittable_size`: a regular file, an http(s) or s3:// URL,
  uncompressed, TFRecord/RecordIO/lines, CSV with ``csv_quoted_newlines=False``; cut at record
  starts by an index file beside it, if any) gets a number of byte ranges in proportion to its
  size; any other source (compressed, CSV that may quote line breaks, a size nobody knows) is
  one whole part, since splitting it would make every part read all of it;
- a single stream (a FIFO, a :class:`~streamio.PipeChannel`, stdin, a file object) is always
  one whole part: it can be read once, by one reader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UsageError
from ..sources import source_name
from .dataset import Dataset
from .ranges import splittable_size

__all__ = ["DatasetPart", "plan_parts"]


@dataclass(frozen=True)
class DatasetPart:
    """One reader's share: ``dataset`` (iterate it as usual), the names of the sources it
    reads, and ``nbytes``, the bytes it is planned to read (None when a stream's size is
    unknown)."""

    dataset: Dataset
    names: tuple
    nbytes: Optional[int]


def _size_of(source: Any) -> Optional[int]:
    """The size of a local regular file (a cheap stat), else None."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, str) and "://" in text:
            return None
        try:
            return os.stat(text).st_size if os.path.isfile(text) else None
        except OSError:
            return None
    return None


def _whole(ds: Dataset, sources: list, sizes: list) -> DatasetPart:
    part = Dataset(sources, ds.format, decoder=ds.decoder, **ds.reader_options)
    known = [s for s in sizes if s is not None]
    return DatasetPart(part, tuple(source_name(s) for s in sources),
                       sum(known) if len(known) == len(sizes) else None)


def plan_parts(ds: Dataset, n: int, *, single_stream: Any = None) -> list:
    """At most ``n`` (and at least one) :class:`DatasetPart` of ``ds``'s sources (its stages
    are not carried over: each part is ``Dataset(sources, format, decoder=..., **options)``,
    sharded where it splits a source). ``single_stream(source) -> bool`` says which sources can
    be read only once; they are whole parts. Probes each source once when there are fewer
    sources than parts (a stat, or one request)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"the number of parts must be an int >= 1, not {n!r}")
    if getattr(ds, "inputs", None) is not None:  # streamio.mix: no sources of its own
        raise UsageError("a mix (streamio.mix) cannot be split into parts of its sources: read"
                         " it as one Dataset, or split each input and mix in each part")
    sources = list(ds.sources)
    if len(sources) >= n:
        sizes = [_size_of(s) for s in sources]
        return _by_size(ds, sources, sizes, n)
    once = single_stream or (lambda source: False)
    whole, ranged = [], []
    for source in sources:
        size = None if once(source) else splittable_size(source, ds.format, ds.reader_options,
                                                           warn=False)
        if size is None:
            whole.append(_whole(ds, [source], [_size_of(source)]))
        else:
            ranged.append((source, size))
    parts = whole
    for (source, size), pieces in zip(ranged, _apportion([s for _, s in ranged],
                                                          max(len(ranged), n - len(whole)))):
        single = Dataset([source], ds.format, decoder=ds.decoder, **ds.reader_options)
        for index in range(pieces):
            part = single.shard(pieces, index) if pieces > 1 else single
            parts.append(DatasetPart(part, (source_name(source),), -(-size // pieces)))
    return parts


def _apportion(sizes: list, budget: int) -> list:
    """``budget`` pieces over sources of ``sizes`` (``budget >= len(sizes)``): one each, the rest
    in proportion to size (largest remainders), so the counts add up to ``budget`` exactly."""
    extra = budget - len(sizes)
    total = sum(sizes) or 1
    shares = [extra * size / total for size in sizes]
    counts = [1 + int(share) for share in shares]
    left = budget - sum(counts)
    by_remainder = sorted(range(len(sizes)), key=lambda i: int(shares[i]) - shares[i])
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


def _by_size(ds: Dataset, sources: list, sizes: list, n: int) -> list:
    """``n`` parts of whole sources, in order, each about ``1/n`` of the bytes (a source of
    unknown size counts as the average of the known ones)."""
    known = [s for s in sizes if s is not None]
    average = sum(known) / len(known) if known else 1.0
    weights = [average if s is None else max(s, 1) for s in sizes]
    total = sum(weights)
    parts, start, acc = [], 0, 0.0
    for i, weight in enumerate(weights):
        acc += weight
        left_sources = len(sources) - (i + 1)
        left_parts = n - len(parts) - 1
        # Close the part at its share of the bytes, or when only one source per part is left.
        if left_parts and (acc >= total * (len(parts) + 1) / n or left_sources == left_parts):
            parts.append(_whole(ds, sources[start:i + 1], sizes[start:i + 1]))
            start = i + 1
    parts.append(_whole(ds, sources[start:], sizes[start:]))
    return parts

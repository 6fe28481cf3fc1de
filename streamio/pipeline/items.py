"""Decoded items of an unbatched Dataset: what ``Dataset(..., decoder=d)`` yields without ``batch()``.

A decoder decodes batches (``decode_batch(records) -> {name: column}``). Without ``batch()`` the
consumer gets one item per record, so the epoch decodes each block of records in one call and
hands out its rows, as ``tf.io.parse_single_example`` would give them:

- a dense field: row ``i`` of its column (a numpy array of the field's shape; a 0-d value, a
  numpy scalar, for a scalar field);
- a ``VarLen`` field (a padded column ``name`` beside its lengths ``name_len``): the row cut to
  its own length (``name_len`` stays, a scalar);
- an object field (bytes, str): the value itself;
- a sparse field (:class:`~streamio.SparseBatch`): that row, as a one-row ``SparseBatch``.

Rows are views of the block's columns (copy an item you keep for long, as with ``batch()``).
The decode runs at the end of the chain, after every stage (``map``/``filter``/``shuffle`` before
it see records, as they do before ``batch()``) and after a resume's fast-forward has dropped
the items already delivered (those are never decoded). A block whose decode fails is decoded
record by record: every item before the bad record is handed out, then its ``DecodeError``
(naming the source and record) is raised. A decoder that drops a record (``on_error="skip"``)
gives no item for it.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..decoders.skips import replaying
from ..decoders.sparse import SparseBatch
from ..errors import FormatError
from .stages import close_blocks

__all__ = ["decode_items", "split_rows"]


def decode_items(run: Any, blocks: Iterator[tuple]) -> Iterator[tuple]:
    """``(records, ids)`` blocks -> ``(items, None)`` blocks of decoded rows (``run`` is the
    :class:`~streamio.pipeline.EpochRun`; its ``decode`` names a bad record)."""
    try:
        for records, ids in blocks:
            if not records:
                continue
            try:
                items = split_rows(run.decode(records, ids))
            except FormatError:
                items = None
            if items is None or len(items) != len(records):
                # An error (found record by record, the items before it delivered) or rows
                # dropped by the decoder (each record's own rows then, none for a dropped one).
                # The block's decode already counted and warned about the records it dropped:
                # the replay drops them silently.
                items, failure = _replay(run, records, ids)
                if failure is not None:
                    if items:
                        yield items, None
                    raise failure
            yield items, None
    finally:
        close_blocks(blocks)


def _replay(run: Any, records: list, ids: Any) -> tuple:
    """Each record decoded alone: (the items up to the first failure, that failure or None).
    No ``yield`` under :func:`replaying` (a generator's context is its consumer's)."""
    items: list = []
    with replaying():
        for i, record in enumerate(records):
            try:
                items.extend(split_rows(run.decode([record], None if ids is None
                                                   else ids[i:i + 1])))
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                return items, exc
    return items, None


def split_rows(table: dict) -> list:
    """The rows of one decoded batch, each a dict (see the module docstring)."""
    if not table:
        return []
    columns = []
    n = None
    for name, column in table.items():
        if isinstance(column, SparseBatch):
            rows = [_sparse_row(column, i) for i in range(column.shape[0])]
        else:
            lengths = table.get(name + "_len")
            if lengths is not None and getattr(column, "ndim", 0) >= 2 \
                    and len(lengths) == len(column):
                rows = [row[:k] for row, k in zip(column, np.asarray(lengths).tolist())]
            else:
                rows = list(column)
        if n is None:
            n = len(rows)
        elif len(rows) != n:
            return []  # not one row per record: the caller decodes record by record
        columns.append(rows)
    names = list(table)
    return [dict(zip(names, values)) for values in zip(*columns)]


def _sparse_row(batch: SparseBatch, i: int) -> SparseBatch:
    start, stop = int(batch.indptr[i]), int(batch.indptr[i + 1])
    return SparseBatch(np.array([0, stop - start]), batch.indices[start:stop],
                       batch.values[start:stop], (1, batch.shape[1]))

"""Accounting for one epoch: is training waiting for data, and on what?

The pipeline updates an :class:`EpochStats` as it runs (readers in whatever thread runs them,
delivery counters in the consumer's thread); ``Dataset.stats()`` takes a snapshot at any time,
during or after the epoch. Each counter has a single writer and CPython reads of ints and floats
are atomic, so a snapshot never blocks the pipeline; the list of open readers is the only shared
structure and takes a lock.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Optional

__all__ = ["EpochStats", "STATS_KEYS", "empty_snapshot", "merge_snapshots"]

#: The keys of every snapshot, in a stable order.
STATS_KEYS = (
    "epoch", "records", "batches", "bytes", "bytes_decoded", "records_read", "skipped_records",
    "skipped_bytes", "sources_opened", "source_wait_s", "decode_s", "wait_s", "consumer_s",
    "first_batch_s", "elapsed_s", "records_per_s", "finished", "decoder_skipped",
)
#: The skipped records an epoch's ``decoder_skips`` lists (the first ones).
SKIPS_KEPT = 100
_READER_FIELDS = ("bytes_read", "bytes_decoded", "records", "skipped_records", "skipped_bytes",
                  "source_wait_s")


class EpochStats:
    """Counters of one epoch.

    - ``records``/``batches``: delivered to the consumer (after shard, skip and take);
    - ``bytes``, ``bytes_decoded``, ``records_read``, ``skipped_records``, ``skipped_bytes``,
      ``source_wait_s``: summed over the readers of the epoch (``bytes`` as read from the
      source, compressed if it is; ``records_read`` counts every framed record, also those a
      round-robin shard passes over); ``source_wait_s`` is time blocked reading the source;
    - ``decoder_skipped``: records a decoder dropped under its own ``on_error="skip"`` (an
      image that does not decode), also counted in ``skipped_records``; which fields failed is
      in ``decoder_skipped_fields`` (``{field: records}``), and ``decoder_skips`` lists the
      first :data:`SKIPS_KEPT` of them that a decoder named (a CSV row: ``{"source", "offset",
      "record_index", "field", "reason"}``, offset None where unknown; this process's own);
    - ``decode_s``: time in the decoder; ``wait_s``: time the consumer spent inside ``next()``
      waiting for the pipeline; ``consumer_s``: the rest of the epoch, when the consumer held
      the data (a training step). ``wait_s`` much larger than ``consumer_s`` means input-bound;
    - ``first_batch_s``: from the start of the epoch to the first item; ``elapsed_s``,
      ``records_per_s``: so far, or for the whole epoch once it is ``finished``.
    """

    def __init__(self, epoch: Optional[int] = None) -> None:
        self.epoch = epoch
        self._clock = time.perf_counter
        self._start = self._clock()
        # Wall-clock start, comparable between processes: which epoch is the latest when stats
        # come from DataLoader workers too.
        self.started_at = time.time()
        self._end: Optional[float] = None
        # Re-entrant: a garbage collection at an allocation under it may close a dropped
        # reader of this epoch, which reports here from the same thread.
        self._lock = threading.RLock()
        self._live: list = []  # reader stats objects of the sources open right now
        self._closed = dict.fromkeys(_READER_FIELDS, 0)
        self._closed["source_wait_s"] = 0.0
        self.sources_opened = 0
        self.records = 0
        self.batches = 0
        self.decode_s = 0.0
        self.wait_s = 0.0
        self.first_batch_s: Optional[float] = None
        self.decoder_skipped: collections.Counter = collections.Counter()
        self.decoder_skips: list = []

    # -- written by the pipeline ----------------------------------------------------------------
    def reader_opened(self, reader_stats: Any) -> None:
        with self._lock:
            self._live.append(reader_stats)
            self.sources_opened += 1

    def reader_closed(self, reader_stats: Any) -> None:
        with self._lock:
            # By identity: ReaderStats is a dataclass, and two readers' counters may be equal.
            for position, live in enumerate(self._live):
                if live is reader_stats:
                    del self._live[position]
                    for field in _READER_FIELDS:
                        self._closed[field] += getattr(reader_stats, field, 0)
                    break

    def note_decoder_skips(self, skipped: dict) -> None:
        """Records a decoder dropped (``{field: records}``, see ``decoders.skips``)."""
        if skipped:
            with self._lock:
                self.decoder_skipped.update(skipped)
                for err in getattr(skipped, "errors", ())[:SKIPS_KEPT - len(self.decoder_skips)]:
                    self.decoder_skips.append(_skip_entry(err))

    def first_item(self) -> None:
        if self.first_batch_s is None:
            self.first_batch_s = self._clock() - self._start

    def finish(self) -> None:
        if self._end is None:
            self._end = self._clock()

    @property
    def finished(self) -> bool:
        return self._end is not None

    # -- read by anyone -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The counters now, as a plain dict (keys: :data:`STATS_KEYS`)."""
        with self._lock:
            totals = dict(self._closed)
            for live in self._live:
                for field in _READER_FIELDS:
                    totals[field] += getattr(live, field, 0)
            fields = dict(self.decoder_skipped)
            skips = list(self.decoder_skips)
        dropped = sum(fields.values())
        end = self._end if self._end is not None else self._clock()
        elapsed = max(0.0, end - self._start)
        wait_s = self.wait_s
        return {
            "epoch": self.epoch,
            "records": self.records,
            "batches": self.batches,
            "bytes": totals["bytes_read"],
            "bytes_decoded": totals["bytes_decoded"],
            "records_read": totals["records"],
            "skipped_records": totals["skipped_records"] + dropped,
            "skipped_bytes": totals["skipped_bytes"],
            "sources_opened": self.sources_opened,
            "source_wait_s": totals["source_wait_s"],
            "decode_s": self.decode_s,
            "wait_s": wait_s,
            "consumer_s": max(0.0, elapsed - wait_s),
            "first_batch_s": self.first_batch_s,
            "elapsed_s": elapsed,
            "records_per_s": self.records / elapsed if elapsed > 0 else 0.0,
            "finished": self.finished,
            "decoder_skipped": dropped,
            "decoder_skipped_fields": fields,
            "decoder_skips": skips,
        }


def _skip_entry(err: Any) -> dict[str, Any]:
    """A skipped record as ``decoder_skips`` lists it (from the error that named it)."""
    return {"source": getattr(err, "source", None), "offset": getattr(err, "offset", None),
            "record_index": getattr(err, "record_index", None),
            "field": getattr(err, "field", None), "reason": getattr(err, "reason", str(err))}


def empty_snapshot() -> dict[str, Any]:
    """What ``stats()`` says before any epoch ran: zeros (``epoch``/``first_batch_s`` None)."""
    snap: dict[str, Any] = dict.fromkeys(STATS_KEYS, 0)
    snap.update(epoch=None, first_batch_s=None, finished=False, source_wait_s=0.0, decode_s=0.0,
                wait_s=0.0, consumer_s=0.0, elapsed_s=0.0, records_per_s=0.0,
                decoder_skipped_fields={}, decoder_skips=[])
    return snap


#: Counters that add up over the readers of one epoch (DataLoader workers, input pipelines).
_SUMMED = ("records", "batches", "bytes", "bytes_decoded", "records_read", "skipped_records",
           "skipped_bytes", "sources_opened", "source_wait_s", "decode_s", "wait_s", "consumer_s",
           "decoder_skipped")


def merge_snapshots(snapshots: list) -> dict[str, Any]:
    """One snapshot for an epoch read by several readers at once (DataLoader workers): counters
    and times spent are summed over the readers; ``elapsed_s`` is the longest reader's,
    ``first_batch_s`` the earliest first item; ``finished`` when every reader has finished."""
    if not snapshots:
        return empty_snapshot()
    if len(snapshots) == 1:
        out = dict(snapshots[0])
        out.setdefault("decoder_skipped_fields", {})  # not carried by the workers' table
        out.setdefault("decoder_skips", [])
        return out
    out = empty_snapshot()
    for key in _SUMMED:
        out[key] = sum(snap[key] for snap in snapshots)
    out["epoch"] = snapshots[0]["epoch"]
    firsts = [snap["first_batch_s"] for snap in snapshots if snap["first_batch_s"] is not None]
    out["first_batch_s"] = min(firsts) if firsts else None
    out["elapsed_s"] = max(snap["elapsed_s"] for snap in snapshots)
    out["records_per_s"] = out["records"] / out["elapsed_s"] if out["elapsed_s"] > 0 else 0.0
    out["finished"] = all(snap["finished"] for snap in snapshots)
    fields: collections.Counter = collections.Counter()
    for snap in snapshots:
        fields.update(snap.get("decoder_skipped_fields") or {})
    out["decoder_skipped_fields"] = dict(fields)
    skips = [entry for snap in snapshots for entry in snap.get("decoder_skips") or ()]
    out["decoder_skips"] = skips[:SKIPS_KEPT]
    return out

"""The pipeline layer: ``Dataset`` (shuffle, batch, prefetch, shard, epochs) over the readers.

``Dataset`` is the public entry point (re-exported as ``streamio.Dataset``); the building blocks
are importable for tests and for adapters: ``ShuffleBuffer`` (bounded random order),
``Prefetcher`` (one thread, one bounded queue), ``EpochStats`` (the accounting behind
``Dataset.stats()``) and ``derive_rng`` (seeds from ``(seed, epoch, rank, worker)``).

Rooms: ``dataset`` describes a pipeline; ``stages`` holds the stages (each one object that
knows how it applies, resumes and describes itself; ``Stage`` is their base); ``epoch`` runs an
epoch (``EpochRun``); ``iterator`` hands it out (``EpochIterator``); ``resume`` replays one.

The seam for consumers of the pipeline (adapters, the shared stream), and nothing else of it:

- ``Dataset.with_feed(feed)``: epochs read ``feed(run)`` instead of the sources (the feed
  protocol: :mod:`streamio.pipeline.epoch`);
- ``EpochRun.for_sources(ds, epoch, stats)``: read a Dataset's sources (after its shards),
  every record with its origin;
- ``record_origin`` / ``origin_source`` / ``origin_index`` (``INDEX_BITS``): the record-origin
  encoding;
- ``Dataset.epoch_stats`` and ``Dataset.add_stats_provider(provider)``: per-epoch stats of this
  process, and how an adapter reports epochs read elsewhere;
- ``EpochIterator.state_dict()`` / ``state_after(items, next_epoch=...)``: resume states;
  :func:`streamio.pipeline.resume.check_fields` checks one read from a file.
"""

from .dataset import Dataset, PipelineContext
from .epoch import INDEX_BITS, EpochRun, origin_index, origin_source, record_origin
from .iterator import EpochIterator
from .prefetch import Prefetcher
from .shuffle import ShuffleBuffer, derive_rng
from .stages import Stage
from .stats import STATS_KEYS, EpochStats

__all__ = [
    "Dataset",
    "EpochIterator",
    "EpochRun",
    "EpochStats",
    "INDEX_BITS",
    "PipelineContext",
    "Prefetcher",
    "STATS_KEYS",
    "ShuffleBuffer",
    "Stage",
    "derive_rng",
    "origin_index",
    "origin_source",
    "record_origin",
]

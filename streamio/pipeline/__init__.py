"""The pipeline layer: ``Dataset`` (shuffle, batch, prefetch, shard, epochs) over the readers.

``Dataset`` is the public entry point (re-exported as ``streamio.Dataset``); the building blocks
are importable for tests and for adapters: ``ShuffleBuffer`` (bounded random order),
``Prefetcher`` (one thread, one bounded queue), ``EpochStats`` (the accounting behind
``Dataset.stats()``) and ``derive_rng`` (seeds from ``(seed, epoch, rank, worker)``).
"""

from .dataset import Dataset, EpochIterator, PipelineContext
from .prefetch import Prefetcher
from .shuffle import ShuffleBuffer, derive_rng
from .stats import STATS_KEYS, EpochStats

__all__ = [
    "Dataset",
    "EpochIterator",
    "EpochStats",
    "PipelineContext",
    "Prefetcher",
    "STATS_KEYS",
    "ShuffleBuffer",
    "derive_rng",
]

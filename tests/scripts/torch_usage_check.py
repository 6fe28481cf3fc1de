"""Three epochs of one DataLoader set-up (for tests/adapters/test_torch_usage.py).

usage: torch_usage_check.py MODE WORKERS [persistent] PARTS...
MODE: "collate" (a batched Dataset, DataLoader's default batch_size), "none" (batch_size=None),
"cache" (a memory cache(), batch_size=None). Prints one JSON object: each epoch's tensor shapes
and ``stats()["sources_opened"]``; warnings go to stderr (the workers' too).
"""

import json
import sys

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # tests/, for support.examples

from support.examples import ID_X  # noqa: E402

import streamio  # noqa: E402


def value_types(values) -> set:
    """The type names of the values, and of what the lists and dicts among them hold."""
    names = set()
    for v in values:
        names.add(type(v).__name__)
        if isinstance(v, (list, tuple)):
            names |= value_types(v)
        elif isinstance(v, dict):
            names |= value_types(v.values())
    return names


def main() -> None:
    mode, workers = sys.argv[1], int(sys.argv[2])
    persistent = sys.argv[3] == "persistent"
    parts = sys.argv[4:]
    ds = streamio.Dataset(parts, "tfrecord", decoder=ID_X)
    if mode == "cache":
        ds = ds.cache()
    ds = ds.batch(64).to_torch()
    extra = {} if mode == "collate" else {"batch_size": None}
    loader = DataLoader(ds, num_workers=workers, persistent_workers=persistent, **extra)
    epochs = []
    for _ in range(3):
        shapes = sorted({tuple(batch["x"].shape) for batch in loader})
        stats = ds.stats()
        epochs.append({"shapes": shapes, "sources_opened": stats["sources_opened"],
                       # stats() of an epoch read by workers: plain Python values
                       "types": sorted(value_types(stats.values())),
                       "repr": repr(stats)})
    json.dump(epochs, sys.stdout)


if __name__ == "__main__":
    main()

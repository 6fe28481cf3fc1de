"""One DataLoader over a source bound to the main process (stdin, a file object), two epochs
(for tests/adapters/test_torch_bound_sources.py).

usage: torch_bound_sources.py SOURCE WORKERS CONTEXT [cache DIR|memory] [persistent]
SOURCE: "-" (stdin, fed by the test through a pipe from another process) or "fileobj:PATH";
CONTEXT: fork, spawn or forkserver. Prints one JSON object: per epoch, the ids delivered or
the error's class and last line, and the stats of each completed epoch.
"""

import json
import sys

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])  # tests/, for support.examples

from support.examples import ID_X  # noqa: E402

import streamio  # noqa: E402


def main() -> None:
    source, workers, context = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rest = sys.argv[4:]
    if source.startswith("fileobj:"):
        source = open(source[len("fileobj:"):], "rb")
    ds = streamio.Dataset(source, "tfrecord", decoder=ID_X)
    if "cache" in rest:  # "cache DIR", or "cache memory"
        where = rest[rest.index("cache") + 1]
        ds = ds.cache(None if where == "memory" else where)
    ds = ds.batch(16).to_torch()
    loader = DataLoader(ds, batch_size=None, num_workers=workers,
                        multiprocessing_context=context if workers else None,
                        persistent_workers="persistent" in rest)
    epochs = []
    for _ in range(2):
        ids = []
        try:
            for batch in loader:
                ids.extend(batch["id"].tolist())
        except Exception as exc:  # noqa: BLE001 - reported to the test
            epochs.append({"error": type(exc).__name__,
                           "message": str(exc).strip().splitlines()[-1]})
            continue
        stats = ds.stats()
        epochs.append({"ids": ids, "records": stats["records"], "finished": stats["finished"]})
    json.dump({"epochs": epochs}, sys.stdout)


if __name__ == "__main__":
    main()

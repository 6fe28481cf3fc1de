"""One rank of the DDP test in tests/adapters/test_torch_adapter.py.

usage: python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_check.py DATADIR OUTDIR

Each rank trains a DDP model (gloo, CPU) from ``DataLoader(num_workers=2)`` over the files of
DATADIR/<layout>/ through ``to_device(..., even_batches=policy)``, and writes the record ids and
batch counts it saw to OUTDIR/rank<r>.json. DDP all-reduces gradients in every backward, so a
rank with fewer batches would leave the other waiting: finishing at all is part of the test.
"""

import datetime
import glob
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from streamio.decoders import Example, FixedLen
from streamio.errors import UsageError
from streamio.pipeline import Dataset
from streamio.torch import to_device

DECODER = Example({"id": FixedLen([], "int64"), "x": FixedLen([4], "float32")})
RUNS = (("even", "drop"), ("uneven", None), ("uneven", "drop"), ("uneven", "pad"))


def main():
    datadir, outdir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    result = {"rank": rank, "world_size": dist.get_world_size()}
    for layout, policy in RUNS:
        files = sorted(glob.glob(os.path.join(datadir, layout, "*.tfrecord")))
        ds = Dataset(files, "tfrecord", decoder=DECODER).shuffle(32, seed=5).batch(10)
        loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
        ids, batches = [], 0
        for batch in to_device(loader, "cpu", even_batches=policy):
            if policy is not None:  # without a policy a DDP step would hang: only count
                model(batch["x"]).sum().backward()
            ids.extend(batch["id"].tolist())
            batches += 1
        result[f"{layout}-{policy}"] = {"ids": ids, "batches": batches}
    # Rank 1's files are empty: "pad" has nothing to repeat there, and every rank must say so
    # (one rank raising while the other waits in the next all-reduce would hang).
    files = sorted(glob.glob(os.path.join(datadir, "lopsided", "*.tfrecord")))
    ds = Dataset(files, "tfrecord", decoder=DECODER).batch(10)
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
    try:
        result["lopsided-pad"] = {"batches": sum(1 for _ in to_device(loader, "cpu",
                                                                        even_batches="pad"))}
    except UsageError as exc:
        result["lopsided-pad"] = {"error": str(exc)}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

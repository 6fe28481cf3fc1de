"""One rank of a multi-host torchrun job (tests/multihost/driver.py starts ``torchrun`` on each
host): a gloo process group at host 0's address, then each case of CASES (JSON) read through
``to_torch()`` and a DataLoader with 2 workers, for its epochs; writes what it delivered to
``OUT/<case>-r<rank>.json`` on its host.

usage: rank_job.py OUT CASES_JSON

A case: ``{"name", "epochs", "source"}`` where source is ``{"urls": [...]}``,
``{"pipe": PREFIX, "node_streams": ...}`` (a PipeChannel fed by ``streamio serve-pipe`` on this
host) or ``{"sagemaker": CHANNEL, "root": ROOT}`` (``streamio.sagemaker.channel``).
"""

import json
import os
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

import streamio
from streamio import Dataset, PipeChannel
from support.examples import ID_X

WORKERS = 2


def dataset(source):
    if "urls" in source:
        return Dataset(source["urls"], "tfrecord", decoder=ID_X), {}
    if "pipe" in source:
        channel = PipeChannel(source["pipe"], open_timeout=200, read_timeout=200)
        return (Dataset(channel, "tfrecord", decoder=ID_X),
                {"node_streams": source["node_streams"]})
    from streamio import sagemaker
    return sagemaker.channel(source["sagemaker"], ID_X, root=source["root"], open_timeout=200,
                             read_timeout=200), {}


def run_case(case, rank):
    base, options = dataset(case["source"])
    ds = base.shuffle(64, seed=7).batch(16)
    loader = DataLoader(ds.to_torch(connect_timeout=200, **options), batch_size=None,
                        num_workers=WORKERS)
    epochs = []
    for _ in range(case["epochs"]):
        ids = []
        for batch in loader:
            assert (batch["x"][:, 0] == batch["id"]).all()  # rows stay whole
            ids.extend(batch["id"].tolist())
        epochs.append(ids)
        dist.barrier()
    return epochs


def main():
    out, cases = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.makedirs(out, exist_ok=True)
    for case in cases:
        result = {"rank": rank, "host": os.uname().nodename, "world": dist.get_world_size(),
                  "local_rank": int(os.environ["LOCAL_RANK"]), "error": None, "epochs": []}
        try:
            result["epochs"] = run_case(case, rank)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["error"] = {"type": type(exc).__name__, "message": str(exc)[:2000],
                               "streamio": isinstance(exc, streamio.StreamioError)}
        with open(os.path.join(out, f"{case['name']}-r{rank}.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

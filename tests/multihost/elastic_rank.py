"""One rank of driver.py's elastic scenario: a job of 2 hosts x 2 ranks checkpointed mid-epoch,
resumed on another layout (1 host x 3 ranks, 3 hosts x 1 rank).

usage: elastic_rank.py OUT SPEC_JSON   SPEC: {"phase": "old"|"new", "urls": [...],
                                              "checkpoint": DIR on the shared filesystem}

``old``: StatefulDataLoader(num_workers=2); rank r takes TAKE[r] batches, then saves its
``loader.state_dict()`` with ``torch.distributed.checkpoint`` under a key naming the rank.
``new``: every rank loads every old rank's key, ``to_torch().load_state_dict(states)`` (the list,
in rank order), a fresh StatefulDataLoader(num_workers=2): the rest of the epoch, then epoch 1.
Each rank writes ``OUT/<phase>-r<rank>.json`` on its host.
"""

import datetime
import json
import os
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchdata.stateful_dataloader import StatefulDataLoader

from streamio import Dataset
from support.examples import ID_X

TAKE = (3, 7, 2, 5)  # batches each old rank takes before the checkpoint
KEY = "streamio_loader_rank{}"


def pipeline(urls):
    return Dataset(urls, "tfrecord", decoder=ID_X).shuffle(64, seed=11).batch(8)


def ids_of(batches):
    ids = []
    for batch in batches:
        ids.extend(batch["id"].tolist())
    return ids


def old(spec, rank):
    loader = StatefulDataLoader(pipeline(spec["urls"]).to_torch(), batch_size=None,
                                num_workers=2)
    it = iter(loader)
    ids = ids_of(next(it) for _ in range(TAKE[rank]))
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint stores it
    dcp.save({KEY.format(rank): json.dumps(state)}, checkpoint_id=spec["checkpoint"])
    del it  # the job ends mid-epoch
    return [ids]


def new(spec, rank):
    reader = dcp.FileSystemReader(spec["checkpoint"])
    keys = sorted((k for k in reader.read_metadata().state_dict_metadata
                   if k.startswith(KEY.format(""))), key=lambda k: int(k.rsplit("rank", 1)[1]))
    loaded = {k: "" for k in keys}
    dcp.load(loaded, checkpoint_id=spec["checkpoint"])
    tds = pipeline(spec["urls"]).to_torch()
    tds.load_state_dict([json.loads(loaded[k]) for k in keys])
    loader = StatefulDataLoader(tds, batch_size=None, num_workers=2)
    return [ids_of(loader), ids_of(loader)]


def main():
    out, spec = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    result = {"rank": rank, "host": os.uname().nodename, "world": dist.get_world_size(),
              "error": None, "epochs": []}
    try:
        result["epochs"] = (old if spec["phase"] == "old" else new)(spec, rank)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{spec['phase']}-r{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One of a host's two local ranks reading the host's Pipe-mode FIFO through the shared-stream
dealer (local rank 0's main process runs it: ``num_workers=0``), without torchrun; prints the
ids it delivered as JSON, or the error. For driver.py's hostile-neighbour scenario.

usage: local_rank.py CHANNEL_PREFIX RANK
"""

import json
import sys

from torch.utils.data import DataLoader

import streamio
from streamio import Dataset, PipeChannel
from support.examples import ID_X


def main():
    prefix, rank = sys.argv[1], int(sys.argv[2])
    channel = PipeChannel(prefix, open_timeout=200, read_timeout=200)
    ds = Dataset(channel, "tfrecord", decoder=ID_X).batch(16)
    tds = ds.to_torch(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                      connect_timeout=200)
    out = {"ids": [], "error": None}
    try:
        for batch in DataLoader(tds, batch_size=None, num_workers=0):
            out["ids"].extend(batch["id"].tolist())
    except streamio.StreamioError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()

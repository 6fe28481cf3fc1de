"""DataLoader scenarios for tests/adapters/test_torch_adapter.py, run in a fresh process.

A process that imported TensorFlow must not fork DataLoader workers (it can deadlock), and the
pytest process may have imported it; so the worker scenarios run here and print one JSON object.

usage: torch_loader_check.py WORKDIR
"""

import gc
import json
import os
import subprocess
import sys

import torch
from torch.utils.data import DataLoader

import streamio
from streamio.pipeline import Dataset
from streamio.torch import to_device

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.examples import ID_X, write_id_parts  # noqa: E402

FILE_SIZES = [37, 50, 13, 41, 29, 30]  # uneven on purpose: 200 records in 6 files
DECODER = ID_X


def epoch_ids(loader):
    ids = []
    for batch in loader:
        assert isinstance(batch["id"], torch.Tensor) and isinstance(batch["x"], torch.Tensor)
        assert torch.equal(batch["x"][:, 0].long(), batch["id"])  # rows stay together
        ids.extend(batch["id"].tolist())
    return ids


def workers_scenarios(paths):
    out = {}
    ds = Dataset(paths, "tfrecord", decoder=DECODER).shuffle(64, seed=1).batch(8).prefetch(2)
    configs = ((0, False, None), (2, False, None), (2, True, None), (3, False, None),
               (3, True, None), (2, True, "spawn"))
    for workers, persistent, context in configs:
        tds = ds.to_torch()
        loader = DataLoader(tds, batch_size=None, num_workers=workers,
                            persistent_workers=persistent, multiprocessing_context=context)
        first, second = epoch_ids(loader), epoch_ids(loader)
        tds.set_epoch(0)
        again = epoch_ids(loader)
        out[f"{workers}{'p' if persistent else ''}{context or ''}"] = {"epochs": [first, second, again],
                                                         "next_epoch": tds.epoch}
        # Shut persistent workers down now: workers forked later would inherit this loader.
        del loader, tds
        gc.collect()
    return out


def round_robin_single_file(paths, workdir):
    path = os.path.join(workdir, "single.tfrecord")
    with open(path, "wb") as f:
        for p in paths:
            f.write(open(p, "rb").read())
    ds = Dataset(path, "tfrecord", decoder=DECODER).batch(16)
    return epoch_ids(DataLoader(ds.to_torch(), batch_size=None, num_workers=2))


def fifo_with_workers(paths, workdir):
    """One FIFO, two workers: worker 0 reads it and deals records to both."""
    fifo = os.path.join(workdir, "one.fifo")
    os.mkfifo(fifo)
    whole = os.path.join(workdir, "whole.tfrecord")
    with open(whole, "wb") as f:
        for p in paths:
            f.write(open(p, "rb").read())
    writer = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                            "fifo_writer.py"), fifo, whole])
    ds = Dataset(fifo, "tfrecord", decoder=DECODER).batch(16)
    try:
        return epoch_ids(DataLoader(ds.to_torch(), batch_size=None, num_workers=2))
    finally:
        writer.wait(timeout=60)


def pipe_channel(paths, workdir, persistent):
    prefix = os.path.join(workdir, f"channel{int(persistent)}")
    writer = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel",
                               prefix, "--epochs", "2", "--open-timeout", "20", *paths],
                              stderr=subprocess.DEVNULL)
    channel = streamio.PipeChannel(prefix, open_timeout=20, read_timeout=20)
    ds = Dataset(channel, "tfrecord", decoder=DECODER).shuffle(32, seed=3).batch(8)
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=1,
                        persistent_workers=persistent)
    try:
        batches = to_device(loader, "cpu")
        return [epoch_ids(batches), epoch_ids(batches)]
    finally:
        writer.wait(timeout=30)


def stats_from_workers(paths):
    """ds.stats() after epochs read in 2 DataLoader workers, then in the main process."""
    ds = Dataset(paths, "tfrecord", decoder=DECODER).batch(8)
    out = {}
    for workers in (2, 0):
        loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=workers)
        epoch_ids(loader)
        del loader  # stats() must not depend on the DataLoader staying alive
        gc.collect()
        out[str(workers)] = ds.stats()
    out["file_bytes"] = sum(os.path.getsize(p) for p in paths)
    return out


def main():
    workdir = sys.argv[1]
    paths = write_id_parts(workdir, FILE_SIZES)
    result = {
        "all_ids": list(range(sum(FILE_SIZES))),
        "workers": workers_scenarios(paths),
        "round_robin": round_robin_single_file(paths, workdir),
        "fifo_shared": fifo_with_workers(paths, workdir),
        "pipe_channel": pipe_channel(paths, workdir, False),
        "pipe_channel_persistent": pipe_channel(paths, workdir, True),
        "stats": stats_from_workers(paths),
        "tensorflow_imported": "tensorflow" in sys.modules,
    }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()

"""A DataLoader epoch that fails in a worker, then a good one (for
tests/adapters/test_torch_adapter.py).

Run in a fresh interpreter so that its stderr holds only what this scenario printed: after the
failed epoch, torch used to print "Exception ignored in _MultiProcessingDataLoaderIter.__del__
... AssertionError: can only test a child process" from the next epoch's forked workers.

usage: torch_failed_epoch.py WORKDIR  -> one JSON object on stdout
"""

import json
import os
import sys

import numpy as np
import torch  # noqa: F401  (torch first, as a training script would)
from torch.utils.data import DataLoader

import streamio
from streamio.decoders import Example, FixedLen, encode_example
from streamio.pipeline import Dataset


def children() -> list:
    """PIDs of this process's live children (DataLoader workers; not the resource tracker)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            out.append(int(entry))
    return out


def main() -> None:
    workdir = sys.argv[1]
    paths = []
    for k in range(4):
        path = os.path.join(workdir, f"part-{k}.tfrecord")
        streamio.write_records(path, "tfrecord", (encode_example({"id": i})
                                                  for i in range(k * 50, k * 50 + 50)))
        paths.append(path)
    good = list(paths)
    bad = bytearray(open(paths[1], "rb").read())
    bad[200] ^= 0xFF  # a payload byte: CRC mismatch in the middle of the file
    paths[1] = os.path.join(workdir, "part-1-bad.tfrecord")
    open(paths[1], "wb").write(bytes(bad))
    decoder = Example({"id": FixedLen([], "int64")})
    result = {}
    loader = DataLoader(Dataset(paths, "tfrecord", decoder=decoder).batch(8).prefetch(2)
                        .to_torch(), batch_size=None, num_workers=2)
    try:
        for _ in loader:
            pass
        result["first"] = "no error"
    except streamio.CorruptRecordError as exc:
        result["first"] = type(exc).__name__
    result["children_after_failure"] = len(children())
    loader = DataLoader(Dataset(good, "tfrecord", decoder=decoder).batch(8).to_torch(),
                        batch_size=None, num_workers=2)
    ids = [i for _ in range(2) for batch in loader for i in batch["id"].tolist()]
    result["second"] = sorted(ids) == sorted(list(range(200)) * 2)
    result["children_at_end"] = len(children())
    json.dump(result, sys.stdout)
    sys.stdout.flush()


if __name__ == "__main__":
    np.seterr(all="raise")
    main()

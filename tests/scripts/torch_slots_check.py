"""DataLoader workers hand batches to the main process through rings of shared-memory slots
(tests/adapters/test_torch_slots.py), run in a fresh process (a process that imported
TensorFlow must not fork DataLoader workers).

Prints one JSON object of facts about each case: the record ids that arrived, whether every row
equals what ``num_workers=0`` gives, how many batches were rebuilt over a slot, how many rings
the main process mapped, and the mode and name of each ring's mapping.

usage: torch_slots_check.py WORKDIR
"""

import gc
import json
import os
import sys
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader

from streamio.adapters import _torch_slots as slots
from streamio.decoders import Example, FixedLen
from streamio.pipeline import Dataset
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.examples import write_id_parts  # noqa: E402
from torch_transport_check import same_rows  # noqa: E402  (this folder: the script's own)

DECODER = Example({"id": FixedLen([], "int64"), "x": FixedLen([4], "float32")})
SIZES = [600, 500, 400]  # in batches of 4: 375 batches, many more than a ring's slots
REBUILT = [0]
_rebuild = slots._rebuild_from_slot


def counting_rebuild(*args):
    """The main process's unpickler finds the rebuild function by name: count its calls."""
    REBUILT[0] += 1
    return _rebuild(*args)


slots._rebuild_from_slot = counting_rebuild


def mixed(batch):
    ids = batch["id"]
    return {"id": ids, "x": batch["x"], "small": (ids % 7).astype(np.int16),
            "flag": ids % 2 == 0, "empty": np.zeros((len(ids), 0), np.float32),
            "names": [b"r%d" % i for i in ids]}


def rows(batch):
    return {int(rid): {k: (v[i] if isinstance(v, list) else v[i].clone())
                       for k, v in batch.items()} for i, rid in enumerate(batch["id"].tolist())}


def mappings():
    """(mode, name) of the mapping of every ring this process mapped."""
    out = []
    with open("/proc/self/maps") as f:
        maps = [line.split() for line in f]
    for _, ring in slots._mapped.values():
        address = np.frombuffer(ring, np.uint8).ctypes.data
        for fields in maps:
            start, end = (int(v, 16) for v in fields[0].split("-"))
            if start <= address < end:
                st = os.stat(f"/proc/self/map_files/{fields[0]}")
                out.append([oct(st.st_mode & 0o777), " ".join(fields[5:])])
    return out


def epoch(loader, hold):
    """Rows of one epoch: ``hold`` keeps every batch until the end (the slots stay held)."""
    got, held = {}, []
    REBUILT[0] = 0
    for batch in loader:
        if hold:
            held.append(batch)
        else:
            got.update(rows(batch))
            for value in batch.values():  # the main process may write into its tensors
                if isinstance(value, torch.Tensor) and value.numel() and value.dtype != torch.bool:
                    value.add_(1)
    for batch in held:
        got.update(rows(batch))
    del held
    gc.collect()
    return got, REBUILT[0]


def main(workdir):
    paths = write_id_parts(workdir, SIZES)
    ds = Dataset(paths, "tfrecord", decoder=DECODER).batch(4).map(mixed)
    expected = {}
    for batch in ds.to_torch():  # num_workers=0: no process boundary
        expected.update(rows(batch))
    report = {"records": sum(SIZES), "batches": sum(SIZES) // 4, "slots": slots.SLOTS}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a non-writable buffer warning
        loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                            persistent_workers=True)
        for case, hold in (("released", False), ("held", True), ("released_again", False)):
            got, rebuilt = epoch(loader, hold)
            report[case] = {"ids": sorted(got), "same_rows": same_rows(got, expected),
                            "rebuilt_over_slots": rebuilt, "rings": len(slots._mapped)}
    report["mappings"] = mappings()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])

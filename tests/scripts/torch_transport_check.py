"""DataLoader workers hand batches to the main process (tests/adapters/test_torch_transport.py),
run in a fresh process (a process that imported TensorFlow must not fork DataLoader workers).

Prints one JSON object: for each case, whether every batch arrived as a plain dict of writable
tensors equal to the batch the main process makes itself from the same records.

usage: torch_transport_check.py WORKDIR
"""

import json
import os
import sys
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader

from streamio.decoders import Example, FixedLen
from streamio.pipeline import Dataset
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.examples import write_id_parts  # noqa: E402  (the {id, x} files of the other checks)

DECODER = Example({"id": FixedLen([], "int64"), "x": FixedLen([4], "float32")})
SIZES = [90, 70, 40]
WIDE = 40_000  # float64 columns: a batch of 16 rows is ~5 MB, over PIPE_BATCH_BYTES


def widen(batch):
    """Fields of other kinds: a wide float64 block (a big batch), int16, an empty column and
    names (a list: not a tensor)."""
    ids = batch["id"]
    return {"id": ids, "x": batch["x"], "small": (ids % 7).astype(np.int16),
            "empty": np.zeros((len(ids), 0), np.float32),
            "wide": np.repeat(ids[:, None].astype(np.float64), WIDE, axis=1),
            "names": [b"r%d" % i for i in ids]}


def narrow(batch):
    return {k: v for k, v in widen(batch).items() if k != "wide"}


def check_collate(batch):
    """A user's collate_fn runs in the worker and sees a dict of tensors."""
    assert isinstance(batch, dict), type(batch)
    assert all(isinstance(v, torch.Tensor) for k, v in batch.items() if k != "names")
    return batch


def rows(batches):
    """{record id: {field: that record's row}}: workers cut batches differently (each reads its
    own files), so batches are compared row by row."""
    out = {}
    for b in batches:
        for i, rid in enumerate(b["id"].tolist()):
            out[rid] = {k: (v[i] if isinstance(v, list) else v[i].clone()) for k, v in b.items()}
    return out


def well_formed(batch, expected_fields):
    """A plain dict with the expected fields whose tensors are writable (torch would warn when
    a tensor views read-only memory, and warnings are errors here)."""
    if type(batch) is not dict or set(batch) != expected_fields:
        return False
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.numel() and value.dtype != torch.bool:
            value.add_(0)
    return True


def same_rows(got, expected):
    if set(got) != set(expected):
        return False
    for rid, row in expected.items():
        for name, value in row.items():
            mine = got[rid][name]
            if isinstance(value, bytes):
                if mine != value:
                    return False
            elif not (mine.dtype == value.dtype and mine.shape == value.shape
                      and torch.equal(mine, value)):
                return False
    return True


def main(workdir):
    paths = write_id_parts(workdir, SIZES)
    report = {}
    for case, fn, collate in (("small", narrow, None), ("wide", widen, None),
                              ("collate", narrow, check_collate)):
        ds = Dataset(paths, "tfrecord", decoder=DECODER).batch(16).map(fn)
        expected = list(ds.to_torch())  # num_workers=0: no process boundary
        kwargs = {} if collate is None else {"collate_fn": collate}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. a non-writable buffer warning
            got = list(DataLoader(ds.to_torch(), batch_size=None, num_workers=2, **kwargs))
        expected_rows = rows(expected)
        report[case] = {
            "well_formed": all(well_formed(b, set(fn({"id": np.zeros(1, np.int64),
                                                        "x": np.zeros((1, 4), np.float32)})))
                               for b in got),
            "same_rows": same_rows(rows(got), expected_rows),
            "ids": sorted(int(i) for b in got for i in b["id"]),
        }
    report["records"] = sum(SIZES)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])

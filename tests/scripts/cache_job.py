"""One run of a training job over a directory cache, as a restarted job would start it: a new
process, a new Dataset. Python's audit hook records every open() of a source file, so the test
can tell "served from the cache" from "read the source" without trusting streamio's own counters.

usage: cache_job.py DIRECTORY SOURCE [SOURCE ...]
  one SOURCE: Dataset(SOURCE).batch(16).cache(DIRECTORY)
  several:    mix([Dataset(S) for S in SOURCES], seed=1, stop="all_exhausted").batch(16)
              .cache(DIRECTORY)
Prints one JSON line: {"ids": sorted ids delivered, "warnings": [...], "opened": [sources
opened], "bytes": bytes read from the sources}.
"""

import json
import os
import sys
import warnings

import numpy as np

directory, sources = sys.argv[1], sys.argv[2:]
watched = {os.path.abspath(s) for s in sources}
opened = []


def _audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path in watched:
            opened.append(path)


sys.addaudithook(_audit)

import streamio  # noqa: E402
from streamio.decoders import Example, FixedLen  # noqa: E402

decoder = Example({"x": FixedLen((), np.int64)})
if len(sources) == 1:
    ds = streamio.Dataset(sources[0], "tfrecord", decoder=decoder)
else:
    ds = streamio.mix([streamio.Dataset(s, "tfrecord", decoder=decoder) for s in sources],
                      seed=1, stop="all_exhausted")
ds = ds.batch(16).cache(directory)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ids = sorted(i for batch in ds for i in batch["x"].tolist())
print(json.dumps({"ids": ids, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                  "opened": sorted(set(opened)), "bytes": ds.stats()["bytes"]}))

"""Fills a cache directory on a small tmpfs (the test mounts it in a private mount namespace):
every epoch must end in a streamio SourceError saying the disk is full, leave no file behind
(no temp file, no partial cache), and never pass for a cache later.

usage: cache_disk_full.py DIRECTORY   (prints "full-disk: ok")
"""

import os
import sys

import numpy as np

import streamio
from streamio.decoders import Example, FixedLen

directory = sys.argv[1]
records = [streamio.encode_example({"x": [i], "pad": os.urandom(2000)}) for i in range(400)]
data = b"".join(streamio.formats.encode_tfrecord(r) for r in records)  # ~800 KB > the tmpfs
ds = Dataset = streamio.Dataset(data, "tfrecord", decoder=Example({
    "x": FixedLen((), np.int64), "pad": FixedLen((), "bytes")})).batch(8).cache(directory)
for epoch in range(2):
    delivered = 0
    try:
        for batch in ds:
            delivered += 1
    except streamio.SourceError as exc:
        assert "full" in str(exc) and directory in str(exc), exc
        assert isinstance(exc.__cause__, OSError), exc.__cause__
    else:
        raise SystemExit(f"epoch {epoch}: no error although the disk is full")
    assert 0 < delivered <= 50, delivered  # the error may come at the last write
    left = os.listdir(directory)
    assert left == [], left
print("full-disk: ok")

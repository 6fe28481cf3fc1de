"""The tests' usual Example files: records {id: int64, x: float32 [4] = [id] * 4}, so that "every
record once" is a check of the ids a run delivered. Subprocess scripts (tests/scripts/) put tests/
on sys.path to import this."""

from __future__ import annotations

import os
from typing import Iterable, List

import numpy as np

import streamio
from streamio.decoders import Example, FixedLen, encode_example

ID_X = Example({"id": FixedLen([], "int64"), "x": FixedLen([4], "float32")})


def id_example(i: int) -> bytes:
    return encode_example({"id": i, "x": np.full(4, i, np.float32)})


def write_tfrecords(path, records: Iterable[bytes]) -> str:
    """A TFRecord file of ``records`` at ``path`` (a str or Path); returns the path as a str."""
    streamio.write_records(str(path), "tfrecord", records)
    return str(path)


def write_id_examples(path, ids: Iterable[int]) -> str:
    """A TFRecord file at ``path`` of ``id_example(i)`` for each id; returns the path."""
    return write_tfrecords(path, (id_example(i) for i in ids))


def write_id_parts(directory: str, sizes: Iterable[int], first: int = 0) -> List[str]:
    """``part-<k>.tfrecord`` files in ``directory`` of ``sizes[k]`` records each, the ids counting
    on from ``first`` across the files (uneven sizes exercise every split)."""
    paths = []
    for k, n in enumerate(sizes):
        paths.append(write_id_examples(os.path.join(directory, f"part-{k}.tfrecord"),
                                       range(first, first + n)))
        first += n
    return paths

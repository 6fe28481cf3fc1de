"""An image decoder's ``on_error="skip"`` drops a record: ``stats()`` counts it and names the field,
wherever the decoder runs (the Dataset's decode stage, map threads, map processes)."""

from __future__ import annotations

import io

import numpy as np
import pytest

import streamio
from streamio import Dataset, Example, FixedLen, Image

PIL = pytest.importorskip("PIL.Image")


def png(value: int) -> bytes:
    out = io.BytesIO()
    PIL.fromarray(np.full((12, 10, 3), value, np.uint8)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    images = [png(i) for i in range(10)]
    images[3] = b"\x89PNG but not an image"
    p = tmp_path_factory.mktemp("skips") / "images.tfrecord"
    streamio.write_records(str(p), "tfrecord", [
        streamio.encode_example({"img": img, "label": np.int64(i)}) for i, img in enumerate(images)])
    return str(p)


DECODER = Example({"img": Image(size=8, on_error="skip"), "label": FixedLen([], "int64")})


def labels(batches) -> list:
    return [int(x) for b in batches for x in b["label"]]


@pytest.mark.parametrize("how", ["decoder", "inline map", "thread map", "process map"])
def test_a_skipped_image_is_counted_and_named(path, how):
    if how == "decoder":
        ds = Dataset(path, "tfrecord", decoder=DECODER).batch(4)
    else:
        num_parallel = None if how == "inline map" else 2
        backend = "process" if how == "process map" else "thread"
        ds = Dataset(path, "tfrecord").batch(4).map(DECODER.decode_batch,
                                                     num_parallel=num_parallel, backend=backend)
    assert labels(ds) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    stats = ds.stats()
    assert stats["skipped_records"] == 1
    assert stats["decoder_skipped"] == 1
    assert stats["decoder_skipped_fields"] == {"img": 1}

"""An unbatched Dataset with a decoder yields decoded items (streamio.pipeline.items), never
the encoded records: one dict per record, as tf.io.parse_single_example gives.

Sources are real files and FIFOs fed by writer processes; to_torch runs real DataLoader workers
in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import warnings
import sys
from pathlib import Path

import numpy as np
import pytest

import streamio
from streamio.decoders import Example, FixedLen, VarLen, encode_example
from streamio.errors import DecodeError
from streamio.pipeline import Dataset

from support.examples import write_id_parts, write_tfrecords

SPEC = Example({"id": FixedLen([], "int64"), "x": FixedLen([3], "float32"),
                "v": VarLen("int64"), "s": FixedLen([], "bytes")})


def example(i: int) -> bytes:
    return encode_example({"id": i, "x": np.full(3, i, np.float32), "v": np.arange(i % 5),
                           "s": b"row%d" % i})


@pytest.fixture
def path(tmp_path):
    return write_tfrecords(tmp_path / "ex.tfrecord", (example(i) for i in range(300)))


def check_item(item, i):
    assert isinstance(item, dict), f"item {i} is a {type(item).__name__}, not decoded"
    assert int(item["id"]) == i and np.ndim(item["id"]) == 0
    assert item["x"].shape == (3,) and item["x"].tolist() == [i] * 3
    assert item["v"].tolist() == list(range(i % 5)) and int(item["v_len"]) == i % 5
    assert item["s"] == b"row%d" % i


def test_items_are_decoded_examples_not_encoded_bytes(path):
    items = list(Dataset(path, "tfrecord", decoder=SPEC))
    assert len(items) == 300
    for i, item in enumerate(items):
        check_item(item, i)
    # The same values as the batched path's rows.
    batch = next(iter(Dataset(path, "tfrecord", decoder=SPEC).batch(300)))
    assert [int(it["id"]) for it in items] == batch["id"].tolist()


def test_items_from_a_fifo_fed_by_another_process(fifo, path):
    pipe = fifo.make(open(path, "rb").read(), 777, 13)
    items = list(Dataset(pipe, "tfrecord", decoder=SPEC))
    assert [int(it["id"]) for it in items] == list(range(300))
    check_item(items[123], 123)


def test_a_bad_record_comes_after_every_item_before_it(tmp_path):
    records = [example(i) for i in range(50)]
    records[37] = b"\x0a\x05garbage"  # a well-framed record that is no Example
    bad = write_tfrecords(tmp_path / "bad.tfrecord", records)
    got = []
    with pytest.raises(DecodeError) as info:
        for item in Dataset(bad, "tfrecord", decoder=SPEC):
            got.append(int(item["id"]))
    assert got == list(range(37))
    assert info.value.record_index == 37 and info.value.source == bad


def test_shuffle_filter_and_resume_see_records_and_hand_out_items(path):
    def make():
        return (Dataset(path, "tfrecord", decoder=SPEC).filter(lambda r: isinstance(r, bytes))
                .shuffle(64, seed=3))

    ds = make()
    it = iter(ds)
    first = [int(next(it)["id"]) for _ in range(100)]
    state = it.state_dict()
    it.close()
    rest = [int(item["id"]) for item in ds.iter_from(state)]
    assert sorted(first + rest) == list(range(300))
    assert first + rest == [int(item["id"]) for item in make()]  # one run's order


def test_batch_is_unchanged_and_a_mix_of_unbatched_inputs_decodes_once(tmp_path, path):
    other = write_tfrecords(tmp_path / "b.tfrecord", (example(i) for i in range(300, 400)))
    a = Dataset(path, "tfrecord", decoder=SPEC)
    b = Dataset(other, "tfrecord", decoder=SPEC)
    mixed = streamio.mix([a, b], [0.5, 0.5], seed=1, stop="all_exhausted")
    items = list(mixed)
    assert sorted(int(it["id"]) for it in items) == list(range(400))
    batches = list(mixed.batch(32))
    assert sorted(np.concatenate([bt["id"] for bt in batches]).tolist()) == list(range(400))


def test_to_tf_items_are_examples(path):
    pytest.importorskip("tensorflow")
    tfds = Dataset(path, "tfrecord", decoder=SPEC).to_tf()
    assert tfds.element_spec["x"].shape == (3,) and tfds.element_spec["id"].shape == ()
    got = [int(x["id"]) for x in tfds]
    assert got == list(range(300))
    first = next(iter(tfds.skip(7)))
    assert first["v"].numpy().tolist() == [0, 1] and first["s"].numpy() == b"row7"


def test_dataloader_workers_collate_items_into_batches(tmp_path):
    pytest.importorskip("torch")
    parts = write_id_parts(str(tmp_path), [40, 70, 30])
    code = ("import json, sys, torch, streamio\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from support.examples import ID_X\n"
            "if __name__ == '__main__':\n"
            "    ds = streamio.Dataset(sys.argv[2:], 'tfrecord', decoder=ID_X).to_torch()\n"
            "    loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2)\n"
            "    out = [(list(b['x'].shape), b['id'].tolist()) for b in loader]\n"
            "    print(json.dumps(out))\n")
    tests_dir = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", code, tests_dir, *parts], capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert sorted(i for _, ids in out for i in ids) == list(range(140))
    assert all(shape[1:] == [4] and shape[0] == len(ids) <= 16 for shape, ids in out)


@pytest.mark.parametrize("on_error", ["skip", "warn"])
def test_a_dropped_row_is_counted_and_warned_about_once_without_batch(tmp_path, on_error):
    # An unbatched Csv that drops a ragged row: the block's decode drops it, then the items
    # are made record by record; that replay must not count or warn about the row again.
    from streamio.decoders import Csv

    rows = [f"{i},{i * 2}" for i in range(50)]
    rows[17] = "17,34,99"  # one column too many
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    ds = Dataset(str(path), "csv", decoder=Csv(dtype="float32", on_error=on_error))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = list(ds)
    said = [w for w in caught if "skipped a record" in str(w.message)]
    assert [int(item["features"][0]) for item in items] == [i for i in range(50) if i != 17]
    assert len(said) == (1 if on_error == "warn" else 0), [str(w.message) for w in said]
    stats = ds.stats()
    assert stats["decoder_skipped"] == 1, stats
    assert [s["record_index"] for s in stats["decoder_skips"]] == [17]

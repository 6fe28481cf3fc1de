"""Block decoding (one decode_batch per chunk, sliced into batches) and the self-sizing prefetch.

A decoder whose outputs all have fixed shapes decodes the batches cut from one chunk together;
VarLen fields, a CSV block holding a repeated header, and decode errors fall back to batch by
batch. ``prefetch()`` with no size grows its queue from AUTO_START while the consumer waits,
within AUTO_MAX_ITEMS items and AUTO_MAX_BYTES bytes.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from streamio.decoders import Csv, Example, FixedLen, VarLen, encode_example
from streamio.errors import DecodeError
from streamio.pipeline import Dataset, Prefetcher
from streamio.pipeline.prefetch import AUTO_MAX_BYTES, AUTO_MAX_ITEMS, AUTO_START

from support.examples import write_tfrecords

FIXED = {"x": FixedLen((2, 2), "float32"), "id": FixedLen((), "int64"),
         "name": FixedLen((), "bytes")}


class Counting(Example):
    """An Example decoder that counts its decode_batch calls (fresh() returns self)."""

    calls = 0

    def decode_batch(self, records, **kwargs):
        self.calls += 1
        return super().decode_batch(records, **kwargs)


def fixed_record(i: int) -> bytes:
    return encode_example({"x": np.arange(4, dtype=np.float32) + i, "id": i,
                           "name": b"r%d" % i})


def assert_same_batch(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def expected_batches(path, decoder, batch_size, seed, **options) -> list:
    raw = Dataset(path, "tfrecord", **options)
    if seed is not None:
        raw = raw.shuffle(500, seed=seed)
    return [decoder.decode_batch(records) for records in raw.batch(batch_size)]


# -- a) fixed-shape outputs: one decode per block --------------------------------------------------
@pytest.mark.parametrize("seed", [None, 3])
@pytest.mark.parametrize("read_size", [4096, None])
def test_fixed_shape_blocks_decode_once_and_slice_into_the_same_batches(tmp_path, seed, read_size):
    n, size = 3001, 16  # a 4096-byte chunk holds about 50 records: 3 batches
    path = write_tfrecords(tmp_path / "fixed.tfrecord", (fixed_record(i) for i in range(n)))
    options = {} if read_size is None else {"read_size": read_size}
    want = expected_batches(path, Example(FIXED), size, seed, **options)
    decoder = Counting(FIXED)
    ds = Dataset(path, "tfrecord", decoder=decoder, **options)
    if seed is not None:
        ds = ds.shuffle(500, seed=seed)
    got = list(ds.batch(size))
    assert len(got) == len(want) == -(-n // size)
    for g, w in zip(got, want):
        assert_same_batch(g, w)
    assert got[-1]["id"].shape == (n % size,) and got[-1]["x"].shape == (n % size, 2, 2)
    ids = np.concatenate([b["id"] for b in got]).tolist()
    assert sorted(ids) == list(range(n))
    assert (ids == list(range(n))) == (seed is None)
    assert 0 < decoder.calls < len(got), "blocks of batches were not decoded together"


# -- b) a VarLen field: batch by batch, padded per batch -------------------------------------------
def test_varlen_fields_are_padded_per_batch_not_per_block(tmp_path):
    n, size = 1000, 32
    lengths = [20 if i == 100 else i % 5 for i in range(n)]
    records = [encode_example({"id": i, "tags": np.arange(k, dtype=np.int64)})
               for i, k in enumerate(lengths)]
    path = write_tfrecords(tmp_path / "var.tfrecord", records)
    features = {"id": FixedLen((), "int64"), "tags": VarLen("int64", pad_value=-1)}
    decoder = Counting(features)
    got = list(Dataset(path, "tfrecord", decoder=decoder).batch(size))
    want = expected_batches(path, Example(features), size, None)
    assert len(got) == len(want) == -(-n // size)
    for g, w in zip(got, want):
        assert_same_batch(g, w)
    widths = [b["tags"].shape[1] for b in got]
    assert widths[100 // size] == 20 and widths.count(20) == 1  # only the batch holding it
    assert decoder.calls == len(got)


# -- c) CSV: a header row repeated mid-stream ------------------------------------------------------
@pytest.mark.parametrize("read_size", [1024, 2048, None])
@pytest.mark.parametrize("as_columns", [True, False])
def test_csv_header_repeated_in_one_stream_is_dropped(tmp_path, read_size, as_columns):
    parts, start = [], 0
    for count in (500, 300):
        rows = [b"id,x"] + [b"%d,%d" % (i, 3 * i) for i in range(start, start + count)]
        parts.append(b"\n".join(rows) + b"\n")
        start += count
    path = tmp_path / "joined.csv"
    path.write_bytes(b"".join(parts))  # one stream: "id,x" arrives again after row 500
    options = {} if read_size is None else {"read_size": read_size}
    decoder = (Csv(header=True, as_columns=True, dtype="int64") if as_columns
               else Csv(header=True))  # float32 features (B, 2): the fast paths
    batches = list(Dataset(str(path), "csv", decoder=decoder, **options).batch(16))
    if as_columns:
        ids = np.concatenate([b["id"] for b in batches])
        xs = np.concatenate([b["x"] for b in batches])
        assert ids.dtype == np.int64
    else:
        table = np.concatenate([b["features"] for b in batches])
        assert table.dtype == np.float32 and table.shape == (800, 2)
        ids, xs = table[:, 0], table[:, 1]
    assert ids.tolist() == list(range(800))
    assert xs.tolist() == [3 * i for i in range(800)]
    # 801 records after the first header: the batch holding the repeated one has a row less.
    want = [16] * 50 + [1]
    want[500 // 16] -= 1
    assert [len(b["id" if as_columns else "features"]) for b in batches] == want


# -- d) a corrupt record in the middle of a block --------------------------------------------------
@pytest.mark.parametrize("prefetch", [None, "auto", 3])
@pytest.mark.parametrize("read_size", [4096, None])
def test_a_bad_record_delivers_the_whole_batches_before_it_and_names_itself(
        tmp_path, prefetch, read_size):
    n, size, bad = 2000, 32, 1234
    records = [fixed_record(i) for i in range(n)]
    records[bad] = b"\xff\xff\xff"  # framed fine, not an Example
    path = write_tfrecords(tmp_path / "bad.tfrecord", records)
    options = {} if read_size is None else {"read_size": read_size}
    ds = Dataset(path, "tfrecord", decoder=Example(FIXED), **options).batch(size)
    if prefetch == "auto":
        ds = ds.prefetch()
    elif prefetch is not None:
        ds = ds.prefetch(prefetch)
    got = []
    with pytest.raises(DecodeError) as info:
        for batch in ds:
            got.append(batch["id"].tolist())
    assert all(len(b) == size for b in got)
    assert [i for b in got for i in b] == list(range(bad // size * size))
    assert info.value.record_index == bad and info.value.source == path


def test_a_bad_record_is_named_in_its_stream_after_a_shuffle(tmp_path):
    records = [fixed_record(i) for i in range(2000)]
    records[777] = b"\xff\xff\xff"
    path = write_tfrecords(tmp_path / "bad.tfrecord", records)
    ds = Dataset(path, "tfrecord", decoder=Example(FIXED)).shuffle(300, seed=1).batch(32)
    with pytest.raises(DecodeError) as info:
        list(ds.prefetch())
    assert info.value.record_index == 777 and info.value.source == path


# -- e) prefetch(): every record once, in order; errors come through -------------------------------
def test_auto_prefetch_delivers_every_record_once_in_order(tmp_path):
    path = write_tfrecords(tmp_path / "p.tfrecord", (fixed_record(i) for i in range(3000)))
    plain = list(Dataset(path, "tfrecord", read_size=4096))
    assert list(Dataset(path, "tfrecord", read_size=4096).prefetch()) == plain
    assert [r for b in Dataset(path, "tfrecord").batch(7).prefetch() for r in b] == plain
    decoded = Dataset(path, "tfrecord", decoder=Example(FIXED), read_size=4096).batch(50)
    ids = np.concatenate([b["id"] for b in decoded.prefetch()])
    assert ids.tolist() == list(range(3000))


# -- f) the self-sizing queue stays within its caps ------------------------------------------------
def _run_auto(item_bytes: int, blocks: int = 15, per_block: int = 3) -> list:
    """A slow upstream and a consumer that comes back while the producer is mid-block (so it
    waits, and the queue wants to grow); returns the sizes seen after each block."""
    def upstream():
        for b in range(blocks):
            time.sleep(0.03)
            yield list(range(b * per_block, (b + 1) * per_block)), None

    pre = Prefetcher(upstream(), None, size_of=lambda item: item_bytes)
    assert pre.size == AUTO_START
    got, sizes = [], []
    for items, _ in pre:
        got += items
        sizes.append(pre.size)
        time.sleep(0.015)
    assert got == list(range(blocks * per_block))  # exactly once, in order
    return sizes


@pytest.mark.parametrize("item_bytes", [40 << 20, 16 << 20])
def test_auto_prefetch_size_respects_the_byte_cap(item_bytes):
    sizes = _run_auto(item_bytes)
    cap = max(AUTO_START, AUTO_MAX_BYTES // item_bytes)  # 2 and 4 items
    assert max(sizes) <= cap, sizes
    assert max(sizes) == cap, sizes  # it did want to grow: the consumer waited


def test_auto_prefetch_grows_while_the_consumer_waits_up_to_the_item_cap():
    sizes = _run_auto(1, blocks=25)
    assert max(sizes) > AUTO_START, sizes
    assert max(sizes) <= AUTO_MAX_ITEMS
    assert sizes == sorted(sizes)  # doubling only: nothing shrinks it at one byte per item


# -- g) a filled queue holds at most `size` items plus one block in the producer's hand ------------
@pytest.mark.parametrize("per_block", [1, 5])
def test_auto_prefetch_keeps_at_most_size_items_ahead(per_block):
    produced, makers = [0], {}

    def upstream():
        for b in range(40):
            produced[0] += per_block
            makers[b] = threading.current_thread().name
            yield list(range(b * per_block, (b + 1) * per_block)), None

    pre = Prefetcher(upstream(), None)
    got = []
    for step, (items, _) in enumerate(pre):
        got += items
        size = pre.size  # only the consumer's waits change it (no size_of here): never shrinks
        if makers[items[0] // per_block] == "streamio-prefetch":
            assert len(items) <= size  # queued by the producer: cut to fit the queue
        if step < 6:
            time.sleep(0.05)  # a slow consumer: the producer fills the queue meanwhile
            assert produced[0] - len(got) <= pre.size + per_block, (produced[0], len(got), size)
    assert got == list(range(40 * per_block))

"""The consumer's end of an epoch (``streamio.pipeline.iterator.EpochIterator``): items are
handed out by C code (an ``itertools.chain`` over each block's list iterator), so these tests
hold what its Python ``__next__`` used to guarantee: the count of items handed out is exact at
every step (resume states), ``close()`` ends the epoch mid-block, a dropped iterator closes at
once (no reference cycle waiting for the collector), and an error comes after every item
before it."""

from __future__ import annotations

import gc
import os
import random

import pytest

import streamio
from streamio import Dataset
from streamio.errors import CorruptRecordError
from streamio.pipeline.iterator import EpochIterator

from support.fds import fd_targets

N = 400


def _payload(i: int) -> bytes:
    return b"%06d" % i + b"x" * (i % 53)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("iterator") / "data.tfrecord")
    streamio.write_records(out, "tfrecord", [_payload(i) for i in range(N)])
    return out


def _ids(items) -> list:
    return [int(item[:6]) for item in items]


@pytest.mark.parametrize("read_size", [256, 1 << 20])  # many blocks, and one
def test_delivered_and_state_are_exact_at_every_step(path, read_size):
    ds = Dataset(path, "tfrecord", read_size=read_size)
    it = iter(ds)
    assert isinstance(it, EpochIterator)
    states = {0: it.state_dict()}
    for k in range(N):
        assert it.delivered == k
        assert int(next(it)[:6]) == k
        states[k + 1] = it.state_dict()
    with pytest.raises(StopIteration):
        next(it)
    assert it.delivered == N and it.state_dict()["finished"]
    rng = random.Random(read_size)
    for k in sorted(rng.sample(range(N + 1), 12)) + [0, N]:
        assert _ids(Dataset(path, "tfrecord", read_size=read_size).iter_from(states[k])) \
            == list(range(k, N)), k


def test_close_mid_block_ends_the_epoch_where_it_stands(path):
    ds = Dataset(path, "tfrecord")  # one block holds every record
    it = iter(ds)
    assert _ids([next(it) for _ in range(3)]) == [0, 1, 2]
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert list(it) == []
    assert it.delivered == 3
    assert ds.stats()["finished"]
    assert _ids(Dataset(path, "tfrecord").iter_from(it.state_dict())) == list(range(3, N))
    it.close()  # again: nothing happens


def test_a_batched_epoch_counts_batches(path):
    ds = Dataset(path, "tfrecord", read_size=512).batch(7)
    it = iter(ds)
    first = next(it)
    assert len(first) == 7 and it.delivered == 1
    rest = list(it)
    assert it.delivered == 1 + len(rest) == -(-N // 7)
    stats = ds.stats()
    assert stats["batches"] == it.delivered and stats["records"] == N


def test_a_dropped_iterator_closes_at_once(path):
    ds = Dataset(path, "tfrecord")
    gc.disable()  # a reference cycle would keep the epoch open until the collector ran
    try:
        it = iter(ds)
        assert int(next(it)[:6]) == 0
        assert not ds.stats()["finished"]
        del it
        assert ds.stats()["finished"], "the epoch was not closed when its iterator was dropped"
    finally:
        gc.enable()


def test_an_error_comes_after_every_item_before_it(path, tmp_path):
    bad = tmp_path / "bad.tfrecord"
    data = bytearray(open(path, "rb").read())
    frames = [12 + len(_payload(i)) + 4 for i in range(N)]
    at = sum(frames[:250]) + 12 + 2  # a data byte of record 250
    data[at] ^= 0xFF
    bad.write_bytes(bytes(data))
    got = []
    it = iter(Dataset(str(bad), "tfrecord", read_size=1024))
    with pytest.raises(CorruptRecordError):
        for item in it:
            got.append(item)
    assert _ids(got) == list(range(250))
    assert it.delivered == 250
    with pytest.raises(StopIteration):
        next(it)


def test_an_iterator_is_made_by_its_dataset_and_not_pickled(path):
    import pickle

    with pytest.raises(TypeError, match="iter"):
        EpochIterator.from_iterable([[1, 2]])
    with pytest.raises(TypeError, match="read_records"):
        type(streamio.read_records(path, "tfrecord")).from_iterable([[1, 2]])
    it = iter(Dataset(path, "tfrecord"))
    try:
        with pytest.raises(TypeError, match="state_dict"):
            pickle.dumps(it)
    finally:
        it.close()


# -- read_records: the same chain over each read's records -----------------------------------
def test_read_records_gives_every_record_of_every_source_in_order(path):
    got = list(streamio.read_records([path, path], "tfrecord", read_size=300))
    assert _ids(got) == list(range(N)) * 2


@pytest.mark.parametrize("how", ["close", "drop"])
def test_read_records_stopped_early_closes_its_reader(path, how):
    records = streamio.read_records([path, path], "tfrecord", read_size=300)
    assert _ids([next(records) for _ in range(N + 5)]) == list(range(N)) + list(range(5))
    assert path in fd_targets()  # the second source is open
    gc.disable()  # a reference cycle would keep it open until the collector ran
    try:
        if how == "close":
            records.close()
            assert list(records) == []
            records.close()
        else:
            del records
        assert path not in fd_targets()
    finally:
        gc.enable()


def test_read_records_error_comes_after_every_record_before_it(tmp_path):
    path = str(tmp_path / "cut.tfrecord")
    streamio.write_records(path, "tfrecord", [_payload(i) for i in range(50)])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)  # the last record cut short
    got = []
    with pytest.raises(streamio.errors.StreamioError) as caught:
        for record in streamio.read_records(path, "tfrecord", read_size=128):
            got.append(record)
    assert _ids(got) == list(range(49))
    assert "cut.tfrecord" in str(caught.value)


def test_a_record_reader_iterated_and_dropped_closes_its_source(path):
    from streamio.reader import RecordReader

    records = iter(RecordReader(path, "tfrecord", read_size=300))
    assert _ids([next(records) for _ in range(5)]) == list(range(5))
    assert path in fd_targets()
    gc.disable()  # a reference cycle would keep it open until the collector ran
    try:
        del records
        assert path not in fd_targets()
    finally:
        gc.enable()
    assert _ids(RecordReader(path, "tfrecord", read_size=300)) == list(range(N))

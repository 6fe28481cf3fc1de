"""Read buffers kept from one reader for the next (``streamio._read_buffers``).

What a user cares about: a reader given a buffer another reader used reads exactly its own
records (never a byte left there by the other), a buffer anything still views is never written
again, threads never share a buffer, a forked child starts empty, and the pool's memory is
bounded.
"""

from __future__ import annotations

import gzip
import os
import random
import select
import signal
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import streamio
from streamio import _read_buffers as read_buffers
from streamio.formats import encode_tfrecord
from streamio.reader import RecordReader


@pytest.fixture(autouse=True)
def _empty_pool():
    read_buffers.clear()
    yield
    read_buffers.clear()


def _write(path, records, compress=False):
    data = b"".join(encode_tfrecord(r) for r in records)
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def test_a_buffer_given_back_is_lent_to_the_next_reader_of_its_size():
    first = read_buffers.lend(4096)
    assert type(first) is bytearray and len(first) == 4096
    read_buffers.give_back(first)
    assert read_buffers.kept_bytes() == 4096
    again = read_buffers.lend(4096)
    assert again is first and read_buffers.kept_bytes() == 0
    other = read_buffers.lend(4096)  # the kept one is out: a new one
    assert other is not first
    read_buffers.give_back(first)
    assert read_buffers.lend(8192) is not first  # another size: a new one


@pytest.mark.parametrize("view", [lambda b: memoryview(b)[:10],
                                  lambda b: np.frombuffer(b, np.uint8)[:10]],
                         ids=["memoryview", "numpy"])
def test_a_buffer_something_still_views_is_never_lent_again(view):
    buffer = read_buffers.lend(4096)
    buffer[:10] = b"0123456789"
    kept = view(buffer)
    read_buffers.give_back(buffer)
    lent = read_buffers.lend(4096)
    assert lent is not buffer
    lent[:10] = b"x" * 10
    assert bytes(kept) == b"0123456789"
    assert read_buffers.kept_bytes() == 0  # the pinned one was dropped, not kept


def test_the_pool_keeps_a_bounded_number_of_bytes(monkeypatch):
    monkeypatch.setattr(read_buffers, "POOL_BYTES", 10_000)
    buffers = [read_buffers.lend(4096) for _ in range(4)]
    for buffer in buffers:
        read_buffers.give_back(buffer)
    assert read_buffers.kept_bytes() == 8192
    big = bytearray(read_buffers.KEEP_MAX + 1)
    read_buffers.clear()
    read_buffers.give_back(big)
    assert read_buffers.kept_bytes() == 0


def test_a_reader_in_a_used_buffer_reads_only_its_own_bytes(tmp_path):
    # A large file of one byte value, then small files (shorter reads, a partial last read, a
    # record completed in place, a gzip file, a byte range) of others, all through one buffer
    # size: any byte left over from an earlier reader would show in a record.
    rng = random.Random(5)
    big = _write(tmp_path / "big.tfrecord", [b"\xaa" * 3000] * 400)
    small = [[bytes([k]) * rng.choice([0, 7, 178, 5000, 20_000]) for _ in range(30)]
             for k in range(1, 9)]
    paths = [_write(tmp_path / f"s{k}.tfrecord", records, compress=k % 3 == 0)
             for k, records in enumerate(small)]
    for _ in range(2):
        assert len(list(streamio.read_records(big, "tfrecord", read_size=65536))) == 400
        for path, records in zip(paths, small):
            assert list(streamio.read_records(path, "tfrecord", read_size=65536)) == records
        ranged = RecordReader(paths[1], "tfrecord", read_size=65536, byte_range=(0, 10 ** 9))
        assert list(ranged) == small[1]
    assert read_buffers.kept_bytes() > 0  # they were kept, and lent again


def test_a_reader_stopped_early_gives_its_buffer_back(tmp_path):
    path = _write(tmp_path / "a.tfrecord", [b"r" * 100] * 2000)
    blocks = RecordReader(path, "tfrecord", read_size=8192).record_lists()
    next(blocks)
    assert read_buffers.kept_bytes() == 0  # lent while the reader reads
    blocks.close()  # a consumer that stops (a break, a take())
    assert read_buffers.kept_bytes() == 8192
    assert list(streamio.read_records(path, "tfrecord", read_size=8192)) == [b"r" * 100] * 2000


def test_a_dataset_of_many_files_and_a_mix_read_right_epoch_after_epoch(tmp_path):
    rng = random.Random(7)
    files = [[rng.randbytes(rng.choice([1, 100, 178, 900])) for _ in range(rng.randrange(50))]
             for _ in range(12)]
    paths = [_write(tmp_path / f"f{k}.tfrecord", records) for k, records in enumerate(files)]
    every = [r for records in files for r in records]
    ds = streamio.Dataset(paths, "tfrecord", read_size=4096)
    mixed = streamio.mix([streamio.Dataset(paths[:6], "tfrecord", read_size=4096),
                          streamio.Dataset(paths[6:], "tfrecord", read_size=2048)],
                         [0.5, 0.5], seed=3, stop="all_exhausted")
    for _ in range(3):
        assert list(ds) == every
        assert sorted(mixed) == sorted(every)


def test_threads_never_share_a_buffer():
    errors = []

    def work(seed):
        rng = random.Random(seed)
        for _ in range(300):
            buffer = read_buffers.lend(rng.choice([512, 1024]))
            mark = bytes([seed]) * len(buffer)
            buffer[:] = mark
            if rng.random() < 0.2:
                threading.Event().wait(0.0005)
            if bytes(buffer) != mark:
                errors.append(seed)
            read_buffers.give_back(buffer)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_forked_child_starts_with_an_empty_pool():
    # A bare fork (the child only reads the pool and writes two numbers), so that threads a
    # library started earlier in this process (TensorFlow's) cannot stop the child; a child
    # that does not answer within a minute is killed, never waited for.
    read_buffers.give_back(read_buffers.lend(4096))
    assert read_buffers.kept_bytes() == 4096
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(w, f"{read_buffers.kept_bytes()} {len(read_buffers.lend(4096))}".encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 60)
        got = os.read(r, 100).decode() if ready else "no answer"
    finally:
        os.close(r)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert got == "0 4096"
    assert read_buffers.kept_bytes() == 4096  # the parent's pool is its own


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lend", "give", "view", "drop"]),
                          st.integers(0, 7), st.sampled_from([16, 32])), max_size=60))
def test_lent_buffers_are_never_held_twice_and_viewed_bytes_never_change(ops):
    read_buffers.clear()
    held = []  # buffers lent and not given back
    views = []  # (view, the bytes it showed when taken)
    stamp = 0
    for op, k, size in ops:
        if op == "lend":
            buffer = read_buffers.lend(size)
            assert len(buffer) == size
            assert all(buffer is not other for other in held)
            stamp += 1
            buffer[:] = bytes([stamp % 256]) * size
            held.append(buffer)
        elif op == "give" and held:
            read_buffers.give_back(held.pop(k % len(held)))
        elif op == "view" and held:
            buffer = held[k % len(held)]
            views.append((memoryview(buffer), bytes(buffer)))
        elif op == "drop" and views:
            views.pop(k % len(views))[0].release()
        # A holder writes its buffer only when it is lent, and a viewed buffer is never lent
        # again: every view keeps showing what it showed.
        for view, seen in views:
            assert bytes(view) == seen
    for view, _ in views:
        view.release()

"""The pipeline: Dataset epochs, shuffle, batch, prefetch, shard, skip/take and stats.

Every record carries a unique id (its first 8 bytes), so "exactly once" is checked by counting
ids. Sources are real: files written with ``streamio.write_records``, FIFOs fed by writer
processes (``conftest.fifo``), a PipeChannel served by another process.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamio
from streamio.errors import StreamioWarning, CorruptRecordError, DecodeError, SourceError
from streamio.pipeline import Dataset, Prefetcher, ShuffleBuffer
from streamio.pipeline.shuffle import NUMPY_MIN_BUFFER, derive_rng
from streamio.pipeline.stats import STATS_KEYS

from support.fds import fd_targets, open_fds
from support.protobuf import field, varint


def rec(i: int, pad: int = 8) -> bytes:
    return b"%08d" % i + b"." * pad


def rid(record: bytes) -> int:
    return int(record[:8])


def ids_of(items) -> list:
    """Ids of a flat list of records, or of a list of raw batches."""
    out = []
    for item in items:
        if isinstance(item, list):
            out.extend(rid(r) for r in item)
        else:
            out.append(rid(item))
    return out


def write(path, ids, pad: int = 8) -> str:
    streamio.write_records(str(path), "tfrecord", (rec(i, pad) for i in ids))
    return str(path)


@pytest.fixture
def files(tmp_path):
    """Four TFRecord files of uneven length holding ids 0..1999 in order."""
    bounds = [0, 700, 1000, 1550, 2000]
    return [write(tmp_path / f"part-{k}.tfrecord", range(bounds[k], bounds[k + 1]))
            for k in range(4)]


@pytest.fixture
def one_file(tmp_path):
    return write(tmp_path / "one.tfrecord", range(3000))


# -- exactly once ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n_sources, num_shards", [(4, 1), (4, 2), (4, 3), (1, 3), (2, 3)])
def test_every_record_exactly_once_per_epoch_under_shuffle_shard_prefetch(
        files, one_file, n_sources, num_shards):
    sources = files if n_sources == 4 else [one_file] if n_sources == 1 else files[:2]
    expected = sorted(ids_of(streamio.read_records(sources, "tfrecord")))
    base = Dataset(sources, "tfrecord").shuffle(500, seed=7).batch(32).prefetch(3)
    shards = [base.shard(num_shards, i) for i in range(num_shards)]
    for _epoch in range(2):
        per_shard = [ids_of(list(ds)) for ds in shards]
        for got in per_shard:
            assert len(got) == len(set(got)), "a record came twice within one shard"
        union = sorted(i for got in per_shard for i in got)
        assert union == expected  # all records, none twice, across the shards
    if n_sources >= num_shards:
        assert all(not ds.round_robin for ds in shards)
        assert sum(len(ds.sources) for ds in shards) == n_sources
    else:
        assert all(ds.round_robin for ds in shards)


def test_nested_shards_of_one_stream_partition_it(one_file):
    base = Dataset(one_file, "tfrecord").shuffle(100, seed=1)
    parts = [ids_of(list(base.shard(2, i).shard(3, j))) for i in range(2) for j in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(3000))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # round-robin is balanced


def test_whole_source_shards_follow_source_index_modulo(files):
    ds = Dataset(files, "tfrecord")
    assert ds.shard(3, 0).sources == (files[0], files[3])
    assert ds.shard(3, 2).sources == (files[2],)
    assert ds.shard(3, 2).shard(1, 0).sources == (files[2],)


# -- shuffle: determinism, epochs, permutations -------------------------------------------------
def test_same_seed_same_order_and_every_epoch_a_different_permutation(one_file):
    ds = Dataset(one_file, "tfrecord").shuffle(1000, seed=3)
    epoch0, epoch1 = ids_of(list(ds)), ids_of(list(ds))
    assert sorted(epoch0) == sorted(epoch1) == list(range(3000))
    assert epoch0 != epoch1
    assert epoch0 != list(range(3000))
    again = Dataset(one_file, "tfrecord").shuffle(1000, seed=3)
    assert ids_of(list(again)) == epoch0 and ids_of(list(again)) == epoch1
    assert ids_of(list(Dataset(one_file, "tfrecord").shuffle(1000, seed=4))) != epoch0
    assert ds.stats()["epoch"] == 1


def test_seed_none_draws_one_seed_at_construction(one_file):
    ds = Dataset(one_file, "tfrecord").shuffle(200)
    other = Dataset(one_file, "tfrecord").shuffle(200)
    e0, e1 = ids_of(list(ds)), ids_of(list(ds))
    assert e0 != e1 and sorted(e0) == sorted(e1)
    assert ids_of(list(other)) != e0
    # The drawn seed belongs to the description: a pinned epoch replays exactly.
    assert ids_of(list(ds.with_context(epoch=1))) == e1


def test_with_context_pins_epoch_and_seeds_by_worker_without_mutating(one_file):
    ds = Dataset(one_file, "tfrecord").shuffle(500, seed=11)
    pinned = ds.with_context(epoch=5)
    first, second = ids_of(list(pinned)), ids_of(list(pinned))
    assert first == second  # the epoch is pinned: the adapters set it each epoch
    assert ids_of(list(ds.with_context(epoch=5, worker=1, num_workers=2))) != first
    assert ids_of(list(ds.with_context(epoch=5, rank=1, world_size=2))) != first
    assert ds.context.epoch is None and ds.context.worker == 0
    assert ids_of(list(ds)) == ids_of(list(ds.with_context(epoch=0)))


def test_shuffle_order_does_not_depend_on_how_a_fifo_splits_the_stream(fifo, tmp_path):
    path = write(tmp_path / "big.tfrecord", range(6000))
    with open(path, "rb") as f:
        data = f.read()
    pipe = fifo.make(data, 1, 7, 4093, 65537, 3)
    size = 2 * NUMPY_MIN_BUFFER  # the numpy path, which works in blocks
    from_file = ids_of(list(Dataset(path, "tfrecord").shuffle(size, seed=5).batch(64)))
    from_pipe = ids_of(list(Dataset(pipe, "tfrecord").shuffle(size, seed=5).batch(64)))
    assert from_pipe == from_file
    assert sorted(from_pipe) == list(range(6000))


def test_shuffle_batches_moves_whole_batches(one_file):
    ds = Dataset(one_file, "tfrecord").batch(100).shuffle_batches(8, seed=2)
    batches = [ids_of(b) for b in ds]
    assert all(b == list(range(b[0], b[0] + 100)) for b in batches)  # contents intact
    starts = [b[0] for b in batches]
    assert sorted(starts) == list(range(0, 3000, 100)) and starts != sorted(starts)


def test_shuffle_after_batch_shuffles_batches_with_a_byte_bound(one_file):
    ds = Dataset(one_file, "tfrecord").batch(50).shuffle(10, buffer_bytes=4000, seed=0)
    batches = [ids_of(b) for b in ds]
    assert sorted(i for b in batches for i in b) == list(range(3000))
    assert [b[0] for b in batches] != list(range(0, 3000, 50))


# -- ShuffleBuffer properties ----------------------------------------------------------------------
@given(
    buffer_size=st.sampled_from([1, 2, 7, 64, NUMPY_MIN_BUFFER, 1500]),
    buffer_bytes=st.one_of(st.none(), st.integers(1, 4000)),
    initial=st.one_of(st.none(), st.integers(0, 50)),
    sizes=st.lists(st.integers(0, 60), min_size=0, max_size=40),
    n=st.integers(0, 3500),
    cuts=st.lists(st.integers(1, 900), min_size=1, max_size=8),
    seed=st.integers(0, 2**32),
)
def test_shuffle_buffer_is_a_bounded_chunking_invariant_permutation(
        buffer_size, buffer_bytes, initial, sizes, n, cuts, seed):
    items = [b"%06d" % i + b"x" * (sizes[i % len(sizes)] if sizes else 0) for i in range(n)]

    def run(pieces):
        buf = ShuffleBuffer(buffer_size, rng=np.random.default_rng(seed),
                            buffer_bytes=buffer_bytes, initial=initial)
        out, pos, k = [], 0, 0
        biggest = 0
        while pos < n:
            piece = items[pos:pos + pieces[k % len(pieces)]]
            k += 1
            pos += len(piece)
            biggest = max([biggest] + [len(x) for x in piece])
            emitted, _ = buf.push(piece)
            out.extend(emitted)
            # Held: at most the bound plus one block in the making (numpy path) ...
            assert len(buf) <= buffer_size + buf.block
            if buffer_bytes is not None:
                # ... and bytes: the bound, a quarter more staged, one item over the edge.
                slack = (buffer_bytes // 4 if buf.block > 1 else 0) + 2 * biggest
                assert buf.nbytes <= buffer_bytes + slack
        out.extend(buf.drain()[0])
        assert len(buf) == 0
        return out

    first = run(cuts)
    assert sorted(first) == items  # every item exactly once
    assert run([1]) == first  # the order depends on the seed, not on the chunking


def _loop_exchange(buf, slots, items) -> list:
    """The reference: for each arrival in turn, emit the chosen slot's item and take its place."""
    out = []
    for slot, item in zip(slots.tolist(), items):
        out.append(buf[slot])
        buf[slot] = item
    return out


@given(n=st.integers(1, 300), k=st.integers(1, 300), seed=st.integers(0, 2**32))
def test_block_exchange_equals_the_one_at_a_time_loop(n, k, seed):
    from streamio.pipeline.shuffle import _ExchangePlan
    rng = np.random.default_rng(seed)
    slots = rng.integers(0, n, size=k)  # repeats included: they must behave as in the loop
    old = [b"old%d" % i for i in range(n)]
    new = [b"new%d" % j for j in range(k)]
    expected_buf = list(old)
    expected = _loop_exchange(expected_buf, slots, new)
    buf = np.empty(n, dtype=object)
    buf[:] = old
    plan = _ExchangePlan(slots, n)
    assert plan.apply(buf, np.array(new, dtype=object)).tolist() == expected
    assert buf.tolist() == expected_buf
    ids = np.arange(n, dtype=np.int64)
    new_ids = np.arange(n, n + k, dtype=np.int64)
    expected_ids = ids.tolist()
    emitted_ids = _loop_exchange(expected_ids, slots, new_ids.tolist())
    assert plan.apply(ids, new_ids).tolist() == emitted_ids
    assert ids.tolist() == expected_ids


def test_an_accelerated_exchange_gives_the_same_orders(one_file, monkeypatch):
    import streamio.pipeline.shuffle as shuffle_module

    def run():
        orders = [ids_of(list(Dataset(one_file, "tfrecord").shuffle(NUMPY_MIN_BUFFER, seed=8)))]
        buf = ShuffleBuffer(NUMPY_MIN_BUFFER, rng=np.random.default_rng(1), buffer_bytes=30000)
        items = [rec(i, i % 13) for i in range(3000)]
        out, out_ids = buf.push(items, np.arange(3000))
        rest, rest_ids = buf.drain()
        orders.append((out + rest, out_ids.tolist() + rest_ids.tolist()))
        return orders

    plain = run()
    monkeypatch.setattr(shuffle_module, "_FAST_EXCHANGE", _loop_exchange)
    assert run() == plain


def test_ids_and_sizes_move_the_same_with_or_without_the_c_kernels(one_file, monkeypatch):
    import streamio.pipeline.shuffle as shuffle_module

    def run():
        decoded = Dataset(one_file, "tfrecord", decoder=_FirstByte()).shuffle(
            NUMPY_MIN_BUFFER, seed=3).batch(64)
        orders = [[batch.tolist() for batch in decoded]]
        buf = ShuffleBuffer(NUMPY_MIN_BUFFER, rng=np.random.default_rng(2), buffer_bytes=30000)
        items = [rec(i, i % 13) for i in range(5000)]
        out, out_ids = buf.push(items, np.arange(5000))
        rest, rest_ids = buf.drain()
        orders.append((out + rest, out_ids.tolist() + rest_ids.tolist()))
        return orders

    accelerated = run()
    assert [rid(x) for x in accelerated[1][0]] == accelerated[1][1]  # ids travel with items
    monkeypatch.setattr(shuffle_module, "_FAST_EXCHANGE", None)
    monkeypatch.setattr(shuffle_module, "_FAST_EXCHANGE_INT64", None)
    assert run() == accelerated


def test_push_pieces_hands_out_what_push_does_in_the_same_order():
    items = [rec(i, i % 7) for i in range(9000)]
    for size, buffer_bytes, initial in [(NUMPY_MIN_BUFFER, None, None), (3000, 40000, 100),
                                        (10, None, None)]:
        whole = ShuffleBuffer(size, rng=np.random.default_rng(5), buffer_bytes=buffer_bytes,
                              initial=initial)
        pieces = ShuffleBuffer(size, rng=np.random.default_rng(5), buffer_bytes=buffer_bytes,
                               initial=initial)
        for start in range(0, 9000, 1234):
            chunk, ids = items[start:start + 1234], np.arange(start, min(9000, start + 1234))
            out, out_ids = whole.push(chunk, ids)
            parts = pieces.push_pieces(chunk, ids)
            assert all(part for part, _ in parts)  # no empty pieces
            assert [x for part, _ in parts for x in part] == out
            assert [int(i) for _, part_ids in parts for i in part_ids] == out_ids.tolist()
            assert len(pieces) == len(whole)
        assert pieces.drain()[0] == whole.drain()[0]


class _FirstByte:
    """A tiny decoder: a batch of records -> the record ids (so batches show their order)."""

    def decode_batch(self, records, *, source=None, first_index=0):
        return np.array([rid(r) for r in records])

    def output_spec(self):
        return None


def test_the_c_exchange_kernel_matches_the_reference_when_built():
    speedups = pytest.importorskip("streamio._speedups")
    kernel = getattr(speedups, "shuffle_exchange", None)
    if kernel is None:
        pytest.skip("the C accelerator has no shuffle_exchange")
    rng = np.random.default_rng(0)
    for n, k in [(1, 5), (10, 10), (1000, 256), (5000, 2048)]:
        slots = rng.integers(0, n, size=k)
        items = [b"new%d" % j for j in range(k)]
        buf = np.empty(n, dtype=object)
        buf[:] = [b"old%d" % i for i in range(n)]
        expected_buf = buf.tolist()
        expected = _loop_exchange(expected_buf, slots, items)
        assert kernel(buf, slots, items) == expected and buf.tolist() == expected_buf


def test_shuffle_buffer_ids_travel_with_their_items():
    rng = np.random.default_rng(0)
    for size in (5, NUMPY_MIN_BUFFER):
        buf = ShuffleBuffer(size, rng=rng)
        items = [rec(i) for i in range(3000)]
        out, out_ids = [], []
        for start in range(0, 3000, 333):
            o, oi = buf.push(items[start:start + 333], np.arange(start, min(3000, start + 333)))
            out += o
            out_ids += oi.tolist()
        o, oi = buf.drain()
        out += o
        out_ids += oi.tolist()
        assert [rid(x) for x in out] == out_ids


def test_initial_lets_items_flow_before_the_buffer_is_full():
    rng = np.random.default_rng(0)
    items = [rec(i) for i in range(40)]
    waiting = ShuffleBuffer(1000, rng=rng)
    assert waiting.push(items)[0] == []  # a full buffer's worth first
    eager = ShuffleBuffer(1000, rng=rng, initial=10)
    out = eager.push(items)[0]
    assert 10 <= len(out) <= 20  # about one out for every two in once 10 are held
    assert len(set(out)) == len(out)


def test_derive_rng_depends_on_every_part_of_the_key():
    draws = {key: derive_rng(1, epoch=key[0], rank=key[1], worker=key[2]).integers(1 << 62)
             for key in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]}
    assert len(set(draws.values())) == 4
    assert derive_rng(1, epoch=3).integers(1 << 62) == derive_rng(1, epoch=3).integers(1 << 62)


# -- memory bound ---------------------------------------------------------------------------------
_RSS_KB = textwrap.dedent("""
    def rss_kb(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
""")
_RSS_SCRIPT = _RSS_KB + textwrap.dedent("""
    import sys
    from streamio.pipeline import Dataset

    path, buffer_bytes = sys.argv[1], sys.argv[2]
    options = {} if buffer_bytes == "none" else {"buffer_bytes": int(buffer_bytes)}
    ds = Dataset(path, "tfrecord").shuffle(100_000, seed=0, **options).batch(4)
    before = rss_kb("VmRSS")
    n = 0
    for batch in ds:
        n += len(batch)
    print(n, rss_kb("VmHWM") - before)
""")


def _peak_growth_mb(path: str, buffer_bytes: str) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, path, buffer_bytes],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    return int(out[0]), int(out[1]) / 1024


def test_buffer_bytes_bounds_peak_memory(tmp_path):
    # 500 records of 100 KB (50 MB): a count bound of 100,000 would hold them all.
    records = 500
    path = write(tmp_path / "large.tfrecord", range(records), pad=100_000)
    bound_mb = 4
    n, bounded = _peak_growth_mb(path, str(bound_mb << 20))
    assert n == records
    n, unbounded = _peak_growth_mb(path, "none")
    assert n == records
    assert unbounded > 40  # without buffer_bytes the buffer holds the whole stream
    # With it: the bound, a quarter more while a block is merged and a quarter on its way out,
    # and a few MiB of read buffers and chunk lists (the reader reads 1 MiB at a time).
    assert bounded < bound_mb * 1.5 + 8, f"peak grew {bounded:.1f} MB over a {bound_mb} MB bound"


_DECODED_RSS_SCRIPT = _RSS_KB + textwrap.dedent("""
    import sys
    import numpy as np
    import streamio
    from streamio.decoders import Example, FixedLen, encode_example
    from streamio.pipeline import Dataset

    path = sys.argv[1]
    streamio.write_records(path, "tfrecord", (encode_example({"x": np.full(256, i, np.float32),
                                                              "id": i}) for i in range(60000)))
    dec = Example({"x": FixedLen((256,), "float32"), "id": FixedLen((), "int64")})
    ds = Dataset(path, "tfrecord", decoder=dec).batch(16).shuffle(1000, buffer_bytes=4 << 20,
                                                                  seed=0)
    before = rss_kb("VmRSS")
    n = 0
    for batch in ds:
        n += len(batch["id"])
    print(n, rss_kb("VmHWM") - before)
""")


def test_buffer_bytes_bounds_a_shuffle_of_decoded_batches(tmp_path):
    # 60,000 decoded rows of 1 KB (62 MB): a shuffle of batches bounded to 4 MiB must hold about
    # that much, not whole decoded chunks behind each batch it holds.
    out = subprocess.run([sys.executable, "-c", _DECODED_RSS_SCRIPT, str(tmp_path / "x.tfrecord")],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    n, grown_mb = int(out[0]), int(out[1]) / 1024
    assert n == 60000
    assert grown_mb < 4 * 1.5 + 8, f"peak grew {grown_mb:.1f} MB over a 4 MB bound"


# -- prefetch: threads, descriptors, errors --------------------------------------------------------
def _wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.mark.parametrize("how", ["break", "drop", "close", "take"])
def test_leaving_early_stops_the_thread_and_closes_the_fifo(fifo, tmp_path, how):
    data = b"".join(streamio.formats.encode_tfrecord(rec(i, 200)) for i in range(60_000))
    pipe = fifo.make(data, 65536)
    threads, fds = threading.active_count(), open_fds()
    ds = Dataset(pipe, "tfrecord").shuffle(100, seed=0).batch(16).prefetch(2)
    if how == "break":
        for batch in ds:
            assert len(batch) == 16
            break
    elif how == "drop":
        it = iter(ds)
        next(it)
        del it
    elif how == "close":
        it = iter(ds)
        next(it)
        it.close()
        with pytest.raises(StopIteration):
            next(it)
    else:
        ds = ds.take(3)
        assert len(list(ds)) == 3
    assert _wait_for(lambda: threading.active_count() == threads), "a prefetch thread is left"
    assert open_fds() <= fds, "a file descriptor is left open"
    assert pipe not in fd_targets()
    stats = ds.stats()
    assert stats["finished"] and stats["bytes"] < len(data)  # stopped reading early


@pytest.mark.parametrize("n", [4, None])  # a fixed queue, and prefetch()'s self-sized one
def test_reader_errors_come_through_prefetch_unchanged(tmp_path, n):
    path = write(tmp_path / "bad.tfrecord", range(200))
    with open(path, "r+b") as f:
        frame = 8 + 4 + 16 + 4
        f.seek(150 * frame + 12 + 3)  # a data byte of record 150
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptRecordError) as direct:
        list(streamio.read_records(path, "tfrecord"))
    got = []
    with pytest.raises(CorruptRecordError) as through:
        for record in Dataset(path, "tfrecord", read_size=512).prefetch(n):
            got.append(rid(record))
    err, expected = through.value, direct.value
    assert type(err) is type(expected)
    assert (err.source, err.offset, err.record_index) == (expected.source, expected.offset, 150)
    assert got == list(range(150))  # every whole record before the fault
    frames = [frame.filename for frame in traceback.extract_tb(err.__traceback__)]
    assert any(name.endswith(("tfrecord.py", "_framing.py", "reader.py")) for name in frames), \
        "the producer's traceback is kept"


def test_source_errors_come_through_prefetch(tmp_path):
    ds = Dataset(str(tmp_path / "missing.tfrecord"), "tfrecord").batch(2).prefetch(2)
    with pytest.raises(SourceError):
        list(ds)
    assert _wait_for(lambda: not any(t.name == "streamio-prefetch" for t in threading.enumerate()))


@given(sizes=st.lists(st.integers(1, 40), max_size=30), n=st.integers(1, 12))
def test_prefetch_hands_over_every_item_in_order(sizes, n):
    blocks, start = [], 0
    for size in sizes:
        blocks.append((list(range(start, start + size)), np.arange(start, start + size)))
        start += size
    pre = Prefetcher(iter(blocks), n)
    got, got_ids = [], []
    for items, ids in pre:
        got += items
        got_ids += ids.tolist()
    assert got == got_ids == list(range(start))
    assert _wait_for(lambda: not pre.alive)


class _Boom(Exception):
    pass


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), max_size=25), n=st.one_of(st.none(), st.integers(1, 5)),
       fail_at=st.one_of(st.none(), st.integers(0, 25)), seed=st.integers(0, 2 ** 32 - 1),
       leave_after=st.one_of(st.none(), st.integers(0, 30)))
def test_prefetch_under_random_timing_delivers_in_order_once(sizes, n, fail_at, seed, leave_after):
    # Producer and consumer each pause at random (the GIL is free meanwhile), so blocks are made
    # by either thread in any mix: items still come in order, each once, then the upstream's
    # error (the same object) or the end; leaving early stops the thread and closes the upstream.
    rng = np.random.default_rng(seed)
    pauses = rng.choice([0.0, 0.0, 0.0005, 0.002], size=64)
    closed = []

    def upstream():
        start = 0
        try:
            for k, size in enumerate(sizes):
                time.sleep(pauses[k])
                if k == fail_at:
                    raise _Boom(k)
                yield list(range(start, start + size)), None
                start += size
        finally:
            closed.append(threading.current_thread().name)

    expected = list(range(sum(sizes if fail_at is None else sizes[:fail_at])))
    pre = Prefetcher(upstream(), n)
    got = []
    error = None
    try:
        for j, (items, _) in enumerate(pre):
            got += items
            time.sleep(pauses[-1 - j % 32])
            if leave_after is not None and len(got) >= leave_after:
                break
    except _Boom as exc:
        error = exc
    pre.close()
    assert got == expected[:len(got)]
    if leave_after is None or leave_after > len(expected):
        assert got == expected
        assert (error is not None) == (fail_at is not None and fail_at < len(sizes))
    assert _wait_for(lambda: not pre.alive)
    assert len(closed) == 1  # the upstream ran its cleanup exactly once


def test_prefetch_cuts_a_block_bigger_than_its_queue():
    pre = Prefetcher(iter([(list(range(10)), np.arange(10))]), 3)
    time.sleep(0.2)  # a slow consumer: the producer thread has queued the block meanwhile
    pieces = list(pre)
    assert [items for items, _ in pieces] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [ids.tolist() for _, ids in pieces] == [items for items, _ in pieces]


def _block_makers(consumer_s: float, n=None) -> list:
    """Which thread made each block, for a consumer that spends consumer_s on each one."""
    makers = []

    def upstream():
        for i in range(20):
            time.sleep(0.003)  # a read: the GIL is free meanwhile
            makers.append(threading.current_thread().name)
            yield [i], None

    got = []
    for items, _ in Prefetcher(upstream(), n):
        got += items
        time.sleep(consumer_s)
    assert got == list(range(20))
    return makers


def test_prefetch_works_ahead_of_a_busy_consumer():
    # A consumer that spends time on each block (a training step) finds them made by the
    # producer thread, while it was busy: that is what prefetch is for.
    makers = _block_makers(0.03, n=4)
    assert makers.count("streamio-prefetch") >= 15, makers


def test_a_consumer_faster_than_its_input_makes_blocks_itself():
    # A consumer with nothing else to do would only wait for a thread switch per block: it
    # makes most blocks in its own thread instead.
    makers = _block_makers(0.0)
    assert makers.count(threading.current_thread().name) >= 10, makers


def test_prefetch_keeps_at_most_n_items_ahead():
    produced = []

    def upstream():
        for i in range(100):
            produced.append(i)
            yield [i], None

    pre = Prefetcher(upstream(), 3)
    assert next(pre) == ([0], None)
    time.sleep(0.3)  # let the producer run as far as it may
    assert len(produced) <= 1 + 3 + 1  # taken, queued, one in the producer's hand
    pre.close()
    assert _wait_for(lambda: not pre.alive)


# -- PipeChannel ----------------------------------------------------------------------------------
_CHANNEL_WRITER = textwrap.dedent("""
    import os, sys
    import streamio
    from streamio.formats import encode_tfrecord
    prefix = sys.argv[1]
    for epoch in range(2):
        path = f"{prefix}_{epoch}"
        os.mkfifo(path + ".tmp")
        os.rename(path + ".tmp", path)
        with open(path, "wb") as f:
            for i in range(500):
                f.write(encode_tfrecord(b"%08d" % (epoch * 100000 + i)))
""")


def test_pipe_channel_dataset_reads_one_fifo_per_epoch(tmp_path):
    prefix = str(tmp_path / "train")
    writer = subprocess.Popen([sys.executable, "-c", _CHANNEL_WRITER, prefix])
    try:
        channel = streamio.PipeChannel(prefix, open_timeout=30, read_timeout=30)
        ds = Dataset(channel, "tfrecord").shuffle(100, seed=0).batch(10).prefetch(2)
        epoch0 = ids_of(list(ds))
        assert ds.stats()["sources_opened"] == 1 and ds.stats()["records"] == 500
        epoch1 = ids_of(list(ds))
        assert sorted(epoch0) == list(range(500))
        assert sorted(epoch1) == list(range(100000, 100500))
        assert writer.wait(timeout=30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


# -- batch, skip, take ----------------------------------------------------------------------------
def test_batches_keep_the_last_partial_batch_unless_drop_last(one_file):
    sizes = [len(b) for b in Dataset(one_file, "tfrecord").batch(128)]
    assert sizes == [128] * 23 + [56]
    sizes = [len(b) for b in Dataset(one_file, "tfrecord").batch(128, drop_last=True)]
    assert sizes == [128] * 23
    assert ids_of(list(Dataset(one_file, "tfrecord").batch(7))) == list(range(3000))


def test_skip_and_take_apply_where_they_are_called(one_file):
    def run(ds):
        return [ids_of(x) if isinstance(x, list) else rid(x) for x in ds]

    ds = Dataset(one_file, "tfrecord")
    assert run(ds.skip(10).take(5)) == list(range(10, 15))
    assert run(ds.take(5).skip(2)) == [2, 3, 4]
    assert run(ds.batch(10).skip(2).take(2)) == [list(range(20, 30)), list(range(30, 40))]
    assert run(ds.take(25).batch(10))[-1] == list(range(20, 25))
    assert run(ds.take(0)) == [] and run(ds.skip(5000)) == []
    shuffled = run(ds.shuffle(100, seed=0).take(50))
    assert len(set(shuffled)) == 50


def test_take_stops_reading(tmp_path):
    path = write(tmp_path / "long.tfrecord", range(100_000))
    ds = Dataset(path, "tfrecord", read_size=64 * 1024).take(10)
    assert len(list(ds)) == 10
    assert ds.stats()["bytes"] <= 64 * 1024 < os.path.getsize(path)


# -- stats ----------------------------------------------------------------------------------------
def test_stats_count_delivery_damage_and_time(tmp_path):
    path = write(tmp_path / "s.tfrecord", range(1000))
    with open(path, "r+b") as f:
        f.seek(10 * 32 + 12 + 2)  # a data byte of record 10: one corrupt record
        f.write(b"!")
    ds = Dataset(path, "tfrecord", on_error="skip").shuffle(64, seed=0).batch(100).prefetch(2)
    assert ds.stats()["records"] == 0 and ds.stats()["epoch"] is None
    it = iter(ds)
    next(it)
    during = ds.stats()
    assert not during["finished"] and 100 <= during["records"] <= 999
    rest = list(it)
    stats = ds.stats()
    assert set(STATS_KEYS) <= set(stats)
    assert stats["finished"] and stats["epoch"] == 0
    assert stats["records"] == 999 == 100 + sum(len(b) for b in rest)
    assert stats["batches"] == 10
    assert stats["skipped_records"] == 1 and stats["skipped_bytes"] == 32
    assert stats["bytes"] == os.path.getsize(path) and stats["records_read"] == 999
    assert stats["first_batch_s"] is not None and stats["first_batch_s"] <= stats["elapsed_s"]
    assert stats["wait_s"] + stats["consumer_s"] == pytest.approx(stats["elapsed_s"])
    assert stats["records_per_s"] == pytest.approx(999 / stats["elapsed_s"])
    assert stats["source_wait_s"] >= 0


# -- decoders -------------------------------------------------------------------------------------

def example_with_id(i: int) -> bytes:
    """tf.train.Example{features{feature{"id": int64_list{value: [i]}}}}, by hand."""
    int64_list = field(1, varint(i))
    feature = field(3, int64_list)
    entry = field(1, b"id") + field(2, feature)
    return field(1, field(1, entry))


@pytest.fixture
def examples(tmp_path):
    decoders = pytest.importorskip("streamio.decoders")
    records = [example_with_id(i) for i in range(300)]
    records[137] = b"\xff\xff\xff"  # framed fine, not an Example
    path = str(tmp_path / "examples.tfrecord")
    streamio.write_records(path, "tfrecord", records)
    return path, decoders.Example({"id": decoders.FixedLen((), "int64")})


def test_decoded_batches_are_dicts_of_arrays_exactly_once(examples, tmp_path):
    _, decoder = examples
    path = str(tmp_path / "good.tfrecord")
    streamio.write_records(path, "tfrecord", (example_with_id(i) for i in range(300)))
    ds = Dataset(path, "tfrecord", decoder=decoder).shuffle(64, seed=0).batch(32).prefetch(2)
    assert ds.decoder is decoder and ds.batch_size == 32
    batches = list(ds)
    assert all(isinstance(b["id"], np.ndarray) and b["id"].dtype == np.int64 for b in batches)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(300)) and ids.tolist() != list(range(300))
    assert ds.stats()["records"] == 300 and ds.stats()["decode_s"] > 0


@pytest.mark.parametrize("shuffled", [False, True])
def test_decode_errors_name_the_record_in_its_stream(examples, shuffled):
    path, decoder = examples
    ds = Dataset(path, "tfrecord", decoder=decoder)
    if shuffled:
        ds = ds.shuffle(300, seed=1)
    with pytest.raises(DecodeError) as info:
        list(ds.batch(16).prefetch(2))
    assert info.value.record_index == 137 and info.value.source == path


def test_csv_headers_are_read_before_shuffle_and_shard(tmp_path):
    decoders = pytest.importorskip("streamio.decoders")
    paths = []
    for k in range(2):
        rows = [b"id,x"] + [b"%d,%d" % (k * 100 + i, i * 2) for i in range(100)]
        path = tmp_path / f"t{k}.csv"
        path.write_bytes(b"\n".join(rows) + b"\n")
        paths.append(str(path))
    decoder = decoders.Csv(header=True, as_columns=True, dtype="int64")
    ds = Dataset(paths, "csv", decoder=decoder).shuffle(50, seed=0).batch(16)
    ids = np.concatenate([b["id"] for b in ds]).tolist()
    assert sorted(ids) == list(range(100)) + list(range(100, 200))
    # Round-robin shards of one file (a CSV row may hold a quoted line break, so it is not split
    # by byte range, which is said once per source): each shard's decoder still learns the
    # header.
    shard_ids = []
    with pytest.warns(StreamioWarning, match="not split by byte range"):
        for i in range(3):
            shard_ids.append(np.concatenate([
                b["id"] for b in Dataset(paths[0], "csv", decoder=decoder)
                .shuffle(20, seed=0).batch(8).shard(3, i)]).tolist())
    assert sorted(i for s in shard_ids for i in s) == list(range(100))
    other = tmp_path / "other.csv"
    other.write_bytes(b"x,id\n1,2\n")
    with pytest.raises(DecodeError) as info:
        list(Dataset([paths[0], str(other)], "csv", decoder=decoder).batch(8))
    assert info.value.source == str(other)


# -- sources ---------------------------------------------------------------------------------------
def test_globs_and_directories_expand_to_sorted_files(tmp_path):
    for name in ("b.tfrecord", "a.tfrecord", "c.txt", ".hidden.tfrecord"):
        write(tmp_path / name, range(3))
    (tmp_path / "sub").mkdir()
    a, b, c = (str(tmp_path / n) for n in ("a.tfrecord", "b.tfrecord", "c.txt"))
    assert Dataset(str(tmp_path / "*.tfrecord"), "tfrecord").sources == (a, b)
    assert Dataset(str(tmp_path), "tfrecord").sources == (a, b, c)
    assert Dataset([str(tmp_path / "b*"), a], "tfrecord").sources == (b, a)
    with pytest.raises(ValueError, match="no files match"):
        Dataset(str(tmp_path / "*.nothing"), "tfrecord")
    with pytest.raises(ValueError, match="no files"):
        Dataset(str(tmp_path / "sub"), "tfrecord")


def test_a_packed_directory_reads_its_shards_not_their_index_files(tmp_path):
    """`streamio pack --index` / `streamio index` write x.tfrecord.index beside x.tfrecord
    (MXNet: x.idx beside x.rec): a directory or glob over them reads the records once, and the
    index still serves the byte-range splits."""
    from streamio.tools.index import write_index

    for k in range(2):
        path = write(tmp_path / f"part-{k}.tfrecord", range(10 * k, 10 * k + 10))
        write_index(path, "tfrecord")
    streamio.write_records(str(tmp_path / "train.rec"), "recordio", [b"r%d" % i for i in range(4)])
    (tmp_path / "train.idx").write_text("0\t0\n")
    (tmp_path / "lone.idx").write_text("not an index of anything here\n")
    names = [os.path.basename(s) for s in Dataset(str(tmp_path), "tfrecord").sources]
    assert names == ["lone.idx", "part-0.tfrecord", "part-1.tfrecord", "train.rec"]
    tfrecords = Dataset(str(tmp_path / "part-*"), "tfrecord")
    assert [os.path.basename(s) for s in tfrecords.sources] == ["part-0.tfrecord",
                                                                 "part-1.tfrecord"]
    assert sorted(ids_of(list(tfrecords))) == list(range(20))
    assert sorted(i for k in range(3) for i in ids_of(list(tfrecords.shard(3, k)))) \
        == list(range(20))


def test_bytes_source_and_a_list_read_in_order(tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(rec(i)) for i in range(5))
    path = write(tmp_path / "x.tfrecord", range(5, 9))
    assert ids_of(list(Dataset([data, path], "tfrecord"))) == list(range(9))


def test_dataset_pickles_for_worker_processes(one_file):
    ds = Dataset(one_file, "tfrecord").shuffle(100, seed=9).batch(10)
    first = ids_of(list(ds))
    clone = pickle.loads(pickle.dumps(ds))
    assert ids_of(list(clone.with_context(epoch=0))) == first


# -- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("build, error", [
    (lambda ds: ds.batch(0), ValueError),
    (lambda ds: ds.batch(2.5), TypeError),
    (lambda ds: ds.batch(4).batch(4), ValueError),
    (lambda ds: ds.shard(2, 2), ValueError),
    (lambda ds: ds.shard(0, 0), ValueError),
    (lambda ds: ds.shard(2, -1), ValueError),
    (lambda ds: ds.shuffle(-1), ValueError),
    (lambda ds: ds.shuffle(0), ValueError),
    (lambda ds: ds.shuffle(10, buffer_bytes=-5), ValueError),
    (lambda ds: ds.shuffle(10, initial=-1), ValueError),
    (lambda ds: ds.shuffle(10, seed=-1), ValueError),
    (lambda ds: ds.shuffle_batches(4), ValueError),
    (lambda ds: ds.prefetch(0), ValueError),
    (lambda ds: ds.take(-1), ValueError),
    (lambda ds: ds.skip(-1), ValueError),
    (lambda ds: ds.with_context(rank=2, world_size=2), ValueError),
    (lambda ds: ds.with_context(worker=1), ValueError),
    (lambda ds: ds.with_context(epoch=-1), ValueError),
])
def test_bad_arguments_raise_when_the_dataset_is_built(one_file, build, error):
    with pytest.raises(error):
        build(Dataset(one_file, "tfrecord"))


def test_bad_constructor_arguments(one_file):
    with pytest.raises(ValueError):
        Dataset(one_file, "parquet")
    with pytest.raises(TypeError):
        Dataset(one_file, "tfrecord", chunk_size=5)  # unknown reader option
    with pytest.raises(ValueError):
        Dataset(one_file, "tfrecord", on_error="ignore")
    with pytest.raises(TypeError):
        Dataset(one_file, "tfrecord", decoder=object())
    with pytest.raises(TypeError):
        Dataset(12345, "tfrecord")
    with pytest.raises(ValueError):
        Dataset([], "tfrecord")


def test_methods_return_new_datasets(one_file):
    ds = Dataset(one_file, "tfrecord")
    chained = ds.shuffle(10, seed=0).batch(5).prefetch(2).shard(2, 1).take(3)
    assert ds.batch_size is None and chained.batch_size == 5
    assert ids_of(list(ds)) == list(range(3000))
    assert len(list(chained)) == 3
    gc.collect()

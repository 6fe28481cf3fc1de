"""Dataset.map / Dataset.filter: inline, threads and processes, over real files and FIFOs."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import zlib

import multiprocessing
import numpy as np
import pytest

import streamio
from streamio import Dataset
from streamio.errors import DecodeError, MapError
from streamio.pipeline.parallel import SEGMENT_PREFIX, item_rng

N = 500
RECORDS = [zlib.compress(f"record {i:05d} ".encode() * (1 + i % 7)) for i in range(N)]
PLAIN = [zlib.decompress(r) for r in RECORDS]
CONFIGS = [(None, "thread"), (1, "thread"), (3, "thread"), (1, "process"), (2, "process")]


# Module-level functions: a process backend pickles them by name.
def inflate(record: bytes) -> bytes:
    return zlib.decompress(record)


def jittery(record: bytes) -> bytes:
    # Uneven work, so threads finish out of order and ordered=True has something to do.
    time.sleep(0.002 if zlib.crc32(record) % 3 == 0 else 0.0)
    return zlib.decompress(record)


def fails_on_123(record: bytes) -> bytes:
    text = zlib.decompress(record)
    if text.startswith(b"record 00123 "):
        raise ValueError("cannot map record 123")
    return text


def fails_on_batch_3(batch: list) -> int:
    if zlib.decompress(batch[0]).startswith(b"record 00030 "):
        raise KeyError("batch three")
    return len(batch)


def decode_error(record: bytes) -> bytes:
    if zlib.decompress(record).startswith(b"record 00007 "):
        raise DecodeError("bad image", record_index=0, field="image")
    return record


def draws(record: bytes, rng: np.random.Generator) -> int:
    return int(rng.integers(1 << 62))


def batch_draws(batch: list, rng: np.random.Generator) -> int:
    return int(rng.integers(1 << 62))


def slow(record: bytes) -> int:
    time.sleep(0.05)
    return os.getpid()


def pid_of(record: bytes) -> int:
    time.sleep(0.01)
    return os.getpid()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("map") / "records.tfrecord"
    streamio.write_records(str(p), "tfrecord", RECORDS)
    return str(p)


def shm_names() -> set:
    # Other processes on this machine use /dev/shm too: look at this process's map segments.
    mine = f"{SEGMENT_PREFIX}{os.getpid()}-"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}


def map_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("streamio-map")]


def assert_clean(before_shm: set) -> None:
    gc.collect()
    assert multiprocessing.active_children() == []
    assert map_threads() == []
    assert shm_names() - before_shm == set()


# -- order, completeness ------------------------------------------------------------------------
@pytest.mark.parametrize("num_parallel,backend", CONFIGS)
def test_map_keeps_order(path, num_parallel, backend):
    ds = Dataset(path, "tfrecord", read_size=777)  # small reads: many blocks
    assert list(ds.map(jittery, num_parallel=num_parallel, backend=backend)) == PLAIN


@pytest.mark.parametrize("num_parallel,backend", CONFIGS)
def test_unordered_map_delivers_every_item_once(path, num_parallel, backend):
    ds = Dataset(path, "tfrecord", read_size=777)
    out = list(ds.map(jittery, num_parallel=num_parallel, backend=backend, ordered=False))
    assert sorted(out) == sorted(PLAIN)


@pytest.mark.parametrize("num_parallel,backend", CONFIGS)
def test_map_over_batches_of_raw_records(path, num_parallel, backend):
    """After batch() an item is a list of records: the way image decoders are mapped."""
    out = list(Dataset(path, "tfrecord").batch(64).map(len, num_parallel=num_parallel,
                                                       backend=backend))
    assert out == [64] * (N // 64) + [N % 64]


def test_map_composes_with_shuffle_batch_prefetch_from_a_fifo(fifo):
    data = b"".join(_framed(r) for r in RECORDS)
    pipe = fifo.make(data, 1, 999, 4093)
    ds = (Dataset(pipe, "tfrecord").prefetch().shuffle(100, seed=1)
          .map(inflate, num_parallel=2).filter(lambda r: not r.startswith(b"record 00000 "))
          .batch(32).map(len, num_parallel=2, backend="thread", ordered=False).prefetch(2))
    sizes = list(ds)
    assert sum(sizes) == N - 1
    stats = ds.stats()
    assert stats["batches"] == len(sizes) and stats["records_read"] == N


def _framed(record: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    streamio.write_records(buf, "tfrecord", [record])
    return buf.getvalue()


def test_stats_count_what_the_map_delivers(path):
    ds = Dataset(path, "tfrecord").filter(lambda r: zlib.decompress(r).endswith(b"0 ")).batch(10)
    ds = ds.map(lambda b: (np.zeros((len(b), 3)), np.arange(len(b))))
    batches = list(ds)
    stats = ds.stats()
    assert stats["batches"] == len(batches)
    assert stats["records"] == sum(len(b[1]) for b in batches) == N // 10


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_parallel,backend", CONFIGS)
def test_error_names_the_record_and_keeps_the_cause(path, num_parallel, backend):
    got = []
    with pytest.raises(MapError) as info:
        for item in Dataset(path, "tfrecord").map(fails_on_123, num_parallel=num_parallel,
                                                  backend=backend):
            got.append(item)
    err = info.value
    assert got == PLAIN[:123]  # everything before the fault, in order
    assert (err.source, err.record_index, err.item_index) == (path, 123, 123)
    assert isinstance(err.__cause__, ValueError)
    assert "cannot map record 123" in str(err)
    if backend == "process":  # the child's traceback travels as text
        assert "fails_on_123" in str(err.__cause__.__cause__)
    else:
        assert err.__cause__.__traceback__ is not None


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_error_in_a_batch_names_its_position(path, backend):
    with pytest.raises(MapError) as info:
        list(Dataset(path, "tfrecord").batch(10).map(fails_on_batch_3, num_parallel=2,
                                                     backend=backend))
    assert info.value.item_index == 3 and info.value.record_index is None
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("num_parallel,backend", [(None, "thread"), (2, "process")])
def test_a_decode_error_passes_through_with_a_note(path, num_parallel, backend):
    with pytest.raises(DecodeError) as info:
        list(Dataset(path, "tfrecord").map(decode_error, num_parallel=num_parallel,
                                           backend=backend))
    assert info.value.field == "image"
    assert any("record 7" in note for note in info.value.__notes__)


def test_filter_error_names_the_record(path):
    def picky(record):
        if zlib.decompress(record).startswith(b"record 00042 "):
            raise RuntimeError("no")
        return True

    with pytest.raises(MapError) as info:
        list(Dataset(path, "tfrecord").filter(picky))
    assert info.value.record_index == 42 and isinstance(info.value.__cause__, RuntimeError)


def test_bad_arguments_fail_at_construction(path):
    ds = Dataset(path, "tfrecord")
    with pytest.raises(TypeError):
        ds.map("not callable")
    with pytest.raises(ValueError):
        ds.map(len, num_parallel=0)
    with pytest.raises(ValueError):
        ds.map(len, num_parallel=2, backend="gpu")
    with pytest.raises(TypeError):
        ds.map(len, ordered=1)
    lock = threading.Lock()  # cloudpickle takes lambdas and closures, but not a lock
    with pytest.raises(TypeError, match="pickles"):
        ds.map(lambda r: (lock, r), num_parallel=2, backend="process")
    with pytest.raises(TypeError):
        ds.map(len, bogus=True)
    with pytest.raises(TypeError):
        ds.filter(None)


# -- cleanup ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["break", "close", "del"])
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_leaving_early_stops_every_worker_and_frees_shared_memory(path, backend, how):
    before = shm_names()
    it = iter(Dataset(path, "tfrecord").map(slow, num_parallel=2, backend=backend))
    for _, _ in zip(range(3), it):
        pass
    if backend == "process":
        assert multiprocessing.active_children()  # they were running
        assert shm_names() - before  # and held segments
    if how == "close":
        it.close()
    elif how == "del":
        del it
    else:
        for _ in it:
            break
        it.close()
    assert_clean(before)


def test_error_exit_cleans_up_too(path):
    before = shm_names()
    with pytest.raises(MapError):
        list(Dataset(path, "tfrecord").map(fails_on_123, num_parallel=2, backend="process"))
    assert_clean(before)


def test_a_dead_map_process_ends_the_epoch_with_an_error(path):
    before = shm_names()
    it = iter(Dataset(path, "tfrecord").map(pid_of, num_parallel=2, backend="process"))
    pid = next(it)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(MapError, match="died"):
        for _ in it:
            pass
    assert_clean(before)


# -- seeds ----------------------------------------------------------------------------------------
def test_seeded_map_is_reproducible_across_runs_and_parallelism(path):
    ds = Dataset(path, "tfrecord").with_context(epoch=3)
    runs = [list(ds.map(draws, num_parallel=k, backend=b, seed=11))
            for k, b in [(None, "thread"), (3, "thread"), (2, "process")]]
    runs.append(sorted(Dataset(path, "tfrecord").with_context(epoch=3)
                       .map(draws, num_parallel=2, seed=11, ordered=False)))
    assert runs[0] == runs[1] == runs[2] and sorted(runs[0]) == runs[3]
    assert len(set(runs[0])) == N
    # the record, not its arrival order, keys the draw: a shuffle moves the values with it
    shuffled = list(ds.shuffle(50, seed=2).map(draws, seed=11))
    assert sorted(shuffled) == sorted(runs[0]) and shuffled != runs[0]
    assert runs[0][0] == int(item_rng(11, epoch=3, record=0).integers(1 << 62))
    other_epoch = list(Dataset(path, "tfrecord").with_context(epoch=4).map(draws, seed=11))
    assert other_epoch != runs[0]


def test_seeded_batch_map_depends_on_worker_and_position(path):
    ds = Dataset(path, "tfrecord").batch(50)
    a = list(ds.with_context(epoch=0).map(batch_draws, seed=1, num_parallel=2))
    b = list(ds.with_context(epoch=0).map(batch_draws, seed=1))
    c = list(ds.with_context(epoch=0, worker=1, num_workers=2).map(batch_draws, seed=1))
    assert a == b and a != c


# -- adapters -------------------------------------------------------------------------------------
def test_to_torch_after_map(path):
    torch = pytest.importorskip("torch")
    ds = Dataset(path, "tfrecord").batch(100).map(
        lambda b: {"n": np.array([len(r) for r in b])}, num_parallel=2)
    batches = list(ds.to_torch())
    assert all(isinstance(b["n"], torch.Tensor) for b in batches)
    assert sum(len(b["n"]) for b in batches) == N


def lengths_and_labels(batch: list) -> tuple:
    return np.array([len(r) for r in batch], np.int64), np.arange(len(batch), dtype=np.int32)


@pytest.mark.parametrize("num_parallel,backend", [(None, "thread"), (2, "process")])
def test_to_tf_after_map(path, num_parallel, backend):
    tf = pytest.importorskip("tensorflow")
    tds = Dataset(path, "tfrecord").batch(64).map(lengths_and_labels, num_parallel=num_parallel,
                                                   backend=backend).to_tf()
    assert tds.element_spec[0].dtype == tf.int64 and tds.element_spec[1].dtype == tf.int32
    for _ in range(2):  # two epochs, the first one's first batch was peeked
        total = sum(int(tf.size(y)) for _, y in tds)
        assert total == N


def digests(batch: list) -> list:
    import hashlib

    return [hashlib.sha256(r).hexdigest() for r in batch]


def test_process_map_carries_large_batches_exactly(tmp_path):
    """Batches of 100 KB records (6 MB a task: the slots' segments grow) arrive byte for byte."""
    import hashlib

    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, 100_000 + i, dtype=np.uint8).tobytes() for i in range(150)]
    path = str(tmp_path / "big.tfrecord")
    streamio.write_records(path, "tfrecord", records)
    before = shm_names()
    got = [d for batch in Dataset(path, "tfrecord").batch(64).map(digests, num_parallel=2,
                                                                 backend="process")
           for d in batch]
    assert got == [hashlib.sha256(r).hexdigest() for r in records]
    assert_clean(before)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_map_behind_prefetch_is_cleaned_up_too(path, backend):
    """The prefetch thread runs the map stage (and owns its pool); closing the epoch from the
    consumer still stops everything."""
    before = shm_names()
    ds = Dataset(path, "tfrecord").map(slow, num_parallel=2, backend=backend).prefetch(2).batch(5)
    it = iter(ds)
    for _ in range(3):
        next(it)
    it.close()
    assert_clean(before)
    assert [t for t in threading.enumerate() if "prefetch" in t.name.lower()] == []


# -- results through shared memory (process backend) ---------------------------------------------
def arrays_of(batch: list) -> dict:
    """Large arrays (out of band), a small one and a strided one (in band), sized by the batch,
    with contents that depend on every record: a mixed-up result shows."""
    seeds = np.array([zlib.crc32(r) for r in batch], np.uint32)
    rng = np.random.default_rng(seeds)
    n = len(batch) * 600  # bigger batches, bigger results: the result segments must grow
    return {"u8": rng.integers(0, 256, (n, 37), np.uint8),
            "f32": rng.standard_normal(n).astype(np.float32),
            "small": seeds.copy(),
            "strided": rng.integers(0, 9, (n, 4), np.int64)[:, ::2],
            "fortran": np.asfortranarray(rng.integers(0, 9, (n, 5), np.int16)),
            "nested": (seeds.astype(np.float64) * 2, [b"%d" % len(batch)])}


def assert_same_results(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key in ("u8", "f32", "small", "strided", "fortran"):
            assert g[key].dtype == w[key].dtype and np.array_equal(g[key], w[key]), key
        assert np.array_equal(g["nested"][0], w["nested"][0]) and g["nested"][1] == w["nested"][1]


@pytest.mark.parametrize("ordered", [True, False])
def test_process_map_returns_arrays_that_the_consumer_owns(path, ordered):
    """Arrays come back equal, writable, and stay intact while later batches arrive through the
    same (reused, then grown) result segments."""
    before = shm_names()
    ds = Dataset(path, "tfrecord").batch(40)
    want = [arrays_of(b) for b in ds]
    got = list(ds.map(arrays_of, num_parallel=2, backend="process", ordered=ordered))
    if not ordered:  # every batch exactly once, in any order: compare in input order
        position = {tuple(w["small"].tolist()): i for i, w in enumerate(want)}
        got.sort(key=lambda r: position[tuple(r["small"].tolist())])
    assert_same_results(got, want)
    for result in got:  # writable, and never overwritten by a later result (lent or copied)
        result["u8"][:] = 0
        assert result["u8"].flags.writeable and result["f32"].flags.writeable
    assert_same_results([arrays_of(b) for b in ds], want)
    assert_clean(before)


def test_process_map_results_of_growing_size(tmp_path):
    """A later, larger task or result than the slot's segment holds gets a new segment, which
    the other side attaches in place of the old one; the old one is unlinked (nothing
    accumulates in /dev/shm while the epoch runs)."""
    # 0.25 to 6 MB a record: ~20 tasks reuse the 4 slots, whose input and result segments grow
    # from 1 to 2, 4 and 8 MiB.
    records = [bytes([i]) * ((1 + i) * 250_000) for i in range(24)]
    path = str(tmp_path / "grow.tfrecord")
    streamio.write_records(path, "tfrecord", records)
    before = shm_names()
    peak = 0
    got = []
    for result in Dataset(path, "tfrecord").batch(1).map(same_size_result, num_parallel=2,
                                                         backend="process"):
        got.append((int(result[0]), result.nbytes, bool((result == result[0]).all())))
        del result  # given back to its child, which reuses it or replaces it to grow
        peak = max(peak, len(shm_names() - before))
    assert got == [(i, len(record), True) for i, record in enumerate(records)]
    # Per child: 2 input slots, results of its tasks in flight or read ahead (2), lent (LEASES)
    # or about to be given back, and one more while it replaces a result segment (it creates
    # the new one, then unlinks the old one); children that kept their replaced result
    # segments until the end reach 20 and more here
    from streamio.pipeline.parallel.shm_results import LEASES
    assert peak <= 2 * (2 + 2 + LEASES + 1), peak
    assert_clean(before)


def same_size_result(batch: list) -> np.ndarray:
    return np.frombuffer(batch[0], np.uint8).copy()


def lent_from_shared_memory(array: np.ndarray) -> bool:
    """True when ``array`` views a segment the map lends (no copy): its base is a view of an
    mmap of /dev/shm, not memory of this process's own."""
    import mmap

    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def record_array(record: bytes) -> np.ndarray:
    """40 KB (out of band) that depend on the record."""
    return np.full(10_000, zlib.crc32(record), np.uint32)


def test_process_map_lends_results_while_the_consumer_keeps_a_few(path):
    """A consumer that keeps its last few results (a prefetch queue, a training step) gets every
    one without a copy once it lets go of older ones, and a kept result is never overwritten by a
    later one, even after the consumer wrote into it; one that keeps more than the lending limit
    gets copies past it, still intact. (Tasks are 64 records: the results of one task share a
    segment, lent until the last of them is dropped.)"""
    from streamio.pipeline.parallel.shm_results import LEASES

    want = [zlib.crc32(r) for r in RECORDS] * 4
    for keep in (1, 64 * (2 * LEASES + 1)):
        before = shm_names()
        window: list = []
        lent = []
        peak = 0
        for i, result in enumerate(Dataset([path] * 4, "tfrecord").map(
                record_array, num_parallel=2, backend="process")):
            lent.append(lent_from_shared_memory(result))
            peak = max(peak, len(shm_names() - before))
            assert result.flags.writeable
            window.append((i, result))
            if len(window) > keep:
                j, old = window.pop(0)
                assert (old == want[j]).all(), j  # intact after later results came
                old[:] = 7  # the consumer's own now; must not reach a later result
                del old
            del result
        assert len(lent) == len(want)
        assert all((r == want[j]).all() for j, r in window)
        # Segments are reused, not piling up: per process its 2 input slots, and results lent,
        # in flight or read ahead, and being given back.
        assert peak <= 2 * (2 + LEASES + 4), peak
        if keep == 1:
            assert all(lent), lent.index(False)  # given back and lent again, task after task
        else:
            assert any(lent) and not all(lent), lent
        del window
        assert_clean(before)


def big_pid(record: bytes) -> np.ndarray:
    time.sleep(0.01)
    return np.full(100_000, os.getpid(), np.int64)


def test_a_map_process_killed_with_results_in_shared_memory_leaves_nothing(path):
    before = shm_names()
    it = iter(Dataset(path, "tfrecord").map(big_pid, num_parallel=2, backend="process"))
    first = next(it)
    assert shm_names() - before  # result segments exist
    os.kill(int(first[0]), signal.SIGKILL)
    with pytest.raises(MapError, match="died"):
        for _ in it:
            pass
    assert_clean(before)


@pytest.mark.parametrize("how", ["break", "close"])
def test_leaving_early_with_large_results_frees_result_segments(path, how):
    before = shm_names()
    it = iter(Dataset(path, "tfrecord").batch(20).map(arrays_of, num_parallel=2,
                                                      backend="process"))
    kept = [next(it) for _ in range(3)]
    if how == "close":
        it.close()
    else:
        del it
    assert_clean(before)
    # what was delivered before stays valid after the segments are gone
    want = [arrays_of(b) for b in list(Dataset(path, "tfrecord").batch(20))[:3]]
    assert_same_results(kept, want)


def fails_after_arrays(batch: list) -> np.ndarray:
    if zlib.decompress(batch[0]).startswith(b"record 00040 "):
        raise ValueError("batch at record 40")
    return np.full(200_000, len(batch), np.uint8)


def test_error_after_array_results_keeps_earlier_results_and_names_position(path):
    before = shm_names()
    got = []
    with pytest.raises(MapError) as info:
        for result in Dataset(path, "tfrecord").batch(10).map(fails_after_arrays,
                                                               num_parallel=2, backend="process"):
            got.append(result)
    assert len(got) == 4 and all(r.nbytes == 200_000 and (r == 10).all() for r in got)
    assert info.value.item_index == 4
    assert "batch at record 40" in str(info.value.__cause__)
    assert_clean(before)


def test_forkserver_preload_names_the_modules_fn_needs():
    import pickle

    from streamio.pipeline.parallel import _pickled_modules

    decoder = streamio.ImageRecord(size=32)
    modules = _pickled_modules(pickle.dumps(decoder.decode_batch, pickle.HIGHEST_PROTOCOL))
    assert "streamio.decoders.image" in modules
    # a user's module is imported by each child, never by the shared server (it may start threads)
    assert _pickled_modules(pickle.dumps(inflate, pickle.HIGHEST_PROTOCOL)) == [
        "streamio.pipeline.parallel"]

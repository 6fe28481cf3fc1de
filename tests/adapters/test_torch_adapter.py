"""The PyTorch adapter: tensors without copies, every record once over workers and ranks, epochs
and seeds, to_device.

DataLoader scenarios with worker processes run in a fresh interpreter (tests/scripts/): this
pytest process may have imported TensorFlow, and forking workers from it can deadlock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import streamio  # noqa: E402
from streamio.decoders import (Example, FixedLen, RecordIOProtobuf, SparseBatch,  # noqa: E402
                               VarLen, encode_recordio_protobuf)
from streamio.decoders import encode_example  # noqa: E402
from streamio.errors import MissingDependencyError, UsageError  # noqa: E402
from streamio.pipeline import Dataset  # noqa: E402
from streamio.torch import convert_batch, even_batches, to_device, to_torch  # noqa: E402

from conftest import SCRIPTS  # noqa: E402
from support.examples import ID_X, write_id_parts  # noqa: E402

DECODER = ID_X
SUBPROCESS_TIMEOUT = 120


@pytest.fixture
def parts(tmp_path):
    return write_id_parts(str(tmp_path), [37, 50, 13, 41, 29, 30])  # 200 records, uneven


def ids_of(batches):
    out = []
    for batch in batches:
        out.extend(batch["id"].tolist())
    return out


# -- conversion ----------------------------------------------------------------------------------
def test_numeric_columns_become_tensors_that_share_memory():
    decoder = Example({"x": FixedLen([3], "float32"), "y": FixedLen([], "int64"),
                       "v": VarLen("int64"), "s": FixedLen([], "bytes")})
    records = [encode_example({"x": [i, i + 1.0, i + 2.0], "y": i, "v": np.arange(i),
                               "s": b"row%d" % i}) for i in range(4)]
    batch = decoder.decode_batch(records)
    out = convert_batch(batch)
    assert isinstance(out["x"], torch.Tensor) and out["x"].dtype == torch.float32
    assert out["x"].shape == (4, 3) and out["y"].tolist() == [0, 1, 2, 3]
    # torch.from_numpy: the tensor is a view of the decoder's array, not a copy.
    assert np.shares_memory(out["x"].numpy(), batch["x"])
    assert np.shares_memory(out["v"].numpy(), batch["v"])
    assert out["v_len"].tolist() == [0, 1, 2, 3] and out["v"][3].tolist() == [0, 1, 2]
    assert out["s"] == [b"row0", b"row1", b"row2", b"row3"]  # bytes stay Python objects


def test_read_only_arrays_are_copied_not_aliased():
    array = np.frombuffer(np.arange(6, dtype=np.float32).tobytes(), dtype=np.float32)
    tensor = convert_batch({"a": array})["a"]
    tensor += 1  # must not write into memory numpy marked read-only
    assert array.tolist() == [0, 1, 2, 3, 4, 5] and tensor.tolist() == [1, 2, 3, 4, 5, 6]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_recordio_protobuf_becomes_csr_tensor(tmp_path):
    rng = np.random.default_rng(0)
    dense = ((rng.random((40, 25)) < 0.2) * rng.random((40, 25))).astype(np.float32)
    rows, cols = np.nonzero(dense)
    sparse = SparseBatch(np.concatenate([[0], np.cumsum((dense != 0).sum(1))]), cols,
                         dense[rows, cols], dense.shape)
    path = str(tmp_path / "sparse.rec")
    streamio.write_records(path, "recordio",
                           encode_recordio_protobuf(sparse, np.arange(40, dtype=np.float32)))
    ds = Dataset(path, "recordio", decoder=RecordIOProtobuf()).batch(16)
    got = list(torch.utils.data.DataLoader(ds.to_torch(), batch_size=None))
    assert [b["values"].layout for b in got] == [torch.sparse_csr] * 3
    assert np.array_equal(torch.cat([b["values"].to_dense() for b in got]).numpy(), dense)
    assert torch.cat([b["label_values"] for b in got]).flatten().tolist() == list(range(40))


def test_raw_records_pass_through(parts):
    batches = list(Dataset(parts[:1], "tfrecord").batch(10).to_torch())
    assert [len(b) for b in batches] == [10, 10, 10, 7]
    assert all(isinstance(r, bytes) for b in batches for r in b)


# -- one process: epochs, seeds, sharding plans ------------------------------------------------
def test_each_iter_is_an_epoch_with_its_own_order_and_set_epoch_replays(parts):
    tds = Dataset(parts, "tfrecord", decoder=DECODER).shuffle(64, seed=7).batch(8).to_torch()
    loader = torch.utils.data.DataLoader(tds, batch_size=None)
    first, second = ids_of(loader), ids_of(loader)
    assert sorted(first) == sorted(second) == list(range(200))
    assert first != second
    assert tds.epoch == 2
    tds.set_epoch(1)
    assert ids_of(loader) == second
    assert tds.epoch == 2
    stats = tds.stats()
    assert stats["epoch"] == 1 and stats["records"] == 200


def test_single_fifo_is_read_by_the_main_process(fifo, tmp_path, parts):
    data = b"".join(open(p, "rb").read() for p in parts)
    path = fifo.make(data, name="train.fifo")
    ds = Dataset(path, "tfrecord", decoder=DECODER).shuffle(50, seed=1).batch(32).prefetch(2)
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=0)
    assert sorted(ids_of(loader)) == list(range(200))


@pytest.mark.parametrize("world_size,num_workers", [(1, 3), (2, 3), (2, 2), (3, 2)])
def test_plans_split_sources_exactly_once(parts, world_size, num_workers):
    tds = Dataset(parts, "tfrecord", decoder=DECODER).batch(7).to_torch()
    seen = []
    for rank in range(world_size):
        for worker in range(num_workers):
            plan = tds.plan(epoch=0, rank=rank, world_size=world_size, worker=worker,
                            num_workers=num_workers)
            seen.extend(ids_of(plan))
    assert sorted(seen) == list(range(200))


def test_plan_shares_one_fifo_between_local_ranks_and_refuses_unsaid_hosts(tmp_path,
                                                                           monkeypatch):
    # (Workers and local ranks sharing it for real: tests/adapters/test_shared_fifo.py and
    # tests/adapters/test_shared_stream_multirank.py.)
    from streamio.sharing.stream import SharedStreamFeed
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    path = str(tmp_path / "pipe")
    os.mkfifo(path)
    tds = Dataset(path, "tfrecord").to_torch()
    # Two ranks, nothing said about hosts: one host, whose ranks share the FIFO.
    assert isinstance(tds.plan(epoch=0, rank=1, world_size=2)._feed, SharedStreamFeed)
    channel = streamio.PipeChannel(str(tmp_path / "train"))
    with pytest.raises(UsageError, match="single stream on each host"):
        Dataset(channel, "tfrecord").to_torch().plan(epoch=0, rank=1, world_size=2,
                                                    local_rank=0, local_world_size=1)
    # one reader in all: fine
    Dataset(path, "tfrecord").to_torch().plan(epoch=0)


def test_rank_and_world_size_from_the_torchrun_environment(parts, monkeypatch):
    ds = Dataset(parts, "tfrecord", decoder=DECODER).batch(16)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from_env = ids_of(ds.to_torch())
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    rank0 = ids_of(ds.to_torch(rank=0, world_size=2))
    assert sorted(from_env + rank0) == list(range(200))
    assert set(from_env).isdisjoint(rank0) and from_env and rank0


def test_bad_arguments_fail_at_construction(parts):
    ds = Dataset(parts, "tfrecord")
    with pytest.raises(ValueError):
        ds.to_torch(rank=1)
    with pytest.raises(ValueError):
        ds.to_torch(rank=2, world_size=2)
    with pytest.raises(TypeError):
        to_torch([b"not a dataset"])
    with pytest.raises(ValueError):
        ds.to_torch().set_epoch(-1)
    with pytest.raises(TypeError):
        ds.to_torch(pinned=True)


def test_pin_memory_without_cuda_is_ignored(parts):
    batches = list(Dataset(parts, "tfrecord", decoder=DECODER).batch(50).to_torch(pin_memory=True))
    assert sorted(ids_of(batches)) == list(range(200))
    if not torch.cuda.is_available():
        assert not batches[0]["x"].is_pinned()


# -- DataLoader workers (fresh interpreter) -----------------------------------------------------
@pytest.fixture(scope="module")
def loader_report(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("loader")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "torch_loader_check.py"), str(workdir)],
                          capture_output=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("config", ["0", "2", "2p", "3", "3p", "2pspawn"])
def test_workers_deliver_every_record_once_per_epoch(loader_report, config):
    """num_workers 0, 2, 3 (p: persistent_workers=True; spawn: spawned, not forked, workers)
    over six files of uneven length."""
    everything = loader_report["all_ids"]
    first, second, replay = loader_report["workers"][config]["epochs"]
    for epoch in (first, second, replay):
        assert sorted(epoch) == everything  # each record exactly once
    assert first != second  # the epoch advanced in the workers too: a new shuffle order
    assert replay == first  # set_epoch(0) replays epoch 0
    assert loader_report["workers"][config]["next_epoch"] == 1


def test_one_file_is_shared_round_robin_between_workers(loader_report):
    assert sorted(loader_report["round_robin"]) == loader_report["all_ids"]


def test_one_fifo_is_shared_by_two_workers(loader_report):
    assert sorted(loader_report["fifo_shared"]) == loader_report["all_ids"]


@pytest.mark.parametrize("key", ["pipe_channel", "pipe_channel_persistent"])
def test_pipe_channel_worker_reads_the_next_fifo_each_epoch(loader_report, key):
    first, second = loader_report[key]
    assert sorted(first) == sorted(second) == loader_report["all_ids"]
    assert first != second


@pytest.mark.parametrize("workers", ["2", "0"])
def test_dataset_stats_count_what_the_workers_read(loader_report, workers):
    stats = loader_report["stats"][workers]
    assert stats["records"] == stats["records_read"] == 200
    # Batches run across files: one reader makes 25; two workers (files 0, 2, 4: 79 records,
    # and 1, 3, 5: 121) make 10 + 16.
    assert stats["batches"] == {"2": 26, "0": 25}[workers]
    assert stats["bytes"] == loader_report["stats"]["file_bytes"]
    assert stats["sources_opened"] == 6
    assert stats["first_batch_s"] is not None and stats["first_batch_s"] >= 0
    assert stats["source_wait_s"] > 0 and stats["finished"] is True


def test_a_failed_epoch_leaves_nothing_behind(tmp_path):
    """A worker's CorruptRecordError ends epoch 1; epoch 2 runs. torch re-raised the error from
    a local variable (a reference cycle through the traceback) unless the type takes
    message=, so the failed epoch's DataLoader iterator outlived it: its workers lived on, and
    the next epoch's forked workers finalised it ("Exception ignored in
    _MultiProcessingDataLoaderIter.__del__ ... AssertionError: can only test a child
    process")."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "torch_failed_epoch.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result == {"first": "CorruptRecordError", "children_after_failure": 0,
                      "second": True, "children_at_end": 0}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataloader_over_the_dataset_itself_says_call_to_torch(parts, num_workers):
    code = ("import sys, torch, streamio\n"
            "loader = torch.utils.data.DataLoader(streamio.Dataset(sys.argv[1:], 'tfrecord')"
            f".batch(4), num_workers={num_workers})\n"
            "try:\n    next(iter(loader))\n"
            "except TypeError as exc:\n    print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, *parts], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("UsageTypeError") and "call ds.to_torch()" in proc.stdout
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_torch_path_never_imports_tensorflow(loader_report):
    assert loader_report["tensorflow_imported"] is False


def test_missing_torch_names_the_pip_install():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from streamio.errors import MissingDependencyError\n"
            "from streamio.pipeline import Dataset\n"
            "try:\n    Dataset(b'', 'tfrecord').to_torch()\n"
            "except MissingDependencyError as e:\n    print('A', e)\n"
            "try:\n    import streamio.torch\n"
            "except MissingDependencyError as e:\n    print('B', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=SUBPROCESS_TIMEOUT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line[0] for line in lines] == ["A", "B"]
    assert all("pip install" in line and "torch" in line for line in lines)
    assert issubclass(MissingDependencyError, ImportError)


# -- ranks: torchrun ----------------------------------------------------------------------------
def test_torchrun_two_ranks_two_workers_equal_batches(tmp_path):
    """2 ranks (gloo, CPU) x 2 DataLoader workers, DDP backward every step."""
    for layout, sizes, first in (("even", [20] * 8, 0),
                                 ("uneven", [5, 40, 7, 33, 12, 3, 26, 50], 1000),
                                 ("lopsided", [10, 10, 0, 0], 2000)):
        os.makedirs(tmp_path / layout)
        write_id_parts(str(tmp_path / layout), sizes, first=first)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(SCRIPTS / "ddp_check.py"), str(tmp_path),
                           str(out)], capture_output=True, timeout=SUBPROCESS_TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]

    def run(name):
        return [r[name]["ids"] for r in ranks], [r[name]["batches"] for r in ranks]

    # Shares that split evenly: every record exactly once, equal batch counts.
    ids, batches = run("even-drop")
    assert sorted(ids[0] + ids[1]) == list(range(160))
    assert batches[0] == batches[1] == 8
    # Uneven shares: without a policy the ranks would disagree (and DDP would hang) ...
    everything = list(range(1000, 1176))
    ids, batches = run("uneven-None")
    assert sorted(ids[0] + ids[1]) == everything and batches[0] != batches[1]
    short, long_ = min(batches), max(batches)
    # ... "drop": every rank stops with the shortest; no record twice.
    ids, batches = run("uneven-drop")
    assert batches == [short, short]
    seen = ids[0] + ids[1]
    assert len(seen) == len(set(seen)) and set(seen) <= set(everything)
    # ... "pad": every rank goes on to the longest, repeating batches; every record at least once.
    ids, batches = run("uneven-pad")
    assert batches == [long_, long_]
    assert set(ids[0] + ids[1]) == set(everything)
    # A rank with no batch at all cannot pad: both ranks raise (neither hangs).
    assert ["nothing to repeat" in r["lopsided-pad"].get("error", "") for r in ranks] == [True] * 2


def test_even_batches_without_a_process_group_passes_through():
    batches = [{"a": torch.ones(2)}, {"a": torch.zeros(2)}]
    assert list(even_batches(batches, "pad")) == batches
    with pytest.raises(ValueError):
        list(even_batches(batches, "repeat"))


# -- to_device ------------------------------------------------------------------------------------
def test_to_device_on_cpu_passes_batches_through_every_epoch(parts):
    loader = torch.utils.data.DataLoader(
        Dataset(parts, "tfrecord", decoder=DECODER).batch(32).to_torch(), batch_size=None)
    moved = to_device(loader, "cpu")
    for _ in range(2):  # re-iterable: one pass per epoch
        got = list(moved)
        assert sorted(ids_of(got)) == list(range(200))
        assert all(b["x"].device.type == "cpu" for b in got)
    assert moved.batches_yielded == 2 * 7 and moved.wait_s > 0


def test_to_device_checks_its_arguments():
    with pytest.raises(ValueError):
        to_device([], "cpu", depth=0)
    with pytest.raises(ValueError):
        to_device([], "cpu", even_batches="sometimes")
    with pytest.raises(ValueError):
        to_device([], "no-such-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            to_device([], "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_to_device_cuda_overlaps_copies_and_keeps_values(parts):
    ds = Dataset(parts, "tfrecord", decoder=DECODER).batch(16)
    expected = list(ds.to_torch())
    for depth in (1, 2, 4):
        got = []
        for batch in to_device(torch.utils.data.DataLoader(ds.to_torch(), batch_size=None),
                               "cuda", depth=depth):
            assert batch["x"].is_cuda and batch["id"].is_cuda
            # compute on the current stream right away: must see this batch's copied values
            got.append({k: (v * 1).cpu() for k, v in batch.items()})
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert torch.equal(a["x"], b["x"]) and torch.equal(a["id"], b["id"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_to_device_cuda_moves_sparse_and_leaves_lists():
    dense = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    batch = {"s": dense.to_sparse_csr(), "names": [b"a", b"b"]}
    (moved,) = list(to_device([batch], "cuda"))
    assert moved["s"].layout == torch.sparse_csr and moved["s"].is_cuda
    assert torch.equal(moved["s"].to_dense().cpu(), dense)
    assert moved["names"] == [b"a", b"b"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pin_memory_pins_with_cuda(parts):
    batch = next(iter(Dataset(parts, "tfrecord", decoder=DECODER).batch(50)
                      .to_torch(pin_memory=True)))
    assert batch["x"].is_pinned() and batch["id"].is_pinned()

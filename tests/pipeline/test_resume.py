"""Exact mid-epoch resume (issue #12, part 1): records delivered before a checkpoint plus those
after are exactly one epoch, in the order of the run that was never interrupted.

Real sources: files, gzip files, HTTP from a server on 127.0.0.1, S3 from moto's server on
127.0.0.1, SageMaker-style FIFOs fed by a writer process; torchdata's StatefulDataLoader with
0 and 2 worker processes.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import streamio
from streamio import Dataset
from streamio.decoders import Example, FixedLen, encode_example
from streamio.errors import UsageError
from streamio.pipeline.resume import seal

from hostile_http import HostileHTTPServer
from support.clean_workers import context_for

# Notices from the libraries under test, not from streamio: torchdata calls a deprecated torch
# API, and torch.distributed.checkpoint says it runs in a single process (as the test means).
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

N_FILES = 3
PER_FILE = 150  # records per source; ids are 1000 * source + index
# The fixtures are module-scoped (built once), which Hypothesis cannot tell.
_MODULE_FIXTURE = [HealthCheck.function_scoped_fixture]
ALL_IDS = sorted(1000 * k + i for k in range(N_FILES) for i in range(PER_FILE))


def _records(k: int) -> list:
    # Records of unequal sizes, so reader chunks and shuffle blocks split unevenly.
    return [encode_example({"x": [1000 * k + i], "pad": b"p" * (i % 37)}) for i in range(PER_FILE)]


def _decoder() -> Example:
    return Example({"x": FixedLen((), np.int64)})


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same records as plain files, gzip files, HTTP URLs and (if moto is there) S3 URIs."""
    tmp = str(tmp_path_factory.mktemp("resume"))
    out = {"file": [], "gzip": [], "http": []}
    blobs = []
    for k in range(N_FILES):
        plain = os.path.join(tmp, f"part-{k}.tfrecord")
        streamio.write_records(plain, "tfrecord", _records(k))
        gz = os.path.join(tmp, f"part-{k}.tfrecord.gz")
        streamio.write_records(gz, "tfrecord", _records(k), compression="gzip")
        out["file"].append(plain)
        out["gzip"].append(gz)
        blobs.append(open(plain, "rb").read())
    server = HostileHTTPServer().start()
    out["http"] = [server.add(f"/part-{k}.tfrecord", blob) for k, blob in enumerate(blobs)]
    moto = _start_moto(blobs, out)
    try:
        yield out
    finally:
        server.stop()
        if moto is not None:
            moto()


def _start_moto(blobs: list, out: dict):
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:  # CI installs moto[server]; a user without it skips the S3 case only
        return None
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="test",
                      AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    client = boto3.client("s3")
    client.create_bucket(Bucket="resume")
    for k, blob in enumerate(blobs):
        client.put_object(Bucket="resume", Key=f"part-{k}.tfrecord", Body=blob)
    out["s3"] = [f"s3://resume/part-{k}.tfrecord" for k in range(N_FILES)]

    def stop() -> None:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return stop


#: Pipelines: record shuffle + batch + decode + prefetch; batch-level shuffles after decode;
#: skip/take after batching; a byte-bounded batch shuffle (decodes while fast-forwarding); raw
#: records (no decoder).
CHAINS = {
    "shuffle-batch-prefetch": lambda d: d.shuffle(64, seed=1).batch(8).prefetch(3),
    "shuffle_batches": lambda d: d.shuffle(40, seed=2).batch(5).shuffle_batches(6, seed=3)
    .prefetch(),
    "batch-shuffle-skip-take": lambda d: d.batch(6).shuffle(7, seed=4).skip(2).take(60)
    .prefetch(2),
    "skip-take-in-order": lambda d: d.shuffle(30, seed=5).batch(7).skip(3).take(45),
    "bytes-bounded-batch-shuffle": lambda d: d.batch(9).shuffle(5, buffer_bytes=400, seed=6),
    "records": lambda d: d.shuffle(100, seed=7).prefetch(4),
    # map on records and on decoded batches, on threads; a filter that drops some records
    "map-threads": lambda d: d.map(_same_record, num_parallel=2).shuffle(50, seed=8).batch(8)
    .map(_tag_batch, num_parallel=2).prefetch(2),
    "filter-map": lambda d: d.filter(_keep_most).shuffle(40, seed=9).batch(6).map(_tag_batch),
}


def _same_record(record: bytes) -> bytes:
    return bytes(record)


def _tag_batch(batch: dict) -> dict:
    return dict(batch, tag=batch["x"] * 2)


def _keep_most(record: bytes) -> bool:
    return len(record) % 5 != 2


def _dataset(paths: list, chain: str, decoded: bool = True) -> streamio.Dataset:
    base = streamio.Dataset(paths, "tfrecord", decoder=_decoder() if decoded else None)
    return CHAINS[chain](base)


def _ids(item) -> list:
    """The record ids in an item (a decoded batch or example, or one record)."""
    if isinstance(item, dict):
        return np.atleast_1d(item["x"]).tolist()
    return _decoder().decode_batch([item])["x"].tolist()


def _epoch(ds, epoch: int) -> list:
    return [_ids(item) for item in ds.with_context(epoch=epoch)]


@settings(max_examples=40, deadline=None, suppress_health_check=_MODULE_FIXTURE)
@given(kind=st.sampled_from(["file", "gzip", "http", "s3"]), chain=st.sampled_from(sorted(CHAINS)),
       epoch=st.integers(0, 3), where=st.floats(0, 1))
def test_resume_gives_exactly_the_rest_of_the_epoch_in_order(sources, kind, chain, epoch, where):
    if kind not in sources:
        pytest.skip("moto[server] is not installed")
    ds = _dataset(sources[kind], chain).with_context(epoch=epoch)
    full = _epoch(ds, epoch)
    cut = round(where * len(full))  # items (records, or batches) delivered before the checkpoint
    it = iter(ds)
    before = [_ids(next(it)) for _ in range(cut)]
    state = json.loads(json.dumps(it.state_dict()))  # what a checkpoint file holds
    it.close()
    # A new process would build the Dataset again: a fresh object, nothing shared.
    again = _dataset(sources[kind], chain).with_context(epoch=epoch)
    after = [_ids(item) for item in again.iter_from(state)]
    assert before + after == full  # determinism: the same batches, in the same order
    delivered = Counter(i for batch in before + after for i in batch)
    if chain in ("batch-shuffle-skip-take", "skip-take-in-order", "filter-map"):
        # skip/take/filter: a part of the epoch, still no repeats
        assert max(delivered.values()) == 1
    else:
        assert sorted(delivered.elements()) == ALL_IDS  # exactly one epoch: none lost or twice


@settings(max_examples=15, deadline=None, suppress_health_check=_MODULE_FIXTURE)
@given(cuts=st.lists(st.floats(0, 1), min_size=2, max_size=4))
def test_resuming_a_resumed_epoch_again(sources, cuts):
    ds = _dataset(sources["gzip"], "shuffle_batches").with_context(epoch=1)
    full = _epoch(ds, 1)
    got: list = []
    it = iter(ds)
    for where in sorted(cuts):
        while len(got) < round(where * len(full)):
            got.append(_ids(next(it)))
        state = it.state_dict()
        it.close()
        it = ds.iter_from(state)
    got.extend(_ids(item) for item in it)
    assert got == full


def test_seeds_come_from_the_state(sources):
    """A Dataset built with seed=None draws new seeds in each process; the state carries the
    ones the interrupted epoch used."""
    first = streamio.Dataset(sources["file"], "tfrecord", decoder=_decoder()).shuffle(50).batch(4)
    full = _epoch(first, 0)
    it = iter(first.with_context(epoch=0))
    before = [_ids(next(it)) for _ in range(10)]
    state = it.state_dict()
    second = streamio.Dataset(sources["file"], "tfrecord", decoder=_decoder()).shuffle(50).batch(4)
    assert _epoch(second, 0) != full  # another seed: another order...
    assert before + [_ids(b) for b in second.with_context(epoch=0).iter_from(state)] == full


def test_epochs_count_on_after_a_resume_and_load_state_dict_is_the_same(sources):
    make = lambda: _dataset(sources["file"], "shuffle-batch-prefetch")  # noqa: E731
    reference = make()
    epochs = [[_ids(b) for b in reference] for _ in range(3)]  # epochs 0, 1, 2
    ds = make()
    list(iter(ds))
    it = iter(ds)  # epoch 1
    before = [_ids(next(it)) for _ in range(5)]
    state = it.state_dict()
    assert state["epoch"] == 1
    resumed = make()
    resumed.load_state_dict(state)
    assert before + [_ids(b) for b in resumed] == epochs[1]
    assert [_ids(b) for b in resumed] == epochs[2]  # the next iter() is epoch 2


def test_a_finished_epoch_resumes_empty(sources):
    ds = _dataset(sources["file"], "records").with_context(epoch=0)
    it = iter(ds)
    list(it)
    state = it.state_dict()
    assert state["finished"] and state["delivered"] == len(ALL_IDS)
    assert list(ds.iter_from(state)) == []


class _RecordingExample(Example):
    """Notes the ids of the records it decodes (one list shared by the per-epoch copies)."""

    seen: list = []

    def decode_batch(self, records, **kwargs):
        out = super().decode_batch(records, **kwargs)
        self.seen.extend(out["x"].tolist())
        return out

    def fresh(self):
        return self


@pytest.mark.parametrize("chain", ["shuffle-batch-prefetch", "shuffle_batches",
                                   "batch-shuffle-skip-take"])
def test_skipped_batches_are_not_decoded(sources, chain):
    decoder = _RecordingExample({"x": FixedLen((), np.int64)})
    ds = CHAINS[chain](streamio.Dataset(sources["gzip"], "tfrecord", decoder=decoder))
    ds = ds.with_context(epoch=0)
    full = _epoch(ds, 0)
    it = iter(ds)
    before = [_ids(next(it)) for _ in range(len(full) // 2)]
    state = it.state_dict()
    it.close()
    decoder.seen.clear()
    after = [_ids(b) for b in ds.iter_from(state)]
    assert before + after == full
    # Fast-forward frames and shuffles the delivered records again but decodes none of them.
    assert not set(decoder.seen) & {i for batch in before for i in batch}
    assert {i for batch in after for i in batch} <= set(decoder.seen)


def test_a_state_from_another_pipeline_is_refused(sources):
    ds = _dataset(sources["file"], "shuffle-batch-prefetch")
    it = iter(ds)
    next(it)
    state = it.state_dict()
    other = streamio.Dataset(sources["file"], "tfrecord", decoder=_decoder()).shuffle(64, seed=1)
    with pytest.raises(UsageError, match="different pipeline"):
        other.batch(9).prefetch(3).iter_from(state)
    with pytest.raises(UsageError, match="another shard's"):
        ds.shard(2, 1).iter_from(state)
    with pytest.raises(UsageError, match="not a streamio resume state"):
        ds.iter_from({"epoch": 0})


def test_a_stage_that_does_not_declare_its_order_cannot_resume(sources):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class _Opaque:  # a stage type added later that says nothing about determinism
        n: int

    ds = _dataset(sources["file"], "records")
    it = iter(ds)
    next(it)
    state = it.state_dict()
    opaque = ds._with_stage(_Opaque(3))
    state = seal(dict(state, seeds=state["seeds"] + [None]))
    with pytest.raises(UsageError, match="cannot resume mid-epoch through"):
        opaque.iter_from(state)


def test_pipe_channel_resumes_in_a_restarted_job(tmp_path, fifo):
    """A restarted SageMaker job gets fresh FIFOs starting at _0, replaying the same bytes: the
    resumed epoch keeps its number (and so its shuffle order) and skips what was delivered."""
    streamio.write_records(str(tmp_path / "ref.tfrecord"), "tfrecord",
                           [r for k in range(N_FILES) for r in _records(k)])
    reference = _dataset([str(tmp_path / "ref.tfrecord")], "shuffle-batch-prefetch")
    reference_full = _epoch(reference, 1)

    job1 = tmp_path / "job1"
    job1.mkdir()
    for e in range(2):
        fifo.start(_mkfifo(job1 / f"train_{e}"), str(tmp_path / "ref.tfrecord"))
    ds1 = CHAINS["shuffle-batch-prefetch"](streamio.Dataset(
        streamio.PipeChannel(str(job1 / "train"), open_timeout=30), "tfrecord",
        decoder=_decoder()))
    list(iter(ds1))  # epoch 0, all of it
    it = iter(ds1)  # epoch 1, interrupted
    before = [_ids(next(it)) for _ in range(20)]
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert state["epoch"] == 1

    # The restarted job: the same channel path, fresh FIFOs from _0 replaying the same data.
    for e in range(2):
        os.unlink(job1 / f"train_{e}")
    fifo.start(_mkfifo(job1 / "train_0"), str(tmp_path / "ref.tfrecord"))
    ds2 = CHAINS["shuffle-batch-prefetch"](streamio.Dataset(
        streamio.PipeChannel(str(job1 / "train"), open_timeout=30), "tfrecord",
        decoder=_decoder()))
    after = [_ids(b) for b in ds2.iter_from(state)]
    assert before + after == reference_full
    assert sorted(i for b in before + after for i in b) == ALL_IDS


def _mkfifo(path) -> str:
    os.mkfifo(path)
    return str(path)


# -- PyTorch: StatefulDataLoader (per-worker state) and torch.distributed.checkpoint --------------
def _torch_epoch(loader) -> list:
    return [batch["x"].tolist() for batch in loader]


@settings(max_examples=10, deadline=None, suppress_health_check=_MODULE_FIXTURE)
@given(num_workers=st.sampled_from([0, 2]), where=st.floats(0, 1),
       chain=st.sampled_from(["shuffle-batch-prefetch", "shuffle_batches"]))
@example(num_workers=0, where=0.0, chain="shuffle-batch-prefetch")
@example(num_workers=2, where=0.0, chain="shuffle-batch-prefetch")
@example(num_workers=0, where=1.0, chain="shuffle_batches")
@example(num_workers=2, where=1.0, chain="shuffle_batches")
def test_stateful_dataloader_resumes_exactly(sources, num_workers, where, chain):
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    make = lambda ds: stateful.StatefulDataLoader(  # noqa: E731
        ds.to_torch(), batch_size=None, num_workers=num_workers,
        multiprocessing_context=context_for(num_workers))
    ds = _dataset(sources["gzip"], chain)
    reference = make(ds)
    epochs = [_torch_epoch(reference) for _ in range(2)]  # epochs 0 and 1, uninterrupted

    loader = make(ds)
    it = iter(loader)
    cut = round(where * len(epochs[0]))
    before = [next(it)["x"].tolist() for _ in range(cut)]
    # Each worker's state comes back with its batches; JSON, as a checkpoint would store it.
    state = json.loads(json.dumps(loader.state_dict()))
    del it

    resumed = make(_dataset(sources["gzip"], chain))
    resumed.load_state_dict(state)
    after = _torch_epoch(resumed)
    assert before + after == epochs[0]
    assert sorted(i for b in before + after for i in b) == ALL_IDS
    assert _torch_epoch(resumed) == epochs[1]  # and the next epoch is epoch 1


def test_stream_dataset_is_a_distributed_checkpoint_stateful(sources, tmp_path):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint.stateful import Stateful

    ds = _dataset(sources["file"], "shuffle_batches")
    full = [b["x"].tolist() for b in ds.to_torch()]
    tds = ds.to_torch()
    assert isinstance(tds, Stateful)
    it = iter(tds)
    before = [next(it)["x"].tolist() for _ in range(7)]
    dcp.save({"data": tds}, checkpoint_id=str(tmp_path / "ckpt"))
    restored = _dataset(sources["file"], "shuffle_batches").to_torch()
    dcp.load({"data": restored}, checkpoint_id=str(tmp_path / "ckpt"))
    assert before + [b["x"].tolist() for b in restored] == full
    del torch


def test_torch_pipe_channel_resumes_in_a_restarted_job(tmp_path, fifo):
    """to_torch over a PipeChannel: the restarted job's first FIFO (_0) carries the resumed
    epoch (its number, so its order, from the state); the next FIFO the next epoch."""
    pytest.importorskip("torch")
    ref = str(tmp_path / "ref.tfrecord")
    streamio.write_records(ref, "tfrecord", [r for k in range(N_FILES) for r in _records(k)])
    reference = _dataset([ref], "shuffle-batch-prefetch")
    epochs = {e: _epoch(reference, e) for e in (1, 2)}
    prefix = tmp_path / "train"

    def channel_ds():
        return CHAINS["shuffle-batch-prefetch"](streamio.Dataset(
            streamio.PipeChannel(str(prefix), open_timeout=30), "tfrecord", decoder=_decoder()))

    for e in range(2):
        fifo.start(_mkfifo(f"{prefix}_{e}"), ref)
    job1 = channel_ds().to_torch()
    list(job1)  # epoch 0 from train_0
    it = iter(job1)  # epoch 1 from train_1, interrupted
    before = [next(it)["x"].tolist() for _ in range(9)]
    state = json.loads(json.dumps(job1.state_dict()))
    del it
    for e in range(2):
        os.unlink(f"{prefix}_{e}")
    for e in range(2):  # the restarted job's FIFOs, from _0 again, the same data
        fifo.start(_mkfifo(f"{prefix}_{e}"), ref)
    job2 = channel_ds().to_torch()
    job2.load_state_dict(state)
    assert before + [b["x"].tolist() for b in job2] == epochs[1]  # from train_0
    assert [b["x"].tolist() for b in job2] == epochs[2]  # from train_1


def _double(record):
    return record + record


def _even_length(record):
    return len(record) % 2 == 0


@pytest.mark.parametrize("num_parallel", [None, 2])
def test_resume_through_map_and_filter(tmp_path, num_parallel):
    path = str(tmp_path / "m.tfrecord")
    records = [b"r%04d" % i + b"x" * (i % 3) for i in range(500)]
    streamio.write_records(path, "tfrecord", records)
    ds = (Dataset(path, "tfrecord").filter(_even_length)
          .map(_double, num_parallel=num_parallel).shuffle(64, seed=3).batch(16))
    whole = [list(b) for b in ds.with_context(epoch=0)]
    for cut in (0, 1, 7, len(whole) - 1):
        it = iter(ds.with_context(epoch=0))
        first = [list(next(it)) for _ in range(cut)]
        state = it.state_dict()
        it.close()
        rest = [list(b) for b in ds.with_context(epoch=0).iter_from(state)]
        assert first + rest == whole


def test_unordered_map_refuses_to_resume(tmp_path):
    path = str(tmp_path / "m.tfrecord")
    streamio.write_records(path, "tfrecord", [b"a", b"b", b"c"])
    ds = Dataset(path, "tfrecord").map(_double, num_parallel=2, ordered=False)
    it = iter(ds)
    next(it)
    with pytest.raises(streamio.UsageError, match="cannot resume"):
        ds.iter_from(it.state_dict())
    it.close()

"""Elastic resume (issue #25): the states of n shards resume on m shards, every record exactly
once over the two runs (and over three, when the resumed epoch is interrupted again).

Real sources: files (whole-file shards and byte-range splits of one file), a gzip file (dealt
round-robin), HTTP from a server on 127.0.0.1. States go through JSON, as a checkpoint would.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import streamio
from streamio.decoders import Example, FixedLen, encode_example
from streamio.errors import UsageError
from streamio.pipeline.resume import seal

from hostile_http import HostileHTTPServer

N_FILES = 3
PER_FILE = 140
ALL_IDS = sorted(1000 * k + i for k in range(N_FILES) for i in range(PER_FILE))
_MODULE_FIXTURE = [HealthCheck.function_scoped_fixture]
pytestmark = [pytest.mark.filterwarnings("ignore:.*is not split by byte range"),
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")]


def _records(k: int) -> list:
    return [encode_example({"x": [1000 * k + i], "pad": b"p" * (i % 29)}) for i in range(PER_FILE)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three files; the same records in one file (split by byte range), in one gzip file
    (compressed: dealt round-robin) and as three HTTP URLs."""
    tmp = str(tmp_path_factory.mktemp("elastic"))
    files, blobs = [], []
    for k in range(N_FILES):
        path = os.path.join(tmp, f"part-{k}.tfrecord")
        streamio.write_records(path, "tfrecord", _records(k))
        files.append(path)
        blobs.append(open(path, "rb").read())
    one = os.path.join(tmp, "all.tfrecord")
    streamio.write_records(one, "tfrecord", [r for k in range(N_FILES) for r in _records(k)])
    gz = os.path.join(tmp, "all.tfrecord.gz")
    streamio.write_records(gz, "tfrecord", [r for k in range(N_FILES) for r in _records(k)],
                           compression="gzip")
    server = HostileHTTPServer().start()
    urls = [server.add(f"/part-{k}.tfrecord", blob) for k, blob in enumerate(blobs)]
    try:
        yield {"files": files, "one file": [one], "gzip": [gz], "http": urls}
    finally:
        server.stop()


def _decoder() -> Example:
    return Example({"x": FixedLen((), np.int64)})


#: Pipelines whose replay skips undecoded (before_decode, lazy) and one that must decode
#: (a map after batch), and raw records.
CHAINS = {
    "shuffle-batch-prefetch": lambda d, b, s: d.shuffle(s, seed=1).batch(b).prefetch(3),
    "batch-shuffles": lambda d, b, s: d.shuffle(s, seed=2).batch(b).shuffle_batches(4, seed=3),
    "batch-map": lambda d, b, s: d.shuffle(s, seed=4).batch(b).map(_tag),
    "records": lambda d, b, s: d.shuffle(s, seed=5).prefetch(),
}


def _tag(batch: dict) -> dict:
    return dict(batch, tag=batch["x"] + 1)


def _ids(item) -> list:
    if isinstance(item, dict):
        return item["x"].tolist()
    return _decoder().decode_batch([item])["x"].tolist()


def _make(paths: list, chain: str, batch: int, buffer: int):
    decoder = None if chain == "records" else _decoder()
    return CHAINS[chain](streamio.Dataset(paths, "tfrecord", decoder=decoder), batch, buffer)


def _shard(ds, n: int, i: int):
    return ds.shard(n, i) if n > 1 else ds


def _interrupt(make, n: int, cuts: list, resume=None) -> tuple:
    """Run n shards, shard i taking cuts[i] items (from `resume` states if given): the record
    ids delivered and each shard's state (through JSON)."""
    got, states = [], []
    for i in range(n):
        ds = _shard(make(), n, i)
        it = iter(ds) if resume is None else ds.iter_from(resume)
        for _ in range(cuts[i]):
            try:
                got += _ids(next(it))
            except StopIteration:
                break
        states.append(json.loads(json.dumps(it.state_dict())))
        it.close()
    return got, states


def _finish(make, m: int, states: list) -> list:
    got = []
    for j in range(m):
        for item in _shard(make(), m, j).iter_from(states):
            got += _ids(item)
    return got


@settings(max_examples=60, deadline=None, suppress_health_check=_MODULE_FIXTURE)
@given(kind=st.sampled_from(["files", "one file", "gzip", "http"]),
       chain=st.sampled_from(sorted(CHAINS)), n=st.integers(1, 5), m=st.integers(1, 5),
       batch=st.integers(1, 9), buffer=st.sampled_from([1, 16, 100, 500]),
       seed=st.integers(0, 2 ** 16))
@example(kind="files", chain="shuffle-batch-prefetch", n=4, m=3, batch=8, buffer=100, seed=0)
@example(kind="one file", chain="batch-shuffles", n=2, m=5, batch=5, buffer=16, seed=1)
@example(kind="gzip", chain="records", n=5, m=1, batch=1, buffer=500, seed=2)
@example(kind="http", chain="batch-map", n=3, m=2, batch=7, buffer=100, seed=3)
def test_n_shards_resume_on_m_shards_exactly_once(sources, kind, chain, n, m, batch, buffer,
                                                  seed):
    rng = random.Random(seed)
    make = lambda: _make(sources[kind], chain, batch, buffer)  # noqa: E731
    before, states = _interrupt(make, n, [rng.randint(0, 40 // batch + 30) for _ in range(n)])
    after = _finish(make, m, states)
    assert sorted(before + after) == ALL_IDS
    # The epochs after it run on the new layout, each whole.
    assert sorted(i for j in range(m) for item in _shard(make(), m, j) for i in _ids(item)) \
        == ALL_IDS


@settings(max_examples=25, deadline=None, suppress_health_check=_MODULE_FIXTURE)
@given(kind=st.sampled_from(["files", "one file", "gzip"]), chain=st.sampled_from(sorted(CHAINS)),
       layouts=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
       seed=st.integers(0, 2 ** 16))
def test_a_resumed_epoch_interrupted_again_resumes_on_a_third_layout(sources, kind, chain,
                                                                     layouts, seed):
    rng = random.Random(seed)
    n, m, k = layouts
    make = lambda: _make(sources[kind], chain, 6, 64)  # noqa: E731
    first, states = _interrupt(make, n, [rng.randint(0, 15) for _ in range(n)])
    second, states2 = _interrupt(make, m, [rng.randint(0, 15) for _ in range(m)], states)
    third = _finish(make, k, states2)
    assert sorted(first + second + third) == ALL_IDS


def test_the_same_layout_resumes_identically_from_the_list(sources):
    """m == n: each shard picks its own state and continues the uninterrupted epoch exactly."""
    make = lambda: _make(sources["files"], "batch-shuffles", 5, 40)  # noqa: E731
    whole = [[_ids(b) for b in make().shard(3, i)] for i in range(3)]
    _, states = _interrupt(make, 3, [2, 0, 7])
    for i in range(3):
        rest = [_ids(b) for b in make().shard(3, i).iter_from(states)]
        assert rest == whole[i][[2, 0, 7][i]:]


def test_an_elastic_epoch_resumes_on_its_own_layout_identically(sources):
    make = lambda: _make(sources["one file"], "shuffle-batch-prefetch", 4, 50)  # noqa: E731
    _, states = _interrupt(make, 4, [3, 9, 0, 5])
    full = [_ids(b) for b in make().shard(3, 1).iter_from(states)]
    it = make().shard(3, 1).iter_from(states)
    head = [_ids(next(it)) for _ in range(6)]
    state = json.loads(json.dumps(it.state_dict()))
    assert head + [_ids(b) for b in make().shard(3, 1).iter_from(state)] == full
    # Also found in a list of every new shard's states (the layout unchanged).
    others = [json.loads(json.dumps(iter(make().shard(3, j).iter_from(states)).state_dict()))
              for j in (0, 2)]
    assert head + [_ids(b) for b in make().shard(3, 1).iter_from([others[0], state, others[1]])] \
        == full


def test_the_state_stays_small(sources):
    """A few hundred bytes per shard, whatever the buffers hold."""
    make = lambda: _make(sources["files"], "shuffle-batch-prefetch", 8, 5000)  # noqa: E731
    _, states = _interrupt(make, 4, [3, 3, 3, 3])
    assert all(len(json.dumps(s)) < 400 for s in states)
    it = make().shard(3, 0).iter_from(states)
    next(it)
    assert len(json.dumps(it.state_dict())) < 4 * 400 + 300


def test_skipped_and_other_shards_batches_are_not_decoded(sources):
    """The replay decodes only this shard's share of the remainder (no map after batch)."""
    seen = []

    class Counting(Example):
        def decode_batch(self, records, **kw):
            out = super().decode_batch(records, **kw)
            seen.extend(out["x"].tolist())
            return out

    def make():
        return streamio.Dataset(sources["files"], "tfrecord",
                                decoder=Counting({"x": FixedLen((), np.int64)})) \
            .shuffle(30, seed=1).batch(6)

    _, states = _interrupt(make, 2, [5, 8])
    seen.clear()
    mine = [i for b in make().shard(3, 1).iter_from(states) for i in _ids(b)]
    assert sorted(seen) == sorted(mine)
    assert 0 < len(mine) < len(ALL_IDS) / 2


def test_lists_that_are_not_every_shard_of_one_run_are_refused(sources):
    make = lambda: _make(sources["files"], "shuffle-batch-prefetch", 8, 50)  # noqa: E731
    _, states = _interrupt(make, 3, [1, 2, 3])
    with pytest.raises(UsageError, match=r"shard\(s\) \[1\] missing"):
        make().iter_from([states[0], states[2], states[0]])
    # the hint gives shard()'s signature, shard(num_shards, index) (issue #41, item 9)
    with pytest.raises(UsageError, match=r"2 states must be the 2 shards of one split \(each"
                                         r" taken by shard\(2, i\) of the same Dataset\)"):
        make().iter_from(states[:2])  # two of a 3-way split
    with pytest.raises(UsageError, match="empty"):
        make().iter_from([])
    later = json.loads(json.dumps(states[1]))
    later["epoch"] = 1
    with pytest.raises(UsageError, match=r"states\[1\]: .*field\(s\) \['epoch'\] do not match"):
        make().iter_from([states[0], later, states[2]])  # edited: its check says so
    later = seal(later)  # as if taken an epoch later
    with pytest.raises(UsageError, match="different epochs"):
        make().iter_from([states[0], later, states[2]])
    with pytest.raises(UsageError, match="needs the same Dataset"):
        make().shard(2, 0).shard(2, 1).iter_from(states)  # not the same split's universe


def test_a_state_that_does_not_fit_its_shard_is_refused(sources):
    make = lambda: _make(sources["files"], "shuffle-batch-prefetch", 8, 50)  # noqa: E731
    _, states = _interrupt(make, 2, [1, 2])
    other = lambda: _make(sources["files"], "shuffle-batch-prefetch", 9, 50)  # noqa: E731
    with pytest.raises(UsageError, match="different pipeline"):
        other().iter_from(states)  # another batch size: the old shards' chains do not match
    swapped = [seal(dict(states[0], place=[0, 1, 0, 1], shards=[[2, 1]])), states[1]]
    with pytest.raises(UsageError):
        make().iter_from(swapped)
    for bad in ({"shards": [[1, 0]]}, {"shards": [[2, 2]]}, {"place": [1, 1, 0, 1]},
                {"elastic": {"from": [], "deal": [1, 0]}}, {"elastic": {"deal": [2, 2]}}):
        with pytest.raises(UsageError):
            make().iter_from([seal(dict(states[0], **bad)), states[1]])


def test_copies_of_a_stream_read_once_are_not_elastic(tmp_path, sources):
    """States of shards that each read their own copy of the data (record-level shards) cannot
    be replayed from one read of a FIFO: refused, naming the old shard layers."""
    make = lambda: _make(sources["files"], "shuffle-batch-prefetch", 8, 50)  # noqa: E731
    _, states = _interrupt(make, 2, [1, 2])
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    pipe = streamio.Dataset([fifo] * 3, "tfrecord", decoder=_decoder()) \
        .shuffle(50, seed=1).batch(8).prefetch(3)
    with pytest.raises(UsageError, match=r"shard layers \[\[2, 0\]\] \(its own copy"):
        pipe.iter_from([dict(s) for s in states])


def test_s3_objects_resume_elastically(monkeypatch):
    """S3 (moto's server on 127.0.0.1): one object split by byte range among 3 shards, resumed
    on 2, and three objects (whole-object shards) on 4 resumed on 1."""
    from support.s3 import moto_endpoint, s3_client

    with moto_endpoint() as endpoint:
        client = s3_client(endpoint, monkeypatch, "elastic")
        blob = b"".join(streamio.formats.encode_tfrecord(r)
                        for k in range(N_FILES) for r in _records(k))
        client.put_object(Bucket="elastic", Key="all.tfrecord", Body=blob)
        for k in range(N_FILES):
            client.put_object(Bucket="elastic", Key=f"part-{k}.tfrecord",
                              Body=b"".join(streamio.formats.encode_tfrecord(r)
                                            for r in _records(k)))
        layouts = [(["s3://elastic/all.tfrecord"], 3, 2),
                   ([f"s3://elastic/part-{k}.tfrecord" for k in range(N_FILES)], 4, 1)]
        for paths, n, m in layouts:
            make = lambda: _make(paths, "shuffle-batch-prefetch", 8, 64)  # noqa: E731
            before, states = _interrupt(make, n, [2, 5, 1, 3][:n])
            assert before
            assert sorted(before + _finish(make, m, states)) == ALL_IDS


def test_a_mix_resumes_elastically(sources):
    """streamio.mix over two inputs (all_exhausted): 2 shards checkpointed, resumed on 3."""
    def make():
        inputs = [streamio.Dataset(sources["files"][:2], "tfrecord").shuffle(50, seed=1),
                  streamio.Dataset(sources["files"][2:], "tfrecord")]
        return streamio.mix(inputs, [0.7, 0.3], seed=5, stop="all_exhausted").batch(6)

    def ids(batch):
        return [i for record in batch for i in _ids(record)]

    got, states = [], []
    for i in range(2):
        it = iter(make().shard(2, i))
        for _ in range(7 + 5 * i):
            got += ids(next(it))
        states.append(json.loads(json.dumps(it.state_dict())))
    for j in range(3):
        got += [i for batch in make().shard(3, j).iter_from(states) for i in ids(batch)]
    assert sorted(got) == ALL_IDS


def test_an_epoch_served_from_a_cache_resumes_elastically(sources, tmp_path):
    """Epoch 1 of 2 shards is served from their directory caches; resumed on 3 shards (each
    replays the old shards' cached epochs), every record once."""
    def make():
        return (streamio.Dataset(sources["files"], "tfrecord", decoder=_decoder())
                .batch(8).cache(str(tmp_path / "cache")).shuffle_batches(4, seed=2))

    got, states = [], []
    for i in range(2):
        ds = make().shard(2, i)
        list(ds)  # epoch 0 fills this shard's cache
        it = iter(ds)  # epoch 1, from the cache
        for _ in range(3 + 4 * i):
            got += _ids(next(it))
        states.append(json.loads(json.dumps(it.state_dict())))
        it.close()
    assert {s["epoch"] for s in states} == {1}
    for j in range(3):
        got += [i for b in make().shard(3, j).iter_from(states) for i in _ids(b)]
    assert sorted(got) == ALL_IDS

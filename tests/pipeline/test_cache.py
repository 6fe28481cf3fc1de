"""Dataset.cache() (issue #25, "Cache"): the first complete epoch fills the cache, later epochs
are served from it without reading the sources.

Real parts: FIFOs of a Pipe-mode channel fed by a writer process (whose later FIFOs never come),
an HTTP server on 127.0.0.1 counting requests, a tmpfs that fills up (in a private mount
namespace), DataLoader worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest

import streamio
from streamio import Dataset
from streamio.decoders import Csv, Example, FixedLen, encode_example
from streamio.errors import CorruptRecordError, SourceError, StreamioWarning, UsageError
from streamio.pipeline import cache as C
from streamio.pipeline.resume import plan_fast_forward

from conftest import SCRIPTS
from hostile_http import HostileHTTPServer
from support.clean_workers import CONTEXT

N_FILES = 2
PER_FILE = 300  # ids are 1000 * source + index
ALL_IDS = sorted(1000 * k + i for k in range(N_FILES) for i in range(PER_FILE))


def _records(k: int) -> list:
    return [encode_example({"x": [1000 * k + i], "b": b"p" * (i % 23)}) for i in range(PER_FILE)]


def _decoder() -> Example:
    return Example({"x": FixedLen((), np.int64), "b": FixedLen((), "bytes")})


@pytest.fixture
def server():
    with HostileHTTPServer() as srv:
        yield srv


def _urls(server) -> list:
    return [server.add(f"/part-{k}.tfrecord", b"".join(
        streamio.formats.encode_tfrecord(r) for r in _records(k))) for k in range(N_FILES)]


def _gets(server) -> int:
    """Reads of the objects; a directory cache's checks (one-byte ``Range: bytes=0-0``
    requests for the ETag, :mod:`streamio.pipeline.cache.sources`) are counted by ``_checks``."""
    return len(server.requests) - _checks(server)


def _checks(server) -> int:
    return sum(1 for _, headers in server.requests if headers.get("Range") == "bytes=0-0")


# The chains under test: a cache of records (decoded after it) and a cache of decoded batches;
# each with a stage after it that differs per epoch.
CHAINS = {
    "records": lambda ds, c: c(ds).batch(16).shuffle_batches(4, seed=3),
    "batches": lambda ds, c: c(ds.batch(16)).shuffle_batches(4, seed=3),
}


def _ids(item) -> list:
    return item["x"].tolist()


def _epoch(ds) -> list:
    return [_ids(b) for b in ds]


def _nothing_in(directory) -> bool:
    return not os.path.exists(directory) or os.listdir(directory) == []


def _where(tmp_path, kind: str):
    return None if kind == "memory" else str(tmp_path / "cache")


# -- the sources are read once ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["memory", "directory"])
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_http_source_is_fetched_once_in_three_epochs(server, tmp_path, kind, chain):
    urls = _urls(server)
    where = _where(tmp_path, kind)
    cached = CHAINS[chain](Dataset(urls, "tfrecord", decoder=_decoder()),
                           lambda d: d.cache(where))
    # The same chain with an order-keeping stage in the cache's place (seeds derive from the
    # stages' positions): what each epoch must be.
    plain = CHAINS[chain](Dataset(urls, "tfrecord", decoder=_decoder()), lambda d: d.prefetch(1))
    epochs = [_epoch(cached) for _ in range(3)]
    assert _gets(server) == N_FILES  # one GET per source, in all three epochs
    assert epochs == [_epoch(plain.with_context(epoch=e)) for e in range(3)]
    assert epochs[1] != epochs[2]  # the stage after the cache runs anew, with the epoch's number
    assert cached.stats()["bytes"] == 0  # a cached epoch reads nothing


@pytest.mark.parametrize("kind", ["memory", "directory"])
def test_pipe_channel_trains_later_epochs_from_the_cache(tmp_path, fifo, kind):
    """Only the first FIFO ever comes: later epochs must not open the channel (nor start the
    prefetch thread before the cache, which would)."""
    ref = tmp_path / "ref.tfrecord"
    streamio.write_records(str(ref), "tfrecord", [r for k in range(N_FILES) for r in _records(k)])
    os.mkfifo(tmp_path / "train_0")
    fifo.start(str(tmp_path / "train_0"), str(ref))
    channel = streamio.PipeChannel(str(tmp_path / "train"), open_timeout=20)
    ds = (Dataset(channel, "tfrecord", decoder=_decoder()).batch(16).prefetch(2)
          .cache(_where(tmp_path, kind)).shuffle_batches(4, seed=1))
    epochs = [_epoch(ds) for _ in range(3)]
    for items in epochs:
        assert sorted(i for b in items for i in b) == ALL_IDS
    assert epochs[1] != epochs[2]
    assert channel.epoch == 1  # the channel was opened once: train_1 was never asked for


def test_a_complete_cache_never_builds_its_upstream(tmp_path):
    """Nothing before a complete cache runs: a map before it is not called again."""
    calls = []
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    ds = Dataset(data, "tfrecord").map(lambda r: calls.append(1) or r).cache()
    assert len(list(ds)) == PER_FILE and len(calls) == PER_FILE
    assert len(list(ds)) == PER_FILE and len(calls) == PER_FILE


# -- an interrupted fill leaves nothing ------------------------------------------------------------
def test_interrupted_filling_epoch_leaves_nothing_and_the_next_epoch_fills(server, tmp_path):
    urls = _urls(server)
    directory = tmp_path / "cache"
    ds = Dataset(urls, "tfrecord", decoder=_decoder()).batch(16).cache(str(directory))
    it = iter(ds)
    for _ in range(3):
        next(it)
    temps = os.listdir(directory)
    # Filling: one temp file, made by mkstemp in the directory itself (0600), not trusted yet.
    assert len(temps) == 1 and temps[0].startswith(".streamio-cache-")
    assert stat.S_IMODE(os.stat(directory / temps[0]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    it.close()
    assert os.listdir(directory) == []  # nothing a later epoch could trust
    gets = _gets(server)
    assert sorted(i for b in _epoch(ds) for i in b) == ALL_IDS  # epoch 1 reads the source again
    assert _gets(server) == gets + N_FILES
    (final,) = os.listdir(directory)
    assert final.startswith("streamio-cache-") and final.endswith(".bin")
    assert sorted(i for b in _epoch(ds) for i in b) == ALL_IDS  # epoch 2: from the file
    assert _gets(server) == gets + N_FILES


def test_a_cache_that_epochs_stop_before_filling_says_so_once(tmp_path):
    """``.cache().take(n)`` (or a loop that breaks early) never completes the cache, so every
    epoch reads the sources again: silently, that defeats the cache. The first early stop says
    so with a StreamioWarning naming the cache; later ones do not repeat it; a complete epoch
    says nothing."""
    source = tmp_path / "train.tfrecord"
    streamio.write_records(str(source), "tfrecord", _records(0))
    taken = Dataset(str(source), "tfrecord").cache(str(tmp_path / "c1")).take(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [len(list(taken)) for _ in range(3)] == [5, 5, 5]
    said = [str(w.message) for w in caught if issubclass(w.category, StreamioWarning)]
    assert len(said) == 1, said
    assert said[0].startswith(f".cache({str(tmp_path / 'c1')!r}) was not filled")
    assert "take()" in said[0] and "reads the sources again" in said[0]
    assert os.listdir(tmp_path / "c1") == []
    whole = Dataset(str(source), "tfrecord").cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(whole)) == len(list(whole)) == len(_records(0))


def test_an_epoch_that_fails_while_filling_leaves_nothing(tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    directory = tmp_path / "cache"
    state = {"fail": True, "calls": 0}

    def flaky(record):
        state["calls"] += 1
        if state["fail"] and state["calls"] > 200:  # after blocks went to the temp file
            raise RuntimeError("boom")
        return record

    ds = Dataset(data, "tfrecord").map(flaky).cache(str(directory))
    got = []
    with pytest.raises(streamio.MapError):
        got.extend(ds)
    assert len(got) >= 64 and os.path.isdir(directory)  # the fill had begun
    assert _nothing_in(directory)
    state["fail"] = False
    assert len(list(ds)) == PER_FILE
    assert len(os.listdir(directory)) == 1


# -- the digest: a cache belongs to one pipeline, one place -----------------------------------------
def test_a_cache_of_another_pipeline_is_refused(tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    directory = str(tmp_path / "cache")
    base = Dataset(data, "tfrecord", decoder=_decoder())
    list(base.batch(16).cache(directory))
    for other in (base.batch(8), base.shuffle(10, seed=1).batch(16),
                  Dataset(data, "tfrecord", decoder=Example({"x": FixedLen((), np.int64)}))
                  .batch(16)):
        with pytest.raises(UsageError, match=f"cache directory {directory} holds the cache of"
                                             " another pipeline"):
            list(other.cache(directory))
    # The same pipeline in a new object uses it; each shard has its own file.
    assert sorted(i for b in base.batch(16).cache(directory) for i in _ids(b)) == ALL_IDS[:PER_FILE]
    shards = [base.batch(16).cache(str(tmp_path / "sharded")).shard(2, j) for j in range(2)]
    got = sorted(i for s in shards for b in s for i in _ids(b))
    assert got == ALL_IDS[:PER_FILE]
    assert len(os.listdir(tmp_path / "sharded")) == 2


def test_the_digest_has_the_place_but_not_the_epoch():
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    ds = Dataset(data, "tfrecord").shuffle(10, seed=1).cache()
    digest = lambda d: C.cache_digest(d, 1)  # noqa: E731
    assert digest(ds) == digest(ds.with_context(epoch=5))
    assert digest(ds) != digest(ds.with_context(rank=1, world_size=2))
    assert digest(ds) != digest(ds.with_context(worker=1, num_workers=2))
    assert digest(ds)[0] != digest(Dataset(data, "tfrecord").shuffle(10, seed=2).cache())[0]


# -- cache files are input ------------------------------------------------------------------------
def _filled(tmp_path, batch=16):
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    directory = tmp_path / "cache"
    ds = Dataset(data, "tfrecord", decoder=_decoder()).batch(batch).cache(str(directory))
    reference = _epoch(ds)
    (name,) = os.listdir(directory)
    return ds, reference, directory / name


def test_a_changed_block_is_an_error_naming_the_file_not_wrong_data(tmp_path):
    ds, reference, path = _filled(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit, inside some block
    path.write_bytes(bytes(raw))
    got = []
    with pytest.raises(CorruptRecordError, match="SHA-256 mismatch") as info:
        for batch in ds:
            got.append(_ids(batch))
    assert str(path) in str(info.value)
    assert got == reference[:len(got)]  # what came before the bad block is right; nothing after


def test_a_truncated_or_foreign_file_is_an_error(tmp_path):
    ds, _, path = _filled(tmp_path)
    raw = path.read_bytes()
    for bad in (raw[:-7], raw[:40], b"", b"\x80\x04\x95" + b"cos\nsystem\n(S'id'\ntR." * 9):
        path.write_bytes(bad)
        with pytest.raises(CorruptRecordError) as info:
            list(ds)
        assert str(path) in str(info.value)


def test_lengths_are_checked_before_anything_is_allocated():
    kind, chunks = C.encode_block([b"abc", b"de"], None)
    payload = bytearray(b"".join(bytes(c) for c in chunks))
    payload[1:9] = (1 << 60).to_bytes(8, "little")  # n: a huge item count
    with pytest.raises(CorruptRecordError, match="announced"):
        C.decode_block(kind, payload)
    head = C._BLOCK.pack(C._BLOCK_MAGIC, kind, 1 << 62, bytes(32))
    with pytest.raises(CorruptRecordError, match="left"):
        C.parse_block_header(head, 100, "f", 0)


def test_cache_files_are_never_opened_through_a_symlink_nor_others_files(tmp_path):
    ds, reference, path = _filled(tmp_path)
    os.chmod(path, 0o666)
    with pytest.raises(UsageError, match="others may write it"):
        list(ds)
    os.chmod(path, 0o600)
    target = tmp_path / "elsewhere.bin"
    os.rename(path, target)
    os.symlink(target, path)
    with pytest.raises(UsageError, match="symbolic link"):
        list(ds)
    os.unlink(path)
    os.rename(target, path)
    assert _epoch(ds) == reference


def test_items_a_file_cache_cannot_hold_are_a_usage_error(tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    ds = Dataset(data, "tfrecord", decoder=_decoder()).batch(16)
    objects = ds.map(lambda b: {"o": np.array([{"a": 1}] * len(b["x"]), dtype=object)})
    with pytest.raises(UsageError, match="field 'o' holds dict objects"):
        list(objects.cache(str(tmp_path / "c1")))
    with pytest.raises(UsageError, match="an item is a tuple"):
        list(ds.map(lambda b: (b["x"], b["b"])).cache(str(tmp_path / "c2")))
    assert _nothing_in(tmp_path / "c2")
    # bytes and str objects, sparse batches and every numeric dtype round-trip
    sparse = streamio.SparseBatch(np.array([0, 1, 3]), np.array([0, 0, 2]),
                                  np.array([1.5, 2, 3], np.float32), (2, 4))
    batch = {"b": np.array([b"x", b""], dtype=object), "s": np.array(["\u00e9", "t"], object),
             "f": np.arange(6, dtype=">f8").reshape(2, 3), "t": np.array([True, False]),
             "d": np.array(["2020-01-01", "2021-02-03"], "M8[D]"), "sp": sparse,
             "u": np.array(["ab", "c"]), "e": np.zeros((2, 0), np.int16)}
    kind, chunks = C.encode_block([batch, batch], None)
    items, ids = C.decode_block(kind, bytearray(b"".join(bytes(c) for c in chunks)))
    assert ids is None and len(items) == 2
    for name, value in batch.items():
        if name == "sp":
            assert items[1][name] == value
        else:
            assert items[1][name].dtype == value.dtype and items[1][name].tolist() == value.tolist()


def test_a_csv_header_and_record_origins_come_back_from_the_cache(tmp_path):
    rows = b"a,b\n" + b"".join(b"%d,%d\n" % (i, 2 * i) for i in range(50)) + b"x,1\n"
    path = tmp_path / "t.csv"
    path.write_bytes(rows)
    for where in (None, str(tmp_path / "cache")):
        ds = Dataset(str(path), "csv", decoder=Csv(header=True, as_columns=True)).cache(where).batch(10)
        for _ in range(2):  # filling, then cached: the header and the bad row's place survive
            it = iter(ds)
            assert [b["a"].tolist() for b in (next(it) for _ in range(5))][0][:2] == [0, 1]
            with pytest.raises(streamio.DecodeError) as info:
                next(it)
            assert info.value.record_index == 51 and str(path) in str(info.value)


# -- the disk fills ---------------------------------------------------------------------------------
def _private_mounts() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def test_a_full_disk_is_a_clear_error_and_leaves_no_file(tmp_path):
    if not _private_mounts():
        pytest.skip("needs `unshare --mount` (root, or user namespaces) to mount a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    script = SCRIPTS / "cache_disk_full.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SCRIPTS.parent.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])}
    cmd = (f"mount -t tmpfs -o size=256k tmpfs {mount} && exec {sys.executable} {script}"
           f" {mount}/cache")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "full-disk: ok" in out.stdout


# -- memory -----------------------------------------------------------------------------------------
def test_memory_is_bounded_by_max_bytes(tmp_path):
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    ds = Dataset(data, "tfrecord", decoder=_decoder()).batch(16)
    with pytest.raises(UsageError, match=r"max_bytes=4096 bytes.*directory="):
        list(ds.cache(max_bytes=4096))
    assert len(list(ds.cache(max_bytes=1 << 20))) == 19
    with pytest.raises(UsageError, match="max_bytes=4096 bytes on disk"):
        list(ds.cache(str(tmp_path / "c"), max_bytes=4096))
    assert _nothing_in(tmp_path / "c")
    assert C.DEFAULT_MAX_BYTES == 1 << 30


def test_memory_cache_hands_out_batches_no_consumer_can_change():
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    ds = Dataset(data, "tfrecord", decoder=_decoder()).batch(16).cache()
    first = list(ds)
    first[0]["extra"] = 1
    with pytest.raises(ValueError):
        first[0]["x"] += 1  # read-only: later epochs would see the change
    again = list(ds)
    assert "extra" not in again[0] and [_ids(b) for b in again] == [_ids(b) for b in first]


# -- resume across a cache --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["memory", "directory"])
@pytest.mark.parametrize("chain", sorted(CHAINS) + ["shuffle-before"])
def test_resume_in_a_cached_epoch_is_exact_in_a_new_dataset(server, tmp_path, kind, chain):
    urls = _urls(server)
    where = _where(tmp_path, kind)
    if chain == "shuffle-before":  # the cache holds epoch 0's shuffle: rebuilt alike
        make = lambda: Dataset(urls, "tfrecord", decoder=_decoder()).shuffle(  # noqa: E731
            100, seed=9).cache(where).batch(16).shuffle_batches(3, seed=2)
    else:
        make = lambda: CHAINS[chain](Dataset(urls, "tfrecord", decoder=_decoder()),  # noqa: E731
                                     lambda d: d.cache(where))
    ds1 = make()
    reference = [_epoch(ds1) for _ in range(3)]
    it = iter(ds1.with_context(epoch=2))  # a cached epoch
    before = [_ids(next(it)) for _ in range(7)]
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert state["epoch"] == 2
    gets = _gets(server)
    after = _epoch(make().iter_from(state))
    assert before + after == reference[2]
    if kind == "directory":
        assert _gets(server) == gets  # from the files: the source is not touched


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_resumed_filling_epoch_fills_the_cache_completely(server, tmp_path, chain):
    urls = _urls(server)
    where = str(tmp_path / "cache")
    make = lambda: CHAINS[chain](Dataset(urls, "tfrecord", decoder=_decoder()),  # noqa: E731
                                 lambda d: d.cache(where))
    reference = [_epoch(CHAINS[chain](Dataset(urls, "tfrecord", decoder=_decoder()),
                                      lambda d: d.prefetch(1)).with_context(epoch=e))
                 for e in range(2)]
    it = iter(make())
    before = [_ids(next(it)) for _ in range(5)]
    state = it.state_dict()
    it.close()
    assert os.listdir(where) == []
    ds2 = make()
    assert before + _epoch(ds2.iter_from(state)) == reference[0]
    gets = _gets(server)
    assert _epoch(ds2) == reference[1]  # epoch 1 from the cache the resumed epoch 0 filled
    assert _gets(server) == gets


def test_the_fast_forward_sees_every_item_through_a_cache():
    """A cache after batch() makes the replay skip at the end (it decodes what it skips, so the
    cache of a replayed filling epoch is whole); before batch() nothing changes."""
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    base = Dataset(data, "tfrecord", decoder=_decoder())
    after = base.batch(16).cache().shuffle_batches(2, seed=1)
    assert plan_fast_forward(after._stages, True, 5).mode == "end"
    before = base.cache().batch(16)
    assert plan_fast_forward(before._stages, True, 5).mode == "before_decode"


def test_a_shuffle_after_the_cache_is_reproducible_per_seed():
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    make = lambda seed: Dataset(data, "tfrecord").cache().shuffle(50, seed=seed)  # noqa: E731
    a, b, c = make(1), make(1), make(2)
    ea, eb, ec = ([list(d) for _ in range(3)] for d in (a, b, c))
    assert ea == eb and ea != ec
    assert ea[1] != ea[2] and sorted(ea[1]) == sorted(ea[2])
    assert ea == [list(Dataset(data, "tfrecord").prefetch(1).shuffle(50, seed=1)
                       .with_context(epoch=e)) for e in range(3)]


# -- through to_torch -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,persistent,gets_per_epoch", [
    ("memory", True, 0), ("directory", False, 0), ("memory", False, N_FILES)])
def test_torch_workers_cache_their_own_shard(server, tmp_path, kind, persistent, gets_per_epoch):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    urls = _urls(server)
    ds = Dataset(urls, "tfrecord", decoder=_decoder()).batch(16).cache(_where(tmp_path, kind))
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                        persistent_workers=persistent, multiprocessing_context=CONTEXT)
    for epoch in range(3):
        got = sorted(i for b in loader for i in b["x"].tolist())
        assert got == ALL_IDS
        assert _gets(server) == N_FILES + epoch * gets_per_epoch
    if kind == "directory":
        assert len(os.listdir(tmp_path / "cache")) == 2  # one file per worker


def test_torch_in_process_memory_cache(server):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    ds = Dataset(_urls(server), "tfrecord", decoder=_decoder()).batch(16).cache()
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=0)
    for _ in range(3):
        assert sorted(i for b in loader for i in b["x"].tolist()) == ALL_IDS
    assert _gets(server) == N_FILES


def test_a_directory_that_cannot_be_written_is_a_source_error(tmp_path):
    if os.geteuid() == 0:
        blocked = tmp_path / "file"  # root writes anywhere: a path under a regular file
        blocked.write_bytes(b"")
        directory = str(blocked / "cache")
    else:
        os.chmod(tmp_path, 0o500)
        directory = str(tmp_path / "cache")
    data = b"".join(streamio.formats.encode_tfrecord(r) for r in _records(0))
    with pytest.raises(SourceError, match="cache"):
        list(Dataset(data, "tfrecord").cache(directory))


@pytest.mark.parametrize("kind", ["memory", "directory"])
def test_torch_workers_sharing_one_pipe_channel_cache_their_share(tmp_path, fifo, kind):
    """SageMaker's case: one FIFO per epoch dealt to every DataLoader worker. Each worker caches
    the blocks it was dealt; epochs 1 and 2 come from the caches, with no FIFO."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    ref = tmp_path / "ref.tfrecord"
    streamio.write_records(str(ref), "tfrecord", [r for k in range(N_FILES) for r in _records(k)])
    os.mkfifo(tmp_path / "train_0")
    fifo.start(str(tmp_path / "train_0"), str(ref))
    channel = streamio.PipeChannel(str(tmp_path / "train"), open_timeout=20)
    ds = Dataset(channel, "tfrecord", decoder=_decoder()).batch(16).cache(_where(tmp_path, kind))
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2, persistent_workers=True,
                        multiprocessing_context=CONTEXT)
    for _ in range(3):
        assert sorted(i for b in loader for i in b["x"].tolist()) == ALL_IDS
    assert not os.path.exists(tmp_path / "train_1")


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, not ours
def test_stateful_dataloader_resumes_a_cached_epoch_from_the_files(server, tmp_path):
    """2 workers, a directory cache: a checkpoint in epoch 2 resumes exactly in a new
    DataLoader over a new Dataset, from the workers' files (no request to the server)."""
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    urls = _urls(server)
    make = lambda: stateful.StatefulDataLoader(  # noqa: E731
        CHAINS["batches"](Dataset(urls, "tfrecord", decoder=_decoder()),
                          lambda d: d.cache(str(tmp_path / "cache"))).to_torch(),
        batch_size=None, num_workers=2, multiprocessing_context=CONTEXT)
    loader = make()
    epochs = [[b["x"].tolist() for b in loader] for _ in range(3)]
    assert epochs[1] != epochs[2]
    loader = make()  # a new run over the same directory: epochs 0 and 1 from the files
    for _ in range(2):
        for _ in loader:
            pass
    it = iter(loader)  # epoch 2
    before = [next(it)["x"].tolist() for _ in range(9)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    gets = _gets(server)
    resumed = make()
    resumed.load_state_dict(state)
    assert before + [b["x"].tolist() for b in resumed] == epochs[2]
    assert _gets(server) == gets


# -- a local file rewritten under the same name ---------------------------------------------------
def _write_ids(path, ids, mtime_ns=None) -> None:
    """Rewrite ``path`` in place (same inode) with one record per id; its mtime set explicitly
    (a rewrite within one clock tick of the filesystem would keep the old one)."""
    before = os.stat(path).st_mtime_ns if os.path.exists(path) else None
    data = b"".join(streamio.formats.encode_tfrecord(encode_example({"x": [i]})) for i in ids)
    with open(path, "r+b" if before is not None else "wb") as f:
        f.write(data)
        f.truncate()
    if mtime_ns is None and before is not None:
        mtime_ns = before + 10 ** 9
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def _job(directory, *sources) -> dict:
    """A restarted job: a new process and a new Dataset over the same directory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SCRIPTS.parent.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])}
    out = subprocess.run([sys.executable, str(SCRIPTS / "cache_job.py"), str(directory),
                          *map(str, sources)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


OLD, NEW = range(200, 500), range(600, 900)  # ids of equal encoded size: only mtime tells


def test_a_source_rewritten_in_place_is_noticed_by_a_restarted_job(tmp_path):
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    directory = tmp_path / "cache"
    first = _job(directory, source)
    assert first["ids"] == list(OLD) and first["opened"] and first["warnings"] == []
    (name,) = os.listdir(directory)
    inode, size = os.stat(source).st_ino, os.stat(source).st_size
    _write_ids(source, NEW)  # a nightly export over the same path
    assert (os.stat(source).st_ino, os.stat(source).st_size) == (inode, size)

    second = _job(directory, source)
    assert second["ids"] == list(NEW)  # not the cached OLD records
    (warning,) = second["warnings"]
    assert warning.startswith("StreamioWarning: ") and "stale" in warning
    assert str(source) in warning and str(directory / name) in warning
    assert os.listdir(directory) == [name]  # refilled in place: one file, no temp left

    third = _job(directory, source)  # from the refilled cache: the source is not opened
    assert third == {"ids": list(NEW), "warnings": [], "opened": [], "bytes": 0}


def test_a_removed_source_is_not_served_from_the_cache(tmp_path):
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    directory = str(tmp_path / "cache")
    ds = Dataset(str(source), "tfrecord", decoder=Example({"x": FixedLen((), np.int64)}))
    ds = ds.batch(16).cache(directory)
    assert sorted(i for b in ds for i in _ids(b)) == list(OLD)
    os.unlink(source)
    for _ in range(2):  # the stale file stays refused, epoch after epoch
        with pytest.warns(StreamioWarning, match=f"stale: source {source} changed"), \
                pytest.raises(SourceError) as info:
            list(ds)
        assert str(source) in str(info.value)


def test_a_mix_notices_a_change_in_one_input(tmp_path):
    a, b = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    _write_ids(a, range(0, 100))
    _write_ids(b, range(200, 300))
    directory = tmp_path / "cache"
    assert _job(directory, a, b)["ids"] == list(range(100)) + list(range(200, 300))
    assert _job(directory, a, b)["opened"] == []  # cached
    _write_ids(b, range(600, 700))
    again = _job(directory, a, b)
    assert again["ids"] == list(range(100)) + list(range(600, 700))
    (warning,) = again["warnings"]
    assert f"source {b} changed" in warning
    assert _job(directory, a, b)["opened"] == []


def test_a_source_that_changes_during_the_fill_is_not_kept(tmp_path):
    """The records handed out came from a file that changed under them: no cache is put in
    place (a warning names the file), and the next epoch reads the new file and fills."""
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    directory = tmp_path / "cache"
    decoder = Example({"x": FixedLen((), np.int64)})
    seen = []

    def export_lands(record):  # the nightly export rewrites the file while epoch 0 reads it
        seen.append(1)
        if len(seen) == 50:
            _write_ids(source, NEW)
        return record

    changing = Dataset(str(source), "tfrecord", decoder=decoder).map(export_lands).batch(16)
    with pytest.warns(StreamioWarning,
                      match=f"source {source} changed while the cache .* was filling"):
        got = sorted(i for b in changing.cache(str(directory)) for i in _ids(b))
    assert got == list(OLD)  # read before the change reached the reader (one block)
    assert _nothing_in(directory)  # nothing kept: no cache, no temp file
    assert _job(directory, source)["ids"] == list(NEW)
    assert _job(directory, source)["opened"] == []


def test_a_fifo_path_is_not_recorded_and_later_epochs_need_no_writer(tmp_path, fifo):
    """A FIFO is stat'ed (not a regular file: not recorded), never opened to check it: once the
    cache is complete, later epochs train with no writer on the FIFO."""
    ref = tmp_path / "ref.tfrecord"
    _write_ids(ref, OLD)
    path = tmp_path / "pipe"
    os.mkfifo(path)
    fifo.start(str(path), str(ref))
    ds = Dataset(str(path), "tfrecord", decoder=Example({"x": FixedLen((), np.int64)}),
                 open_timeout=5).batch(16).cache(str(tmp_path / "cache"))
    for _ in range(3):
        assert sorted(i for b in ds for i in _ids(b)) == list(OLD)
    assert ds.stats()["sources_opened"] == 0


def _rewrite_manifest(path, change) -> None:
    """Rewrite the cache file's manifest (``change(manifest)``) with a matching SHA-256 and
    trailer: what another writer could leave, past the checksums."""
    raw = path.read_bytes()
    _, version, manifest_len, body_len, _ = C._TRAILER.unpack(raw[-C._TRAILER.size:])
    manifest = json.loads(raw[body_len:body_len + manifest_len])
    change(manifest)
    data = json.dumps(manifest).encode()
    trailer = C._TRAILER.pack(C._MAGIC, version, len(data), body_len,
                              hashlib.sha256(data).digest())
    path.write_bytes(raw[:body_len] + data + trailer)


@pytest.mark.parametrize("files", [
    None, {}, [["x", 1, 2, 3]], [["", 0, 0, 0, 0]], [["a\0b", 0, 0, 0, 0]], [[7, 0, 0, 0, 0]],
    [["p", -1, 0, 0, 0]], [["p", 1.5, 0, 0, 0]], [["p", True, 0, 0, 0]],
    [["p", 0, 2 ** 63, 0, 0]], [["p", 0, 0, 2 ** 64, 0]], [["p", 0, 0, 0, "1"]], ["p"]])
def test_a_malformed_file_identity_is_a_corrupt_record_error(tmp_path, files):
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    ds = Dataset(str(source), "tfrecord").cache(str(tmp_path / "cache"))
    assert len(list(ds)) == len(OLD)
    (path,) = (tmp_path / "cache").iterdir()
    _rewrite_manifest(path, lambda m: m.update(files=files))
    with pytest.raises(CorruptRecordError, match="cache manifest: local files") as info:
        list(ds)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("remote", [
    None, {}, [["http://h/x", None, None]], [["no-scheme", None, None, 1]],
    [["http://h/\0", None, None, 1]], [["http://h/x", 7, None, 1]],
    [["http://h/x", None, None, -1]], [["http://h/x", None, None, True]],
    [["http://h/x", "e" * 2000, None, 1]], ["http://h/x"]])
def test_a_malformed_remote_identity_is_a_corrupt_record_error(tmp_path, remote):
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    ds = Dataset(str(source), "tfrecord").cache(str(tmp_path / "cache"))
    assert len(list(ds)) == len(OLD)
    (path,) = (tmp_path / "cache").iterdir()
    _rewrite_manifest(path, lambda m: m.update(remote=remote))
    with pytest.raises(CorruptRecordError, match="cache manifest: remote objects"):
        list(ds)


def test_the_manifest_records_local_files_and_a_faithful_rewrite_is_served(tmp_path):
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    ds = Dataset(str(source), "tfrecord").cache(str(tmp_path / "cache"))
    list(ds)
    (path,) = (tmp_path / "cache").iterdir()
    st = os.stat(source)
    seen = {}
    _rewrite_manifest(path, lambda m: seen.update(m))
    assert seen["files"] == [[str(source), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]]
    assert len(list(ds)) == len(OLD) and ds.stats()["sources_opened"] == 0


def test_a_cache_file_of_the_previous_version_is_filled_again_and_an_unknown_one_refused(
        tmp_path):
    """Version 1 recorded no file identities: an earlier streamio's own file, so an upgrade
    fills it again (with a warning naming it) rather than stopping a restarted job; a version
    no streamio wrote is refused (the trailer's rule)."""
    source = tmp_path / "train.tfrecord"
    _write_ids(source, OLD)
    ds = Dataset(str(source), "tfrecord").cache(str(tmp_path / "cache"))
    list(ds)
    (path,) = (tmp_path / "cache").iterdir()

    def set_version(version):
        raw = bytearray(path.read_bytes())
        raw[-C._TRAILER.size + 8:-C._TRAILER.size + 12] = version.to_bytes(4, "little")
        path.write_bytes(bytes(raw))

    records = [bytes(r) for r in Dataset(str(source), "tfrecord")]
    set_version(1)
    with pytest.warns(StreamioWarning, match=f"{path}.*earlier streamio.*format 1"):
        assert [bytes(r) for r in ds] == records
    assert C._TRAILER.unpack(path.read_bytes()[-C._TRAILER.size:])[1] == C.VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [bytes(r) for r in ds] == records  # the new file is served, no warning
    set_version(C.VERSION + 1)
    with pytest.raises(CorruptRecordError, match=f"version {C.VERSION + 1}, this streamio reads"):
        list(ds)

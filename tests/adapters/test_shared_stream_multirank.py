"""The local ranks of one host sharing one FIFO (torchrun on an 8-GPU host; SageMaker gives each
host one FIFO per channel): real rank processes (tests/scripts/multirank_check.py), each with
its own DataLoader, read one FIFO that another process feeds; local rank 0's worker 0 deals."""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys
import time

import pytest

import streamio
from streamio import Dataset
from streamio.sharing.stream import SharedStreamFeed, stream_address

from hang_guard import bounded
from support.examples import write_id_examples

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SCRIPT = os.path.join(HERE, "scripts", "multirank_check.py")
N = 400
EPOCHS = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("multirank-data")
    return {"a": write_id_examples(str(root / "a.tfrecord"), range(N)),
            "b": write_id_examples(str(root / "b.tfrecord"), range(10_000, 10_000 + N)),
            # Long enough that a rank killed at its 3rd batch dies while the other still has
            # blocks of its share to take (each reader's END goes out with its share's last
            # block; a rank that dies after the others' END is not seen by them).
            "long": write_id_examples(str(root / "long.tfrecord"), range(20 * N))}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: object) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Job:
    """Rank processes and the writers that feed their FIFOs; everything is killed at the end."""

    def __init__(self, tmp_path) -> None:
        self.tmp = tmp_path
        self.procs: list = []
        self.outs: dict = {}
        self.ranks: dict = {}

    def channel(self, name: str, data: str, epochs: int = EPOCHS) -> str:
        prefix = str(self.tmp / name)
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "streamio", "serve-pipe", "--channel", prefix, "--epochs",
             str(epochs), "--open-timeout", "60", data], stderr=subprocess.DEVNULL))
        return "channel:" + prefix

    def fifo(self, name: str, data: str, ranks: int, epochs: int = EPOCHS) -> tuple:
        """One FIFO path refilled each epoch (after every rank finished the last one)."""
        path = str(self.tmp / name)
        os.mkfifo(path)
        markers = str(self.tmp / (name + "-markers"))
        os.mkdir(markers)
        self.procs.append(subprocess.Popen(
            [sys.executable, SCRIPT, "write", path, data, str(epochs), markers, str(ranks)]))
        return path, markers

    def torchrun(self, name: str, nproc: int, source: str, *args: object) -> None:
        """``nproc`` ranks started by a real ``torchrun`` launcher (one node, its store and
        process group on 127.0.0.1): it sets every variable a rank reads, as in a training job."""
        out = self.out_of(name + "/{rank}")
        launcher = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--node-rank=0",
             f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
             f"--master-port={free_port()}", "--local-addr=127.0.0.1", "--max-restarts=0",
             SCRIPT, "rank", out, source, *map(str, args)], env=clean_env())
        self.procs.append(launcher)
        for r in range(nproc):
            self.outs[f"{name}/{r}"] = out.replace("{rank}", str(r))
            self.ranks[f"{name}/{r}"] = launcher

    def out_of(self, name: str) -> str:
        return str(self.tmp / (name.replace("/", "-") + ".json"))

    def rank(self, name: str, source: str, *args: object, env: dict | None = None) -> None:
        out = self.out_of(name)
        self.outs[name] = out
        self.ranks[name] = subprocess.Popen(
            [sys.executable, SCRIPT, "rank", out, source, *map(str, args)],
            env=env or clean_env())
        self.procs.append(self.ranks[name])

    def results(self, seconds: float = 100.0) -> dict:
        """Each rank's outcome (None for one that died), waiting at most ``seconds`` in all."""
        def wait() -> dict:
            found = {}
            for name, out in self.outs.items():
                proc = self.ranks[name]
                while not os.path.exists(out) and proc.poll() is None:
                    time.sleep(0.05)
                found[name] = json.load(open(out)) if os.path.exists(out) else None
            return found
        return bounded(wait, seconds)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def assert_exactly_once(results: dict, expected: set, epochs: int = EPOCHS) -> None:
    for name, result in results.items():
        assert result is not None and result["error"] is None, (name, result)
        assert result["tensorflow_imported"] is False
        assert len(result["epochs"]) == epochs, name
    for epoch in range(epochs):
        seen = collections.Counter()
        for result in results.values():
            seen.update(result["epochs"][epoch])
        assert set(seen) == expected, f"epoch {epoch}: {len(expected - set(seen))} missing"
        assert max(seen.values()) == 1, f"epoch {epoch}: a record went to two readers"


def group(results: dict, prefix: str) -> dict:
    return {name: r for name, r in results.items() if name.startswith(prefix + "/")}


@pytest.fixture(scope="module")
def served(tmp_path_factory, data):
    """Every scenario that should deliver each record once, run at the same time (each is a few
    processes that mostly wait for torch to import: together they take little more than one).

    - ``env``: RANK/LOCAL_RANK/... as torchrun sets them, to_torch() without arguments, 2
      workers per rank, one FIFO path reopened for each of two epochs;
    - ``explicit``: to_torch(rank=, world_size=, local_rank=, local_world_size=), a PipeChannel
      (a new FIFO each epoch, SageMaker's convention), num_workers=0 (the dealer in rank 0's main
      process), and rank 1 starting seconds after rank 0 (a late rank is served);
    - ``replicated``/``sharded``: two simulated hosts of two ranks, each host its own FIFO
      (ranks 0-1 node 0, ranks 2-3 node 1); "replicated": both carry the same records and each
      node keeps its half; "sharded": each carries its own and each node keeps all;
    - ``ddp``: a gloo process group, 3 workers per rank and ``to_device(even_batches="pad")``:
      the ranks step in lockstep (one all-reduce per batch) while sharing the FIFO, two epochs;
    - ``torchrun``: the same under a real ``torchrun`` launcher (2 ranks x 2 workers, a
      PipeChannel), to_torch() without arguments: what a training script on a SageMaker host runs.
    """
    job = Job(tmp_path_factory.mktemp("served"))
    try:
        path, markers = job.fifo("shared.fifo", data["a"], ranks=2)
        for r in range(2):
            job.rank(f"env/{r}", path, "--workers", 2, "--markers", markers,
                     env=clean_env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2,
                                   MASTER_ADDR="127.0.0.1", MASTER_PORT=29511))
        source = job.channel("explicit", data["a"])
        for r in range(2):
            job.rank(f"explicit/{r}", source, "--workers", 0, "--rank", r, "--world", 2,
                     "--local-rank", r, "--local-world", 2, "--delay", 4 if r else 0)
        for mode, workers in (("replicated", 2), ("sharded", 0)):
            sources = [job.channel(f"{mode}-node0", data["a"], epochs=1),
                       job.channel(f"{mode}-node1",
                                   data["a"] if mode == "replicated" else data["b"], epochs=1)]
            for r in range(4):
                job.rank(f"{mode}/{r}", sources[r // 2], "--workers", workers, "--epochs", 1,
                         "--node-streams", mode,
                         env=clean_env(RANK=r, WORLD_SIZE=4, LOCAL_RANK=r % 2,
                                       LOCAL_WORLD_SIZE=2))
        source = job.channel("ddp", data["a"])
        port = free_port()
        for r in range(2):
            job.rank(f"ddp/{r}", source, "--workers", 3, "--ddp", "pad",
                     env=clean_env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2,
                                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
        job.torchrun("torchrun", 2, job.channel("torchrun", data["a"]), "--workers", 2)
        yield job.results(seconds=400)
    finally:
        job.close()


def test_two_ranks_from_torchrun_variables_share_one_fifo_over_epochs(served):
    assert_exactly_once(group(served, "env"), set(range(N)))


def test_two_ranks_with_explicit_arguments_one_late_share_a_pipe_channel(served):
    assert_exactly_once(group(served, "explicit"), set(range(N)))


@pytest.mark.parametrize("mode", ["replicated", "sharded"])
def test_two_nodes_of_two_ranks_each_read_their_own_fifo(served, mode):
    results = group(served, mode)
    assert len(results) == 4
    expected = set(range(N)) if mode == "replicated" else set(range(N)) | set(range(10_000,
                                                                                 10_000 + N))
    assert_exactly_once(results, expected, epochs=1)
    if mode == "replicated":  # a node's share is its own: node 0 even positions, node 1 odd
        for name, result in results.items():
            node = int(name[-1]) // 2
            assert all(i % 2 == node for e in result["epochs"] for i in e), name


def test_ranks_in_lockstep_under_a_process_group_finish_every_epoch_evenly(served):
    """Shares differ (by up to a block and a short last one); even_batches="pad" gives both ranks the same
    number of batches, and every record is used (a short rank repeats its last batch)."""
    results = group(served, "ddp")
    for name, result in results.items():
        assert result is not None and result["error"] is None, (name, result)
    for epoch in range(EPOCHS):
        counts = [r["batches"][epoch] for r in results.values()]
        assert counts[0] == counts[1], counts
        seen = set()
        for result in results.values():
            seen.update(result["epochs"][epoch])
        assert seen == set(range(N)), f"epoch {epoch}"


def test_ranks_started_by_torchrun_share_one_pipe_channel(served):
    """No variable set by hand: torchrun's own environment places the ranks on one host."""
    results = group(served, "torchrun")
    assert len(results) == 2
    assert_exactly_once(results, set(range(N)))
    assert all(r["torchrun"] for r in results.values())


@pytest.fixture(scope="module")
def failed(tmp_path_factory, data):
    """The scenarios that must end in an error, at the same time: in ``kill1``/``kill0`` that
    rank kills itself (SIGKILL) at its 3rd batch (each rank waits after its first batch for
    the other's first, so both hold blocks when it dies); in
    ``alone`` only local rank 0 of two ever starts (connect_timeout 6 s)."""
    job = Job(tmp_path_factory.mktemp("failed"))
    try:
        for victim in (1, 0):
            source = job.channel(f"kill{victim}", data["long"], epochs=1)
            for r in range(2):
                extra = ("--die-after", 3) if r == victim else ()
                job.rank(f"kill{victim}/{r}", source, "--workers", 2, "--slow", 0.1,
                         "--epochs", 1, "--rank", r, "--world", 2, "--local-rank", r,
                         "--local-world", 2, "--sync-first",
                         job.out_of(f"kill{victim}/{1 - r}") + ".first", *extra)
        lonely = job.channel("lonely", data["a"], epochs=1)
        job.rank("alone/0", lonely, "--workers", 2, "--epochs", 1, "--rank", 0, "--world", 2,
                 "--local-rank", 0, "--local-world", 2, "--connect-timeout", 6)
        yield job.results(seconds=300)
    finally:
        job.close()


@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_that_dies_ends_the_epoch_with_an_error_on_the_other(failed, victim):
    """The other rank ends with a streamio error, within the bound on the whole run (rank 1: the
    dealer names it; rank 0: the dealer goes with it)."""
    results = group(failed, f"kill{victim}")
    assert results[f"kill{victim}/{victim}"] is None  # it died
    survivor = results[f"kill{victim}/{1 - victim}"]
    assert survivor is not None, "the surviving rank did not finish"
    error = survivor["error"]
    assert error is not None and error["streamio"] and error["type"] == "SourceError", survivor
    if victim == 1:
        assert "of local rank 1 left" in error["message"], error
    else:
        assert "local rank 0" in error["message"], error  # "... left" or "... stopped"


def test_a_rank_that_never_connects_is_named(failed):
    error = failed["alone/0"]["error"]
    assert error is not None and error["type"] == "SourceError", failed["alone/0"]
    assert "local rank 1 (none of its readers)" in error["message"], error
    assert "connect_timeout" in error["message"]


def test_plan_takes_the_shared_path_for_local_ranks(tmp_path, monkeypatch):
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    path = str(tmp_path / "pipe")
    os.mkfifo(path)
    tds = Dataset(path, "tfrecord").to_torch()
    # torchrun's variables place rank 3 of 4 as local rank 1 of 2 on node 1.
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(streamio.UsageError, match="node_streams"):
        tds.plan(epoch=0, rank=3, world_size=4, worker=0, num_workers=2)
    tds = Dataset(path, "tfrecord").to_torch(node_streams="sharded")
    feed = tds.plan(epoch=0, rank=3, world_size=4, worker=1, num_workers=2)._feed
    assert isinstance(feed, SharedStreamFeed)
    assert (feed.local_rank, feed.local_world_size, feed.worker) == (1, 2, 1)
    # Every local rank meets at the same address; another epoch or another job elsewhere.
    same = Dataset(path, "tfrecord").to_torch(node_streams="sharded").plan(
        epoch=0, rank=2, world_size=4, worker=0, num_workers=2)._feed
    assert same.address == feed.address
    assert stream_address([path], 1) != feed.address
    monkeypatch.setenv("MASTER_PORT", "29999")
    assert stream_address([path], 0) != feed.address
    # Explicit arguments win over the environment, and must fit the rank.
    feed = Dataset(path, "tfrecord").to_torch(local_rank=0, local_world_size=4).plan(
        epoch=0, rank=0, world_size=4, worker=0, num_workers=1)._feed
    assert feed.local_world_size == 4
    with pytest.raises(streamio.UsageError, match="does not fit"):
        Dataset(path, "tfrecord").to_torch(local_rank=1, local_world_size=2).plan(
            epoch=0, rank=0, world_size=2)
    with pytest.raises(streamio.UsageError):
        Dataset(path, "tfrecord").to_torch(local_rank=1)
    with pytest.raises(streamio.UsageError):
        Dataset(path, "tfrecord").to_torch(node_streams="both")
    # stdin cannot be named by another process: a clear error, not a dealer nobody finds.
    with pytest.raises(streamio.UsageError, match="cannot be shared between the ranks"):
        Dataset("-", "tfrecord").to_torch().plan(epoch=0, rank=0, world_size=2,
                                                 local_rank=0, local_world_size=2)
    # One rank per host and one worker: the host's only reader keeps its node's share itself.
    plan = Dataset(path, "tfrecord").to_torch(node_streams="replicated").plan(
        epoch=0, rank=1, world_size=2, local_rank=0, local_world_size=1)
    assert plan._feed is None and plan._round_robin == ((2, 1),)


def test_the_dealer_keeps_a_shard_of_the_stream(tmp_path):
    """A record-level shard on a shared stream (what sagemaker.channel() does for a
    FullyReplicated channel on host 1 of 2, and node_streams="replicated") is applied by the
    dealer: the workers together get exactly that shard. Two 'workers' as threads of this
    process, one FIFO fed by a writer process."""
    import threading

    data = str(tmp_path / "raw.tfrecord")
    streamio.write_records(data, "tfrecord", (b"%d" % i for i in range(300)))
    fifo = str(tmp_path / "shard.fifo")
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, os.path.join(HERE, "scripts", "fifo_writer.py"),
                               fifo, data])
    try:
        tds = Dataset(fifo, "tfrecord").shard(2, 1).to_torch(connect_timeout=30)
        got: dict = {0: [], 1: []}

        def read(worker: int) -> None:
            for record in tds.plan(epoch=0, worker=worker, num_workers=2):
                got[worker].append(int(record))

        def both() -> None:
            threads = [threading.Thread(target=read, args=(w,), daemon=True) for w in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        bounded(both, 60)
    finally:
        writer.kill()
        writer.wait()
    seen = got[0] + got[1]
    assert sorted(seen) == list(range(1, 300, 2))

"""Elastic resume through PyTorch (issue #25): a job of 2 ranks x 2 StatefulDataLoader workers
checkpointed mid-epoch, resumed by a job of 3 ranks x 1 worker. Real rank processes
(tests/scripts/elastic_torch.py), gloo with its store on 127.0.0.1 (inside a private network
namespace where ``unshare --net`` is permitted), a timeout on every job.

Over both jobs every record of the interrupted epoch is delivered exactly once, and the new
job's next epoch is an ordinary full epoch. Cases: several TFRecord files (whole-file shards),
one file split by byte range, gzip files (fewer than the readers: each reader keeps a round-robin
share); the old ranks' states are gathered three ways (``all_gather_object``, one JSON per rank,
``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import streamio

from conftest import SCRIPTS
from support.examples import id_example, write_id_examples, write_id_parts
from support.rank_jobs import assert_exactly_once, run_job, script_env

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

# torchdata calls a deprecated torch API (a notice from the library, not from streamio)
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

SCRIPT = str(SCRIPTS / "elastic_torch.py")
JOB_TIMEOUT = 240  # seconds a job's ranks may take (torch imports on a busy 2-core machine)
FILE_SIZES = [37, 50, 13, 41, 29, 30]  # uneven on purpose
RANGE_RECORDS = 300
GZIP_SIZES = [70, 45, 85]  # 3 files for 4 old readers, 3 new ones


def _write_cases(root) -> dict:
    """Each case's directory and the ids it holds."""
    os.makedirs(root / "files")
    write_id_parts(str(root / "files"), FILE_SIZES)
    os.makedirs(root / "range")
    write_id_examples(root / "range" / "big.tfrecord", range(1000, 1000 + RANGE_RECORDS))
    os.makedirs(root / "gzip")
    first = 2000
    for k, n in enumerate(GZIP_SIZES):
        streamio.write_records(str(root / "gzip" / f"part-{k}.tfrecord.gz"), "tfrecord",
                               [id_example(i) for i in range(first, first + n)],
                               compression="gzip")
        first += n
    return {"files": set(range(sum(FILE_SIZES))),
            "range": set(range(1000, 1000 + RANGE_RECORDS)),
            "gzip": set(range(2000, 2000 + sum(GZIP_SIZES)))}


def _job(workdir, phase: str, nranks: int) -> None:
    proc = run_job(SCRIPT, ["job", workdir, phase, nranks, JOB_TIMEOUT], JOB_TIMEOUT + 30)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]


def _results(workdir, case: str, phase: str, nranks: int) -> list:
    found = []
    for rank in range(nranks):
        with open(workdir / case / f"{phase}-rank{rank}.json") as f:
            found.append(json.load(f))
    for rank, result in enumerate(found):
        assert "error" not in result, (case, phase, rank, result["error"])
        assert result["tensorflow_imported"] is False
    return found


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The old job has run; ``resume(phase, nranks)`` runs a resumed job once."""
    root = tmp_path_factory.mktemp("elastic-torch")
    expected = _write_cases(root)
    _job(root, "old", 2)
    done = set()

    def resume(phase: str, nranks: int) -> None:
        if phase not in done:
            done.add(phase)
            _job(root, phase, nranks)

    return root, expected, resume


@pytest.mark.parametrize("phase, nranks", [("same", 2), ("new", 3)],
                         ids=["2x2-to-2x2", "2x2-to-3x1"])
def test_every_record_once_over_the_interrupted_and_the_resumed_job(jobs, phase, nranks):
    root, expected, resume = jobs
    resume(phase, nranks)
    for case in ("files", "range", "gzip"):
        old = _results(root, case, "old", 2)
        new = _results(root, case, phase, nranks)
        before = [r["epochs"][0] for r in old]
        assert all(before), f"{case}: every old rank took some batches"
        assert_exactly_once(before + [r["epochs"][0] for r in new], expected[case],
                            f"{case}, epoch 0 over both jobs")
        assert_exactly_once([r["epochs"][1] for r in new], expected[case],
                            f"{case}, epoch 1 of the resumed job")


def test_one_process_two_workers_resumed_on_three_workers_and_on_none(tmp_path):
    """No process group: StatefulDataLoader(num_workers=2) checkpointed after 5 batches,
    ``to_torch().load_state_dict([its state])`` then a fresh loader with 3 workers (forked,
    persistent, spawned), and one with ``num_workers=0``: each gives the rest of the epoch,
    then a full epoch 1."""
    os.makedirs(tmp_path / "files")
    write_id_parts(str(tmp_path / "files"), FILE_SIZES)
    proc = subprocess.run([sys.executable, SCRIPT, "local", str(tmp_path)], capture_output=True,
                          timeout=JOB_TIMEOUT, env=script_env())
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    result = json.loads((tmp_path / "local.json").read_text())
    assert result["tensorflow_imported"] is False
    everything = set(range(sum(FILE_SIZES)))
    for workers in ("3", "0", "3-persistent", "3-spawn"):
        assert "error" not in result[workers], (workers, result[workers])
        rest, next_epoch = result[workers]
        assert_exactly_once([result["before"], rest], everything, f"{workers} workers, epoch 0")
        assert_exactly_once([next_epoch], everything, f"{workers} workers, epoch 1")


def test_a_checkpoint_saving_every_rank_under_one_key_fails_loudly(jobs):
    """``torch.distributed.checkpoint`` keeps one copy of a key that every rank saves (it takes
    them for replicas): ``dcp.save({"loader": loader.state_dict()})`` gives every rank rank 0's
    state back. Rank 1 resuming from it must fail, not read rank 0's share again."""
    root, _, resume = jobs
    resume("same", 2)
    for case in ("files", "range", "gzip"):
        ranks = _results(root, case, "same", 2)
        assert ranks[0]["naive"] == {"own": True, "error": None}
        assert ranks[1]["naive"]["own"] is False
        assert "another shard's" in ranks[1]["naive"]["error"], (case, ranks[1]["naive"])


def _old_rank_states(paths: list, world: int, batches: int) -> tuple:
    """``world`` ranks (to_torch(rank=, world_size=): no process group) x StatefulDataLoader
    (num_workers=0, no fork in the test process): each takes ``batches`` batches. (ids, the
    loaders' states through JSON)"""
    from torchdata.stateful_dataloader import StatefulDataLoader

    delivered, states = [], []
    for rank in range(world):
        tds = _id_pipeline(paths).to_torch(rank=rank, world_size=world)
        loader = StatefulDataLoader(tds, batch_size=None, num_workers=0)
        it = iter(loader)
        for _ in range(batches):
            delivered += next(it)["id"].tolist()
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it
    return delivered, states


def _id_pipeline(paths: list) -> streamio.Dataset:
    from support.examples import ID_X

    return streamio.Dataset(paths, "tfrecord", decoder=ID_X).shuffle(64, seed=11).batch(8)


@pytest.mark.parametrize("new_world", [2, 3])
@pytest.mark.parametrize("gathered", ["rank 1 missing", "rank 0 twice"])
def test_a_gathered_list_without_every_old_rank_is_refused(tmp_path, gathered, new_world):
    """Ranks' states gathered by hand (one JSON per rank) can miss one, or hold one twice:
    the resumed job must say so (as ``Dataset.iter_from`` does for shards), not repeat what
    the missing rank had delivered."""
    from streamio.errors import UsageError

    paths = write_id_parts(str(tmp_path), FILE_SIZES)
    _, states = _old_rank_states(paths, 2, 3)
    wrong = {"rank 1 missing": states[:1], "rank 0 twice": [states[0], states[0]]}[gathered]
    said = {"rank 1 missing": r"missing: rank, worker \[\(1, 0\)", "rank 0 twice": "appears twice"}
    with pytest.raises(UsageError, match=said[gathered]):
        for rank in range(new_world):
            tds = _id_pipeline(paths).to_torch(rank=rank, world_size=new_world)
            tds.load_state_dict(wrong)
            list(tds)

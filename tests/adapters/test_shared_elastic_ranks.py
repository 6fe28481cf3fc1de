"""A Pipe-mode channel shared by every local reader of a host, resumed after a restart (issue
#25): one host's 2 local ranks x 2 StatefulDataLoader workers read one PipeChannel (local rank
0's worker 0 deals its blocks), the job stops mid-epoch, and a restarted job whose channel
carries the same bytes (its FIFOs start again at ``_0``) resumes

- on 3 local ranks x 1 worker, from every old rank's state (gathered with
  ``all_gather_object``): every record of the interrupted epoch exactly once over both jobs, and
  the next epoch whole on the new layout;
- on the same 2 x 2, each rank from its own state (one JSON per rank): each rank's batches are
  exactly the uninterrupted job's, the rest of epoch 0 and then epoch 1.

Also: an elastic resume stopped in turn and resumed on another layout (ranks, and workers of one
process; these found that a nested replay of one old reader's share must get all of its blocks
each), and the epoch after one resumed in epoch 1 through ``StatefulDataLoader.load_state_dict``
reads the restarted channel's next FIFO (it read ``_2``: the shift of the FIFO numbers was set
in the worker that loaded the state only).

Real parts: rank processes (tests/scripts/shared_elastic_ranks.py) with torchrun's variables and
a gloo process group on 127.0.0.1 (inside a private network namespace where ``unshare --net``
is permitted), FIFOs fed by writer processes, forked DataLoader workers, a timeout on each job.
"""

from __future__ import annotations

import json
import os

import pytest

import streamio

from conftest import SCRIPTS
from support.clean_workers import context_for
from support.examples import write_id_examples
from support.rank_jobs import assert_exactly_once, run_job

pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

# torchdata calls a deprecated torch API (a notice from the library, not from streamio)
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

SCRIPT = SCRIPTS / "shared_elastic_ranks.py"
JOB_TIMEOUT = 150  # seconds a job's ranks may take (torch imports on a busy 2-core machine)
N = 1200
BATCH = 16
EVERYTHING = set(range(N))


def _results(workdir, phase: str, nranks: int) -> list:
    found = []
    for rank in range(nranks):
        path = workdir / f"{phase}-rank{rank}.json"
        result = json.loads(path.read_text()) if path.exists() else {"error": "no result"}
        assert "error" not in result, (phase, rank, result["error"])
        assert result["tensorflow_imported"] is False
        found.append(result)
    return found


def _job(workdir, phase: str, nranks: int) -> list:
    proc = run_job(SCRIPT, ["job", workdir, phase, JOB_TIMEOUT], JOB_TIMEOUT + 30)
    results = _results(workdir, phase, nranks)  # a rank's own error first: it says more
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return results


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The interrupted job has run; ``job(phase, nranks)`` runs another once (its results)."""
    root = tmp_path_factory.mktemp("shared-elastic-ranks")
    write_id_examples(root / "records.tfrecord", range(N))
    done = {"old": _job(root, "old", 2)}

    def job(phase: str, nranks: int) -> list:
        if phase not in done:
            done[phase] = _job(root, phase, nranks)
        return done[phase]

    return job


def _ids(batches: list) -> list:
    return [i for batch in batches for i in batch]


def test_three_local_ranks_of_one_worker_resume_two_ranks_of_two_workers(jobs):
    old, new = jobs("old", 2), jobs("new", 3)
    # the old job stopped mid-epoch, each rank after its own number of full batches
    assert [len(r["epochs"][0]) for r in old] == [5, 9]  # the script's PHASES
    assert all(len(b) == BATCH for r in old for b in r["epochs"][0])
    before = [_ids(r["epochs"][0]) for r in old]
    assert_exactly_once(before + [_ids(r["epochs"][0]) for r in new], EVERYTHING,
                        "epoch 0 over the interrupted and the resumed job")
    assert_exactly_once([_ids(r["epochs"][1]) for r in new], EVERYTHING,
                        "epoch 1 of the resumed job")
    assert all(r["epochs"][1] for r in new), "every new rank reads its share of epoch 1"


def test_the_same_layout_resumes_each_rank_exactly_where_the_uninterrupted_job_was(jobs):
    old, same, whole = jobs("old", 2), jobs("same", 2), jobs("whole", 2)
    assert_exactly_once([_ids(r["epochs"][0]) for r in whole], EVERYTHING, "uninterrupted")
    for rank in range(2):
        taken = old[rank]["epochs"][0]
        assert taken == whole[rank]["epochs"][0][:len(taken)], rank
        assert same[rank]["epochs"][0] == whole[rank]["epochs"][0][len(taken):], rank
        assert same[rank]["epochs"][1] == whole[rank]["epochs"][1], rank


def test_an_elastic_resume_stopped_in_turn_resumes_on_another_layout(jobs):
    """2 x 2 stopped, resumed on 3 x 1, stopped again mid-epoch, resumed on 2 x 2: the
    interrupted epoch's records exactly once over the three jobs."""
    old, stopped, again = jobs("old", 2), jobs("new-stopped", 3), jobs("again", 2)
    assert [len(r["epochs"][0]) for r in stopped] == [4, 1, 6]  # the script's PHASES
    assert_exactly_once([_ids(r["epochs"][0]) for r in old + stopped + again], EVERYTHING,
                        "epoch 0 over the three jobs")
    assert_exactly_once([_ids(r["epochs"][1]) for r in again], EVERYTHING,
                        "epoch 1 of the last job")


@pytest.fixture
def restart(tmp_path, fifo):
    """``restart(workers, states=None, own=None)``: a job of one process (no process group)
    whose channel starts again at ``_0`` (``_0`` and ``_1`` carry the same N records; ``_2``,
    which no restarted job should reach in its first two epochs, other records), its
    StatefulDataLoader resumed from ``states`` (to_torch's list form) or ``own`` (the loader's
    own state)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from support.examples import ID_X

    records = write_id_examples(tmp_path / "records.tfrecord", range(N))
    decoy = write_id_examples(tmp_path / "decoy.tfrecord", range(N, 2 * N))
    prefix = str(tmp_path / "train")

    def job(workers: int, states=None, own=None) -> StatefulDataLoader:
        for epoch, data in enumerate((records, records, decoy)):
            path = f"{prefix}_{epoch}"
            if os.path.exists(path):
                os.unlink(path)
            os.mkfifo(path)
            fifo.start(path, data)
        channel = streamio.PipeChannel(prefix, open_timeout=60)
        tds = streamio.Dataset(channel, "tfrecord", decoder=ID_X).shuffle(200, seed=5) \
            .batch(BATCH).to_torch()
        if states is not None:
            tds.load_state_dict(states)
        loader = StatefulDataLoader(tds, batch_size=None, num_workers=workers,
                                    multiprocessing_context=context_for(workers))
        if own is not None:
            loader.load_state_dict(own)
        return loader

    yield job
    for proc in fifo.procs:  # writers of FIFOs that no job opened (the old ones were unlinked)
        if proc.poll() is None:
            proc.kill()


def _stop(loader, batches: int) -> tuple:
    """The ids of ``batches`` batches, and the loader's state after them (through JSON); the
    job stops: its workers go, the writers see their FIFOs closed."""
    it = iter(loader)
    ids = [i for _ in range(batches) for i in next(it)["id"].tolist()]
    return ids, json.loads(json.dumps(loader.state_dict()))


def test_one_rank_two_workers_then_three_then_two(restart):
    """The same in one process: StatefulDataLoader with 2 workers stopped, resumed on 3 from
    [its state] and stopped, resumed on 2 from [that state]."""
    first, state = _stop(restart(2), 13)
    second, state = _stop(restart(3, [state]), 7)
    rest = [i for b in restart(2, [state]) for i in b["id"].tolist()]
    assert_exactly_once([first, second, rest], EVERYTHING, "epoch 0 over the three jobs")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_epoch_after_one_resumed_in_epoch_one_reads_the_channels_next_fifo(restart,
                                                                                  workers):
    """Stopped in epoch 1; the restarted job's channel starts again at ``_0``: the resumed
    epoch 1 reads ``_0``, the epoch after it ``_1`` (SageMaker makes ``_2`` only after)."""
    loader = restart(workers)
    assert_exactly_once([[i for b in loader for i in b["id"].tolist()]], EVERYTHING, "epoch 0")
    before, state = _stop(loader, 5)
    job = restart(workers, own=state)
    rest = [i for b in job for i in b["id"].tolist()]
    assert_exactly_once([before, rest], EVERYTHING, "epoch 1 over both jobs")
    assert_exactly_once([[i for b in job for i in b["id"].tolist()]], EVERYTHING,
                        "the epoch after the resumed one")

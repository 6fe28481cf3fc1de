"""A Pipe-mode channel shared by every local reader of a host, resumed after a restart (issue
#25): one host's 2 local ranks x 2 StatefulDataLoader workers read one PipeChannel (local rank
0's worker 0 deals its blocks), the job stops mid-epoch, and a restarted job whose channel
carries the same bytes (its FIFOs start again at ``_0``) resumes

- on 3 local ranks x 1 worker, from every old rank's state (gathered with
  ``all_gather_object``): every record of the interrupted epoch exactly once over both jobs, and
  the next epoch whole on the new layout;
- on the same 2 x 2, each rank from its own state (one JSON per rank): each rank's batches are
  exactly the uninterrupted job's, the rest of epoch 0 and then epoch 1.

Real parts: rank processes (tests/scripts/shared_elastic_ranks.py) with torchrun's variables and
a gloo process group on 127.0.0.1 (inside a private network namespace where ``unshare --net``
is permitted), FIFOs fed by writer processes, forked DataLoader workers, a timeout on each job.
"""

from __future__ import annotations

import json

import pytest

from conftest import SCRIPTS
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
TAKE = (5, 9)  # the script's: batches each old rank took before its job stopped
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


def test_the_interrupted_job_stopped_mid_epoch(jobs):
    old = jobs("old", 2)
    assert [len(r["epochs"][0]) for r in old] == list(TAKE)
    assert all(len(b) == BATCH for r in old for b in r["epochs"][0])
    assert_exactly_once([_ids(r["epochs"][0]) for r in old],
                        set(_ids(old[0]["epochs"][0]) + _ids(old[1]["epochs"][0])), "old job")


def test_three_local_ranks_of_one_worker_resume_two_by_two(jobs):
    old, new = jobs("old", 2), jobs("new", 3)
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

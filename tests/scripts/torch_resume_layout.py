"""The process of tests/adapters/test_torch_resume_layout.py (issue #41, item 9): a
StatefulDataLoader with 2 workers checkpointed mid-epoch, its state then loaded the ways a user
might, each into a fresh to_torch() and a fresh loader (forked workers: so a script, not the
test process).

usage: torch_resume_layout.py WORKDIR   (WORKDIR/files/ holds the TFRecord parts; writes
WORKDIR/result.json: for each case the ids of the rest of the epoch, or the error and where
it was raised: "load" (at load_state_dict) or "iterate")
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/: support.examples

from elastic_torch import epoch_ids, loader_of, pipeline, take, write  # noqa: E402


def attempt(load, workers):
    """``load(tds)`` then a fresh loader with ``workers`` workers: its first epoch's ids, or
    the error and its stage."""
    tds = pipeline(WORKDIR, "files").to_torch()
    try:
        load(tds)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"error": f"{type(exc).__name__}: {exc}", "at": "load"}
    try:
        return {"ids": epoch_ids(loader_of(tds, workers))}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}", "at": "iterate"}


def into_loader(state, workers):
    """The old loader's state loaded into a new StatefulDataLoader (torchdata's own path)."""
    tds = pipeline(WORKDIR, "files").to_torch()
    loader = loader_of(tds, workers)
    loader.load_state_dict(state)
    from streamio.errors import UsageError

    ids = []
    stage = "iter"  # iter(loader) starts the workers, which load their states
    try:
        it = iter(loader)
        stage = "next"
        for batch in it:
            ids.extend(batch["id"].tolist())
        return {"ids": ids}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}", "at": "iterate", "stage": stage,
                "usage_error": isinstance(exc, UsageError), "ids_before": len(ids)}


def main():
    ids, state, it = take(loader_of(pipeline(WORKDIR, "files").to_torch(), 2), 5)
    del it
    worker0 = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    result = {
        "before": ids,
        # the loader's whole state, not wrapped in a list: the list form's resume
        "bare-3": attempt(lambda tds: tds.load_state_dict(state), 3),
        "bare-2": attempt(lambda tds: tds.load_state_dict(state), 2),
        "bare-0": attempt(lambda tds: tds.load_state_dict(state), 0),
        # one worker's state alone, in the main process: refused at load_state_dict
        "worker0-3": attempt(lambda tds: tds.load_state_dict(worker0), 3),
        # the 2-worker loader's state into a 3-worker loader (torchdata gives each worker
        # its old state): refused where the dataset's load_state_dict runs, naming the layouts
        "loader-3": into_loader(state, 3),
        # the same layout still resumes exactly
        "loader-2": into_loader(state, 2),
    }
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    write(os.path.join(WORKDIR, "result.json"), result)
    return 0


if __name__ == "__main__":
    WORKDIR = sys.argv[1]
    sys.exit(main())

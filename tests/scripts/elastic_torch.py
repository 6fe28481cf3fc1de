"""The rank processes of tests/adapters/test_elastic_torch.py: a job checkpointed on one layout
(ranks x DataLoader workers) resumed on another.

usage:
  elastic_torch.py job WORKDIR PHASE NRANKS TIMEOUT   start NRANKS rank processes (gloo, the store
                                                     and every socket on 127.0.0.1) and wait
  elastic_torch.py rank WORKDIR PHASE                 one rank (RANK, WORLD_SIZE... from the env)
  elastic_torch.py local WORKDIR                      one process, no process group: a
                                                     StatefulDataLoader's workers 2 -> 3 and 0

WORKDIR/<case>/ holds each case's TFRecord files (written by the test, see CASES there); every
record is ``{id, x = [id] * 4}`` (tests/support/examples.py), so "exactly once" is a check of ids.

Phases (each rank writes WORKDIR/<case>/<phase>-rank<r>.json: the ids it got, per epoch):
- ``old``: 2 ranks x StatefulDataLoader(num_workers=2); rank r takes TAKE[case][r] batches, then
  saves its ``loader.state_dict()`` three ways (what a user would do): gathered with
  ``all_gather_object`` into one JSON file (rank 0 writes it), one JSON file per rank (in its
  result), and a ``torch.distributed.checkpoint`` whose keys name the rank;
- ``same``: 2 ranks x 2 workers, each ``loader.load_state_dict(its own state)``: the rest of
  the epoch, then epoch 1 (today's same-layout resume);
- ``new``: 3 ranks x 1 worker: ``to_torch().load_state_dict(every old rank's state)`` (a list,
  gathered as GATHER[case] says), a fresh StatefulDataLoader: the rest of the epoch, then epoch 1.
"""

import datetime
import glob
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: support.examples

CASES = ("files", "range", "gzip")
TAKE = {"files": (3, 7), "range": (6, 1), "gzip": (2, 5)}  # batches each old rank takes
GATHER = {"files": "all_gather", "range": "per_rank_json", "gzip": "dcp"}
DCP_KEY = "streamio_loader_rank{}"  # one key per rank: DCP keeps one copy of a key all ranks save
NAIVE_KEY = "loader"  # the same key on every rank: what DCP keeps is rank 0's


def pipeline(workdir, case):
    from streamio.pipeline import Dataset
    from support.examples import ID_X

    paths = sorted(glob.glob(os.path.join(workdir, case, "*.tfrecord*")))
    return Dataset(paths, "tfrecord", decoder=ID_X).shuffle(64, seed=11).batch(8).prefetch(2)


def loader_of(tds, num_workers, **options):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(tds, batch_size=None, num_workers=num_workers, **options)


def epoch_ids(loader):
    ids = []
    for batch in loader:
        ids.extend(batch["id"].tolist())
    return ids


def take(loader, batches):
    """The ids of the first ``batches`` batches, and the loader's state after them (through
    JSON, as a checkpoint stores it)."""
    it = iter(loader)
    ids = []
    for _ in range(batches):
        ids.extend(next(it)["id"].tolist())
    state = json.loads(json.dumps(loader.state_dict()))
    return ids, state, it


def write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def old_rank(workdir, case, rank, world):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    ids, state, it = take(loader_of(pipeline(workdir, case).to_torch(), 2), TAKE[case][rank])
    gathered = [None] * world
    dist.all_gather_object(gathered, state)
    if rank == 0:
        write(os.path.join(workdir, case, "gathered.json"), gathered)
    dcp.save({DCP_KEY.format(rank): json.dumps(state)},
             checkpoint_id=os.path.join(workdir, case, "dcp"))
    dcp.save({NAIVE_KEY: json.dumps(state)}, checkpoint_id=os.path.join(workdir, case, "naive"))
    del it  # the job ends here: the workers are stopped mid-epoch
    return {"epochs": [ids], "state": state}


def gathered_states(workdir, case):
    """Every old rank's ``loader.state_dict()``, in rank order, as GATHER[case] says."""
    how = GATHER[case]
    if how == "all_gather":
        with open(os.path.join(workdir, case, "gathered.json")) as f:
            return json.load(f)
    if how == "per_rank_json":
        paths = sorted(glob.glob(os.path.join(workdir, case, "old-rank*.json")))
        return [json.load(open(p))["state"] for p in paths]
    # torch.distributed.checkpoint: the old ranks' keys are in the checkpoint's metadata, so a
    # job of any size can ask for all of them (every rank loads every key).
    import torch.distributed.checkpoint as dcp

    path = os.path.join(workdir, case, "dcp")
    keys = sorted((k for k in dcp.FileSystemReader(path).read_metadata().state_dict_metadata
                   if k.startswith(DCP_KEY.format(""))), key=lambda k: int(k.rsplit("rank", 1)[1]))
    loaded = {k: "" for k in keys}
    dcp.load(loaded, checkpoint_id=path)
    return [json.loads(loaded[k]) for k in keys]


def resumed_rank(workdir, case, rank, phase):
    tds = pipeline(workdir, case).to_torch()
    if phase == "same":
        with open(os.path.join(workdir, case, f"old-rank{rank}.json")) as f:
            state = json.load(f)["state"]
        loader = loader_of(tds, 2)
        loader.load_state_dict(state)
        naive = naive_checkpoint(workdir, case, state)
    else:
        states = gathered_states(workdir, case)
        tds.load_state_dict(states)
        loader = loader_of(tds, 1)
    result = {"epochs": [epoch_ids(loader), epoch_ids(loader)], "gathered": GATHER[case]}
    if phase == "same":
        result["naive"] = naive
    return result


def naive_checkpoint(workdir, case, own):
    """``dcp.save({"loader": state})`` on every rank: does this rank get its own state back,
    and what does resuming from what it got do?"""
    import torch.distributed.checkpoint as dcp

    got = {NAIVE_KEY: ""}
    dcp.load(got, checkpoint_id=os.path.join(workdir, case, "naive"))
    state = json.loads(got[NAIVE_KEY])
    loader = loader_of(pipeline(workdir, case).to_torch(), 2)
    loader.load_state_dict(state)
    try:
        next(iter(loader))
        error = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        error = f"{type(exc).__name__}: {exc}"
    return {"own": state == own, "error": error}


def rank_main(workdir, phase):
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in CASES:
        try:
            if phase == "old":
                result = old_rank(workdir, case, rank, world)
            else:
                result = resumed_rank(workdir, case, rank, phase)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which names it
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["tensorflow_imported"] = "tensorflow" in sys.modules
        write(os.path.join(workdir, case, f"{phase}-rank{rank}.json"), result)
        dist.barrier()  # the next case's files (gathered.json, dcp) are everyone's
    dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(script, workdir, phase, nranks, timeout, others=()):
    """Start ``script rank workdir phase`` as ``nranks`` ranks of one host, as torchrun would
    (its variables, the store on 127.0.0.1), and wait for them, at most ``timeout`` seconds: a
    rank that hangs fails the job, never the CI run. ``others`` (processes feeding the ranks)
    are killed with them if still running. Returns the worst exit code (124: timed out)."""
    port = free_port()
    ranks = []
    for rank in range(nranks):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
        env.update(RANK=str(rank), WORLD_SIZE=str(nranks), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(nranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        ranks.append(subprocess.Popen([sys.executable, script, "rank", workdir, phase],
                                      env=env))
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for proc in ranks:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        print(f"{phase}: ranks still running after {timeout} s", file=sys.stderr)
        return 124
    finally:
        for proc in [*others, *ranks]:  # a writer whose reader stopped early is done too
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return max(codes)


def job_main(workdir, phase, nranks, timeout):
    return run_ranks(__file__, workdir, phase, nranks, timeout)


def local_main(workdir):
    """One process: 2 workers checkpointed, resumed on 3 workers (forked; persistent; spawned)
    and on num_workers=0."""
    case = "files"
    ids, state, it = take(loader_of(pipeline(workdir, case).to_torch(), 2), 5)
    del it
    result = {"before": ids}
    for name, workers, options in (("3", 3, {}), ("0", 0, {}),
                                   ("3-persistent", 3, {"persistent_workers": True}),
                                   ("3-spawn", 3, {"multiprocessing_context": "spawn"})):
        try:
            tds = pipeline(workdir, case).to_torch()
            tds.load_state_dict([state])  # the one old loader's state, in a list
            loader = loader_of(tds, workers, **options)
            result[name] = [epoch_ids(loader), epoch_ids(loader)]
            del loader  # persistent workers stop now, before the next loader forks
        except Exception as exc:  # noqa: BLE001 - reported to the test, which names it
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    write(os.path.join(workdir, "local.json"), result)
    return 0


def main():
    mode, workdir = sys.argv[1], sys.argv[2]
    if mode == "job":
        return job_main(workdir, sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    if mode == "rank":
        rank_main(workdir, sys.argv[3])
        return 0
    return local_main(workdir)


if __name__ == "__main__":
    sys.exit(main())

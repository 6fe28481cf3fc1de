"""The jobs of tests/adapters/test_shared_elastic_ranks.py: one host's local ranks x
StatefulDataLoader workers sharing one PipeChannel (SageMaker Pipe mode), checkpointed mid-epoch
and resumed by a restarted job whose channel carries the same bytes.

usage:
  shared_elastic_ranks.py job WORKDIR PHASE TIMEOUT   feed the channel and start the phase's
                                                      ranks (gloo, the store and every socket on
                                                      127.0.0.1), wait at most TIMEOUT seconds
  shared_elastic_ranks.py rank WORKDIR PHASE          one rank (torchrun's variables in the env)

WORKDIR/records.tfrecord holds the channel's bytes (``{id, x}`` records: support/examples.py);
every job makes ``WORKDIR/train_<epoch>`` afresh (a restarted job's channel starts again at
``_0``) and a writer process feeds it. Each rank writes WORKDIR/<phase>-rank<r>.json: its
batches' ids, per epoch.

Phases (PHASES: local ranks x workers, which states they resume from):
- ``whole``: 2 x 2, two uninterrupted epochs (what the same-layout resume must reproduce);
- ``old``: 2 x 2, rank r takes 5 or 9 batches, then its ``loader.state_dict()`` is gathered
  with ``all_gather_object`` (rank 0 writes WORKDIR/gathered-old.json) and kept in its result
  (one JSON per rank); the job stops mid-epoch;
- ``same``: 2 x 2, ``loader.load_state_dict(its own state)``: the rest of epoch 0, then epoch 1;
- ``new``: 3 x 1, ``to_torch().load_state_dict(the gathered list)``: the rest of epoch 0, then
  epoch 1;
- ``new-stopped``, ``again``: ``new`` stopped mid-epoch in turn, its states resumed on 2 x 2.
"""

import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: support.examples
sys.path.insert(0, HERE)
from elastic_torch import loader_of, run_ranks, write  # noqa: E402

N = 1200
BATCH = 16
TIMEOUT = 120  # the channel's, the dealer's and the process group's (a busy 2-core machine)
#: phase: (local ranks, workers, resumed from, batches each rank takes before its job stops).
#: "from" is None (a fresh job), ("own", phase): each rank loads its own loader state of that
#: phase; ("list", phase): to_torch().load_state_dict(every rank's state of that phase).
PHASES = {"whole": (2, 2, None, None), "old": (2, 2, None, (5, 9)),
          "same": (2, 2, ("own", "old"), None), "new": (3, 1, ("list", "old"), None),
          # an elastic resume interrupted in turn, resumed again on another layout
          "new-stopped": (3, 1, ("list", "old"), (4, 1, 6)),
          "again": (2, 2, ("list", "new-stopped"), None)}


def pipeline(workdir):
    import streamio
    from support.examples import ID_X

    channel = streamio.PipeChannel(os.path.join(workdir, "train"), open_timeout=TIMEOUT,
                                   read_timeout=TIMEOUT)
    return streamio.Dataset(channel, "tfrecord", decoder=ID_X).shuffle(200, seed=5).batch(BATCH)


def epoch_batches(loader):
    return [batch["id"].tolist() for batch in loader]


def stopped(workdir, phase, loader, batches, rank, world):
    """The first ``batches`` batches; the loader's state is gathered with
    ``all_gather_object`` (rank 0 writes WORKDIR/gathered-<phase>.json) and kept in the
    result (one JSON per rank); the job stops mid-epoch."""
    import torch.distributed as dist

    it = iter(loader)
    got = [next(it)["id"].tolist() for _ in range(batches)]
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint file carries it
    gathered = [None] * world
    dist.all_gather_object(gathered, state)
    if rank == 0:
        write(os.path.join(workdir, f"gathered-{phase}.json"), gathered)
    return {"epochs": [got], "state": state}


def rank_main(workdir, phase):
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
    rank, world = dist.get_rank(), dist.get_world_size()
    _, workers, resumed, take = PHASES[phase]
    try:
        tds = pipeline(workdir).to_torch(connect_timeout=TIMEOUT)
        if resumed and resumed[0] == "list":
            with open(os.path.join(workdir, f"gathered-{resumed[1]}.json")) as f:
                tds.load_state_dict(json.load(f))  # every old rank's state: a list
        loader = loader_of(tds, workers)
        if resumed and resumed[0] == "own":
            with open(os.path.join(workdir, f"{resumed[1]}-rank{rank}.json")) as f:
                loader.load_state_dict(json.load(f)["state"])
        if take:
            result = stopped(workdir, phase, loader, take[rank], rank, world)
        else:
            result = {"epochs": [epoch_batches(loader), epoch_batches(loader)]}
    except Exception as exc:  # noqa: BLE001 - reported to the test, which names it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    write(os.path.join(workdir, f"{phase}-rank{rank}.json"), result)
    # Every rank holds on until all are done: local rank 0's worker 0 deals to the others.
    dist.barrier()
    dist.destroy_process_group()


def feed(workdir, epochs):
    """The restarted job's channel: ``train_<epoch>`` made afresh, a writer process each."""
    writers = []
    for epoch in range(epochs):
        path = os.path.join(workdir, f"train_{epoch}")
        if os.path.exists(path):
            os.unlink(path)
        os.mkfifo(path)
        writers.append(subprocess.Popen([sys.executable, os.path.join(HERE, "fifo_writer.py"),
                                         path, os.path.join(workdir, "records.tfrecord")]))
    return writers


def job_main(workdir, phase, timeout):
    """Start the ranks as torchrun would on one host (its variables, the store on 127.0.0.1)
    and wait for them, at most ``timeout`` seconds: a rank that hangs fails the job."""
    nranks, _, _, take = PHASES[phase]
    writers = feed(workdir, 1 if take else 2)
    return run_ranks(__file__, workdir, phase, nranks, timeout, others=writers)


def main():
    mode, workdir, phase = sys.argv[1:4]
    if mode == "job":
        return job_main(workdir, phase, float(sys.argv[4]))
    rank_main(workdir, phase)
    return 0


if __name__ == "__main__":
    sys.exit(main())

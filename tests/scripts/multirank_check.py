"""Ranks of one host sharing one FIFO, for tests/adapters/test_shared_stream_multirank.py.

usage:
  multirank_check.py rank OUT SOURCE [options]   one rank: DataLoader over SOURCE, writes OUT
  multirank_check.py write FIFO DATA EPOCHS MARKERS RANKS
                                                 a writer that refills one FIFO path each epoch,
                                                 after every rank finished the previous one

SOURCE is a FIFO path, or channel:PREFIX for a PipeChannel (one FIFO per epoch). Without
--rank the rank comes from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
which the test sets or a real ``torchrun`` launcher does; with it, to_torch() gets them as
arguments. ``{rank}`` in OUT is replaced by the rank (torchrun gives every rank the same
arguments).
"""

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.examples import ID_X  # noqa: E402

DECODER = ID_X
HERE = os.path.dirname(os.path.abspath(__file__))


def plus_one(batch):
    # Rows stay together through the workers: x is id + 1 after this.
    return {"id": batch["id"], "x": batch["x"] + 1}


class Slow:
    """A map that takes its time, so that a kill lands mid-epoch (picklable for spawn)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return batch


def rank_main(args):
    import streamio
    from streamio import Dataset
    from torch.utils.data import DataLoader

    rank = args.rank if args.rank is not None else int(os.environ["RANK"])
    args.out = args.out.replace("{rank}", str(rank))
    result = {"epochs": [], "error": None, "batches": [],
              "torchrun": os.environ.get("TORCHELASTIC_RUN_ID") is not None}
    if args.delay:
        time.sleep(args.delay)  # a rank that starts late
    if args.source.startswith("channel:"):
        # Generous: on a loaded 2-core machine the writer process may take long to start; the
        # test's hang guard bounds the whole run.
        source = streamio.PipeChannel(args.source[len("channel:"):], open_timeout=200,
                                      read_timeout=200)
    else:
        source = args.source
    ds = Dataset(source, "tfrecord", decoder=DECODER).shuffle(32, seed=3).batch(8).map(plus_one)
    if args.slow:
        ds = ds.map(Slow(args.slow))
    options = {"connect_timeout": args.connect_timeout}
    if args.node_streams:
        options["node_streams"] = args.node_streams
    if args.rank is not None:
        options.update(rank=args.rank, world_size=args.world, local_rank=args.local_rank,
                       local_world_size=args.local_world)
    loader = DataLoader(ds.to_torch(**options), batch_size=None, num_workers=args.workers)
    batches_of = loader
    if args.ddp:
        # A real process group (gloo, 127.0.0.1) and to_device's even_batches: ranks in
        # lockstep, one all-reduce per batch, as DDP training runs.
        import torch.distributed as dist
        from streamio.torch import to_device
        dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
        batches_of = to_device(loader, "cpu", even_batches=args.ddp)
    batches = 0
    try:
        for epoch in range(args.epochs):
            ids = []
            count = 0
            for batch in batches_of:
                count += 1
                assert (batch["x"][:, 0] == batch["id"] + 1).all()
                ids.extend(batch["id"].tolist())
                batches += 1
                if batches == 1:
                    open(args.out + ".first", "w").close()  # this rank has been served
                    # Go on only once the other rank is served too (it holds blocks then, and
                    # a kill lands mid-epoch however slowly the machine starts processes).
                    deadline = time.monotonic() + 120
                    while args.sync_first and not os.path.exists(args.sync_first) \
                            and time.monotonic() < deadline:
                        time.sleep(0.05)
                if batches == args.die_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # a rank that dies mid-epoch
            result["epochs"].append(ids)
            result["batches"].append(count)
            if args.markers:
                open(os.path.join(args.markers, f"e{epoch}-r{rank}"), "w").close()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = {"type": type(exc).__name__, "message": str(exc),
                           "streamio": isinstance(exc, streamio.StreamioError)}
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(args.out + ".tmp", args.out)


def write_main(fifo, data, epochs, markers, ranks):
    """Refill one FIFO path each epoch, after every rank finished the previous epoch (the
    reader has closed it by then, so the next open meets the next epoch's reader)."""
    import subprocess
    for epoch in range(epochs):
        if epoch:
            names = [os.path.join(markers, f"e{epoch - 1}-r{r}") for r in range(ranks)]
            deadline = time.monotonic() + 120
            while not all(os.path.exists(n) for n in names):
                if time.monotonic() > deadline:
                    raise SystemExit("the ranks did not finish the epoch")
                time.sleep(0.05)
        subprocess.run([sys.executable, os.path.join(HERE, "fifo_writer.py"), fifo, data,
                        "1", "999", "4093", "65537"], check=True, timeout=120)


def main():
    if sys.argv[1] == "write":
        fifo, data, epochs, markers, ranks = sys.argv[2:7]
        write_main(fifo, data, int(epochs), markers, int(ranks))
        return
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("out")
    p.add_argument("source")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--local-rank", type=int)
    p.add_argument("--local-world", type=int)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--die-after", type=int, default=-1)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--sync-first", help="after the first batch, wait for this file")
    p.add_argument("--node-streams")
    # Longer than the library's default: a loaded 2-core machine starting 16 processes that
    # import torch can take minutes; the test's hang guard bounds the whole run.
    p.add_argument("--connect-timeout", type=float, default=200.0)
    p.add_argument("--markers")
    p.add_argument("--ddp", help="init a gloo group and use to_device(even_batches=DDP)")
    rank_main(p.parse_args())


if __name__ == "__main__":
    main()

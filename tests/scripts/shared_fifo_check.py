"""DataLoader workers sharing one FIFO, for tests/adapters/test_shared_fifo.py, run in a fresh
process (the pytest process may have imported TensorFlow, and forking after that can deadlock).

usage: shared_fifo_check.py WORKDIR SCENARIO   -> prints one JSON object
"""

import json
import os
import signal
import subprocess
import sys
import time
import traceback

import numpy as np
from torch.utils.data import DataLoader

import streamio
from streamio import Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.examples import ID_X, write_id_examples  # noqa: E402

N = 1000
EPOCHS = 3
DECODER = ID_X
HERE = os.path.dirname(os.path.abspath(__file__))


def plus_one(batch):
    # A map in the workers (threads): ids travel through it unchanged, x gains one.
    return {"id": batch["id"], "x": batch["x"] + 1}


#: "VICTIM:FLAG" in the DataLoader workers' environment: worker VICTIM kills itself (SIGKILL)
#: in the map below once the file FLAG exists (see kill_worker).
KILL_ENV = "STREAMIO_TEST_KILL_WORKER"


def slow(batch):
    order = os.environ.get(KILL_ENV)
    if order:
        victim, flag = order.split(":", 1)
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None and info.id == int(victim) and os.path.exists(flag):
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
    return batch


def feed(fifo, data):
    # Odd piece sizes, from another process, as SageMaker would write.
    return subprocess.Popen([sys.executable, os.path.join(HERE, "fifo_writer.py"), fifo, data,
                             "1", "999", "4093", "65537"])


def ids_of(loader):
    ids = []
    for batch in loader:
        assert (batch["x"][:, 0] == batch["id"] + 1).all()  # rows stay together
        ids.extend(batch["id"].tolist())
    return ids


def pipeline(source, workers_map=True):
    ds = Dataset(source, "tfrecord", decoder=DECODER).shuffle(64, seed=1).batch(16)
    return ds.map(plus_one, num_parallel=2) if workers_map else ds


def plain_fifo(workdir, data, workers, persistent):
    fifo = os.path.join(workdir, f"plain-{workers}-{int(persistent)}.fifo")
    os.mkfifo(fifo)
    tds = pipeline(fifo).to_torch()
    loader = DataLoader(tds, batch_size=None, num_workers=workers, persistent_workers=persistent)
    epochs = []
    for _ in range(EPOCHS):
        writer = feed(fifo, data)
        epochs.append(ids_of(loader))
        writer.wait(timeout=60)
    return epochs


def pipe_channel(workdir, data, workers, persistent):
    prefix = os.path.join(workdir, f"channel-{workers}-{int(persistent)}")
    writer = subprocess.Popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel",
                               prefix, "--epochs", str(EPOCHS), "--open-timeout", "60", data],
                              stderr=subprocess.DEVNULL)
    channel = streamio.PipeChannel(prefix, open_timeout=60, read_timeout=60)
    loader = DataLoader(pipeline(channel).to_torch(), batch_size=None, num_workers=workers,
                        persistent_workers=persistent)
    try:
        return [ids_of(loader) for _ in range(EPOCHS)]
    finally:
        writer.wait(timeout=60)


def kill_worker(workdir, data, victim):
    """Worker ``victim`` of a DataLoader dies by SIGKILL mid-epoch; the epoch must end with an
    error. It kills itself, in the map that runs in its main thread while streamio iterates,
    once the first batch has arrived: a worker killed from outside at any moment may die while
    it holds torch's own lock of the DataLoader's shared done-event (its loop checks the event
    after each index it takes), and the DataLoader then waits on that lock forever (about one
    run in fifteen here; pytorch/pytorch#21554 is the family of such hangs). That is torch's
    hang, not streamio's; ``direct_kill`` kills workers from outside at any moment, with no
    DataLoader."""
    fifo = os.path.join(workdir, f"kill-{victim}.fifo")
    os.mkfifo(fifo)
    writer = feed(fifo, data)
    ds = Dataset(fifo, "tfrecord", decoder=DECODER).batch(16).map(slow)
    loader = DataLoader(ds.to_torch(connect_timeout=20), batch_size=None, num_workers=3)
    flag = os.path.join(workdir, f"kill-{victim}.now")
    os.environ[KILL_ENV] = f"{victim}:{flag}"  # the workers start with this environment
    try:
        it = iter(loader)
    finally:
        del os.environ[KILL_ENV]
    delivered = 0
    t0 = time.monotonic()
    try:
        next(it)
        delivered += 1
        with open(flag, "x"):
            pass
        for _ in it:
            delivered += 1
        outcome = {"error": None}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        # (No file reads here: the DataLoader's SIGCHLD handler may raise again at any point.)
        frames = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__)]
        outcome = {"error": type(exc).__name__, "message": str(exc), "raised_in": frames[-1]}
    outcome.update(seconds=time.monotonic() - t0, delivered=delivered)
    del it, loader
    writer.kill()
    writer.wait()
    return outcome


def _direct_worker(tds, worker, num_workers, report, go):
    """One 'DataLoader worker' without a DataLoader: iterate this worker's plan, say how it ended.
    After its first batch it says so and waits for the file ``go`` (so that the kill lands while
    every worker still has blocks of its share to take; see direct_kill)."""
    count = 0
    try:
        for _ in tds.plan(epoch=0, worker=worker, num_workers=num_workers):
            count += 1
            if count == 1:
                report.send(("started", os.getpid()))
                deadline = time.monotonic() + 60
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
        report.send(("done", count, None, None))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        report.send(("done", count, type(exc).__name__, str(exc)))


def direct_kill(workdir, data, victim):
    """Three worker processes share one FIFO; one is killed mid-epoch: every other one must end
    with an error saying what happened, within the time limit (no DataLoader to notice for them).
    Each reports through its own pipe (a killed writer could leave a shared Queue's lock held).

    Mid-epoch for every worker: each waits after its first batch until the victim is dead. (The
    kill once came when the victim reported its first batch, whenever the others were: under
    load, a worker that started seconds earlier had taken its whole share and its END by then,
    and rightly ended without an error: its records were all delivered. A worker whose share is
    out is not told of a later death; see streamio.sharing.stream.)"""
    import multiprocessing
    from multiprocessing.connection import wait

    fifo = os.path.join(workdir, f"direct-{victim}.fifo")
    os.mkfifo(fifo)
    go = os.path.join(workdir, f"direct-{victim}.go")
    writer = feed(fifo, data)
    ds = Dataset(fifo, "tfrecord", decoder=DECODER).batch(16).map(slow)
    tds = ds.to_torch(connect_timeout=30)
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(3)]
    procs = [ctx.Process(target=_direct_worker, args=(tds, w, 3, pipes[w][1], go))
             for w in range(3)]
    for proc in procs:
        proc.start()
    pids = {}
    for w in range(3):
        kind, pids[w] = pipes[w][0].recv()  # every worker has its first batch and waits
    t0 = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    procs[victim].join(timeout=30)
    open(go, "x").close()
    ends = {}
    readers = {pipes[w][0]: w for w in range(3) if w != victim}
    deadline = time.monotonic() + 120
    while len(ends) < 2 and time.monotonic() < deadline:
        for conn in wait(list(readers), timeout=5):
            message = conn.recv()
            if message[0] == "done":
                ends[str(readers[conn])] = {"count": message[1], "error": message[2],
                                            "message": message[3]}
    for proc in procs:
        proc.join(timeout=30)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    writer.kill()
    writer.wait()
    return {"others": ends, "seconds": time.monotonic() - t0}


def nap(batch):
    time.sleep(0.02)
    return np.array([len(r) for r in batch])


def big_records(workdir):
    """100 KB records: a block (64 of them) is far larger than a socket's buffer, so a dealer
    that sent blocks nobody was reading yet would wait on a worker the DataLoader is not asking
    (this hung about one run in four before workers asked only when about to read)."""
    path = os.path.join(workdir, "big.tfrecord")
    streamio.write_records(path, "tfrecord", (bytes([i % 256]) * 100_000 for i in range(2000)))
    counts = []
    for epoch in range(3):
        fifo = os.path.join(workdir, f"big-{epoch}.fifo")
        os.mkfifo(fifo)
        writer = feed(fifo, path)
        ds = Dataset(fifo, "tfrecord").batch(64).map(nap)
        counts.append(sum(len(b) for b in DataLoader(ds.to_torch(), batch_size=None,
                                                     num_workers=2)))
        writer.wait(timeout=60)
    return counts


def corrupt(workdir, data):
    fifo = os.path.join(workdir, "corrupt.fifo")
    os.mkfifo(fifo)
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # a CRC fails in the middle of the stream
    bad = os.path.join(workdir, "bad.tfrecord")
    open(bad, "wb").write(raw)
    writer = feed(fifo, bad)
    ds = Dataset(fifo, "tfrecord", decoder=DECODER).batch(16)
    ids = []
    try:
        for batch in DataLoader(ds.to_torch(), batch_size=None, num_workers=2):
            ids.extend(batch["id"].tolist())
        outcome = {"error": None}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    writer.wait(timeout=60)
    outcome["ids"] = ids
    return outcome


def main():
    workdir, scenario = sys.argv[1], sys.argv[2]
    data = write_id_examples(os.path.join(workdir, "data.tfrecord"), range(N))
    if scenario == "epochs":
        result = {f"{kind}-{w}-{int(p)}": fn(workdir, data, w, p)
                  for kind, fn in (("fifo", plain_fifo), ("channel", pipe_channel))
                  for w, p in ((2, False), (3, True))}
    elif scenario == "kill":
        result = {}
        for victim in (1, 0):
            try:
                result[f"worker{victim}"] = kill_worker(workdir, data, victim)
            except RuntimeError as exc:  # the SIGCHLD handler again, after the first error
                result.setdefault(f"worker{victim}", {"error": type(exc).__name__,
                                                      "message": str(exc), "raised_in": "",
                                                      "delivered": 0})
    elif scenario == "direct":
        result = {f"worker{v}": direct_kill(workdir, data, v) for v in (1, 0)}
    elif scenario == "big":
        result = {"counts": big_records(workdir)}
    elif scenario == "corrupt":
        result = corrupt(workdir, data)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()

"""Processes for tests/adapters/test_shared_stream_stall.py: a reader that stops reading, a dealer
that stops, the local ranks of two runs of one job, and a squatter of another uid.

usage:
  shared_stall.py rogue ADDRESS_HEX RANK WORKER NUM_WORKERS LOCAL_WORLD
      connects as that reader, asks for blocks and never reads (prints its pid)
  shared_stall.py dealer DATA TOKEN TIMEOUT
      worker 0 of 2 over DATA (the dealer); prints its pid at its first record, then reads on
  shared_stall.py rank DATA LOCAL_RANK OUT      local rank LOCAL_RANK of 2 (1 worker each)
  shared_stall.py launch DATA OUT_PREFIX        a launcher: starts both ranks, waits for them
  shared_stall.py runs WORKDIR DATA NOBODY_PYTHON
      as root in a private network namespace: run 1, uid 65534 squats its address, run 2;
      prints one JSON object
"""

import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

HERE = os.path.abspath(__file__)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def rogue(address_hex, rank, worker, num_workers, local_world):
    """(Imports nothing of streamio: it is up at once; the hello is the wire's, by hand.)"""
    import struct

    deadline = time.monotonic() + 30
    while True:  # until the dealer listens
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(bytes.fromhex(address_hex).decode("latin-1"))
            break
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    hello = struct.pack("<4sIIIII", b"sio\x02", int(rank), int(worker), int(num_workers),
                        int(local_world), 0)
    sock.sendall(hello + b"W" * 64)
    print(os.getpid(), flush=True)
    time.sleep(600)  # holds its place and reads nothing


def dealer(data, token, timeout):
    from streamio import Dataset
    from streamio.sharing.stream import SharedStreamFeed

    ds = Dataset(data, "tfrecord")
    feed = SharedStreamFeed(ds, token=token, epoch=0, worker=0, num_workers=2,
                            connect_timeout=float(timeout))
    for i, _ in enumerate(ds._with_feed(feed)):
        if i == 0:
            print(os.getpid(), flush=True)
        time.sleep(0.01)


def rank(data, local_rank, out):
    from streamio import Dataset
    from streamio.sharing.stream import SharedStreamFeed, stream_address

    ds = Dataset(data, "tfrecord")
    address = stream_address([data], 0)
    result = {"address": address.encode("latin-1").hex(), "ids": [], "error": None}
    feed = SharedStreamFeed(ds, address=address, epoch=0, worker=0, num_workers=1,
                            local_rank=int(local_rank), local_world_size=2, connect_timeout=20)
    try:
        result["ids"] = [int(r) for r in ds._with_feed(feed)]
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {exc}"
    with open(out, "w") as f:
        json.dump(result, f)


def launch(data, prefix):
    ranks = [subprocess.Popen([sys.executable, HERE, "rank", data, str(r), f"{prefix}-{r}.json"])
             for r in (0, 1)]
    for proc in ranks:
        proc.wait(timeout=120)


def runs(workdir, data, nobody_python):
    def run(n):
        prefix = os.path.join(workdir, f"run{n}")
        subprocess.run([sys.executable, HERE, "launch", data, prefix], timeout=150, check=True)
        return [json.load(open(f"{prefix}-{r}.json")) for r in (0, 1)]

    first = run(1)
    env = dict(os.environ, PYTHONPATH="")  # the squatter needs no streamio (nor this file)
    code = ("import socket, time; s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM);"
            f" s.bind(bytes.fromhex({first[0]['address']!r}).decode('latin-1')); s.listen(8);"
            " print('bound', flush=True); time.sleep(600)")
    squatter = subprocess.Popen(NOBODY + [nobody_python, "-c", code],
                                stdout=subprocess.PIPE, text=True, env=env, cwd="/")
    try:
        bound = squatter.stdout.readline().strip() == "bound"
        second = run(2)
    finally:
        squatter.kill()
        squatter.wait()
    print(json.dumps({"first": first, "second": second, "squatted": bound}))


if __name__ == "__main__":
    COMMANDS = {"rogue": rogue, "dealer": dealer, "rank": rank, "launch": launch, "runs": runs}
    COMMANDS[sys.argv[1]](*sys.argv[2:])

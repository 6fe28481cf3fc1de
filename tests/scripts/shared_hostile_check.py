"""A training job sharing one stream while another local user attacks it, for
tests/adapters/test_shared_stream_hostile.py. Runs as root inside a private network namespace
(``unshare --net``: abstract sockets are per namespace, so nothing outside is reachable).

usage: shared_hostile_check.py WORKDIR HOSTILE_PYTHON   -> prints one JSON object

- the attacker: tests/scripts/shared_hostile.py as uid 65534 (``setpriv``), started first;
- job "ranks": two local ranks (torchrun's variables) x 2 DataLoader workers share a PipeChannel
  of N records, two epochs (local rank 0's worker 0 deals);
- job "solo": one rank whose 2 DataLoader workers share another PipeChannel, two epochs;
- "planted": a reader, then a dealer, told to use an address the attacker holds.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from streamio import Dataset
from streamio.sharing.stream import SharedStreamFeed

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.examples import id_example, write_id_examples  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
N = 2000
PORT = 29533
PLANTED = "streamio-planted-victim"
_JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def env(**extra):
    out = {k: v for k, v in os.environ.items() if k not in _JOB_VARIABLES}
    out.update({k: str(v) for k, v in extra.items()})
    return out


def wait_for(path, seconds, procs=()):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            return False
        time.sleep(0.05)
    return True


def outcome(data, make_feed):
    """How one reader of a planted address ends: (error type, message, records)."""
    ds = Dataset(data, "tfrecord")
    got = 0
    try:
        for _ in ds._with_feed(make_feed(ds)):
            got += 1
        return {"error": None, "records": got}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"error": type(exc).__name__, "message": str(exc), "records": got}


def planted(data):
    address = "\0" + PLANTED
    return {
        "client": outcome(data, lambda ds: SharedStreamFeed(
            ds, address=address, epoch=0, worker=1, num_workers=2, local_rank=1,
            local_world_size=2, connect_timeout=5)),
        "dealer": outcome(data, lambda ds: SharedStreamFeed(
            ds, address=address, epoch=0, worker=0, num_workers=1, local_rank=0,
            local_world_size=2, connect_timeout=5)),
    }


def main(workdir, hostile_python):
    data = os.path.join(workdir, "data.tfrecord")
    write_id_examples(data, range(N))
    pub = tempfile.mkdtemp(prefix="streamio-hostile-")  # the attacker's own corner
    os.chmod(pub, 0o777)
    with open(os.path.join(pub, "inject.txt"), "w") as f:
        f.write("\n".join(id_example(10**6 + i).hex() for i in range(64)))
    with open(os.path.join(pub, "plant"), "w") as f:
        f.write(PLANTED)
    for name in ("inject.txt", "plant"):
        os.chmod(os.path.join(pub, name), 0o644)
    prefix, solo = os.path.join(workdir, "train"), os.path.join(workdir, "solo")
    from streamio.sharing import _local_ipc
    key = os.path.join(_local_ipc.private_dir(), _local_ipc.KEY_NAME)
    procs = []
    try:
        hostile = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", hostile_python,
             os.path.join(HERE, "shared_hostile.py"), pub, prefix, "127.0.0.1", str(PORT),
             os.path.join(pub, "inject.txt"), key])
        procs.append(hostile)
        if not wait_for(os.path.join(pub, "ready"), 60, [hostile]):
            raise SystemExit("the attacker did not start")
        for channel in (prefix, solo):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "streamio", "serve-pipe", "--channel", channel,
                 "--epochs", "2", "--open-timeout", "90", data], stderr=subprocess.DEVNULL))
        outs = {}
        script = os.path.join(HERE, "multirank_check.py")
        for name, source, extra in [
                ("rank0", prefix, dict(RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2,
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT)),
                ("rank1", prefix, dict(RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2,
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT)),
                ("solo", solo, dict(RANK=0, WORLD_SIZE=1))]:
            outs[name] = os.path.join(workdir, name + ".json")
            procs.append(subprocess.Popen(
                [sys.executable, script, "rank", outs[name], "channel:" + source, "--workers",
                 "2", "--connect-timeout", "60"], env=env(**extra)))
        ranks = procs[-3:]
        results = {}
        for name, out in outs.items():
            wait_for(out, 150, [ranks[list(outs).index(name)]])
            results[name] = json.load(open(out)) if os.path.exists(out) else None
        results["planted"] = planted(data)
        open(os.path.join(pub, "stop"), "w").close()
        wait_for(os.path.join(pub, "report.json"), 30, [hostile])
        report = os.path.join(pub, "report.json")
        results["hostile"] = json.load(open(report)) if os.path.exists(report) else None
        results["pwned"] = os.path.exists(os.path.join(pub, "pwned"))
        key_mode = os.stat(key).st_mode if os.path.exists(key) else None
        results["key_mode"] = None if key_mode is None else key_mode & 0o777
        print(json.dumps(results))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(pub, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

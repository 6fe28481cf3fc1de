"""The PyTorch scenarios of the multi-host harness (run by driver.py in the outer namespace):
torchrun across hosts, SageMaker multi-host channels, and a neighbour host trying to reach a
host's shared-stream dealer. Each returns what the ranks delivered; the checks are the tests'."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time

import driver
import netns

OUT = "/tmp/out"  # on each host: its own /tmp


def serve_pipe(host: netns.Host, channel: str, epochs: int, files: list) -> subprocess.Popen:
    """``streamio serve-pipe`` on ``host``: one FIFO per epoch, ``<channel>_<epoch>``."""
    return host.popen([sys.executable, "-m", "streamio", "serve-pipe", "--channel", channel,
                       "--epochs", str(epochs), "--open-timeout", "300", *files],
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(procs) -> list:
    """Each writer's exit status and the tail of its stderr (killed if still running)."""
    done = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        done.append([proc.returncode, (err or "")[-1000:]])
    return done


def torchrun_2x2(h: driver.Harness) -> dict:
    """2 hosts x 2 local ranks x 2 workers: files over HTTP, objects over S3, and one Pipe-mode
    FIFO per host (every host's carries all records: node_streams='replicated'; each its own
    half: 'sharded'), 2 epochs each."""
    hosts = h.hosts[:2]
    writers = []
    for i, host in enumerate(hosts):
        files = h.fetch(host, h.parts, "/tmp/data")
        writers.append(serve_pipe(host, "/tmp/ml/all", 2, files))
        writers.append(serve_pipe(host, "/tmp/ml/own", 2, files[i::2]))
    cases = [
        {"name": "http", "epochs": 2, "source": {"urls": [h.http(n) for n in h.parts]}},
        {"name": "s3", "epochs": 2, "source": {"urls": [h.s3(n) for n in h.parts]}},
        {"name": "pipe_replicated", "epochs": 2,
         "source": {"pipe": "/tmp/ml/all", "node_streams": "replicated"}},
        {"name": "pipe_sharded", "epochs": 2,
         "source": {"pipe": "/tmp/ml/own", "node_streams": "sharded"}},
    ]
    result = driver.torchrun(hosts, OUT, cases)
    result["writers"] = stop(writers)
    return result


def _sagemaker_config(h: driver.Harness, host: netns.Host, i: int, hosts: int) -> list:
    """``/tmp/ml`` on ``host`` as SageMaker lays it out for host ``algo-<i+1>``: four channels
    (File/Pipe x FullyReplicated/ShardedByS3Key); the Pipe channels' writers."""
    channels = {}
    for mode in ("File", "Pipe"):
        for dist, tag in (("FullyReplicated", "fr"), ("ShardedByS3Key", "sh")):
            channels[f"{tag}{mode.lower()}"] = {
                "TrainingInputMode": mode, "ContentType": "application/x-tfrecord",
                "S3DistributionType": dist, "RecordWrapperType": "None"}
    resource = {"current_host": f"algo-{i + 1}", "hosts": [f"algo-{k + 1}" for k in range(hosts)],
                "network_interface_name": "eth0"}
    code = ("import json,os,sys\nos.makedirs('/tmp/ml/input/config',exist_ok=True)\n"
            "for n,t in (('inputdataconfig',sys.argv[1]),('resourceconfig',sys.argv[2])):\n"
            " open(f'/tmp/ml/input/config/{n}.json','w').write(t)\n")
    host.python("-c", code, json.dumps(channels), json.dumps(resource))
    mine = h.parts[i::hosts]  # ShardedByS3Key: SageMaker gives each host its own objects
    h.fetch(host, h.parts, "/tmp/ml/input/data/frfile")
    h.fetch(host, mine, "/tmp/ml/input/data/shfile")
    all_files = h.fetch(host, h.parts, "/tmp/pipe-data")
    own = [f"/tmp/pipe-data/{n}" for n in mine]
    return [serve_pipe(host, "/tmp/ml/input/data/frpipe", 1, all_files),
            serve_pipe(host, "/tmp/ml/input/data/shpipe", 1, own)]


def sagemaker_2x2(h: driver.Harness) -> dict:
    """SageMaker's multi-host layout on 2 hosts (algo-1, algo-2), torchrun's 2 ranks on each:
    ``sagemaker.channel()`` of File and Pipe channels, FullyReplicated and ShardedByS3Key."""
    hosts = h.hosts[:2]
    writers = []
    for i, host in enumerate(hosts):
        writers += _sagemaker_config(h, host, i, len(hosts))
    cases = [{"name": name, "epochs": 1, "source": {"sagemaker": name, "root": "/tmp/ml"}}
             for name in ("frfile", "shfile", "frpipe", "shpipe")]
    result = driver.torchrun(hosts, "/tmp/out-sm", cases)
    result["writers"] = stop(writers)
    return result


def _abstract_names(host: netns.Host) -> set:
    """The abstract Unix socket names bound in ``host``'s network namespace."""
    table = host.run_ok(["cat", "/proc/net/unix"])
    return {line.split()[-1] for line in table.splitlines()[1:]
            if line.split()[-1].startswith("@streamio-")}


_CONNECT = """import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\\0" + sys.argv[1][1:])
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


def hostile_neighbour(h: driver.Harness) -> dict:
    """Host 0's two local ranks share one FIFO through a dealer (an abstract Unix socket);
    while it waits for rank 1, host 1 (same user, same machine) and host 0 itself try to connect
    to its name. Then rank 1 starts and the epoch must deliver every record once."""
    host0, host1 = h.hosts[:2]
    files = h.fetch(host0, h.parts, "/tmp/hostile-data")
    writer = serve_pipe(host0, "/tmp/ml/hostile", 1, files)
    rank_cmd = [sys.executable, str(driver.HERE / "local_rank.py"), "/tmp/ml/hostile"]
    before = _abstract_names(host0)
    rank0 = host0.popen(rank_cmd + ["0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
    names: set = set()
    deadline = time.monotonic() + 120
    while not names and time.monotonic() < deadline and rank0.poll() is None:
        time.sleep(0.2)
        names = _abstract_names(host0) - before
    out = {"dealer_names": sorted(names), "host1_sees": sorted(_abstract_names(host1)),
           "from_host1": {}, "from_host0": {}, "from_storage": None}
    for name in names:
        out["from_host1"][name] = host1.python("-c", _CONNECT, name).strip()
        out["from_storage"] = h.net.storage.python("-c", _CONNECT, name).strip()
        out["from_host0"][name] = host0.python("-c", _CONNECT, name).strip()
    # What else of host 0's a neighbour could reach: its FIFO, its key file, its /dev/shm.
    probe = ("import os,sys\nprint(' '.join(p for p in sys.argv[1:] if os.path.exists(p)))")
    paths = ["/tmp/hostile-data", f"{netns.HOME}/.cache/streamio/shared-stream.key"]
    out["host0_paths"] = host0.python("-c", probe, *paths).split()
    out["host1_paths"] = host1.python("-c", probe, *paths).split()
    rank1 = host0.popen(rank_cmd + ["1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)
    out["ranks"] = []
    for proc in (rank0, rank1):
        try:
            so, se = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            so, se = proc.communicate()
        out["ranks"].append({"rc": proc.returncode, "stdout": so[-200000:], "stderr": se[-3000:]})
    out["writers"] = stop([writer])
    return out


SCENARIOS = {"torchrun": torchrun_2x2, "sagemaker": sagemaker_2x2, "hostile": hostile_neighbour}


def elastic(h: driver.Harness) -> dict:
    """2 hosts x 2 ranks read part of an epoch over HTTP and checkpoint (DCP, on the shared
    filesystem); the job resumes on 1 host x 3 ranks and, from the same checkpoint, on 3 hosts
    x 1 rank."""
    urls = [h.http(n) for n in h.parts]
    spec = {"urls": urls, "checkpoint": "/tmp/shared/elastic-ckpt"}
    out = {"old": driver.torchrun(h.hosts[:2], "/tmp/out-el-old", dict(spec, phase="old"),
                                  script="elastic_rank.py")}
    out["one_host"] = driver.torchrun(h.hosts[:1], "/tmp/out-el-1x3", dict(spec, phase="new"),
                                      nproc=3, script="elastic_rank.py")
    out["three_hosts"] = driver.torchrun(h.hosts[:3], "/tmp/out-el-3x1",
                                         dict(spec, phase="new"), nproc=1,
                                         script="elastic_rank.py")
    return out


SCENARIOS["elastic"] = elastic


def _ray_start(host: netns.Host, env: dict, *args: str) -> str:
    return host.python("-m", "ray.scripts.scripts", "start", "--node-ip-address", host.address,
                       "--num-cpus", "1", "--object-store-memory", str(128 << 20),
                       "--disable-usage-stats", *args, env=env, timeout=240)


def ray_cluster(h: driver.Harness) -> dict:
    """A Ray cluster across hosts: the head on host 0, a worker node on host 1 (each its own
    raylet and object store, at its own address); the job on host 0."""
    head, worker = h.hosts[:2]
    # Ray's token authentication, the token given to every node (as a cluster would): a node
    # that would fall back on ~/.ray/auth_token reads another job's token on a shared home.
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    out = {"head": _ray_start(head, env, "--head", "--port", "6379", "--include-dashboard",
                              "false")[-500:]}
    out["worker"] = _ray_start(worker, env, "--address", f"{head.address}:6379")[-500:]
    job = head.python(str(driver.HERE / "ray_job.py"), json.dumps([h.http(n) for n in h.parts]),
                      json.dumps([h.s3(n) for n in h.parts]), "s3://data/ray-out/part",
                      env=env, timeout=400)
    out.update(json.loads(job.splitlines()[-1]))
    for host in (worker, head):
        host.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], env=env,
                 timeout=60)
    return out


SCENARIOS["ray"] = ray_cluster

"""The multi-host harness's driver: builds the hosts (tests/multihost/netns.py), starts the storage
host's servers, runs the scenarios named on its command line and prints one JSON object
``{scenario: result}`` (a scenario that raised gives ``{"driver_error": text}``).

usage: python driver.py SCENARIO[,SCENARIO...] WORKDIR [--rounds N]

Run it through :func:`netns.outer_command` (``unshare --net --mount --pid ...``): it expects to
be alone in a fresh network namespace. The scenarios live in ``scenarios_*.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # netns, scenarios_*, support (tests/)

import netns  # noqa: E402
from support.examples import write_id_parts  # noqa: E402

#: The test data: uneven parts, so that whole files and byte ranges both split unevenly.
PART_SIZES = (700, 300, 520, 480, 610, 390)
RECORDS = sum(PART_SIZES)
HTTP_PORT, S3_PORT = 8000, 5000
STORAGE = f"{netns.STORAGE_ADDRESS}"


class Harness:
    """The network, the data and the storage servers: what every scenario is given."""

    def __init__(self, workdir: Path, hosts: int, big: bool) -> None:
        self.workdir = workdir
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.parts = [os.path.basename(p) for p in write_id_parts(str(data), PART_SIZES)]
        self.big = None
        if big:
            import scenarios_link
            self.big = scenarios_link.write_big(data)
        shared = workdir / "shared"
        shared.mkdir(exist_ok=True)
        self.net = netns.Network(hosts, shared=str(shared))
        self.hosts = self.net.hosts
        self.storage = self.net.storage.popen(
            [sys.executable, str(HERE / "storage.py"), str(data), HTTP_PORT, S3_PORT],
            stdout=subprocess.PIPE, stderr=open(workdir / "storage.log", "w"), text=True)
        if self.storage.stdout.readline().strip() != "ready":
            raise RuntimeError("the storage host's servers did not start")

    def http(self, name: str) -> str:
        return f"http://{STORAGE}:{HTTP_PORT}/{name}"

    def request_log(self, name: str) -> str:
        """Where the storage host tells the Range headers of the requests for ``name``."""
        return f"http://{STORAGE}:{HTTP_PORT + 1}/{name}"

    @staticmethod
    def s3(name: str) -> str:
        return f"s3://data/{name}"

    def fetch(self, host: netns.Host, names, directory: str) -> list:
        """Download ``names`` from the storage host into ``directory`` on ``host`` (over its
        link, as SageMaker's File mode copies a channel's objects); the paths there."""
        paths = [f"{directory}/{n}" for n in names]
        args = ["curl", "-sSf", "--create-dirs"]
        for name, path in zip(names, paths):
            args += ["-o", path, self.http(name)]
        host.run_ok(args)
        return paths

    def close(self) -> None:
        self.storage.kill()
        self.storage.wait()
        self.net.close()


def read_results(host: netns.Host, directory: str) -> dict:
    """The JSON files a job left in ``directory`` on ``host``, by file name."""
    code = ("import glob,json,os,sys\nprint(json.dumps({os.path.basename(p): json.load(open(p))"
            f" for p in glob.glob({directory!r} + '/*.json')}}))")
    return json.loads(host.python("-c", code))


def torchrun(hosts, out: str, cases, timeout: float = 400, nproc: int = 2,
             script: str = "rank_job.py") -> dict:
    """``torchrun --nnodes len(hosts) --nproc-per-node nproc`` of ``script OUT CASES`` on every
    host, the rendezvous (static, the c10d store) at host 0's address; every rank's results
    (the JSON files the ranks left in OUT on their hosts) by file name."""
    procs = []
    for i, host in enumerate(hosts):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
                "--nproc-per-node", str(nproc), "--node-rank", str(i), "--master-addr",
                hosts[0].address, "--master-port", "29400", "--max-restarts", "0",
                str(HERE / script), out, json.dumps(cases)]
        procs.append(host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True))
    logs = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            logs.append(f"timed out after {timeout} s\n" + (proc.communicate()[0] or ""))
    results = {}
    for host in hosts:
        results.update(read_results(host, out))
    return {"returncodes": [p.returncode for p in procs], "logs": [log[-4000:] for log in logs],
            "ranks": results}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenarios")
    p.add_argument("workdir")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import scenarios_link
    import scenarios_torch
    table = {**scenarios_torch.SCENARIOS, **scenarios_link.SCENARIOS}
    names = args.scenarios.split(",")
    harness = Harness(Path(args.workdir), hosts=3,
                      big=any(n.startswith("link") for n in names))
    harness.rounds = args.rounds
    out = {}
    try:
        for name in names:
            started = time.monotonic()
            try:
                out[name] = table[name](harness)
            except Exception:  # noqa: BLE001 - reported to the test, which fails with it
                out[name] = {"driver_error": traceback.format_exc()[-4000:]}
            out[name]["seconds"] = round(time.monotonic() - started, 1)
    finally:
        harness.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

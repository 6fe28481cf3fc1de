"""Hosts on one machine: each a network namespace (+ mount and UTS namespaces) joined by a bridge.

Run inside one outer ``unshare --net --mount --pid --fork`` (see :func:`outer_command`), so that
nothing can route beyond the harness and every process dies with it. A :class:`Host` is a
holder process (``unshare --net --mount --uts ... sleep``) whose namespaces commands enter with
``nsenter``; its veth end ``eth0`` is moved into it by pid and its peer joins the bridge ``mh0``
of the outer namespace. Addresses are 10.77.0.0/24, used only on that bridge.

What is per host (and so shared by nothing across hosts): the network namespace (its abstract
Unix sockets, loopback, ports), ``/tmp`` and ``/dev/shm`` (tmpfs mounted in the host's own mount
namespace: FIFOs, shared-memory segments), ``~/.cache`` (streamio's key file) and the hostname.
What crosses: only TCP/UDP over the bridge, and ``/tmp/shared``, which stands for a cluster's
shared filesystem (where a job keeps its checkpoints). The repository and Python are the
machine's, read the same on every host.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
STORAGE_ADDRESS = f"{SUBNET}.2"
BRIDGE = "mh0"
#: The home directory streamio's key lives under (``~/.cache/streamio``, found from the password
#: database, not ``$HOME``): its ``.cache`` is private to each host, as on separate machines.
HOME = pwd.getpwuid(os.getuid()).pw_dir
#: What each host mounts privately before it runs anything (the hostname is set by the caller).
_PRIVATE_SETUP = ("mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs"
                  f" /dev/shm && mkdir -p {HOME}/.cache && mount -t tmpfs -o mode=0755 tmpfs"
                  f" {HOME}/.cache && mkdir -p /tmp/ml && ")


def outer_command(argv: Sequence[str]) -> list:
    """``argv`` inside a fresh outer namespace: its own network (only what the harness builds),
    mounts and pids (everything left dies when the driver, its pid 1, ends)."""
    return ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            *argv]


def why_not() -> Optional[str]:
    """None where the harness can run here, else why not (the tests skip with it)."""
    for tool in ("unshare", "nsenter", "ip", "tc", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} not found (util-linux, iproute2, curl)"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c",
         "ip link add va type veth peer name vb && tc qdisc add dev va root tbf rate 100mbit"
         " burst 256kb latency 50ms && mount -t tmpfs tmpfs /tmp"],
        capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return ("network/mount namespaces, veth or tc tbf are not permitted here: "
                + probe.stderr.strip()[:200])
    return None


def sh(command: str, timeout: float = 30) -> str:
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{command!r} failed: {out.stderr.strip()}")
    return out.stdout


def _keep_checkout_visible(setup: str) -> str:
    """``setup`` mounts a new ``/tmp`` (and ``~/.cache``): a checkout below either (a CI that
    clones into /tmp) would vanish from the host. A process started in the checkout first
    keeps a link to it through its cwd; the checkout is bound back at its own path from there."""
    root = str(ROOT)
    if not any(root == top or root.startswith(top + "/") for top in ("/tmp", f"{HOME}/.cache")):
        return setup
    q = shlex.quote(root)
    return (f"(cd {q} && exec sleep 100000) & keep=$! && while [ \"$(readlink /proc/$keep/cwd)\""
            f" != {q} ]; do sleep 0.01; done && {setup} mkdir -p {q} && mount -c --bind"
            f" /proc/$keep/cwd {q} && kill $keep && ")


class Host:
    """One host: a holder process in its own namespaces; ``run``/``popen`` enter them."""

    def __init__(self, name: str, address: str, index: int, *, private: bool = True,
                 shared: Optional[str] = None) -> None:
        self.name, self.address, self.index = name, address, index
        self.private = private
        self.link = f"mhv{index}"  # the bridge side of its veth, in the outer namespace
        setup = ""
        if private:
            setup = _PRIVATE_SETUP
            if shared:  # the cluster's shared filesystem (checkpoints), at /tmp/shared
                # cd first: the new /tmp hides the path; the kernel follows the cwd link.
                setup = (f"cd {shlex.quote(shared)} && {setup} mkdir /tmp/shared && mount -c"
                         " --bind /proc/self/cwd /tmp/shared && cd / && ")
            setup = _keep_checkout_visible(setup)
        setup += f"hostname {name} && ip link set lo up && "
        self._holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--uts", "sh", "-c",
             setup + "echo ready && exec sleep 100000"], stdout=subprocess.PIPE, text=True)
        line = self._holder.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"host {name} did not start")
        self.pid = self._holder.pid
        sh(f"ip link add {self.link} type veth peer name eth0 netns {self.pid}"
           f" && ip link set {self.link} master {BRIDGE} up")
        self.run_ok(["sh", "-c", f"ip addr add {address}/24 dev eth0 && ip link set eth0 up"])

    def env(self, extra: Optional[dict] = None) -> dict:
        """The environment a process of this host starts with: its own home and temp
        directories, this checkout first on the path, the storage host's S3 endpoint."""
        env = {k: v for k, v in os.environ.items()
               if not k.lower().endswith("_proxy") and not k.startswith(("PYTEST_", "SM_"))}
        env.update(HOME=HOME, TMPDIR="/tmp", PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "tests")]), GLOO_SOCKET_IFNAME="eth0",
            AWS_ENDPOINT_URL=f"http://{STORAGE_ADDRESS}:5000", AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
            RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1",
            PYTHONUNBUFFERED="1", HOSTNAME=self.name)
        env.update(extra or {})
        return env

    def argv(self, argv: Sequence[str]) -> list:
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-u", "--", *map(str, argv)]

    def popen(self, argv: Sequence[str], env: Optional[dict] = None, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("cwd", str(ROOT))
        return subprocess.Popen(self.argv(argv), env=self.env(env), **kwargs)

    def run(self, argv: Sequence[str], env: Optional[dict] = None, timeout: float = 120,
            **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("cwd", str(ROOT))
        kwargs.setdefault("capture_output", True)
        return subprocess.run(self.argv(argv), env=self.env(env), timeout=timeout, text=True,
                              **kwargs)

    def run_ok(self, argv: Sequence[str], **kwargs) -> str:
        out = self.run(argv, **kwargs)
        if out.returncode != 0:
            raise RuntimeError(f"{self.name}: {list(argv)[:6]} failed ({out.returncode}):\n"
                               f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def python(self, *args: str, **kwargs) -> str:
        return self.run_ok([sys.executable, *args], **kwargs)

    def set_link(self, up: bool, *, side: str = "cable") -> None:
        """``side="cable"``: pull (or plug back) this host's cable, the bridge side of its veth:
        the host keeps its address and routes and sees only that nothing arrives (a connect
        waits for its timeout). ``side="host"``: set the host's own interface down, which
        takes its routes with it (a connect fails at once, ENETUNREACH)."""
        state = "up" if up else "down"
        if side == "cable":
            sh(f"ip link set {self.link} {state}")
        else:
            self.run_ok(["ip", "link", "set", "eth0", state])

    def close(self) -> None:
        self._holder.kill()
        self._holder.wait()


class Network:
    """The bridge, the storage host (``shape`` on its link: every byte it serves) and ``n``
    compute hosts ``host0`` .. (10.77.0.10 + i)."""

    def __init__(self, hosts: int, *, shape: Optional[str] = "400mbit",
                 shared: Optional[str] = None) -> None:
        sh("ip link set lo up && ip link add " + BRIDGE + " type bridge && ip link set "
           + BRIDGE + " up")
        # The storage host keeps the machine's /tmp: it serves files the driver wrote there.
        self.storage = Host("storage", STORAGE_ADDRESS, 0, private=False)
        self.hosts = [Host(f"host{i}", f"{SUBNET}.{10 + i}", i + 1, shared=shared)
                      for i in range(hosts)]
        self.rate = None
        if shape:
            self.shape(shape)

    def shape(self, rate: str) -> None:
        """``tc tbf`` on the storage host's egress: what it sends goes at most at ``rate``.
        The burst is above a veth's largest (GSO) packet, 64 KiB, which tbf would drop."""
        self.storage.run_ok(["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                             "burst", "256kb", "latency", "100ms"])
        self.rate = rate

    def close(self) -> None:
        for host in [*self.hosts, self.storage]:
            host.close()


"""The shared stream when a side stops without leaving: a process of this user that takes a
reader's place and never reads, a dealer whose process is stopped (SIGSTOP: a frozen worker),
and the names of two runs of one job (another uid that saw one run's socket must not hold the
next run's). Real processes (tests/scripts/shared_stall.py), small timeouts."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import streamio
from streamio import Dataset, _util
from streamio.sharing.stream import SharedStreamFeed, dealer_address, stream_address

from hang_guard import bounded
from support.rank_jobs import private_network, script_env

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SCRIPT = os.path.join(HERE, "scripts", "shared_stall.py")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
TIMEOUT = 3.0  # connect_timeout: also the stall bound


def write_data(path: str, n: int, size: int = 0) -> str:
    streamio.write_records(path, "tfrecord", (b"%d " % i + b"x" * size for i in range(n)))
    return path


def script(*args: object, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SCRIPT, *map(str, args)], stdout=subprocess.PIPE,
                            text=True, env=script_env(), **kw)


def test_a_reader_that_stops_reading_is_named_and_ends_the_epoch_everywhere(tmp_path):
    """A process of this user takes local rank 1 worker 0's place, asks for blocks (each larger
    than a socket's buffer) and never reads. The dealer never blocks on it: within the stall
    bound every other reader, of both ranks, ends with a SourceError naming it (its place,
    pid and uid); before the fix the dealer's send blocked and every reader waited forever."""
    # 2.5 MB blocks; the rogue's share (6 blocks) is more than its socket can hold (the dealer
    # asks 4 MiB of the kernel for each reader: 8 MiB here)
    data = write_data(str(tmp_path / "d.tfrecord"), 1600, 40_000)
    address = stream_address([data], 0)
    ds = Dataset(data, "tfrecord")
    ends: dict = {}
    rogue_pid: list = []

    def read(rank: int, worker: int) -> None:
        feed = SharedStreamFeed(ds, address=address, epoch=0, worker=worker, num_workers=2,
                                local_rank=rank, local_world_size=2, connect_timeout=TIMEOUT)
        count = 0
        try:
            for _ in ds._with_feed(feed):
                count += 1
                time.sleep(0.03)  # a reader that decodes: its share takes ~12 s
            ends[(rank, worker)] = (None, count, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - checked below
            ends[(rank, worker)] = (exc, count, time.monotonic())

    def scenario() -> float:
        # The rogue first (it connects as soon as the dealer listens), then the readers.
        proc = script("rogue", address.encode("latin-1").hex(), 1, 0, 2, 2)
        try:
            t0 = time.monotonic()
            readers = [threading.Thread(target=read, args=(rank, worker), daemon=True)
                       for rank, worker in ((0, 0), (0, 1), (1, 1))]
            for thread in readers:
                thread.start()
            rogue_pid.append(int(proc.stdout.readline()))
            for thread in readers:
                thread.join()
        finally:
            proc.kill()
            proc.wait()
        return t0

    t0 = bounded(scenario, 60)
    assert set(ends) == {(0, 0), (0, 1), (1, 1)}
    for who, (error, count, at) in ends.items():
        assert isinstance(error, streamio.SourceError), (who, error, count)
        message = str(error)
        assert "DataLoader worker 0 of local rank 1 stopped reading" in message, message
        assert f"pid {rogue_pid[0]}, uid {os.getuid()}" in message, message
        assert "cannot be delivered" in message
        assert at - t0 < TIMEOUT + 8, f"{who} ended {at - t0:.1f} s after the epoch began"
        assert count < 384  # mid-epoch (a share is 6 or 7 blocks of 64): the stall ended it


def test_a_stopped_dealer_ends_every_readers_epoch_with_its_name(tmp_path):
    """The dealer's process (worker 0) is stopped (SIGSTOP, as a cgroup freeze would) after its
    first record: worker 1, which asks for blocks, hears nothing, not even the dealer's
    keep-alive, and ends within the stall bound with a SourceError naming the dealer's pid;
    before the fix it waited in recv forever."""
    data = write_data(str(tmp_path / "d.tfrecord"), 2000)
    token = "s" * 16
    dealer = script("dealer", data, token, 30)  # (stopped: its own deadlines do not run)
    try:
        pid = int(dealer.stdout.readline())
        os.kill(pid, signal.SIGSTOP)
        ds = Dataset(data, "tfrecord")
        feed = SharedStreamFeed(ds, token=token, epoch=0, worker=1, num_workers=2,
                                connect_timeout=TIMEOUT)

        def read() -> tuple:
            t0 = time.monotonic()
            with pytest.raises(streamio.SourceError) as info:
                for _ in ds._with_feed(feed):
                    pass
            return info.value, time.monotonic() - t0

        error, seconds = bounded(read, 40)
    finally:
        dealer.kill()
        dealer.wait()
    assert f"worker 0, pid {pid}, uid {os.getuid()}" in str(error), error
    assert "sent nothing" in str(error) and "keep-alive" in str(error), error
    assert seconds < TIMEOUT + 8, seconds


def _two_readers_of_a_fifo(tmp_path, write, n: int) -> tuple:
    """Two workers' feeds share a FIFO whose bytes ``write(fifo, data)`` sends; ``({worker:
    records' numbers}, {worker: error})``."""
    fifo = str(tmp_path / "slow.fifo")
    os.mkfifo(fifo)
    data = write_data(str(tmp_path / "d.tfrecord"), n)
    ds = Dataset(fifo, "tfrecord")
    got: dict = {0: [], 1: []}
    errors: dict = {}

    def read(worker: int) -> None:
        feed = SharedStreamFeed(ds, token="k" * 16, epoch=0, worker=worker, num_workers=2,
                                connect_timeout=TIMEOUT)
        try:
            got[worker] = [int(r.split()[0]) for r in ds._with_feed(feed)]
        except Exception as exc:  # noqa: BLE001 - checked by the caller
            errors[worker] = exc

    def scenario() -> None:
        threads = [threading.Thread(target=read, args=(w,), daemon=True) for w in (0, 1)]
        threads.append(threading.Thread(target=write, args=(fifo, data), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    bounded(scenario, 60)
    return got, errors


def _streamio_warnings(caplog) -> list:
    return [r.getMessage() for r in caplog.records
            if r.name == "streamio" and r.levelno >= logging.WARNING]


def test_a_dealer_waiting_for_its_stream_keeps_its_readers(tmp_path, caplog, monkeypatch):
    """A stream that is slow (a FIFO whose writer waits 2 x the stall bound before writing) is
    no stall: the dealer, whose stream is read by a thread of its own, accepts every reader and
    its keep-alives hold them; the waits are logged as every wait of streamio is (a WARNING on
    logger ``streamio``: what it waits for, how long, what ends it), and every record comes."""
    monkeypatch.setattr(_util, "WAIT_LOG_AFTER_S", 1.0)

    def write(fifo: str, data: str) -> None:
        time.sleep(2 * TIMEOUT + 1)
        with open(fifo, "wb") as out, open(data, "rb") as src:
            out.write(src.read())

    with caplog.at_level(logging.INFO, logger="streamio"):
        got, errors = _two_readers_of_a_fifo(tmp_path, write, 300)
    # (Before, the dealer could not even accept worker 1 while it waited for the stream, and
    # ended the epoch after connect_timeout: "not every reader connected".)
    assert errors == {}, errors
    assert sorted(got[0] + got[1]) == list(range(300))
    logged = _streamio_warnings(caplog)
    dealer = [m for m in logged if "the dealer of" in m and "waits for its stream" in m]
    assert dealer and " s so far" in dealer[0], logged
    reader = [m for m in logged if "a reader of the shared stream waits for its next block" in m]
    assert reader and f"{TIMEOUT:g} s without a word from it (connect_timeout) ends it" \
        in reader[0], logged


def test_a_stream_whose_blocks_keep_coming_is_no_wait(tmp_path, caplog, monkeypatch):
    """A FIFO whose writer sends a block's records every 0.25 s, slower than the readers take
    them, for 4 s: the dealer has a block asked of its stream all along, but the stream is not
    stuck, and nothing says it is (before, that was logged as a wait for the stream)."""
    monkeypatch.setattr(_util, "WAIT_LOG_AFTER_S", 0.5)
    monkeypatch.setattr(_util, "WAIT_LOG_INTERVAL_S", 0.5)
    from streamio.sharing import dealer as dealer_module
    monkeypatch.setattr(dealer_module, "LOG_AFTER_S", 0.5, raising=False)  # (the code before)
    monkeypatch.setattr(dealer_module, "LOG_EVERY_S", 0.5, raising=False)
    n = 64 * 16

    def write(fifo: str, data: str) -> None:
        with open(data, "rb") as src:
            frames = src.read()
        step = len(frames) // 16  # (the records are alike: 64 of them a step)
        with open(fifo, "wb", buffering=0) as out:
            for k in range(16):
                out.write(frames[k * step:(k + 1) * step if k < 15 else None])
                time.sleep(0.25)

    with caplog.at_level(logging.INFO, logger="streamio"):
        got, errors = _two_readers_of_a_fifo(tmp_path, write, n)
    assert errors == {}, errors
    assert sorted(got[0] + got[1]) == list(range(n))
    waits = [r.getMessage() for r in caplog.records if "waits for its stream" in r.getMessage()]
    assert waits == [], waits


# -- names of two runs -----------------------------------------------------------------------
def rank_addresses(env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", "import sys; from streamio.sharing.stream import"
                          " stream_address; print(stream_address([sys.argv[1]], 0).encode("
                          "'latin-1').hex())", "/data/train.fifo"], capture_output=True,
                         text=True, env=env, timeout=60, check=True)
    return out.stdout.strip()


def test_each_run_of_a_job_has_its_own_names_that_its_ranks_share(tmp_path):
    """Two runs of the same manual job (same stream, same MASTER_ADDR/PORT): the ranks of one
    run (started by one launcher) meet at one name, the next run at another; ranks started by
    different processes meet where given one STREAMIO_RUN_ID."""
    env = dict(script_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    env.pop("STREAMIO_RUN_ID", None)
    launcher = ("import subprocess, sys; print(*(subprocess.run([sys.executable, '-c',"
                " sys.argv[1]], capture_output=True, text=True, check=True).stdout.strip()"
                " for _ in range(2)))")
    rank = ("from streamio.sharing.stream import stream_address;"
            " print(stream_address(['/data/train.fifo'], 0).encode('latin-1').hex())")

    def run() -> list:
        out = subprocess.run([sys.executable, "-c", launcher, rank], capture_output=True,
                             text=True, env=env, timeout=120, check=True)
        return out.stdout.split()

    first, second = run(), run()
    assert first[0] == first[1] and second[0] == second[1]  # one run's ranks agree
    assert first[0] != second[0]  # the next run meets elsewhere
    given = dict(env, STREAMIO_RUN_ID="3f9c2a")
    assert rank_addresses(given) == rank_addresses(given)  # different parents, one run id
    assert rank_addresses(given) != rank_addresses(dict(env, STREAMIO_RUN_ID="77ab01"))


def test_another_user_holding_the_last_runs_name_does_not_stop_the_next_run(tmp_path):
    """Run 1 of a 2-rank job reads a stream; uid 65534 then binds the name run 1 used (it is
    visible in /proc/net/unix); run 2 of the same job (new launcher) meets at another name and
    reads every record. Before the fix run 2 used run 1's name, and both ranks failed."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("needs Linux and root (to run the squatter as uid 65534)")
    if not private_network() or subprocess.run(
            ["unshare", "--net", *NOBODY, sys.executable, "-c", "pass"],
            capture_output=True, timeout=60).returncode != 0:
        pytest.skip("unshare --net / setpriv as uid 65534 not permitted here")
    data = write_data(str(tmp_path / "d.tfrecord"), 500)
    command = f'ip link set lo up && exec "{sys.executable}" "{SCRIPT}" runs "{tmp_path}"' \
              f' "{data}" "{sys.executable}"'
    proc = subprocess.run(["unshare", "--net", "sh", "-c", command], capture_output=True,
                          text=True, timeout=300, env=script_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["squatted"], "uid 65534 could not bind run 1's name"
    for n in ("first", "second"):
        ranks = result[n]
        assert [r["error"] for r in ranks] == [None, None], ranks
        assert sorted(ranks[0]["ids"] + ranks[1]["ids"]) == list(range(500)), n
    assert result["first"][0]["address"] != result["second"][0]["address"]

"""The shared stream (one FIFO dealt to every local rank and DataLoader worker) against another
local user: a training host is a shared machine, and the data loader must not be a way in.

The main scenario runs real processes in a private network namespace (``unshare --net``: Linux
abstract sockets are per namespace, so no other job on the machine is reachable and none of
theirs reaches the test): two local ranks and a single rank, each with DataLoader workers, as
root, and an attacker as uid 65534 (``setpriv``) that watches ``/proc/net/unix``, connects to
every streamio socket asking for records, and binds every name it can guess for later epochs,
answering with a pickle that would run code and with records of its own
(tests/scripts/shared_hostile.py, tests/scripts/shared_hostile_check.py). The protocol breakers
of the user's own processes and the wire format are tested in this process.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import streamio
from streamio import Dataset
from streamio.sharing import _local_ipc, _wire as wire
from streamio.sharing.stream import SharedStreamFeed, dealer_address, stream_address

from hang_guard import bounded

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SCRIPT = os.path.join(HERE, "scripts", "shared_hostile_check.py")
N = 2000
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _runs(cmd: list) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def hostile_python() -> str:
    """An interpreter uid 65534 can run (the job's own may sit in a home it cannot enter)."""
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if candidate and _runs(NOBODY + [candidate, "-c", "pass"]):
            return candidate
    pytest.skip("no Python interpreter that uid 65534 may run")


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("needs Linux and root (to run the attacker as uid 65534)")
    if not _runs(["unshare", "--net", "sh", "-c", "ip link set lo up && " + " ".join(NOBODY)
                  + " true"]):
        pytest.skip("unshare --net / setpriv not permitted here")
    pytest.importorskip("torch")
    workdir = tmp_path_factory.mktemp("hostile")
    command = f'ip link set lo up && exec "{sys.executable}" "{SCRIPT}" "{workdir}" ' \
              f'"{hostile_python()}"'
    # This checkout's streamio in every process (a script's own folder comes first on its path).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)).rstrip(
            os.pathsep))
    proc = subprocess.run(["unshare", "--net", "sh", "-c", command], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_exactly_once(results: list, expected: set) -> None:
    for result in results:
        assert result is not None and result["error"] is None, result
        assert len(result["epochs"]) == 2
    for epoch in range(2):
        seen = collections.Counter()
        for result in results:
            seen.update(result["epochs"][epoch])
        assert not set(seen) - expected, f"epoch {epoch}: records the job never wrote"
        assert set(seen) == expected, f"epoch {epoch}: {len(expected - set(seen))} missing"
        assert max(seen.values()) == 1, f"epoch {epoch}: a record went to two readers"


def test_two_epochs_deliver_every_record_once_while_another_user_attacks(attacked):
    """Local ranks (one dealer for 2 x 2 readers) and a single rank's workers both read every
    record exactly once in both epochs, none of the attacker's."""
    assert_exactly_once([attacked["rank0"], attacked["rank1"]], set(range(N)))
    assert_exactly_once([attacked["solo"]], set(range(N)))


def test_the_attacker_runs_no_code_gets_no_record_and_cannot_read_the_key(attacked):
    hostile = attacked["hostile"]
    assert hostile is not None, "the attacker did not report"
    # It did attack: it saw the job's sockets, connected to them, and held its guessed names.
    assert len(hostile["seen"]) >= 2 and hostile["connected"] >= 2, hostile
    assert len(hostile["bound"]) >= 3, hostile
    assert hostile["records_received"] == 0, hostile
    assert attacked["pwned"] is False, "a rank ran the attacker's pickle"
    assert hostile["key_readable"] is False, hostile
    assert attacked["key_mode"] == 0o600


def test_an_address_held_by_another_user_is_refused_by_reader_and_dealer(attacked):
    """Told to use an address the attacker listens at (which its names never are): a reader
    refuses the listener at once and says so; a dealer refuses to serve behind it."""
    planted = attacked["planted"]
    for side in ("client", "dealer"):
        end = planted[side]
        assert end["error"] == "SourceError" and end["records"] == 0, (side, end)
        assert "uid 65534" in end["message"] and "another user" in end["message"], (side, end)
    assert attacked["pwned"] is False


# -- the user's own processes breaking the protocol (no namespace needed) -------------------------
def write_data(path: str, n: int) -> str:
    streamio.write_records(path, "tfrecord", (b"%d" % i for i in range(n)))
    return path


def rogue(address, message: bytes, *, read: bool = False) -> bytes:
    """A process of this user that connects, sends ``message`` and hangs up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(address)
        sock.sendall(message)
        got = b""
        if read:
            while len(got) < wire.HEADER.size or len(got) < wire.HEADER.size + \
                    wire.HEADER.unpack_from(got)[2]:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        return got


def test_protocol_breakers_are_dropped_and_the_epoch_goes_on(tmp_path):
    """While worker 0 (the dealer) waits for worker 1: garbage, a hello that hangs up before its
    first block, a hello for a worker that does not exist, another rank layout, and a second
    worker 0. Each is dropped (a hello that does not fit is told why); worker 1 then connects
    and the two workers get every record exactly once."""
    ds = Dataset(write_data(str(tmp_path / "d.tfrecord"), N), "tfrecord")
    token = "a" * 16
    got: dict = {0: [], 1: []}
    errors: dict = {}
    first, go = threading.Event(), threading.Event()

    def read(worker: int) -> None:
        feed = SharedStreamFeed(ds, token=token, epoch=0, worker=worker, num_workers=2,
                                connect_timeout=30)
        try:
            for record in ds._with_feed(feed):
                got[worker].append(int(record))
                first.set()
                go.wait(20)  # worker 0 holds its place while the rogues come
        except Exception as exc:  # noqa: BLE001 - checked below
            errors[worker] = exc

    address = dealer_address(token, 0)

    def scenario() -> list:
        dealer = threading.Thread(target=read, args=(0,), daemon=True)
        dealer.start()
        assert first.wait(20), "worker 0 got no record"
        rogue(address, b"GET / HTTP/1.0\r\n\r\n")
        rogue(address, wire.encode_hello(0, 1, 2, 1))  # takes worker 1's place, hangs up
        told = [rogue(address, wire.encode_hello(0, 7, 2, 1) + b"W"),  # no such worker
                rogue(address, wire.encode_hello(0, 1, 3, 1) + b"W", read=True),  # 3 workers
                rogue(address, wire.encode_hello(0, 1, 2, 4) + b"W", read=True),  # 4 ranks
                rogue(address, wire.encode_hello(0, 0, 2, 1) + b"W", read=True)]  # worker 0 again
        rogue(address, b"\x00" * 64)
        rogue(address, b"sio\x01" + b"\xff" * 16)
        go.set()
        other = threading.Thread(target=read, args=(1,), daemon=True)
        other.start()
        dealer.join()
        other.join()
        return told

    told = bounded(scenario, 90)
    assert errors == {}, errors
    seen = got[0] + got[1]
    assert sorted(seen) == list(range(N))  # (worker 0 may have taken all of them)
    for answer in told[1:]:
        kind, _, size = wire.parse_header(answer[:wire.HEADER.size], 64, 1 << 20)
        assert kind == wire.ERROR
        error = wire.parse_error(answer[wire.HEADER.size:])
        assert isinstance(error, streamio.SourceError) and "refused" in str(error), error
    assert "already connected" in str(wire.parse_error(told[3][wire.HEADER.size:]))


def test_a_reader_that_leaves_holding_records_ends_the_epoch_with_its_name(tmp_path):
    """Not silently short: a reader of this user that got a block and hangs up without a
    goodbye ends the epoch for the others with a SourceError naming it."""
    ds = Dataset(write_data(str(tmp_path / "d.tfrecord"), N), "tfrecord")
    token = "b" * 16
    feed = SharedStreamFeed(ds, token=token, epoch=0, worker=0, num_workers=2,
                            connect_timeout=30)

    def scenario() -> BaseException:
        box = {}
        answered, first = threading.Event(), threading.Event()

        def read() -> None:
            try:
                for _ in ds._with_feed(feed):
                    first.set()
                    answered.wait(20)  # the rogue gets its block while blocks are left
            except Exception as exc:  # noqa: BLE001 - checked below
                box["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(20), "worker 0 got no record"
        answer = rogue(dealer_address(token, 0), wire.encode_hello(0, 1, 2, 1) + b"W",
                       read=True)
        answered.set()
        assert wire.HEADER.unpack_from(answer)[0] == wire.BLOCK
        reader.join()
        return box.get("error")

    error = bounded(scenario, 60)
    assert isinstance(error, streamio.SourceError), error
    assert "DataLoader worker 1 left" in str(error) and "cannot be delivered" in str(error)


# -- names and the key --------------------------------------------------------------------------
def test_names_need_the_secret_and_the_key_lives_in_a_private_directory(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(_local_ipc, "home_dir", lambda uid: None)  # no home: the temp dir
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    path = str(tmp_path / "pipe")
    first = stream_address([path], 0)
    directory = tmp_path / f"streamio-{os.getuid()}"
    key = directory / "shared-stream.key"
    assert directory.stat().st_mode & 0o777 == 0o700 and key.stat().st_mode & 0o777 == 0o600
    assert stream_address([path], 0) == first  # every rank finds the same name
    # The epoch is not in clear, and one epoch's name says nothing about the next.
    assert len(first.rsplit("-", 1)[1]) == 32 and stream_address([path], 1) != first
    assert dealer_address("c" * 16, 0) != dealer_address("c" * 16, 1)
    assert len(dealer_address("c" * 16, 1).rsplit("-", 1)[1]) == 32
    # Another key (another user's, or a new one): other names.
    _local_ipc._keys.clear()
    key.unlink()
    assert stream_address([path], 0) != first
    # A key that others could read is refused, not used.
    _local_ipc._keys.clear()
    key.chmod(0o644)
    with pytest.raises(streamio.SourceError, match="refusing the shared stream's key"):
        stream_address([path], 0)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_private_directory_made_by_another_user_is_refused(tmp_path, monkeypatch):
    """Another user who made ``<tempdir>/streamio-<uid>`` first would know the key: a user with a
    home of its own keeps the key there; without one, the squatted directory is refused with a
    SourceError naming the owner."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    _local_ipc._keys.clear()
    squat = tmp_path / f"streamio-{os.getuid()}"
    squat.mkdir(mode=0o700)
    os.chown(squat, 65534, 65534)
    # With a home of its own, the user's key lives there and the squatted directory is moot.
    monkeypatch.setattr(_local_ipc, "home_dir", lambda uid: str(home))
    first = stream_address([str(tmp_path / "pipe")], 0)
    key = home / ".cache" / "streamio" / "shared-stream.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_uid == os.getuid()
    assert oct(key.parent.stat().st_mode & 0o777) == oct(0o700)
    # A home that another user could write is passed over for the temp dir (squatted: refused).
    _local_ipc._keys.clear()
    home.chmod(0o777)
    with pytest.raises(streamio.SourceError, match="owner uid 65534"):
        stream_address([str(tmp_path / "pipe")], 0)
    home.chmod(0o755)
    _local_ipc._keys.clear()
    assert stream_address([str(tmp_path / "pipe")], 0) == first  # the same key again
    # Without a home: the squatted temp dir is refused, naming its owner, never used.
    monkeypatch.setattr(_local_ipc, "home_dir", lambda uid: None)
    _local_ipc._keys.clear()
    with pytest.raises(streamio.SourceError, match="owner uid 65534"):
        stream_address([str(tmp_path / "pipe")], 0)
    os.chown(squat, os.getuid(), os.getgid())
    squat.chmod(0o755)
    with pytest.raises(streamio.SourceError, match="not a private directory"):
        stream_address([str(tmp_path / "pipe")], 0)


# -- the wire format ---------------------------------------------------------------------------
class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /nonexistent/pwned",))


def test_an_error_on_the_wire_is_data_never_code(tmp_path):
    evil = pickle.dumps(_Boom())
    for payload in (evil, b"{", json.dumps({"type": "os.system", "message": "m",
                                            "fields": {}}).encode()):
        error = wire.parse_error(payload)
        assert type(error) is streamio.SourceError
    # streamio's own errors come back as themselves, with their attributes.
    original = streamio.CorruptRecordError("bad crc", source="a.fifo", offset=12,
                                           record_index=3)
    message = wire.encode_error(original, 1, 0)
    back = wire.parse_error(message[wire.HEADER.size:])
    assert type(back) is streamio.CorruptRecordError and str(back) == str(original)
    assert (back.source, back.offset, back.record_index) == ("a.fifo", 12, 3)
    source = streamio.SourceError("gone", source="x.fifo")
    back = wire.parse_error(wire.encode_error(source)[wire.HEADER.size:])
    assert str(back) == str(source) and back.source == "x.fifo"


def test_malformed_blocks_and_headers_are_source_errors():
    ids = np.arange(3, dtype=np.int64)
    good = wire.encode_block("s", ids, [b"a", b"bb", b"ccc"])
    kind, count, size = wire.parse_header(good[:16], 64, 1 << 20)
    name, got_ids, records = wire.parse_block(count, good[16:])
    assert (name, got_ids.tolist(), records) == ("s", [0, 1, 2], [b"a", b"bb", b"ccc"])
    for header in (wire.HEADER.pack(9, 0, 0), wire.HEADER.pack(1, 65, 10),
                   wire.HEADER.pack(1, 1, 1 << 40), wire.HEADER.pack(2, 1, 0),
                   wire.HEADER.pack(3, 0, 1 << 30)):
        with pytest.raises(streamio.SourceError, match="malformed"):
            wire.parse_header(header, 64, 1 << 20)
    for payload in (good[16:-1], good[16:] + b"x", b"\xff\xff\xff\xff", b""):
        with pytest.raises(streamio.SourceError):
            wire.parse_block(count, payload)


def test_a_worker_that_stops_early_says_goodbye_and_the_others_finish(tmp_path):
    """A reader that stops (its loop ended: goodbye, then its socket closes) keeps its place:
    the other reader finishes the epoch at once, not after connect_timeout with a "missing"
    error."""
    ds = Dataset(write_data(str(tmp_path / "d.tfrecord"), N), "tfrecord")
    token = "d" * 16
    got: dict = {0: [], 1: []}
    errors: dict = {}
    stopped = threading.Event()

    def read(worker: int) -> None:
        feed = SharedStreamFeed(ds, token=token, epoch=0, worker=worker, num_workers=2,
                                connect_timeout=8)
        records = iter(ds._with_feed(feed))
        try:
            for record in records:
                got[worker].append(int(record))
                if worker == 1:
                    break  # stops after its first record: goodbye and close
                if worker == 0 and len(got[0]) == 1:
                    stopped.wait(10)  # let worker 1 leave first
        except Exception as exc:  # noqa: BLE001 - checked below
            errors[worker] = exc
        finally:
            records.close()
            if worker == 1:
                stopped.set()

    def both() -> float:
        threads = [threading.Thread(target=read, args=(w,), daemon=True) for w in (0, 1)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0

    seconds = bounded(both, 60)
    assert errors == {}, errors
    assert got[1] and len(got[0]) + len(got[1]) <= N and len(set(got[0] + got[1])) == \
        len(got[0]) + len(got[1])
    assert seconds < 8, f"the dealer waited {seconds:.1f} s for a reader that had said goodbye"


def test_an_address_in_use_by_this_user_is_waited_for_then_named(tmp_path, monkeypatch):
    """"Its dealer address is in use": a holder of this user that lets go (an earlier reader of
    the same epoch number, still exiting) is waited for and the epoch is served; one that
    does not let go is named (its pid) after the grace period."""
    monkeypatch.setattr(_local_ipc, "IN_USE_GRACE_S", 1.5)
    ds = Dataset(write_data(str(tmp_path / "d.tfrecord"), 300), "tfrecord")

    def hold(address, seconds: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(address)
        sock.listen(8)
        threading.Timer(seconds, sock.close).start()

    def read(token: str) -> list:
        feed = SharedStreamFeed(ds, token=token, epoch=0, worker=0, num_workers=1,
                                connect_timeout=10)
        return [int(r) for r in ds._with_feed(feed)]

    hold(dealer_address("e" * 16, 0), 0.5)
    assert sorted(bounded(lambda: read("e" * 16), 30)) == list(range(300))
    hold(dealer_address("f" * 16, 0), 5)
    with pytest.raises(streamio.SourceError, match=f"still in use by pid {os.getpid()}"):
        bounded(lambda: read("f" * 16), 30)

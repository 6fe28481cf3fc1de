"""Records lost to one flipped bit (issue #10, finding 6): ``python benchmarks/bitflip.py``.

Each trial writes 1000 records of random sizes (one stream serves 50 trials), flips one random
bit anywhere in the stream (``--headers-only``: in a frame header), and frames it with ``on_error="skip"`` in 64 KiB chunks. A record is lost when the reader does not
deliver it intact (a damaged record delivered in its place counts as lost too). Prints, per
format, the most records one trial lost, the 99th percentile and the mean.

RecordIO is written both ways a multi-part record can be joined: ``dmlc`` (records that hold the
magic number at an aligned offset are split there, as MXNet's writer does) and ``concat``
(some records split into 2-3 parts at arbitrary points, as Amazon's tools do).
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import struct
import sys
import time

from streamio.formats import encode_recordio, encode_tfrecord, make_framer
from streamio.formats.recordio import MAGIC, MAGIC_BYTES

N_RECORDS = 1000
CHUNK = 64 * 1024
FORMATS = ("tfrecord", "recordio-dmlc", "recordio-concat")


def make_records(rng: random.Random, n: int = N_RECORDS) -> list[bytes]:
    records = []
    for i in range(n):
        payload = bytearray(rng.randbytes(rng.randint(0, 1024)))
        if i % 10 == 0 and len(payload) >= 8:  # dmlc splits these into multi-part records
            at = rng.randrange(0, len(payload) - 4) & ~3
            payload[at:at + 4] = MAGIC_BYTES
        records.append(bytes(payload))
    return records


def _concat_frames(rng: random.Random, payload: bytes) -> bytes:
    """A record split into 2-3 parts at arbitrary points (cflag 1, 2..., 3), or one frame."""
    if len(payload) < 3 or rng.random() >= 0.1:
        return encode_recordio(payload, multipart="concat")
    cuts = sorted(rng.sample(range(1, len(payload)), rng.randint(1, 2)))
    parts = [payload[a:b] for a, b in zip([0] + cuts, cuts + [len(payload)])]
    frames = []
    for k, part in enumerate(parts):
        cflag = 1 if k == 0 else (3 if k == len(parts) - 1 else 2)
        frames.append(struct.pack("<II", MAGIC, cflag << 29 | len(part)) + part
                      + b"\0" * (-len(part) & 3))
    return b"".join(frames)


def encode(fmt: str, records: list[bytes], rng: random.Random) -> bytes:
    if fmt == "tfrecord":
        return b"".join(encode_tfrecord(r) for r in records)
    if fmt == "recordio-dmlc":
        return b"".join(encode_recordio(r, multipart="dmlc") for r in records)
    return b"".join(_concat_frames(rng, r) for r in records)


def frame(fmt: str, data: bytes) -> list[bytes]:
    if fmt == "tfrecord":
        framer = make_framer("tfrecord", source="trial", on_error="skip")
    else:
        framer = make_framer("recordio", source="trial", on_error="skip",
                             multipart=fmt.split("-")[1])
    out: list[bytes] = []
    for at in range(0, len(data), CHUNK):
        out += framer.feed(data[at:at + CHUNK])
    out += framer.finish()
    return out


def lost(records: list[bytes], delivered: list[bytes]) -> int:
    missing = collections.Counter(records) - collections.Counter(delivered)
    return sum(missing.values())


def header_bits(fmt: str, data: bytes) -> list[int]:
    """The bit offsets of every frame header in a clean stream."""
    bits, pos = [], 0
    while pos < len(data):
        if fmt == "tfrecord":
            size = 16 + struct.unpack_from("<Q", data, pos)[0]
            header = 12
        else:
            length = struct.unpack_from("<I", data, pos + 4)[0] & ((1 << 29) - 1)
            size = 8 + length + (-length & 3)
            header = 8
        bits.extend(range(pos * 8, (pos + header) * 8))
        pos += size
    return bits


def trial(fmt: str, records: list[bytes], data: bytes, bit: int) -> int:
    damaged = bytearray(data)
    damaged[bit // 8] ^= 1 << (bit % 8)
    return lost(records, frame(fmt, bytes(damaged)))


# Each stream takes a moment to make in Python: one stream serves this many trials.
TRIALS_PER_STREAM = 50


def run(trials: int, seed: int = 0, formats=FORMATS, headers_only: bool = False,
        ) -> dict[str, list[int]]:
    """Losses of ``trials`` one-bit flips per format (only in frame headers if asked)."""
    results = {}
    for fmt in formats:
        losses = []
        for i in range(trials):
            if i % TRIALS_PER_STREAM == 0:
                rng = random.Random(f"{seed}-{fmt}-{i}")
                records = make_records(rng)
                data = encode(fmt, records, rng)
                targets = header_bits(fmt, data) if headers_only else None
            bit = rng.choice(targets) if targets else rng.randrange(len(data) * 8)
            losses.append(trial(fmt, records, data, bit))
        results[fmt] = losses
    return results


def p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--headers-only", action="store_true",
                        help="flip bits of frame headers only (lengths, magic numbers, CRCs)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run(args.trials, args.seed, headers_only=args.headers_only)
    where = "a frame header" if args.headers_only else "a stream"
    print(f"{args.trials} trials, one bit flipped in {where} of {N_RECORDS} records,"
          " on_error='skip'")
    print(f"{'format':<18} {'max':>5} {'p99':>5} {'mean':>7}")
    for fmt, losses in results.items():
        print(f"{fmt:<18} {max(losses):>5} {p99(losses):>5} {statistics.mean(losses):>7.3f}")
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

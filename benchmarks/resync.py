"""Skip-mode resynchronisation speed (issue #10, finding 7): ``python benchmarks/resync.py``.

Feeds garbage in 1 MiB chunks to a framer with ``on_error="skip"``: every byte is searched for
the next sound header, none is found. Prints MB/s (10**6 bytes per second) per format and garbage
kind (CPU time), with the C kernels and with the pure-Python code a framer uses where the extension did not
build (``accelerate=False``). Garbage: zeros and random bytes, and small little-endian u64s
(every 8th offset holds a plausible TFRecord length: the dense case of the searches), and RecordIO
magic numbers, each before an lrec whose length is over the limit: every other aligned word a
magic number that the RecordIO searches must reject.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time

import numpy as np

from streamio.formats.recordio import LENGTH_MASK, MAGIC, RecordIOFramer
from streamio.formats.tfrecord import TFRecordFramer

CHUNK = 1 << 20
GARBAGE = {
    "zeros": bytes,
    "random": os.urandom,
    "u64s": lambda n: np.random.default_rng(0).integers(0, 1000, n // 8 + 1, "<u8")
    .tobytes()[:n & ~7],  # whole u64s: RecordIO wants a 4-aligned garbage length
    "magics": lambda n: (struct.pack("<II", MAGIC, LENGTH_MASK) * (n // 8 + 1))[:n & ~7],
}


def rate(fmt: str, data: bytes, accelerate: bool) -> float:
    cls = TFRecordFramer if fmt == "tfrecord" else RecordIOFramer
    framer = cls(source="garbage", on_error="skip", accelerate=accelerate)
    view = memoryview(data)
    # CPU time of this process: the work is one thread's, and on a shared machine wall time
    # mostly measures the neighbours.
    start = time.process_time()
    for at in range(0, len(data), CHUNK):
        framer.feed(view[at:at + CHUNK])
    framer.finish()
    elapsed = time.process_time() - start
    assert framer.records == 0 and framer.skipped_bytes == len(data), "garbage framed as records?"
    return len(data) / elapsed / 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="garbage per case with C (MB)")
    parser.add_argument("--python-mb", type=int, default=20,
                        help="garbage per case with the pure-Python code (MB)")
    args = parser.parse_args(argv)
    print(f"{'format':<9} {'garbage':<7} {'C (MB/s)':>9} {'Python (MB/s)':>14}")
    for fmt in ("tfrecord", "recordio"):
        for kind, make in GARBAGE.items():
            fast = rate(fmt, make(args.mb * 10**6), True)
            slow = rate(fmt, make(args.python_mb * 10**6), False)
            print(f"{fmt:<9} {kind:<7} {fast:>9.0f} {slow:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

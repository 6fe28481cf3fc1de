"""Skip-mode resynchronisation speed (issue #10, finding 7): ``python benchmarks/resync.py``.

Feeds garbage (zeros, random bytes) in 1 MiB chunks to a framer with ``on_error="skip"``: every
byte is searched for the next sound header, none is found. Prints MB/s (10**6 bytes per second)
per format and garbage kind, with the C kernels and with the pure-Python references (on a smaller
input: they test TFRecord offsets one by one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from streamio.formats.recordio import RecordIOFramer
from streamio.formats.tfrecord import TFRecordFramer

CHUNK = 1 << 20


def rate(fmt: str, data: bytes, accelerate: bool) -> float:
    cls = TFRecordFramer if fmt == "tfrecord" else RecordIOFramer
    framer = cls(source="garbage", on_error="skip", accelerate=accelerate)
    view = memoryview(data)
    start = time.perf_counter()
    for at in range(0, len(data), CHUNK):
        framer.feed(view[at:at + CHUNK])
    framer.finish()
    elapsed = time.perf_counter() - start
    assert framer.records == 0 and framer.skipped_bytes == len(data), "garbage framed as records?"
    return len(data) / elapsed / 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="garbage per case with C (MB)")
    parser.add_argument("--python-mb", type=int, default=2,
                        help="garbage per case with the pure-Python references (MB)")
    args = parser.parse_args(argv)
    print(f"{'format':<9} {'garbage':<7} {'C (MB/s)':>9} {'Python (MB/s)':>14}")
    for fmt in ("tfrecord", "recordio"):
        for kind in ("zeros", "random"):
            make = (lambda n: bytes(n)) if kind == "zeros" else os.urandom
            fast = rate(fmt, make(args.mb * 10**6), True)
            slow = rate(fmt, make(args.python_mb * 10**6), False)
            print(f"{fmt:<9} {kind:<7} {fast:>9.0f} {slow:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

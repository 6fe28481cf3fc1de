"""Byte-range splits vs round-robin: ``streamio bench --workloads ranges``.

Writes one TFRecord file (``--mb``, default 1024 MB, of ``--record-kb`` records), then reads it
as ``--readers`` shards (``Dataset(path, "tfrecord").shard(N, i)``), one after the other in this
process: first split by byte range (what ``shard`` does for a regular file), then dealt
round-robin (what it did before, and still does for a pipe or a compressed file; here each reader
reads the file as an unbuffered stream, ``open(path, "rb", buffering=0)``, which is never split).
Prints, per mode, the bytes each reader read (``stats()["bytes"]``) and records/s (each reader's
records over its own time, and all records over the total time). Readers run one at a time so
the figures do not depend on how many cores are free; with parallel workers the round-robin
readers would also compete for the same disk bandwidth.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from .. import Dataset, write_records


def write_file(path: str, mb: int, record_kb: float) -> int:
    size = int(record_kb * 1024)
    block = os.urandom(size * 64)
    count = mb * 1024 * 1024 // (size + 16)

    def records():
        for i in range(count):
            at = (i * 7919) % 64 * size
            yield block[at:at + size]

    write_records(path, "tfrecord", records())
    return count


def run(path: str, readers: int, mode: str) -> dict:
    """Read ``path`` as ``readers`` shards one after the other. ``mode`` "byte-range": by path
    (a regular file is split by byte range); "round-robin": each reader reads the whole file as
    an unbuffered stream (a stream is never split; its records are dealt round-robin)."""
    rows = []
    total_records = 0
    start = time.perf_counter()
    for i in range(readers):
        t0 = time.perf_counter()
        stream = open(path, "rb", buffering=0) if mode == "round-robin" else None
        try:
            ds = Dataset(stream or path, "tfrecord").shard(readers, i).batch(1024)
            n = sum(len(batch) for batch in ds)
        finally:
            if stream is not None:
                stream.close()
        elapsed = time.perf_counter() - t0
        rows.append((i, ds.stats()["bytes"], n, n / elapsed))
        total_records += n
    total = time.perf_counter() - start
    return {"rows": rows, "records": total_records, "seconds": total}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="file size in MiB (default 1024)")
    parser.add_argument("--record-kb", type=float, default=4.0, help="record size in KiB")
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where to write the file (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "big.tfrecord")
        t0 = time.perf_counter()
        count = write_file(path, args.mb, args.record_kb)
        size = os.stat(path).st_size
        print(f"wrote {size / 2**20:,.0f} MiB, {count:,} records of {args.record_kb:g} KiB"
              f" in {time.perf_counter() - t0:.1f} s")
        for mode in ("byte-range", "round-robin"):
            result = run(path, args.readers, mode)
            print(f"\n{mode}: {args.readers} readers, {result['records']:,} records in all"
                  f" ({result['records'] / result['seconds']:,.0f} records/s over"
                  f" {result['seconds']:.1f} s)")
            for i, nbytes, n, rate in result["rows"]:
                print(f"  reader {i}: read {nbytes / 2**20:8,.1f} MiB"
                      f" ({nbytes / size:6.1%} of the file), {n:9,} records, {rate:11,.0f}"
                      " records/s")
            assert result["records"] == count, "records lost or doubled"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reads the storage host's 200 MB TFRecord object from one host (driver.py's link scenarios).

usage:
  link_reader.py rate HTTP_URL S3_URL ROUNDS   streamio beside curl, alternating; JSON runs
  link_reader.py read URL [OPEN READ]           streamio once (prints "first" at the first
                                                record, then JSON: records, in order, error,
                                                when it ended: time.monotonic(), machine-wide)
                                                with these open_timeout and read_timeout

Every record holds its index in its first 8 bytes (big-endian), so a reader checks that each
arrived once and in order. Rates count the bytes after the first byte (curl's
time_starttransfer; streamio's first record) over the time after it: the server hashes the
object for its ETag before it answers, the same wait for both.
"""

import json
import subprocess
import sys
import time

import streamio
from streamio import Dataset


def read_streamio(url, timeouts=None, announce=False):
    options = {} if timeouts is None else dict(zip(("open_timeout", "read_timeout"), timeouts))
    start = time.perf_counter()
    first = None
    n = size = first_size = 0
    in_order = True
    error = None
    try:
        for record in Dataset(url, "tfrecord", **options):
            if first is None:
                first, first_size = time.perf_counter(), len(record) + 16
                if announce:
                    print("first", flush=True)
            in_order &= int.from_bytes(record[:8], "big") == n
            n += 1
            size += len(record) + 16  # TFRecord framing: 12 bytes before, 4 after
    except streamio.StreamioError as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    return {"tool": "streamio", "records": n, "bytes": size, "in_order": in_order,
            "error": error, "seconds": end - start, "ended_at": time.monotonic(),
            "transfer_seconds": end - first if first else None,
            "transfer_bytes": size - first_size}


def read_curl(url):
    out = subprocess.run(["curl", "-sSf", "-o", "/dev/null", "-w",
                          "%{size_download} %{time_starttransfer} %{time_total}", url],
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    size, ttfb, total = int(out[0]), float(out[1]), float(out[2])
    return {"tool": "curl", "bytes": size, "seconds": total, "transfer_seconds": total - ttfb,
            "transfer_bytes": size}


def presigned(s3_url):
    import boto3
    bucket, key = s3_url[len("s3://"):].split("/", 1)
    return boto3.client("s3").generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600)


def rates(http_url, s3_url, rounds):
    s3_plain = presigned(s3_url)
    runs = []
    for r in range(rounds):
        order = [("http", "curl"), ("http", "streamio"), ("s3", "curl"), ("s3", "streamio")]
        for proto, tool in (order if r % 2 == 0 else order[::-1]):
            if tool == "curl":
                run = read_curl(http_url if proto == "http" else s3_plain)
            else:
                run = read_streamio(http_url if proto == "http" else s3_url)
            runs.append(dict(run, proto=proto, round=r))
    return runs


def main():
    if sys.argv[1] == "rate":
        print(json.dumps(rates(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        timeouts = tuple(map(float, sys.argv[3:5])) if len(sys.argv) > 3 else None
        print(json.dumps(read_streamio(sys.argv[2], timeouts, announce=True)))


if __name__ == "__main__":
    main()

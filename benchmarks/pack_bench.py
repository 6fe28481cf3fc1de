"""Pack a generated ImageFolder tree and compare reading the shards back with reading the loose
files from local disk (the page cache is dropped for neither: both read warm files, so this
measures per-file overhead, not the network storage the advice is about).

usage: python benchmarks/pack_bench.py [--files 3000] [--workdir DIR]
"""

import argparse
import io
import os
import shutil
import tempfile
import time

import numpy as np

import streamio


def make_tree(root, files, classes=10, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(files):
        folder = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(folder, exist_ok=True)
        small = rng.integers(0, 255, size=(12, 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((160, 120), Image.BILINEAR)  # smooth: JPEG-like size
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        with open(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
            f.write(buf.getvalue())


def read_loose(root):
    n = nbytes = 0
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            with open(os.path.join(folder, name), "rb") as f:
                nbytes += len(f.read())
            n += 1
    return n, nbytes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="pack-bench-")
    try:
        tree = os.path.join(work, "tree")
        make_tree(tree, args.files)
        t = time.perf_counter()
        result = streamio.pack(tree, os.path.join(work, "shards", "train"), jobs=8,
                               shard_size=16 << 20)
        pack_s = time.perf_counter() - t
        t = time.perf_counter()
        n, nbytes = read_loose(tree)
        loose_s = time.perf_counter() - t
        t = time.perf_counter()
        m = sum(len(r) for r in streamio.Dataset(result.shards, "tfrecord").batch(256))
        shard_s = time.perf_counter() - t
        print(f"{n} files, {nbytes / 1e6:.1f} MB; packed into {len(result.shards)} shards in"
              f" {pack_s:.2f} s ({n / pack_s:,.0f} files/s)")
        print(f"read back: loose files {n / loose_s:,.0f} files/s; shards {m / shard_s:,.0f}"
              f" records/s ({loose_s / shard_s:.1f}x)")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

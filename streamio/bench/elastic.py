"""Cost of an elastic resume: ``streamio bench --workloads elastic``.

An epoch read by ``n`` shards (``Dataset.shard(n, i)``: ranks x workers) is checkpointed at a
depth (a fraction of each shard's batches); the list of the ``n`` states is resumed on ``m``
shards (``shard(m, j).iter_from(states)``). Writes N tf.train.Example records (``x``
float32[32], ``label``; the benchmark's records) as 8 TFRecord files (whole-file shards) and as
one gzip TFRecord file (round-robin shards: every shard reads the whole stream), and with
``--sources ...,pipe`` as one file written into a PipeChannel shared by DataLoader workers
(:mod:`streamio.bench.elastic_pipe`: its figures are whole jobs'). For each source,
layout ``n->m`` and depth, prints (seconds; the shards run one after another in this process, and
a job's time is its slowest shard's, as if each had its own machine):

- ``elastic_s``: from ``iter_from(states)`` to the end of the resumed epoch, the slowest of the
  ``m`` new shards (each replays what the old shards' plans had read, without decoding, to learn
  what they had delivered, then reads its share of the rest);
- ``first_s``: from ``iter_from(states)`` to the first batch, the slowest new shard;
- ``same_s``: the same-layout resume (``n->n``, each shard from its own state) to the end of the
  epoch, the slowest shard;
- ``rest_s``: what the uninterrupted epoch on ``n`` shards took from the checkpoint to its end,
  the slowest shard (the work left, with nothing to replay);
- ``epoch_s``: a whole epoch on ``m`` shards, the slowest shard (for scale).

Pipeline: ``shuffle(10000, seed=0).batch(256).prefetch()`` with the Example decoder; each figure
is the median of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import numpy as np

import streamio

from .cases import example_decoder
from .workloads import example_payloads

DEFAULT_RECORDS = 200_000
DEFAULT_LAYOUTS = "4-3,4-2,2-4"
DEFAULT_DEPTHS = "0.25,0.5,0.9"
FILES = 8  # the "files" source: enough for whole-file shards on 2, 3 and 4 shards


def _pipeline(paths: list, shards: int, index: int) -> streamio.Dataset:
    ds = streamio.Dataset(paths, "tfrecord", decoder=example_decoder())
    ds = ds.shuffle(10000, seed=0).batch(256).prefetch().with_context(epoch=0)
    return ds.shard(shards, index) if shards > 1 else ds


def _marks(paths: list, shards: int) -> list:
    """For each shard of the uninterrupted epoch, the time at which each batch arrived and
    the time the epoch ended (the last mark)."""
    clock = time.perf_counter
    found = []
    for i in range(shards):
        t0 = clock()
        marks = [clock() - t0 for _ in _pipeline(paths, shards, i)]
        marks.append(clock() - t0)
        found.append(marks)
    return found


def _checkpoint(paths: list, shards: int, marks: list, depth: float) -> tuple:
    """Each shard's state after ``depth`` of its batches, the uninterrupted remainder (the
    slowest shard's seconds) and the batches left."""
    states, rest, left = [], [], 0
    for i in range(shards):
        batches = len(marks[i]) - 1
        cut = min(max(batches - 1, 0), round(depth * batches))
        it = iter(_pipeline(paths, shards, i))
        for _ in range(cut):
            next(it)
        states.append(it.state_dict())
        it.close()
        rest.append(marks[i][-1] - marks[i][cut])
        left += batches - cut
    return states, max(rest), left


def _resume(paths: list, shards: int, states_for, left: int) -> tuple:
    """(slowest time to the first batch, slowest time to the end) over ``shards`` resumed
    shards; shard ``j`` resumes from ``states_for(j)``. Together they must deliver the
    ``left`` batches the old shards had not (the remainder keeps the old batches)."""
    clock = time.perf_counter
    first, end = [], []
    delivered = 0
    for j in range(shards):
        t0 = clock()
        it = _pipeline(paths, shards, j).iter_from(states_for(j))
        got = next(it, None)
        first.append(clock() - t0)
        if got is not None:
            delivered += 1 + sum(1 for _ in it)
        end.append(clock() - t0)
    if delivered != left:
        raise RuntimeError(f"the resumed shards delivered {delivered} batches, not {left}")
    return max(first), max(end)


def _print_pipe(tmp: str, data: str, layouts: list, depths: list, rounds: int) -> None:
    from . import elastic_pipe

    why = elastic_pipe.available()
    if why is not None:
        print(why)
        return
    for n, m, depth, med in elastic_pipe.rows(tmp, data, layouts, depths, rounds):
        print(f"{'pipe':6} {f'{n}->{m}':>5} {depth:6.2f} {med[0]:10.3f} {med[1]:8.3f}"
              f" {med[2]:7.3f} {med[3]:7.3f} {med[4]:8.3f}", flush=True)


def _layouts(text: str) -> list:
    pairs = []
    for item in text.split(","):
        n, m = (int(v) for v in item.split("-"))
        if n < 1 or m < 1:
            raise SystemExit(f"layouts are N-M with N, M >= 1, not {item!r}")
        pairs.append((n, m))
    return pairs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                        help=f"old-new shard counts (default {DEFAULT_LAYOUTS})")
    parser.add_argument("--depths", default=DEFAULT_DEPTHS)
    parser.add_argument("--sources", default="files,gzip",
                        help="files, gzip, pipe (a PipeChannel shared by DataLoader workers:"
                             " needs torch and torchdata)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    depths = [float(d) for d in args.depths.split(",")]
    layouts = _layouts(args.layouts)
    kinds = [k.strip() for k in args.sources.split(",")]
    warnings.simplefilter("ignore")  # the gzip file is dealt round-robin: it warns, once a shard
    with tempfile.TemporaryDirectory() as tmp:
        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        records = [bytes(p) for p in payloads]
        del payloads
        files = []
        for k in range(FILES):
            files.append(os.path.join(tmp, f"part-{k}.tfrecord"))
            streamio.write_records(files[-1], "tfrecord", records[k::FILES])
        gzip = os.path.join(tmp, "data.tfrecord.gz")
        streamio.write_records(gzip, "tfrecord", records, compression="gzip")
        plain = os.path.join(tmp, "data.tfrecord")
        if "pipe" in kinds:
            streamio.write_records(plain, "tfrecord", records)
        del records
        sources = {"files": files, "gzip": [gzip]}
        size = sum(os.stat(p).st_size for p in files)
        print(f"{args.records} records, {size / 1e6:.1f} MB in {FILES} files"
              f" ({os.stat(gzip).st_size / 1e6:.1f} MB gzip, one file);"
              f" shuffle(10000).batch(256).prefetch(), Example decoder; medians of"
              f" {args.rounds} rounds; a job's time is its slowest shard's")
        print(f"{'source':6} {'n->m':>5} {'depth':>6} {'elastic_s':>10} {'first_s':>8}"
              f" {'same_s':>7} {'rest_s':>7} {'epoch_s':>8}")
        for kind in kinds:
            if kind == "pipe":
                _print_pipe(tmp, plain, layouts, depths, args.rounds)
                continue
            paths = sources[kind]
            for n, m in layouts:
                rows = {d: [] for d in depths}
                for _ in range(args.rounds):
                    old_marks = _marks(paths, n)
                    epoch_m = max(marks[-1] for marks in _marks(paths, m))
                    for depth in depths:
                        states, rest, left = _checkpoint(paths, n, old_marks, depth)
                        first, elastic = _resume(paths, m, lambda j: states, left)
                        _, same = _resume(paths, n, lambda i: states[i], left)
                        rows[depth].append((elastic, first, same, rest, epoch_m))
                for depth in depths:
                    med = [statistics.median(col) for col in zip(*rows[depth])]
                    print(f"{kind:6} {f'{n}->{m}':>5} {depth:6.2f} {med[0]:10.3f} {med[1]:8.3f}"
                          f" {med[2]:7.3f} {med[3]:7.3f} {med[4]:8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

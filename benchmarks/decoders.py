"""Decoders that gained a C path in issue 14 (item 2), side by side in one run:

* ``sparse``: SageMaker RecordIO-protobuf rows of ~50 nonzeros out of 1M columns (float32 values,
  uint64 keys, shape) plus a float32 label, into a CSR ``SparseBatch``: ``RecordIOProtobuf`` with
  the C kernel and with the pure-Python reference path;
* ``sequence``: ``tf.train.SequenceExample`` records, context float + int64, two feature lists
  of 10-50 steps (float32[4] and int64 a step): ``SequenceExample`` with the C kernel, with the
  pure-Python reference, and ``tf.io.parse_sequence_example`` on the same batches (in its own
  process, the serialized batches made into tensors before timing; eager and inside a
  ``tf.function``, the faster reported).

Decode only: the records are in memory as each reader's batch type (Python ``bytes`` lists for
streamio, string tensors for TensorFlow). Each figure is the median of ``--rounds``, rounds
alternating between the contestants.

    python benchmarks/decoders.py [--records 20000] [--batch 256] [--rounds 3] [--no-tf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Callable, List

import numpy as np

from streamio.decoders.wire import encode_varint, len_field


def _entry(key: bytes, value: bytes) -> bytes:
    return len_field(1, len_field(1, key) + len_field(2, value))


def _float_feature(values) -> bytes:
    return len_field(2, len_field(1, struct.pack("<%df" % len(values), *values)))


def _int64_feature(values) -> bytes:
    return len_field(3, len_field(1, b"".join(encode_varint(v & (2 ** 64 - 1)) for v in values)))


def sequence_records(n: int, seed: int = 0) -> List[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        steps = int(rng.integers(10, 51))
        context = (_entry(b"score", _float_feature([float(rng.standard_normal())]))
                   + _entry(b"user", _int64_feature([int(rng.integers(0, 1 << 40))])))
        emb = rng.standard_normal((steps, 4)).astype(np.float32)
        tok = rng.integers(0, 50_000, steps)
        lists = (_entry(b"emb", b"".join(len_field(1, _float_feature(row)) for row in emb))
                 + _entry(b"tok", b"".join(len_field(1, _int64_feature([int(t)])) for t in tok)))
        out.append(len_field(1, context) + len_field(2, lists))
    return out


def sparse_records(n: int, seed: int = 0) -> List[bytes]:
    import scipy.sparse as sp

    from streamio.decoders.recordio_protobuf import encode_recordio_protobuf

    rng = np.random.default_rng(seed)
    nnz, ncol = 50, 1_000_000
    indices = np.sort(rng.choice(ncol, (n, nnz), replace=True), axis=1).ravel()
    x = sp.csr_matrix((rng.standard_normal(n * nnz).astype(np.float32), indices,
                       np.arange(n + 1) * nnz), shape=(n, ncol))
    return encode_recordio_protobuf(x, rng.integers(0, 2, n).astype(np.float32))


def _rate(decode: Callable[[list], object], records: list, batch: int) -> float:
    start = time.perf_counter()
    for s in range(0, len(records), batch):
        decode(records[s:s + batch])
    return len(records) / (time.perf_counter() - start)


def _streamio_cases(records_seq: list, records_sparse: list) -> dict:
    """name -> (decode function, records); the C and Python paths of each decoder."""
    from streamio.decoders import example, recordio_protobuf
    from streamio.decoders.example import FixedLen, SequenceExample

    seq = SequenceExample(context={"score": FixedLen((), "float32"), "user": FixedLen((), "int64")},
                          sequence={"emb": FixedLen((4,), "float32"), "tok": FixedLen((), "int64")})
    sparse = recordio_protobuf.RecordIOProtobuf()
    sparse.decode_batch(records_sparse[:1])  # primed: the schema from the first record

    def with_kernel(module, attr, kernel, decode):
        def run(batch):
            saved = getattr(module, attr, None)
            setattr(module, attr, kernel)
            try:
                return decode(batch)
            finally:
                setattr(module, attr, saved)
        return run

    c_seq = getattr(example, "_c_parse_sequence_examples", None)  # None: an older tree
    c_rp = recordio_protobuf._c_parse_recordio_protobuf
    cases = {}
    if c_seq is not None:
        cases["sequence/streamio-C"] = (seq.decode_batch, records_seq)
    cases["sequence/streamio-python"] = (
        with_kernel(example, "_c_parse_sequence_examples", None, seq.decode_batch), records_seq)
    if c_rp is not None:
        cases["sparse/streamio-C"] = (sparse.decode_batch, records_sparse)
    cases["sparse/streamio-python"] = (
        with_kernel(recordio_protobuf, "_c_parse_recordio_protobuf", None, sparse.decode_batch),
        records_sparse)
    return cases


_TF_WORKER = r"""
import json, sys, time, statistics
import tensorflow as tf
path, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
batches = [b for b in tf.data.TFRecordDataset(path).batch(batch)]
context = {"score": tf.io.FixedLenFeature([], tf.float32), "user": tf.io.FixedLenFeature([], tf.int64)}
sequence = {"emb": tf.io.FixedLenSequenceFeature([4], tf.float32),
            "tok": tf.io.FixedLenSequenceFeature([], tf.int64)}
n = sum(int(b.shape[0]) for b in batches)
def eager(b):
    return tf.io.parse_sequence_example(b, context_features=context, sequence_features=sequence)
graph = tf.function(eager)
out = {}
for name, fn in (("eager", eager), ("tf.function", graph)):
    fn(batches[0])  # traced / warmed
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        for b in batches:
            fn(b)
        rates.append(n / (time.perf_counter() - t))
    out[name] = statistics.median(rates)
print(json.dumps(out))
"""


def tf_sequence_rates(records: list, batch: int, rounds: int) -> dict:
    from streamio.formats.tfrecord import encode_tfrecord

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "seq.tfrecord")
        with open(path, "wb") as f:
            for r in records:
                f.write(encode_tfrecord(r))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        proc = subprocess.run([sys.executable, "-c", _TF_WORKER, path, str(batch), str(rounds)],
                              capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode:
            return {"error": proc.stderr[-500:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-tf", action="store_true", help="skip tf.io.parse_sequence_example")
    args = p.parse_args(argv)
    seq, sparse = sequence_records(args.records), sparse_records(args.records)
    cases = _streamio_cases(seq, sparse)
    # the Python paths are ~30x slower: a tenth of the records keeps the run short
    rates = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (decode, records) in cases.items():
            part = records if name.endswith("-C") else records[:max(args.batch, len(records) // 10)]
            rates[name].append(_rate(decode, part, args.batch))
    result = {name: statistics.median(r) for name, r in rates.items()}
    if not args.no_tf:
        for mode, rate in tf_sequence_rates(seq, args.batch, args.rounds).items():
            result[f"sequence/tf.io.parse_sequence_example ({mode})"] = rate
    print(f"batches of {args.batch}, median of {args.rounds} rounds, records/s")
    for name, rate in result.items():
        print(f"  {name:55s} {rate:>14,.0f}" if isinstance(rate, float) else f"  {name}: {rate}")
    tf_best = max((v for k, v in result.items() if "parse_sequence_example" in k
                   and isinstance(v, float)), default=None)
    if tf_best and "sequence/streamio-C" in result:
        print(f"  SequenceExample C / best tf.io.parse_sequence_example: "
              f"{result['sequence/streamio-C'] / tf_best:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

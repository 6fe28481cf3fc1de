"""Seed corpora for the fuzz targets, made by streamio's own writers and the peers' files.

    python tests/fuzz/make_corpus.py [--out build/fuzz/seeds]

Each target gets ``<out>/<target>/<sha1>`` files in its input layout (targets.py): the inputs in
``findings/<target>-*`` (bugs found before: a regression comes back at once), TFRecord and
RecordIO streams from ``streamio.write_records``, Examples from ``encode_example``,
SequenceExamples made of its Features, RecordIO-protobuf records from ``write_recordio_protobuf``,
CSV text, and the files in ``../shared/peer-fixtures/`` (used when present; cut to ``MAX_SEED``
bytes). The seeds are deterministic (a fixed random seed), so a corpus can be rebuilt at any
time; ``build/`` is gitignored.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import shutil
import struct
import sys
from pathlib import Path
from typing import Dict, Iterable, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import targets as T  # noqa: E402

from streamio.decoders.wire import len_field as _ld  # noqa: E402  (a length-delimited field)

ROOT = Path(__file__).resolve().parents[2]
# ../shared/peer-fixtures beside the checkout (/work/main), or two levels up (a worktree)
_PEER_PLACES = [p / "shared" / "peer-fixtures" for p in (ROOT.parent, ROOT.parent.parent)]
PEER = next((p for p in _PEER_PLACES if p.is_dir()), _PEER_PLACES[0])
FIXTURES = ROOT / "fixtures"
DEFAULT_OUT = ROOT / "build" / "fuzz" / "seeds"
FINDINGS = Path(__file__).resolve().parent / "findings"
MAX_SEED = 4096  # libFuzzer's default -max_len: longer seeds would only be cut


def _peer(relpath: str) -> bytes:
    path = PEER / relpath
    return path.read_bytes() if path.exists() else b""


def _stream(fmt: str, records: Iterable[bytes], **options) -> bytes:
    import streamio

    buf = io.BytesIO()
    streamio.write_records(buf, fmt, list(records), **options)
    return buf.getvalue()


def _payloads(data: bytes, fmt: str, limit: int = 12, **options) -> List[bytes]:
    """The first records of a stream (the decoders' targets take records, not streams)."""
    import streamio

    out = []
    try:
        for record in streamio.read_records(io.BytesIO(data), fmt, **options):
            out.append(record)
            if len(out) == limit:
                break
    except streamio.StreamioError:
        pass
    return out


def _flip(data: bytes, rng: random.Random, flips: int = 1) -> bytes:
    out = bytearray(data)
    for _ in range(flips if out else 0):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _some_records(rng: random.Random) -> List[List[bytes]]:
    return [[], [b""], [b"a"], [b"hello world %d" % i for i in range(5)],
            [rng.randbytes(rng.choice([1, 7, 100, 500])) for _ in range(6)],
            [b"x" * 1500, b"", b"y" * 3],
            [rng.randbytes(n) for n in (512, 1000, 2047)]]  # copied while folded (AVX-512)


def scan_tfrecords_seeds(rng: random.Random) -> List[bytes]:
    streams = [_stream("tfrecord", records) for records in _some_records(rng)]
    streams += [_peer("sagemaker-tensorflow-extensions/100.tfrecords"),
                (FIXTURES / "tf" / "plain.tfrecord").read_bytes()[:MAX_SEED],
                (FIXTURES / "examples" / "examples.tfrecord").read_bytes()]
    streams = [s for s in streams if s]
    seeds = []
    for i, stream in enumerate(streams):
        seeds.append(T.encode_scan_tfrecords(stream))
        seeds.append(T.encode_scan_tfrecords(stream, framer=True, cut_seed=i, limit=i % 8,
                                             wrap=i % 4, on_error_skip=i % 2 == 1))
        seeds.append(T.encode_scan_tfrecords(_flip(stream, rng), framer=True, cut_seed=i,
                                             on_error_skip=True))
        seeds.append(T.encode_scan_tfrecords(stream, whole=False, verify=False, pos=3,
                                             end=len(stream) - 5))
        # The span kernel with room for a few records, and framers fed through feed_spans.
        seeds.append(T.encode_scan_tfrecords(stream, framer=True, cut_seed=i, room=1 + i % 5,
                                             on_error_skip=i % 2 == 0))
        seeds.append(T.encode_scan_tfrecords(_flip(stream, rng), framer=True, cut_seed=i,
                                             room=63, on_error_skip=True))
    return seeds


def scan_recordio_seeds(rng: random.Random) -> List[bytes]:
    magic = struct.pack("<I", 0xCED7230A)
    with_magic = [b"ab" * 4 + magic + b"cd", magic, b"abcd" + magic + magic + b"x"]
    streams = [_stream("recordio", records) for records in _some_records(rng)]
    streams += [_stream("recordio", with_magic), _stream("recordio", with_magic,
                                                           multipart="concat")]
    for rel in ("ml-io/complete_records.pr", "ml-io/split_records.pr",
                "ml-io/corrupted_split_records.pr", "ml-io/test.pbr", "ml-io/test_image_0.rec",
                "sagemaker-python-sdk/first_10_rows_recordio",
                "sagemaker-xgboost-container/train.pb",
                "sagemaker-xgboost-container/sparse_edge_cases/diagonal.pbr"):
        streams.append(_peer(rel)[:MAX_SEED])
    streams = [s for s in streams if s]
    seeds = []
    for i, stream in enumerate(streams):
        seeds.append(T.encode_scan_recordio(stream))
        seeds.append(T.encode_scan_recordio(stream, framer=True, options=i % 8, cut_seed=i,
                                            wrap=i % 4, limit=i % 8))
        seeds.append(T.encode_scan_recordio(_flip(stream, rng), framer=True, options=1 | i % 2 * 2,
                                            cut_seed=i))
        seeds.append(T.encode_scan_recordio(stream, whole=False, pos=8, end=len(stream) - 3))
    return seeds


def parse_examples_seeds(rng: random.Random) -> List[bytes]:
    from streamio import encode_example

    records = [encode_example({"x": [float(i), -1.5, 1e30], "label": i - 3,
                               "tags": [b"a" * i, "b"]}) for i in range(4)]
    records.append(encode_example({"x": np.float32([0.5] * 7), "label": [2 ** 40, -1],
                                   "": b"empty key", "\xff": [True, False]}))
    records.append(encode_example({}))
    full = (b"x", 2), (b"label", 3), (b"tags", 1)
    tf_written = _payloads((FIXTURES / "examples" / "examples.tfrecord").read_bytes(), "tfrecord")
    seeds = [T.encode_parse_examples(records, full),
             T.encode_parse_examples(records[:2], ((b"x", 2),), wrap=2),
             T.encode_parse_examples(records, ((b"x", 3), (b"tags", 1)), wrap=3),  # wrong kind
             T.encode_parse_examples([_flip(r, rng, 2) for r in records], full),
             T.encode_parse_examples(records[:1] + [b"\x0a\x05ab"], full),
             T.encode_parse_examples([], full)]
    if tf_written:  # written by TensorFlow (fixtures/make_examples.py), described beside
        import json

        features = json.loads((FIXTURES / "examples" / "examples.json").read_text())["features"]
        kinds = {"bytes": 1, "float32": 2, "int64": 3}
        spec = [(name.encode(), kinds.get(f.get("dtype"), 1)) for name, f in features.items()]
        for start in range(0, len(spec), 7):
            seeds.append(T.encode_parse_examples(tf_written, spec[start:start + 7]))
    return seeds


def _field_payload(buf: bytes) -> tuple:
    """(payload, rest) of the length-delimited field at the front of ``buf``."""
    pos = 1  # the tags here are one byte (field numbers 1 and 2)
    length = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return buf[pos:pos + length], buf[pos + length:]


def _feature(value) -> bytes:
    """One ``Feature`` as streamio's ``encode_example`` writes it (Example > Features > map
    entry > value), so the steps below use streamio's own encoding of values."""
    from streamio import encode_example

    features, _ = _field_payload(encode_example({"v": value}))
    entry, _ = _field_payload(features)
    _, after_key = _field_payload(entry)
    return _field_payload(after_key)[0]


def _sequence_example(context: dict, lists: dict) -> bytes:
    """A ``SequenceExample``: ``context`` is a Features, the same bytes as an Example's field 1
    (so ``encode_example`` writes it), ``feature_lists`` (field 2) maps a name to a FeatureList
    (repeated Feature, field 1)."""
    from streamio import encode_example

    entries = b"".join(_ld(1, _ld(1, name.encode()) + _ld(2, b"".join(_ld(1, _feature(step))
                                                                        for step in steps)))
                       for name, steps in lists.items())
    return encode_example(context) + (_ld(2, entries) if lists else b"")


def parse_sequence_examples_seeds(rng: random.Random) -> List[bytes]:
    records = [_sequence_example({"id": i, "w": [0.5, float(i)], "tags": [b"t"] * (i + 1)},
                                 {"tok": [[i, t] for t in range(i)],
                                  "emb": [np.float32([t, -t, 0.25]) for t in range(i + 1)],
                                  "word": [[b"w%d" % t] for t in range(i)]})
               for i in range(4)]
    records.append(_sequence_example({"": b"empty key"}, {"": [[1], [2, 3]], "\xff": [[True]]}))
    records.append(_sequence_example({}, {}))
    records.append(_sequence_example({"id": 7}, {"tok": []}))  # a FeatureList of no steps
    context = (b"id", 3), (b"w", 2), (b"tags", 1)
    sequence = (b"tok", 3), (b"emb", 2), (b"word", 1)
    seeds = [T.encode_parse_sequence_examples(records, context, sequence),
             T.encode_parse_sequence_examples(records[:2], ((b"w", 2),), ((b"emb", 2),), wrap=2),
             T.encode_parse_sequence_examples(records, (), ((b"tok", 2), (b"word", 1)),
                                              wrap=3),  # wrong kind
             T.encode_parse_sequence_examples(records, ((b"", 1),), ((b"", 3), (b"\xc3\xbf", 3)),
                                              wrap=1),
             T.encode_parse_sequence_examples([_flip(r, rng, 2) for r in records], context,
                                              sequence),
             T.encode_parse_sequence_examples(records[:1] + [b"\x12\x05ab"], context, sequence),
             T.encode_parse_sequence_examples([], context, sequence)]
    # a step whose packed int64s end inside a varint, after records with steps: the error names
    # the record of that step (counted from the steps before it)
    cut_step = _ld(1, _ld(1, b"tok") + _ld(2, _ld(1, _ld(3, _ld(1, b"\x05\xff")))))
    seeds.append(T.encode_parse_sequence_examples(records[:4] + [_ld(2, cut_step)] + records[:2],
                                                  context, sequence))
    tf_written = _payloads((FIXTURES / "examples" / "sequence_examples.tfrecord").read_bytes(),
                           "tfrecord")
    if tf_written:  # written by TensorFlow (fixtures/make_examples.py), described beside
        import json

        described = json.loads((FIXTURES / "examples" / "sequence_examples.json").read_text())
        kinds = {"bytes": 1, "float32": 2, "int64": 3}
        spec = {part: tuple((name.encode(), kinds.get(f.get("dtype"), 1))
                            for name, f in described[part].items())
                for part in ("context", "sequence")}
        seeds.append(T.encode_parse_sequence_examples(tf_written, spec["context"],
                                                      spec["sequence"]))
        seeds.append(T.encode_parse_sequence_examples(tf_written, spec["sequence"],
                                                      spec["context"], wrap=3))
    return seeds


def parse_recordio_protobuf_seeds(rng: random.Random) -> List[bytes]:
    from streamio.decoders.recordio_protobuf import encode_recordio_protobuf

    x = np.arange(12, dtype=np.float32).reshape(4, 3) - 2.5
    batches = [
        (encode_recordio_protobuf(x, np.arange(4, dtype=np.float32)),
         [((1, b"values"), 2), ((2, b"values"), 2)]),
        (encode_recordio_protobuf(x.astype(np.float64), np.arange(4, dtype=np.float64)),
         [((1, b"values"), 3), ((2, b"values"), 3)]),
        (encode_recordio_protobuf(x.astype(np.int32) * 1000, np.arange(4, dtype=np.int32)),
         [((1, b"values"), 7), ((2, b"values"), 7)]),
        (encode_recordio_protobuf({"values": x, "w": x[:, :1]}),
         [((1, b"values"), 2), ((1, b"w"), 2)]),
    ]
    try:
        import scipy.sparse

        sparse = scipy.sparse.random(5, 50, density=0.1, format="csr", dtype=np.float32,
                                     random_state=1)
        batches.append((encode_recordio_protobuf(sparse, np.ones(5, dtype=np.float32)),
                        [((1, b"values"), 2), ((2, b"values"), 2)]))
    except ImportError:
        pass
    for rel, kind in (("ml-io/complete_records.pr", 2), ("ml-io/test.pbr", 7),
                      ("sagemaker-xgboost-container/train.pb", 7),
                      ("sagemaker-xgboost-container/sparse/train.pb", 7),
                      ("sagemaker-xgboost-container/single_feature_label.pb", 3),
                      ("sagemaker-xgboost-container/sparse_edge_cases/rectangular_sparse.pbr", 7),
                      ("sagemaker-python-sdk/nips-train_1.pbr", 2),
                      ("sagemaker-python-sdk/first_10_rows_recordio", 2)):
        records = _payloads(_peer(rel), "recordio", limit=3, multipart="concat")
        if records:
            batches.append(([r for r in records if len(r) < MAX_SEED // 2][:3] or records[:1],
                            [((1, b"values"), kind), ((2, b"values"), kind)]))
    seeds = []
    for i, (records, spec) in enumerate(batches):
        seeds.append(T.encode_parse_recordio_protobuf(records, spec, wrap=i % 4))
        seeds.append(T.encode_parse_recordio_protobuf([_flip(r, rng, 2) for r in records], spec))
    return seeds


def parse_csv_floats_seeds(rng: random.Random) -> List[bytes]:
    hard = [b"9007199254740993", b"0.1e-22", b"1234567890123456789012", b"2.2250738585072011e-308",
            b"7.038531e-26", b"123456789e-30"]
    numbers = [repr(rng.uniform(-1e6, 1e6)).encode() for _ in range(30)]
    rows3 = [b",".join(numbers[i:i + 3]) for i in range(0, 30, 3)]
    seeds = [T.encode_parse_csv_floats(rows3, 3),
             T.encode_parse_csv_floats(rows3, 3, double=True, usecols=[2, 0]),
             T.encode_parse_csv_floats([b";".join(hard)], len(hard), delimiter=b";", double=True),
             T.encode_parse_csv_floats([b",".join(hard)], len(hard)),
             T.encode_parse_csv_floats([b"-0,+.5,5.,1e400", b"1e-400,0000.000,.5e-3,-1"], 4),
             T.encode_parse_csv_floats([b"1,2", b"3"], 2),
             T.encode_parse_csv_floats([b'"1",2'], 2),
             T.encode_parse_csv_floats([b"nan,inf", b" 1,2"], 2, double=True)]
    for rel, ncols in (("ml-io/test.csv", 4), ("sagemaker-xgboost-container/train.csv", 6)):
        text = _peer(rel)
        if text:
            seeds.append(T.encode_parse_csv_floats(text.rstrip(b"\n").split(b"\n"), ncols))
            seeds.append(T.encode_parse_csv_floats(text.replace(b"\r", b"").split(b"\n"), ncols,
                                                   usecols=[0]))
    return seeds


def shuffle_seeds(rng: random.Random) -> List[bytes]:
    seeds = []
    for n in (1, 2, 5, 16, 40):
        seeds.append(T.encode_shuffle(n, [rng.randrange(-n, n) for _ in range(rng.randint(0, 60))]))
        seeds.append(T.encode_shuffle(n, [0] * 5 + [n - 1, -1, -n], aliased=True))
        seeds.append(T.encode_shuffle(n, [n, 3, -n - 1][:rng.randint(1, 3)], wide=True))
    return seeds


def mix_take_seeds(rng: random.Random) -> List[bytes]:
    """Two to a few parts by weight (3/4 and 1/4 as the mix benchmark, equal thirds, an empty
    range), with and without origins; parts that run out before the draws, draws that run out
    first, a limit that cuts; parts held only by the kernel's argument (moved out) or elsewhere
    too (read), an output list given to append to; records in buffers, two such parts alone
    among them."""
    seeds = []
    for cuts in ([3 << 30], [1 << 30, 2 << 30], [0, 1 << 31, 1 << 31]):
        k = len(cuts) + 1
        for origins in (False, True):
            draws = [rng.getrandbits(32) for _ in range(rng.randint(0, 80))]
            sizes = [rng.randint(0, 40) for _ in range(k)]
            starts = [rng.randint(0, s) for s in sizes]
            seeds.append(T.encode_mix_take(sizes, starts, cuts, draws, origins=origins,
                                           limit=rng.choice([0, 7, 64, 255])))
            seeds.append(T.encode_mix_take([200] * k, [0] * k, cuts, draws, begin=3,
                                           origins=origins))
            # Parts held elsewhere too (read, not moved), and a list given to append to.
            seeds.append(T.encode_mix_take(sizes, starts, cuts, draws, origins=origins,
                                           shared=True, into=rng.randint(1, 7)))
            # Records in buffers (made by the kernel), one past its buffer.
            seeds.append(T.encode_mix_take(sizes, starts, cuts, draws, origins=origins,
                                           spans=True))
            seeds.append(T.encode_mix_take(sizes, [0] * k, cuts, draws, spans=True, raw=True))
        # Two parts of records in buffers, without origins: the kernel's own loop for them.
        draws = [rng.getrandbits(32) for _ in range(rng.randint(20, 80))]
        seeds.append(T.encode_mix_take([2 * rng.randint(0, 20), 2 * rng.randint(0, 20)],
                                       [0, 1], cuts[:1], draws, spans=True,
                                       limit=rng.choice([7, 64, 255])))
        seeds.append(T.encode_mix_take([40, 30], [0, 0], cuts[:1], draws, spans=True, raw=True))
    return seeds


def crc32c_seeds(rng: random.Random) -> List[bytes]:
    seeds = [T.encode_crc32c(b"123456789"), T.encode_crc32c(b"", start=0xFFFFFFFF)]
    # 511/512/513...: around the length where the AVX-512 kernel starts folding (2 blocks of
    # 256), its 64-byte steps and the crc32-instruction tail after them.
    for length in (1, 7, 8, 64, 255, 511, 512, 513, 575, 767, 768, 769, 831, 3000, 4000):
        seeds.append(T.encode_crc32c(rng.randbytes(length), offset=length % 8,
                                     start=rng.getrandbits(32) if length % 2 else None))
    return seeds


def find_sync_seeds(rng: random.Random) -> List[bytes]:
    """Garbage, then real frames written by streamio's own encoders, at every alignment."""
    from streamio.formats import encode_recordio, encode_tfrecord

    seeds = []
    for junk in (0, 1, 3, 5, 64):
        for frame in (encode_tfrecord(b"payload"), encode_recordio(b"payload"),
                      encode_recordio(b"x" * 40, multipart="concat")):
            buf = bytes(junk) + rng.randbytes(junk) + frame + encode_tfrecord(b"next")
            seeds.append(T.encode_find_sync(buf, base=junk % 4, pos=junk % 3))
    for frame in (encode_tfrecord(b""), encode_recordio(b"")):  # a header as the last bytes
        seeds.append(T.encode_find_sync(rng.randbytes(8) + frame[:12]))
    seeds.append(T.encode_find_sync(bytes(4096)))  # a run of zeros: the slow case once
    seeds.append(T.encode_find_sync(rng.randbytes(2048), limit=16))
    # dense candidates (the search's block filters pass nearly every offset / aligned word):
    # small u64s before a TFRecord frame, magic numbers before a RecordIO one
    small = b"".join(struct.pack("<Q", rng.randrange(1000)) for _ in range(200))
    seeds.append(T.encode_find_sync(small + encode_tfrecord(b"payload"), which=1, limit=1 << 28))
    magics = (b"\x0a\x23\xd7\xce" + struct.pack("<I", 2 << 29)) * 100
    for base in range(4):
        seeds.append(T.encode_find_sync(magics + encode_recordio(b"payload"), which=2, base=base,
                                        cut=base))
    return seeds


def resample_seeds(rng: random.Random) -> List[bytes]:
    """Small images of each filter and channel count: whole-image and fractional boxes, down
    and up, the vertical-first case (height shrinking much more than width), wild boxes."""
    seeds = []
    for i in range(40):
        h, w = rng.randint(1, 24), rng.randint(1, 24)
        box = None if i % 4 == 0 else tuple(rng.randrange(65536) for _ in range(4))
        seeds.append(T.encode_resample(rng.randbytes(rng.randint(1, 3 * h * w)), h=h, w=w,
                                       out_w=rng.randint(1, 40), out_h=rng.randint(1, 40),
                                       box=box, filter_index=i % 5, rgb=i % 3 != 0, isa=i % 4,
                                       wild=i % 7 == 6))
    seeds.append(T.encode_resample(rng.randbytes(600), h=24, w=10, out_w=8, out_h=3))
    return seeds


def parse_index_seeds(rng: random.Random) -> List[bytes]:
    """Index files as streamio index / pack write them (both dialects, for real TFRecord and
    RecordIO files), CRLF and blank-line variants, one flipped byte, and kinds of lie."""
    from streamio.formats.index_file import encode_index

    out = []
    for records in _some_records(rng):
        for fmt in ("tfrecord", "recordio"):
            entries, at = [], 0
            for key, record in enumerate(records):
                n = len(_stream(fmt, [record]))
                entries.append((key, at, n))
                at += n
            text = "".join(encode_index(fmt, entries)).encode()
            for variant in (text, text.replace(b"\n", b"\r\n"), b"\n" + text + b"\n\n",
                            _flip(text, rng), text[::-1], text + b"1" * 30 + b" 1\n"):
                out.append(T.encode_parse_index(variant, size=at))
    return out


def csv_rows_seeds(rng: random.Random) -> List[bytes]:
    """Rows of three columns, good and bad: ragged, not numbers, quotes closed, doubled and left
    open, bytes that are not UTF-8, missing values, rows wider than max_columns."""
    fields = [b"1", b"-2.5", b"", b"x", b'"3"', b'"4,5"', b'"6', b"\xff", b"1e3", b" 7 ", b'"a""b"']
    seeds = []
    for _ in range(30):
        rows = [b",".join(rng.choice(fields) for _ in range(rng.choice([1, 2, 3, 3, 3, 4, 9])))
                for _ in range(rng.randint(1, 12))]
        seeds.append(T.encode_csv_rows(rows, limit=rng.randint(3, 8), dtype=rng.randrange(3)))
    return seeds


def shared_wire_seeds(rng: random.Random) -> List[bytes]:
    """Both directions of the shared stream: hellos, requests and goodbyes; blocks, an END and
    errors as the dealer writes them (one with a pickle where JSON belongs)."""
    import numpy as np
    from streamio.sharing import _wire as W
    from streamio.errors import CorruptRecordError, SourceError

    hello = W.encode_hello(1, 0, 2, 2)
    seeds = [T.encode_shared_wire(hello + b"WWB", to_dealer=True, seed=i) for i in range(3)]
    seeds.append(T.encode_shared_wire(b"GET / HTTP/1.0\r\n", to_dealer=True))
    seeds.append(T.encode_shared_wire(b"sio\x01" + bytes(16), to_dealer=True))
    for records in _some_records(rng)[2:6]:
        records = records[:64] or [b""]
        ids = np.arange(len(records), dtype=np.int64) + rng.randrange(1 << 40)
        block = W.encode_block("train_0", ids, records)
        seeds.append(T.encode_shared_wire(block + W.encode_end()))
    error = CorruptRecordError("bad crc", source="a.fifo", offset=12, record_index=3)
    seeds.append(T.encode_shared_wire(W.encode_error(error, 1, 0)))
    seeds.append(T.encode_shared_wire(W.encode_error(SourceError("gone", source="b"))))
    evil = b"cos\nsystem\n(S'id'\ntR."
    seeds.append(T.encode_shared_wire(W.HEADER.pack(W.ERROR, 0, len(evil)) + evil))
    return seeds


def resume_state_seeds(rng: random.Random) -> List[bytes]:
    """States the fuzzed pipeline took at several points of several epochs, and a few near
    misses (a changed seed, a count past the end, a string where a number belongs)."""
    ds = T._resume_pipeline()
    seeds = []
    for epoch, taken in ((0, 0), (0, 3), (1, 5), (4, 8)):
        it = iter(ds.with_context(epoch=epoch))
        for _ in range(taken):
            next(it)
        state = it.state_dict()
        it.close()
        seeds.append(T.encode_resume_state(state))
    seeds.append(T.encode_resume_state({**state, "seeds": [2, None, 2]}))
    seeds.append(T.encode_resume_state({**state, "delivered": 10 ** 6}))
    # Sealed again (check recomputed): past the check, so the later checks are reached.
    from streamio.pipeline.resume import seal

    seeds.append(T.encode_resume_state(seal({**state, "seeds": [2, None, 2]})))
    seeds.append(T.encode_resume_state(seal({**state, "delivered": 10 ** 6})))
    seeds.append(T.encode_resume_state({**state, "epoch": "1", "finished": "no"}))
    # Elastic: the states of 2 shards (a list), and the state of an epoch resumed from them.
    shards = []
    for i in range(2):
        it = iter(ds.shard(2, i))
        next(it)
        shards.append(it.state_dict())
        it.close()
    seeds.append(T.encode_resume_state(shards))
    it = ds.iter_from(shards)
    next(it)
    seeds.append(T.encode_resume_state(it.state_dict()))
    it.close()
    return seeds


def byte_ranges_seeds(rng: random.Random) -> List[bytes]:
    """Valid files whose payloads hold whole frames of their format (a frame, a stream of
    them, a frame of a frame), as payloads and as files, cut 2 to 8 ways; and damaged ones."""
    from streamio.formats import encode_recordio, encode_tfrecord

    seeds = []
    for recordio, encode in ((False, encode_tfrecord), (True, encode_recordio)):
        for k in range(6):
            payloads = []
            for i in range(rng.randint(1, 8)):
                plain = rng.randbytes(rng.randint(0, 30))
                kind = (i + k) % 4
                body = (plain if kind == 0 else encode(plain) if kind == 1 else
                        encode(encode(plain)) if kind == 2 else
                        b"".join(encode(rng.randbytes(rng.randint(0, 9))) for _ in range(3)))
                payloads.append(body[:255])
            packed = b"".join(bytes([len(p)]) + p for p in payloads)
            file = b"".join(encode(p) for p in payloads)
            for skip in (False, True):
                seeds.append(T.encode_byte_ranges(packed, recordio=recordio, skip=skip,
                                                  payloads=True, n=k, cut_seed=k))
                damaged = bytearray(file)
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
                seeds.append(T.encode_byte_ranges(bytes(damaged), recordio=recordio, skip=skip,
                                                  n=k + 1, cut_seed=k))
    return [s for s in seeds if len(s) <= MAX_SEED]


def cache_file_seeds(rng: random.Random) -> List[bytes]:
    """Cache files streamio wrote: of records (with their origins), batches of records, and
    decoded batches (numbers, bytes, str, a sparse field), each small enough for MAX_SEED."""
    import tempfile

    import streamio
    from streamio.decoders import Example, FixedLen, VarLen

    data = _stream("tfrecord", [streamio.encode_example({"x": [i], "b": b"q" * (i % 5),
                                                         "v": [1.5] * (i % 3)})
                                for i in range(12)])
    decoder = Example({"x": FixedLen((), np.int64), "b": FixedLen((), "bytes"),
                       "v": VarLen("float32")})
    chains = [lambda d: d.cache, lambda d: d.batch(4).cache]
    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (dec, chain) in enumerate([(None, chains[0]), (None, chains[1]),
                                          (decoder, chains[1])]):
            ds = streamio.Dataset(data, "tfrecord", decoder=dec)
            if k == 0:
                ds = ds.map(lambda r: r)  # record origins travel with the records
            where = f"{tmp}/{k}"
            list(chain(ds)(where))
            for name in sorted(Path(where).iterdir()):
                seeds.append(T.encode_cache_file(name.read_bytes()))
        import streamio.pipeline.cache as C

        # A cache of a local file: its manifest records the file's identity; the manifest alone
        # too (the target also feeds its input to the manifest parser).
        source = Path(tmp) / "local.tfrecord"
        source.write_bytes(data)
        list(streamio.Dataset(str(source), "tfrecord").cache(f"{tmp}/local"))
        for name in sorted(Path(f"{tmp}/local").iterdir()):
            raw = name.read_bytes()
            seeds.append(T.encode_cache_file(raw))
            _, _, manifest_len, body_len, _ = C._TRAILER.unpack(raw[-C._TRAILER.size:])
            seeds.append(raw[body_len:body_len + manifest_len])
            # The same manifest recording remote objects (what an HTTP or S3 cache records).
            manifest = json.loads(raw[body_len:body_len + manifest_len])
            manifest["remote"] = [["http://127.0.0.1:1/a.tfrecord", '"e1"', None, 17],
                                  ["s3://b/k", None, "2026-01-01T00:00:00+00:00", None]]
            seeds.append(json.dumps(manifest, sort_keys=True).encode())

        sparse = streamio.SparseBatch(np.array([0, 2]), np.array([0, 3]),
                                      np.array([1, 2], np.int8), (1, 5))
        kind, chunks = C.encode_block([{"s": sparse, "t": np.array(["a", "\u00e9"], object)}],
                                      None)
        seeds.append(bytes([kind]) + b"".join(bytes(c) for c in chunks))  # a bare block
    return [s for s in seeds if len(s) <= MAX_SEED]


SEEDS = {
    "scan_tfrecords": scan_tfrecords_seeds,
    "scan_recordio": scan_recordio_seeds,
    "parse_examples": parse_examples_seeds,
    "parse_sequence_examples": parse_sequence_examples_seeds,
    "parse_recordio_protobuf": parse_recordio_protobuf_seeds,
    "parse_csv_floats": parse_csv_floats_seeds,
    "shuffle_exchange": shuffle_seeds,
    "shuffle_exchange_int64": shuffle_seeds,
    "mix_take": mix_take_seeds,
    "crc32c": crc32c_seeds,
    "find_sync": find_sync_seeds,
    "resample": resample_seeds,
    "parse_index": parse_index_seeds,
    "csv_rows": csv_rows_seeds,
    "shared_wire": shared_wire_seeds,
    "resume_state": resume_state_seeds,
    "cache_file": cache_file_seeds,
    "byte_ranges": byte_ranges_seeds,
}


def findings_for(name: str) -> List[bytes]:
    """Inputs that once found a bug (findings/<target>-*): every run replays them first."""
    return [p.read_bytes() for p in sorted(FINDINGS.glob(f"{name}-*")) if p.is_file()]


def seeds_for(name: str) -> List[bytes]:
    """The seed inputs of one target: its findings, and what its seed maker writes."""
    maker = SEEDS.get(name)
    made = [s[:MAX_SEED] for s in maker(random.Random(name))] if maker else []
    return findings_for(name) + made


def write_corpus(out: Path, names: Iterable[str] = ()) -> Dict[str, int]:
    counts = {}
    for name in list(names) or list(T.TARGETS):
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for seed in seeds_for(name):
            (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        counts[name] = len(list(folder.iterdir()))
    return counts


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("targets", nargs="*", help="default: all")
    args = parser.parse_args(argv)
    if not PEER.exists():
        print(f"note: {PEER} not found; seeds from streamio's writers only")
    for name, count in write_corpus(args.out, args.targets).items():
        print(f"{name}: {count} seeds in {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

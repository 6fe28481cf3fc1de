"""Fuzz targets: each C kernel against its pure-Python reference, as a function of raw bytes.

A target is ``run(ck, data)``: it decodes the fuzzer's bytes into the kernel's arguments, calls the
kernel from ``ck`` (the C module: the sanitizer build under ``fuzz.py``, the normal build in
``tests/kernels/test_fuzz_harness.py``) and the reference, and raises ``Mismatch`` when they
differ. The comparison rules are those of ``tests/kernels/test_kernel_*.py`` (same records, same
``(pos, status)``, same error message, index and field, same arrays bit for bit, no reference
leaked); an exception a rule does not expect propagates, and the fuzzer reports it as a crash.

Every target has an ``encode`` that builds an input from readable arguments, so the seeds
(``make_corpus.py``) are valid streams written by streamio's own writers, and a mutation of a
seed's payload bytes stays a mutation of the stream. Input layouts are in each decoder.

To add a kernel: write ``run`` and ``encode``, add a ``Target`` to ``TARGETS`` naming the kernel,
and seeds in ``make_corpus.py``. A parser of untrusted bytes written in Python only (a wire
protocol) is a ``Target`` with no kernels: ``run`` ignores ``ck`` and checks the parser's own
rules, and ``fuzz.py`` always instruments its modules for coverage.
``tests/kernels/test_fuzz_harness.py`` fails while a public function of ``streamio._speedups`` has
no target.
"""

from __future__ import annotations

import json
import random
import re
import struct
import sys
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


class Mismatch(AssertionError):
    """The C kernel and its reference disagree on one input."""


def expect_equal(name: str, c_value: Any, py_value: Any) -> None:
    if c_value != py_value:
        raise Mismatch(f"{name} differs:\n  C:      {c_value!r:.2000}\n"
                       f"  Python: {py_value!r:.2000}")


class Input:
    """Reads arguments off the front of the fuzzer's bytes; past the end, every read gives 0."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.byte() | self.byte() << 8

    def u32(self) -> int:
        return self.u16() | self.u16() << 16

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def rest(self) -> bytes:
        return self.take(len(self.data))

    def records(self) -> List[bytes]:
        """``u16 length | bytes`` pieces to the end (a length past the end takes what is left)."""
        out = []
        while self.pos < len(self.data):
            out.append(self.take(self.u16()))
        return out


def pack_records(records: Sequence[bytes]) -> bytes:
    return b"".join(struct.pack("<H", len(r)) + r for r in records)


def pack_name(name: bytes) -> bytes:
    return bytes([len(name)]) + name


# --- scan kernels ---------------------------------------------------------------------------------

# mostly the default limit (so payload CRCs get checked), sometimes small, zero or beyond 64 bits
LIMITS = (1 << 28, 1 << 28, 1 << 28, 1 << 28, 150, 64, 0, 1, 1 << 70)
WRAPS: Tuple[Callable[[bytes], Any], ...] = (bytes, bytearray, memoryview,
                                              lambda b: memoryview(bytearray(b)))
WHOLE, FRAMER = 0x40, 0x80  # flag bits shared by the two scan targets


def _cuts(seed: int, n: int) -> List[int]:
    rng = random.Random(seed)
    return sorted({rng.randint(0, n) for _ in range(rng.randint(0, 8))})


def run_framer(make: Callable[[], Any], data: bytes, cuts: List[int],
               room: Optional[int] = None, crcs: bool = False) -> list:
    """Feed ``data`` split at ``cuts``; record every result, error and counter a user can see
    (tests/kernels/test_kernel_framing.py compares the C and Python framers with it).

    ``room``: feed through ``feed_spans`` with a span buffer of that many records, each chunk
    held in one buffer that the next piece overwrites (as a reader's), its records made from
    their three parts right after the call: the events must be those of ``feed``. ``crcs``:
    their CRCs left to this consumer where the framer allows it (``span_crcs``), checked as
    each is made; the first mismatch goes to ``span_fault``, whose error ends the run after
    the records before it, as ``feed`` raises it at the next call."""
    from streamio.errors import FormatError
    from streamio.formats._framing import _crc_matches

    framer = make()
    events: list = []
    pairs = None if room is None else memoryview(bytearray(16 * room)).cast("q")
    chunk = bytearray()
    pieces = [data[pos:cut] for pos, cut in zip([0] + cuts, cuts + [len(data)])]
    for piece in pieces + [None]:
        try:
            if piece is None:
                records = framer.finish()
            elif pairs is None:
                records = framer.feed(piece)
            else:
                chunk[:] = piece
                records, buffer, n, at = framer.feed_spans(memoryview(chunk), pairs, crcs)
                if n:
                    made = [bytes(buffer[pairs[2 * i]:pairs[2 * i] + pairs[2 * i + 1]])
                            for i in range(n)]
                    bad = next((i for i, r in enumerate(made) if framer.span_crcs and
                                not _crc_matches(r, buffer, pairs[2 * i] + len(r))), None)
                    buffer.release()  # nothing may hold it: the reader releases it so
                    del buffer
                    if bad is not None:
                        err = framer.span_fault(bad, pairs[2 * bad])
                        events.append(("records", records[:at] + made[:bad]))
                        events.append(("error", type(err), err.offset, err.record_index,
                                       str(err)))
                        break
                    records = records[:at] + made + records[at:]
        except FormatError as err:  # anything else is a bug and propagates
            events.append(("error", type(err), err.offset, err.record_index, str(err)))
            break
        events.append(("records", records))
    events.append(("counters", framer.records, framer.skipped_records, framer.skipped_bytes))
    return events


def encode_scan_tfrecords(stream: bytes, *, verify: bool = True, wrap: int = 0, limit: int = 0,
                          whole: bool = True, framer: bool = False, pos: int = 0, end: int = 0,
                          on_error_skip: bool = False, cut_seed: int = 0, room: int = 0
                          ) -> bytes:
    flags = verify | wrap << 1 | limit << 3 | (WHOLE if whole else 0) | (FRAMER if framer else 0)
    options = on_error_skip | (room & 63) << 2
    return struct.pack("<BHHBB", flags, pos, end, options, cut_seed) + stream


def run_scan_tfrecords(ck: ModuleType, data: bytes) -> None:
    """Input: ``flags u8 | pos u16 | end u16 | on_error u8 | cut seed u8 | stream``. flags: bit 0
    verify, bits 1-2 buffer type, bits 3-5 limit, bit 6 whole buffer, bit 7 also compare whole
    framers (accelerate=True vs False, and through feed_spans) fed the stream in pieces. Also
    scan_tfrecord_spans (room for ``on_error >> 2`` records, 0-63) against its reference and
    against scan_tfrecords."""
    from streamio.formats.tfrecord import TFRecordFramer, scan_tfrecord_spans, scan_tfrecords

    inp = Input(data)
    flags = inp.byte()
    verify, wrap, limit = bool(flags & 1), WRAPS[flags >> 1 & 3], LIMITS[flags >> 3 & 7]
    pos_sel, end_sel, on_error, cut_seed = inp.u16(), inp.u16(), inp.byte(), inp.byte()
    stream = inp.rest()
    n = len(stream)
    pos, end = (0, n) if flags & WHOLE else (pos_sel % (n + 1), end_sel % (n + 1))
    ref_out: list = []
    c_out: list = []
    ref = scan_tfrecords(wrap(stream), pos, end, verify, limit, ref_out)
    fast = ck.scan_tfrecords(wrap(stream), pos, end, verify, limit, c_out)
    expect_equal("(pos, status)", fast, ref)
    expect_equal("records", c_out, ref_out)
    expect_equal("record types", {type(r) for r in c_out} - {bytes}, set())
    room = on_error >> 2
    spans = [np.full(2 * room, -1, np.int64) for _ in range(2)]
    got = [fn(wrap(stream), pos, end, verify, limit, out)
           for fn, out in zip((ck.scan_tfrecord_spans, scan_tfrecord_spans), spans)]
    expect_equal("spans (n, pos, status)", got[0], got[1])
    expect_equal("spans", spans[0].tolist(), spans[1].tolist())
    # Payload CRCs left to the consumer (data=False): the C kernel as its reference, and the
    # frames that pass both checks come first, at the same places.
    unchecked = [np.full(2 * room, -1, np.int64) for _ in range(2)]
    loose = [fn(wrap(stream), pos, end, verify, limit, out, False)
             for fn, out in zip((ck.scan_tfrecord_spans, scan_tfrecord_spans), unchecked)]
    expect_equal("unchecked spans (n, pos, status)", loose[0], loose[1])
    expect_equal("unchecked spans", unchecked[0].tolist(), unchecked[1].tolist())
    expect_equal("checked spans begin the unchecked", unchecked[0][:2 * got[0][0]].tolist(),
                 spans[0][:2 * got[0][0]].tolist())
    n = got[0][0]
    made = [stream[o:o + size] for o, size in spans[0][:2 * n].reshape(-1, 2).tolist()]
    if n < room:  # room to spare: the same frames, pos and status as scan_tfrecords
        expect_equal("spans against scan_tfrecords", (made, got[0][1:]), (ref_out, ref))
    else:  # full: the first `room` of them, stopped with OK (what follows is not looked at)
        expect_equal("spans against scan_tfrecords (full)", (made, got[0][2]),
                     (ref_out[:room], 0))
    if flags & FRAMER:
        skip = "skip" if on_error & 1 else "raise"
        small = 1 << 28 if on_error & 2 == 0 else 100
        cuts = _cuts(cut_seed, n)
        runs = [run_framer(partial(TFRecordFramer, verify=verify, on_error=skip,
                                   max_record_size=small, source="s", accelerate=accelerate),
                           stream, cuts)
                for accelerate in (True, False)]
        expect_equal(f"framer events (on_error={skip}, cuts={cuts})", runs[0], runs[1])
        spanned = run_framer(partial(TFRecordFramer, verify=verify, on_error=skip,
                                     max_record_size=small, source="s"),
                             stream, cuts, max(1, room))
        expect_equal(f"framer events through feed_spans (cuts={cuts})", spanned, runs[0])
        deferred = run_framer(partial(TFRecordFramer, verify=verify, on_error=skip,
                                      max_record_size=small, source="s"),
                              stream, cuts, max(1, room), crcs=True)
        expect_equal(f"framer events through feed_spans, CRCs left to the consumer"
                     f" (cuts={cuts})", deferred, runs[0])


def encode_scan_recordio(stream: bytes, *, wrap: int = 0, limit: int = 0, whole: bool = True,
                         framer: bool = False, pos: int = 0, end: int = 0, options: int = 0,
                         cut_seed: int = 0) -> bytes:
    flags = wrap << 1 | limit << 3 | (WHOLE if whole else 0) | (FRAMER if framer else 0)
    return struct.pack("<BHHBB", flags, pos, end, options, cut_seed) + stream


def run_scan_recordio(ck: ModuleType, data: bytes) -> None:
    """Input: ``flags u8 | pos u16 | end u16 | options u8 | cut seed u8 | stream``. flags as for
    scan_tfrecords (bit 0 unused); options: bit 0 on_error="skip", bit 1 multipart="concat",
    bit 2 a small max_record_size for the framers."""
    from streamio.formats.recordio import RecordIOFramer, scan_recordio

    inp = Input(data)
    flags = inp.byte()
    wrap, limit = WRAPS[flags >> 1 & 3], LIMITS[flags >> 3 & 7]
    pos_sel, end_sel, options, cut_seed = inp.u16(), inp.u16(), inp.byte(), inp.byte()
    stream = inp.rest()
    n = len(stream)
    pos, end = (0, n) if flags & WHOLE else (pos_sel % (n + 1), end_sel % (n + 1))
    ref_out: list = []
    c_out: list = []
    ref = scan_recordio(wrap(stream), pos, end, limit, ref_out)
    fast = ck.scan_recordio(wrap(stream), pos, end, limit, c_out)
    expect_equal("(pos, status)", fast, ref)
    expect_equal("records", c_out, ref_out)
    expect_equal("record types", {type(r) for r in c_out} - {bytes}, set())
    if flags & FRAMER:
        skip = "skip" if options & 1 else "raise"
        multipart = "concat" if options & 2 else "dmlc"
        small = 50 if options & 4 else 1 << 28
        cuts = _cuts(cut_seed, n)
        runs = [run_framer(partial(RecordIOFramer, multipart=multipart, on_error=skip,
                                   max_record_size=small, source="s", accelerate=accelerate),
                           stream, cuts)
                for accelerate in (True, False)]
        expect_equal(f"framer events (on_error={skip}, multipart={multipart}, cuts={cuts})",
                     runs[0], runs[1])


# --- decode kernels: protobuf ---------------------------------------------------------------------

def _normalize(value: Any) -> tuple:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes(), value.flags.writeable)
    return ("list", [bytes(v) for v in value], [type(v) for v in value])


def outcome(fn: Callable[..., Any], *args: Any) -> tuple:
    """What a caller sees: the arrays (bit for bit) or the _WireError's message, index, field."""
    from streamio.decoders.wire import _WireError

    try:
        result = fn(*args)
    except _WireError as exc:
        return ("error", exc.message, exc.index, exc.field)
    return ("ok",) + tuple(
        [_normalize(v) for v in part] if isinstance(part, list) else _normalize(part)
        for part in result)


RECORD_WRAPS: Tuple[Callable[[bytes], Any], ...] = (bytes, bytes, bytearray, memoryview)


def encode_parse_examples(records: Sequence[bytes], spec: Sequence[Tuple[bytes, int]],
                          wrap: int = 0) -> bytes:
    head = bytes([len(spec) | wrap << 4])
    head += b"".join(bytes([kind - 1]) + pack_name(name) for name, kind in spec)
    return head + pack_records(records)


def _spec(inp: Input, entry: Callable[[Input], Any]) -> Tuple[int, list]:
    head = inp.byte()
    return head >> 4 & 3, [entry(inp) for _ in range(head & 7)]


def run_parse_examples(ck: ModuleType, data: bytes) -> None:
    """Input: ``head u8`` (bits 0-2: number of features, bits 4-5: record type given to C),
    per feature ``kind-1 u8 | name length u8 | name``, then records as ``u16 length | bytes``."""
    from streamio.decoders.example import parse_examples

    inp = Input(data)
    wrap, spec = _spec(inp, lambda i: (i.byte() % 3 + 1, i.take(i.byte() % 32)))
    records = inp.records()
    names = tuple(name for _, name in spec)
    kinds = tuple(kind for kind, _ in spec)
    fast = outcome(ck.parse_examples, [RECORD_WRAPS[wrap](r) for r in records], names, kinds)
    expect_equal("parse_examples outcome", fast, outcome(parse_examples, records, names, kinds))


def encode_parse_sequence_examples(records: Sequence[bytes],
                                   context: Sequence[Tuple[bytes, int]],
                                   sequence: Sequence[Tuple[bytes, int]], wrap: int = 0) -> bytes:
    head = encode_parse_examples([], context, wrap)
    head += encode_parse_examples([], sequence)
    return head + pack_records(records)


def run_parse_sequence_examples(ck: ModuleType, data: bytes) -> None:
    """Input: the context features as parse_examples's ``head u8`` and features (bits 4-5 of
    this head: record type given to C), then the sequence features the same way (their head's
    bits 4-5 unused), then records as ``u16 length | bytes``."""
    from streamio.decoders.example import parse_sequence_examples

    def entry(i: Input) -> Tuple[int, bytes]:
        return i.byte() % 3 + 1, i.take(i.byte() % 32)

    inp = Input(data)
    wrap, context = _spec(inp, entry)
    _, sequence = _spec(inp, entry)
    records = inp.records()
    args = (tuple(name for _, name in context), tuple(kind for kind, _ in context),
            tuple(name for _, name in sequence), tuple(kind for kind, _ in sequence))
    fast = outcome(ck.parse_sequence_examples, [RECORD_WRAPS[wrap](r) for r in records], *args)
    expect_equal("parse_sequence_examples outcome", fast,
                 outcome(parse_sequence_examples, records, *args))


PROTOBUF_KINDS = (2, 3, 7, 9)


def encode_parse_recordio_protobuf(records: Sequence[bytes],
                                   spec: Sequence[Tuple[Tuple[int, bytes], int]],
                                   wrap: int = 0) -> bytes:
    head = bytes([len(spec) | wrap << 4])
    head += b"".join(bytes([PROTOBUF_KINDS.index(kind) << 1 | (section - 1)]) + pack_name(key)
                     for (section, key), kind in spec)
    return head + pack_records(records)


def run_parse_recordio_protobuf(ck: ModuleType, data: bytes) -> None:
    """Input: ``head u8`` as for parse_examples, per tensor ``kind index << 1 | section-1 u8 |
    key length u8 | key``, then records as ``u16 length | bytes``."""
    from streamio.decoders.recordio_protobuf import parse_recordio_protobuf

    def entry(i: Input) -> Tuple[int, Tuple[int, bytes]]:
        b = i.byte()
        return PROTOBUF_KINDS[b >> 1 & 3], (b & 1) + 1, i.take(i.byte() % 32)

    inp = Input(data)
    wrap, spec = _spec(inp, entry)
    records = inp.records()
    names = tuple((section, key) for _, section, key in spec)
    kinds = tuple(kind for kind, _, _ in spec)
    fast = outcome(ck.parse_recordio_protobuf, [RECORD_WRAPS[wrap](r) for r in records], names,
                   kinds)
    expect_equal("parse_recordio_protobuf outcome", fast,
                 outcome(parse_recordio_protobuf, records, names, kinds))


# --- decode kernel: CSV numbers -------------------------------------------------------------------

# What the kernel must read (tests/kernels/test_kernel_csv.py): plain decimal numbers, nothing else.
SIMPLE_NUMBER = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
DELIMITERS = (b",", b";")
MAX_COLUMNS = 8


def encode_parse_csv_floats(rows: Sequence[bytes], ncols: int, *, double: bool = False,
                            delimiter: bytes = b",", usecols: Optional[Sequence[int]] = None
                            ) -> bytes:
    flags = double | DELIMITERS.index(delimiter) << 1 | (usecols is not None) << 2
    head = bytes([ncols - 1, flags])
    if usecols is not None:
        head += bytes([len(usecols)]) + bytes(usecols)
    return head + b"\n".join(rows)


def _loadtxt(rows: List[bytes], delimiter: bytes, usecols: Optional[List[int]], double: bool
             ) -> Optional[np.ndarray]:
    try:
        return np.loadtxt(rows, dtype=np.float64 if double else np.float32,
                          delimiter=delimiter.decode(), quotechar=None, comments=None, ndmin=2,
                          usecols=usecols, encoding="latin-1")
    except ValueError:
        return None


def run_parse_csv_floats(ck: ModuleType, data: bytes) -> None:
    """Input: ``ncols-1 u8 | flags u8`` (bit 0 float64, bit 1 ';' for ',', bit 2 usecols), then
    ``count u8 | columns`` if usecols, then the rows joined by ``\\n``. The reference is the rule
    of tests/kernels/test_kernel_csv.py: the kernel returns None unless every row has ncols fields
    and every selected field is a plain number, and then exactly np.loadtxt's values (compared
    where no row holds a CR, which loadtxt reads as a line break)."""
    inp = Input(data)
    ncols = inp.byte() % MAX_COLUMNS + 1
    flags = inp.byte()
    double, delimiter = bool(flags & 1), DELIMITERS[flags >> 1 & 1]
    usecols: Optional[List[int]] = None
    if flags & 4:
        wanted = [c % ncols for c in inp.take(inp.byte() % (ncols + 1))]
        usecols = list(dict.fromkeys(wanted)) or [0]  # unique, at least one, any order
    text = inp.rest()
    rows = text.split(b"\n") if text else []
    got = ck.parse_csv_floats(rows, ncols, delimiter, usecols, double)
    simple = all(len(row.split(delimiter)) == ncols for row in rows) and all(
        SIMPLE_NUMBER.fullmatch(row.split(delimiter)[c])
        for row in rows for c in (range(ncols) if usecols is None else usecols))
    expect_equal("returned a table (None: not plain numbers)", got is not None, simple)
    if got is None:
        return
    width = ncols if usecols is None else len(usecols)
    if not rows:  # loadtxt cannot know the width of an empty table
        expect_equal("empty table shape", got.shape, (0, width))
        return
    if any(b"\r" in row for row in rows):
        # Outside the kernel's domain ("rows without line terminators"): loadtxt would split
        # such a row where the kernel, rightly, never looks (a CR in an unused field).
        return
    expected = _loadtxt(rows, delimiter, usecols, double)
    if expected is None:
        raise Mismatch(f"np.loadtxt rejects rows the kernel read: {rows!r:.2000}")
    expect_equal("dtype and shape", (got.dtype, got.shape), (expected.dtype, expected.shape))
    # bit for bit: -0.0, rounding, overflow to inf
    expect_equal("values", got.tobytes(), expected.tobytes())
    expect_equal("writeable", got.flags.writeable, True)


# --- shuffle kernels ------------------------------------------------------------------------------

MAX_SLOTS = 60


def encode_shuffle(n: int, slots: Sequence[int], *, wide: bool = False, aliased: bool = False
                   ) -> bytes:
    """Slots in [-n, n) as bytes (``wide``: any int8, so some fall outside the buffer)."""
    if wide:
        raw = bytes(s & 0xFF for s in slots)
    else:
        raw = bytes((s + n) % (2 * n) for s in slots)
    return bytes([n - 1, wide | aliased << 1]) + raw


def _slots(inp: Input) -> Tuple[int, np.ndarray, bool, bool]:
    n = inp.byte() % 40 + 1
    flags = inp.byte()
    raw = inp.take(MAX_SLOTS)
    if flags & 1:
        slots = np.frombuffer(raw, dtype=np.int8).astype(np.int64)
    else:
        slots = np.array([b % (2 * n) - n for b in raw], dtype=np.int64)
    return n, slots, bool(flags & 1), bool(flags & 2)


def _in_range(slots: np.ndarray, n: int) -> bool:
    return bool(((slots >= -n) & (slots < n)).all())


def run_shuffle_exchange(ck: ModuleType, data: bytes) -> None:
    """Input: ``n-1 u8 | flags u8 | slots (u8 each, at most 60)``; flags bit 0: raw int8 slots
    (some out of range: IndexError, buffer untouched). Reference: ``_ExchangePlan.apply``."""
    from streamio.pipeline.shuffle import _ExchangePlan

    n, slots, _, _ = _slots(Input(data))
    items = [("new", j) for j in range(len(slots))]
    old = [("old", i) for i in range(n)]
    baseline = [sys.getrefcount(x) for x in items + old]
    c_buf = np.empty(n, dtype=object)
    c_buf[:] = old
    if not _in_range(slots, n):
        try:
            ck.shuffle_exchange(c_buf, slots, items)
        except IndexError:
            pass
        else:
            raise Mismatch(f"no IndexError for slots {slots.tolist()} in a buffer of {n}")
        expect_equal("buffer after a refused exchange", c_buf.tolist(), old)
    else:
        ref_buf = c_buf.copy()
        expected = _ExchangePlan(slots % n, n).apply(
            ref_buf, np.fromiter(items, dtype=object, count=len(items))).tolist()
        got = ck.shuffle_exchange(c_buf, slots, items)
        expect_equal("emitted items", got, expected)
        expect_equal("buffer", c_buf.tolist(), ref_buf.tolist())
        del got, expected, ref_buf
    del c_buf
    expect_equal("reference counts", [sys.getrefcount(x) for x in items + old], baseline)


def run_shuffle_exchange_int64(ck: ModuleType, data: bytes) -> None:
    """Input as for shuffle_exchange; flags bit 1: ``new`` and ``out`` are one array (the kernel
    reads new[j] before it writes out[j])."""
    from streamio.pipeline.shuffle import _ExchangePlan

    n, slots, _, aliased = _slots(Input(data))
    new = np.arange(1000, 1000 + len(slots), dtype=np.int64)
    c_buf = np.arange(n, dtype=np.int64)
    out = new.copy() if aliased else np.full(len(slots), -1, dtype=np.int64)
    given_new = out if aliased else new
    if not _in_range(slots, n):
        try:
            ck.shuffle_exchange_int64(c_buf, slots, given_new, out)
        except IndexError:
            pass
        else:
            raise Mismatch(f"no IndexError for slots {slots.tolist()} in a buffer of {n}")
        expect_equal("buffer after a refused exchange", c_buf.tolist(), list(range(n)))
        return
    ref_buf = c_buf.copy()
    expected = _ExchangePlan(slots % n, n).apply(ref_buf, new)
    expect_equal("return value", ck.shuffle_exchange_int64(c_buf, slots, given_new, out), None)
    expect_equal("out", out.tolist(), expected.tolist())
    expect_equal("buffer", c_buf.tolist(), ref_buf.tolist())


# --- mix ------------------------------------------------------------------------------------------

MIX_END = 1 << 32


def encode_mix_take(sizes: Sequence[int], starts: Sequence[int], cuts: Sequence[int],
                    draws: Sequence[int], *, begin: int = 0, limit: int = 64,
                    origins: bool = False, shared: bool = False, into: int = 0,
                    spans: bool = False, raw: bool = False) -> bytes:
    """Parts of ``sizes`` items (each < 256) from ``starts``, bounds ``cuts`` (one fewer than
    the parts; sorted by the decoder), then the draws (uint32). ``shared``: the parts are also
    held elsewhere (read, not moved); ``into``: a list of that many items (1-7) to append to;
    ``spans``: the odd parts, and those of an even size, are records in a buffer (two parts
    of even sizes: the kernel's loop for two such parts, without origins); ``raw``: starts as
    given (one past its part is refused) and a span part's last pair past its buffer."""
    flags = origins | raw << 2 | shared << 3 | (into & 7) << 4 | spans << 7
    head = bytes([len(sizes) - 1, flags, begin, limit])
    head += b"".join(bytes([n, s]) for n, s in zip(sizes, starts))
    return head + b"".join(struct.pack("<I", c) for c in cuts) + struct.pack(
        f"<{len(draws)}I", *draws)


def run_mix_take(ck: ModuleType, data: bytes) -> None:
    """Input: ``k-1 u8 | flags u8 | begin u8 | limit u8 | k x (size u8, start u8) |
    (k-1) x u32 cut | draws (u32 each; a ragged tail is refused)``; flags bit 0: origins (an
    int64 array per part), bit 1: a raw cut (unsorted, or past 2**32: refused), bit 2: a start
    past its part (refused), bit 3: the parts are held elsewhere too (the kernel reads them;
    else it moves the taken items out, None in their slots), bits 4-6: the items go into a
    given list already holding that many, bit 7: the odd parts and those of an even size are
    records in a buffer (a ``(buffer, spans)`` tuple, whose items the kernel makes; two such
    parts without origins take the kernel's own loop for them; with bit 2, the last pair of
    each points past the buffer: refused when taken); such a part whose size is not 2 mod 3
    has each record followed by its masked CRC-32C (a ``(buffer, spans, True)`` tuple: the
    kernel checks it as it copies the record), one in about eleven of them wrong (the pass
    stops before it). Reference: ``mix_take_reference``, on its own copy of the parts."""
    from streamio.formats import masked_crc32c
    from streamio.pipeline.mix import mix_take_reference

    inp = Input(data)
    k = inp.byte() + 1
    flags = inp.byte()
    begin, limit = inp.byte(), inp.byte()
    sizes, starts = [], []
    for _ in range(k):
        size, start = inp.byte(), inp.byte()
        sizes.append(size)
        starts.append(start if flags & 4 else start % (size + 1))
    cuts = [inp.u32() for _ in range(k - 1)]
    if flags & 2:
        cuts = [c * 2 if j % 2 else c for j, c in enumerate(cuts)]  # some past 2**32
    else:
        cuts.sort()
    bounds = np.array(cuts + [MIX_END], dtype=np.uint64)
    draws = inp.rest()
    begin = min(begin, len(draws) // 4 + 1)  # mostly in range, sometimes one past the end
    blocks = [[("item", j, i) for i in range(size)] for j, size in enumerate(sizes)]
    spanned = [bool(flags & 128) and (j % 2 == 1 or sizes[j] % 2 == 0) for j in range(k)]
    checked = [spanned[j] and sizes[j] % 3 != 2 for j in range(k)]
    buffers: Dict[int, bytes] = {}
    pairs: Dict[int, np.ndarray] = {}
    for j in range(k):
        if spanned[j]:  # records of 0, 3 and 6 bytes, one after the other in a buffer
            records = [b"%02x." % (i % 256) * (i % 3) for i in range(sizes[j])]
            if checked[j]:  # each followed by its CRC, some wrong
                footers = [masked_crc32c(r) ^ ((i * 37 + sizes[j]) % 11 == 0)
                           for i, r in enumerate(records)]
                buffers[j] = b"".join(r + f.to_bytes(4, "little")
                                      for r, f in zip(records, footers))
            else:
                buffers[j] = b"".join(records)
            lengths = np.array([len(r) for r in records], dtype=np.int64)
            frames = lengths + 4 * checked[j]
            pair = np.stack([np.cumsum(frames) - frames, lengths], axis=1).reshape(-1)
            if flags & 4 and sizes[j]:
                pair[-2] = len(buffers[j]) + 1  # past the buffer
            pairs[j] = pair
    origins = ([np.arange(size, dtype=np.int64) * 256 + j for j, size in enumerate(sizes)]
               if flags & 1 else None)
    shared, into = bool(flags & 8), (flags >> 4) & 7
    held = [("held", i) for i in range(into)]
    # (the span parts' buffers too, but not b"": a singleton anything may hold)
    everything = ([item for block in blocks for item in block] + held
                  + [b for b in buffers.values() if b] + list(pairs.values()))
    baseline = [sys.getrefcount(x) for x in everything]
    runs = []
    for fn in (ck.mix_take, mix_take_reference):
        given = list(starts)
        out = None if origins is None else np.full(limit, -1, dtype=np.int64)
        parts = [((buffers[j], pairs[j], True) if checked[j] else (buffers[j], pairs[j]))
                 if spanned[j] else list(block)  # held by `parts` alone, unless shared
                 for j, block in enumerate(blocks)]
        others = list(parts) if shared else None
        extra = (list(held),) if into else ()
        try:
            items, end, short = fn(draws, begin, limit, bounds, parts, given, origins, out,
                                   *extra)
        except (TypeError, ValueError) as exc:
            runs.append(("error", type(exc).__name__, str(exc), given))
            untouched = all(part == blocks[j] for j, part in enumerate(parts) if not spanned[j])
        else:
            if into and items is not extra[0]:
                raise Mismatch(f"{fn.__name__} did not return the list it was given")
            runs.append(([x if type(x) is bytes else id(x) for x in items], end, short, given,
                         None if out is None else out.tolist()))
            # The kernel moves what it took out of parts only it holds; else parts stay.
            moved = fn is ck.mix_take and not shared
            untouched = all(
                x is None if moved and starts[j] <= i < given[j] else x is blocks[j][i]
                for j, part in enumerate(parts) if not spanned[j] for i, x in enumerate(part))
            del items
        if not untouched:
            raise Mismatch(f"{fn.__name__} left parts other than it should")
        del parts, others, extra
    expect_equal("mix_take outcome", runs[0], runs[1])
    del runs
    expect_equal("reference counts", [sys.getrefcount(x) for x in everything], baseline)


# --- CRC-32C --------------------------------------------------------------------------------------

def encode_crc32c(payload: bytes, *, start: Optional[int] = None, offset: int = 0) -> bytes:
    flags = offset | (start is not None) << 3
    return bytes([flags]) + struct.pack("<I", start or 0) + payload


def run_crc32c(ck: ModuleType, data: bytes) -> None:
    """Input: ``flags u8`` (bits 0-2: start offset in a larger buffer, for alignment; bit 3:
    pass a start value) ``| start u32 | data``. Reference: the ``crc32c`` package."""
    import crc32c

    inp = Input(data)
    flags, start = inp.byte(), inp.u32()
    offset = flags & 7
    payload = inp.rest()
    view = memoryview(bytes(offset) + payload)[offset:]
    for name in ("crc32c", "crc32c_portable", "crc32c_sse42"):
        fn = getattr(ck, name, None)
        if fn is None:
            continue
        if flags & 8:
            expect_equal(f"{name}(data, start)", fn(view, start), crc32c.crc32c(payload, start))
        else:
            expect_equal(f"{name}(data)", fn(view), crc32c.crc32c(payload))


def encode_find_sync(buf: bytes, *, which: int = 3, base: int = 0, pos: int = 0, cut: int = 0,
                     limit: int = 1 << 20) -> bytes:
    return bytes([which | (base & 3) << 2]) + struct.pack("<HHI", pos, cut, limit) + buf


def run_find_sync(ck: ModuleType, data: bytes) -> None:
    """Input: ``flags u8`` (bits 0-1: which finder(s): 1 TFRecord, 2 RecordIO, 3 both; bits 2-3:
    ``base`` mod 4 for RecordIO's alignment) ``| pos u16 | cut u16 | limit u32 | buffer``.
    ``pos`` and ``end`` (the buffer's length minus ``cut``) are clamped into the buffer, as a
    framer passes them; ``limit`` is ``max_record_size`` (0 means 1). Same offset or -1 from C and
    Python. References: the specifications ``_find_tfrecord_sync_loop`` /
    ``_find_recordio_sync_loop`` beside their framers, and the numpy searches the framers use
    without C (``find_tfrecord_sync`` / ``find_recordio_sync``). The C TFRecord search is also
    run in its portable build (``_find_tfrecord_sync_portable``: no SSE2, CRCs from tables)."""
    from streamio.formats.recordio import _find_recordio_sync_loop, find_recordio_sync
    from streamio.formats.tfrecord import _find_tfrecord_sync_loop, find_tfrecord_sync

    inp = Input(data)
    flags, pos, cut, limit = inp.byte(), inp.u16(), inp.u16(), inp.u32()
    buf = inp.rest()
    end = max(0, len(buf) - cut % (len(buf) + 1))
    pos = min(pos, end)
    limit = max(1, limit)
    if flags & 1 and hasattr(ck, "find_tfrecord_sync"):
        want = _find_tfrecord_sync_loop(buf, pos, end, limit)
        expect_equal("find_tfrecord_sync", ck.find_tfrecord_sync(buf, pos, end, limit), want)
        if hasattr(ck, "_find_tfrecord_sync_portable"):
            expect_equal("_find_tfrecord_sync_portable",
                         ck._find_tfrecord_sync_portable(buf, pos, end, limit), want)
        expect_equal("find_tfrecord_sync (numpy)", find_tfrecord_sync(buf, pos, end, limit), want)
    if flags & 2 and hasattr(ck, "find_recordio_sync"):
        base = (flags >> 2) & 3
        want = _find_recordio_sync_loop(buf, pos, end, base, limit)
        expect_equal("find_recordio_sync", ck.find_recordio_sync(buf, pos, end, base, limit), want)
        expect_equal("find_recordio_sync (numpy)", find_recordio_sync(buf, pos, end, base, limit),
                     want)


# --- image resampling ---------------------------------------------------------------------------

RESAMPLE_FILTERS = ("lanczos", "bilinear", "bicubic", "box", "hamming")  # Pillow's codes 1..5


def encode_resample(pixels: bytes, *, h: int, w: int, out_w: int, out_h: int,
                    box: Optional[Tuple[int, int, int, int]] = None, filter_index: int = 1,
                    rgb: bool = True, isa: int = 3, wild: bool = False) -> bytes:
    """``box``: four u16 fractions (x0, y0, x1, y1) of 65535; None: the whole image."""
    flags = filter_index | rgb << 3 | (isa & 3) << 5 | (box is None) << 7
    return (bytes([flags, h - 1, w - 1, out_w - 1, out_h - 1, wild])
            + struct.pack("<4H", *(box or (0, 0, 0, 0))) + pixels)


def run_resample(ck: ModuleType, data: bytes) -> None:
    """Input: ``flags u8`` (bits 0-2: filter, mod 5; bit 3: RGB, else L; bit 4: an L image as
    (H, W, 1); bits 5-6: SIMD level, 3 = the best; bit 7: the whole image as box)
    ``| h-1 u8 | w-1 u8 | out_w-1 u8 | out_h-1 u8 | wild u8 | box 4 x u16 | pixels``. Sizes are
    taken mod 24 (source) and mod 40 (output); the pixels repeat to fill the image. The box is
    fractions of the image, sorted; with ``wild & 1`` unsorted fractions of -1/4 .. 5/4 of it, so
    some are refused: then both must raise ValueError. Reference: Pillow's own resize."""
    from streamio.decoders._resample import resize_pillow

    inp = Input(data)
    flags = inp.byte()
    h, w = inp.byte() % 24 + 1, inp.byte() % 24 + 1
    out_w, out_h = inp.byte() % 40 + 1, inp.byte() % 40 + 1
    wild = inp.byte() & 1
    raw = [inp.u16() for _ in range(4)]
    filt = RESAMPLE_FILTERS[(flags & 7) % 5]
    shape = (h, w, 3) if flags & 8 else (h, w, 1) if flags & 16 else (h, w)
    body = inp.rest() or b"\0"
    pixels = np.frombuffer((body * (h * w * 3 // len(body) + 1))[:int(np.prod(shape))],
                           np.uint8).reshape(shape)
    if flags & 128:
        box = (0.0, 0.0, float(w), float(h))
    elif wild:
        box = tuple((v / 65535 * 1.5 - 0.25) * (w if i % 2 == 0 else h) for i, v in enumerate(raw))
    else:
        xs = sorted((raw[0] / 65535 * w, raw[2] / 65535 * w))
        ys = sorted((raw[1] / 65535 * h, raw[3] / 65535 * h))
        box = (xs[0], ys[0], xs[1], ys[1])
    isa = (flags >> 5) & 3
    out = np.full((out_h, out_w) + shape[2:], 0xA5, np.uint8)
    try:
        expected = resize_pillow(pixels, (out_w, out_h), filt, box)
    except ValueError as exc:
        try:
            ck.resample(pixels, out, RESAMPLE_FILTERS.index(filt) + 1, *box, -1 if isa == 3 else isa)
        except ValueError:
            return
        raise Mismatch(f"Pillow refused box {box} of a {w}x{h} image ({exc}); the kernel did not")
    ck.resample(pixels, out, RESAMPLE_FILTERS.index(filt) + 1, *box, -1 if isa == 3 else isa)
    if not np.array_equal(out, expected):
        raise Mismatch(f"{filt} {shape} -> {out_w}x{out_h} box {box} isa {isa}: "
                       f"{int((out != expected).sum())} bytes differ")


# --- pure-Python parsers of untrusted bytes (no kernel) -------------------------------------------
def encode_parse_index(text: bytes, *, size: int = 0) -> bytes:
    return struct.pack("<I", size) + text


def _index_outcome(parse: Callable[..., Any], text: bytes) -> tuple:
    from streamio.errors import FormatError

    try:
        index = parse(text, source="fuzz.index")
    except FormatError as exc:
        return ("error", str(exc), exc.source, exc.offset)
    return ("index", index.offsets, index.lengths)


def run_parse_index(ck: ModuleType, data: bytes) -> None:
    """Input: ``data file size u32 | index file bytes``. No C kernel: the index-file parser
    (streamio.formats.index_file) gives a RecordIndex or a FormatError, nothing else, and the
    same as its line-by-line reference (parse_index's whole-buffer path for canonical files is
    the "kernel"); what it gives, written again by encode_index, reads back the same;
    index_misfit gives None or a reason."""
    from streamio.formats.index_file import (encode_index, index_misfit, parse_index,
                                             parse_index_lines)

    inp = Input(data)
    size = inp.u32()
    text = inp.rest()
    got = _index_outcome(parse_index, text)
    expect_equal("parse_index vs parse_index_lines", got, _index_outcome(parse_index_lines, text))
    if got[0] == "error":
        return
    index = parse_index(text)
    why = index_misfit(index, size)
    if why is not None and not isinstance(why, str):
        raise Mismatch(f"index_misfit gave {why!r}")
    lengths = index.lengths or [0] * len(index.offsets)
    fmt = "recordio" if index.lengths is None else "tfrecord"
    text = "".join(encode_index(fmt, zip(range(len(lengths)), index.offsets, lengths)))
    again = parse_index(text.encode())
    expect_equal("offsets read again", again.offsets, index.offsets)
    expect_equal("lengths read again", again.lengths if index.offsets else None,
                 index.lengths if index.offsets else None)
# --- the CSV decoder's bad rows (no kernel) --------------------------------------------------------
def encode_csv_rows(rows: Sequence[bytes], *, limit: int = 4, dtype: int = 0) -> bytes:
    """Input: ``max_columns u8 | dtype u8 (0 float32, 1 int64, 2 str in column 1) | rows``."""
    return bytes([limit & 0xFF, dtype & 0xFF]) + pack_records(rows)


def _csv_outcome(decode: Callable[[], Any]) -> tuple:
    from streamio.errors import DecodeError

    try:
        out = decode()
    except DecodeError as exc:
        return ("error", str(exc), exc.record_index, exc.field)
    return ("columns", {name: (value.dtype.str, value.shape, value.tolist() if value.dtype == object
                               else value.tobytes()) for name, value in sorted(out.items())})


def run_csv_rows(ck: ModuleType, data: bytes) -> None:
    """No kernel: a batch of CSV rows (any bytes) under ``Csv(on_error="skip")`` gives exactly
    the rows that decode one by one (a decoder primed with three columns, ``max_columns`` from
    the input), and counts the rest; ``"raise"`` gives columns or a DecodeError, nothing else;
    ``more_fields_than`` agrees with the csv module on every row it can split."""
    import csv

    from streamio.decoders import Csv
    from streamio.decoders._csv_rows import more_fields_than
    from streamio.decoders.skips import counting_skips

    inp = Input(data)
    limit = max(3, inp.byte())
    kind = inp.byte() % 3
    rows = inp.records()[:64]
    options = dict(max_columns=limit, as_columns=True,
                   dtype={1: ("float32", "int64", "str")[kind]})

    def primed(**more: Any) -> Any:
        decoder = Csv(**options, **more)
        decoder.decode_batch([b"0,0,0"])
        return decoder

    good = [row for row in rows if _csv_outcome(lambda: primed().decode_batch([row]))[0] != "error"]
    _csv_outcome(lambda: primed().decode_batch(rows))  # raises nothing but a DecodeError
    with counting_skips() as skipped:
        got = _csv_outcome(lambda: primed(on_error="skip").decode_batch(rows))
    expect_equal("skip vs the good rows alone", got,
                 _csv_outcome(lambda: primed().decode_batch(good)))
    expect_equal("rows skipped", sum(skipped.values()), len(rows) - len(good))
    for row in rows:
        try:
            fields = list(csv.reader([row.decode("latin-1")], strict=True))
        except csv.Error:
            continue
        if len(fields) == 1:
            expect_equal("more_fields_than", more_fields_than(row, b",", b'"', limit),
                         len(fields[0]) > limit)


# --- pure-Python parsers of hostile bytes: the shared stream's wire protocol --------------------

def encode_shared_wire(stream: bytes, *, to_dealer: bool = False, seed: int = 0) -> bytes:
    """Input: u8 flags (bit 0: ``stream`` is what a client sends the dealer, else what the dealer
    sends a client), u8 cut seed (the dealer's view is fed in pieces), then the bytes."""
    return bytes([int(to_dealer), seed & 0xFF]) + stream


def _dealer_view(data: bytes, cuts: List[int]) -> tuple:
    """A dealer's events from one client's bytes fed in pieces: (events, refused)."""
    from streamio.sharing._wire import ClientParser
    from streamio.errors import SourceError

    parser, events, start = ClientParser(), [], 0
    try:
        for end in cuts + [len(data)]:
            events.extend(parser.feed(data[start:end]))
            start = end
    except SourceError:
        return events, True
    return events, False


def _client_view(data: bytes) -> None:
    """A client reading the dealer's messages: each parses, or is a SourceError; a block that
    parses re-encodes to the same bytes (nothing is guessed), an error is a streamio error."""
    from streamio.sharing import _wire as wire
    from streamio.errors import SourceError, StreamioError

    pos = 0
    while pos + wire.HEADER.size <= len(data):
        try:
            kind, count, size = wire.parse_header(data[pos:pos + wire.HEADER.size], 64, 1 << 20)
        except SourceError:
            return
        payload = data[pos + wire.HEADER.size:pos + wire.HEADER.size + size]
        if len(payload) < size:
            return  # cut short: the socket layer reports that
        if kind == wire.ERROR:
            if not isinstance(wire.parse_error(payload), StreamioError):
                raise Mismatch(f"an ERROR became a foreign exception: {payload!r:.300}")
        elif kind == wire.BLOCK:
            try:
                name, ids, records = wire.parse_block(count, payload)
            except SourceError:
                return
            name_len = struct.unpack_from("<I", payload)[0]
            raw_name = bytes(payload[4:4 + name_len])
            if raw_name == name.encode("utf-8", "replace"):  # valid UTF-8: exact round trip
                again = wire.encode_block(name, ids, records)
                expect_equal("re-encoded block", again, data[pos:pos + wire.HEADER.size + size])
        pos += wire.HEADER.size + size


def run_shared_wire(ck: ModuleType, data: bytes) -> None:
    """The shared stream's wire parsers on hostile bytes (no kernel: ``ck`` is unused). The
    dealer's view must not depend on how the bytes were cut (same events, or refused both
    ways); the client's view must give records, an END or a streamio error, never another
    exception."""
    inp = Input(data)
    flags, seed = inp.byte(), inp.byte()
    stream = inp.rest()
    if flags & 1:
        whole = _dealer_view(stream, [])
        cut = _dealer_view(stream, _cuts(seed, len(stream)))
        expect_equal("refused", cut[1], whole[1])
        if not whole[1]:
            expect_equal("events", cut[0], whole[0])
    else:
        _client_view(stream)
# --- pure-Python parsers of hostile bytes: resume states ----------------------------------------

_RESUME: dict = {}


def _resume_pipeline() -> Any:
    """A small pipeline with fixed seeds (a state's check is then the same in every process)."""
    if "ds" not in _RESUME:
        import streamio

        records = [streamio.encode_example({"x": i}) for i in range(23)]
        from streamio.formats import encode_tfrecord

        data = b"".join(encode_tfrecord(r) for r in records)
        _RESUME["ds"] = streamio.Dataset(data, "tfrecord").shuffle(5, seed=1).batch(3) \
            .shuffle_batches(2, seed=2)
        _RESUME["epochs"] = {}
    return _RESUME["ds"]


def _resume_records() -> set:
    _resume_pipeline()
    if "records" not in _RESUME:
        _RESUME["records"] = {r for batch in _RESUME["ds"] for r in batch}
    return _RESUME["records"]


def encode_resume_state(state: Any) -> bytes:
    """Input: the state as JSON text, as a checkpoint file or a DataLoader state holds it."""
    return json.dumps(state).encode("utf-8")


def run_resume_state(ck: ModuleType, data: bytes) -> None:
    """A resume state parsed from a checkpoint's bytes (no kernel: ``ck`` is unused): the
    pipeline resumes exactly the epoch the state names from the item it names, or refuses with
    a streamio usage error; never another exception, never different items."""
    from streamio.errors import UsageError, UsageTypeError

    try:
        state = json.loads(data.decode("utf-8"))
    except ValueError:
        return  # not JSON: the adapters say so before a state is looked at
    ds = _resume_pipeline()
    try:
        got = list(ds.iter_from(state))
    except (UsageError, UsageTypeError):
        return
    if isinstance(state, list) or "elastic" in state:
        # An elastic resume (a list of shard states, or an epoch resumed from one): what it
        # delivers are records of the epoch, none twice.
        records = [r for batch in got for r in batch]
        if len(set(records)) != len(records) or not set(records) <= _resume_records():
            raise Mismatch("an elastic resume delivered a record twice or one not in the data")
        return
    if state["finished"]:
        expect_equal("items of a finished epoch", got, [])
        return
    epochs = _RESUME["epochs"]
    epoch = state["epoch"]
    if epoch not in epochs:
        if len(epochs) > 64:
            epochs.clear()
        epochs[epoch] = list(ds.with_context(epoch=epoch))
    if state["delivered"] > len(epochs[epoch]):
        raise Mismatch(f"a state past the end of its epoch ({state['delivered']} of"
                       f" {len(epochs[epoch])} items) was accepted")
    expect_equal("resumed items", got, epochs[epoch][state["delivered"]:])


# --- byte-range splits: where a range reader starts and stops -----------------------------------

def encode_byte_ranges(stream: bytes, *, recordio: bool = False, skip: bool = False,
                       payloads: bool = False, n: int = 2, cut_seed: int = 0) -> bytes:
    flags = recordio | skip << 1 | payloads << 2
    return struct.pack("<BBB", flags, n, cut_seed) + stream


def _payloads_of(stream: bytes) -> List[bytes]:
    """``stream`` cut into payloads, each ``len u8 | bytes``."""
    out, at = [], 0
    while at < len(stream):
        size = stream[at]
        out.append(stream[at + 1:at + 1 + size])
        at += 1 + size
    return out


def _range_events(fmt: str, data: bytes, bounds: List[int], skip: bool, cut_seed: int,
                  accelerate: bool) -> list:
    """Each range of ``data`` (``bounds``: the split offsets, 0 and the size included) read by
    a range framer fed in pieces: its records, or its error, and its counters."""
    from streamio.errors import FormatError
    from streamio.formats.recordio import RecordIOFramer
    from streamio.formats.tfrecord import TFRecordFramer

    cls = RecordIOFramer if fmt == "recordio" else TFRecordFramer
    events = []
    for a, b in zip(bounds, bounds[1:]):
        framer = cls(source="range", on_error="skip" if skip else "raise", accelerate=accelerate)
        origin = framer.start_range(a, None if b >= len(data) else b)
        rest = data[origin:]
        cuts = _cuts(cut_seed + a, len(rest))
        got: list = []
        try:
            for lo, hi in zip([0] + cuts, cuts + [len(rest)]):
                got += framer.feed(rest[lo:hi])
            got += framer.finish()
            got += framer.finish()  # raises a fault finish() met
            events.append(("records", got))
        except FormatError as err:
            events.append(("error", got, type(err), err.offset, str(err)))
        events.append(("counters", framer.skipped_records))
    return events


def run_byte_ranges(ck: ModuleType, data: bytes) -> None:
    """Input: ``flags u8 | n u8 | cut seed u8 | stream``. flags: bit 0 RecordIO (dmlc), else
    TFRecord; bit 1 on_error="skip"; bit 2: ``stream`` holds payloads (``len u8 | bytes``
    each) written as a valid file, else it is the file. ``2 + n % 7`` ranges
    (``split_range``), each framer fed in pieces. The range framers with the C kernels and
    with the Python code (``accelerate=False``) give the same events; a valid file's ranges
    give exactly its records, once each, with no error and nothing skipped (the range rule,
    ``TFRecordFramer._chain_confirms``: payloads may hold frames, as the seeds' do)."""
    from streamio.formats import encode_recordio, encode_tfrecord
    from streamio.sources.ranged import split_range

    head = Input(data)
    flags, n, cut_seed = head.byte(), 2 + head.byte() % 7, head.byte()
    fmt = "recordio" if flags & 1 else "tfrecord"
    stream = data[head.pos:]
    records = None
    if flags & 4:
        records = _payloads_of(stream)
        encode = encode_recordio if fmt == "recordio" else encode_tfrecord
        stream = b"".join(encode(r) for r in records)
    bounds = [split_range(len(stream), ((n, i),))[0] for i in range(n)] + [len(stream)]
    fast = _range_events(fmt, stream, bounds, bool(flags & 2), cut_seed, True)
    slow = _range_events(fmt, stream, bounds, bool(flags & 2), cut_seed, False)
    expect_equal("range events", fast, slow)
    if records is not None:
        got = [r for event in fast if event[0] == "records" for r in event[1]]
        bad = [event for event in fast if event[0] == "error" or event[0] == "counters"
               and event[1]]
        if bad or got != records:
            raise Mismatch(f"the ranges of a valid file gave {got!r:.300} and {bad!r:.300},"
                           f" not its records {records!r:.300}")


# --- pure-Python parsers of hostile bytes: cache files ------------------------------------------

def encode_cache_file(data: bytes) -> bytes:
    """Input: a whole cache file (``Dataset.cache(directory)``), as another local user could
    have left it in the directory."""
    return data


def _cache_item_ok(item: Any) -> bool:
    from streamio import SparseBatch

    if isinstance(item, bytes):
        return True
    if isinstance(item, list):
        return all(isinstance(r, bytes) for r in item)
    if isinstance(item, dict):
        return all(isinstance(v, SparseBatch) or (
            isinstance(v, np.ndarray) and (not v.dtype.hasobject or all(
                isinstance(x, (bytes, str)) for x in v.reshape(-1)))) for v in item.values())
    return False


def _check_cache_manifest(manifest: dict) -> None:
    """A manifest the parser accepted: its local files are ``[path, size, mtime_ns, inode,
    device]`` with a str path and ints in os.stat's ranges, its remote objects ``[url, etag,
    last_modified, size]`` (what the staleness check compares)."""
    for entry in manifest["files"]:
        path, *numbers = entry
        if not (type(path) is str and path and "\0" not in path and len(numbers) == 4
                and all(type(x) is int for x in numbers) and 0 <= numbers[0] < 2 ** 63
                and -2 ** 63 <= numbers[1] < 2 ** 63 and 0 <= min(numbers[2:])
                and max(numbers[2:]) < 2 ** 64):
            raise Mismatch(f"the manifest parser accepted a file identity {entry!r:.120}")
    for entry in manifest["remote"]:  # [url, etag, last_modified, size]: what a check compares
        url, etag, modified, size = entry
        if not (type(url) is str and "://" in url and "\0" not in url
                and all(x is None or type(x) is str for x in (etag, modified))
                and (size is None or (type(size) is int and 0 <= size < 2 ** 63))):
            raise Mismatch(f"the manifest parser accepted a remote identity {entry!r:.120}")


def run_cache_file(ck: ModuleType, data: bytes) -> None:
    """No kernel: the cache-file parser (streamio.pipeline.cache.parse_cache) gives the manifest
    and blocks of records, batches of records or decoded batches (numbers, bytes, str, sparse;
    never another object), or a CorruptRecordError naming the file; nothing else. What it gives,
    encoded again, reads back the same. The manifest parser is also fed the input itself with
    its SHA-256 (mutations rarely pass the trailer's), so its fields (the local files'
    identities among them) meet hostile JSON."""
    import hashlib

    from streamio.errors import CorruptRecordError
    from streamio.pipeline import cache as C

    blocks = []
    try:
        manifest, blocks = C.parse_cache(data, "fuzz.bin")
        _check_cache_manifest(manifest)
    except CorruptRecordError as exc:
        expect_equal("error names the file", exc.source, "fuzz.bin")
    try:
        _check_cache_manifest(C.parse_manifest(data, hashlib.sha256(data).digest(), "fuzz.bin", 0))
    except CorruptRecordError as exc:
        expect_equal("error names the file", exc.source, "fuzz.bin")
    if data:
        # The block parser behind the checksum (which mutations rarely pass): the first byte
        # picks the block kind, the rest is the payload.
        try:
            blocks.append(C.decode_block(data[0] % 4, bytearray(data[1:]), "fuzz.bin"))
        except CorruptRecordError as exc:
            expect_equal("error names the file", exc.source, "fuzz.bin")
    for items, ids in blocks:
        if not all(_cache_item_ok(item) for item in items):
            raise Mismatch(f"the parser made items {[type(i).__name__ for i in items][:4]}")
        if ids is not None and (ids.dtype != np.int64 or len(ids) != len(items)):
            raise Mismatch(f"record origins {ids!r:.80} for {len(items)} items")
        kind, chunks = C.encode_block(items, ids)
        again = C.decode_block(kind, bytearray(b"".join(bytes(c) for c in chunks)))
        expect_equal("block read again", repr(again), repr((items, ids)))


# --- the table ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    name: str
    # the functions of streamio._speedups this target covers; () for a pure-Python parser of
    # untrusted bytes (its references are then always instrumented: they are all there is)
    kernels: Tuple[str, ...]
    run: Callable[[ModuleType, bytes], None]
    # streamio modules whose Python code atheris instruments for coverage (the references)
    references: Tuple[str, ...]

    def available(self, ck: ModuleType) -> bool:
        """Whether the build has the first kernel (a target for a kernel yet to come is skipped);
        a target without kernels (a pure-Python parser) always runs."""
        return not self.kernels or hasattr(ck, self.kernels[0])

    def one_input(self, ck: ModuleType) -> Callable[[bytes], None]:
        return lambda data: self.run(ck, data)


TARGETS: Dict[str, Target] = {t.name: t for t in [
    Target("scan_tfrecords", ("scan_tfrecords", "scan_tfrecord_spans"), run_scan_tfrecords,
           ("streamio.formats.tfrecord",)),
    Target("scan_recordio", ("scan_recordio",), run_scan_recordio,
           ("streamio.formats.recordio",)),
    Target("parse_examples", ("parse_examples",), run_parse_examples,
           ("streamio.decoders.example", "streamio.decoders._example_parse",
            "streamio.decoders.wire")),
    Target("parse_sequence_examples", ("parse_sequence_examples",), run_parse_sequence_examples,
           ("streamio.decoders.example", "streamio.decoders._example_parse",
            "streamio.decoders.wire")),
    Target("parse_recordio_protobuf", ("parse_recordio_protobuf",), run_parse_recordio_protobuf,
           ("streamio.decoders.recordio_protobuf", "streamio.decoders._recordio_parse",
            "streamio.decoders.wire")),
    Target("parse_csv_floats", ("parse_csv_floats",), run_parse_csv_floats, ()),
    Target("shuffle_exchange", ("shuffle_exchange",), run_shuffle_exchange,
           ("streamio.pipeline.shuffle",)),
    Target("shuffle_exchange_int64", ("shuffle_exchange_int64",), run_shuffle_exchange_int64,
           ("streamio.pipeline.shuffle",)),
    Target("mix_take", ("mix_take",), run_mix_take, ("streamio.pipeline.mix",)),
    Target("crc32c", ("crc32c", "crc32c_portable", "crc32c_sse42"), run_crc32c, ()),
    Target("find_sync", ("find_tfrecord_sync", "find_recordio_sync", "_find_tfrecord_sync_portable"),
           run_find_sync, ("streamio.formats.tfrecord", "streamio.formats._tfrecord_sync",
                           "streamio.formats.recordio", "streamio.formats._recordio_sync")),
    Target("resample", ("resample",), run_resample, ("streamio.decoders._resample",)),
    Target("parse_index", (), run_parse_index, ("streamio.formats.index_file",)),
    # No kernel: the CSV decoder's bad rows and row widths (on_error, max_columns).
    Target("csv_rows", (), run_csv_rows, ("streamio.decoders.csv", "streamio.decoders._csv_rows")),
    # No kernel: a parser of bytes another process writes (always instrumented for coverage).
    Target("shared_wire", (), run_shared_wire, ("streamio.sharing._wire",)),
    # No kernel: a checkpoint's resume state (JSON a restarted job reads back).
    Target("resume_state", (), run_resume_state, ("streamio.pipeline.resume",)),
    # The range rule (where a byte-range reader starts and stops), C kernels against Python.
    Target("byte_ranges", ("scan_tfrecord_spans",), run_byte_ranges,
           ("streamio.formats._framing", "streamio.formats.tfrecord",
            "streamio.formats.recordio")),
    # No kernel: a cache file (Dataset.cache(directory)) another local user could have written.
    Target("cache_file", (), run_cache_file, ("streamio.pipeline.cache.file_format",
                                               "streamio.pipeline.cache")),
]}


def public_kernels(ck: ModuleType) -> List[str]:
    """The functions a build of the extension offers (its public, callable names)."""
    return sorted(name for name in dir(ck)
                  if not name.startswith("_") and callable(getattr(ck, name)))


def uncovered_kernels(ck: ModuleType) -> List[str]:
    covered = {k for t in TARGETS.values() for k in t.kernels}
    return [name for name in public_kernels(ck) if name not in covered]

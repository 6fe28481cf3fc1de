"""Prototype: what mixing costs when records are made in the order the mix hands them out.

``streamio.mix`` places records its inputs' readers already made (bytes objects, in each
input's order), so a mixed epoch uses and frees records in an order that interleaves two
allocation streams; ``streamio bench --workloads mix`` measures 1.10-1.18x the inputs read
alone on the development VM (docs/resume.md, "What it costs"). This script measures the
alternative before it is built into the framers: the inputs' read buffers and the spans of
their records are handed to the mix, which makes each record (a bytes object) in output order.

It compiles a small C module (no CRC check, TFRecord framing only: a sketch, not streamio's
reader) and times, in pairs of fresh processes taking epochs by turns as the mix benchmark
does, three pipelines over the same two TFRecord files (400,000 Examples, 3/4 and 1/4):

- ``alone``: the files read one after the other, records made in read order (1 MiB reads);
- ``move``: the two files mixed 0.75/0.25 as ``streamio.mix`` does it today: records made
  per input block, placed by ``streamio._speedups.mix_take`` (3/4 and 1/2 MiB reads);
- ``span``: the same mix, the same draws (the same output, checked), records made in output
  order from the inputs' read buffers.

usage: python benchmarks/mix_spans_prototype.py [--rounds 6] [--epochs 12]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

C_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* scan(buf, pos, end, spans_out) -> (n, next): whole TFRecord frames in buf[pos:end] */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer b, o; Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "y*nnw*", &b, &pos, &end, &o)) return NULL;
    const unsigned char *p = b.buf; int64_t *sp = o.buf; Py_ssize_t cap = o.len / 16, n = 0;
    while (n < cap && end - pos >= 12) {
        uint64_t len; memcpy(&len, p + pos, 8);
        if ((uint64_t)(end - pos - 12) < len + 4) break;
        sp[2 * n] = pos + 12; sp[2 * n + 1] = (int64_t)len; n++;
        pos += 12 + (Py_ssize_t)len + 4;
    }
    PyBuffer_Release(&b); PyBuffer_Release(&o);
    return Py_BuildValue("(nn)", n, pos);
}

/* make(buf, spans, n) -> list of bytes in order */
static PyObject *make(PyObject *self, PyObject *args) {
    Py_buffer b, s; Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*n", &b, &s, &n)) return NULL;
    const char *p = b.buf; const int64_t *sp = s.buf;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *r = PyBytes_FromStringAndSize(p + sp[2 * i], sp[2 * i + 1]);
        if (!r) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, r);
    }
    PyBuffer_Release(&b); PyBuffer_Release(&s);
    return out;
}

/* take(draws, begin, limit, bound, (buf0, buf1), (spans0, spans1), starts[2], counts[2]) ->
 * (list, end, short): bytes made in output order */
static PyObject *take(PyObject *self, PyObject *args) {
    Py_buffer d; Py_ssize_t begin, limit; unsigned long long bound;
    PyObject *bufs, *spans, *starts, *counts;
    if (!PyArg_ParseTuple(args, "y*nnKOOOO", &d, &begin, &limit, &bound, &bufs, &spans, &starts, &counts)) return NULL;
    Py_buffer bb[2], ss[2]; const char *p[2]; const int64_t *sp[2]; Py_ssize_t st[2], cn[2];
    for (int k = 0; k < 2; k++) {
        PyObject_GetBuffer(PyTuple_GET_ITEM(bufs, k), &bb[k], PyBUF_SIMPLE);
        PyObject_GetBuffer(PyTuple_GET_ITEM(spans, k), &ss[k], PyBUF_SIMPLE);
        p[k] = bb[k].buf; sp[k] = ss[k].buf;
        st[k] = PyLong_AsSsize_t(PyList_GET_ITEM(starts, k));
        cn[k] = PyLong_AsSsize_t(PyList_GET_ITEM(counts, k));
    }
    const uint32_t *u = (const uint32_t *)d.buf; Py_ssize_t nd = d.len / 4;
    Py_ssize_t most = nd - begin < limit ? nd - begin : limit, n = 0, shortp = -1;
    PyObject *out = PyList_New(most);
    if (out == NULL) return NULL; /* (buffers leak: a sketch) */
    Py_SET_SIZE(out, 0);
    PyObject **slot = ((PyListObject *)out)->ob_item;
    for (; n < most; n++) {
        int k = (uint64_t)u[begin + n] >= bound;
        Py_ssize_t j = st[k];
        if (j == cn[k]) { shortp = k; break; }
        slot[n] = PyBytes_FromStringAndSize(p[k] + sp[k][2 * j], sp[k][2 * j + 1]);
        if (slot[n] == NULL) { /* out of memory: give up the pass */
            Py_SET_SIZE(out, n);
            Py_DECREF(out);
            for (int q = 0; q < 2; q++) { PyBuffer_Release(&bb[q]); PyBuffer_Release(&ss[q]); }
            PyBuffer_Release(&d);
            return NULL;
        }
        st[k] = j + 1;
    }
    Py_SET_SIZE(out, n);
    for (int k = 0; k < 2; k++) {
        PyList_SetItem(starts, k, PyLong_FromSsize_t(st[k]));
        PyBuffer_Release(&bb[k]); PyBuffer_Release(&ss[k]);
    }
    PyBuffer_Release(&d);
    PyObject *r = Py_BuildValue("(Onn)", out, begin + n, shortp); Py_DECREF(out); return r;
}

static PyMethodDef M[] = {{"scan", scan, METH_VARARGS, 0}, {"make", make, METH_VARARGS, 0}, {"take", take, METH_VARARGS, 0}, {0}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "proto", 0, -1, M};
PyMODINIT_FUNC PyInit_proto(void) { return PyModule_Create(&mod); }
"""

MiB = 1 << 20
DRAW = 8192


def build(directory: str) -> None:
    """Compile the prototype module into ``directory`` with the compiler Python was built with."""
    source = os.path.join(directory, "proto.c")
    with open(source, "w") as f:
        f.write(C_SOURCE)
    target = os.path.join(directory, "proto" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    subprocess.run(cc + ["-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"],
                         source, "-o", target], check=True)


class _Input:
    """One file read in ``read_size`` pieces into one buffer; its whole records as spans."""

    def __init__(self, proto, path: str, read_size: int) -> None:
        self.proto = proto
        self.file = open(path, "rb", buffering=0)
        self.read_size = read_size
        self.buf = bytearray(read_size + 65536)
        self.view = memoryview(self.buf)
        self.start = self.filled = 0
        self.spans = np.empty(2 * (len(self.buf) // 16 + 16), np.int64)

    def next_spans(self):
        while not self.file.closed:
            tail = self.filled - self.start
            if tail:
                self.view[:tail] = self.view[self.start:self.filled]
            got = self.file.readinto(self.view[tail:tail + self.read_size])
            if not got:
                self.file.close()
                break
            self.filled = tail + got
            n, self.start = self.proto.scan(self.buf, 0, self.filled, self.spans)
            if n:
                return self.buf, self.spans, n
        return None

    def next_list(self):
        got = self.next_spans()
        return None if got is None else self.proto.make(*got)


def _bound(live: list) -> int:
    return int(0.75 * 2**32) if all(live) else (2**32 if live[0] else 0)


def alone_blocks(proto, a: str, b: str):
    for path in (a, b):
        source = _Input(proto, path, MiB)
        block = source.next_list()
        while block is not None:
            yield block
            block = source.next_list()


def move_blocks(proto, a: str, b: str):
    from streamio import _speedups

    inputs = [_Input(proto, a, 3 * MiB // 4), _Input(proto, b, MiB // 2)]
    rng = np.random.Generator(np.random.PCG64(0))
    live, parts, starts, longest = [True, True], [[], []], [0, 0], 0
    while any(live):
        draws = rng.bit_generator.random_raw(DRAW // 2).view("<u4")
        bounds = np.array([_bound(live), 2**32], np.uint64)
        t = 0
        while t < DRAW:
            out, t, short = _speedups.mix_take(draws, t, max(64, min(8192, longest)), bounds,
                                               parts, starts, None, None)
            if out:
                yield out
            if short < 0:
                continue
            parts[short], starts[short] = inputs[short].next_list(), 0
            if parts[short] is None:
                parts[short], live[short] = [], False
                break
            longest = max(longest, len(parts[short]))


def span_blocks(proto, a: str, b: str):
    inputs = [_Input(proto, a, 3 * MiB // 4), _Input(proto, b, MiB // 2)]
    rng = np.random.Generator(np.random.PCG64(0))
    live, bufs, spans = [True, True], [b"", b""], [np.zeros(2, np.int64)] * 2
    starts, counts, longest = [0, 0], [0, 0], 0
    while any(live):
        draws = rng.bit_generator.random_raw(DRAW // 2).view("<u4")
        bound = _bound(live)
        t = 0
        while t < DRAW:
            out, t, short = proto.take(draws, t, max(64, min(8192, longest)), bound,
                                       tuple(bufs), tuple(spans), starts, counts)
            if out:
                yield out
            if short < 0:
                continue
            got, starts[short] = inputs[short].next_spans(), 0
            if got is None:
                counts[short], live[short] = 0, False
                break
            bufs[short], spans[short], counts[short] = got
            longest = max(longest, counts[short])


PIPELINES = {"alone": alone_blocks, "move": move_blocks, "span": span_blocks}


class _Items:
    """The consumer's end, as streamio's EpochIterator: items one by one, block after block."""

    def __init__(self, blocks) -> None:
        self.blocks, self.items = blocks, iter(())

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.items)
        except StopIteration:
            pass
        self.items = iter(next(self.blocks))
        return next(self.items)


def _child(kind: str, a: str, b: str, directory: str) -> None:
    sys.path.insert(0, directory)
    import proto

    def epoch():
        t0, n = time.perf_counter(), 0
        for _ in _Items(PIPELINES[kind](proto, a, b)):
            n += 1
        return {"wall": time.perf_counter() - t0, "items": n}

    epoch()
    print("ready", flush=True)
    for _ in sys.stdin:
        print(json.dumps(epoch()), flush=True)


def _digest(proto, kind: str, a: str, b: str) -> str:
    h = hashlib.sha256()
    for record in _Items(PIPELINES[kind](proto, a, b)):
        h.update(record)
    return h.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    from streamio.bench.mix import _median_interval, _quartiles, _write_pair
    from streamio.bench.workloads import example_payloads

    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        sys.path.insert(0, tmp)
        import proto

        payloads, _, _ = example_payloads(args.records, np.random.default_rng(0))
        a, b = _write_pair(tmp, "examples", [bytes(p) for p in payloads])
        del payloads
        if _digest(proto, "move", a, b) != _digest(proto, "span", a, b):
            raise SystemExit("move and span gave different epochs")
        print(f"{args.records} Examples, 3/4 in a; {args.rounds} pairs of processes x"
              f" {args.epochs} epochs by turns; median epoch times, median ratio [quartiles]"
              " [95% interval of the median]")
        for first, second in (("alone", "move"), ("alone", "span"), ("move", "span")):
            ratios, times = [], {first: [], second: []}
            for r in range(args.rounds):
                procs = {kind: subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--child", kind, a, b, tmp],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    for kind in (first, second)}
                try:
                    for proc in procs.values():
                        if proc.stdout.readline().strip() != "ready":
                            raise SystemExit("a child failed to start")
                    for e in range(args.epochs):
                        got = {}
                        for kind in ((first, second) if (r + e) % 2 == 0 else (second, first)):
                            procs[kind].stdin.write("epoch\n")
                            procs[kind].stdin.flush()
                            got[kind] = json.loads(procs[kind].stdout.readline())
                        for kind in got:
                            times[kind].append(got[kind]["wall"])
                        ratios.append(got[second]["wall"] / got[first]["wall"])
                finally:
                    for proc in procs.values():
                        proc.stdin.close()
                        proc.wait()
            low, high = _quartiles(ratios)
            sure_low, sure_high = _median_interval(ratios)
            print(f"{second:>5} / {first:<5} {statistics.median(times[first]):.3f} s"
                  f" {statistics.median(times[second]):.3f} s {statistics.median(ratios):.3f}"
                  f" [{low:.2f}-{high:.2f}] [{sure_low:.2f}-{sure_high:.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The peers (tf.data, the tfrecord package, torch): each in its own long-lived worker process,
one JSON command per line on stdin, one JSON reply per line."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import numpy as np

from .cases import _Skip, example_decoder
from .config import ADAPTER_PARTS, BenchConfig, CSV_FEATURES, DEFAULT_BATCH_SIZE, EXAMPLE_FLOATS
from .measure import peak_rss_mib, reset_peak_rss


# -- the peers' worker processes --------------------------------------------------------------------
def _peer_tf(op: dict) -> dict:
    import tensorflow as tf

    kind, path, bs = op["kind"], op["path"], op.get("batch_size", DEFAULT_BATCH_SIZE)
    if kind == "version":
        return {"version": tf.__version__}
    if kind in ("examples", "examples-autotune", "probe-fifo"):
        spec = {"x": tf.io.FixedLenFeature([EXAMPLE_FLOATS], tf.float32),
                "label": tf.io.FixedLenFeature([], tf.int64)}
        ds = tf.data.TFRecordDataset(path).batch(bs)
        if kind == "examples-autotune":
            ds = ds.map(lambda s: tf.io.parse_example(s, spec),
                        num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        else:
            ds = ds.map(lambda s: tf.io.parse_example(s, spec))
        n = 0
        for batch in ds:
            n += int(batch["label"].shape[0])
        return {"records": n}
    if kind in ("to_tf-step", "to_tf-graph", "native-step", "native-graph"):
        source, loop = kind.split("-")
        if source == "to_tf":
            from ..pipeline import Dataset

            ds = Dataset(path, "tfrecord", decoder=example_decoder()).batch(bs).to_tf()
        else:
            spec = {"x": tf.io.FixedLenFeature([EXAMPLE_FLOATS], tf.float32),
                    "label": tf.io.FixedLenFeature([], tf.int64)}
            ds = (tf.data.TFRecordDataset(path).batch(bs)
                  .map(lambda s: tf.io.parse_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE)
                  .prefetch(tf.data.AUTOTUNE))
        return {"records": _graph_loops(tf)[loop](ds)}
    if kind == "csv":
        defaults = [[0.0]] * op["columns"]
        ds = tf.data.TextLineDataset(path).batch(bs).map(
            lambda lines: tf.stack(tf.io.decode_csv(lines, record_defaults=defaults), axis=1))
        n = 0
        for batch in ds:
            n += int(batch.shape[0])
        return {"records": n}
    raise ValueError(f"unknown tf op {kind!r}")


_LOOPS: dict = {}


def _graph_loops(tf: Any) -> dict:
    """The two graph-mode consumers (see the module doc), traced once per worker process."""
    if _LOOPS:
        return _LOOPS

    @tf.function
    def step(iterator: Any) -> Any:  # what model.fit runs per step (steps_per_execution=1)
        batch = next(iterator)
        return tf.shape(batch["label"], out_type=tf.int64)[0], tf.reduce_sum(batch["x"])

    def step_loop(ds: Any) -> int:
        iterator, counts = iter(ds), []
        while True:
            try:
                n, _ = step(iterator)
            except (tf.errors.OutOfRangeError, StopIteration):
                break
            counts.append(n)  # no sync per step, as fit without per-batch callbacks
        return int(tf.add_n(counts)) if counts else 0

    @tf.function
    def graph_loop(ds: Any) -> Any:  # the whole epoch inside one tf.function
        n = tf.constant(0, tf.int64)
        total = tf.constant(0.0)
        for batch in ds:
            n += tf.shape(batch["label"], out_type=tf.int64)[0]
            total += tf.reduce_sum(batch["x"])
        return n

    _LOOPS.update(step=step_loop, graph=lambda ds: int(graph_loop(ds)))
    return _LOOPS


def _peer_tfrecord(op: dict) -> dict:
    from tfrecord.reader import tfrecord_loader

    kind, path, bs = op["kind"], op["path"], op.get("batch_size", DEFAULT_BATCH_SIZE)
    if kind == "version":
        import tfrecord

        return {"version": getattr(tfrecord, "__version__", "?")}
    if kind in ("examples", "probe-fifo"):
        n = 0
        xs: list = []
        labels: list = []
        for ex in tfrecord_loader(path, None, {"x": "float", "label": "int"}):
            xs.append(ex["x"])
            labels.append(ex["label"])
            if len(xs) == bs:  # batches of bs, as float32 / int64 arrays
                np.stack(xs), np.concatenate(labels)
                n += bs
                xs, labels = [], []
        if xs:
            np.stack(xs), np.concatenate(labels)
            n += len(xs)
        return {"records": n}
    raise ValueError(f"unknown tfrecord op {kind!r}")


def _peer_torch(op: dict) -> dict:
    import torch

    from ..pipeline import Dataset

    kind, bs = op["kind"], op.get("batch_size", DEFAULT_BATCH_SIZE)
    if kind == "version":
        return {"version": torch.__version__}
    if kind == "to_torch":
        ds = Dataset(op["parts"], "tfrecord", decoder=example_decoder()).batch(bs)
        loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None,
                                             num_workers=op["num_workers"])
        n = 0
        for batch in loader:
            n += int(batch["label"].shape[0])
        return {"records": n}
    raise ValueError(f"unknown torch op {kind!r}")


_PEERS = {"tf": _peer_tf, "tfrecord": _peer_tfrecord, "torch": _peer_torch}


def worker_main() -> None:
    """A peer worker: one JSON command per line on stdin, one JSON reply per line."""
    which = sys.argv[1]
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # anything the peer prints goes to stderr, never into the replies
    replies = os.fdopen(reply_fd, "w", buffering=1)
    run = _PEERS[which]
    for line in sys.stdin:
        op = json.loads(line)
        reset_peak_rss()
        t0 = time.perf_counter()
        try:
            out = run(op)
            out["seconds"] = time.perf_counter() - t0
            out["peak_rss_mib"] = peak_rss_mib()
            out["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which prints it
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()[:2000],
                   "seconds": time.perf_counter() - t0}
        replies.write(json.dumps(out) + "\n")


class PeerWorker:
    """A long-lived worker process for one peer (``tf`` or ``tfrecord``)."""

    def __init__(self, which: str, timeout: float) -> None:
        self.which = which
        self.timeout = timeout
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        code = "import sys; from streamio.bench.peers import worker_main; worker_main()"
        fd, self.stderr_path = tempfile.mkstemp(prefix=f"streamio-bench-{which}-", suffix=".log")
        with os.fdopen(fd, "wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-c", code, which],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=env)

    def call(self, op: dict, timeout: Optional[float] = None) -> dict:
        if self.proc.poll() is not None:
            return {"ok": False, "error": f"{self.which} worker exited: {self._stderr_tail()}"}
        try:
            self.proc.stdin.write((json.dumps(op) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"ok": False, "error": f"{self.which} worker exited: {self._stderr_tail()}"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout or self.timeout)
        if not ready:
            self.restart()
            return {"ok": False, "error": f"no answer within {timeout or self.timeout:g} s"
                                          " (worker restarted)"}
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"{self.which} worker died: {self._stderr_tail()}"}
        return json.loads(line)

    def _stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode(errors="replace")[-1500:].strip()
        except OSError:
            return "(no stderr)"

    def restart(self) -> None:
        self.close()
        self.__init__(self.which, self.timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


def _module_available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def peer_cases(cfg: BenchConfig, work: dict) -> list:
    """(case name, workload, runner, input, (worker, op) or a _Skip)."""
    cases: list = []
    if not cfg.peers:
        return cases
    tf_ok = _module_available("tensorflow") or _Skip("tensorflow is not installed")
    tfr_ok = _module_available("tfrecord") or _Skip("the tfrecord package is not installed")
    bs = cfg.batch_size
    if "examples" in work and "examples" in cfg.workloads:
        w = work["examples"]
        cases.append(("examples/tf.data", w, f"tf.data TFRecordDataset.batch({bs}).map(parse_example)",
                      "file", ("tf", {"kind": "examples"}) if tf_ok is True else tf_ok))
        cases.append(("examples/tf.data-autotune", w,
                      "tf.data ... .map(parse_example, AUTOTUNE).prefetch(AUTOTUNE)", "file",
                      ("tf", {"kind": "examples-autotune"}) if tf_ok is True else tf_ok))
        cases.append(("examples/tfrecord-pkg", w, f"tfrecord package loader + np.stack({bs})",
                      "file", ("tfrecord", {"kind": "examples"}) if tfr_ok is True else tfr_ok))
    if "adapters" in work:
        w = work["adapters"]
        torch_ok = _module_available("torch") or _Skip("torch is not installed")
        tf_or = (lambda op: ("tf", op)) if tf_ok is True else (lambda op: tf_ok)
        native = f"tf.data TFRecordDataset.batch({bs}).map(parse_example, AUTOTUNE).prefetch"
        for loop in ("graph", "step"):
            cases.append((f"adapters/to_tf-{loop}", w, f"streamio to_tf(), {loop} loop", "fifo",
                          tf_or({"kind": f"to_tf-{loop}"})))
            cases.append((f"adapters/tf.data-{loop}", w, f"{native}, {loop} loop", "file",
                          tf_or({"kind": f"native-{loop}"})))
        for workers in (0, 2):
            op = {"kind": "to_torch", "num_workers": workers, "parts": w.meta["parts"]}
            cases.append((f"adapters/to_torch-w{workers}", w,
                          f"streamio to_torch(), DataLoader(num_workers={workers}),"
                          f" {ADAPTER_PARTS} files", "file",
                          ("torch", op) if torch_ok is True else torch_ok))
    if "csv" in work:
        w = work["csv"]
        cases.append(("csv/tf.data", w, f"tf.data TextLineDataset.batch({bs}).map(decode_csv)",
                      "file", ("tf", {"kind": "csv", "columns": CSV_FEATURES + 1})
                      if tf_ok is True else tf_ok))
    return cases

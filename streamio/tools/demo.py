"""``streamio demo``: train a tiny model from an emulated SageMaker Pipe mode channel.

Nothing but the installed package is needed: ``framework="auto"`` (the default) trains with PyTorch
when it is installed and otherwise with a small numpy model (logistic regression), and
``framework="tf"`` with Keras:

1. a small synthetic dataset (a few thousand ``tf.train.Example`` records: 16 float features and a
   0/1 label from a fixed linear rule with label noise) is written as TFRecord, encoded here
   without TensorFlow;
2. ``streamio sagemaker-local --mode Pipe`` runs as a separate process, as SageMaker's agent
   would: it writes the container's input config under ``<workdir>/opt_ml`` and serves the file
   on the channel's FIFOs ``input/data/train_<epoch>``, one per epoch;
3. the training loop opens the channel as a SageMaker script does, ``sagemaker.channel("train")``
   (here with ``root=`` pointing at the emulated ``/opt/ml``), then ``.shuffle().batch()
   .prefetch()`` (and ``to_torch()`` + ``to_device()``, or ``to_tf()`` and Keras, or the
   batches' numpy arrays directly), and prints each epoch's loss, records per second and the
   time the model waited for data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import importlib.util
import math
import time
from typing import Any, Callable, Optional

import numpy as np

from ..decoders.example import encode_example
from ..errors import SourceError, require
from ..errors import UsageError

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_EPOCHS", "DEFAULT_RECORDS",
           "make_demo_data", "run_demo"]

DEFAULT_EPOCHS = 2
#: A few thousand records: enough for the loss to fall visibly in two epochs, small enough that the
#: demo (including interpreter and framework start-up) takes seconds on two CPU cores.
DEFAULT_RECORDS = 4096
DEFAULT_BATCH_SIZE = 64
DEFAULT_SHUFFLE_BUFFER = 1024
DEFAULT_PREFETCH = 4
DEFAULT_SEED = 0
FEATURES = 16
_FRAMEWORKS = ("auto", "numpy", "torch", "tf")
#: The numpy model's step size (Adam): the loss falls visibly within the first epoch.
_NUMPY_LEARNING_RATE = 0.05
#: How long the writer process waits for the training loop to open each epoch's FIFO.
_SERVE_OPEN_TIMEOUT = 60.0


def make_demo_data(path: str, *, records: int = DEFAULT_RECORDS, seed: int = DEFAULT_SEED) -> None:
    """Write the demo's TFRecord file: features ``x`` (16 floats), label ``y`` (0 or 1)."""
    from ..reader import write_records

    rng = np.random.default_rng(seed)
    weights = rng.normal(size=FEATURES).astype(np.float32)
    x = rng.normal(size=(records, FEATURES)).astype(np.float32)
    logits = x @ weights
    y = (logits + rng.normal(scale=0.5, size=records) > 0).astype(np.int64)
    write_records(path, "tfrecord",
                  (encode_example({"x": x[i], "y": int(y[i])}) for i in range(records)))


# -- the Pipe mode writer -------------------------------------------------------------------------
def _serve(root: str, epochs: int, path: str) -> subprocess.Popen:
    """Start ``streamio sagemaker-local`` in Pipe mode in its own process (the SageMaker agent's
    role) and wait until it has written the container's config, as a real container has it
    before the training script starts."""
    cmd = [sys.executable, "-m", "streamio", "sagemaker-local", "--root", root, "--mode", "Pipe",
           "--channel", f"train={path}", "--epochs", str(epochs),
           "--open-timeout", str(_SERVE_OPEN_TIMEOUT)]
    writer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    config = os.path.join(root, "input", "config", "inputdataconfig.json")
    deadline = time.monotonic() + _SERVE_OPEN_TIMEOUT
    while not os.path.exists(config):
        if writer.poll() is not None or time.monotonic() > deadline:
            err = writer.communicate()[1] if writer.poll() is not None else b""
            raise SourceError("the SageMaker emulator did not start: "
                              + err.decode(errors="replace"), source=root)
        time.sleep(0.01)
    return writer


def _dataset(root: str, *, batch_size: int, seed: int) -> Any:
    from .. import sagemaker
    from ..decoders import Example, FixedLen

    decoder = Example({"x": FixedLen([FEATURES], "float32"), "y": FixedLen([], "int64")})
    return (sagemaker.channel("train", decoder=decoder, root=root,
                              open_timeout=_SERVE_OPEN_TIMEOUT)
            .shuffle(DEFAULT_SHUFFLE_BUFFER, seed=seed)
            .batch(batch_size)
            .prefetch(DEFAULT_PREFETCH))


# -- training -------------------------------------------------------------------------------------
def _train_numpy(ds: Any, epochs: int, *, seed: int, report: Callable[[dict], None]) -> list:
    """Logistic regression trained with Adam on the batches' numpy arrays: no framework."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(scale=0.01, size=FEATURES), np.zeros(1)]
    moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    beta1, beta2, step = 0.9, 0.999, 0
    results = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        waited = 0.0
        total, records = 0.0, 0
        iterator = iter(ds)
        while True:
            t1 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            finally:
                waited += time.perf_counter() - t1
            x = batch["x"].astype(np.float64)
            y = batch["y"].astype(np.float64)
            weights, bias = params[0], params[1][0]
            logits = x @ weights + bias
            # Binary cross-entropy from logits, written to stay finite for large |logits|.
            loss = np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits)))
            error = (1.0 / (1.0 + np.exp(-logits)) - y) / len(y)
            grads = [x.T @ error, np.array([error.sum()])]
            step += 1
            for k, (param, grad) in enumerate(zip(params, grads)):
                m, v = moments[k]
                m[:] = beta1 * m + (1 - beta1) * grad
                v[:] = beta2 * v + (1 - beta2) * grad * grad
                m_hat = m / (1 - beta1 ** step)
                v_hat = v / (1 - beta2 ** step)
                param -= _NUMPY_LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-8)
            total += float(loss.sum())
            records += len(y)
        elapsed = time.perf_counter() - t0
        figures = _figures(epoch, total / max(records, 1), records, elapsed, waited, "numpy, cpu")
        report(figures)
        results.append(figures)
    return results


def _train_torch(ds: Any, epochs: int, *, device: Optional[str], seed: int,
                 report: Callable[[dict], None]) -> list:
    import torch

    from ..torch import to_device

    torch.manual_seed(seed)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    # A FIFO is one stream: one reader, the main process (the Dataset's prefetch thread reads
    # ahead while the model trains).
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=0)
    batches = to_device(loader, device)
    results = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        wait0 = batches.wait_s
        total, records = 0.0, 0
        for batch in batches:
            x, y = batch["x"], batch["y"].float()
            optimizer.zero_grad()
            loss = loss_fn(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            records += len(y)
        elapsed = time.perf_counter() - t0
        figures = _figures(epoch, total / max(records, 1), records, elapsed,
                           batches.wait_s - wait0, device)
        report(figures)
        results.append(figures)
    return results


class _TimedDataset:
    """A streamio Dataset whose iterations add the time spent waiting for each item to
    ``waited[0]``. Keras pulls batches inside its compiled step, so there is no consumer-side
    hook; this measures the wait where tf.data's generator blocks on the stream (an upper bound
    on the model's wait: the ``prefetch`` after it hides part of it)."""

    def __init__(self, ds: Any, waited: list) -> None:
        self._ds = ds
        self._waited = waited

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ds, name)

    def with_context(self, **kwargs: Any) -> "_TimedDataset":
        return _TimedDataset(self._ds.with_context(**kwargs), self._waited)

    def shard(self, num_shards: int, index: int) -> "_TimedDataset":
        return _TimedDataset(self._ds.shard(num_shards, index), self._waited)

    def __iter__(self):
        clock = time.perf_counter
        iterator = iter(self._ds)
        while True:
            t0 = clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self._waited[0] += clock() - t0
            yield item


def _train_tf(ds: Any, epochs: int, *, records: int, seed: int,
              report: Callable[[dict], None]) -> list:
    tf = require("tensorflow", "tf")
    from ..adapters.tf import to_tf

    tf.keras.utils.set_random_seed(seed)
    waited = [0.0]
    batch_size = ds.batch_size
    # A known number of batches per epoch: Keras then ends each epoch without its "Your input ran
    # out of data" warning (see streamio.adapters.tf).
    tfds = (to_tf(_TimedDataset(ds, waited), batches=math.ceil(records / batch_size))
            .map(lambda b: (b["x"], tf.cast(b["y"], tf.float32)))
            .prefetch(tf.data.AUTOTUNE))
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)),
                                 tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    results = []

    class Report(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()
            self.wait0 = waited[0]

        def on_epoch_end(self, epoch, logs=None):
            elapsed = time.perf_counter() - self.t0
            # Keras reports the epoch's mean batch loss; every epoch is the whole file.
            figures = _figures(epoch, float(logs["loss"]), records, elapsed,
                               waited[0] - self.wait0, "cpu (keras)")
            report(figures)
            results.append(figures)

    model.fit(tfds, epochs=epochs, verbose=0, shuffle=False, callbacks=[Report()])
    return results


def _figures(epoch: int, loss: float, records: int, elapsed: float, wait_s: float,
             device: str) -> dict:
    return {"epoch": epoch, "loss": loss, "records": records,
            "seconds": elapsed, "records_per_s": records / elapsed if elapsed > 0 else 0.0,
            "data_wait_s": wait_s, "device": str(device)}


def _print_figures(figures: dict) -> None:
    print(f"epoch {figures['epoch']}: loss {figures['loss']:.4f}  {figures['records']} records"
          f"  {figures['records_per_s']:,.0f} records/s  waited for data"
          f" {figures['data_wait_s'] * 1000:.0f} ms ({figures['device']})", flush=True)


def resolve_framework(framework: str) -> str:
    """``"auto"``: torch if it is installed, else numpy; other names as they are."""
    if framework == "auto":
        try:
            found = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):  # a broken or blocked install counts as none
            found = False
        return "torch" if found else "numpy"
    return framework


def run_demo(framework: str = "auto", epochs: int = DEFAULT_EPOCHS, workdir: Optional[str] = None,
             *, records: int = DEFAULT_RECORDS, batch_size: int = DEFAULT_BATCH_SIZE,
             seed: int = DEFAULT_SEED, device: Optional[str] = None,
             verbose: bool = True) -> dict:
    """Run the demo; returns ``{"framework", "records", "epochs": [per-epoch figures]}``.

    Each epoch's figures: ``epoch``, ``loss`` (mean over the epoch's records), ``records``,
    ``seconds``, ``records_per_s``, ``data_wait_s`` (time the training loop waited for data) and
    ``device``. ``framework``: ``"auto"`` (torch if installed, else numpy), ``"numpy"``,
    ``"torch"`` or ``"tf"`` (Keras). ``workdir``: where the data file and FIFOs go (a temporary directory, removed
    afterwards, if None). ``device`` (torch only): defaults to CUDA when available.
    """
    if framework not in _FRAMEWORKS:
        raise UsageError(f"framework must be one of {_FRAMEWORKS}, not {framework!r}")
    for name, value in (("epochs", epochs), ("records", records), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a positive int, not {value!r}")
    framework = resolve_framework(framework)
    # Fail with the pip install to run before starting the writer process.
    if framework == "torch":
        require("torch", "torch")
    elif framework == "tf":
        # The demo's output is its figures: keep TensorFlow's C++ start-up notices out of it
        # (a user's own setting wins).
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        require("tensorflow", "tf")
    own_dir = workdir is None
    workdir = tempfile.mkdtemp(prefix="streamio-demo-") if own_dir else os.fspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    report = _print_figures if verbose else (lambda figures: None)
    writer = None
    try:
        data = os.path.join(workdir, "train.tfrecord")
        make_demo_data(data, records=records, seed=seed)
        root = os.path.join(workdir, "opt_ml")  # stands for the container's /opt/ml
        channel = os.path.join(root, "input", "data", "train")
        if verbose:
            print(f"streamio demo: {records} tf.train.Example records, served as a SageMaker Pipe"
                  f" mode channel {channel}_<epoch> for {epochs} epochs; training with"
                  f" {framework}", flush=True)
        writer = _serve(root, epochs, data)
        ds = _dataset(root, batch_size=batch_size, seed=seed)
        if framework == "torch":
            results = _train_torch(ds, epochs, device=device, seed=seed, report=report)
        elif framework == "numpy":
            results = _train_numpy(ds, epochs, seed=seed, report=report)
        else:
            results = _train_tf(ds, epochs, records=records, seed=seed, report=report)
        _, err = writer.communicate(timeout=_SERVE_OPEN_TIMEOUT)
        if writer.returncode != 0:
            raise SourceError(f"the SageMaker emulator failed: {err.decode(errors='replace')}",
                              source=channel)
        return {"framework": framework, "records": records, "epochs": results}
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)

"""Measurements for the GPU machine (``benchmarks/device_check.sh``; the CUDA tests use them too).

* :func:`measure_overlap`: how much of the host-to-device copy time :func:`streamio.to_device`
  hides behind compute, timed with CUDA events.
* :func:`decode_rates`: ``Image(device="cuda")`` against the CPU path, images/s, and how far
  the two results are apart.
* :func:`scaling`: the image benchmark from one FIFO at several decoder counts, each beside
  the in-memory decode rate on as many threads, measured in the same round.
"""

from __future__ import annotations

import concurrent.futures
import math
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

__all__ = ["decode_rates", "measure_overlap", "scaling", "cpu_decode_jpegs"]


def measure_overlap(device: str = "cuda", shape: Sequence[int] = (256, 3, 224, 224),
                    batches: int = 24, depth: int = 2, compute_factor: float = 2.0) -> dict:
    """Copy ``batches`` pinned uint8 batches of ``shape`` with :func:`to_device` while a
    synthetic compute step (matrix products, ``compute_factor`` times as long as one copy, that
    also reads the batch) runs on each: ``hidden`` is ``(compute + copy - together) / copy``,
    the share of the copy time that did not add to the run (1.0: all hidden). The first batch's
    copy has nothing to hide behind, so the most there is to hide is ``(batches - 1) / batches``.
    """
    import torch

    from ..adapters.torch import to_device

    dev = torch.device(device)
    host = [torch.randint(0, 256, tuple(shape), dtype=torch.uint8).pin_memory() for _ in range(3)]
    feed = [host[i % len(host)] for i in range(batches)]

    def timed(fn: Callable[[], None]) -> float:
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(end)  # ms

    def copies() -> None:
        for b in feed:
            b.to(dev, non_blocking=True)

    matrix = torch.randn(2048, 2048, device=dev)
    timed(lambda: matrix @ matrix)  # warm up cuBLAS
    copy_ms = timed(copies)
    one_mm = timed(lambda: [matrix @ matrix for _ in range(10)]) / 10
    steps = max(1, math.ceil(compute_factor * copy_ms / batches / one_mm))
    sink = []

    def step(batch: Any) -> None:
        out = batch.float().mean()
        for _ in range(steps):
            out = out + (matrix @ matrix)[0, 0]
        sink.append(out)

    resident = host[0].to(dev)
    # Warm up both loops first (the GPU clocks up under load: a first compute-alone timing ran
    # at half speed on an H200 and made the hidden share 301%), then alternate them and keep
    # each one's median, so that a drift weighs on both.
    timed(lambda: [step(resident) for _ in range(batches)])
    timed(lambda: [step(b) for b in to_device(feed, dev, depth)])
    runs: dict = {"compute": [], "together": [], "copy": []}
    for _ in range(3):
        runs["copy"].append(timed(copies))
        runs["compute"].append(timed(lambda: [step(resident) for _ in range(batches)]))
        runs["together"].append(timed(lambda: [step(b) for b in to_device(feed, dev, depth)]))
        sink.clear()
    copy_ms, compute_ms, together_ms = (statistics.median(runs[k])
                                        for k in ("copy", "compute", "together"))
    hidden = (compute_ms + copy_ms - together_ms) / copy_ms
    return {"copy_ms": copy_ms, "compute_ms": compute_ms, "together_ms": together_ms,
            "hidden": hidden, "batches": batches, "shape": list(shape), "depth": depth,
            "copy_GBps": batches * math.prod(shape) / copy_ms / 1e6}


def cpu_decode_jpegs(datas: List[Any], channels: int, device: Any) -> List[Any]:
    """The CPU stand-in for nvJPEG (simplejpeg, libjpeg-turbo): the torch decode path of
    ``Image(device=...)`` on a machine without a GPU (the dry run, the tests)."""
    import simplejpeg
    import torch

    out = []
    for data in datas:
        try:
            pixels = simplejpeg.decode_jpeg(data.numpy().tobytes(),
                                            colorspace="RGB" if channels == 3 else "GRAY")
        except ValueError as exc:  # torchvision says RuntimeError: so does the stand-in
            raise RuntimeError(str(exc)) from None
        out.append(torch.from_numpy(pixels).permute(2, 0, 1).to(device))
    return out


def decode_rates(jpegs: Sequence[bytes], *, device: Optional[str], batch: int = 256,
                 resize: int = 256, crop: int = 224, threads: int = 1) -> Dict[str, Any]:
    """images/s of the CPU path (``threads`` threads) and of the torch path on ``device``
    (``None``: the torch path on the CPU with :func:`cpu_decode_jpegs`, for the dry run), and
    their difference (mean and max absolute, uint8 levels) against the CPU path without DCT
    scaling."""
    import torch

    from ..decoders import Image
    from ..decoders import _torch_image

    batches = [list(jpegs[i:i + batch]) for i in range(0, len(jpegs), batch)]
    cpu = Image(resize=resize, crop=crop)

    # Enough pieces for every thread to stay busy (the batches alone may be fewer).
    pieces = [list(jpegs[i::4 * threads]) for i in range(4 * threads)]

    def cpu_run() -> None:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(cpu.decode_batch, pieces))

    t0 = time.perf_counter()
    cpu_run()
    cpu_rate = len(jpegs) / (time.perf_counter() - t0)
    if device is None:
        dev = torch.device("cpu")
        decode = _torch_image.decode_column
        gpu = Image(resize=resize, crop=crop)

        def torch_batch(b: list) -> Any:
            return decode(gpu, b, dev, decode_jpegs=cpu_decode_jpegs)[0]
    else:
        dev = torch.device(device)
        gpu = Image(resize=resize, crop=crop, device=device)

        def torch_batch(b: list) -> Any:
            return gpu.decode_batch(b)["image"]
    torch_batch(batches[0])  # warm up (nvJPEG handles, cuBLAS-free but allocator and kernels)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    results = [torch_batch(b) for b in batches]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    torch_rate = len(jpegs) / (time.perf_counter() - t0)
    reference = Image(resize=resize, crop=crop, dct_scaling=False)
    diffs = [np.abs(r.cpu().numpy().astype(np.int16)
                    - reference.decode_batch(b)["image"].astype(np.int16))
             for r, b in zip(results[:2], batches[:2])]
    both = np.concatenate([d.ravel() for d in diffs])
    return {"cpu_rate": cpu_rate, "cpu_threads": threads, "torch_rate": torch_rate,
            "device": str(dev), "mean_abs": float(both.mean()), "max_abs": int(both.max()),
            "images": len(jpegs), "batch": batch}


def scaling(info: dict, decoders: Sequence[int], rounds: int, tmpdir: str,
            deadline: Optional[float] = None) -> Iterator[Dict[str, Any]]:
    """The image benchmark's TFRecord case from ONE FIFO at each count of ``decoders``, as
    threads and as processes, each round beside the in-memory decode+resize+crop rate on the
    same number of threads; one dict per count, yielded as soon as it is measured (so that a
    run cut short still has its first rows). Stops before a count when ``deadline``
    (``time.monotonic()``) has passed."""
    from . import images as bench_images

    jpegs = []
    for path, _ in info["files"]:
        with open(path, "rb") as f:
            jpegs.append(f.read())
    n = info["images"]
    bench_images.warm_up(info)  # the forkserver behind map(backend="process"), torch's import
    for count in decoders:
        if deadline is not None and time.monotonic() > deadline:
            return
        cases = {
            "threads": lambda: bench_images.time_fifo(info["tfrecord"], tmpdir, "tfrecord",
                                                       count, "thread"),
            "processes": lambda: bench_images.time_fifo(info["tfrecord"], tmpdir, "tfrecord",
                                                         count, "process"),
            "in-memory": lambda: bench_images.time_limit(jpegs, False, count),
        }
        if count == 1:  # one decoder decodes in the reading thread, whatever the backend
            del cases["processes"]
        seconds: Dict[str, List[float]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                s, got, _ = cases[name]()
                if got != n:
                    raise RuntimeError(f"{count} {name}: {got} images, expected {n}")
                seconds[name].append(s)
        row: Dict[str, Any] = {"decoders": count, "images": n, "rounds": rounds}
        for name, s in seconds.items():
            row[name] = n / statistics.median(s)
        if count == 1:
            row["processes"], seconds["processes"] = row["threads"], seconds["threads"]
        for name in ("threads", "processes"):  # paired per round: drift cancels
            row[f"{name}/in-memory"] = statistics.median(
                m / f for f, m in zip(seconds[name], seconds["in-memory"]))
        yield row

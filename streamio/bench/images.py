"""The image benchmark: ``streamio bench --workloads images`` or
``python benchmarks/images.py``.

An ImageNet-like set (``--images`` photos of about 500x375 made from smooth multi-octave noise,
so that their JPEGs are the size of real photos, ~60-120 KB; 10 classes) is generated once and
cached (``--cache-dir``, default ``./bench-images``, gitignored) as

* (a) a TFRecord file of ``tf.train.Example`` (``image/encoded``, ``image/class/label``),
* (b) an im2rec RecordIO file (MXNet's ``recordio.pack``: IRHeader + JPEG),
* (c) loose JPEG files in ``class_k/`` folders, for the ImageFolder baseline.

Every case decodes each image, resizes the short side to 256 and centre-crops 224x224 (uint8
HWC), in batches of 64, and counts images and labels. Cases (alternating over ``--rounds``, in
reverse order every other round, so that a steady drift in the machine's speed, which a shared
cloud VM has, weighs on both sides of every ratio alike):

* streamio, one FIFO fed by a writer process, for (a) and (b): one decoder (``decoder=`` on the
  Dataset, decoding in the reading thread), then 2 decoders as threads and as processes via
  ``ds.batch(64).map(decoder.decode_batch, num_parallel=2, backend=...)``. Where this checkout's
  ``Dataset`` has no ``map`` yet, a *stand-in* (a bounded, ordered pool of 2 threads or
  processes over the batches of raw records) runs instead, and the output says so;
* the baseline of the articles: a torchvision-style ``ImageFolder`` (PIL open + decode +
  ``Resize(256)`` + ``CenterCrop(224)`` per file, as torchvision does it, written out because
  torchvision is not installable beside this torch) under ``DataLoader(batch_size=64,
  num_workers=2)``, reading the loose files from local disk;
* the limit: the same per-image decode + resize + crop (``Image.decode``) on in-memory bytes in
  one thread, times the number of cores; and the raw decode alone, for reference.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

__all__ = ["main", "make_image_set", "photo"]

DEFAULT_IMAGES = 3_000
DEFAULT_ROUNDS = 3
BATCH = 64
RESIZE, CROP = 256, 224
CLASSES = 10
JPEG_QUALITY = 90
PARALLEL = 2  # decoders in the parallel cases (the 2-core machine the targets are set for)
GENERATOR_VERSION = 1  # bump when photo() changes, so caches are rebuilt
# (height, width) of the photos, with their shares: ImageNet's commonest shapes.
SHAPES = [((375, 500), 0.6), ((333, 500), 0.2), ((500, 375), 0.2)]


# -- the image set -------------------------------------------------------------------------------
def photo(seed: int) -> np.ndarray:
    """A photo-like RGB image: octaves of bicubically upsampled noise (large smooth shapes down
    to fine texture) plus a little grain, so JPEG compresses it as much as it does a photo."""
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    (h, w), = [SHAPES[rng.choice(len(SHAPES), p=[s for _, s in SHAPES])][0]]
    decay = rng.uniform(0.8, 0.9)
    out = np.zeros((h, w, 3), np.float32)
    amp = 1.0
    for cells in (3, 6, 12, 25, 50, 100, 250):
        grid = rng.integers(0, 256, (max(2, cells * h // w), max(2, cells * w // h), 3), np.uint8)
        out += amp * np.asarray(PILImage.fromarray(grid).resize((w, h), PILImage.BICUBIC),
                                np.float32)
        amp *= decay
    out -= out.mean(axis=(0, 1))
    out *= 60 / (out.std() + 1e-6)
    out += rng.normal(0, rng.uniform(3, 7), (h, w, 3)).astype(np.float32)
    return np.clip(out + 128, 0, 255).astype(np.uint8)


def _encode_photo(seed: int) -> bytes:
    import io

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(photo(seed)).save(buf, "JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def make_image_set(n: int, cache_dir: str, log: Callable[[str], None] = lambda m: None) -> dict:
    """Generate (or find cached) ``n`` photos as TFRecord, im2rec and loose files."""
    from ..decoders import encode_example, encode_image_record
    from ..reader import write_records

    root = os.path.join(cache_dir, f"v{GENERATOR_VERSION}-n{n}")
    done = os.path.join(root, "done.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    os.makedirs(root, exist_ok=True)
    larger = _larger_set(cache_dir, n)
    if larger is not None:  # photo i depends only on i: the first n of a larger set are the same
        log(f"taking the first {n} photos of {larger['root']} into {root}")
        jpegs = []
        for path, _ in larger["files"][:n]:
            with open(path, "rb") as f:
                jpegs.append(f.read())
    else:
        log(f"generating {n} photos into {root} (cached for later runs)")
        with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 1) as pool:
            jpegs = pool.map(_encode_photo, range(n), chunksize=16)
    labels = [i % CLASSES for i in range(n)]
    files = []
    for i, (jpeg, label) in enumerate(zip(jpegs, labels)):
        folder = os.path.join(root, "folder", f"class_{label}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"img_{i:06d}.jpg")
        with open(path, "wb") as f:
            f.write(jpeg)
        files.append((path, label))
    tfrecord = os.path.join(root, "train.tfrecord")
    write_records(tfrecord, "tfrecord", (encode_example({"image/encoded": j, "image/class/label": y})
                                         for j, y in zip(jpegs, labels)))
    rec = os.path.join(root, "train.rec")
    write_records(rec, "recordio", (encode_image_record(j, float(y), id=i)
                                    for i, (j, y) in enumerate(zip(jpegs, labels))))
    info = {"root": root, "images": n, "tfrecord": tfrecord, "rec": rec, "files": files,
            "jpeg_bytes": sum(map(len, jpegs)), "label_sum": int(sum(labels))}
    with open(done, "w") as f:
        json.dump(info, f)
    return info


def _larger_set(cache_dir: str, n: int) -> Optional[dict]:
    prefix = f"v{GENERATOR_VERSION}-n"
    sizes = sorted(int(d[len(prefix):]) for d in os.listdir(cache_dir)
                   if d.startswith(prefix) and d[len(prefix):].isdigit())
    for m in sizes:
        done = os.path.join(cache_dir, f"{prefix}{m}", "done.json")
        if m > n and os.path.exists(done):
            with open(done) as f:
                return json.load(f)
    return None


# -- decoding strategies ---------------------------------------------------------------------------
def _decoders(fmt: str) -> Any:
    from ..decoders import Example, FixedLen, Image, ImageRecord

    image = Image(resize=RESIZE, crop=CROP)
    if fmt == "tfrecord":
        return Example({"image/encoded": image, "image/class/label": FixedLen([], "int64")})
    return ImageRecord(image)


def _label_key(fmt: str) -> str:
    return "image/class/label" if fmt == "tfrecord" else "label"


def _image_key(fmt: str) -> str:
    return "image/encoded" if fmt == "tfrecord" else "image"


_WORKER_DECODER: Any = None


def _init_worker(fmt: str) -> None:
    global _WORKER_DECODER
    _WORKER_DECODER = _decoders(fmt)


def _decode_in_worker(records: list) -> dict:
    return _WORKER_DECODER.decode_batch(records)


def _bounded_ordered(submit: Callable[[Any], Any], items: Iterable[Any], depth: int) -> Iterator[Any]:
    """Results of ``submit(item)`` futures in order, at most ``depth`` in flight."""
    pending: deque = deque()
    for item in items:
        pending.append(submit(item))
        if len(pending) >= depth:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def has_map() -> bool:
    from ..pipeline import Dataset

    return callable(getattr(Dataset, "map", None))


def streamio_batches(path: str, fmt: str, parallel: int, backend: str) -> Iterator[dict]:
    """Decoded batches of ``path`` (a FIFO) with ``parallel`` decoders (1: inline)."""
    from ..pipeline import Dataset

    decoder = _decoders(fmt)
    if parallel == 1:
        yield from Dataset(path, fmt, decoder=decoder).batch(BATCH)
        return
    raw = Dataset(path, fmt).batch(BATCH)
    if has_map():
        yield from raw.map(decoder.decode_batch, num_parallel=parallel, backend=backend)
        return
    # Stand-in for Dataset.map until it is merged: the same work, batches of raw records
    # decoded by a pool, in order, 2 x parallel batches in flight.
    if backend == "thread":
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            yield from _bounded_ordered(lambda b: pool.submit(decoder.decode_batch, b), raw,
                                        2 * parallel)
    else:
        ctx = multiprocessing.get_context("fork")  # no threads run in this process here
        with concurrent.futures.ProcessPoolExecutor(parallel, mp_context=ctx,
                                                    initializer=_init_worker,
                                                    initargs=(fmt,)) as pool:
            yield from _bounded_ordered(lambda b: pool.submit(_decode_in_worker, b), raw,
                                        2 * parallel)


class ImageFolderDataset:
    """torchvision's ``ImageFolder(root, transform=Compose([Resize(256), CenterCrop(224),
    PILToTensor()]))`` written out: PIL open, RGB, bilinear resize of the short side (long side
    truncated, as torchvision), centre crop at rounded offsets, HWC uint8 tensor."""

    def __init__(self, files: Sequence[tuple]) -> None:
        self.files = list(files)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple:
        import torch
        from PIL import Image as PILImage

        path, label = self.files[i]
        with open(path, "rb") as f:
            img = PILImage.open(f).convert("RGB")
        w, h = img.size
        rw, rh = (RESIZE, int(RESIZE * h / w)) if w <= h else (int(RESIZE * w / h), RESIZE)
        img = img.resize((rw, rh), PILImage.BILINEAR)
        top, left = int(round((rh - CROP) / 2.0)), int(round((rw - CROP) / 2.0))
        img = img.crop((left, top, left + CROP, top + CROP))
        return torch.from_numpy(np.asarray(img).copy()), label


def imagefolder_batches(files: Sequence[tuple], workers: int) -> Iterator[dict]:
    import torch

    loader = torch.utils.data.DataLoader(ImageFolderDataset(files), batch_size=BATCH,
                                         num_workers=workers, shuffle=False)
    for images, labels in loader:
        yield {"image": images, "label": labels}


# -- measuring -------------------------------------------------------------------------------------
def _consume(batches: Iterable[dict], image_key: str, label_key: str) -> tuple:
    images = labels = 0
    for batch in batches:
        shape = tuple(batch[image_key].shape)
        if shape[1:] != (CROP, CROP, 3):
            raise RuntimeError(f"unexpected batch shape {shape}")
        images += shape[0]
        labels += int(np.asarray(batch[label_key]).sum())
    return images, labels


def time_fifo(src: str, tmpdir: str, fmt: str, parallel: int, backend: str) -> tuple:
    from .measure import FifoFeed

    feed = FifoFeed(src, tmpdir)
    try:
        t0 = time.perf_counter()
        images, labels = _consume(streamio_batches(feed.path, fmt, parallel, backend),
                                  _image_key(fmt), _label_key(fmt))
        return time.perf_counter() - t0, images, labels
    except BaseException:
        feed.unblock()
        raise
    finally:
        feed.close()


def _time_imagefolder(files: Sequence[tuple], workers: int) -> tuple:
    t0 = time.perf_counter()
    images, labels = _consume(imagefolder_batches(files, workers), "image", "label")
    return time.perf_counter() - t0, images, labels


def time_limit(jpegs: Sequence[bytes], raw: bool, threads: int = 1) -> tuple:
    from ..decoders import Image

    if raw:  # the chosen library's decode alone, full size
        import simplejpeg

        def decode(data: bytes) -> Any:
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
    else:
        decode = Image(resize=RESIZE, crop=CROP).decode
    t0 = time.perf_counter()
    if threads == 1:
        for data in jpegs:
            decode(data)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda part: [decode(d) for d in part],
                          [jpegs[k::threads] for k in range(threads)]))
    return time.perf_counter() - t0, len(jpegs), None


def warm_up(info: dict) -> None:
    """Pay the once-per-program costs before any case is timed, so that no case's first round
    carries them: importing torch (the ImageFolder baseline's DataLoader) and starting the
    forkserver behind ``map(backend="process")`` (it imports the decoder's modules once for
    every later epoch). Each epoch's own costs (threads, worker processes, opening the FIFO)
    stay inside the timings."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    if has_map():
        from ..pipeline import Dataset

        for fmt, src in (("tfrecord", info["tfrecord"]), ("recordio", info["rec"])):
            decoder = _decoders(fmt)
            it = iter(Dataset(src, fmt).batch(BATCH).map(decoder.decode_batch,
                                                       num_parallel=PARALLEL, backend="process"))
            try:
                next(it)
            finally:
                it.close()


def _cpu_seconds() -> float:
    """CPU time of this process, its reaped children (the FIFO writer, DataLoader workers)
    and, on Linux, the map forkserver's reaped children (the map processes): on a shared
    machine, CPU per image says what the wall clock cannot, how much work each case does. A
    FIFO case's count includes its writer process's start (~0.05 s of Python start-up)."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    try:
        from multiprocessing import forkserver

        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):  # not Linux, or the server is gone
        pass
    return total


def _load() -> Optional[tuple]:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover - not on this platform
        return None


def run(images: int, rounds: int, cache_dir: str, tmpdir: str, log: Callable[[str], None]) -> dict:
    info = make_image_set(images, cache_dir, log)
    jpegs = []
    for path, _ in info["files"]:
        with open(path, "rb") as f:
            jpegs.append(f.read())
    cores = os.cpu_count() or 1
    warm_up(info)
    load_before = _load()
    cases: dict = {}
    for fmt, src in (("tfrecord", info["tfrecord"]), ("recordio", info["rec"])):
        name = "TFRecord Example" if fmt == "tfrecord" else "im2rec .rec"
        cases[f"{name}: 1 decoder"] = lambda s=src, f=fmt: time_fifo(s, tmpdir, f, 1, "thread")
        cases[f"{name}: {PARALLEL} threads"] = (
            lambda s=src, f=fmt: time_fifo(s, tmpdir, f, PARALLEL, "thread"))
        cases[f"{name}: {PARALLEL} processes"] = (
            lambda s=src, f=fmt: time_fifo(s, tmpdir, f, PARALLEL, "process"))
    cases[f"ImageFolder baseline, DataLoader(num_workers={PARALLEL})"] = (
        lambda: _time_imagefolder(info["files"], PARALLEL))
    cases["limit: decode+resize+crop in memory, 1 thread"] = lambda: time_limit(jpegs, False)
    cases[f"decode+resize+crop in memory, {PARALLEL} threads (are {PARALLEL} cores free?)"] = (
        lambda: time_limit(jpegs, False, PARALLEL))
    cases["raw decode in memory, 1 thread (reference)"] = lambda: time_limit(jpegs, True)
    seconds: dict = {name: [] for name in cases}
    cpu: dict = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            case = cases[name]
            c0 = _cpu_seconds()
            s, n, label_sum = case()
            cpu[name].append(_cpu_seconds() - c0)
            if n != info["images"] or (label_sum is not None and label_sum != info["label_sum"]):
                raise RuntimeError(f"{name}: {n} images, label sum {label_sum}; expected"
                                   f" {info['images']}, {info['label_sum']}")
            seconds[name].append(s)
            log(f"round {r + 1}/{rounds}: {name}: {n / s:,.0f} images/s")
    return {"info": {k: v for k, v in info.items() if k != "files"}, "cores": cores,
            "seconds": seconds, "map": "Dataset.map" if has_map() else "stand-in pool",
            "load": [load_before, _load()], "cpu_seconds": cpu}


def format_report(report: dict) -> str:
    info = report["info"]
    n, mb = info["images"], info["jpeg_bytes"] / 1e6
    cores = report["cores"]
    rate = {name: n / statistics.median(s) for name, s in report["seconds"].items()}
    lines = [f"{n} JPEGs, {mb:.0f} MB ({info['jpeg_bytes'] / n / 1e3:.0f} KB each), decode +"
             f" resize {RESIZE} + centre crop {CROP} + batch {BATCH}; {cores} cores;"
             f" median of {len(next(iter(report['seconds'].values())))} rounds",
             "load average (1, 5, 15 min) before / after: "
             + " / ".join("?" if la is None else ", ".join(f"{x:.1f}" for x in la)
                          for la in report.get("load", [None, None]))
             + f" (more than {cores} means other work shared the cores: ratios are then noisy)",
             f"parallel decoders via {report['map']}"
             + ("" if report["map"] == "Dataset.map" else
                " (Dataset.map is not in this checkout: a bounded ordered pool over batches of"
                " raw records stands in for it)"),
             "", f"{'case':58s} {'images/s':>9s} {'MB/s':>7s} {'CPU ms/image':>12s}"]
    cpu = report.get("cpu_seconds", {})
    for name, r in rate.items():
        per = (f"{statistics.median(cpu[name]) / n * 1e3:12.2f}" if cpu.get(name) else "")
        lines.append(f"{name:58s} {r:9,.0f} {r * mb / n:7.1f} {per}")
    limit = rate["limit: decode+resize+crop in memory, 1 thread"] * cores
    raw_limit = rate["raw decode in memory, 1 thread (reference)"] * cores
    base = rate[f"ImageFolder baseline, DataLoader(num_workers={PARALLEL})"]
    lines.append(f"{'limit x ' + str(cores) + ' cores':58s} {limit:9,.0f} {limit * mb / n:7.1f}")
    lines += ["", "ratios, each the median of the rounds' own ratios (both sides ran in the same"
              " round, so a drift in the machine's speed cancels) (target)"]
    seconds = report["seconds"]

    def paired(a: str, b: str, factor: float = 1.0) -> float:
        # rate_a / (rate_b * factor) per round = seconds_b / (seconds_a * factor)
        return statistics.median(sb / (sa * factor) for sa, sb in zip(seconds[a], seconds[b]))

    limit_case = "limit: decode+resize+crop in memory, 1 thread"
    raw_case = "raw decode in memory, 1 thread (reference)"
    base_case = f"ImageFolder baseline, DataLoader(num_workers={PARALLEL})"
    for fmt in ("TFRecord Example", "im2rec .rec"):
        one = f"{fmt}: 1 decoder"
        for backend in ("threads", "processes"):
            two = f"{fmt}: {PARALLEL} {backend}"
            lines.append(f"  {fmt}, {PARALLEL} {backend}: {paired(two, one):.2f}x one decoder"
                         f" (>= 1.8), {paired(two, base_case):.2f}x ImageFolder (>= 1.0),"
                         f" {paired(two, limit_case, cores):.2f}x the limit (>= 0.9;"
                         f" {paired(two, raw_case, cores):.2f}x raw decode x cores)")
    if all(cpu.get(c) for c in (limit_case, f"{fmt}: {PARALLEL} threads")):
        lines += ["", "CPU per image over the limit's (the work beyond decoding; unlike the wall"
                  " clock, it holds on a loaded machine; idle cores are not in it):"]
        limit_cpu = statistics.median(cpu[limit_case])
        for fmt in ("TFRecord Example", "im2rec .rec"):
            parts = [f"{kind} {statistics.median(cpu[f'{fmt}: {kind}']) / limit_cpu:.2f}x"
                     for kind in ("1 decoder", f"{PARALLEL} threads", f"{PARALLEL} processes")]
            lines.append(f"  {fmt}: " + ", ".join(parts))
    del base, limit, raw_limit
    return "\n".join(lines)


# -- which JPEG library (the table behind the choice in decoders/image.py) --------------------------
def _library_cases() -> dict:
    """Decode + resize-256 + centre-crop-224 per library, each with its own fast path."""
    import io

    from PIL import Image as PILImage

    def box(w: int, h: int) -> tuple:
        side = min(w, h) * CROP / RESIZE
        return ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)

    def finish(pixels: np.ndarray) -> np.ndarray:
        h, w = pixels.shape[:2]
        return np.asarray(PILImage.fromarray(pixels).resize((CROP, CROP), PILImage.BILINEAR,
                                                            box=box(w, h)))

    def pillow(data: bytes) -> np.ndarray:
        im = PILImage.open(io.BytesIO(data))
        im.draft("RGB", (CROP, CROP))  # DCT scaling where the output allows it
        im = im.convert("RGB")
        return np.asarray(im.resize((CROP, CROP), PILImage.BILINEAR, box=box(*im.size)))

    cases: dict = {"Pillow": pillow}
    try:
        import simplejpeg

        cases["simplejpeg"] = lambda data: finish(simplejpeg.decode_jpeg(
            data, colorspace="RGB", min_height=CROP, min_width=CROP))
    except ImportError as exc:
        cases["simplejpeg"] = exc
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        cases["PyTurboJPEG"] = lambda data: finish(tj.decode(data, pixel_format=turbojpeg.TJPF_RGB))
    except Exception as exc:  # noqa: BLE001 - ImportError, or its system library missing/too old
        cases["PyTurboJPEG"] = exc
    return cases


def compare_libraries(jpegs: Sequence[bytes], rounds: int) -> str:
    lines = [f"{'library (decode + resize + crop)':34s} {'1 thread':>10s} {'2 threads':>10s}"
             f" {'ratio':>6s}"]
    for name, fn in _library_cases().items():
        if isinstance(fn, BaseException):
            lines.append(f"{name:34s} not available: {type(fn).__name__}: {fn}")
            continue
        one, two = [], []
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(rounds):
                t0 = time.perf_counter()
                for data in jpegs:
                    fn(data)
                one.append(len(jpegs) / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                list(pool.map(lambda part: [fn(d) for d in part], [jpegs[0::2], jpegs[1::2]]))
                two.append(len(jpegs) / (time.perf_counter() - t0))
        a, b = statistics.median(one), statistics.median(two)
        lines.append(f"{name:34s} {a:10,.0f} {b:10,.0f} {b / a:6.2f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamio bench --workloads images",
                                description="The image benchmark: JPEG records from one FIFO, decoded by 1 and 2 decoders, against an ImageFolder loader and the in-memory decode limit.")
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                   help=f"photos in the set (default {DEFAULT_IMAGES}; 600 for a quick run)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply --images")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--cache-dir", default="bench-images",
                   help="where the generated set is kept between runs (default ./bench-images)")
    p.add_argument("--libraries", action="store_true",
                   help="only compare the JPEG libraries (Pillow, simplejpeg, PyTurboJPEG) on"
                        " the set's images in memory, 1 and 2 threads")
    p.add_argument("--json", dest="json_path", metavar="PATH")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    import tempfile

    args = build_parser().parse_args(argv)
    n = max(BATCH, int(args.images * args.scale))
    log = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if args.libraries:
        info = make_image_set(n, args.cache_dir, log)
        jpegs = []
        for path, _ in info["files"]:
            with open(path, "rb") as f:
                jpegs.append(f.read())
        print(compare_libraries(jpegs, max(1, args.rounds)))
        return 0
    with tempfile.TemporaryDirectory(prefix="streamio-bench-images-") as tmpdir:
        report = run(n, max(1, args.rounds), args.cache_dir, tmpdir, log)
    print(format_report(report))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

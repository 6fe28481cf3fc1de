"""GPU JPEG decode (``Image(device="cuda")``), the prefetcher's resume, and the GPU-host claims.

Tests marked ``cuda`` run with ``pytest -m cuda`` on a machine with a GPU
(``benchmarks/device_check.sh``) and skip elsewhere, saying why. The others run everywhere: the
torch decode path (batching, geometry, bad images, CPU fallback) on the CPU, with simplejpeg
standing in for nvJPEG, so that everything but the GPU's own decoder is tested by CI.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("simplejpeg")

from PIL import Image as PIL  # noqa: E402

import streamio  # noqa: E402
from streamio.bench.device import cpu_decode_jpegs, measure_overlap  # noqa: E402
from streamio.bench.images import photo  # noqa: E402
from streamio.decoders import (Example, FixedLen, Image, RandomResizedCrop,  # noqa: E402
                               encode_example)
from streamio.decoders import _torch_image  # noqa: E402
from streamio.decoders._torch_image import (GPU_MAX_ABS_TOLERANCE,  # noqa: E402
                                            GPU_MEAN_ABS_TOLERANCE)
from streamio.errors import DecodeError, UsageError  # noqa: E402
from streamio.torch import to_device  # noqa: E402

from support.clean_workers import CONTEXT  # noqa: E402

CUDA = torch.cuda.is_available()


def jpeg(array: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    PIL.fromarray(array).save(buf, "JPEG", quality=kw.pop("quality", 90), **kw)
    return buf.getvalue()


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    PIL.fromarray(array).save(buf, "PNG")
    return buf.getvalue()


PHOTOS = [photo(i) for i in range(12)]  # ImageNet-like shapes (500x375, 375x500, 500x333)
JPEGS = [jpeg(p) for p in PHOTOS]


def corrupt(data: bytes) -> bytes:
    return data[:600] + b"\x00" * 200  # header intact, scan data cut short and zeroed


def diff(got, want: np.ndarray) -> np.ndarray:
    return np.abs(got.cpu().numpy().astype(np.int16) - want.astype(np.int16))


def on_cpu(image: Image, values, **kw):
    """The torch decode path, on the CPU, simplejpeg decoding the JPEGs in nvJPEG's place."""
    return _torch_image.decode_column(image, values, torch.device("cpu"),
                                      decode_jpegs=cpu_decode_jpegs, **kw)


# -- everywhere: the torch path's own steps ----------------------------------------------------------
@pytest.mark.skipif(CUDA, reason="checks the error without CUDA")
def test_image_on_cuda_without_a_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="torch.cuda.is_available"):
        Image(size=224, device="cuda")
    with pytest.raises(UsageError, match="'cuda' or 'cuda:N'"):
        Image(size=224, device="cpu")


@pytest.mark.parametrize("options", [dict(resize=256, crop=224), dict(size=160),
                                     dict(resize=(120, 90)), dict(crop=(300, 400)),
                                     dict(size=64, layout="CHW"), dict(size=64, channels=1)])
def test_torch_path_is_the_cpu_path_up_to_resize_rounding(options):
    # Same decoder (libjpeg-turbo) on both sides: what is left is torch's antialiased resize of
    # the whole image + crop against Pillow's resize of the crop's box, both bilinear.
    got, keep = on_cpu(Image(**options), JPEGS)
    want = Image(dct_scaling=False, **options).decode_batch(JPEGS)["image"]
    assert keep is None and got.dtype == torch.uint8 and tuple(got.shape) == want.shape
    d = diff(got, want)
    assert d.mean() <= 0.25 and d.max() <= 2


def test_torch_path_random_resized_crop_draws_the_cpu_paths_crops():
    crop = RandomResizedCrop(96, seed=3)
    got, _ = on_cpu(Image(crop=crop), JPEGS)
    want = Image(crop=crop, dct_scaling=False).decode_batch(JPEGS)["image"]
    d = diff(got, want)
    # The same boxes and flips (a wrong box or flip would differ by tens of levels on average).
    assert d.mean() <= 0.5 and np.percentile(d, 99) <= 2


def test_torch_path_decodes_pngs_on_the_cpu_and_pads_small_images():
    small = photo(20)[:100, :150]
    values = [png(PHOTOS[0]), JPEGS[1], jpeg(small), png(small)]
    got, keep = on_cpu(Image(crop=(200, 200)), values)
    want = Image(crop=(200, 200), dct_scaling=False).decode_batch(values)["image"]
    assert keep is None
    assert np.array_equal(got[0].numpy(), want[0])  # a PNG: the CPU path's own pixels
    assert np.array_equal(got[3].numpy(), want[3])
    assert (got[2].numpy()[:50] == 0).all()  # zero padding where the image is smaller
    assert diff(got, want).max() <= 2


def test_torch_path_bad_images_raise_with_their_record_or_are_skipped():
    values = [JPEGS[0], JPEGS[1], corrupt(JPEGS[2]), JPEGS[3], b"\xff\xd8 not a JPEG"]
    with pytest.raises(DecodeError) as info:
        on_cpu(Image(size=32), values, source="s.tfrecord", first_index=40, field="img")
    assert (info.value.source, info.value.record_index, info.value.field) == ("s.tfrecord", 42,
                                                                              "img")
    got, keep = on_cpu(Image(size=32, on_error="skip"), values)
    assert keep.tolist() == [True, True, False, True, False]
    want = Image(size=32, dct_scaling=False).decode_batch([values[i] for i in (0, 1, 3)])["image"]
    assert tuple(got.shape) == (3, 32, 32, 3) and diff(got, want).max() <= 2


def test_torch_path_refuses_too_many_pixels_before_decoding():
    calls = []

    def decode(datas, channels, device):
        calls.append(len(datas))
        return cpu_decode_jpegs(datas, channels, device)

    got, keep = _torch_image.decode_column(Image(size=16, on_error="skip", max_pixels=180_000),
                                           JPEGS[:4], torch.device("cpu"), decode_jpegs=decode)
    sizes = [p.shape[0] * p.shape[1] for p in PHOTOS[:4]]
    assert keep.tolist() == [s <= 180_000 for s in sizes] == [True, False, False, False]
    assert calls == [1]  # only the image within max_pixels reached the decoder


def test_gpu_options_without_a_torch_filter_or_fixed_size_are_refused():
    with pytest.raises(UsageError, match="fixed output size"):
        _torch_image.check_geometry(Image(resize=256))
    with pytest.raises(UsageError, match="no GPU version"):
        _torch_image.check_geometry(Image(size=64, resample="lanczos"))


def test_prefetcher_state_is_the_last_yielded_batch(tmp_path):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = dataset_of_ids(tmp_path, 64)
    loader = sdl.StatefulDataLoader(ds.to_torch(), batch_size=None)
    prefetcher = to_device(loader, "cpu")
    seen = []
    for batch in prefetcher:
        seen += batch["id"].tolist()
        if len(seen) == 24:
            break
    state = prefetcher.state_dict()
    resumed = sdl.StatefulDataLoader(ds.to_torch(), batch_size=None)
    to_device(resumed, "cpu").load_state_dict(state)
    rest = [i for b in resumed for i in b["id"].tolist()]
    assert sorted(seen + rest) == list(range(64))


def dataset_of_ids(tmp_path, n: int, images=None, decoder=None, batch=8):
    path = str(tmp_path / "ids.tfrecord")
    records = []
    for i in range(n):
        feats = {"id": i}
        if images is not None:
            feats["image"] = images[i % len(images)]
        records.append(encode_example(feats))
    streamio.write_records(path, "tfrecord", records)
    decoder = decoder or Example({"id": FixedLen([], "int64")})
    return streamio.Dataset(path, "tfrecord", decoder=decoder).batch(batch)


# -- on a GPU ---------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_to_device_hides_80_percent_of_copy_time_behind_compute():
    result = measure_overlap(shape=(256, 3, 224, 224), batches=24, depth=2)
    print(result)
    assert result["hidden"] >= 0.8, result


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_dataloader_pin_memory_pins_every_batch_and_loses_none(tmp_path):
    ds = dataset_of_ids(tmp_path, 64)
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                                         pin_memory=True, multiprocessing_context=CONTEXT)
    ids = []
    for batch in loader:
        assert batch["id"].is_pinned()
        ids += batch["id"].tolist()
    assert sorted(ids) == list(range(64))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("depth", [1, 4])
def test_cuda_prefetcher_resumes_a_stateful_dataloader_exactly_once(tmp_path, depth):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = dataset_of_ids(tmp_path, 96)
    loader = sdl.StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                                    multiprocessing_context=CONTEXT)
    prefetcher = to_device(loader, "cuda", depth=depth)
    seen = []
    for batch in prefetcher:
        assert batch["id"].is_cuda
        seen += batch["id"].cpu().tolist()
        if len(seen) == 40:
            break
    state = prefetcher.state_dict()  # the loader itself is `depth` batches further on
    resumed = sdl.StatefulDataLoader(ds.to_torch(), batch_size=None, num_workers=2,
                                     multiprocessing_context=CONTEXT)
    resumed.load_state_dict(state)
    rest = [i for b in to_device(resumed, "cuda", depth=depth) for i in b["id"].cpu().tolist()]
    assert sorted(seen + rest) == list(range(96))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_decode_matches_the_cpu_path_within_tolerance():
    got = Image(resize=256, crop=224, device="cuda").decode_batch(JPEGS)["image"]
    assert got.is_cuda and got.dtype == torch.uint8 and tuple(got.shape) == (12, 224, 224, 3)
    d = diff(got, Image(resize=256, crop=224, dct_scaling=False).decode_batch(JPEGS)["image"])
    print(f"GPU vs CPU: mean |diff| {d.mean():.3f}, max {d.max()}")
    assert d.mean() <= GPU_MEAN_ABS_TOLERANCE and d.max() <= GPU_MAX_ABS_TOLERANCE


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("options", [dict(crop=RandomResizedCrop(96, seed=3)),
                                     dict(size=64, layout="CHW"), dict(size=64, channels=1)])
def test_gpu_decode_crops_layouts_and_grayscale_match_the_cpu_path(options):
    got = Image(device="cuda", **options).decode_batch(JPEGS)["image"]
    want = Image(dct_scaling=False, **options).decode_batch(JPEGS)["image"]
    assert got.is_cuda and tuple(got.shape) == want.shape
    d = diff(got, want)
    assert d.mean() <= GPU_MEAN_ABS_TOLERANCE and d.max() <= GPU_MAX_ABS_TOLERANCE


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_decode_corrupt_jpeg_raises_naming_its_record():
    decoder = Example({"image": Image(size=32, device="cuda"), "id": FixedLen([], "int64")})
    records = [encode_example({"image": img, "id": i}) for i, img in
               enumerate([JPEGS[0], JPEGS[1], corrupt(JPEGS[2]), JPEGS[3]])]
    with pytest.raises(DecodeError) as info:
        decoder.decode_batch(records, source="train.tfrecord", first_index=40)
    assert (info.value.source, info.value.record_index, info.value.field) == (
        "train.tfrecord", 42, "image")


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_decode_skips_corrupt_jpegs_with_their_labels():
    decoder = Example({"image": Image(size=32, device="cuda", on_error="skip"),
                       "id": FixedLen([], "int64")})
    images = [JPEGS[0], corrupt(JPEGS[1]), png(PHOTOS[2]), b"\xff\xd8junk", JPEGS[4]]
    batch = decoder.decode_batch([encode_example({"image": img, "id": i})
                                  for i, img in enumerate(images)])
    assert batch["id"].tolist() == [0, 2, 4]
    want = Image(size=32, dct_scaling=False).decode_batch([images[i] for i in (0, 2, 4)])["image"]
    d = diff(batch["image"], want)
    assert batch["image"].is_cuda and d.mean() <= GPU_MEAN_ABS_TOLERANCE


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_decode_through_a_dataloader_from_a_fifo_exactly_once(fifo, tmp_path):
    images = JPEGS[:6]
    records = [encode_example({"image": images[i % 6], "id": i}) for i in range(90)]
    src = tmp_path / "src.tfrecord"
    streamio.write_records(str(src), "tfrecord", records)
    path = fifo.make(src.read_bytes(), 4093, 65536)
    decoder = Example({"image": Image(size=64, device="cuda"), "id": FixedLen([], "int64")})
    ds = streamio.Dataset(path, "tfrecord", decoder=decoder).batch(16)
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=0)
    want = Image(size=64, dct_scaling=False).decode_batch(images)["image"]
    ids = []
    for batch in to_device(loader, "cuda"):
        assert batch["image"].is_cuda and batch["image"].shape[1:] == (64, 64, 3)
        for i, img in zip(batch["id"].cpu().tolist(), batch["image"]):
            assert diff(img, want[i % 6]).mean() <= GPU_MEAN_ABS_TOLERANCE
        ids += batch["id"].cpu().tolist()
    assert sorted(ids) == list(range(90))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_decode_in_a_dataloader_worker_is_a_usage_error(tmp_path):
    decoder = Example({"image": Image(size=32, device="cuda"), "id": FixedLen([], "int64")})
    ds = dataset_of_ids(tmp_path, 16, images=JPEGS[:2], decoder=decoder)
    loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=1,
                                         multiprocessing_context=CONTEXT)
    with pytest.raises(UsageError, match="num_workers=0"):
        list(loader)


def test_torch_path_reads_headers_with_pillow_when_simplejpeg_is_missing(monkeypatch):
    from streamio.decoders import image as image_module

    monkeypatch.setattr(image_module._Codecs.load(), "simplejpeg", None)
    values = [JPEGS[0], corrupt(JPEGS[1]), b"\xff\xd8junk", JPEGS[3]]
    got, keep = on_cpu(Image(size=48, on_error="skip"), values)
    assert keep.tolist() == [True, False, False, True]
    want = Image(size=48, dct_scaling=False).decode_batch([JPEGS[0], JPEGS[3]])["image"]
    assert diff(got, want).max() <= 2

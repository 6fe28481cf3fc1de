"""Resizing: streamio's C kernel gives Pillow's bytes exactly (every filter, channel count, box,
scale and SIMD level), decoding JPEGs gives the same images as before, and bad arguments are
usage errors, never a crash."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PIL = pytest.importorskip("PIL.Image")

import streamio  # noqa: E402
from streamio.decoders import _resample  # noqa: E402
from streamio.decoders._resample import FILTERS, resize, resize_pillow  # noqa: E402
from streamio.errors import UsageError, UsageTypeError  # noqa: E402

kernel = _resample._c_resample
needs_kernel = pytest.mark.skipif(kernel is None, reason="streamio._speedups is not built")
ISAS = (0, 1, 2)  # plain C, SSE4.1, AVX2 (each capped to what the CPU has)


def check_all_levels(pixels, size, resample, box):
    """Every SIMD level of the kernel, and resize(), equal Pillow's bytes."""
    expected = resize_pillow(pixels, size, resample, box)
    got = resize(pixels, size, resample, box)
    assert got.shape == expected.shape and np.array_equal(got, expected), (size, resample, box)
    if kernel is not None:
        for isa in ISAS:
            out = np.empty_like(expected)
            kernel(pixels, out, FILTERS[resample], *box, isa)
            assert np.array_equal(out, expected), (isa, pixels.shape, size, resample, box)


@st.composite
def resize_cases(draw):
    h = draw(st.integers(1, 48))
    w = draw(st.integers(1, 48))
    shape = draw(st.sampled_from([(h, w), (h, w, 1), (h, w, 3)]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
    else:  # hard edges: the sums reach past 0 and 255 (negative lobes), where clipping acts
        pixels = (rng.integers(0, 2, shape) * 255).astype(np.uint8)
    # fractional boxes inside the image: endpoints on a 1/8 grid or anywhere
    fractions = st.one_of(st.floats(0, 1), st.integers(0, 8).map(lambda k: k / 8))
    a, b = sorted([draw(fractions) * w, draw(fractions) * w])
    c, d = sorted([draw(fractions) * h, draw(fractions) * h])
    box = draw(st.sampled_from([(0.0, 0.0, float(w), float(h)), (a, c, b, d)]))
    size = (draw(st.integers(1, 64)), draw(st.integers(1, 64)))
    return pixels, size, draw(st.sampled_from(sorted(FILTERS))), box


@given(resize_cases())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_resize_equals_pillow(case):
    check_all_levels(*case)


@pytest.mark.parametrize("resample", sorted(FILTERS))
@pytest.mark.parametrize("shape,size,box", [
    ((375, 500, 3), (224, 224), (79.1015625, 23.4375, 407.2265625, 351.5625)),  # resize 256 crop 224
    ((500, 375, 3), (224, 224), (23.4375, 79.1015625, 351.5625, 407.2265625)),
    ((300, 40, 3), (30, 20), None),    # the height shrinks much more: Pillow runs vertical first
    ((1, 97, 3), (13, 5), None),       # 1 x N
    ((97, 1), (3, 40), None),          # N x 1
    ((33, 31, 3), (31, 33), (0.0, 0.0, 31.0, 33.0)),
    ((20, 20, 3), (7, 9), (20.0, 3.0, 20.0, 15.5)),  # an empty box at the right edge
    ((20, 20, 3), (7, 9), (5.5, 20.0, 9.0, 20.0)),   # and at the bottom
    ((2, 700, 3), (1, 1), None),       # very wide kernels
    ((3, 3, 3), (200, 150), (0.25, 0.5, 2.75, 2.5)),  # large upscaling
])
def test_fixed_cases(resample, shape, size, box):
    pixels = np.random.default_rng(7).integers(0, 256, shape, dtype=np.uint8)
    h, w = shape[:2]
    check_all_levels(pixels, size, resample, box if box is not None else (0.0, 0.0, w, h))


def test_integral_box_of_the_output_size_is_a_crop():
    pixels = np.random.default_rng(1).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    got = resize(pixels, (10, 12), "lanczos", (5, 6, 15, 18))
    assert np.array_equal(got, pixels[6:18, 5:15])


@needs_kernel
def test_out_writes_into_a_batch_row():
    pixels = np.random.default_rng(2).integers(0, 256, (50, 60, 3), dtype=np.uint8)
    batch = np.zeros((3, 20, 24, 3), np.uint8)
    returned = resize(pixels, (24, 20), "bilinear", (1.5, 2.25, 58.0, 49.5), out=batch[1])
    assert returned is batch[1] or np.shares_memory(returned, batch)
    assert np.array_equal(batch[1], resize_pillow(pixels, (24, 20), "bilinear",
                                                  (1.5, 2.25, 58.0, 49.5)))
    assert not batch[0].any() and not batch[2].any()


def _jpeg(shape, seed, quality=90):
    rng = np.random.default_rng(seed)
    # smooth content with some noise, as photos are (pure noise would be a poor JPEG)
    h, w = shape[:2]
    y, x = np.mgrid[0:h, 0:w]
    base = (np.sin(x / (3 + seed % 7)) + np.cos(y / (5 + seed % 3))) * 60 + 128
    channels = shape[2] if len(shape) == 3 else 1
    pixels = np.stack([base + rng.normal(0, 20, (h, w)) for _ in range(channels)], axis=-1)
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    image = PIL.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


@needs_kernel
@pytest.mark.parametrize("options", [
    dict(size=224),
    dict(resize=256, crop=224),
    dict(resize=256, crop=224, channels=1),
    dict(resize=(100, 150)),
    dict(size=64, resample="bicubic"),
    dict(size=96, resample="lanczos", dct_scaling=False),
    dict(crop=streamio.RandomResizedCrop(128, seed=3)),
])
def test_image_decode_unchanged(options, monkeypatch):
    """The images streamio.Image decodes are those of the Pillow path, byte for byte."""
    pytest.importorskip("simplejpeg")
    jpegs = [_jpeg(shape, i) for i, shape in enumerate(
        [(375, 500, 3), (500, 375, 3), (333, 333, 3), (240, 320), (1200, 900, 3), (97, 301, 3)])]
    fast = [streamio.Image(**options).decode(j) for j in jpegs]
    batch = streamio.Image(**options).decode_batch(jpegs)["image"]  # resized into its rows
    chw = streamio.Image(layout="CHW", **options).decode_batch(jpegs)["image"]
    monkeypatch.setattr(_resample, "_c_resample", None)  # the Pillow path, as without the build
    slow = [streamio.Image(**options).decode(j) for j in jpegs]
    for a, b, row, planes in zip(fast, slow, batch, chw):
        assert a.shape == b.shape and np.array_equal(a, b)
        assert np.array_equal(row, b) and np.array_equal(planes, b.transpose(2, 0, 1))


GOOD = np.zeros((10, 12, 3), np.uint8)


@pytest.mark.parametrize("call,error", [
    (lambda: resize(GOOD.astype(np.float32), (4, 4)), UsageTypeError),
    (lambda: resize(np.zeros((10, 12, 4), np.uint8), (4, 4)), UsageTypeError),
    (lambda: resize(np.zeros(10, np.uint8), (4, 4)), UsageTypeError),
    (lambda: resize(GOOD.tolist(), (4, 4)), UsageTypeError),
    (lambda: resize(GOOD, (0, 4)), UsageError),
    (lambda: resize(GOOD, (4.0, 4)), UsageTypeError),
    (lambda: resize(GOOD, (4, 4), "nearest"), UsageError),
    (lambda: resize(GOOD, (4, 4), box=(-0.5, 0, 4, 4)), UsageError),
    (lambda: resize(GOOD, (4, 4), box=(0, 0, 12.5, 4)), UsageError),
    (lambda: resize(GOOD, (4, 4), box=(0, 0, 4, 10.01)), UsageError),
    (lambda: resize(GOOD, (4, 4), box=(5, 0, 4, 4)), UsageError),
    (lambda: resize(GOOD, (4, 4), box=(0, float("nan"), 4, 4)), UsageError),
    (lambda: resize(GOOD, (4, 4), box=(0, 0, 4)), UsageTypeError),
    (lambda: resize(GOOD, (4, 4), box=("a", 0, 4, 4)), UsageTypeError),
    (lambda: resize(GOOD, (4, 4), out=np.zeros((4, 4, 1), np.uint8)), UsageTypeError),
    (lambda: resize(GOOD, (4, 4), out=np.zeros((4, 4, 3), np.int16)), UsageTypeError),
    (lambda: resize(GOOD, (4, 4), out=np.zeros((4, 8, 3), np.uint8)[:, ::2]), UsageError),
    (lambda: resize(GOOD, (4, 4), out=GOOD[:4, :4]), UsageError),
])
def test_bad_arguments_are_usage_errors(call, error):
    with pytest.raises(error):
        call()


@needs_kernel
@pytest.mark.parametrize("args,error", [
    ((GOOD, np.zeros((4, 4, 3), np.uint8), 0, 0, 0, 12, 10), ValueError),  # nearest: not ours
    ((GOOD, np.zeros((4, 4, 3), np.uint8), 2, 0, 0, 13, 10), ValueError),
    ((GOOD, np.zeros((4, 4, 3), np.uint8), 2, 0, 0, float("inf"), 10), ValueError),
    ((GOOD, np.zeros((4, 4, 3), np.uint8), 2, float("nan"), 0, 12, 10), ValueError),
    ((GOOD, np.zeros((4, 4, 3), np.uint8), 2, 3, 0, 2, 10), ValueError),
    ((GOOD, np.zeros((0, 4, 3), np.uint8), 2, 0, 0, 12, 10), ValueError),
    ((GOOD, GOOD, 2, 0, 0, 6, 10), ValueError),  # out overlaps src
    ((GOOD, np.zeros((4, 4), np.uint8), 2, 0, 0, 12, 10), TypeError),
    ((GOOD[:, ::2], np.zeros((4, 4, 3), np.uint8), 2, 0, 0, 6, 10), ValueError),
    ((GOOD, np.zeros((4, 4, 3), np.uint8)[::-1], 2, 0, 0, 12, 10), ValueError),
    ((GOOD, bytes(48), 2, 0, 0, 12, 10), (TypeError, BufferError)),
    ((GOOD.astype(np.int32), np.zeros((4, 4, 3), np.int32), 2, 0, 0, 12, 10), TypeError),
])
def test_kernel_refuses_bad_arguments(args, error):
    """The kernel checks what it is given (the fuzz target and any direct caller rely on it)."""
    with pytest.raises(error):
        kernel(*args)

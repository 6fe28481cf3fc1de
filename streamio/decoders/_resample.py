"""Resizing 8-bit images exactly as Pillow does: ``Image.fromarray(a).resize((w, h), filter,
box=box)``, without the round trip through a Pillow image.

:func:`resize` runs the C kernel ``streamio._speedups.resample`` (streamio/_c/resample.c: the
same coefficients, fixed-point arithmetic, pass order and rounding as Pillow's
``libImaging/Resample.c``, with SSE4.1/AVX2 multiply-accumulates) when the extension is built,
and :func:`resize_pillow`, the reference the tests and the fuzz target hold the kernel to,
otherwise. Both give the same bytes for every input; ``tests/kernels/test_kernel_resample.py`` checks it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..errors import UsageError, UsageTypeError, require

try:  # the C kernel (streamio/_c/resample.c)
    from .._speedups import resample as _c_resample  # type: ignore
except ImportError:  # pragma: no cover - depends on the build
    _c_resample = None

__all__ = ["FILTERS", "has_kernel", "resize", "resize_pillow"]

# Pillow's Resampling codes (PIL.Image.Resampling), which the kernel takes. "nearest" is not
# here: Pillow does it with an affine transform, not a convolution; it stays on Pillow.
FILTERS = {"lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}

Box = Tuple[float, float, float, float]


def has_kernel(resample: str) -> bool:
    """Whether the C kernel is built and does ``resample``."""
    return _c_resample is not None and resample in FILTERS


def _check(pixels: Any, size: Tuple[int, int], resample: str, box: Optional[Sequence[float]],
           out: Optional[np.ndarray]) -> Tuple[np.ndarray, Tuple[int, ...], Box]:
    """The arguments, checked: ``(pixels, output shape, box)``; UsageError/UsageTypeError."""
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8:
        raise UsageTypeError(f"pixels must be a uint8 numpy array, not {_describe(pixels)}")
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3)):
        raise UsageTypeError(f"pixels must have shape (H, W), (H, W, 1) or (H, W, 3), not"
                             f" {pixels.shape}")
    if resample not in FILTERS:
        raise UsageError(f"resample must be one of {tuple(FILTERS)}, not {resample!r}")
    if (not isinstance(size, (tuple, list)) or len(size) != 2
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in size)):
        raise UsageTypeError(f"size must be a (width, height) pair of ints, not {size!r}")
    width, height = int(size[0]), int(size[1])
    if width < 1 or height < 1:
        raise UsageError(f"size must be positive, not {size!r}")
    h, w = pixels.shape[:2]
    if box is None:
        box = (0.0, 0.0, float(w), float(h))
    try:
        x0, y0, x1, y1 = (float(v) for v in box)
    except (TypeError, ValueError):
        raise UsageTypeError(f"box must be 4 numbers (x0, y0, x1, y1), not {box!r}") from None
    # Pillow checks the box as C floats: so do we (a hair past the edge in double can be inside).
    f0, g0, f1, g1 = (float(np.float32(v)) for v in (x0, y0, x1, y1))
    if any(v != v for v in (f0, g0, f1, g1)):
        raise UsageError(f"box must not contain NaN: {box!r}")
    if f0 < 0 or g0 < 0 or f1 > w or g1 > h or f1 < f0 or g1 < g0:
        raise UsageError(f"box {box!r} must lie inside the {w}x{h} image with x0 <= x1, y0 <= y1")
    shape = (height, width) + pixels.shape[2:]
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != shape:
            raise UsageTypeError(f"out must be a uint8 array of shape {shape}, not"
                                 f" {_describe(out)}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise UsageError("out must be C-contiguous and writable")
        if np.may_share_memory(out, pixels):  # (address ranges only: cheap)
            raise UsageError("out must not overlap pixels")
    return pixels, shape, (x0, y0, x1, y1)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype} {value.shape}"
    return type(value).__name__


def resize(pixels: np.ndarray, size: Tuple[int, int], resample: str = "bilinear",
           box: Optional[Sequence[float]] = None, *, out: Optional[np.ndarray] = None
           ) -> np.ndarray:
    """``pixels`` (uint8 ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)``) resampled from ``box``
    (``(x0, y0, x1, y1)`` in source pixels, fractional allowed; the whole image by default) to
    ``size = (width, height)``: the bytes of Pillow's ``Image.resize(size, filter, box=box)``.
    ``out``: a C-contiguous uint8 array of the output's shape to write into (returned)."""
    pixels, shape, box = _check(pixels, size, resample, box, out)
    if _c_resample is None:
        result = resize_pillow(pixels, size, resample, box)
        if out is None:
            return result
        out[...] = result
        return out
    if not pixels.flags.c_contiguous:
        pixels = np.ascontiguousarray(pixels)
    if out is None:
        out = np.empty(shape, np.uint8)
    _c_resample(pixels, out, FILTERS[resample], *box)
    return out


def resize_pillow(pixels: np.ndarray, size: Tuple[int, int], resample: str = "bilinear",
                  box: Optional[Sequence[float]] = None) -> np.ndarray:
    """The reference: Pillow's own resize (a new writable array of the same dimensions)."""
    pil = require("PIL.Image", "image")
    image = pil.fromarray(pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1
                          else pixels)
    h, w = pixels.shape[:2]
    result = np.array(image.resize(tuple(size), getattr(pil.Resampling, resample.upper()),
                                   box=tuple(box) if box is not None else (0, 0, w, h)))
    return result.reshape((size[1], size[0]) + pixels.shape[2:])

"""GPU JPEG decoding for :class:`~streamio.Image`: ``Image(size=224, device="cuda")``.

A column of encoded images (one batch) is decoded in one call: the JPEGs go together to nvJPEG
through ``torchvision.io.decode_jpeg(list_of_tensors, device="cuda")``, then images of the same
decoded size are resized together (``torch.nn.functional.interpolate``, antialiased as Pillow
and torchvision's ``Resize`` are) and centre-cropped on the GPU, and the batch is one CUDA
``uint8`` tensor ``(B, H, W, C)`` (``(B, C, H, W)`` with ``layout="CHW"``).

What stays on the CPU: reading each JPEG's header (size and colour space, so that ``max_pixels``
refuses an image before the GPU allocates it, and so that a :class:`RandomResizedCrop` draws its
crop exactly as on the CPU), and images nvJPEG is not given: PNG and other formats, CMYK JPEGs.
Those take the CPU path (:meth:`Image._decode`) and are copied into the batch.

Differences from the CPU path, which the tests bound (``tests/decoders/test_image_gpu.py``):

* nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's (simplejpeg, Pillow): pixels
  differ by a level or two, more at sharp colour edges of 4:2:0 JPEGs;
* the resize is torch's antialiased bilinear/bicubic over the whole image then a crop (what
  torchvision's ``Resize`` + ``CenterCrop`` do), where the CPU path resamples only the crop's
  box with Pillow's filter in fixed point: the same filter, other rounding;
* there is no DCT-domain downscaling (``dct_scaling``): nvJPEG always decodes the full image.

``GPU_MEAN_ABS_TOLERANCE`` and ``GPU_MAX_ABS_TOLERANCE`` are the bounds, against the CPU path
with ``dct_scaling=False``, that the tests hold the GPU path to; docs/images.md says where they come
from.

Where it runs: in the process that iterates the dataset. A DataLoader worker process cannot use
CUDA (it is forked from a process that may have), so GPU decode there is a :class:`UsageError`:
use ``DataLoader(num_workers=0)`` (reading a FIFO is one thread's work; decoding is the GPU's).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import MissingDependencyError, UsageError

#: Resampling filters torch's ``interpolate`` has (with antialiasing, as Pillow's).
GPU_RESAMPLE = ("bilinear", "bicubic", "nearest")

#: The GPU path's distance from the CPU path (``dct_scaling=False``), in uint8 levels: the mean
#: absolute difference over a batch, and the largest at any one pixel. Measured in docs/images.md
#: "GPU JPEG decode"; the tests hold both paths to these.
GPU_MEAN_ABS_TOLERANCE = 3.0
GPU_MAX_ABS_TOLERANCE = 64

#: ``decode_jpegs(datas, channels, device) -> list of (C, H, W) uint8 tensors``: raises on
#: a bad image anywhere in ``datas``.
DecodeJpegs = Callable[[List[Any], int, Any], List[Any]]


def check_device(image: Any, device: Any) -> str:
    """Validate ``Image(device=...)`` at construction; the device as a string ("cuda:0")."""
    if not isinstance(device, str):
        raise UsageError(f"device must be 'cuda' or 'cuda:N', not {device!r}")
    torch = _torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"not a torch device: {device!r} ({exc})") from None
    if dev.type != "cuda":
        raise UsageError(f"device={device!r}: Image decodes on the CPU without device=; device"
                         " is for GPU decoding, 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise UsageError(f"Image(device={device!r}) decodes with nvJPEG on a CUDA GPU, and"
                         " torch.cuda.is_available() is False here; leave device out to decode"
                         " on the CPU")
    _torchvision_io()
    check_geometry(image)
    index = torch.cuda.current_device() if dev.index is None else dev.index
    return f"cuda:{index}"


def check_geometry(image: Any) -> None:
    """What the torch path needs of the options: a fixed output size and a torch filter."""
    if image.shape is None:
        raise UsageError("GPU decoding makes one tensor per batch: give a fixed output size"
                         " (size=, crop=, resize=(h, w) or a RandomResizedCrop)")
    if image.resample not in GPU_RESAMPLE:
        raise UsageError(f"resample={image.resample!r} has no GPU version; use one of"
                         f" {GPU_RESAMPLE}")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("torch", "torch") from exc
    return torch


def _torchvision_io() -> Any:
    try:
        import torchvision.io
    except ImportError as exc:
        raise MissingDependencyError(message="Image(device='cuda') decodes with torchvision:"
                                     " pip install the torchvision that matches your torch"
                                     " (torchvision 0.28 for torch 2.13)") from exc
    return torchvision.io


def nvjpeg_decode(datas: List[Any], channels: int, device: Any) -> List[Any]:
    """torchvision's batched decode on ``device`` (nvJPEG on CUDA)."""
    tvio = _torchvision_io()
    mode = tvio.ImageReadMode.RGB if channels == 3 else tvio.ImageReadMode.GRAY
    return tvio.decode_jpeg(datas, mode=mode, device=device)


def _jpeg_header(codecs: Any, data: bytes) -> Optional[Tuple[int, int]]:
    """``(width, height)`` of a JPEG the GPU can take, None for anything else (the CPU path
    decodes it); raises _BadImage for a JPEG whose header does not read."""
    from .image import _JPEG_MAGIC, _BadImage

    if data[:2] != _JPEG_MAGIC:
        return None
    if codecs.simplejpeg is not None:
        try:
            height, width, colorspace, _ = codecs.simplejpeg.decode_jpeg_header(data)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise _BadImage(str(exc) or type(exc).__name__) from None
        return (width, height) if colorspace in ("RGB", "YCbCr", "Gray") else None
    parser = codecs.parser()  # Pillow's incremental parser: it reads the header first
    try:
        parser.feed(data)
    except (OSError, ValueError, SyntaxError) as exc:
        raise _BadImage(str(exc) or type(exc).__name__) from None
    im = parser.image
    if im is None:
        raise _BadImage("no JPEG header")
    return im.size if im.mode in ("RGB", "L") else None


def decode_column(image: Any, values: Sequence[Any], device: Any, *,
                  source: Optional[str] = None, first_index: int = 0,
                  field: Optional[str] = None, indices: Optional[Sequence[int]] = None,
                  decode_jpegs: DecodeJpegs = nvjpeg_decode) -> Tuple[Any, Optional[np.ndarray]]:
    """:meth:`Image.decode_column` on a torch device: ``(uint8 tensor, keep)``.

    ``decode_jpegs`` is the JPEG decoder (torchvision's, by default); the tests give a CPU one
    to run every other step of this function on machines without a GPU.
    """
    from .image import _BadImage, _Codecs

    torch = _torch()
    if str(device).startswith("cuda") and torch.utils.data.get_worker_info() is not None:
        raise UsageError("Image(device='cuda') decodes in the process that trains: a DataLoader"
                         " worker cannot use CUDA. Use DataLoader(num_workers=0)")
    codecs = _Codecs.load()
    n = len(values)
    keep = np.ones(n, bool)
    jpegs: Dict[int, Tuple[bytes, Tuple[int, int]]] = {}  # row -> (bytes, (width, height))
    on_cpu: Dict[int, np.ndarray] = {}  # row -> HWC array, decoded by the CPU path

    def reject(row: int, exc: _BadImage) -> None:
        image._reject(exc, source, first_index + int(row if indices is None else indices[row]),
                      field)
        keep[row] = False

    for row, value in enumerate(values):
        data = bytes(value)
        try:
            size = _jpeg_header(codecs, data)
            if size is None:
                array = image._decode(data)
                on_cpu[row] = array if image.layout == "HWC" else array.transpose(1, 2, 0)
            else:
                image._check_pixels(*size)
                jpegs[row] = (data, size)
        except _BadImage as exc:
            reject(row, exc)
    decoded = _decode_all(image, jpegs, device, decode_jpegs, reject)
    height, width = image.shape[:2] if image.layout == "HWC" else image.shape[1:]
    out = torch.zeros((n, image.channels, height, width), dtype=torch.uint8, device=device)
    for rows, batch in _geometry(image, decoded, jpegs, torch):
        out[rows] = batch
    for row, array in on_cpu.items():
        out[row] = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1))).to(device)
    if not keep.all():
        out = out[torch.from_numpy(keep).to(device)]
    if image.layout == "HWC":
        out = out.permute(0, 2, 3, 1).contiguous()
    return out, (None if keep.all() else keep)


def _decode_all(image: Any, jpegs: Dict[int, Tuple[bytes, Tuple[int, int]]], device: Any,
                decode_jpegs: DecodeJpegs, reject: Callable[[int, Any], None]) -> Dict[int, Any]:
    """Row -> decoded ``(C, H, W)`` tensor: all in one call; if that fails, one by one, so that
    only the bad images are rejected."""
    from .image import _BadImage

    torch = _torch()
    if not jpegs:
        return {}
    rows = list(jpegs)
    tensors = [torch.frombuffer(bytearray(jpegs[r][0]), dtype=torch.uint8) for r in rows]
    try:
        return _checked(dict(zip(rows, decode_jpegs(tensors, image.channels, device))), jpegs)
    except (RuntimeError, ValueError) as exc:
        first_error = exc
    decoded = {}
    for row, tensor in zip(rows, tensors):
        try:
            decoded.update(_checked({row: decode_jpegs([tensor], image.channels, device)[0]},
                                    jpegs))
        except (RuntimeError, ValueError) as exc:
            reject(row, _BadImage(f"{str(exc).strip() or type(exc).__name__}"
                                  f" (GPU decode of the batch: {type(first_error).__name__})"))
    return decoded


def _checked(decoded: Dict[int, Any], jpegs: Dict[int, Tuple[bytes, Tuple[int, int]]]
             ) -> Dict[int, Any]:
    """The decoder's images, each the size its header said (else a RuntimeError, as the
    decoder's own)."""
    for row, tensor in decoded.items():
        width, height = jpegs[row][1]
        if tuple(tensor.shape[1:]) != (height, width):
            raise RuntimeError(f"decoded {tuple(tensor.shape[1:])}, header says"
                               f" {(height, width)}")
    return decoded


def _geometry(image: Any, decoded: Dict[int, Any],
              jpegs: Dict[int, Tuple[bytes, Tuple[int, int]]], torch: Any):
    """``(rows, (k, C, H, W) uint8 tensor)`` for the decoded images, resized and cropped: images
    of one size together (one interpolate call per size), a RandomResizedCrop image by image."""
    from .image import RandomResizedCrop

    if isinstance(image.crop, RandomResizedCrop):
        size = image.crop.size
        for row, pixels in decoded.items():
            data, (width, height) = jpegs[row]
            box, flip = image.crop.params(width, height, _crc32c(data))
            left, top, right, bottom = box
            result = _resize(pixels[None, :, top:bottom, left:right], size, image.resample, torch)
            yield [row], result.flip(-1) if flip else result
        return
    groups: Dict[Tuple[int, int], List[int]] = {}
    for row in decoded:
        groups.setdefault(jpegs[row][1], []).append(row)
    for (width, height), rows in groups.items():
        pixels = torch.stack([decoded[r] for r in rows])
        if image.resize is not None:
            rw, rh = image._resized(width, height)
            pixels = _resize(pixels, (rh, rw), image.resample, torch)
            if image.crop is not None:
                top, left = image._crop_offsets(rw, rh)
                ch, cw = image.crop
                pixels = pixels[:, :, top:top + ch, left:left + cw]
            yield rows, pixels
            continue
        # No resize: a centre crop is a slice, zero-padded where the image is smaller (_plan).
        box, out, pad, _ = image._plan(width, height, b"")
        x0, y0, x1, y1 = (int(v) for v in box)
        pixels = pixels[:, :, y0:y1, x0:x1]
        if pad is not None:
            canvas = torch.zeros((len(rows), image.channels) + tuple(image.crop),
                                 dtype=torch.uint8, device=pixels.device)
            canvas[:, :, pad[0]:pad[0] + out[1], pad[1]:pad[1] + out[0]] = pixels
            pixels = canvas
        yield rows, pixels


def _crc32c(data: bytes) -> int:
    from .image import _Codecs

    return _Codecs.load().crc32c(data)


def _resize(pixels: Any, size: Tuple[int, int], resample: str, torch: Any) -> Any:
    """``(k, C, h, w)`` uint8 to ``(k, C, *size)``: torch's antialiased filter in float32,
    rounded to the nearest level (as Pillow rounds its fixed point)."""
    if tuple(pixels.shape[-2:]) == tuple(size):
        return pixels
    import torch.nn.functional as F

    scaled = F.interpolate(pixels.float(), size=tuple(size), mode=resample,
                           **({} if resample == "nearest" else
                              {"antialias": True, "align_corners": False}))
    return scaled.round_().clamp_(0, 255).to(torch.uint8)

"""Encoded images (JPEG, PNG, ...) into uint8 arrays: the ``Image`` feature and MXNet's im2rec.

* :class:`Image` decodes one bytes feature per record (``Example({"image/encoded": Image(size=224),
  ...})``) or, used as a decoder itself, records that *are* encoded images.
* :class:`ImageRecord` decodes MXNet image RecordIO (``im2rec``) payloads (layout there).
* :class:`RandomResizedCrop`: the usual training crop + horizontal flip, reproducible.

Decoding: JPEG goes to `simplejpeg <https://pypi.org/project/simplejpeg/>`_ (libjpeg-turbo; the
whole decode runs without the GIL, and it scales in the DCT domain by n/8 when the output is at
most half the source, the fast path of a resize) when it is installed; PNG and every other format,
and JPEGs simplejpeg cannot convert (CMYK), go to Pillow, whose incremental ``ImageFile.Parser``
takes bytes, not a file. Resizing and cropping are one Pillow ``resize`` over the crop's source
box (one resampling pass over only the pixels that are kept); for simplejpeg's arrays that is
streamio's C kernel (``streamio/decoders/_resample.py``), which gives Pillow's bytes exactly.
Both libraries come with ``pip install 'streamio[image]'``; more in docs/images.md.

Shapes: with a fixed output size (``size=224``; ``resize=256, crop=224``; ``resize=(h, w)``;
a :class:`RandomResizedCrop`) a batch is one ``(B, H, W, C)`` uint8 array (``(B, C, H, W)`` with
``layout="CHW"``). Without one, images keep their own sizes and a batch is a 1-D object array
of ``(H, W, C)`` arrays.

Bad images: a record that does not decode is a :class:`~streamio.DecodeError` naming the source,
record and field. The reader's ``on_error`` covers framing only and does not reach decoders, so
image decoders take their own ``on_error``: ``"skip"`` (or ``"warn"``) drops the record, all of
its fields, from the batch, which is then shorter.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DecodeError, UsageError, UsageTypeError, require
from . import _resample
from .skips import drop_record
from .spec import FieldSpec

__all__ = ["Image", "ImageRecord", "RandomResizedCrop", "encode_image_record"]

Layout = Literal["HWC", "CHW"]
OnError = Literal["raise", "skip", "warn"]
_ON_ERROR = ("raise", "skip", "warn")
_RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")

# What a map process decoding images imports lazily: a forkserver imports these once for all of
# its children (see streamio.pipeline.parallel._preload); a missing one is skipped there.
_FORKSERVER_PRELOAD = ("PIL.Image", "PIL.ImageFile", "simplejpeg", "crc32c")

# MXNet recordio.IRHeader: struct "IfQQ" (flag, label, id, id2), 24 bytes.
_IR_HEADER = struct.Struct("<IfQQ")
IR_HEADER_SIZE = _IR_HEADER.size

_JPEG_MAGIC = b"\xff\xd8"

# Images larger than this are refused before their pixels are allocated: a 20-byte header can
# claim 65535 x 65535 pixels (12 GiB). Pillow's own decompression-bomb limit, whose default this is.
DEFAULT_MAX_PIXELS = 89_478_485

Size2 = Tuple[int, int]


def _pair(name: str, value: Any, *, allow_none: bool = True) -> Optional[Size2]:
    """``value`` as ``(height, width)``: an int means a square (or, for resize, the short side)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        pair = (int(value), int(value))
    elif (isinstance(value, (tuple, list)) and len(value) == 2
          and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)):
        pair = (int(value[0]), int(value[1]))
    else:
        raise UsageTypeError(f"{name} must be an int or a (height, width) pair of ints, not {value!r}")
    if min(pair) < 1:
        raise UsageError(f"{name} must be positive, not {value!r}")
    return pair


class RandomResizedCrop:
    """A random crop of random area and aspect ratio, resized to ``size``, and a random horizontal
    flip: ``torchvision.transforms.RandomResizedCrop(size, scale, ratio)`` followed by
    ``RandomHorizontalFlip()`` (same sampling: 10 tries, then a centre crop).

    Reproducible without shared state: each image's draws come from ``(seed, epoch, CRC-32C of
    its encoded bytes)``, so they do not depend on which thread, process or DataLoader worker
    decodes it, nor on batching. Call :meth:`set_epoch` before each epoch (as with
    ``DistributedSampler``) so that epochs differ; a copy already sent to a worker process keeps
    the epoch it was sent with. Identical encoded images get identical crops within an epoch.
    """

    def __init__(self, size: Union[int, Size2], *, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3), flip: bool = True,
                 seed: int = 0) -> None:
        self.size: Size2 = _pair("size", size, allow_none=False)  # type: ignore[assignment]
        scale = tuple(float(s) for s in scale)
        ratio = tuple(float(r) for r in ratio)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise UsageError(f"scale must be (low, high) with 0 < low <= high, not {scale!r}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise UsageError(f"ratio must be (low, high) with 0 < low <= high, not {ratio!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise UsageError(f"seed must be an int >= 0, not {seed!r}")
        self.scale = scale
        self.ratio = ratio
        self.flip = bool(flip)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw this epoch's crops (epoch 0 until called)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise UsageError(f"epoch must be an int >= 0, not {epoch!r}")
        self.epoch = int(epoch)

    def __repr__(self) -> str:
        return (f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio},"
                f" flip={self.flip}, seed={self.seed})")

    def params(self, width: int, height: int, key: int) -> Tuple[Tuple[int, int, int, int], bool]:
        """``((left, top, right, bottom), flip)`` for an image of ``width x height`` whose
        encoded bytes have CRC-32C ``key``."""
        # 10 tries x (area, log-ratio, top, left) + the flip: 41 uniform draws, all fixed by
        # (seed, epoch, key) through SeedSequence's hash, no generator state carried over.
        words = np.random.SeedSequence([self.seed, self.epoch, key]).generate_state(41, np.uint64)
        u = (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        area = width * height
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for t in range(10):
            target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[4 * t])
            aspect = math.exp(lo + (hi - lo) * u[4 * t + 1])
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(u[4 * t + 2] * (height - h + 1))
                left = int(u[4 * t + 3] * (width - w + 1))
                break
        else:  # as torchvision: a centre crop clamped to the ratio range
            in_ratio = width / height
            if in_ratio < self.ratio[0]:
                w, h = width, int(round(width / self.ratio[0]))
            elif in_ratio > self.ratio[1]:
                w, h = int(round(height * self.ratio[1])), height
            else:
                w, h = width, height
            top, left = (height - h) // 2, (width - w) // 2
        flip = self.flip and u[40] < 0.5
        return (left, top, left + w, top + h), flip

    def __reduce__(self):
        return (_rebuild_crop, (self.size, self.scale, self.ratio, self.flip, self.seed, self.epoch))


def _rebuild_crop(size, scale, ratio, flip, seed, epoch) -> RandomResizedCrop:
    crop = RandomResizedCrop(size, scale=scale, ratio=ratio, flip=flip, seed=seed)
    crop.epoch = epoch
    return crop


class _Codecs:
    """The imported libraries, found once per process (not pickled with the decoders)."""

    pil: Any = None
    parser: Any = None
    simplejpeg: Any = None
    crc32c: Any = None
    searched = False

    @classmethod
    def load(cls) -> "type[_Codecs]":
        if not cls.searched:
            pil = require("PIL.Image", "image")
            cls.parser = require("PIL.ImageFile", "image").Parser
            try:
                import simplejpeg  # optional: Pillow decodes JPEG too, a little slower
            except ImportError:  # pragma: no cover - depends on the environment
                simplejpeg = None
            import crc32c

            cls.pil, cls.simplejpeg, cls.crc32c = pil, simplejpeg, crc32c.crc32c
            cls.searched = True
        return cls


class _BadImage(Exception):
    """Why one image did not decode (turned into a DecodeError naming the record by the caller)."""


class Image:
    """Encoded image bytes (JPEG, PNG, or any format Pillow reads) to a uint8 array.

    Options (keyword-only):

    - ``size``: shorthand for ``resize=size, crop=size`` (resize the short side, centre-crop
      a square; torchvision's ``Resize(size)`` + ``CenterCrop(size)``);
    - ``resize``: an int resizes the short side to it, keeping the aspect ratio (as
      ``torchvision.transforms.Resize(int)``); ``(height, width)`` resizes to exactly that;
    - ``crop``: ``int`` or ``(height, width)`` centre crop (after ``resize``; without one, of
      the decoded image, zero-padded where it is smaller, as ``CenterCrop``), or a
      :class:`RandomResizedCrop` for training (then without ``resize``);
    - ``channels``: 3 (RGB) or 1 (grayscale); the channel axis is always there;
    - ``layout``: ``"HWC"`` (default) or ``"CHW"``;
    - ``resample``: Pillow's filter for resizing, ``"bilinear"`` by default (torchvision's);
    - ``dct_scaling``: let JPEG decoding shrink by 1/2, 1/4 or 1/8 in the DCT domain when the
      output needs at most that many pixels (PIL's ``draft``; much faster on large photos, and
      close to, not equal to, a full decode then resize); ``False`` always decodes at full size;
    - ``on_error``: ``"raise"`` (a :class:`~streamio.DecodeError` naming the record),
      ``"skip"`` or ``"warn"`` (drop the record from its batch);
    - ``max_pixels``: larger images are bad records, refused before decoding;
    - ``device``: ``"cuda"`` (or ``"cuda:N"``) decodes each batch's JPEGs at once on the GPU
      (nvJPEG, through ``torchvision.io.decode_jpeg``), resizes and crops there, and gives a
      CUDA ``torch.uint8`` tensor instead of a numpy array (see ``streamio/decoders/_torch_image.py``
      for what it needs and how close it is to the CPU path).

    Resize + crop is one resampling pass over the crop's region of the source, equal to
    resizing the whole image and then cropping up to rounding at the crop's edges.
    As a decoder of its own, ``decode_batch(records)`` treats each record as one encoded image
    and returns ``{"image": ...}``.
    """

    def __init__(self, *, size: Union[int, Size2, None] = None,
                 resize: Union[int, Size2, None] = None,
                 crop: Union[int, Size2, RandomResizedCrop, None] = None,
                 channels: int = 3, layout: Layout = "HWC", resample: str = "bilinear",
                 dct_scaling: bool = True, on_error: OnError = "raise",
                 max_pixels: int = DEFAULT_MAX_PIXELS, device: Optional[str] = None) -> None:
        if size is not None:
            if resize is not None or crop is not None:
                raise UsageError("size=N means resize=N, crop=N: give size or resize/crop, not both")
            resize = crop = size
        self._resize_short = isinstance(resize, (int, np.integer))
        self.resize = _pair("resize", resize)
        if isinstance(crop, RandomResizedCrop):
            if resize is not None:
                raise UsageError("a RandomResizedCrop picks its own scale: give no resize with it")
            self.crop: Union[Size2, RandomResizedCrop, None] = crop
        else:
            self.crop = _pair("crop", crop)
            if self.crop is not None and self.resize is not None:
                short = min(self.resize)
                fits = (min(self.crop) <= short if self._resize_short
                        else self.crop[0] <= self.resize[0] and self.crop[1] <= self.resize[1])
                if not fits:
                    raise UsageError(f"crop {self.crop} is larger than the resized image"
                                     f" (resize={resize!r})")
        if channels not in (1, 3):
            raise UsageError(f"channels must be 1 (grayscale) or 3 (RGB), not {channels!r}")
        if layout not in ("HWC", "CHW"):
            raise UsageError(f"layout must be 'HWC' or 'CHW', not {layout!r}")
        if resample not in _RESAMPLE:
            raise UsageError(f"resample must be one of {_RESAMPLE}, not {resample!r}")
        if on_error not in _ON_ERROR:
            raise UsageError(f"on_error must be one of {_ON_ERROR}, not {on_error!r}")
        self.channels = channels
        self.layout = layout
        self.resample = resample
        self.dct_scaling = bool(dct_scaling)
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)) or max_pixels < 1:
            raise UsageError(f"max_pixels must be a positive int, not {max_pixels!r}")
        self.on_error = on_error
        self.max_pixels = int(max_pixels)
        self.device = None
        if device is not None:
            from . import _torch_image

            self.device = _torch_image.check_device(self, device)

    # -- description ----------------------------------------------------------------------------
    @property
    def shape(self) -> Optional[Tuple[int, int, int]]:
        """The shape of every decoded image, or None when images keep their own sizes."""
        if isinstance(self.crop, RandomResizedCrop):
            h, w = self.crop.size
        elif self.crop is not None:
            h, w = self.crop
        elif self.resize is not None and not self._resize_short:
            h, w = self.resize
        else:
            return None
        return (self.channels, h, w) if self.layout == "CHW" else (h, w, self.channels)

    def field_spec(self) -> FieldSpec:
        shape = self.shape
        if shape is None:
            return FieldSpec("object", np.dtype(object), ())
        return FieldSpec("dense", np.uint8, shape)

    def output_spec(self) -> Dict[str, FieldSpec]:
        return {"image": self.field_spec()}

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch to a :class:`RandomResizedCrop` (nothing to do otherwise)."""
        if isinstance(self.crop, RandomResizedCrop):
            self.crop.set_epoch(epoch)

    def fresh(self) -> "Image":
        return self

    def reset(self) -> None:
        """Nothing to forget: image decoding keeps no state between batches."""

    def __repr__(self) -> str:
        resize = self.resize[0] if self._resize_short and self.resize else self.resize
        opts = [f"{k}={v!r}" for k, v in (("resize", resize), ("crop", self.crop)) if v is not None]
        opts += [f"channels={self.channels}", f"layout={self.layout!r}"]
        if self.on_error != "raise":
            opts.append(f"on_error={self.on_error!r}")
        if self.device is not None:
            opts.append(f"device={self.device!r}")
        return f"Image({', '.join(opts)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and repr(self) == repr(other)

    __hash__ = None  # type: ignore[assignment]

    # -- geometry -------------------------------------------------------------------------------
    def _plan(self, width: int, height: int, data: Any
              ) -> Tuple[Tuple[float, float, float, float], Size2, Optional[Size2], bool]:
        """``(source box, (out_w, out_h), pad, flip)`` for a ``width x height`` image.

        ``pad`` is ``(top, left)`` for a plain centre crop larger than the image (the box is then
        the whole image and the result is placed at that offset in a zero canvas), else None.
        """
        crop = self.crop
        if isinstance(crop, RandomResizedCrop):
            box, flip = crop.params(width, height, _Codecs.crc32c(data))
            return box, (crop.size[1], crop.size[0]), None, flip
        rw, rh = self._resized(width, height)
        if crop is None:
            return (0.0, 0.0, float(width), float(height)), (rw, rh), None, False
        ch, cw = crop
        if self.resize is None and (ch > height or cw > width):
            # CenterCrop pads a smaller image with zeros: crop what there is, pad the rest.
            top = (ch - height) // 2 if ch > height else -int(round((height - ch) / 2.0))
            left = (cw - width) // 2 if cw > width else -int(round((width - cw) / 2.0))
            y0, x0 = max(0, -top), max(0, -left)
            y1, x1 = min(height, y0 + ch), min(width, x0 + cw)
            return ((float(x0), float(y0), float(x1), float(y1)), (x1 - x0, y1 - y0),
                    (max(0, top), max(0, left)), False)
        top, left = self._crop_offsets(rw, rh)
        sx, sy = width / rw, height / rh
        return ((left * sx, top * sy, (left + cw) * sx, (top + ch) * sy), (cw, ch), None, False)

    def _resized(self, width: int, height: int) -> Size2:
        """``(width, height)`` after ``resize`` (before the crop)."""
        if self.resize is None:
            return width, height
        if self._resize_short:  # torchvision Resize(int): short side to N, long side truncated
            n = self.resize[0]
            if width <= height:
                return n, int(n * height / width)
            return int(n * width / height), n
        return self.resize[1], self.resize[0]

    def _crop_offsets(self, rw: int, rh: int) -> Size2:
        """``(top, left)`` of the centre crop in a ``rw x rh`` resized image."""
        ch, cw = self.crop  # type: ignore[misc]
        return int(round((rh - ch) / 2.0)), int(round((rw - cw) / 2.0))  # torchvision's

    # -- decoding -------------------------------------------------------------------------------
    def decode(self, data: Any) -> np.ndarray:
        """One encoded image as a uint8 array of :attr:`shape` (HWC or CHW).

        Raises :class:`~streamio.DecodeError` (without a record position) if it does not decode.
        """
        try:
            array = self._decode(data)
        except _BadImage as exc:
            raise DecodeError(f"not a decodable image: {exc}") from None
        # Writable and contiguous: torch.from_numpy takes it without a warning or a copy.
        return np.require(array, np.uint8, ["C", "W"])

    def _decode(self, data: Any, dest: Optional[np.ndarray] = None) -> np.ndarray:
        """The image as an array; ``dest`` (a batch's row, HWC): where a resize may write it
        (the result is then ``dest`` itself)."""
        codecs = _Codecs.load()
        array = None
        if codecs.simplejpeg is not None and bytes(data[:2]) == _JPEG_MAGIC:
            array = self._decode_jpeg(codecs, data, dest)
        if array is None:
            array = self._decode_pillow(codecs, data)
        return array if self.layout == "HWC" else np.ascontiguousarray(array.transpose(2, 0, 1))

    def _decode_jpeg(self, codecs: Any, data: Any, dest: Optional[np.ndarray] = None
                     ) -> Optional[np.ndarray]:
        """simplejpeg's decode (None: hand the image to Pillow, which reads more kinds of JPEG)."""
        sj = codecs.simplejpeg
        try:
            height, width, colorspace, _ = sj.decode_jpeg_header(data)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise _BadImage(str(exc) or type(exc).__name__) from None
        if colorspace not in ("RGB", "YCbCr", "Gray"):
            return None  # CMYK / YCCK: Pillow converts those
        self._check_pixels(width, height)
        box, out, pad, flip = self._plan(width, height, data)
        min_h = min_w = 0
        if self.dct_scaling and pad is None:
            # The smallest of 1/2, 1/4, 1/8 that still leaves the box at least as large as the
            # output. libjpeg-turbo has SIMD inverse DCTs for those (and the full size) only:
            # the other n/8 scales (3/4 for a 500x375 photo to 256 + crop 224) run its plain C
            # IDCT and decode slower than the full image (1.5-1.8 ms vs 0.9-1.3 ms here).
            s = max(out[0] / max(box[2] - box[0], 1e-9), out[1] / max(box[3] - box[1], 1e-9))
            factor = 1.0
            while factor > 0.125 and s <= factor / 2:
                factor /= 2
            if factor < 1.0:
                min_w, min_h = math.ceil(width * factor), math.ceil(height * factor)
        try:
            pixels = sj.decode_jpeg(data, colorspace="RGB" if self.channels == 3 else "GRAY",
                                    min_height=min_h, min_width=min_w)
        except (ValueError, RuntimeError) as exc:
            raise _BadImage(str(exc) or type(exc).__name__) from None
        dh, dw = pixels.shape[:2]
        if (dw, dh) != (width, height):
            fx, fy = dw / width, dh / height
            box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
        return self._finish(codecs, pixels, None, box, out, pad, flip, dest)

    def _check_pixels(self, width: int, height: int) -> None:
        if width * height > self.max_pixels:
            raise _BadImage(f"{width}x{height} pixels is more than max_pixels={self.max_pixels}")

    def _decode_pillow(self, codecs: Any, data: Any) -> np.ndarray:
        parser = codecs.parser()
        pil = codecs.pil
        try:
            parser.feed(bytes(data))
            if parser.image is not None:  # the header is read: refuse a huge image before decoding
                self._check_pixels(parser.image.width, parser.image.height)
            image = parser.close()
            self._check_pixels(image.width, image.height)
            mode = "RGB" if self.channels == 3 else "L"
            if image.mode != mode:
                image = image.convert(mode)
        except (OSError, ValueError, SyntaxError, TypeError, EOFError, IndexError,
                pil.DecompressionBombError) as exc:
            # Pillow reports corrupt or truncated data with these; MemoryError and the like are
            # not about this record and pass through.
            raise _BadImage(str(exc) or type(exc).__name__) from None
        box, out, pad, flip = self._plan(image.width, image.height, data)
        return self._finish(codecs, None, image, box, out, pad, flip)

    def _finish(self, codecs: Any, pixels: Optional[np.ndarray], image: Any,
                box: Tuple[float, float, float, float], out: Size2, pad: Optional[Size2],
                flip: bool, dest: Optional[np.ndarray] = None) -> np.ndarray:
        """Crop/resize a decoded image (a numpy array or a Pillow image) to the output."""
        w = pixels.shape[1] if pixels is not None else image.width
        h = pixels.shape[0] if pixels is not None else image.height
        whole = box == (0.0, 0.0, float(w), float(h))
        integral = all(float(v).is_integer() for v in box)
        if (box[2] - box[0], box[3] - box[1]) == (float(out[0]), float(out[1])) and integral:
            # No scaling: a crop (or nothing) is a slice, not a resampling.
            if pixels is None:
                pixels = np.asarray(image)
            x0, y0, x1, y1 = (int(v) for v in box)
            result = pixels if whole else pixels[y0:y1, x0:x1]
        elif pixels is not None and _resample.has_kernel(self.resample):
            # simplejpeg's array straight into the C kernel: Pillow's resize, byte for byte,
            # without making a Pillow image of it and an array of the result (2-3x faster).
            direct = dest is not None and not flip and pad is None and self.layout == "HWC"
            result = _resample.resize(pixels, out, self.resample, box,
                                      out=dest if direct else None)
        else:
            pil = codecs.pil
            if image is None:
                image = pil.fromarray(pixels[:, :, 0] if self.channels == 1 else pixels)
            image = image.resize(out, getattr(pil.Resampling, self.resample.upper()), box=box)
            result = np.asarray(image)
        if result.ndim == 2:
            result = result[:, :, None]
        if flip:
            result = result[:, ::-1]
        if pad is not None:
            ch, cw = self.crop  # type: ignore[misc]
            canvas = np.zeros((ch, cw, self.channels), np.uint8)
            canvas[pad[0]:pad[0] + result.shape[0], pad[1]:pad[1] + result.shape[1]] = result
            return canvas
        # Possibly read-only (Pillow's buffer) or a view: decode() makes it an array of its own,
        # decode_column() copies it straight into its row of the batch (one copy, not two).
        return result

    def decode_column(self, values: Sequence[Any], *, source: Optional[str] = None,
                      first_index: int = 0, field: Optional[str] = None,
                      indices: Optional[Sequence[int]] = None
                      ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Decode a column of encoded images: ``(images, keep)``.

        ``images`` is ``(n, *shape)`` uint8 for a fixed :attr:`shape`, else an object array of
        arrays; ``keep`` is None, or (after a bad image under ``on_error="skip"``/``"warn"``) the
        boolean mask of the rows that decoded, ``images`` holding only those. ``indices``: the
        position of each value in its batch, where that is not its position in ``values``.
        """
        if self.device is not None:
            from . import _torch_image

            return _torch_image.decode_column(self, values, self.device, source=source,
                                              first_index=first_index, field=field,
                                              indices=indices)
        shape = self.shape
        n = len(values)
        out: Any = np.empty((n,) + shape, np.uint8) if shape is not None else np.empty(n, object)
        keep: Optional[np.ndarray] = None
        for i, data in enumerate(values):
            try:
                if shape is None:  # the image is its own array
                    out[i] = np.require(self._decode(data), np.uint8, ["C", "W"])
                else:  # resized straight into the batch's row where it can be, else copied there
                    row = out[i]
                    array = self._decode(data, row if self.layout == "HWC" else None)
                    if array is not row:
                        row[...] = array
            except _BadImage as exc:
                self._reject(exc, source, first_index + int(i if indices is None else indices[i]),
                             field)
                if keep is None:
                    keep = np.ones(n, bool)
                keep[i] = False
        if keep is not None:
            out = out[keep]
        return out, keep

    def _reject(self, exc: _BadImage, source: Optional[str], record_index: int,
                field: Optional[str]) -> None:
        """A bad image under ``on_error``: raise its DecodeError, or warn (and the caller drops
        the record), or only let the caller drop it."""
        err = DecodeError(f"not a decodable image: {exc}", source=source,
                          record_index=record_index, field=field)
        if self.on_error == "raise":
            raise err from None
        drop_record(field or "image", err, warn=self.on_error == "warn", stacklevel=4)

    def decode_batch(self, records: Sequence[Any], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, np.ndarray]:
        images, _ = self.decode_column(records, source=source, first_index=first_index)
        return {"image": images}


class ImageRecord:
    """Decode MXNet image RecordIO (``im2rec``) records: ``Dataset(path, "recordio",
    decoder=ImageRecord(size=224))``. Payload layout (MXNet ``recordio.pack``; ``struct`` format
    ``IfQQ``, little-endian on every platform MXNet ships)::

        u32 flag | f32 label | u64 id | u64 id2 | flag x f32 labels (when flag > 0) | image bytes

    With ``flag == 0`` the label is the header's ``label``; with ``flag > 0`` it is the ``flag``
    floats that follow the header (the header's ``label`` is then unused, 0 by convention).

    A batch is ``{"image": images, "label": float32, "id": int64}``. ``label`` is ``(B,)`` (the
    header's label; records must have ``flag == 0``) unless ``label_width=k``, which gives
    ``(B, k)`` from records holding ``k`` labels (``flag == k``; with ``k == 1`` a ``flag == 0``
    record's header label also counts). ``id`` is the header's u64 ``id`` (ids past 2**63 wrap).
    Image options are those of :class:`Image` (``image=Image(...)`` or its keywords).
    ``on_error="skip"`` also drops records whose header is cut short or whose label count is
    wrong.
    """

    def __init__(self, image: Optional[Image] = None, *, label_width: Optional[int] = None,
                 **image_options: Any) -> None:
        if image is not None and image_options:
            raise UsageTypeError("give an Image or its keyword options, not both")
        if image is not None and not isinstance(image, Image):
            raise UsageTypeError(f"image must be a streamio.Image, not {type(image).__name__}")
        self.image = image if image is not None else Image(**image_options)
        if label_width is not None and (isinstance(label_width, bool) or not isinstance(
                label_width, (int, np.integer)) or label_width < 1):
            raise UsageError(f"label_width must be None or an int >= 1, not {label_width!r}")
        self.label_width = None if label_width is None else int(label_width)

    def __repr__(self) -> str:
        width = "" if self.label_width is None else f", label_width={self.label_width}"
        return f"ImageRecord({self.image!r}{width})"

    def output_spec(self) -> Dict[str, FieldSpec]:
        label_shape = () if self.label_width is None else (self.label_width,)
        return {"image": self.image.field_spec(), "label": FieldSpec("dense", np.float32, label_shape),
                "id": FieldSpec("dense", np.int64, ())}

    def set_epoch(self, epoch: int) -> None:
        self.image.set_epoch(epoch)

    def fresh(self) -> "ImageRecord":
        return self

    def reset(self) -> None:
        """Nothing to forget: stateless."""

    def _header(self, record: Any) -> Tuple[np.ndarray, int, Any]:
        """``(labels, id, image bytes)`` of one record; raises _BadImage if the header is bad."""
        if len(record) < IR_HEADER_SIZE:
            raise _BadImage(f"record of {len(record)} bytes is shorter than the"
                            f" {IR_HEADER_SIZE}-byte im2rec header")
        flag, label, ident, _ = _IR_HEADER.unpack_from(record)
        start = IR_HEADER_SIZE + 4 * flag
        if flag and start > len(record):
            raise _BadImage(f"header says {flag} labels, more than the record holds")
        if flag:
            labels = np.frombuffer(record, "<f4", flag, IR_HEADER_SIZE)
        else:
            labels = np.array([label], np.float32)
        want = 1 if self.label_width is None else self.label_width
        if len(labels) != want or (self.label_width is None and flag):
            hint = "" if self.label_width is not None else f"; pass label_width={len(labels)}"
            raise _BadImage(f"record holds {len(labels)} label(s) (flag={flag}), expected {want}{hint}")
        return labels, ident, memoryview(record)[start:]

    def decode_batch(self, records: Sequence[Any], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, np.ndarray]:
        n = len(records)
        width = 1 if self.label_width is None else self.label_width
        labels = np.empty((n, width), np.float32)
        ids = np.empty(n, np.uint64)
        payloads: List[Any] = []
        keep = np.ones(n, bool)
        for i, record in enumerate(records):
            try:
                labels[i], ids[i], payload = self._header(record)
            except _BadImage as exc:
                err = DecodeError(f"not an im2rec record: {exc}", source=source,
                                  record_index=first_index + i)
                if self.image.on_error == "raise":
                    raise err from None
                drop_record("header", err, warn=self.image.on_error == "warn", stacklevel=2)
                keep[i] = False
                payload = None
            payloads.append(payload)
        good = np.flatnonzero(keep)
        images, ok = self.image.decode_column([payloads[i] for i in good], source=source,
                                              first_index=first_index, field="image",
                                              indices=good)
        if ok is not None:
            keep[good[~ok]] = False
        label = labels[keep]
        return {"image": images, "label": label[:, 0] if self.label_width is None else label,
                "id": ids[keep].view(np.int64)}


def encode_image_record(image: bytes, label: Union[float, Sequence[float], np.ndarray], *,
                        id: int = 0, id2: int = 0) -> bytes:
    """One im2rec payload (MXNet ``recordio.pack``): a scalar ``label`` goes in the header
    (``flag = 0``); a sequence of labels follows it as float32 (``flag = len(label)``, header
    label 0). Write payloads with ``streamio.write_records(path, "recordio", payloads)``."""
    if isinstance(label, (int, float, np.integer, np.floating)) and not isinstance(label, bool):
        return _IR_HEADER.pack(0, float(label), id, id2) + bytes(image)
    labels = np.asarray(label, dtype="<f4").ravel()
    if labels.size == 0:
        raise UsageError("label must be a number or a non-empty sequence of numbers")
    return _IR_HEADER.pack(labels.size, 0.0, id, id2) + labels.tobytes() + bytes(image)

"""The feature specs of :mod:`streamio.decoders.example`: ``FixedLen``, ``VarLen``, the kind
numbers the parsers take, dtypes and defaults."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import UsageError, UsageTypeError

# Feature.kind field numbers; parse functions take and report kinds as these numbers.
KIND_BYTES = 1
KIND_FLOAT = 2
KIND_INT64 = 3
_KIND_NAMES = {0: "no value list", KIND_BYTES: "bytes_list", KIND_FLOAT: "float_list",
               KIND_INT64: "int64_list"}

# dtype name -> (wire kind it is read from, numpy dtype of the output)
_DTYPES: Dict[str, Tuple[int, Any]] = {
    "float32": (KIND_FLOAT, np.float32),
    "float64": (KIND_FLOAT, np.float64),
    "int64": (KIND_INT64, np.int64),
    "int32": (KIND_INT64, np.int32),
    "bytes": (KIND_BYTES, object),
}
_INT32_RANGE = (-(2 ** 31), 2 ** 31 - 1)

DEFAULT_PAD_VALUE = 0


def _dtype_name(dtype: Any) -> str:
    if dtype is bytes or dtype == "string":  # tf.string users write "string"
        return "bytes"
    if dtype is float or dtype == "float":
        # numpy reads these as float64, TensorFlow (tf.as_dtype, tf.float) as float32: a guess
        # would silently double the size of (or narrow) every value for one camp of users.
        raise UsageError(f"dtype {dtype!r} is ambiguous (numpy reads it as float64, TensorFlow"
                         " as float32): write 'float32' (what an Example's float_list holds)"
                         " or 'float64' (to cast)")
    if isinstance(dtype, str) and dtype in _DTYPES:
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name in _DTYPES:
        return name
    raise UsageError(f"dtype must be one of {sorted(_DTYPES)}, not {dtype!r}")


class FixedLen:
    """A feature with a fixed number of values per example, decoded to ``(B, *shape)``.

    ``dtype``: ``"float32"`` / ``"int64"`` / ``"bytes"`` (the three Example value lists), or
    ``"float64"`` / ``"int32"`` to cast (int32 values out of range are an error, not a wrap).
    ``"float"`` (and ``float``) is refused: numpy reads it as float64, TensorFlow as float32.
    ``bytes`` gives an object array of ``bytes``. ``default`` (a scalar, broadcast, or an array of
    ``shape``) fills examples that lack the feature; without one a missing feature is a
    :class:`~streamio.errors.DecodeError` naming the record.

    As a :class:`SequenceExample` *sequence* feature it plays TF's ``FixedLenSequenceFeature``:
    ``default`` pads the steps, and an absent feature list raises "... is required", unless
    ``allow_missing=True`` (as in TF), which reads it as 0 steps. ``allow_missing`` means nothing
    elsewhere and is refused there.
    """

    __slots__ = ("shape", "dtype", "default", "allow_missing")

    def __init__(self, shape: Union[int, Sequence[int]], dtype: Any, default: Any = None, *,
                 allow_missing: bool = False) -> None:
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        try:
            shape = tuple(int(d) for d in shape)
        except TypeError:
            raise UsageTypeError(f"shape must be an int or a sequence of ints, not {shape!r}") from None
        if any(d < 0 for d in shape):
            raise UsageError(f"shape must not have negative dimensions: {shape}")
        self.shape: Tuple[int, ...] = shape
        self.dtype: str = _dtype_name(dtype)
        self.default: Optional[np.ndarray] = (None if default is None
                                              else _as_default(default, self.dtype, shape))
        if not isinstance(allow_missing, bool):
            raise UsageTypeError(f"allow_missing must be True or False, not {allow_missing!r}")
        self.allow_missing: bool = allow_missing

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        default = "" if self.default is None else f", default={self.default.tolist()!r}"
        missing = ", allow_missing=True" if self.allow_missing else ""
        return f"FixedLen({self.shape}, {self.dtype!r}{default}{missing})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FixedLen) and (self.shape, self.dtype) == (other.shape, other.dtype)
                and _same_default(self.default, other.default)
                and self.allow_missing == other.allow_missing)

    __hash__ = None

    def __reduce__(self):
        return (_fixed_len, (self.shape, self.dtype, self.default, self.allow_missing))


class VarLen:
    """A feature with any number of values: ``batch[name]`` is ``(B, longest in the batch)``,
    padded with ``pad_value``, and ``batch[name + "_len"]`` the lengths (``int64``).

    For ``dtype="bytes"`` a ``pad_value`` of 0 means ``b""``.
    """

    __slots__ = ("dtype", "pad_value")

    def __init__(self, dtype: Any, pad_value: Any = DEFAULT_PAD_VALUE) -> None:
        self.dtype: str = _dtype_name(dtype)
        if self.dtype == "bytes" and isinstance(pad_value, int) and pad_value == 0:
            pad_value = b""
        self.pad_value = _as_default(pad_value, self.dtype, ()).item()

    def __repr__(self) -> str:
        return f"VarLen({self.dtype!r}, pad_value={self.pad_value!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, VarLen) and self.dtype == other.dtype
                and _same_default(np.asarray(self.pad_value), np.asarray(other.pad_value)))

    __hash__ = None

    def __reduce__(self):
        return (VarLen, (self.dtype, self.pad_value))


def _fixed_len(shape: Tuple[int, ...], dtype: str, default: Any, allow_missing: bool) -> FixedLen:
    return FixedLen(shape, dtype, default, allow_missing=allow_missing)  # keyword-only: unpickle


def _same_default(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.all((a == b) | ((a != a) & (b != b))))


def _as_default(value: Any, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    """``value`` as an array of ``shape`` and ``dtype``; ValueError/TypeError if it cannot be."""
    if dtype == "bytes":
        arr = np.asarray(value, dtype=object)
        flat = arr.ravel()
        for k, item in enumerate(flat):
            if isinstance(item, str):
                flat[k] = item.encode("utf-8")
            elif not isinstance(item, bytes):
                raise UsageTypeError(f"a bytes default must hold bytes or str, not {item!r}")
        arr = flat.reshape(arr.shape)
    else:
        target = _DTYPES[dtype][1]
        try:
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise UsageTypeError(f"a {dtype} default must be numeric, not {value!r}")
            if target in (np.int32, np.int64) and arr.dtype.kind == "f":
                if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                    raise UsageError(f"a {dtype} default must hold whole numbers, not {value!r}")
            info = np.iinfo(target) if target in (np.int32, np.int64) else None
            if info is not None and arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise UsageError(f"default {value!r} does not fit in {dtype}")
            arr = arr.astype(target)
        except (OverflowError, ValueError) as exc:
            raise UsageError(f"default {value!r} is not a valid {dtype} value: {exc}") from None
    try:
        return np.array(np.broadcast_to(arr, shape))
    except ValueError:
        raise UsageError(f"default of shape {arr.shape} does not fit the feature shape {shape}") from None

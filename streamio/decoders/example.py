"""``tf.train.Example`` and ``tf.train.SequenceExample`` records into numpy columns, without TF.

Wire format (tensorflow/core/example/example.proto, feature.proto; proto3)::

    Example         { Features features = 1; }
    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
    Features        { map<string, Feature> feature = 1; }
    FeatureLists    { map<string, FeatureList> feature_list = 1; }
    FeatureList     { repeated Feature feature = 1; }
    Feature         { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }   FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

Decoding is split in two so that the per-record part stays small and replaceable:
:func:`parse_examples` / :func:`parse_sequence_examples`, the *reference* wire parsers, are pure
functions from a batch of records to flat value arrays plus a ``counts`` matrix, the only
per-record Python code (the C kernel, streamio/_c/pb_example.c, has the same signature);
:class:`Example` / :class:`SequenceExample` turn those into ``FixedLen`` and ``VarLen`` columns
with whole-batch numpy operations (reshape, defaults, padding). The decoders and
``encode_example`` are here; this module is also the public face of ``_example_spec``
(``FixedLen``, ``VarLen``, kinds, dtypes, defaults), ``_example_parse`` (the reference parsers)
and ``_example_fast`` (``parse_examples_fast``, the vectorised path where C is not built).

Protobuf semantics kept (so that results equal ``tf.io.parse_example`` and any protobuf parser):
the last map entry for a key wins; a message field that occurs twice is merged (parsed as the
concatenation of its occurrences); the ``oneof`` keeps the kind set last; packed and unpacked
encodings of a repeated field are both accepted; unknown fields are skipped.
"""


from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DecodeError
from ..errors import UsageError, UsageTypeError
from .image import Image
from ._example_fast import (SkeletonLayout, parse_examples_fast, span_values,  # noqa: F401
                            vectorisable_groups)
from ._example_parse import map_entry, parse_examples, parse_sequence_examples  # noqa: F401
from ._example_spec import (_DTYPES, _INT32_RANGE, DEFAULT_PAD_VALUE, KIND_BYTES,  # noqa: F401
                            KIND_FLOAT, KIND_INT64, FixedLen, VarLen)
from .wire import _WireError, encode_packed_varints, len_field
from .sparse import SparseBatch
from .spec import FieldSpec

try:  # the C kernel (streamio/_c/pb_example.c); tests/kernels/test_kernel_protobuf.py holds it to parse_examples
    from .._speedups import parse_examples as _c_parse_examples
except ImportError:  # pragma: no cover - depends on the build
    _c_parse_examples = None
try:  # the same file; tests/kernels/test_kernel_protobuf.py holds it to parse_sequence_examples
    from .._speedups import parse_sequence_examples as _c_parse_sequence_examples
except ImportError:  # pragma: no cover - depends on the build (or an older one)
    _c_parse_sequence_examples = None

__all__ = [
    "Example",
    "FixedLen",
    "encode_example",
    "SequenceExample",
    "VarLen",
    "parse_examples",
    "parse_sequence_examples",
]

# --- whole-batch assembly ------------------------------------------------------------------------

def _object_array(values: List[bytes]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _cast(values: Any, dtype: str, counts: np.ndarray, where: "_Where", name: str) -> np.ndarray:
    """Flat wire values as the output dtype (int32 only if every value fits)."""
    if dtype == "bytes":
        return _object_array(values)
    target = _DTYPES[dtype][1]
    if target is np.int32 and len(values):
        bad = (values < _INT32_RANGE[0]) | (values > _INT32_RANGE[1])
        if bad.any():
            k = int(np.argmax(bad))
            owner = int(np.searchsorted(np.cumsum(np.maximum(counts, 0)), k, "right"))
            raise where.error(f"value {int(values[k])} does not fit in int32", owner, name)
    return values.astype(target, copy=False)


class _Where:
    """Where a batch came from, for error messages."""

    __slots__ = ("source", "first_index")

    def __init__(self, source: Optional[str], first_index: int) -> None:
        self.source = source
        self.first_index = first_index

    def error(self, message: str, row: Optional[int], field: Optional[str]) -> DecodeError:
        return DecodeError(message, source=self.source,
                           record_index=None if row is None else self.first_index + row,
                           field=field)


def _fixed_column(name: str, spec: FixedLen, values: Any, counts: np.ndarray,
                  where: _Where) -> np.ndarray:
    n = spec.size
    nrec = len(counts)
    if (counts == n).all():  # the common case, in one pass: every record has its n values
        flat = _cast(values, spec.dtype, counts, where, name)
        # Writable, so that torch.from_numpy takes it without a warning or a copy.
        return np.require(flat.reshape((nrec,) + spec.shape), requirements="W")
    wrong = (counts >= 0) & (counts != n)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise where.error(f"feature has {counts[i]} values, expected {n} for shape {spec.shape}",
                          i, name)
    missing = counts < 0
    any_missing = bool(missing.any())
    if any_missing and spec.default is None:
        raise where.error("feature is missing and has no default", int(np.argmax(missing)), name)
    flat = _cast(values, spec.dtype, counts, where, name)
    out = np.empty((nrec, n), dtype=flat.dtype)
    out[~missing] = flat.reshape(-1, n)
    out[missing] = spec.default.reshape(n)
    return out.reshape((nrec,) + spec.shape)


def _varlen_column(name: str, spec: VarLen, values: Any, counts: np.ndarray, where: _Where
                   ) -> Tuple[np.ndarray, np.ndarray]:
    lengths = np.maximum(counts, 0)
    flat = _cast(values, spec.dtype, counts, where, name)
    width = int(lengths.max()) if len(lengths) else 0
    out = np.full((len(lengths), width), spec.pad_value, dtype=flat.dtype)
    out[np.arange(width) < lengths[:, None]] = flat
    return out, lengths


def _validate_features(features: Any, what: str,
                       sequence: bool = False) -> Dict[str, Union[FixedLen, VarLen]]:
    if not isinstance(features, Mapping):
        raise UsageTypeError(f"{what} must be a mapping {{name: FixedLen | VarLen}}, not {type(features).__name__}")
    out: Dict[str, Union[FixedLen, VarLen]] = {}
    for name, spec in features.items():
        if not isinstance(name, str):
            raise UsageTypeError(f"feature names must be str, not {name!r}")
        if not isinstance(spec, (FixedLen, VarLen)):
            raise UsageTypeError(f"feature {name!r}: expected FixedLen or VarLen, not {spec!r}")
        if isinstance(spec, FixedLen) and spec.allow_missing and not sequence:
            raise UsageError(f"feature {name!r}: allow_missing is for SequenceExample sequence"
                             " features; give a default for a feature that may be missing")
        out[name] = spec
    return out


def _output_names(groups: Sequence[Tuple[Mapping[str, Any], bool]]) -> None:
    """Raise ValueError if two outputs would share a name (``x`` VarLen and a feature ``x_len``)."""
    seen: Dict[str, str] = {}
    for features, is_sequence in groups:
        for name, spec in features.items():
            outs = [name]
            if isinstance(spec, VarLen) or is_sequence:
                outs.append(name + "_len")
            if is_sequence and isinstance(spec, VarLen):
                outs.append(name + "_step_len")
            for out in outs:
                if out in seen:
                    raise UsageError(f"output {out!r} of feature {name!r} clashes with feature {seen[out]!r}")
                seen[out] = name


def _spec_of(spec: Union[FixedLen, VarLen], steps: bool) -> Dict[str, Tuple[str, Any, tuple]]:
    kind = "object" if spec.dtype == "bytes" else "dense"
    dtype = _DTYPES[spec.dtype][1]
    lead = (None,) if steps else ()
    if isinstance(spec, FixedLen):
        return {"": (kind, dtype, lead + spec.shape)}
    out = {"": (kind, dtype, lead + (None,))}
    if steps:
        out["_step_len"] = ("dense", np.int64, (None,))
    return out


class Example:
    """Decode serialized ``tf.train.Example`` records: ``Example({"x": FixedLen((3,), "float32"),
    "tags": VarLen("bytes")})``.

    ``decode_batch(records)`` returns ``{name: (B, *shape) array}`` for each ``FixedLen`` and
    ``{name: (B, longest) padded array, name + "_len": (B,) int64}`` for each ``VarLen``;
    features the spec does not name are ignored. Results equal ``tf.io.parse_example`` with the
    matching ``FixedLenFeature`` / ``VarLenFeature`` (a ``VarLen`` comes padded instead of as a
    ``SparseTensor``). Stateless: one instance may decode any number of streams.
    """

    def __init__(self, features: Mapping[str, Union[FixedLen, VarLen, Image]]) -> None:
        # An Image feature is a bytes feature on the wire, decoded after parsing (decoders/image.py).
        self._images: Dict[str, Image] = ({name: spec for name, spec in features.items()
                                           if isinstance(spec, Image)}
                                          if isinstance(features, Mapping) else {})
        self.features = _validate_features(
            {name: FixedLen([], "bytes") if name in self._images else spec
             for name, spec in features.items()} if self._images else features, "features")
        _output_names([(self.features, False)])
        self._names = tuple(name.encode("utf-8") for name in self.features)
        self._kinds = tuple(_DTYPES[spec.dtype][0] for spec in self.features.values())

    def __repr__(self) -> str:
        return f"Example({dict(self.features, **self._images)!r})"

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch to the random crops of ``Image`` features."""
        for image in self._images.values():
            image.set_epoch(epoch)

    def fresh(self) -> "Example":
        """A decoder for a new stream (Example keeps no state, so this is ``self``)."""
        return self

    def reset(self) -> None:
        """Nothing to forget: Example decoders are stateless."""

    def output_spec(self) -> Dict[str, FieldSpec]:
        out: Dict[str, FieldSpec] = {}
        for name, spec in self.features.items():
            for suffix, (kind, dtype, shape) in _spec_of(spec, False).items():
                out[name + suffix] = FieldSpec(kind, dtype, shape)
            if isinstance(spec, VarLen):
                out[name + "_len"] = FieldSpec("dense", np.int64, ())
        for name, image in self._images.items():
            out[name] = image.field_spec()
        return out

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, Union[np.ndarray, SparseBatch]]:
        where = _Where(source, first_index)
        try:
            parse = _c_parse_examples or parse_examples_fast
            values, counts = parse(records, self._names, self._kinds)
        except _WireError as exc:
            raise where.error(f"not a valid tf.train.Example: {exc.message}", exc.index, exc.field) from None
        out: Dict[str, Union[np.ndarray, SparseBatch]] = {}
        for j, (name, spec) in enumerate(self.features.items()):
            if isinstance(spec, FixedLen):
                out[name] = _fixed_column(name, spec, values[j], counts[:, j], where)
            else:
                out[name], out[name + "_len"] = _varlen_column(name, spec, values[j], counts[:, j], where)
        if self._images:
            out = _decode_images(self._images, out, source, first_index)
        return out


def _decode_images(images: Mapping[str, Image], out: Dict[str, Any], source: Optional[str],
                   first_index: int) -> Dict[str, Any]:
    """Decode the Image columns; a record an image skips (``on_error="skip"``) leaves every
    column."""
    kept: Dict[str, np.ndarray] = {}
    for name, image in images.items():
        out[name], ok = image.decode_column(out[name], source=source, first_index=first_index,
                                            field=name)
        if ok is not None:
            kept[name] = ok
    if not kept:
        return out
    keep = np.logical_and.reduce(list(kept.values()))
    return {k: v[keep[kept[k]]] if k in kept else v[keep] for k, v in out.items()}


class SequenceExample:
    """Decode serialized ``tf.train.SequenceExample`` records.

    ``context`` features decode as in :class:`Example`. Each ``sequence`` feature is a list of
    steps, padded to the longest sequence in the batch: ``FixedLen(shape)`` gives
    ``(B, steps, *shape)`` (padding: its ``default``, else 0), ``VarLen`` gives ``(B, steps,
    longest step)``; ``batch[name + "_len"]`` holds the number of steps of each example, and a
    ``VarLen`` sequence also gets ``batch[name + "_step_len"]`` ``(B, steps)`` with the length of
    each step. As in TF, an absent feature list is an error for a ``FixedLen`` sequence feature
    unless it says ``allow_missing=True`` (then: 0 steps), and 0 steps for a ``VarLen`` one; a
    feature list that is present but empty has 0 steps. Stateless.
    """

    def __init__(self, context: Optional[Mapping[str, Union[FixedLen, VarLen]]] = None,
                 sequence: Optional[Mapping[str, Union[FixedLen, VarLen]]] = None) -> None:
        self.context = _validate_features({} if context is None else context, "context")
        self.sequence = _validate_features({} if sequence is None else sequence, "sequence",
                                           sequence=True)
        _output_names([(self.context, False), (self.sequence, True)])
        self._c_names = tuple(name.encode("utf-8") for name in self.context)
        self._c_kinds = tuple(_DTYPES[spec.dtype][0] for spec in self.context.values())
        self._s_names = tuple(name.encode("utf-8") for name in self.sequence)
        self._s_kinds = tuple(_DTYPES[spec.dtype][0] for spec in self.sequence.values())

    def __repr__(self) -> str:
        return f"SequenceExample(context={self.context!r}, sequence={self.sequence!r})"

    def fresh(self) -> "SequenceExample":
        """A decoder for a new stream (stateless, so this is ``self``)."""
        return self

    def reset(self) -> None:
        """Nothing to forget: SequenceExample decoders are stateless."""

    def output_spec(self) -> Dict[str, FieldSpec]:
        out = Example(self.context).output_spec()
        for name, spec in self.sequence.items():
            for suffix, (kind, dtype, shape) in _spec_of(spec, True).items():
                out[name + suffix] = FieldSpec(kind, dtype, shape)
            out[name + "_len"] = FieldSpec("dense", np.int64, ())
        return out

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0) -> Dict[str, Union[np.ndarray, SparseBatch]]:
        where = _Where(source, first_index)
        try:
            parse = _c_parse_sequence_examples or parse_sequence_examples
            c_values, c_counts, s_values, s_steps, step_counts = parse(
                records, self._c_names, self._c_kinds, self._s_names, self._s_kinds)
        except _WireError as exc:
            raise where.error(f"not a valid tf.train.SequenceExample: {exc.message}",
                              exc.index, exc.field) from None
        out: Dict[str, Union[np.ndarray, SparseBatch]] = {}
        for j, (name, spec) in enumerate(self.context.items()):
            if isinstance(spec, FixedLen):
                out[name] = _fixed_column(name, spec, c_values[j], c_counts[:, j], where)
            else:
                out[name], out[name + "_len"] = _varlen_column(name, spec, c_values[j],
                                                               c_counts[:, j], where)
        for j, (name, spec) in enumerate(self.sequence.items()):
            absent = s_steps[:, j] < 0
            if isinstance(spec, FixedLen) and not spec.allow_missing and absent.any():
                # TF (FixedLenSequenceFeature, allow_missing=False): "Feature list ... is required"
                raise where.error(f"feature list {name!r} is required but absent; pass"
                                  f" FixedLen(..., allow_missing=True) to read it as 0 steps",
                                  int(np.argmax(absent)), name)
            steps = np.maximum(s_steps[:, j], 0)
            out.update(_sequence_column(name, spec, s_values[j], steps, step_counts[j], where))
        return out


def _sequence_column(name: str, spec: Union[FixedLen, VarLen], values: Any, steps: np.ndarray,
                     step_counts: np.ndarray, where: _Where) -> Dict[str, np.ndarray]:
    nrec = len(steps)
    longest = int(steps.max()) if nrec else 0
    step_owner = np.repeat(np.arange(nrec), steps)
    if isinstance(spec, FixedLen):
        n = spec.size
        wrong = step_counts != n
        if wrong.any():
            k = int(np.argmax(wrong))
            raise where.error(f"a step has {step_counts[k]} values, expected {n} for shape"
                              f" {spec.shape}", int(step_owner[k]), name)
        # values per record: only an int32 cast that fails needs them (to name the record)
        per_record = (np.bincount(step_owner, weights=step_counts, minlength=nrec).astype(np.int64)
                      if _DTYPES[spec.dtype][1] is np.int32 else steps * n)
        flat = _cast(values, spec.dtype, per_record, where, name)
        pad = spec.default.reshape(n) if spec.default is not None else (
            b"" if spec.dtype == "bytes" else 0)
        out = np.empty((nrec, longest, n), dtype=flat.dtype)
        out[...] = pad
        # Step g of the batch (record r's step t) goes to out[r, t] = row r * longest + t of the
        # (B * T, n) output. numpy copies (steps, n) blocks by a row index or a (B, T) mask
        # element by element (4-6x slower): numbers are moved as one n-value item a step.
        shift = np.arange(nrec, dtype=np.int64) * longest - (np.cumsum(steps) - steps)
        rows = np.arange(len(step_owner), dtype=np.int64) + np.repeat(shift, steps)
        if flat.dtype == object:
            out.reshape(-1, n)[rows] = flat.reshape(-1, n)
        elif n:
            step_item = np.dtype((np.void, n * flat.itemsize))
            out.reshape(-1, n).view(step_item).reshape(-1)[rows] = \
                np.ascontiguousarray(flat).reshape(-1, n).view(step_item).reshape(-1)
        return {name: out.reshape((nrec, longest) + spec.shape), name + "_len": steps}
    step_mask = np.arange(longest) < steps[:, None]  # (B, T): which steps exist
    per_record = np.bincount(step_owner, weights=step_counts, minlength=nrec).astype(np.int64)
    flat = _cast(values, spec.dtype, per_record, where, name)
    width = int(step_counts.max()) if len(step_counts) else 0
    out = np.full((nrec, longest, width), spec.pad_value, dtype=flat.dtype)
    step_len = np.zeros((nrec, longest), dtype=np.int64)
    step_len[step_mask] = step_counts
    out[np.arange(width) < step_len[:, :, None]] = flat
    return {name: out, name + "_len": steps, name + "_step_len": step_len}


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize one ``tf.train.Example`` without TensorFlow (the inverse of :class:`Example`).

    Values: floats (a float, a list, a float numpy array) -> ``float_list``; ints or bools ->
    ``int64_list``; ``bytes``/``str`` or a list of them -> ``bytes_list``. Wire layout
    (tensorflow/core/example/example.proto): ``Example{features=1: Features{feature=1:
    map<string, Feature>}}``, each map entry ``{key=1, value=2}``, ``Feature{bytes_list=1 |
    float_list=2 | int64_list=3}``, each list ``{value=1}``, numbers packed.
    """
    entries = []
    for name, value in features.items():
        if isinstance(value, (bytes, str)):
            value = [value]
        array = np.asarray(value)
        if array.ndim == 0:
            array = array.reshape(1)
        if array.dtype.kind in "OSU":
            items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.ravel()]
            feature = len_field(1, b"".join(len_field(1, v) for v in items))
        elif array.dtype.kind == "f":
            feature = len_field(2, len_field(1, array.astype("<f4").tobytes()))
        elif array.dtype.kind in "iub":
            feature = len_field(3, len_field(1, encode_packed_varints(array.astype(np.int64))))
        else:
            raise UsageTypeError(f"feature {name!r}: cannot encode values of dtype {array.dtype}")
        entries.append(len_field(1, len_field(1, name.encode("utf-8")) + len_field(2, feature)))
    return len_field(1, b"".join(entries))

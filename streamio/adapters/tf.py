"""TensorFlow adapter: a streamio ``Dataset`` as a ``tf.data.Dataset`` with an exact
``element_spec``.

The element spec comes from ``decoder.output_spec()``: each field ``(B, *shape)`` with a ``None``
batch dimension (and ``None`` where the decoder says a dimension varies, such as a ``VarLen``
feature padded to the longest in its batch, whose lengths come as ``name + "_len"``); sparse
fields are ``tf.SparseTensor`` (from the CSR ``SparseBatch``: same values, row-major indices);
object fields (bytes, str) are ``tf.string``. A decoder that learns its outputs from the data
(``output_spec()`` is ``None``) is peeked: the first batch is read when ``to_tf()`` is called,
kept, and handed out first by the first iteration, so no record is lost and no extra epoch of a
FIFO is consumed (but ``to_tf()`` then waits for the first batch).

Each iteration of the returned ``tf.data.Dataset`` (a ``for`` loop, a Keras epoch, a
``.repeat()`` round) is one epoch of the stream: the sources are re-opened (a
:class:`~streamio.PipeChannel` moves to its next FIFO) and shuffle seeds derive from the epoch.

Errors raised while reading reach the user as TensorFlow errors (``from_generator`` wraps them)
whose message carries streamio's message.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Iterator, Optional

import numpy as np

from ..decoders.sparse import SparseBatch
from ..decoders.spec import FieldSpec
from ..errors import UsageError, require
from . import check_splittable

tf = require("tensorflow", "tf")

__all__ = ["element_spec", "to_tf"]


def _tf_dtype(dtype: np.dtype) -> Any:
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return tf.string
    return tf.as_dtype(dtype)


def _type_spec(field: FieldSpec, batched: bool) -> Any:
    shape = ((None,) if batched else ()) + tuple(field.shape)
    if field.kind == "sparse":
        return tf.SparseTensorSpec(shape=shape, dtype=_tf_dtype(field.dtype))
    return tf.TensorSpec(shape=shape, dtype=_tf_dtype(field.dtype))


def element_spec(spec: Optional[dict], *, batched: bool) -> Any:
    """The ``tf.data`` element spec for a decoder's ``output_spec()`` (``None``: raw records)."""
    if spec is None:
        return tf.TensorSpec(shape=(None,) if batched else (), dtype=tf.string)
    return {name: _type_spec(field, batched) for name, field in spec.items()}


def _spec_from_batch(batch: Any, batched: bool) -> Optional[dict]:
    """A ``{name: FieldSpec}`` guessed from one batch, for decoders that learn from the data.

    Only the batch dimension varies, except that a field ``x`` with an ``x_len`` companion is a
    padded ``VarLen`` (its second dimension is the longest in each batch, so it varies too).
    """
    if not isinstance(batch, dict):
        return None  # raw records
    spec = {}
    for name, value in batch.items():
        if isinstance(value, SparseBatch):
            shape = (value.shape[1],) if batched else ()
            spec[name] = FieldSpec("sparse", value.values.dtype, shape)
            continue
        value = np.asarray(value)
        shape = list(value.shape[1:] if batched else value.shape)
        if f"{name}_len" in batch and shape:
            shape[0] = None
        kind = "object" if value.dtype.kind in "OSU" else "dense"
        spec[name] = FieldSpec(kind, value.dtype if kind == "dense" else np.dtype(object),
                               tuple(shape))
    return spec


def _signature_of(value: Any, batched: bool) -> Any:
    """The element spec of what a ``map()`` made, from its first item: dicts, tuples, arrays,
    scalars and bytes (the leading dimension of a batch may vary)."""
    if isinstance(value, dict):
        return {name: _signature_of(v, batched) for name, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_signature_of(v, batched) for v in value)
    if isinstance(value, SparseBatch):
        return tf.SparseTensorSpec(shape=(None,) * batched + tuple(value.shape[1:]),
                                   dtype=_tf_dtype(value.values.dtype))
    if isinstance(value, list) and all(isinstance(v, (bytes, str)) for v in value):
        return tf.TensorSpec(shape=(None,), dtype=tf.string)
    array = np.asarray(value)
    shape = tuple(array.shape)
    if batched and shape:
        shape = (None,) + shape[1:]
    return tf.TensorSpec(shape=shape, dtype=_tf_dtype(array.dtype))


def _to_tf_value(value: Any, field: Optional[FieldSpec]) -> Any:
    if isinstance(value, SparseBatch):
        # CSR -> COO: row of each value from indptr; CSR order is already row-major (canonical).
        rows = np.repeat(np.arange(value.shape[0], dtype=np.int64), np.diff(value.indptr))
        indices = np.stack([rows, value.indices], axis=1)
        return tf.compat.v1.SparseTensorValue(indices, value.values,
                                              np.asarray(value.shape, dtype=np.int64))
    if field is not None and field.kind == "dense":
        return np.asarray(value, dtype=field.dtype)  # no copy when the dtype already matches
    return value


class _EpochSource:
    """The generator function ``from_generator`` calls once per iteration (= per epoch)."""

    def __init__(self, dataset: Any, rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.spec: Optional[dict] = None
        self._epoch = itertools.count()
        self._lock = threading.Lock()
        self._pending: Optional[tuple] = None  # (iterator, first batch) read by peek()

    def _epoch_dataset(self) -> Any:
        with self._lock:
            epoch = next(self._epoch)
        return self.dataset.with_context(epoch=epoch, rank=self.rank, world_size=self.world_size)

    def peek(self) -> Any:
        """Read the first batch of the first epoch now, and keep it for the first iteration."""
        iterator = iter(self._epoch_dataset())
        try:
            first = next(iterator)
        except StopIteration:
            raise UsageError("the stream has no records, so the element spec of the tf.data"
                             " Dataset cannot be learnt from its first batch; give the decoder"
                             " an explicit spec") from None
        self._pending = (iterator, first)
        return first

    def _batches(self) -> Iterator[Any]:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            iterator, first = pending
            yield first
            yield from iterator
        else:
            yield from self._epoch_dataset()

    def __call__(self) -> Iterator[Any]:
        spec = self.spec
        for batch in self._batches():
            if isinstance(batch, dict):
                yield {name: _to_tf_value(value, None if spec is None else spec.get(name))
                       for name, value in batch.items()}
            elif isinstance(batch, SparseBatch):
                yield _to_tf_value(batch, None)
            else:
                yield batch  # raw records: bytes, or a list of bytes (tf.string)


def to_tf(dataset: Any, *, input_context: Any = None) -> Any:
    """``dataset`` as a ``tf.data.Dataset`` whose ``element_spec`` is exact (see the module doc).

    ``input_context``: a ``tf.distribute.InputContext`` (what
    ``strategy.distribute_datasets_from_function`` passes): input pipeline ``i`` of ``n`` reads
    ``dataset.shard(n, i)``, and its shuffle seeds derive from ``i``. Works with ``.map``,
    ``.prefetch(tf.data.AUTOTUNE)`` and ``model.fit`` (map batches to ``(x, y)`` for Keras).
    """
    for name in ("with_context", "shard", "sources"):
        if not hasattr(dataset, name):
            raise TypeError(f"to_tf needs a streamio Dataset, not {type(dataset).__name__}")
    rank, world_size = 0, 1
    if input_context is not None:
        try:
            world_size = int(input_context.num_input_pipelines)
            rank = int(input_context.input_pipeline_id)
        except AttributeError:
            raise TypeError("input_context must be a tf.distribute.InputContext, not"
                            f" {type(input_context).__name__}") from None
        if world_size > 1:
            check_splittable(tuple(dataset.sources), world_size,
                             f"{world_size} tf.distribute input pipelines",
                             "read it in one input pipeline")
            dataset = dataset.shard(world_size, rank)
    batched = getattr(dataset, "batch_size", None) is not None
    # Without batch() items are raw records whatever the decoder (it decodes batches).
    decoder = getattr(dataset, "decoder", None) if batched else None
    source = _EpochSource(dataset, rank, world_size)
    spec = None
    if getattr(dataset, "maps_items", False):
        # A map() makes items of its own kind: learn the spec from the first one (peeked, so
        # it is not lost and no extra epoch of a FIFO is read).
        first = source.peek()
        if isinstance(first, dict):
            source.spec = _spec_from_batch(first, batched)
        return tf.data.Dataset.from_generator(source,
                                              output_signature=_signature_of(first, batched))
    if decoder is not None:
        spec = decoder.output_spec()
        if spec is None:
            spec = _spec_from_batch(source.peek(), batched)
    source.spec = spec
    return tf.data.Dataset.from_generator(source, output_signature=element_spec(spec,
                                                                                batched=batched))

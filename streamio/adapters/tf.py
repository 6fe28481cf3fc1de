"""TensorFlow adapter: a streamio ``Dataset`` as a ``tf.data.Dataset`` with an exact
``element_spec``.

The spec comes from ``decoder.output_spec()``: each field ``(B, *shape)`` with a ``None`` batch
dimension (and ``None`` where a dimension varies, as a ``VarLen`` padded per batch with its
lengths in ``name + "_len"``); sparse fields are ``tf.SparseTensor``, bytes and str fields
``tf.string``. A decoder that learns its outputs from the data is peeked: ``to_tf()`` reads the
first batch and the first iteration hands it out first (no record lost, no extra FIFO epoch).

Contract:
- Each iteration (a ``for`` loop, a Keras epoch, a ``.repeat()`` round) is one epoch of the
  stream: sources re-opened (a ``PipeChannel`` moves to its next FIFO), shuffle seeds per epoch.
- ``to_tf(batches=n)`` gives the Dataset that cardinality, so Keras ends each epoch after ``n``
  steps; an epoch of any other length makes ``model.fit`` raise (a longer one in place of its
  ``n``-th batch, which waits to see whether an ``n + 1``-th follows).
- Every batch comes out as numpy iteration gives it. Fixed-shape outputs travel as blocks of up
  to ``BLOCK_BATCHES`` batches of one size (``[k, B, ...]``, ``unbatch()``-ed inside tf.data),
  one ``tf.numpy_function`` per block under a ``scan``; other outputs one batch per
  ``from_generator`` call (why: docs/performance.md).
- One iteration at a time on the block path: a new one closes the epoch a ``break`` or a short
  Keras epoch left open, and an older iterator still read then raises ``UsageError``. Call
  ``to_tf()`` once per concurrent reader.
- No wait is unbounded or silent: a block call that finds another reading its iteration waits
  ``BLOCK_CALL_WAIT_S`` at most; source waits are bounded by their timeouts and logged; a wait
  for a ``prefetch()`` thread is logged and fails if the thread is gone.
- Errors reach the user as TensorFlow errors carrying streamio's message; ``Dataset.stats()``
  describes the latest epoch read through the tf.data Dataset or the Dataset itself.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Iterator, Optional

import numpy as np

from ..decoders.sparse import SparseBatch
from ..decoders.spec import FieldSpec
from ..errors import UsageError, require
from ..errors import UsageTypeError
from . import check_splittable, source_groups

tf = require("tensorflow", "tf")

__all__ = ["element_spec", "resume_callback", "to_tf"]

#: Batches per Python call on the fixed-shape path. 16 makes the per-call cost small beside the
#: batches' own cost (measured on 2 cores, 200k Examples in batches of 256, read inside a
#: tf.function through from_generator: 540k rec/s one batch per call, 920k with 16); 64
#: measured no better and delays the first batch more. Capped by BLOCK_BYTES.
BLOCK_BATCHES = 16
#: Blocks made ahead by a tf.data prefetch, so the Python side (reading, decoding, stacking) runs
#: while TensorFlow consumes the previous block. One is enough to overlap the two; each costs up
#: to BLOCK_BYTES.
BLOCK_PREFETCH = 1
#: The most bytes one stacked block may hold (large rows get fewer batches per call): the block
#: is an extra copy, alive until TensorFlow has split it.
BLOCK_BYTES = 16 << 20
#: How long a block call waits for another call still reading the same iteration. TensorFlow
#: calls one iterator's ``scan`` steps one at a time, so such a wait means the other call is
#: stuck: it then fails (naming what it waited for) instead of waiting with it forever.
BLOCK_CALL_WAIT_S = 60.0


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


def _to_tf_value(value: Any, field: Optional[FieldSpec], batched: bool = True) -> Any:
    if isinstance(value, SparseBatch) and not batched and value.shape[0] == 1:
        # One example's row (an unbatched item): a 1-D sparse tensor, as the spec says.
        return tf.compat.v1.SparseTensorValue(value.indices[:, None], value.values,
                                              np.asarray(value.shape[1:], dtype=np.int64))
    if isinstance(value, SparseBatch):
        # CSR -> COO: row of each value from indptr; CSR order is already row-major (canonical).
        rows = np.repeat(np.arange(value.shape[0], dtype=np.int64), np.diff(value.indptr))
        indices = np.stack([rows, value.indices], axis=1)
        return tf.compat.v1.SparseTensorValue(indices, value.values,
                                              np.asarray(value.shape, dtype=np.int64))
    if field is not None and field.kind == "dense":
        return np.asarray(value, dtype=field.dtype)  # no copy when the dtype already matches
    return value


def _fixed_shape(spec: Optional[dict]) -> bool:
    """Whether every output is dense with a fixed shape (so batches of one size can stack)."""
    if not spec:
        return False
    return all(f.kind == "dense" and np.dtype(f.dtype).kind not in "OSU"
               and all(d is not None for d in f.shape) for f in spec.values())


def _block_batches(spec: dict, batch_size: int) -> int:
    row = sum(np.dtype(f.dtype).itemsize * int(np.prod(f.shape, dtype=np.int64))
              for f in spec.values())
    return int(max(1, min(BLOCK_BATCHES, BLOCK_BYTES // max(1, row * batch_size))))


def _blocked_signature(signature: dict) -> dict:
    """``[B, ...]`` specs as ``[k, B, ...]``: the generator's blocks before ``unbatch()``."""
    return {name: tf.TensorSpec((None,) + tuple(s.shape), s.dtype)
            for name, s in signature.items()}


def _stack(batches: list, spec: dict) -> dict:
    """``k`` batches of one size as one ``{name: [k, B, ...]}`` block (one copy per field)."""
    out = {}
    for name, field in spec.items():
        first = batches[0][name]
        block = np.empty((len(batches),) + np.shape(first), dtype=field.dtype)
        for i, batch in enumerate(batches):
            block[i] = batch[name]  # casts if the decoder's dtype differs (as _to_tf_value)
        out[name] = block
    return out


_OVERTAKEN = ("a to_tf() Dataset is read by one iterator at a time: another iteration of it"
              " started while this one was running, and closed it; iterate it again, or call"
              " to_tf() once per reader")


class _EpochSource:
    """The generator function ``from_generator`` calls once per iteration (= per epoch)."""

    def __init__(self, dataset: Any, rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.spec: Optional[dict] = None
        self.batched = True  # False: items are single examples (no batch())
        self.block = 1  # batches per call: > 1 on the fixed-shape path (see BLOCK_BATCHES)
        self.batches: Optional[int] = None  # to_tf(batches=): what every epoch must hold
        self._counted = True  # whether the running epoch is checked against it (not resumed)
        self._epoch = itertools.count()
        self._lock = threading.Lock()
        self._pending: Optional[tuple] = None  # (iterator, first batch) read by peek()
        # The Dataset of the latest epoch (its stats), for the user's Dataset.stats().
        self._latest: Any = None
        # Resume: a state the first epoch resumes from, and the running epoch's iterator.
        self.resume: Optional[dict] = None
        self.current: Any = None
        # The block path's open epoch by iterator token (see next_block; one at a time), and
        # the empty end-of-epoch block.
        self._ids = itertools.count(1)
        self._open: dict = {}
        self._finished = -1  # the token of the latest iteration that ended (or failed)
        self._end: list = []

    def latest_stats(self) -> Optional[tuple]:
        """``(started_at, snapshot)`` of the latest epoch read here (``Dataset.stats()``)."""
        latest = self._latest
        stats = None if latest is None else getattr(latest, "epoch_stats", None)
        return None if stats is None else (stats.started_at, stats.snapshot())

    def _start(self) -> Any:
        """The next epoch's iterator (the rest of a resumed epoch, the first time if asked)."""
        with self._lock:
            resume, self.resume = self.resume, None
            if resume is not None:
                epoch = resume["epoch"]
                self._epoch = itertools.count(epoch + 1)
            else:
                epoch = next(self._epoch)
            self._counted = resume is None  # a resumed epoch holds only the rest
        ds = self.dataset.with_context(epoch=epoch, rank=self.rank, world_size=self.world_size)
        self._latest = ds
        self.current = iter(ds) if resume is None else ds.iter_from(resume)
        return self.current

    def peek(self) -> Any:
        """Read the first batch of the first epoch now, and keep it for the first iteration."""
        iterator = self._start()
        try:
            first = next(iterator)
        except StopIteration:
            raise UsageError("the stream has no records, so the element spec of the tf.data"
                             " Dataset cannot be learnt from its first batch; give the decoder"
                             " an explicit spec") from None
        self._pending = (iterator, first)
        return first

    def _batches(self) -> Iterator[Any]:
        """The epoch's batches; with ``to_tf(batches=n)`` an epoch of another length fails here,
        naming ``batches=``, before TensorFlow's cardinality check sees it: a shorter one at
        its end, a longer one in place of its ``n``-th batch (read only once the stream shows
        whether an ``n + 1``-th follows), so that a consumer taking exactly ``n`` fails too."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            iterator, first = pending
            batches = itertools.chain([first], iterator)
        else:
            batches = self._start()
        expected = self.batches if self._counted else None
        if expected is None:
            yield from batches
            return
        batches = iter(batches)
        n = 0
        for batch in batches:
            n += 1
            if n == expected and next(batches, None) is not None:
                # Look one batch ahead before handing out the last one declared: Keras (and
                # anything else that trusts the cardinality) never asks past it, so a longer
                # epoch must fail here, while it is still being read, or not at all.
                raise UsageError(_wrong_length(expected, f"more than {expected}"))
            yield batch
        if n != expected:
            raise UsageError(_wrong_length(expected, str(n)))

    def __call__(self) -> Iterator[Any]:
        """``from_generator``'s generator off the block path: one batch per call."""
        spec = self.spec
        for batch in self._batches():
            if isinstance(batch, dict):
                yield {name: _to_tf_value(value, None if spec is None else spec.get(name),
                                          self.batched)
                       for name, value in batch.items()}
            elif isinstance(batch, SparseBatch):
                yield _to_tf_value(batch, None)
            else:
                yield batch  # raw records: bytes, or a list of bytes (tf.string)

    # -- the block path: one numpy_function call per block -----------------------------------
    def next_block(self, token: Any) -> list:
        """``[token, field arrays...]``: the next block of the iteration ``token`` names (-1: a
        new iteration, which opens the next epoch and gets a token), the arrays in the spec's
        field order. At the epoch's end (or after an error) the epoch is closed at once, and
        the end is an empty block (``k = 0``), which ``take_while`` stops at: a
        ``numpy_function`` cannot end a ``map`` or ``scan`` by raising StopIteration
        (TensorFlow reports that as an error)."""
        token = int(token)
        if token < 0:
            with self._lock:
                token = next(self._ids)
                # One iteration at a time: a stream is read in order, and a new iteration
                # means the previous one was abandoned (a break, a Keras epoch of fewer steps)
                # and its iterator dropped, which TensorFlow does not tell a numpy_function.
                stale, self._open = self._open, {token: (self._blocks(), threading.Lock())}
            for blocks, busy in stale.values():
                # A call still reading it (an iterator not dropped yet) closes it when done.
                if busy.acquire(blocking=False):
                    try:
                        blocks.close()  # its prefetch threads and sources
                    finally:
                        busy.release()
        entry = self._open.get(token)
        if entry is None and token == self._finished:
            # Called again after its end or its error (TensorFlow may ask once more).
            return [np.int64(token)] + self._end
        if entry is None:
            raise UsageError(_OVERTAKEN)
        blocks, busy = entry
        if not busy.acquire(timeout=BLOCK_CALL_WAIT_S):
            raise UsageError(f"to_tf(): waited {BLOCK_CALL_WAIT_S:g} s for another call still"
                             f" reading iteration {token}'s block (its source may be stalled;"
                             " each wait on a source is logged to the 'streamio' logger)")
        try:
            try:
                block = next(blocks)
            except BaseException as exc:
                with self._lock:
                    if self._open.get(token) is entry:
                        del self._open[token]
                        self._finished = token
                blocks.close()
                if isinstance(exc, StopIteration):
                    return [np.int64(token)] + self._end
                raise
            if self._open.get(token) is not entry:  # overtaken while reading this block
                blocks.close()
                raise UsageError(_OVERTAKEN)
        finally:
            busy.release()
        return [np.int64(token)] + [block[name] for name in self.spec]

    def block_dataset(self, signature: dict) -> Any:
        """The ``tf.data.Dataset`` of ``[k, B, ...]`` blocks, before ``unbatch()``.

        A ``scan`` carries each iterator's token (its state starts at -1 in every new
        iterator); one ``numpy_function`` per block hands the arrays over. Not
        ``from_generator``: it wraps its generator in a ``flat_map`` and checks every element
        in Python, which cost ~15% more CPU per block and ~25 ms more to start each epoch on
        2 cores (measured on constant blocks in a graph-mode loop), where the adapters
        benchmark's 200k-record epoch takes ~250 ms.
        """
        names = list(self.spec)
        specs = [signature[name] for name in names]
        dtypes = [tf.int64] + [s.dtype for s in specs]
        self._end = [np.empty((0,) + tuple(0 if d is None else d for d in s.shape[1:]),
                              dtype=s.dtype.as_numpy_dtype) for s in specs]

        def step(token: Any, _: Any) -> tuple:
            token, *arrays = tf.numpy_function(self.next_block, [token], dtypes, stateful=True)
            token.set_shape(())
            for array, spec in zip(arrays, specs):
                array.set_shape(spec.shape)
            return token, dict(zip(names, arrays))

        # range(2**62): endless in practice; take_while ends each iteration at its empty block.
        return (tf.data.Dataset.range(2 ** 62)
                .scan(tf.constant(-1, tf.int64), step)
                .take_while(lambda block: tf.shape(block[names[0]])[0] > 0))

    def _blocks(self) -> Iterator[dict]:
        """Runs of up to ``block`` consecutive batches of one size, stacked: a batch of another
        size (the last, partial one) ends the run and starts the next, so unbatching gives back
        exactly the batches, in order."""
        spec, limit = self.spec, self.block
        first = next(iter(spec))
        run: list = []
        rows = -1
        batches = self._batches()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception:
                # The batches read before a fault are delivered before the error, as they are
                # one per call.
                if run:
                    yield _stack(run, spec)
                raise
            n = len(batch[first])
            if run and (n != rows or len(run) == limit):
                yield _stack(run, spec)
                run = []
            run.append(batch)
            rows = n
        if run:
            yield _stack(run, spec)


def _wrong_length(expected: int, held: str) -> str:
    return (f"to_tf(batches={expected}): this epoch of the stream held {held} batches. Pass"
            " batches= the number of batches every epoch holds (records per epoch / batch size,"
            " rounded up unless drop_last), or leave batches= out: training works the same, and"
            " Keras warns once that the input ran out of data")


def to_tf(dataset: Any, *, input_context: Any = None, batches: Optional[int] = None) -> Any:
    return _to_tf(dataset, input_context=input_context, batches=batches)[0]


def _to_tf(dataset: Any, *, input_context: Any = None, batches: Optional[int] = None,
           resume: Optional[dict] = None) -> tuple:
    """``dataset`` as a ``tf.data.Dataset`` whose ``element_spec`` is exact (see the module doc).

    ``input_context``: a ``tf.distribute.InputContext`` (what
    ``strategy.distribute_datasets_from_function`` passes): input pipeline ``i`` of ``n`` reads
    ``dataset.shard(n, i)``, and its shuffle seeds derive from ``i``. Works with ``.map``,
    ``.prefetch(tf.data.AUTOTUNE)`` and ``model.fit`` (map batches to ``(x, y)`` for Keras).

    ``batches``: the number of items (batches) every epoch holds, if you know it: the result then
    has that cardinality, which Keras needs to end epochs without its "Your input ran out of
    data" warning; an epoch of another length raises (see the module doc).
    """
    for name in ("with_context", "shard", "sources"):
        if not hasattr(dataset, name):
            raise UsageTypeError(f"to_tf needs a streamio Dataset, not {type(dataset).__name__}")
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int)):
        raise UsageTypeError(f"batches must be an int or None, not {type(batches).__name__}")
    if batches is not None and batches < 1:
        raise UsageError(f"batches must be >= 1, not {batches}")
    owner = dataset
    rank, world_size = 0, 1
    if input_context is not None:
        try:
            world_size = int(input_context.num_input_pipelines)
            rank = int(input_context.input_pipeline_id)
        except AttributeError:
            raise UsageTypeError("input_context must be a tf.distribute.InputContext, not"
                            f" {type(input_context).__name__}") from None
        if world_size > 1:
            for group in source_groups(dataset):  # a mix: each pipeline shards every input
                check_splittable(group, world_size,
                                 f"{world_size} tf.distribute input pipelines",
                                 "read it in one input pipeline")
            dataset = dataset.shard(world_size, rank)
    batched = getattr(dataset, "batch_size", None) is not None
    # Without batch() a decoder's items are its rows (streamio.pipeline.items): one example each.
    decoder = getattr(dataset, "decoder", None)
    source = _EpochSource(dataset, rank, world_size)
    source.batched = batched
    if resume is not None:
        from ..pipeline.resume import check_fields

        check_fields(resume)  # its epoch is read before the pipeline checks the rest
    source.resume = resume
    source.batches = batches
    adopt = getattr(owner, "add_stats_provider", None)
    if adopt is not None:
        adopt(source)
    spec = None
    if getattr(dataset, "maps_items", False):
        # A map() makes items of its own kind: learn the spec from the first one (peeked, so
        # it is not lost and no extra epoch of a FIFO is read).
        first = source.peek()
        if isinstance(first, dict):
            source.spec = _spec_from_batch(first, batched)
        tfds = tf.data.Dataset.from_generator(source,
                                              output_signature=_signature_of(first, batched))
        if batches is not None:
            tfds = tfds.apply(tf.data.experimental.assert_cardinality(batches))
        return tfds, source
    if decoder is not None:
        spec = decoder.output_spec()
        if spec is None:
            spec = _spec_from_batch(source.peek(), batched)
    source.spec = spec
    signature = element_spec(spec, batched=batched)
    if batched and _fixed_shape(spec):
        source.block = _block_batches(spec, dataset.batch_size)
    if source.block > 1:
        tfds = source.block_dataset(_blocked_signature(signature)).prefetch(BLOCK_PREFETCH)
        tfds = tfds.unbatch()  # back to the batches: [k, B, ...] -> k x [B, ...]
    else:
        tfds = tf.data.Dataset.from_generator(source, output_signature=signature)
    if batches is not None:
        tfds = tfds.apply(tf.data.experimental.assert_cardinality(batches))
    return tfds, source


# -- resume with Keras ----------------------------------------------------------------------------
def resume_callback(path: str, *, every: int = 100) -> Any:
    """A Keras callback that saves where the input stream stands, and resumes from it.

    ::

        resume = resume_callback("ckpt/stream.json", every=500)
        tfds = resume.to_tf(ds)                  # resumes from the file if it exists
        model.fit(tfds.map(to_xy), epochs=10, initial_epoch=resume.initial_epoch,
                  callbacks=[resume, keras.callbacks.ModelCheckpoint(..., save_freq=500)])

    The state (a small JSON file, written atomically) is taken from the batches Keras has
    *trained on* (``on_train_batch_end``), not from what tf.data has prefetched, every
    ``every`` steps and at each epoch's end (then it points at the next epoch's start). Save
    the model at the same steps (``ModelCheckpoint(save_freq=every)``): the stream state and
    the weights must describe the same step. A restarted run gets the rest of the interrupted
    epoch exactly (see :mod:`streamio.pipeline.resume`), then the following epochs; pass
    ``initial_epoch`` so that Keras numbers them alike. ``to_tf`` keywords as :func:`to_tf`.
    """
    import json
    import os

    from ..pipeline.resume import check_fields

    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UsageError(f"every must be an int >= 1, not {every!r}")
    path = os.fspath(path)

    class StreamResume(tf.keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.path = path
            self.every = every
            self.state: Optional[dict] = None
            if os.path.exists(path):
                try:
                    with open(path, encoding="utf-8") as f:
                        self.state = check_fields(json.load(f))
                except (ValueError, UsageTypeError) as exc:  # not JSON, not UTF-8, not a state
                    raise UsageError(f"resume_callback: {path} holds no resume state ({exc})"
                                     ) from None
            #: The epoch to pass to ``model.fit(initial_epoch=...)``.
            self.initial_epoch = 0 if self.state is None else int(self.state["epoch"])
            self._source: Any = None
            self._saved_at = 0

        def to_tf(self, dataset: Any, **kwargs: Any) -> Any:
            tfds, self._source = _to_tf(dataset, resume=self.state, **kwargs)
            return tfds

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._saved_at = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            steps = batch + 1  # steps trained in this epoch (Keras counts from 0 each epoch)
            if steps - self._saved_at >= self.every:
                self._save(steps, next_epoch=False)
                self._saved_at = steps

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._save(0, next_epoch=True)

        def _save(self, steps: int, *, next_epoch: bool) -> None:
            it = None if self._source is None else self._source.current
            if it is None or not callable(getattr(it, "state_after", None)):
                raise UsageError("resume_callback: make the tf.data Dataset with its to_tf()")
            state = it.state_after(steps, next_epoch=next_epoch)
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(tmp, self.path)  # a crash mid-write leaves the previous state whole

    return StreamResume()

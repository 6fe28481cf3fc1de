"""Framework adapters: a streamio ``Dataset`` as a PyTorch ``IterableDataset`` or a ``tf.data``
source.

``adapters.torch`` imports PyTorch and ``adapters.tf`` imports TensorFlow; nothing else in
streamio imports either, and this package imports neither (``Dataset.to_torch()`` /
``Dataset.to_tf()`` import the adapter module when they are called). A missing framework raises
:class:`~streamio.errors.MissingDependencyError`, which names the ``pip install`` that fixes it.
The torch path never imports TensorFlow: a process that imported TensorFlow and then forks
DataLoader workers can deadlock.

What both adapters share lives here: which sources several readers can split.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Sequence

from ..errors import UsageError
from ..sources import ByteSource, PipeChannel, source_name
from ..sources.schemes import local_path

__all__ = ["check_splittable", "is_single_stream", "source_groups"]


def is_single_stream(source: Any) -> bool:
    """True for a source that only one process can read, because reading it consumes it: a FIFO,
    a :class:`~streamio.PipeChannel`, stdin, a file object or an open ``ByteSource``."""
    if isinstance(source, (PipeChannel, ByteSource)):
        return True
    if isinstance(source, (bytes, bytearray, memoryview)):
        return False
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text == "-":
            return True
        path = local_path(text)
        if path is None:
            return False  # a URL: each reader makes its own request
        try:
            return stat.S_ISFIFO(os.stat(path).st_mode)
        except OSError:
            return False  # missing: the reader will raise a SourceError that names it
    return True  # a file object


def source_groups(dataset: Any) -> list:
    """The groups of sources that readers split one by one: a Dataset's sources, or for a mix
    (:func:`streamio.mix`, whose ``inputs`` each reader shards) each input's."""
    inputs = getattr(dataset, "inputs", None)
    if inputs is None:
        return [tuple(dataset.sources)]
    return [group for inp in inputs for group in source_groups(inp)]


def check_splittable(sources: Sequence[Any], readers: int, who: str, fix: str) -> None:
    """Raise :class:`UsageError` if ``readers`` readers cannot split ``sources`` exactly once;
    ``who`` says who the readers are and ``fix`` how to have one reader.

    With at least as many sources as readers each reader takes whole sources, which works for any
    source. With fewer, each reader reads a byte range of every source that allows one (see
    :meth:`Dataset.shard`) and otherwise reads it all, keeping a round-robin share of the
    records, which a single stream cannot allow (the readers would steal each other's bytes).
    """
    if readers <= 1 or len(sources) >= readers:
        return
    streams = [source_name(s) for s in sources if is_single_stream(s)]
    if streams:
        raise UsageError(
            f"{streams[0]} is a single stream (FIFO, PipeChannel, stdin or file object) that"
            f" cannot be split between {readers} readers ({who}): {fix}, or give at least as many"
            " sources (files, or one FIFO per reader) as readers")

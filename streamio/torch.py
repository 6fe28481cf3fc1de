"""The PyTorch side of streamio: ``from streamio.torch import to_device``.

Importing this module imports PyTorch (never TensorFlow); without PyTorch it raises
:class:`~streamio.errors.MissingDependencyError`, which names the ``pip install`` that fixes it.
The implementation lives in :mod:`streamio.adapters.torch`.
"""

from .adapters.torch import (DEFAULT_DEPTH, DEFAULT_EVEN_BATCHES, DevicePrefetcher, StreamDataset,
                             convert_batch, even_batches, to_device, to_torch)

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_EVEN_BATCHES",
    "DevicePrefetcher",
    "StreamDataset",
    "convert_batch",
    "even_batches",
    "to_device",
    "to_torch",
]

"""streamio for Ray Data: ``import streamio.ray``.

``streamio.ray.read(sources, format, decoder=...)`` gives a ``ray.data.Dataset``;
``streamio.ray.write(ds, path_prefix, format)`` writes one as TFRecord / RecordIO shards.
Importing this module imports Ray (``import streamio`` never does); without Ray it raises
:class:`~streamio.errors.MissingDependencyError`, which names ``pip install 'streamio[ray]'``.
The implementation and its rules live in :mod:`streamio.adapters.ray`.
"""

from .adapters.ray import Datasink, Datasource, batch_to_arrow, read, write

__all__ = ["Datasink", "Datasource", "batch_to_arrow", "read", "write"]

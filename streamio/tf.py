"""The TensorFlow side of streamio: ``from streamio.tf import resume_callback``.

Importing this module imports TensorFlow (never PyTorch); without TensorFlow it raises
:class:`~streamio.errors.MissingDependencyError`, which names the ``pip install`` that fixes it.
The implementation lives in :mod:`streamio.adapters.tf` (an import path that keeps working);
``Dataset.to_tf()`` is the usual way in.
"""

from .adapters.tf import element_spec, resume_callback, to_tf

__all__ = [
    "element_spec",
    "resume_callback",
    "to_tf",
]

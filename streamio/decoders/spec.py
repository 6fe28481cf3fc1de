"""What a decoder produces, described before (or after) the first batch.

A pipeline stage or adapter (``tf.data`` needs an ``output_signature`` before it sees data) asks
``decoder.output_spec()`` for a ``{name: FieldSpec}`` mapping; ``None`` means the decoder learns its
outputs from the data (a header row, the first RecordIO-protobuf record) and knows them only
after its first batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

import numpy as np

from ..errors import UsageError

__all__ = ["FieldSpec"]

FieldKind = Literal["dense", "sparse", "object"]
_KINDS = ("dense", "sparse", "object")


@dataclass(frozen=True)
class FieldSpec:
    """One output of a decoder: ``batch[name]`` for every batch.

    ``kind``: ``"dense"`` (a numpy array), ``"sparse"`` (a :class:`~streamio.SparseBatch`) or
    ``"object"`` (a numpy object array of ``bytes`` or ``str``). ``dtype``: the numpy dtype
    (``np.dtype(object)`` for object fields). ``shape``: the shape of one example, without the
    batch dimension; ``None`` for a dimension that varies from batch to batch (the padded length
    of a ``VarLen`` feature).
    """

    kind: FieldKind
    dtype: np.dtype
    shape: Tuple[Optional[int], ...]

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise UsageError(f"FieldSpec kind must be one of {_KINDS}, not {self.kind!r}")
        # Normalise so that specs compare equal however the dtype was spelled.
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in self.shape))

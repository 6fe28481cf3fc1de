"""Decoders: a batch of records -> a dict of numpy columns (the hot path of a training input).

Every decoder has ``decode_batch(records, *, source=None, first_index=0)`` returning
``{name: np.ndarray | SparseBatch}``, ``output_spec()`` returning ``{name: FieldSpec}`` (or
``None`` until the first batch has been seen), and ``fresh()`` returning a decoder in its initial
state for a new stream (an epoch of a headered CSV starts with a header again). Decoders are
picklable and cheap to copy, so DataLoader workers can each hold one.
"""

from .csv import Csv
from .example import Example, FixedLen, SequenceExample, VarLen, encode_example
from .image import Image, ImageRecord, RandomResizedCrop, encode_image_record
from .recordio_protobuf import RecordIOProtobuf, encode_recordio_protobuf
from .sparse import SparseBatch
from .spec import FieldSpec

__all__ = [
    "Csv",
    "Example",
    "FieldSpec",
    "FixedLen",
    "Image",
    "ImageRecord",
    "RandomResizedCrop",
    "RecordIOProtobuf",
    "SequenceExample",
    "SparseBatch",
    "VarLen",
    "encode_example",
    "encode_image_record",
    "encode_recordio_protobuf",
]

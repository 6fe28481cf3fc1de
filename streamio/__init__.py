"""streamio: stream CSV, TFRecord and RecordIO records from pipes, HTTP and files into training.

The public surface is re-exported here; everything else is private or lives in a subpackage.
Framework adapters are imported only when used (``Dataset.to_torch()``, ``Dataset.to_tf()``,
``streamio.torch``), so ``import streamio`` imports neither PyTorch nor TensorFlow.
"""

from __future__ import annotations

from . import errors
from .decoders import (Csv, Example, FieldSpec, FixedLen, RecordIOProtobuf, SequenceExample,
                       SparseBatch, VarLen, encode_example)
from .errors import (CorruptRecordError, DecodeError, FormatError, MapError,
                     MissingDependencyError, RecordTooLargeError, SourceError, StreamioError,
                     TruncatedStreamError, UsageError)
from .pipeline import Dataset
from .reader import RecordReader, read_records, write_recordio_protobuf, write_records
from .sources import PipeChannel

__version__ = "0.1.0"

__all__ = [
    "CorruptRecordError",
    "Csv",
    "Dataset",
    "DecodeError",
    "Example",
    "FieldSpec",
    "FixedLen",
    "FormatError",
    "MapError",
    "MissingDependencyError",
    "PipeChannel",
    "RecordIOProtobuf",
    "RecordReader",
    "RecordTooLargeError",
    "SequenceExample",
    "SourceError",
    "SparseBatch",
    "StreamioError",
    "TruncatedStreamError",
    "UsageError",
    "VarLen",
    "encode_example",
    "errors",
    "read_records",
    "write_recordio_protobuf",
    "write_records",
]

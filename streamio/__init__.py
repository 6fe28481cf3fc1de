"""streamio: stream CSV, TFRecord and RecordIO records from pipes, HTTP and files into training.

The public surface is re-exported here; everything else is private or lives in a subpackage.
Framework adapters are imported only when used (``Dataset.to_torch()``, ``Dataset.to_tf()``,
``streamio.torch``, ``streamio.tf``), so ``import streamio`` imports neither PyTorch nor TensorFlow.
"""

from __future__ import annotations

from . import errors
from .decoders import (Csv, Example, FieldSpec, FixedLen, Image, ImageRecord, RandomResizedCrop,
                       RecordIOProtobuf, SequenceExample, SparseBatch, VarLen, encode_example,
                       encode_image_record)
from .errors import (CorruptRecordError, DecodeError, FormatError, MapError,
                     MissingDependencyError, RecordTooLargeError, SourceError, SplitError,
                     StreamioError, TruncatedStreamError, UsageError, UsageTypeError)
from .pipeline import Dataset
from .pipeline.mix import mix
from .reader import RecordReader, read_records, write_recordio_protobuf, write_records
from .sources import PipeChannel
from .tools.diagnose import diagnose
from .tools.pack import pack

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
    "Image",
    "ImageRecord",
    "MapError",
    "MissingDependencyError",
    "PipeChannel",
    "RandomResizedCrop",
    "RecordIOProtobuf",
    "RecordReader",
    "RecordTooLargeError",
    "SequenceExample",
    "SourceError",
    "SparseBatch",
    "SplitError",
    "StreamioError",
    "TruncatedStreamError",
    "UsageError",
    "UsageTypeError",
    "VarLen",
    "diagnose",
    "encode_example",
    "encode_image_record",
    "errors",
    "mix",
    "pack",
    "read_records",
    "write_recordio_protobuf",
    "write_records",
]

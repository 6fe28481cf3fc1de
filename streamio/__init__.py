"""streamio: stream CSV, TFRecord and RecordIO records from pipes, HTTP and files into training.

The public surface is re-exported here; everything else is private or lives in a subpackage.
"""

from __future__ import annotations

from . import errors
from .errors import (CorruptRecordError, FormatError, RecordTooLargeError, SourceError,
                     StreamioError, TruncatedStreamError)
from .reader import RecordReader, read_records, write_records
from .sources import PipeChannel

__version__ = "0.1.0"

__all__ = sorted([
    "CorruptRecordError",
    "FormatError",
    "PipeChannel",
    "RecordReader",
    "RecordTooLargeError",
    "SourceError",
    "StreamioError",
    "TruncatedStreamError",
    "errors",
    "read_records",
    "write_records",
])

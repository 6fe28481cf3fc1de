"""Sans-IO framers: bytes in, records out. Nothing here does I/O.

``FORMATS`` maps a format name to a factory ``(options) -> framer``; registering a new format is
one module plus one :func:`register_format` line.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

from ._base import DEFAULT_MAX_RECORD_SIZE, ON_ERROR_CHOICES, check_common
# Records still in a read buffer and their CRC check: the seam a consumer of a reader's spans
# (streamio.mix) uses, public here so that it need not reach into _framing.
from ._framing import RecordSpans, masked_crc_matches
from .recordio import MULTIPART_CHOICES, RecordIOFramer, encode_recordio
from .sagemaker_wrapping import ManifestGroupFramer
from .text import TextRowFramer
from .tfrecord import TFRecordFramer, encode_tfrecord, masked_crc32c
from .whole_object import WholeObjectFramer
from ..errors import UsageError, UsageTypeError

FramerFactory = Callable[..., Any]

#: name -> (factory, names of the format options it accepts beyond the common ones)
FORMATS: dict[str, tuple[FramerFactory, frozenset]] = {}


#: File name suffixes that name a format (after any compression suffix), for the command-line
#: tools, which may guess the format from a name; the library's readers take it as given.
SUFFIX_FORMATS = {".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfrec": "tfrecord",
                  ".rec": "recordio", ".recordio": "recordio", ".csv": "csv", ".txt": "lines",
                  ".jsonl": "lines", ".ndjson": "lines"}


def register_format(name: str, factory: FramerFactory, options: frozenset = frozenset()) -> None:
    """Make ``format=name`` available to the readers; ``options`` lists accepted extra keywords."""
    FORMATS[name] = (factory, frozenset(options))


def _tfrecord(*, verify, on_error, max_record_size, source, multipart):
    return TFRecordFramer(verify=verify, on_error=on_error, max_record_size=max_record_size,
                          source=source)


def _recordio(*, verify, on_error, max_record_size, source, multipart):
    return RecordIOFramer(multipart=multipart, on_error=on_error,
                          max_record_size=max_record_size, source=source)


def _csv(*, verify, on_error, max_record_size, source, multipart, quotechar='"', delimiter=",",
         csv_quoted_newlines=True):
    # csv_quoted_newlines=False: the user's word that no row holds a quoted line break, so a row
    # starts after every line feed and a shard may split the file by byte range. Framing itself
    # still honours quotes.
    if not isinstance(csv_quoted_newlines, bool):
        raise UsageTypeError(f"csv_quoted_newlines must be True or False, not"
                             f" {csv_quoted_newlines!r}")
    return TextRowFramer(quotechar=quotechar, delimiter=delimiter, keep_blank=False,
                         csv_rows=True, on_error=on_error, max_record_size=max_record_size,
                         source=source)


def _lines(*, verify, on_error, max_record_size, source, multipart):
    return TextRowFramer(quotechar=None, keep_blank=True, csv_rows=False, on_error=on_error,
                         max_record_size=max_record_size, source=source)


def _manifest(*, verify, on_error, max_record_size, source, multipart, attributes):
    return ManifestGroupFramer(attributes=attributes, on_error=on_error,
                               max_record_size=max_record_size, source=source)


def _object(*, verify, on_error, max_record_size, source, multipart):
    return WholeObjectFramer(max_record_size=max_record_size, source=source)


register_format("tfrecord", _tfrecord)
register_format("recordio", _recordio)
# The delimiter matters to framing: a quote opens a quoted field only at the start of a field.
register_format("csv", _csv, frozenset({"quotechar", "delimiter", "csv_quoted_newlines"}))
register_format("lines", _lines)
# SageMaker channels (streamio.sagemaker picks these from the channel's config): augmented
# manifest lines regrouped from their RecordIO-wrapped attributes, and a whole object as one
# record (images).
register_format("sagemaker-manifest", _manifest, frozenset({"attributes"}))
register_format("object", _object)


def _did_you_mean(name: Any) -> str:
    """``" (did you mean 'tfrecord'?)"`` for a near miss (``'tfrecords'``, ``'TFRecord'``)."""
    if not isinstance(name, str):
        return ""
    lowered = {known.lower(): known for known in FORMATS}
    close = difflib.get_close_matches(name.lower(), sorted(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def make_framer(format: str, *, source: str, verify: bool = True, on_error: str = "raise",
                max_record_size: int = DEFAULT_MAX_RECORD_SIZE, multipart: str = "dmlc",
                **format_options):
    """Build the framer for ``format``; unknown formats and options raise at once."""
    try:
        factory, accepted = FORMATS[format]
    except (KeyError, TypeError):
        raise UsageError(f"unknown format {format!r}{_did_you_mean(format)}; known formats:"
                         f" {sorted(FORMATS)}") from None
    unknown = set(format_options) - accepted
    if unknown:
        raise UsageTypeError(f"format {format!r} takes no option(s) {sorted(unknown)}"
                        + (f"; it accepts {sorted(accepted)}" if accepted else ""))
    if multipart not in MULTIPART_CHOICES:
        raise UsageError(f"multipart must be one of {MULTIPART_CHOICES}, not {multipart!r}")
    return factory(verify=verify, on_error=on_error, max_record_size=max_record_size,
                   source=source, multipart=multipart, **format_options)


__all__ = [
    "DEFAULT_MAX_RECORD_SIZE", "FORMATS", "ON_ERROR_CHOICES", "RecordIOFramer", "RecordSpans",
    "SUFFIX_FORMATS", "TFRecordFramer", "TextRowFramer", "check_common", "encode_recordio",
    "encode_tfrecord", "make_framer", "masked_crc32c", "masked_crc_matches", "register_format",
]

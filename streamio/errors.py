"""The exceptions streamio raises: every one raised on purpose derives from StreamioError::

    StreamioError
     +-- FormatError            the bytes are wrong (attributes: source, offset, record_index)
     |    +-- CorruptRecordError     a checksum, magic number or part sequence does not check out
     |    +-- TruncatedStreamError   the stream ends inside a record (or an open CSV quote)
     |    +-- RecordTooLargeError    a length field exceeds ``max_record_size`` (nothing allocated)
     |    +-- SplitError             a byte-range split cannot be made (split_offset, next_start)
     |    +-- DecodeError            a well-framed record does not decode (attribute: field)
     +-- SourceError            reading failed (I/O, HTTP status, timeouts); ``__cause__`` is why
     +-- MapError               a ``map``/``filter`` function raised (item_index; ``__cause__``)
     +-- UsageError             a bad argument value or impossible use; also a ``ValueError``
     |    +-- ConfigError            a SageMaker input configuration is wrong (path, key)
     +-- UsageTypeError         a wrong type, unknown keyword or unsupported operation; also a
     |                          ``TypeError`` (not a ``ValueError``)
     +-- MissingDependencyError an optional dependency is missing; the message says which
     |                          ``pip install`` fixes it (also an ``ImportError``)
     +-- PackError              a file could not be packed (path; ``streamio.tools.pack``)

Usage mistakes are also the built-in exceptions they used to be, so ``except ValueError`` /
``except TypeError`` code keeps working and ``except StreamioError`` catches them all.
``offset`` is the byte offset in the *decompressed* stream where the faulty record starts (or
where the fault was found, if no record start is known); ``record_index`` is the record's 0-based
index among all records of its source, delivered or skipped; either is ``None`` where the layer
that raised cannot know it (a decoder sees records, not bytes). Every class takes its message as
``message=`` too, and ``error.message`` is ``str(error)`` (why: :class:`_Message`).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "ConfigError",
    "CorruptRecordError",
    "DecodeError",
    "FormatError",
    "MapError",
    "MissingDependencyError",
    "PackError",
    "RecordTooLargeError",
    "SourceError",
    "SplitError",
    "StreamioError",
    "StreamioWarning",
    "TruncatedStreamError",
    "UsageError",
    "UsageTypeError",
]


class _Message:
    """``error.message``: the error's text. A non-data descriptor, so it is truthy on the class
    and a subclass may still assign ``self.message``.

    PyTorch's DataLoader re-raises a worker's exception as ``type(message=...)`` when the type
    has a ``message`` attribute, and otherwise from a local variable, which makes a reference
    cycle (exception -> traceback -> frame -> exception) that keeps the failed epoch's
    DataLoader iterator alive until the garbage collector runs, possibly inside the next epoch's
    forked workers, where its ``__del__`` fails with "AssertionError: can only test a child
    process".
    """

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else str(obj)


class StreamioError(Exception):
    """Root of every exception streamio raises on purpose."""

    message = _Message()

    def __init__(self, *args: Any, message: Optional[str] = None) -> None:
        super().__init__(*((message,) if message is not None else ()), *args)


class StreamioWarning(UserWarning):
    """What streamio tells without stopping: records skipped with ``on_error="warn"``, a
    source dealt round-robin to shards, a cache that is stale or that epochs stop before
    filling."""


class FormatError(StreamioError):
    """The stream's bytes do not follow the format.

    The message names the source, the byte offset and the record; the same facts are kept as
    attributes so that code can act on them.
    """

    def __init__(
        self,
        message: str,
        *,
        source: Optional[str] = None,
        offset: Optional[int] = None,
        record_index: Optional[int] = None,
    ) -> None:
        self.reason = message
        self.source = source
        self.offset = offset
        self.record_index = record_index
        super().__init__(self._describe())

    def _where(self) -> list[str]:
        where = []
        if self.source is not None:
            where.append(f"source {self.source}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        if self.record_index is not None:
            where.append(f"record {self.record_index}")
        return where

    def _describe(self) -> str:
        where = self._where()
        return f"{self.reason} ({', '.join(where)})" if where else self.reason

    def __reduce__(self):  # keep attributes across pickling (DataLoader workers, prefetch)
        return (_rebuild_format_error, (type(self), self.reason, self.__dict__.copy()))


def _rebuild_format_error(cls, reason, state):
    err = cls.__new__(cls)
    Exception.__init__(err, reason)
    err.__dict__.update(state)
    err.args = (err._describe(),)
    return err


class CorruptRecordError(FormatError):
    """A checksum, magic number or multi-part sequence does not check out."""


class TruncatedStreamError(FormatError):
    """The stream ended inside a record."""


class RecordTooLargeError(FormatError):
    """A record is larger than ``max_record_size``; raised before anything is allocated."""


class SplitError(FormatError):
    """A byte-range split cannot be made from the bytes: the next range's reader would start
    inside a record of the range before, where TFRecord frames in the payload chain over
    ``CONFIRM_BYTES`` (TFRecord data stored as a record), and read them as records.

    Raised by the reader of the range before, whatever ``on_error`` says, after its records
    (the file itself may be sound). ``offset``/``record_index`` name that reader's record
    holding the chain (the index counts from the range's first record, as in every error of a
    range reader), ``split_offset`` the split point, ``next_start`` where the next range's
    reader starts. The fix: an index beside the file (``streamio index FILE``), or shards of
    whole files.
    """

    def __init__(self, message: str, *, source: Optional[str] = None,
                 offset: Optional[int] = None, record_index: Optional[int] = None,
                 split_offset: Optional[int] = None, next_start: Optional[int] = None) -> None:
        self.split_offset = split_offset
        self.next_start = next_start
        super().__init__(message, source=source, offset=offset, record_index=record_index)


class DecodeError(FormatError):
    """A well-framed record does not decode; ``field`` names the feature or column if known."""

    def __init__(
        self,
        message: str,
        *,
        source: Optional[str] = None,
        offset: Optional[int] = None,
        record_index: Optional[int] = None,
        field: Optional[str] = None,
    ) -> None:
        self.field = field
        super().__init__(message, source=source, offset=offset, record_index=record_index)

    def _where(self) -> list[str]:
        where = super()._where()
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return where


class SourceError(StreamioError):
    """Reading from the source failed; ``source`` names it and ``__cause__`` holds the cause."""

    def __init__(self, message: str, *, source: Optional[str] = None) -> None:
        self.source = source
        super().__init__(f"{message} (source {source})" if source is not None else message)


class MapError(StreamioError):
    """A function given to ``Dataset.map()`` or ``filter()`` raised; ``__cause__`` is what it
    raised (with its traceback; from a process, the child's traceback as text).

    ``source``/``record_index`` name the record when the item was a record (before ``batch()``);
    ``item_index`` is the item's position among the items that reached the stage this epoch (in
    this reader: a DataLoader worker counts its own). Data errors a function raises
    (:class:`FormatError`, e.g. a decoder's ``DecodeError``) are not wrapped: see
    :mod:`streamio.pipeline.parallel`.
    """

    def __init__(self, message: str, *, source: Optional[str] = None,
                 record_index: Optional[int] = None, item_index: Optional[int] = None) -> None:
        self.reason = message
        self.source = source
        self.record_index = record_index
        self.item_index = item_index
        where = []
        if source is not None:
            where.append(f"source {source}")
        if record_index is not None:
            where.append(f"record {record_index}")
        if item_index is not None:
            where.append(f"item {item_index} of the stage")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)

    def __reduce__(self):  # keep attributes across pickling (DataLoader workers)
        return (_rebuild_map_error, (self.reason, self.source, self.record_index,
                                     self.item_index))


def _rebuild_map_error(reason, source, record_index, item_index):
    return MapError(reason, source=source, record_index=record_index, item_index=item_index)


class UsageError(StreamioError, ValueError):
    """A bad argument value, or the API used in a way that cannot work (re-reading a consumed
    stream, for example). Also a ``ValueError``."""


class UsageTypeError(StreamioError, TypeError):
    """An argument of the wrong type, an unknown keyword argument, or an operation a stream does
    not support (``len(dataset)``). Also a ``TypeError``, not a ``ValueError``, so ``except
    ValueError`` code sees type mistakes exactly as before."""


class MissingDependencyError(StreamioError, ImportError):
    """An optional dependency is missing; the message names the ``pip install`` that fixes it."""

    def __init__(self, module: str = "", extra: str = "", *,
                 message: Optional[str] = None) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            message if message is not None else
            f"{module} is required for this feature: pip install 'streamio[{extra}]'"
            f" (or pip install {module})"
        )


class ConfigError(UsageError):
    """The container's input configuration is missing, malformed or names something unknown.

    ``path`` is the file (or environment variable) and ``key`` the entry at fault, when known.
    """

    def __init__(self, message: str, *, path: Optional[str] = None,
                 key: Optional[str] = None) -> None:
        self.path = path
        self.key = key
        where = ", ".join(x for x in (path and f"in {path}", key and f"key {key!r}") if x)
        super().__init__(f"{message} ({where})" if where else message)


class PackError(StreamioError):
    """A file could not be packed (``path`` names it) or the pack cannot go on."""

    def __init__(self, message: str, *, path: Optional[str] = None) -> None:
        self.path = path
        super().__init__(f"{message}: {path}" if path else message)


def require(module: str, extra: str):
    """Import an optional dependency or raise :class:`MissingDependencyError`."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(module, extra) from exc

"""The shared stream's wire protocol, as data: encoders and parsers that do no I/O.

Everything a reader or the dealer receives is input, not code (another process wrote it): it is
parsed with ``struct`` and JSON, checked against the limits below, and anything that does not fit
is a :class:`~streamio.errors.SourceError` saying what was wrong. Nothing is unpickled.

Client -> dealer: a hello, then one byte per request (``W``) and a goodbye (``B``)::

    hello  = b"sio\\x02" | u32 local rank | u32 worker | u32 the rank's num_workers
             | u32 local world size | u32 flags                          (little-endian)

flags: ``BROADCAST`` (1): the reader replays an elastic resume and takes every block;
``DONE`` (2): the reader's share was delivered before a resume and it takes none.

Dealer -> client: messages of ``u8 kind | 3 zero bytes | u32 count | u64 payload size``:

- BLOCK (1): ``count`` records; payload = u32 source-name length, the name (UTF-8), ``count``
  record origins (i64 each), ``count`` record lengths (u64 each), the records;
- END (2): no payload;
- KEEPALIVE (4): no payload; the dealer is alive and has nothing for the reader yet (sent to a
  reader that asked and waits, so that a reader can tell a dealer waiting on its stream or on
  other readers from one that stopped: see :mod:`streamio.sharing.stream`);
- ERROR (3): payload = a JSON object ``{"type", "message", "fields", "rank", "worker"}``:
  the exception's class name, its text, its attributes (strings, ints or null) and which reader
  it concerns. Only streamio's own error classes are rebuilt; any other name becomes a
  ``SourceError`` quoting it.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Optional

import numpy as np

from .. import errors
from ..errors import SourceError, StreamioError

HELLO_MAGIC = b"sio\x02"
HELLO = struct.Struct("<4sIIIII")
BROADCAST, DONE = 1, 2
HEADER = struct.Struct("<BxxxIQ")
BLOCK, END, ERROR, KEEPALIVE = 1, 2, 3, 4
WANT, BYE = b"W", b"B"

#: Sanity bounds on a hello: a local world or a DataLoader larger than this is not a reader.
MAX_READERS_PER_RANK = 4096
MAX_LOCAL_WORLD = 4096
#: An ERROR's JSON text is at most this long (a message naming a few sources).
MAX_ERROR_BYTES = 64 << 10

#: The attributes of an error that travel with it (plain values only).
_FIELDS = ("source", "offset", "record_index", "field", "item_index", "reason")


class Hello(tuple):
    """``(local_rank, worker, num_workers, local_world, flags)`` of a reader's hello."""

    __slots__ = ()

    @property
    def who(self) -> tuple:
        return self[0], self[1]

    @property
    def flags(self) -> int:
        return self[4]


def encode_hello(local_rank: int, worker: int, num_workers: int, local_world: int,
                 flags: int = 0) -> bytes:
    return HELLO.pack(HELLO_MAGIC, local_rank, worker, num_workers, local_world, flags)


class ClientParser:
    """The dealer's view of one client's bytes: ``feed(data)`` returns the events they complete
    (a :class:`Hello` first, then ``"want"`` / ``"bye"``); bytes that are not the protocol raise
    ``SourceError``. Holds at most one partial hello (24 bytes)."""

    def __init__(self) -> None:
        self.hello: Optional[Hello] = None
        self._partial = b""

    def feed(self, data: bytes) -> list:
        events: list = []
        if self.hello is None:
            data = self._partial + bytes(data)
            if len(data) < HELLO.size:
                if not HELLO_MAGIC.startswith(data[:len(HELLO_MAGIC)]):
                    raise SourceError(f"not a streamio hello: {data[:8]!r}")
                self._partial = data
                return events
            self._partial = b""
            self.hello = parse_hello(data[:HELLO.size])
            events.append(self.hello)
            data = data[HELLO.size:]
        for byte in data:
            if byte == WANT[0]:
                events.append("want")
            elif byte == BYE[0]:
                events.append("bye")
            else:
                raise SourceError(f"unexpected byte {byte:#04x} after the hello")
        return events


def parse_hello(data: bytes) -> Hello:
    magic, rank, worker, num_workers, local_world, flags = HELLO.unpack(data)
    if magic != HELLO_MAGIC:
        raise SourceError(f"not a streamio hello: {bytes(data[:8])!r}")
    if flags & ~(BROADCAST | DONE):
        raise SourceError(f"a hello with unknown flags {flags:#x}")
    if not 0 < local_world <= MAX_LOCAL_WORLD or rank >= local_world:
        raise SourceError(f"a hello for local rank {rank} of {local_world}")
    if not 0 < num_workers <= MAX_READERS_PER_RANK or worker >= num_workers:
        raise SourceError(f"a hello for worker {worker} of {num_workers}")
    return Hello((rank, worker, num_workers, local_world, flags))


# -- dealer -> client ------------------------------------------------------------------------------
def encode_block(name: str, ids: np.ndarray, records: list) -> bytes:
    encoded = name.encode("utf-8", "replace")
    lengths = np.fromiter(map(len, records), np.uint64, len(records)).tobytes()
    payload = b"".join([struct.pack("<I", len(encoded)), encoded,
                        ids.astype("<i8", copy=False).tobytes(), lengths, *records])
    return HEADER.pack(BLOCK, len(records), len(payload)) + payload


def encode_end() -> bytes:
    return HEADER.pack(END, 0, 0)


def encode_keepalive() -> bytes:
    return HEADER.pack(KEEPALIVE, 0, 0)


def encode_error(exc: BaseException, rank: Optional[int] = None,
                 worker: Optional[int] = None) -> bytes:
    """``exc`` as plain data: its class name, text and plain-valued attributes."""
    fields = {}
    for name in _FIELDS:
        value = getattr(exc, name, None)
        if value is None or isinstance(value, (str, int)) and not isinstance(value, bool):
            fields[name] = value
    text = json.dumps({"type": type(exc).__name__, "message": str(exc), "fields": fields,
                       "rank": rank, "worker": worker}).encode("utf-8")
    if len(text) > MAX_ERROR_BYTES:  # a huge message is cut, never refused
        return encode_error(SourceError(str(exc)[:MAX_ERROR_BYTES // 2] + " ..."), rank, worker)
    return HEADER.pack(ERROR, 0, len(text)) + text


def parse_header(data: bytes, max_records: int, max_payload: int) -> tuple:
    """``(kind, count, size)`` of a dealer's message header, checked against the limits."""
    kind, count, size = HEADER.unpack(data)
    if kind == BLOCK:
        ok = 0 < count <= max_records and size <= max_payload
    elif kind in (END, KEEPALIVE):
        ok = count == 0 and size == 0
    elif kind == ERROR:
        ok = count == 0 and size <= MAX_ERROR_BYTES
    else:
        ok = False
    if not ok or bytes(data[1:4]) != b"\0\0\0":
        raise SourceError(f"a malformed message header (kind {kind}, {count} records,"
                          f" {size} bytes)")
    return kind, count, size


def parse_block(count: int, payload: Any) -> tuple:
    """``(source name, origins, records)`` of a BLOCK's payload; every length is checked
    against the payload before it is used."""
    view = memoryview(payload)
    if len(view) < 4:
        raise SourceError("a block shorter than its header")
    (name_len,) = struct.unpack_from("<I", view)
    pos = 4 + name_len
    end = pos + 16 * count
    if end > len(view):
        raise SourceError(f"a block of {count} records whose index does not fit its"
                          f" {len(view)} bytes")
    name = bytes(view[4:pos]).decode("utf-8", "replace")
    ids = np.frombuffer(view[pos:pos + 8 * count], "<i8").astype(np.int64)
    lengths = np.frombuffer(view[pos + 8 * count:end], "<u8").tolist()
    if sum(lengths) != len(view) - end:  # Python ints: no wrap-around
        raise SourceError(f"a block whose record lengths do not add up to its"
                          f" {len(view) - end} bytes of records")
    records = []
    pos = end
    for length in lengths:
        records.append(bytes(view[pos:pos + length]))
        pos += length
    return name, ids, records


def _error_classes() -> dict:
    return {name: getattr(errors, name) for name in errors.__all__
            if isinstance(getattr(errors, name), type)
            and issubclass(getattr(errors, name), StreamioError)}


def parse_error(payload: Any) -> StreamioError:
    """The exception an ERROR's payload describes (a streamio error; never anything else)."""
    try:
        data = json.loads(bytes(payload).decode("utf-8"))
        kind, message, fields = data["type"], data["message"], data["fields"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return SourceError(f"the shared stream's dealer sent an unreadable error ({exc!r:.200})")
    if not (isinstance(kind, str) and isinstance(message, str) and isinstance(fields, dict)):
        return SourceError("the shared stream's dealer sent an error of the wrong shape")
    fields = {k: v for k, v in fields.items() if k in _FIELDS
              and (v is None or isinstance(v, (str, int)) and not isinstance(v, bool))}
    cls = _error_classes().get(kind)
    try:
        return _rebuild(cls, message, fields) if cls is not None else \
            SourceError(f"{kind}: {message}")
    except Exception:  # noqa: BLE001 - attributes of the wrong kind for that class
        return SourceError(f"{kind}: {message}")


def _rebuild(cls: type, message: str, fields: dict) -> StreamioError:
    if issubclass(cls, (errors.FormatError, errors.MapError)) and isinstance(
            fields.get("reason"), str):
        where = {k: fields.get(k) for k in ("source", "offset", "record_index")}
        if issubclass(cls, errors.MapError):
            where = {k: fields.get(k) for k in ("source", "record_index", "item_index")}
        elif issubclass(cls, errors.DecodeError):
            where["field"] = fields.get("field")
        return cls(fields["reason"], **where)
    if issubclass(cls, (errors.FormatError, errors.MapError)):
        return cls(message)
    error = cls(message=message) if cls is errors.MissingDependencyError else cls(message)
    if "source" in fields and issubclass(cls, SourceError):
        error.source = fields["source"]  # the message already names it
    return error

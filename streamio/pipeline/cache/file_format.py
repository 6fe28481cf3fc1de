"""The cache file's format (``Dataset.cache(directory)``): blocks of items, a manifest, a
trailer. Encoding and parsing only, no I/O: :mod:`.cache` reads and writes the files, and the fuzz
target feeds :func:`parse_cache` whole files.

Every parser here takes its bytes as another local user's: each length is checked against what
is left before anything is allocated, a block's items are made only after its SHA-256 matched,
nothing is unpickled (only numbers, bytes, str and sparse batches are made), and whatever does
not check out is a :class:`~streamio.CorruptRecordError` naming the file and the offset.

File layout (all integers little-endian)::

    block*   "SIOB" | u8 kind | u64 payload length | 32-byte SHA-256 of payload | payload
    manifest JSON (the digest, blocks, items, source names, a CSV header, the local files:
             [path, size, mtime_ns, inode, device] each; the remote objects: [url, etag,
             last_modified, size] each)
    trailer  "SIOCACHE" | u32 version | u64 manifest length | u64 blocks' length |
             32-byte SHA-256 of the manifest

A block's payload: ``u8 has_ids | u64 n | [n x i64 record origins] |`` then by kind:
``RECORDS`` n x u64 lengths, the bytes; ``LISTS`` (batches of records) n x u64 counts, one u64
length per record, the bytes; ``DICTS`` (decoded batches) per batch ``u16 fields``, per field
``u16 name length | name | value``; a value is ``u8 ARRAY | u8 dtype length | dtype.str |
u8 ndim | ndim x u64 shape | padding to 16 | data``, ``u8 OBJECTS | u8 b/s (bytes or str) |
u8 ndim | shape | u64 length per element | data`` or ``u8 SPARSE | 2 x u64 shape | three
ARRAY values`` (indptr, indices, values).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import struct
from typing import Any, Optional

import numpy as np

from ...decoders.sparse import SparseBatch
from ...errors import CorruptRecordError, UsageError
from .sources import identity_ok, remote_ok

__all__ = ["DICTS", "LISTS", "MAX_MANIFEST", "RECORDS", "VERSION", "block_header", "check_counts",
           "check_payload", "decode_block", "encode_block", "encode_header",
           "manifest_and_trailer", "older_version", "parse_block_header", "parse_cache",
           "parse_manifest", "parse_trailer"]

#: 2: the manifest records the local files' identities (``files``); 3: and the remote
#: objects' (``remote``: ETag, Last-Modified, size).
VERSION = 3

_BLOCK = struct.Struct("<4sBQ32s")
_BLOCK_MAGIC = b"SIOB"
_TRAILER = struct.Struct("<8sIQQ32s")
_MAGIC = b"SIOCACHE"
#: A manifest holds source names and a CSV header: far below this in any real cache.
MAX_MANIFEST = 16 << 20
RECORDS, LISTS, DICTS = 1, 2, 3
_ARRAY, _OBJECTS, _SPARSE = 1, 2, 3
_ALIGN = 16
# dtype.str of plain numbers, bytes and str: nothing numpy would build an object from.
_DTYPE = re.compile(r"[<>|][biufc]\d{1,2}|[<>|][SU]\d{1,6}|[<>][mM]8\[[A-Za-z]{1,3}\]")
_MAX_ELEMENTS = 1 << 36  # elements of any shape: times the largest itemsize (4 MB) < 2**62


# -- encoding a block --------------------------------------------------------------------------
def _refuse(what: str) -> UsageError:
    return UsageError(f"a file cache stores records, batches of records and decoded batches of"
                      f" numbers, bytes and str; {what}: cache in memory (directory=None) or put"
                      " .cache() before the stage that makes these")


def _array_chunks(value: np.ndarray, name: str, out: list, size: list) -> None:
    if value.dtype.hasobject:
        flat = value.reshape(-1)
        if all(type(v) is bytes for v in flat):
            elem, parts = b"b", list(flat)
        elif all(type(v) is str for v in flat):
            elem, parts = b"s", [v.encode("utf-8", "surrogatepass") for v in flat]
        else:
            kinds = sorted({type(v).__name__ for v in flat})[:4]
            raise _refuse(f"field {name!r} holds {', '.join(kinds)} objects")
        head = struct.pack("<BcB", _OBJECTS, elem, value.ndim)
        lengths = np.fromiter(map(len, parts), np.uint64, len(parts))
        _add(out, size, head + struct.pack(f"<{value.ndim}Q", *value.shape) + lengths.tobytes())
        _add(out, size, b"".join(parts))
        return
    text = value.dtype.str
    if not _DTYPE.fullmatch(text):
        raise _refuse(f"field {name!r} has dtype {value.dtype}")
    head = struct.pack("<BB", _ARRAY, len(text)) + text.encode() + struct.pack(
        f"<B{value.ndim}Q", value.ndim, *value.shape)
    _add(out, size, head)
    _add(out, size, bytes(-size[0] % _ALIGN))
    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    _add(out, size, memoryview(data))


def _add(out: list, size: list, chunk: Any) -> None:
    out.append(chunk)
    size[0] += len(chunk)


def _value_chunks(value: Any, name: str, out: list, size: list) -> None:
    if isinstance(value, np.ndarray):
        _array_chunks(value, name, out, size)
    elif isinstance(value, SparseBatch):
        _add(out, size, struct.pack("<BQQ", _SPARSE, *value.shape))
        for part in (value.indptr, value.indices, value.values):
            _array_chunks(part, name, out, size)
    else:
        raise _refuse(f"field {name!r} is a {type(value).__name__}")


def encode_block(items: list, ids: Optional[np.ndarray]) -> tuple[int, list]:
    """``(kind, chunks)``: the payload of one block of items (see the module docstring); a
    :class:`~streamio.UsageError` for items a file cache does not hold."""
    out: list = []
    size = [0]
    n = len(items)
    _add(out, size, struct.pack("<BQ", ids is not None, n))
    if ids is not None:
        _add(out, size, np.ascontiguousarray(ids, dtype="<i8").tobytes())
    first = items[0] if n else b""
    if isinstance(first, bytes):
        if not all(type(x) is bytes for x in items):
            raise _refuse("a block mixes records with other items")
        _add(out, size, np.fromiter(map(len, items), "<u8", n).tobytes())
        _add(out, size, b"".join(items))
        return RECORDS, out
    if isinstance(first, list):
        if not all(type(b) is list and all(type(r) is bytes for r in b) for b in items):
            raise _refuse("a batch holds something other than records")
        _add(out, size, np.fromiter(map(len, items), "<u8", n).tobytes())
        records = [r for batch in items for r in batch]
        _add(out, size, np.fromiter(map(len, records), "<u8", len(records)).tobytes())
        _add(out, size, b"".join(records))
        return LISTS, out
    if isinstance(first, dict):
        for batch in items:
            if not isinstance(batch, dict) or len(batch) > 0xFFFF:
                raise _refuse(f"an item is a {type(batch).__name__} of {len(batch)} entries")
            _add(out, size, struct.pack("<H", len(batch)))
            for name, value in batch.items():
                key = str(name).encode("utf-8", "surrogatepass")
                if not isinstance(name, str) or len(key) > 0xFFFF:
                    raise _refuse(f"a field name is {name!r:.40}")
                _add(out, size, struct.pack("<H", len(key)) + key)
                _value_chunks(value, name, out, size)
        return DICTS, out
    raise _refuse(f"an item is a {type(first).__name__}")


def block_header(kind: int, chunks: list) -> bytes:
    """The header of a block of ``kind`` whose payload is ``chunks``: magic, kind, length and
    the payload's SHA-256."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return _BLOCK.pack(_BLOCK_MAGIC, kind, sum(len(c) for c in chunks), digest.digest())


def manifest_and_trailer(fields: dict, body_len: int) -> tuple[bytes, bytes]:
    """``(manifest, trailer)`` that end a file whose blocks take ``body_len`` bytes:
    ``fields`` (every manifest key but ``streamio_cache``, the version) as JSON, and the
    trailer that gives the two lengths and the manifest's SHA-256."""
    manifest = json.dumps({"streamio_cache": VERSION, **fields}, sort_keys=True).encode()
    trailer = _TRAILER.pack(_MAGIC, VERSION, len(manifest), body_len,
                            hashlib.sha256(manifest).digest())
    return manifest, trailer


# -- parsing (no I/O: the file reader and the fuzz target share these) ---------------------------
class _Cursor:
    """Reads a payload front to back; every length is checked against what is left first."""

    def __init__(self, payload: Any, where: str, offset: int) -> None:
        self.buf = payload
        self.pos = 0
        self.where = where
        self.offset = offset

    def fail(self, reason: str) -> CorruptRecordError:
        return CorruptRecordError(f"cache block: {reason}", source=self.where,
                                  offset=self.offset + self.pos)

    def take(self, n: int) -> int:
        if n < 0 or n > len(self.buf) - self.pos:
            raise self.fail(f"{n} bytes announced, {len(self.buf) - self.pos} left")
        start = self.pos
        self.pos += n
        return start

    def unpack(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.buf, self.take(size))

    def u64s(self, n: int) -> np.ndarray:
        if n > (len(self.buf) - self.pos) // 8:
            raise self.fail(f"{n} lengths announced, {len(self.buf) - self.pos} bytes left")
        return np.frombuffer(self.buf, "<u8", n, self.take(8 * n))

    def shape(self) -> tuple:
        (ndim,) = self.unpack("<B")
        if ndim > 32:
            raise self.fail(f"{ndim} dimensions")
        shape = self.unpack(f"<{ndim}Q")
        # numpy refuses a shape whose non-zero dimensions multiply past its index range, even
        # for an empty array: bounded here (a real block is far smaller).
        if math.prod(d for d in shape if d) > _MAX_ELEMENTS:
            raise self.fail(f"shape {shape}")
        return shape

    def pieces(self, lengths: np.ndarray) -> list:
        ends = list(itertools.accumulate(lengths.tolist()))  # Python ints: no wrap-around
        total = ends[-1] if ends else 0
        start = self.take(total)
        data = bytes(self.buf[start:start + total])
        return [data[b:e] for b, e in zip([0] + ends[:-1], ends)]

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} bytes after the last item")


def _read_array(cur: _Cursor) -> np.ndarray:
    (kind,) = cur.unpack("<B")
    if kind == _OBJECTS:
        (elem,) = cur.unpack("<c")
        if elem not in (b"b", b"s"):
            raise cur.fail(f"object elements {elem!r}")
        shape = cur.shape()
        count = math.prod(shape)
        parts = cur.pieces(cur.u64s(count))
        if elem == b"s":
            try:
                parts = [p.decode("utf-8", "surrogatepass") for p in parts]
            except UnicodeDecodeError as exc:
                raise cur.fail(f"a str element is not UTF-8 ({exc.reason})") from None
        out = np.empty(count, dtype=object)
        out[:] = parts
        return out.reshape(shape)
    if kind != _ARRAY:
        raise cur.fail(f"value kind {kind}")
    (length,) = cur.unpack("<B")
    start = cur.take(length)
    text = bytes(cur.buf[start:start + length]).decode("ascii", "replace")
    if not _DTYPE.fullmatch(text):
        raise cur.fail(f"dtype {text!r:.40}")
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise cur.fail(f"dtype {text!r}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise cur.fail(f"dtype {text!r}")
    shape = cur.shape()
    cur.take(-cur.pos % _ALIGN)
    count = math.prod(shape)
    if count > (len(cur.buf) - cur.pos) // dtype.itemsize:
        raise cur.fail(f"an array of shape {shape} and dtype {text} does not fit in the block")
    return np.frombuffer(cur.buf, dtype, count, cur.take(count * dtype.itemsize)).reshape(shape)


def _read_value(cur: _Cursor) -> Any:
    (kind,) = struct.unpack_from("<B", cur.buf, cur.pos) if cur.pos < len(cur.buf) else (0,)
    if kind != _SPARSE:
        return _read_array(cur)
    cur.take(1)
    rows, cols = cur.unpack("<QQ")
    parts = [_read_array(cur) for _ in range(3)]
    if any(p.dtype != np.int64 for p in parts[:2]) or parts[2].dtype.kind not in "biufc":
        raise cur.fail("a sparse value's parts are not int64 indices and numeric values")
    try:
        return SparseBatch(parts[0], parts[1], parts[2], (rows, cols))
    except (UsageError, ValueError) as exc:
        raise cur.fail(f"a sparse value does not check out ({exc})") from None


def decode_block(kind: int, payload: Any, where: str = "<cache>", offset: int = 0) -> tuple:
    """``(items, ids)`` from a block's payload (a ``bytearray``: arrays are writable views of
    it); a :class:`~streamio.CorruptRecordError` for anything that does not check out."""
    cur = _Cursor(payload, where, offset)
    has_ids, n = cur.unpack("<BQ")
    if has_ids > 1:
        raise cur.fail(f"has_ids is {has_ids}")
    ids = cur.u64s(n).view("<i8").astype(np.int64) if has_ids else None
    if kind == RECORDS:
        items = cur.pieces(cur.u64s(n))
    elif kind == LISTS:
        ends = list(itertools.accumulate(cur.u64s(n).tolist()))
        records = cur.pieces(cur.u64s(ends[-1] if ends else 0))
        items = [records[b:e] for b, e in zip([0] + ends[:-1], ends)]
    elif kind == DICTS:
        if n > len(payload) // 2:
            raise cur.fail(f"{n} batches announced")
        items = []
        for _ in range(n):
            (fields,) = cur.unpack("<H")
            batch = {}
            for _ in range(fields):
                (length,) = cur.unpack("<H")
                start = cur.take(length)
                try:
                    name = bytes(payload[start:start + length]).decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    raise cur.fail("a field name is not UTF-8") from None
                batch[name] = _read_value(cur)
            items.append(batch)
    else:
        raise cur.fail(f"block kind {kind}")
    cur.done()
    return items, ids


def older_version(tail: bytes) -> Optional[int]:
    """The format version of a cache file an earlier streamio wrote (trailer magic, version
    below ours), else None. Such a file is our own, outdated: filled anew, not refused (an
    upgrade must not stop a restarted job); any other version is refused by parse_trailer."""
    if len(tail) != _TRAILER.size:
        return None
    magic, version = _TRAILER.unpack(tail)[:2]
    return version if magic == _MAGIC and 1 <= version < VERSION else None


def parse_trailer(tail: bytes, size: int, where: str) -> tuple[int, int, bytes]:
    """``(manifest length, blocks' length, manifest SHA-256)`` from the file's last bytes."""
    if size < _TRAILER.size or len(tail) != _TRAILER.size:
        raise CorruptRecordError("not a streamio cache file (too short)", source=where, offset=0)
    magic, version, manifest_len, body_len, sha = _TRAILER.unpack(tail)
    if magic != _MAGIC:
        raise CorruptRecordError("not a streamio cache file (no trailer)", source=where,
                                 offset=size - _TRAILER.size)
    if version != VERSION:
        raise CorruptRecordError(f"cache file version {version}, this streamio reads {VERSION}"
                                 " (delete it and the next epoch fills it again)",
                                 source=where, offset=size - _TRAILER.size)
    if manifest_len > MAX_MANIFEST or body_len + manifest_len + _TRAILER.size != size:
        raise CorruptRecordError(f"cache trailer lengths ({manifest_len}, {body_len}) do not"
                                 f" fit the file's {size} bytes", source=where,
                                 offset=size - _TRAILER.size)
    return manifest_len, body_len, sha


_MANIFEST_KEYS = {"streamio_cache", "digest", "blocks", "items", "names", "header",
                  "header_source", "files", "remote"}
def parse_manifest(data: bytes, sha: bytes, where: str, offset: int) -> dict:
    """The manifest, checked: its SHA-256, JSON, and every field's type."""
    def bad(reason: str) -> CorruptRecordError:
        return CorruptRecordError(f"cache manifest: {reason}", source=where, offset=offset)

    if hashlib.sha256(data).digest() != sha:
        raise bad("SHA-256 mismatch")
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(manifest, dict) or set(manifest) != _MANIFEST_KEYS:
        raise bad("unexpected fields")
    counts = (manifest["blocks"], manifest["items"], manifest["streamio_cache"])
    if not all(type(c) is int and 0 <= c < 2 ** 63 for c in counts):
        raise bad(f"counts {counts!r:.80}")
    names = manifest["names"]
    if not (isinstance(names, dict)
            and all(k.isdigit() and len(k) < 20 and isinstance(v, str) for k, v in names.items())):
        raise bad("source names")
    if not isinstance(manifest["digest"], str):
        raise bad("digest")
    header, source = manifest["header"], manifest["header_source"]
    if not (header is None or isinstance(header, str)) or not (
            source is None or isinstance(source, str)):
        raise bad("header")
    files = manifest["files"]
    if not (type(files) is list and all(identity_ok(f) for f in files)):
        raise bad(f"local files {files!r:.80}")
    remote = manifest["remote"]
    if not (type(remote) is list and all(remote_ok(r) for r in remote)):
        raise bad(f"remote objects {remote!r:.80}")
    return manifest


def parse_block_header(head: bytes, left: int, where: str, offset: int) -> tuple[int, int, bytes]:
    """``(kind, payload length, SHA-256)`` of a block whose header starts at ``offset``."""
    if len(head) != _BLOCK.size or _BLOCK.size > left:
        raise CorruptRecordError("cache block header cut short", source=where, offset=offset)
    magic, kind, length, sha = _BLOCK.unpack(head)
    if magic != _BLOCK_MAGIC or kind not in (RECORDS, LISTS, DICTS):
        raise CorruptRecordError("not a cache block", source=where, offset=offset)
    if length > left - _BLOCK.size:
        raise CorruptRecordError(f"cache block of {length} bytes, {left - _BLOCK.size} left",
                                 source=where, offset=offset)
    return kind, length, sha


def check_payload(payload: Any, sha: bytes, where: str, offset: int) -> None:
    """A block's payload against the SHA-256 its header gives (the header at ``offset``)."""
    if hashlib.sha256(payload).digest() != sha:
        raise CorruptRecordError("cache block: SHA-256 mismatch (the file changed after it was"
                                 " written: delete it and the next epoch fills it again)",
                                 source=where, offset=offset)


def parse_cache(data: bytes, where: str = "<cache>") -> tuple[dict, list]:
    """``(manifest, blocks)`` of a whole cache file in memory (what the fuzz target feeds)."""
    size = len(data)
    manifest_len, body_len, sha = parse_trailer(data[size - _TRAILER.size:], size, where)
    manifest = parse_manifest(data[body_len:body_len + manifest_len], sha, where, body_len)
    blocks = []
    pos = 0
    while pos < body_len:
        kind, length, block_sha = parse_block_header(data[pos:pos + _BLOCK.size], body_len - pos,
                                                     where, pos)
        start = pos + _BLOCK.size
        payload = bytearray(data[start:start + length])
        check_payload(payload, block_sha, where, pos)
        blocks.append(decode_block(kind, payload, where, start))
        pos = start + length
    check_counts(manifest, len(blocks), sum(len(items) for items, _ in blocks), where)
    return manifest, blocks


def check_counts(manifest: dict, blocks: int, items: int, where: str) -> None:
    """The blocks and items read against the manifest's counts (a file cut at a block's end)."""
    if (blocks, items) != (manifest["blocks"], manifest["items"]):
        raise CorruptRecordError(f"cache file holds {blocks} blocks of {items} items, its"
                                 f" manifest says {manifest['blocks']} of {manifest['items']}",
                                 source=where)


def encode_header(header: Optional[bytes]) -> Optional[str]:
    """A CSV header as the manifest holds it (latin-1: any bytes, as JSON text)."""
    return None if header is None else header.decode("latin-1")

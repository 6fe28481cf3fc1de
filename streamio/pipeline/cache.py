"""``Dataset.cache()``: what the stages before it produce, kept from the first complete epoch.

An epoch that finds no complete cache *fills* one: it runs the stages before the cache (always
as epoch 0, so that the cache holds the same items whichever epoch fills it, and a resumed
epoch can rebuild them), hands their items on, and keeps them; only when the upstream ends
normally does the cache become complete (in memory: put in place; in a directory: a temp file
renamed into place). An epoch that finds a complete cache never builds its upstream: no source
is opened (a Pipe-mode channel whose later FIFOs never come trains on), no prefetch thread or
map pool starts. The stages after the cache run anew each epoch, with the epoch's number.

**Memory** (``directory=None``): the items themselves are kept (records as they are, decoded
arrays made read-only, so an in-place change raises instead of altering later epochs), at
most ``max_bytes`` (:data:`DEFAULT_MAX_BYTES`) counted as the shuffle buffer counts
(:func:`~streamio.pipeline.shuffle.estimate_nbytes`; record lengths, 8 bytes per record origin);
beyond it the epoch fails with a :class:`~streamio.UsageError` naming the limit.

**Files** (``directory=...``): one file per reader (rank, worker, shard): its name comes from the
reader's place, and the file records the digest of the pipeline before the cache (sources,
format, reader options, decoder, the stages before the cache with their seeds, shards and the
place; not the epoch). A file with another digest is refused with a UsageError naming the
directory.

The digest describes the pipeline, not the bytes of its sources. So the file also records the
identity (``os.stat``: size, ``st_mtime_ns``, ``st_ino``, ``st_dev``) of every *local regular
file* the reader reads before the cache (a plain path or ``file://`` URL naming a regular file;
the inputs of a :func:`~streamio.mix` too), taken when the fill began; before a complete file is
served, each is stat'ed again (never opened: a FIFO is not a regular file, so a Pipe-mode
channel's later FIFOs are still never asked for). A file missing or with another identity makes
the cache *stale*: it is not served, a :class:`~streamio.errors.StreamioWarning` names the file,
and the epoch fills the cache anew from the sources (the new file renamed over the stale one). A
file whose identity changed *during* the fill is the same warning, and the fill's file is not
put in place: the epoch's items (handed out already, as a pipeline without a cache would hand
them out) came from a file that changed under them, so they may be neither the old contents nor
the new; the next epoch reads the sources again. A warning, not an error: the epoch itself went
as it would have without the cache, and failing the job at its end would punish the cache for
what the source did. HTTP(S) and S3 objects are checked the same way by what their server says
of them (ETag, Last-Modified, size; one small request each, :mod:`.cache_sources`): one that
differs, or does not answer, makes the cache stale. FIFOs, Pipe-mode channels, stdin, bytes and
file objects have no identity outside their bytes and are not checked: delete the directory
when their data changes. A file of an earlier streamio's format (version 1 recorded no
identities, version 2 no remote ones) is stale too (warned, filled again: an upgrade does not
stop a restarted job); a version no streamio wrote is refused.

The file is input another local user could have written: it is opened without following a
symlink, must be a regular file of ours not writable by others, is never unpickled (its own
framing, below), every length is checked before anything is allocated, and every block carries a
SHA-256 checked before its items are handed out (a mismatch is a
:class:`~streamio.CorruptRecordError` naming the file). The directory is created 0700, and one
that is a link, another user's, or writable by others is refused (:mod:`.cache_dir`): the file
names are predictable, and whoever can write the directory could put back an old file.

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

import errno
import hashlib
import itertools
import json
import math
import os
import re
import stat
import struct
import tempfile
import threading
import warnings
from typing import Any, Iterator, Optional

import numpy as np

from ..decoders.sparse import SparseBatch
from ..errors import CorruptRecordError, SourceError, StreamioWarning, UsageError
from .cache_dir import private_directory
from .cache_sources import (changed_source, file_identities, identity_ok, local_files,
                            remote_identities, remote_ok, remote_urls)
from .shuffle import estimate_nbytes
from .stages import close_blocks

__all__ = ["DEFAULT_MAX_BYTES", "FILL_EPOCH", "MemoryCache", "cache_digest", "cached_blocks",
           "encode_block", "parse_cache", "parse_manifest", "parse_trailer", "decode_block"]

#: The memory cache's default bound: 1 GiB, a size most training hosts hold beside a model
#: without swapping; a larger dataset belongs in a directory (``directory=``).
DEFAULT_MAX_BYTES = 1 << 30
#: The epoch the stages before a cache run as, whichever epoch fills it.
FILL_EPOCH = 0
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
_FILE_PREFIX = "streamio-cache-"


# -- the digest -------------------------------------------------------------------------------------
def _decoder_key(decoder: Any) -> Optional[str]:
    if decoder is None:
        return None
    text = repr(decoder)
    # A repr that names an address (the default object repr) differs in every process.
    return type(decoder).__qualname__ if " at 0x" in text else f"{type(decoder).__qualname__}:{text}"


def cache_digest(ds: Any, position: int) -> tuple[str, str]:
    """``(digest, place)`` of the cache at ``position`` of ``ds``: the digest of everything that
    decides its items (not the epoch), and a key of the reader's place (its file name)."""
    from .resume import describe_chain, stage_seeds

    prefix = ds._stages[:position]
    ctx = ds._context
    place = {"selection": list(ds._selection), "round_robin": [list(x) for x in ds._round_robin],
             "place": [ctx.rank, ctx.world_size, ctx.worker, ctx.num_workers],
             "feed": ds._feed is not None}
    description = {"version": VERSION, "place": place,
                   "chain": describe_chain(ds._derive(_stages=prefix)),
                   "seeds": stage_seeds(prefix), "decoder": _decoder_key(ds._decoder)}
    digest = hashlib.sha256(json.dumps(description, sort_keys=True, default=repr).encode())
    place_key = hashlib.sha256(json.dumps(place, sort_keys=True).encode()).hexdigest()[:20]
    return digest.hexdigest(), place_key


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
    """``(kind, chunks)``: the payload of one block of items (see the module docstring)."""
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


def _older_version(tail: bytes) -> Optional[int]:
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


def _check_payload(payload: Any, sha: bytes, where: str, offset: int) -> None:
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
        _check_payload(payload, block_sha, where, pos)
        blocks.append(decode_block(kind, payload, where, start))
        pos = start + length
    _check_counts(manifest, len(blocks), sum(len(items) for items, _ in blocks), where)
    return manifest, blocks


def _check_counts(manifest: dict, blocks: int, items: int, where: str) -> None:
    if (blocks, items) != (manifest["blocks"], manifest["items"]):
        raise CorruptRecordError(f"cache file holds {blocks} blocks of {items} items, its"
                                 f" manifest says {manifest['blocks']} of {manifest['items']}",
                                 source=where)


def _encode_header(header: Optional[bytes]) -> Optional[str]:
    return None if header is None else header.decode("latin-1")


# -- the stores ---------------------------------------------------------------------------------
class _Complete:
    """A complete cache: what an epoch serves."""

    __slots__ = ("blocks", "names", "header", "header_source")

    def __init__(self, blocks: Any, names: dict, header: Optional[bytes],
                 header_source: Optional[str]) -> None:
        self.blocks = blocks
        self.names = names
        self.header = header
        self.header_source = header_source


class MemoryCache:
    """The complete in-memory caches of one ``Cache`` stage, by pipeline digest (the stage
    object is shared by every Dataset derived from the one it was added to: shards, places)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._complete: dict = {}
        self._told_early_stop = False

    def first_early_stop(self) -> bool:
        """True the first time a filling epoch of this stage stops early, False after."""
        with self._lock:
            first, self._told_early_stop = not self._told_early_stop, True
            return first

    def get(self, digest: str) -> Optional[_Complete]:
        with self._lock:
            return self._complete.get(digest)

    def put(self, digest: str, complete: _Complete) -> None:
        with self._lock:
            self._complete[digest] = complete


def _freeze(value: Any) -> None:
    """Make a cached batch's arrays read-only: later epochs hand out the same arrays."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, SparseBatch):
        for part in (value.indptr, value.indices, value.values):
            part.flags.writeable = False


def _copy_item(item: Any) -> Any:
    # A consumer may add keys to a batch dict or change a list: never the cache's own.
    if isinstance(item, dict):
        return dict(item)
    if isinstance(item, list):
        return list(item)
    return item


class _MemorySink:
    def __init__(self, memory: MemoryCache, digest: str, limit: int) -> None:
        self.memory, self.digest, self.limit = memory, digest, limit
        self.blocks: list = []
        self.nbytes = 0

    def add(self, items: list, ids: Any, batched: bool) -> None:
        size = (sum(map(estimate_nbytes, items)) if batched else sum(map(len, items)))
        self.nbytes += size + (8 * len(ids) if ids is not None else 0)
        if self.nbytes > self.limit:
            raise UsageError(f".cache(): the epoch holds more than max_bytes={self.limit} bytes,"
                             " the memory cache's bound: pass directory=... to cache in files"
                             " (memory then stays bounded), or a larger max_bytes")
        if batched:
            for item in items:
                if isinstance(item, dict):
                    for value in item.values():
                        _freeze(value)
            items = [_copy_item(x) for x in items]
        self.blocks.append((list(items), ids))

    def commit(self, complete: _Complete) -> None:
        complete.blocks, self.blocks = self.blocks, []
        self.memory.put(self.digest, complete)

    def abandon(self) -> None:
        self.blocks = []


class _FileSink:
    """Writes one cache file: a temp name made in the directory by ``mkstemp`` (O_EXCL, 0600),
    renamed over the final name once the epoch is complete; removed otherwise."""

    def __init__(self, directory: str, path: str, digest: str, limit: Optional[int],
                 files: list, remote: list) -> None:
        self.directory, self.path, self.digest, self.limit = directory, path, digest, limit
        self.files = files  # the local files' identities when the fill began
        self.remote = remote  # the remote objects' (ETag, Last-Modified, size)
        self.tmp: Optional[str] = None
        self.file: Any = None
        self.written = 0
        self.blocks = 0
        self.items = 0

    def _open(self) -> None:
        make_directory(self.directory)
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=f".{_FILE_PREFIX}", suffix=".tmp",
                                            dir=self.directory)
        except OSError as exc:  # a read-only or foreign directory, a full inode table
            raise self._io_error(exc) from exc
        self.file = os.fdopen(fd, "wb", buffering=1 << 20)

    def _write(self, chunks: list) -> None:
        size = sum(len(c) for c in chunks)
        if self.limit is not None and self.written + size > self.limit:
            raise UsageError(f".cache({self.directory!r}): the cache would exceed max_bytes="
                             f"{self.limit} bytes on disk; give a larger max_bytes (or None)")
        try:
            for chunk in chunks:
                self.file.write(chunk)
        except OSError as exc:
            raise self._io_error(exc) from exc
        self.written += size

    def _io_error(self, exc: OSError) -> SourceError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = ("the disk (or quota) holding it is full; free space, point directory= at a"
                   " larger disk, or cache in memory")
        else:
            why = f"{exc.strerror or exc}"
        return SourceError(f"cannot write the cache: {why}", source=self.directory)

    def add(self, items: list, ids: Any, batched: bool) -> None:
        kind, chunks = encode_block(items, ids)
        if self.file is None:
            self._open()
        digest = hashlib.sha256()
        for chunk in chunks:
            digest.update(chunk)
        length = sum(len(c) for c in chunks)
        self._write([_BLOCK.pack(_BLOCK_MAGIC, kind, length, digest.digest())] + chunks)
        self.blocks += 1
        self.items += len(items)

    def commit(self, complete: _Complete) -> None:
        changed = changed_source(self.files, self.remote)
        if changed is not None:  # not put in place (the module docstring says why); the
            # caller's abandon() removes the temp file
            warnings.warn(f"source {changed} changed while the cache {self.path} was filling:"
                          " not kept (this epoch's items came from a file that changed under"
                          " them); the next epoch reads the sources again", StreamioWarning,
                          stacklevel=2)
            return
        if self.file is None:
            self._open()  # an empty epoch is a complete, empty cache
        manifest = json.dumps({
            "streamio_cache": VERSION, "digest": self.digest, "blocks": self.blocks,
            "items": self.items, "names": {str(k): v for k, v in complete.names.items()},
            "header": _encode_header(complete.header), "header_source": complete.header_source,
            "files": self.files, "remote": self.remote,
        }, sort_keys=True).encode()
        body = self.written
        trailer = _TRAILER.pack(_MAGIC, VERSION, len(manifest), body,
                                hashlib.sha256(manifest).digest())
        self._write([manifest, trailer])
        try:
            self.file.flush()
            os.fsync(self.file.fileno())  # the rename must not land before the bytes
            self.file.close()
            self.file = None
            os.replace(self.tmp, self.path)
        except OSError as exc:
            raise self._io_error(exc) from exc
        self.tmp = None

    def abandon(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass  # a full disk fails the flush too; the file goes below
            self.file = None
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = None


def make_directory(directory: str) -> None:
    """The cache directory, created 0700 if missing, refused unless private to this user
    (:mod:`.cache_dir`)."""
    private_directory(directory)


class _CacheFile:
    """A complete cache file, opened and its trailer and manifest checked."""

    def __init__(self, fd: int, path: str, size: int, body_len: int, manifest: dict) -> None:
        self.fd, self.path, self.size, self.body_len, self.manifest = (fd, path, size, body_len,
                                                                       manifest)

    def complete(self) -> _Complete:
        m = self.manifest
        header = None if m["header"] is None else m["header"].encode("latin-1")
        return _Complete(self.read_blocks(), {int(k): v for k, v in m["names"].items()},
                         header, m["header_source"])

    def read_blocks(self) -> Iterator[tuple]:
        blocks = items = pos = 0
        try:
            while pos < self.body_len:
                head = os.pread(self.fd, _BLOCK.size, pos)
                kind, length, sha = parse_block_header(head, self.body_len - pos, self.path, pos)
                payload = bytearray(length)
                got = os.preadv(self.fd, [payload], pos + _BLOCK.size) if length else 0
                if got != length:
                    raise CorruptRecordError("cache file cut short", source=self.path,
                                             offset=pos + _BLOCK.size + got)
                _check_payload(payload, sha, self.path, pos)
                block = decode_block(kind, payload, self.path, pos + _BLOCK.size)
                blocks += 1
                items += len(block[0])
                yield block
                pos += _BLOCK.size + length
            _check_counts(self.manifest, blocks, items, self.path)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def open_cache_file(path: str, digest: str, directory: str) -> Optional[_CacheFile]:
    """The complete cache at ``path``, checked; None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"cache file {path} is a symbolic link: refused (remove it)") from None
        raise SourceError(f"cannot open the cache file: {exc.strerror or exc}",
                          source=path) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"cache file {path} is not a regular file: refused (remove it)")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise UsageError(f"cache file {path} belongs to another user or others may write it:"
                             " refused (remove it, and keep the cache directory private)")
        size = st.st_size
        tail = os.pread(fd, _TRAILER.size, max(0, size - _TRAILER.size))
        older = _older_version(tail)
        if older is not None:
            warnings.warn(f"cache file {path} was written by an earlier streamio (cache format"
                          f" {older}, this one writes {VERSION}); not served, this epoch fills"
                          " it again from the sources", StreamioWarning, stacklevel=4)
            return None
        manifest_len, body_len, sha = parse_trailer(tail, size, path)
        manifest = parse_manifest(os.pread(fd, manifest_len, body_len), sha, path, body_len)
        if manifest["digest"] != digest:
            raise UsageError(f"the cache directory {directory} holds the cache of another"
                             " pipeline (other sources, format, options, decoder, stages"
                             " before .cache() or their seeds, shard or worker/rank): refused;"
                             " delete it or give another directory")
        result = _CacheFile(fd, path, size, body_len, manifest)
        fd = -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


# -- the stage's blocks ---------------------------------------------------------------------------
def cached_blocks(stage: Any, run: Any, position: int) -> Iterator[tuple]:
    """The blocks of the cache at ``position`` for this epoch: served from a complete cache, or
    the upstream's (built here, as epoch :data:`FILL_EPOCH`), kept while they pass."""
    digest, place = cache_digest(run.ds, position)
    batched = any(s.makes_batches for s in run.ds._stages[:position])
    found = None
    if stage.directory is None:
        complete = stage.memory.get(digest)
        sink: Any = None if complete is not None else _MemorySink(
            stage.memory, digest, stage.max_bytes or DEFAULT_MAX_BYTES)
    else:
        make_directory(stage.directory)  # before anything in it is trusted
        path = os.path.join(stage.directory, f"{_FILE_PREFIX}{place}.bin")
        found = _fresh(open_cache_file(path, digest, stage.directory))
        complete = None if found is None else found.complete()
        # Asked before the upstream is built (it may open the sources at once: a prefetch).
        prefix = run.ds._stages[:position]
        sink = None if found is not None else _FileSink(
            stage.directory, path, digest, stage.max_bytes,
            file_identities(local_files(run.ds, prefix)),
            remote_identities(remote_urls(run.ds, prefix)))
    if complete is not None:
        try:
            yield from _serve(complete, run, batched)
        finally:
            if found is not None:
                found.close()  # also when the blocks were never started
        return
    view, blocks = run.upstream(position, FILL_EPOCH, track_ids=not batched)
    try:
        for items, ids in blocks:
            if not items:
                continue
            sink.add(items, ids, batched)
            yield items, (ids if run.track_ids else None)
        sink.commit(_Complete(None, dict(view.names), view.header, view.header_source))
    except GeneratorExit:
        # The consumer stopped before the stages before the cache ended (a take() after it,
        # a loop that breaks early): nothing is kept, and every such epoch reads the sources
        # again. Said once per cache, as tf.data does, since it defeats the cache silently.
        if stage.memory.first_early_stop():
            warnings.warn(f"{stage.call()} was not filled: the epoch stopped before the"
                          " stages before the cache ended (a take() after the cache, or a loop"
                          " that breaks early); a cache keeps only a complete epoch, so each"
                          " epoch that stops early reads the sources again", StreamioWarning,
                          stacklevel=2)
        raise
    finally:
        sink.abandon()  # nothing, once committed
        close_blocks(blocks)


def _fresh(found: Optional[_CacheFile]) -> Optional[_CacheFile]:
    """``found`` if every local file it records is as it was when it was filled; else None
    (closed), with a warning naming the file: the epoch then fills the cache anew."""
    if found is None:
        return None
    changed = changed_source(found.manifest["files"], found.manifest["remote"])
    if changed is None:
        return found
    found.close()
    warnings.warn(f"cache file {found.path} is stale: source {changed} changed (or is gone) since"
                  " the cache was filled; not served, this epoch fills it again from the"
                  " sources", StreamioWarning, stacklevel=3)
    return None


def _serve(complete: _Complete, run: Any, batched: bool) -> Iterator[tuple]:
    run.names.update(complete.names)
    if complete.header is not None and run.decoder is not None:
        from .epoch import takes_header

        if takes_header(run.decoder):
            run.use_header(complete.header, complete.header_source)
    blocks = complete.blocks
    try:
        for items, ids in blocks:
            yield [_copy_item(x) for x in items] if batched else list(items), (
                ids if run.track_ids else None)
    finally:
        close_blocks(blocks)

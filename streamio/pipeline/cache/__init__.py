"""``Dataset.cache()``: what the stages before it produce, kept from the first complete epoch.

An epoch that finds no complete cache *fills* one: it runs the stages before the cache as epoch
:data:`FILL_EPOCH` (so the cache holds the same items whichever epoch fills it, and a resumed
epoch can rebuild them), hands their items on and keeps them; the cache becomes complete only
when the upstream ends normally (in memory: put in place; in a directory: a temp file renamed
into place). An epoch that finds a complete cache never builds its upstream: no source is opened
(a Pipe-mode channel's later FIFOs are never asked for), no prefetch thread or map pool starts.
The stages after the cache run anew each epoch, with the epoch's number.

**Memory** (``directory=None``): the items themselves (decoded arrays made read-only, so an
in-place change raises), at most ``max_bytes`` (:data:`DEFAULT_MAX_BYTES`) counted as the
shuffle buffer counts; beyond it the epoch fails with a :class:`~streamio.UsageError`.
**Files** (``directory=...``): one file per reader (rank, worker, shard), named by its place, in
the format of :mod:`.cache_format`, recording the digest of the pipeline before the cache
(:func:`cache_digest`; not the epoch): a file with another digest is a UsageError naming the
directory. It also records what identifies the sources behind that digest (:mod:`.cache_sources`:
a local regular file's ``os.stat``, an HTTP(S) or S3 object's ETag, Last-Modified and size) when
the fill began, checked again before a complete file is served: one changed or gone makes the
cache *stale* (not served; a :class:`~streamio.errors.StreamioWarning` names it; the epoch fills
it anew), and one that changed during the fill keeps the fill's file out of place (its items may
be neither the old contents nor the new). A warning, not an error: the epoch went as it would
have without the cache. A file of an earlier format version is stale too; one of a version no
streamio wrote is refused. FIFOs, channels, stdin, bytes and file objects are not checked.

The file is input another local user could have written: opened without following a link,
served only if it is a regular file of ours that others cannot write, parsed as data
(:mod:`.cache_format`); the directory is private (:mod:`.cache_dir`). The guide:
docs/resume.md, "Caching a slow stream"; the trust: docs/security.md, "Cache directories".
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
import threading
import warnings
from typing import Any, Iterator, Optional

import numpy as np

from ...decoders.sparse import SparseBatch
from ...errors import CorruptRecordError, SourceError, StreamioWarning, UsageError
from .directory import private_directory
# The format's names, also read here by the tests and the fuzz target (as before the split).
from .file_format import (_BLOCK, _BLOCK_MAGIC, _MAGIC, _TRAILER, VERSION,  # noqa: F401
                           block_header, check_counts, check_payload, decode_block, encode_block,
                           encode_header, manifest_and_trailer, older_version, parse_block_header,
                           parse_cache, parse_manifest, parse_trailer)
from .sources import (changed_source, file_identities, local_files, remote_identities,
                            remote_urls)
from ..shuffle import estimate_nbytes
from ..stages import close_blocks

__all__ = ["DEFAULT_MAX_BYTES", "FILL_EPOCH", "MemoryCache", "cache_digest", "cached_blocks",
           "encode_block", "parse_cache", "parse_manifest", "parse_trailer", "decode_block"]

#: The memory cache's default bound: 1 GiB, a size most training hosts hold beside a model
#: without swapping; a larger dataset belongs in a directory (``directory=``).
DEFAULT_MAX_BYTES = 1 << 30
#: The epoch the stages before a cache run as, whichever epoch fills it.
FILL_EPOCH = 0
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
    from ..resume import describe_chain, stage_seeds

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
        self._write([block_header(kind, chunks)] + chunks)
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
        manifest, trailer = manifest_and_trailer({
            "digest": self.digest, "blocks": self.blocks, "items": self.items,
            "names": {str(k): v for k, v in complete.names.items()},
            "header": encode_header(complete.header), "header_source": complete.header_source,
            "files": self.files, "remote": self.remote,
        }, self.written)
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
                check_payload(payload, sha, self.path, pos)
                block = decode_block(kind, payload, self.path, pos + _BLOCK.size)
                blocks += 1
                items += len(block[0])
                yield block
                pos += _BLOCK.size + length
            check_counts(self.manifest, blocks, items, self.path)
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
        older = older_version(tail)
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
        from ..epoch import takes_header

        if takes_header(run.decoder):
            run.use_header(complete.header, complete.header_source)
    blocks = complete.blocks
    try:
        for items, ids in blocks:
            yield [_copy_item(x) for x in items] if batched else list(items), (
                ids if run.track_ids else None)
    finally:
        close_blocks(blocks)

"""``streamio pack``: many small files -> a few record shards (TFRecord or im2rec RecordIO).

Small files are slow on any network storage (a metadata round trip and a request per file);
shards of 1-128 MB are not. :func:`pack` walks an ImageFolder tree (one folder per class) or reads
a manifest of ``path,label`` rows, and writes shards of about ``shard_size`` bytes:

* ``format="tfrecord"``: each record a ``tf.train.Example`` with ``image/encoded`` (image files)
  or ``data`` (anything else), ``label`` (int64 class index) and ``filename`` (the path relative to
  the source folder), read back by ``streamio.Example``;
* ``format="recordio"``: each record MXNet's im2rec layout, a 24-byte IRHeader (``u32 flag=0,
  f32 label, u64 id, u64 id2=0``) then the file's bytes, read back by ``streamio.ImageRecord``.

The plan (which file goes to which shard) is made first, from the sorted (or seeded-shuffled)
file list and the files' sizes, so it is the same on every run: a shard is written under a
temporary name and renamed when whole, and a re-run of the same plan skips the shards that exist
(an interrupted pack resumes); shards of a different earlier run under the same prefix are refused
(``replace=True`` removes them), never mixed in. Files are read ``jobs`` at a time with a bounded look-ahead; nothing holds more
than a few files' bytes. A file that cannot be read is reported, then skipped or fatal
(``on_error``), never dropped silently. Nothing outside ``src`` reaches a shard unless asked:
a symbolic link below ``src`` is refused by name (``follow_links=True`` follows them), and each
file is opened component by component from ``src``'s descriptor without following a link
(:mod:`~streamio.sources.local_tree`). ``index=True`` writes beside each shard an index of
``offset length`` lines per record (DALI's and the ``tfrecord`` package's format; offsets in the
uncompressed stream), or MXNet's ``.idx`` (``id<TAB>offset``) for RecordIO.
"""

from __future__ import annotations

import concurrent.futures
import csv
import errno
import glob
import json
import os
import random
import re
import stat
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

from ..decoders import encode_example
from ..errors import PackError, UsageError
from ..formats import encode_recordio, encode_tfrecord
from ..sources.local_tree import LocalTree, check_no_links
from .index import index_path, write_index_file
from .pack_checks import check_inside, claim_prefix, create_temp, image_problem, printable

#: 64 MB: inside the 1-128 MB range that keeps per-request costs small on network storage while
#: a shard still streams in about a second.
DEFAULT_SHARD_SIZE = 64 << 20
DEFAULT_JOBS = 8
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_IR_HEADER = struct.Struct("<IfQQ")  # im2rec IRHeader: flag, label, id, id2
_EXAMPLE_OVERHEAD = 64  # feature names and framing, for planning only
_SUFFIX = {"tfrecord": ".tfrecord", "recordio": ".rec"}


@dataclass
class PackResult:
    """What :func:`pack` did: counts, the shard paths, files skipped (path, reason) and the
    shards left as they were by an earlier run."""

    files: int = 0
    bytes: int = 0
    shards: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    resumed_shards: int = 0
    classes: list = field(default_factory=list)
    format: str = "tfrecord"
    seconds: float = 0.0
    payload_keys: list = field(default_factory=list)  # Example keys used: image/encoded, data

    def dataset_line(self) -> str:
        """The ``Dataset(...)`` that reads the shards back."""
        if not self.shards:
            return "# no shards were written"
        globs = exact_globs(self.shards)
        pattern = globs[0] if len(globs) == 1 else "[" + ", ".join(f'"{g}"' for g in globs) + "]"
        if self.format == "tfrecord":
            mixed = len(self.payload_keys) > 1
            payload = ", ".join(f'"{key}": FixedLen([], "bytes"' + (', default=b""' if mixed
                                                                      else "") + ")"
                                for key in self.payload_keys)
            decoder = (f'Example({{{payload}, "label": FixedLen([], "int64"),'
                       ' "filename": FixedLen([], "bytes")})')
            return f'Dataset({_quoted(pattern)}, "tfrecord", decoder={decoder})'
        return f'Dataset({_quoted(pattern)}, "recordio", decoder=ImageRecord())'


def _quoted(pattern: str) -> str:
    return pattern if pattern.startswith("[") else f'"{pattern}"'


def exact_globs(paths: Sequence[str]) -> list:
    """Glob patterns that match exactly ``paths`` and no other name: for numbered shards
    ``p-00000.x`` ... ``p-00011.x``, ``["p-0000[0-9].x", "p-0001[0-1].x"]`` (at most a few
    patterns per digit); the paths themselves when they are not such a run."""
    paths = list(paths)
    if len(paths) == 1:
        return [glob.escape(paths[0])]
    prefix = os.path.commonprefix(paths)
    suffix = os.path.commonprefix([p[::-1] for p in paths])[::-1]
    prefix = prefix.rstrip("0123456789")  # the numbers are whole, of one width
    suffix = suffix.lstrip("0123456789")
    numbers = [p[len(prefix):len(p) - len(suffix)] for p in paths]
    width = len(numbers[0])
    if not (width and all(len(n) == width and n.isdigit() for n in numbers)):
        return [glob.escape(p) for p in paths]
    values = sorted(int(n) for n in numbers)
    if values != list(range(values[0], values[0] + len(values))):
        return [glob.escape(p) for p in paths]
    head, tail = glob.escape(prefix), glob.escape(suffix)
    return [head + part + tail for part in _digit_globs(values[0], values[-1], width)]


def _digit_globs(lo: int, hi: int, width: int) -> list:
    """Patterns of ``width`` digits matching exactly the numbers ``lo``..``hi``."""
    if width == 0:
        return [""]
    step = 10 ** (width - 1)
    top_lo, top_hi = lo // step, hi // step
    if top_lo == top_hi:
        return [str(top_lo) + rest for rest in _digit_globs(lo % step, hi % step, width - 1)]
    out = []
    first_full, last_full = top_lo, top_hi
    if lo % step:  # the first leading digit covers only part of its range
        out += [str(top_lo) + rest for rest in _digit_globs(lo % step, step - 1, width - 1)]
        first_full += 1
    if hi % step != step - 1:
        last_full -= 1
    if first_full <= last_full:
        digit = str(first_full) if first_full == last_full else f"[{first_full}-{last_full}]"
        out.append(digit + "[0-9]" * (width - 1))
    if hi % step != step - 1:
        out += [str(top_hi) + rest for rest in _digit_globs(0, hi % step, width - 1)]
    return out


@dataclass(frozen=True)
class _Item:
    path: str
    rel: str
    label: int
    size: int
    id: int
    mtime_ns: int = 0
    outside: bool = False  # a manifest entry outside SRC_DIR (allow_outside_src): opened as named


_LINK_HINT = "pass follow_links=True (--follow-links) to pack what links point at"


def _walk_folders(tree: LocalTree, extensions: Optional[Sequence[str]]) -> tuple:
    """ImageFolder: class names are the sorted top-level folders, labels their indices. Links
    below SRC_DIR are refused unless the tree follows them (:mod:`~streamio.sources.local_tree`).
    Returns ``(classes, [(path, rel, label, stat)])``."""
    classes = tree.folders()
    if not classes:
        raise UsageError(f"{tree.root} has no class folders (ImageFolder layout: one folder per"
                         " class)")
    found = []
    seen: set = set()  # following links: a folder reached from two classes is walked once
    for label, name in enumerate(classes):
        for rel, st in tree.files(name, files_first=True, seen=seen):
            if extensions and not rel.lower().endswith(tuple(extensions)):
                continue
            found.append((os.path.join(tree.root, rel), rel, label, st))
    return classes, found


def _read_manifest(manifest: str, src: str, allow_outside: bool = False) -> tuple:
    """``path,label`` rows (CSV with or without a header) or JSON lines ``{"path", "label"}``;
    paths relative to ``src`` (and inside it unless ``allow_outside``); string labels become
    indices of their sorted set. Bytes that are not UTF-8 stand for themselves (file names)."""
    rows = []
    numbers = []
    with open(manifest, newline="", encoding="utf-8", errors="surrogateescape") as f:
        if manifest.endswith((".jsonl", ".json")):
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        entry = json.loads(line)
                        rows.append((entry["path"], entry["label"]))
                        numbers.append(number)
                    except (ValueError, KeyError, TypeError):
                        raise UsageError(f"{manifest} line {number}: expected"
                                         ' {"path": ..., "label": ...}') from None
        else:
            for number, row in enumerate(csv.reader(f), 1):
                if not row or (number == 1 and row[:2] == ["path", "label"]):
                    continue
                if len(row) < 2:
                    raise UsageError(f"{manifest} line {number}: expected path,label")
                rows.append((row[0], row[1]))
                numbers.append(number)
    for (path, _), number in zip(rows, numbers):
        if not isinstance(path, str):
            raise UsageError(f"{manifest} line {number}: the path must be a string")
        if not allow_outside:
            check_inside(path, manifest, number)
    labels = [label for _, label in rows]
    numeric = all(isinstance(x, int) or (isinstance(x, str) and x.strip().lstrip("-").isdigit())
                  for x in labels)
    if numeric:
        classes = []
        index = {x: int(x) for x in labels}
    else:
        classes = sorted({str(x) for x in labels})
        index = {x: classes.index(str(x)) for x in labels}
    found = [(os.path.join(src, p), p, index[label], None) for p, label in rows]
    return classes, found


def _plan(items: list, shard_size: int) -> list:
    """Cut the items into shards of about ``shard_size`` (estimated from file sizes)."""
    shards: list = []
    current: list = []
    size = 0
    for item in items:
        estimate = item.size + len(item.rel) + _EXAMPLE_OVERHEAD
        if current and size + estimate > shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(item)
        size += estimate
    if current:
        shards.append(current)
    return shards


def _payload_key(rel: str) -> str:
    return "image/encoded" if rel.lower().endswith(IMAGE_EXTENSIONS) else "data"


def _encode(item: _Item, data: bytes, format: str) -> bytes:
    if format == "tfrecord":
        # os.fsencode: the name's own bytes, also where they are not UTF-8.
        example = encode_example({_payload_key(item.rel): data, "label": item.label,
                                  "filename": os.fsencode(item.rel)})
        return encode_tfrecord(example)
    header = _IR_HEADER.pack(0, float(item.label), item.id, 0)
    return encode_recordio(header + data)


class _Progress:
    """files, MB, MB/s and ETA on one line of stderr (a terminal's, or when asked)."""

    def __init__(self, total_files: int, total_bytes: int, stream: Optional[TextIO]) -> None:
        self.total_files, self.total_bytes = total_files, total_bytes
        self.stream = stream
        self.start = time.monotonic()
        self.last = 0.0

    def update(self, files: int, nbytes: int, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = nbytes / elapsed
        left = (self.total_bytes - nbytes) / rate if rate > 0 else float("inf")
        eta = f"{left:,.0f} s" if left != float("inf") else "?"
        self.stream.write(f"\rpacked {files}/{self.total_files} files, {nbytes / 1e6:,.1f}"
                          f"/{self.total_bytes / 1e6:,.1f} MB, {rate / 1e6:,.1f} MB/s,"
                          f" ETA {eta}   ")
        self.stream.flush()

    def done(self) -> None:
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def _read_all(items: list, jobs: int, tree: LocalTree) -> Iterator[tuple]:
    """(item, bytes or the OSError) in order, ``jobs`` files read at once, a bounded window.
    Files below SRC_DIR are opened through ``tree`` (no component a link, unless it follows
    them: a link swapped in since the walk fails the open, ``ELOOP``)."""
    def read(item: _Item):
        try:
            fd = os.open(item.path, os.O_RDONLY) if item.outside else tree.open(item.rel)
            with open(fd, "rb") as f:
                return f.read()
        except OSError as exc:
            return exc

    if jobs <= 1:
        for item in items:
            yield item, read(item)
        return
    window = jobs * 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        pending: list = []
        it = iter(items)
        for item in it:
            pending.append((item, pool.submit(read, item)))
            if len(pending) >= window:
                first, fut = pending.pop(0)
                yield first, fut.result()
        for item, fut in pending:
            yield item, fut.result()


def pack(src: str, out_prefix: str, *, format: str = "tfrecord",
         shard_size: int = DEFAULT_SHARD_SIZE, labels: str = "folders",
         manifest: Optional[str] = None, compression: Optional[str] = None,
         shuffle: bool = False, seed: Optional[int] = None, jobs: int = DEFAULT_JOBS,
         index: bool = False, on_error: str = "raise",
         extensions: Optional[Sequence[str]] = None,
         progress: Optional[bool] = None, replace: bool = False,
         allow_outside_src: bool = False, follow_links: bool = False) -> PackResult:
    """Pack the files under ``src`` into shards ``<out_prefix>-NNNNN.tfrecord`` (or ``.rec``).

    ``labels="folders"``: ImageFolder (labels from the sorted class folder names); or pass
    ``manifest=`` (CSV ``path,label`` or JSON lines), paths relative to ``src``. ``compression``:
    None or ``"gzip"`` (``.gz`` shards). ``shuffle``: a seeded file order (``seed`` required, so a
    re-run makes the same plan). ``jobs``: files read at once. ``index``: write record indexes.
    ``on_error``: ``"raise"`` (a :class:`PackError` naming the file) or ``"skip"`` (reported in
    the result and on stderr). ``progress``: a status line on stderr (default: when stderr is a
    terminal). ``replace``: remove the shards (and indexes) an earlier, different run left
    under ``out_prefix`` instead of refusing to mix with them (a re-run of the same plan, an
    interrupted pack, resumes without it). ``allow_outside_src``: pack manifest entries that
    lie outside ``src`` (absolute paths, ``..``). ``follow_links``: pack what symbolic links
    below ``src`` point at (each folder walked once); without it a link (a file, a folder at any
    depth, a class folder, a component of a manifest entry) is refused with a
    :class:`UsageError` naming it, and files are opened without following any link below
    ``src``, so nothing outside ``src`` reaches a shard (``src`` itself may be a link: it is
    the folder you named). Image files whose header does not read, or
    that are cut short, are bad files for ``on_error``. Returns a :class:`PackResult`; see the
    module docstring for the record layout.
    """
    _check_pack_options(src, format, compression, on_error, shard_size, jobs, shuffle, seed)
    started = time.monotonic()
    with LocalTree(src, follow_links=follow_links, hint=_LINK_HINT) as tree:
        return _pack(tree, out_prefix, format, shard_size, labels, manifest, compression,
                     shuffle, seed, jobs, index, on_error, extensions, progress, replace,
                     allow_outside_src, started)


def _pack(tree: LocalTree, out_prefix: str, format: str, shard_size: int, labels: str,
          manifest: Optional[str], compression: Optional[str], shuffle: bool,
          seed: Optional[int], jobs: int, index: bool, on_error: str,
          extensions: Optional[Sequence[str]], progress: Optional[bool], replace: bool,
          allow_outside_src: bool, started: float) -> PackResult:
    classes, items, skipped = _gather(tree, labels, manifest, extensions, allow_outside_src,
                                      on_error)
    if shuffle:
        random.Random(seed).shuffle(items)
    plan = _plan(items, shard_size)
    out_dir = os.path.dirname(os.path.abspath(out_prefix))
    os.makedirs(out_dir, exist_ok=True)
    suffix = _SUFFIX[format] + (".gz" if compression else "")
    record_plan = claim_prefix(out_prefix, plan, [f"{out_prefix}-{n:05d}{suffix}" for n in range(len(plan))],
                 {"format": format, "compression": compression, "index": index,
                  "on_error": on_error}, replace=replace)
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Progress(len(items), sum(item.size for item in items), sys.stderr if show else None)
    result = PackResult(classes=classes, format=format, skipped=skipped,
                        payload_keys=sorted({_payload_key(item.rel) for item in items}))
    for path, reason in skipped:
        print(f"streamio pack: skipped {printable(path)}: {reason}", file=sys.stderr)
    _write_shards(plan, f"{out_prefix}-{{:05d}}{suffix}", record_plan, bar, result,
                  lambda path, shard, update: _write_shard(path, shard, format, compression, jobs,
                                                           index, on_error, result, update,
                                                           tree))
    result.seconds = time.monotonic() - started
    return result


def _check_pack_options(src: str, format: str, compression: Optional[str], on_error: str,
                        shard_size: Any, jobs: Any, shuffle: bool, seed: Optional[int]) -> None:
    """:func:`pack`'s argument checks, before anything is read or written."""
    if format not in _SUFFIX:
        raise UsageError(f"format must be 'tfrecord' or 'recordio', not {format!r}")
    if compression not in (None, "gzip"):
        raise UsageError(f"compression must be None or 'gzip', not {compression!r}")
    if on_error not in ("raise", "skip"):
        raise UsageError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise UsageError(f"shard_size must be a positive number of bytes, not {shard_size!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"jobs must be a positive int, not {jobs!r}")
    if shuffle and seed is None:
        raise UsageError("shuffle=True needs a seed, so that a re-run resumes the same plan")
    if not os.path.isdir(src):
        raise UsageError(f"not a directory: {src}")


def _gather(tree: LocalTree, labels: str, manifest: Optional[str],
            extensions: Optional[Sequence[str]], allow_outside_src: bool,
            on_error: str) -> tuple:
    """``(classes, items, skipped)``: the files to pack (from the class folders or the
    manifest), each stat'ed once, and the ``(path, reason)`` of those that could not be."""
    if manifest is not None:
        classes, found = _read_manifest(manifest, tree.root, allow_outside_src)
    elif labels == "folders":
        classes, found = _walk_folders(tree, extensions)
    else:
        raise UsageError(f"labels must be 'folders' (or pass manifest=), not {labels!r}")
    items = []
    skipped = []
    for i, (path, rel, label, st) in enumerate(found):
        outside = _outside(rel)
        try:
            if st is None and outside:
                st = os.stat(path)
            elif st is None:
                st = _stat_entry(tree, rel)
            elif stat.S_ISLNK(st.st_mode):  # following links, one that leads nowhere
                os.stat(path)
        except OSError as exc:
            if on_error == "raise":
                raise PackError(f"cannot read ({exc.strerror})", path=path) from exc
            skipped.append((path, exc.strerror))
            continue
        items.append(_Item(path, rel, label, st.st_size, i, st.st_mtime_ns, outside))
    return classes, items, skipped


def _outside(rel: str) -> bool:
    """A manifest entry outside SRC_DIR (absolute, or ``..`` out of it)."""
    normal = os.path.normpath(rel)
    return os.path.isabs(rel) or normal == os.pardir or normal.startswith(os.pardir + os.sep)


def _stat_entry(tree: LocalTree, rel: str) -> os.stat_result:
    """A manifest entry's stat, through ``tree`` (no component a link unless it follows them):
    an entry that passes through a link is refused, naming the link."""
    try:
        return tree.stat(rel)
    except OSError as exc:
        if not tree.follow_links and exc.errno in (errno.ELOOP, errno.ENOTDIR):
            check_no_links(tree.root, os.path.normpath(rel), tree.hint)
        raise


def _write_shards(plan: list, name: str, record_plan: Optional[Callable[[], None]],
                  bar: _Progress, result: PackResult,
                  write: Callable[[str, list, Callable[[int, int], None]], int]) -> None:
    """Write each shard of ``plan`` (``name.format(number)``) that is not there whole yet (a
    whole one an earlier run wrote is counted as resumed); ``record_plan()`` before the first
    one written, so shards on disk always have their plan."""
    done_files = done_bytes = 0
    for number, shard in enumerate(plan):
        path = name.format(number)
        result.shards.append(path)
        if os.path.exists(path):  # whole: only complete shards get their final name
            result.resumed_shards += 1
            done_files += len(shard)
            done_bytes += sum(item.size for item in shard)
            result.files += len(shard)
            result.bytes += os.stat(path).st_size  # a whole shard an earlier run wrote
            bar.update(done_files, done_bytes)
            continue
        if record_plan is not None:
            record_plan()
            record_plan = None
        written = write(path, shard, lambda n, b: bar.update(done_files + n, done_bytes + b))
        done_files += len(shard)
        done_bytes += sum(item.size for item in shard)
        result.bytes += written
    bar.update(done_files, done_bytes, force=True)
    bar.done()


def _write_shard(path: str, shard: list, format: str, compression: Optional[str], jobs: int,
                 index: bool, on_error: str, result: PackResult, report,
                 tree: LocalTree) -> int:
    """Write one shard under a temporary name, then rename it (and its index) into place."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31) if compression else None
    offsets: list = []
    position = written = 0
    files = nbytes = 0
    with create_temp(path) as f:
        for item, data in _read_all(shard, jobs, tree):
            problem = _bad_file(item, data)
            if problem is not None:
                if on_error == "raise":
                    raise PackError(problem, path=printable(item.path)) from (
                        data if isinstance(data, OSError) else None)
                result.skipped.append((item.path, problem))
                print(f"streamio pack: skipped {printable(item.path)}: {problem}",
                      file=sys.stderr)
                continue
            frame = _encode(item, data, format)
            offsets.append((item.id, position, len(frame)))
            position += len(frame)
            out = compressor.compress(frame) if compressor else frame
            f.write(out)
            written += len(out)
            files += 1
            nbytes += item.size
            result.files += 1
            report(files, nbytes)
        if compressor:
            tail = compressor.flush()
            f.write(tail)
            written += len(tail)
        if index:
            _write_index(path, offsets, format)  # renamed into place before the shard
    return written


def _bad_file(item: _Item, data) -> Optional[str]:
    """Why a file cannot be packed (unreadable; an image that will not decode), or None."""
    if isinstance(data, OSError):
        return f"cannot read ({data.strerror})"
    if _payload_key(item.rel) == "image/encoded":
        problem = image_problem(data)
        if problem is not None:
            return f"bad image: {problem}"
    return None


def _index_path(shard: str, format: str) -> str:
    return index_path(shard, format)


def _write_index(shard: str, offsets: list, format: str) -> None:
    write_index_file(_index_path(shard, format), format, offsets)  # (record id, offset, length)


def _size(text: str) -> int:
    """``--shard-size``: bytes, or a number with K, M, G, T (binary: ``64MB`` is 64 MiB), also
    written KB/KiB/Ki, MB/MiB..., any case (``1GiB``, ``512k``, ``1.5 GB``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT])(?:I?B|I)?|B)?\s*", text,
                         re.IGNORECASE)
    if match is None:
        raise UsageError(f"not a size: {text!r} (e.g. 64MB, 1GiB, 500000)")
    unit = (match.group(2) or "").upper()
    value = float(match.group(1)) * (1 << (10 * " KMGT".index(unit))) if unit else float(
        match.group(1))
    if value < 1:
        raise UsageError(f"shard size must be positive, not {text!r}")
    return int(value)


def add_cli(sub) -> None:
    p = sub.add_parser("pack", help="pack many small files (an ImageFolder tree) into shards",
                       description="Pack the files under SRC_DIR into record shards"
                                   " OUT_PREFIX-NNNNN.tfrecord (or .rec) of about --shard-size.")
    p.add_argument("src", metavar="SRC_DIR")
    p.add_argument("out_prefix", metavar="OUT_PREFIX")
    p.add_argument("--format", "-f", default="tfrecord", choices=("tfrecord", "recordio"))
    p.add_argument("--shard-size", default="64MB", help="target shard size (default 64MB)")
    p.add_argument("--labels", default="folders", choices=("folders",),
                   help="labels from the class folder names (ImageFolder)")
    p.add_argument("--manifest", help="CSV path,label rows or JSON lines instead of folders")
    p.add_argument("--compression", choices=("gzip",), default=None)
    p.add_argument("--shuffle", action="store_true", help="a seeded file order (needs --seed)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="files read at once")
    p.add_argument("--index", action="store_true", help="write a record index per shard")
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="an unreadable file (or an image that will not decode) fails the run,"
                        " or is reported and skipped")
    p.add_argument("--replace", action="store_true",
                   help="remove the shards and indexes an earlier, different run left under"
                        " OUT_PREFIX (without it such a run is refused, never mixed in)")
    p.add_argument("--allow-outside-src", action="store_true",
                   help="pack manifest entries outside SRC_DIR (absolute paths, '..')")
    p.add_argument("--follow-links", action="store_true",
                   help="pack what symbolic links below SRC_DIR point at (without it a link is"
                        " refused, naming it: one planted in a folder others may write could"
                        " pull in files they may not read)")
    p.set_defaults(func=cmd_pack)


def cmd_pack(args) -> int:
    result = pack(args.src, args.out_prefix, format=args.format,
                  shard_size=_size(args.shard_size), labels=args.labels, manifest=args.manifest,
                  compression=args.compression, shuffle=args.shuffle, seed=args.seed,
                  jobs=args.jobs, index=args.index, on_error=args.on_error,
                  replace=args.replace, allow_outside_src=args.allow_outside_src,
                  follow_links=args.follow_links)
    rate = result.bytes / result.seconds / 1e6 if result.seconds > 0 else 0.0
    print(f"packed {result.files} files into {len(result.shards)} shards"
          f" ({result.bytes / 1e6:,.1f} MB, {result.files / max(result.seconds, 1e-9):,.0f}"
          f" files/s, {rate:,.1f} MB/s"
          + (f"; {result.resumed_shards} shards of the same plan already there"
             if result.resumed_shards else "")
          + ")")
    if result.classes:
        shown = ", ".join(f"{i}={printable(str(name))}"
                          for i, name in enumerate(result.classes[:10]))
        print(f"classes: {shown}" + (" ..." if len(result.classes) > 10 else ""))
    if result.skipped:
        print(f"skipped {len(result.skipped)} files: unreadable, or images that will not"
              " decode (listed on stderr)")
    print(f"read them with: {printable(result.dataset_line())}")
    return 0


__all__ = ["DEFAULT_SHARD_SIZE", "PackError", "PackResult", "add_cli", "pack"]

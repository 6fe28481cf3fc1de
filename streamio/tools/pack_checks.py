"""What ``streamio pack`` checks before it trusts its inputs and its output directory.

* Manifest entries must stay inside ``SRC_DIR`` (no absolute paths, no ``..`` out of it) unless
  the user allows it: a manifest written elsewhere must not pull in a file beside the tree.
* Shards of an earlier run under the same prefix are never mixed with this run's: a re-run
  resumes only the same plan (recorded in a hidden file beside the shards), else it refuses,
  naming them, unless asked to replace them.
* Files are created under unpredictable names, exclusively and without following links
  (``tempfile.mkstemp`` in the destination directory), then renamed into place.
* Image files are checked as they are packed (their header, and that they are not cut short),
  so a broken one is reported by ``pack`` rather than by training.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import warnings
from typing import Any, BinaryIO, Callable, Optional

from ..errors import UsageError

__all__ = ["check_inside", "claim_prefix", "create_temp", "earlier_outputs", "image_problem",
           "printable"]

_PLAN_RECORD = ".{base}.streamio-pack.json"
_SHARD_NAME = r"-\d{5,}\.(?:tfrecord|rec)(?:\.gz)?(?:\.index|\.idx)?"


def printable(text: str) -> str:
    """``text`` (a path that may hold undecodable bytes, as ``surrogateescape`` keeps them) in a
    form any terminal can show: those bytes as ``\\xNN``."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# -- manifest entries -------------------------------------------------------------------------
def check_inside(entry: str, manifest: str, number: int) -> None:
    """Refuse a manifest entry that leaves the source directory (``allow_outside_src`` lets it)."""
    if os.path.isabs(entry):
        raise UsageError(f"{printable(manifest)} line {number}: {printable(entry)!r} is an"
                         " absolute path, outside SRC_DIR (pass allow_outside_src=True /"
                         " --allow-outside-src to pack it anyway)")
    normal = os.path.normpath(entry)
    if normal == os.pardir or normal.startswith(os.pardir + os.sep):
        raise UsageError(f"{printable(manifest)} line {number}: {printable(entry)!r} leaves"
                         " SRC_DIR through '..' (pass allow_outside_src=True /"
                         " --allow-outside-src to pack it anyway)")


# -- earlier runs -----------------------------------------------------------------------------
def earlier_outputs(out_prefix: str) -> list:
    """The shards and shard indexes ``pack`` would have written under ``out_prefix``, sorted."""
    folder = os.path.dirname(os.path.abspath(out_prefix))
    base = os.path.basename(out_prefix)
    pattern = re.compile(re.escape(base) + _SHARD_NAME)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(folder, n) for n in names if pattern.fullmatch(n))


def _shard_digests(plan: list, planned: list, settings: dict) -> dict:
    """``{shard file name: digest}`` of what decides each shard's bytes: the settings and each
    file's name, label, size, modification time and id. The same digest means a re-run would
    write the same shard."""
    out = {}
    for path, shard in zip(planned, plan):
        text = json.dumps({"settings": settings,
                           "files": [[item.rel, item.label, item.size, item.mtime_ns, item.id]
                                     for item in shard]}, sort_keys=True)
        out[os.path.basename(path)] = hashlib.sha256(text.encode("ascii")).hexdigest()
    return out


def _read_record(path: str) -> dict:
    try:
        with open(path, encoding="ascii") as f:
            record = json.load(f)
        shards = record["shards"]
        return shards if isinstance(shards, dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # missing or damaged: then it vouches for no shard


def claim_prefix(out_prefix: str, plan: list, planned: list, settings: dict, *,
                 replace: bool) -> Callable[[], None]:
    """Make ``out_prefix`` this run's. A shard already there is kept only if the plan recorded
    beside it says an earlier run wrote exactly the shard this run would (an interrupted run
    of the same files and settings), with its index; any other shard or index file of the
    prefix is refused, or removed with ``replace``. Returns the function that records this
    plan: call it before the first shard is written (a run that fails before then leaves
    nothing behind)."""
    from ..errors import PackError  # the error type pack users catch

    folder = os.path.dirname(os.path.abspath(out_prefix))
    record = os.path.join(folder, _PLAN_RECORD.format(base=os.path.basename(out_prefix)))
    digests = _shard_digests(plan, planned, settings)
    old = earlier_outputs(out_prefix)
    if old and not replace:
        recorded = _read_record(record)
        same = {name for name, digest in digests.items() if recorded.get(name) == digest}
        same |= {name + suffix for name in same for suffix in (".index", ".idx")}
        foreign = [p for p in old if os.path.basename(p) not in same]
        if foreign:
            shown = ", ".join(printable(os.path.basename(p)) for p in foreign[:5])
            more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
            raise PackError(f"{len(foreign)} shard file(s) of an earlier, different run are"
                            f" there ({shown}{more}): packing beside them would mix both runs;"
                            " pass replace=True (--replace) to remove them first, or use"
                            " another prefix", path=printable(out_prefix))
    if replace:
        for path in old:
            os.unlink(path)

    def write_record() -> None:
        with create_temp(record) as f:
            f.write(json.dumps({"shards": digests}, sort_keys=True).encode("ascii"))

    return write_record


# -- files created in place -------------------------------------------------------------------
class create_temp:
    """``with create_temp(final) as f:`` writes ``final`` through a file created exclusively
    under a random hidden name in its directory (``mkstemp``: ``O_EXCL|O_NOFOLLOW``, so a link
    planted there is never followed), renamed to ``final`` when the block ends without an
    error, and removed if it raises. Made with the usual permissions (``0666 & ~umask``)."""

    def __init__(self, final: str) -> None:
        self.final = final
        folder, name = os.path.split(os.path.abspath(final))
        fd, self.path = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            self.file: BinaryIO = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(self, kind: Any, *rest: Any) -> None:
        try:
            self.file.close()
            if kind is None:
                os.replace(self.path, self.final)
        finally:
            if kind is not None or os.path.lexists(self.path):
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def _umask() -> int:
    """The process's umask, read from /proc where it can be (setting it to read it back races
    with threads that create files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- images -----------------------------------------------------------------------------------
_JPEG_SOI, _JPEG_SOS, _JPEG_EOI = b"\xff\xd8", b"\xff\xda", b"\xff\xd9"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Pillow's decompression-bomb limit, as streamio.Image's max_pixels default.
_MAX_PIXELS = 89_478_485


def image_problem(data: bytes) -> Optional[str]:
    """Why ``data`` will not decode as an image, or None: its header (Pillow's, where Pillow is
    installed: the format, a size in pixels, within the decoders' limit) and whether it is cut
    short (JPEG: an EOI marker after the last SOS, since the coded data stuffs every 0xFF; PNG:
    every chunk's CRC up to IEND). The pixels are not decoded."""
    if not data:
        return "empty file"
    if data[:2] == _JPEG_SOI:
        if data.find(_JPEG_SOS) < 0:
            return "JPEG without image data (no SOS marker)"
        # Usually the file ends with EOI; only where it does not (bytes after it, or cut short)
        # search the coded data, whose 0xFF bytes make the search slow (~300 MB/s).
        if (not data.rstrip(b"\0").endswith(_JPEG_EOI)
                and data.find(_JPEG_EOI, data.rfind(_JPEG_SOS) + 2) < 0):
            return "JPEG cut short (no EOI marker after its image data)"
    try:
        from PIL import Image as PILImage
    except ImportError:  # pragma: no cover - Pillow is optional: the checks above only
        if data[:8] == _PNG_SIGNATURE and b"IEND" not in data[-12:]:
            return "PNG cut short (no IEND chunk at its end)"
        return None
    try:
        with warnings.catch_warnings(), PILImage.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width < 1 or height < 1:
                return f"image of {width}x{height} pixels"
            if width * height > _MAX_PIXELS:
                return f"{width}x{height} pixels is more than the decoders' {_MAX_PIXELS}"
            if image.format == "PNG":
                image.verify()  # chunk CRCs through IEND; does not inflate the pixels
    except Exception as exc:  # noqa: BLE001 - Pillow reports bad data with many types
        return f"not a readable image ({type(exc).__name__}: {exc})"
    return None

"""A local stand-in for SageMaker's input side, so a training script runs unchanged before it
ships: ``streamio sagemaker-local`` (or :class:`Emulator`) writes the container's two config
files under ``--root`` and lays out each channel the way the chosen input mode would:

* ``File`` / ``FastFile``: copies the channel's objects (files, directories, globs) into
  ``<root>/input/data/<name>/``, keeping their relative paths.
* ``Pipe``: for each epoch creates the FIFO ``<root>/input/data/<name>_<epoch>``, waits for the
  reader, streams the objects into it back to back, closes it and removes it. Options as the
  channel settings: ``gzip`` (objects stored gzip-compressed: the FIFO carries gzip members),
  ``record_wrapper`` (each object, or each manifest attribute, in one RecordIO record),
  ``manifest`` + ``attributes`` (an augmented manifest: JSON lines whose ``*-ref`` attributes
  name files, sent attribute by attribute), ``shuffle_seed`` (the object or line order changes
  every epoch, as ShuffleConfig does).

``hosts``/``host_index`` emulate one host of a multi-host job: ``ShardedByS3Key`` hands this host
every ``hosts``-th object (after the epoch's shuffle), ``FullyReplicated`` all of them.
"""

from __future__ import annotations

import glob as _glob
import json
import os
import random
import shutil
import stat
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence, TextIO

from ..errors import UsageError
from ..formats.recordio import LENGTH_MASK, MAGIC
from ..sources.local_tree import LocalTree, check_glob_match
from ..tools.serve_pipe import open_fifo_writer
from .config import DISTRIBUTIONS, INPUT_MODES, check_channel_name

#: Guessed ContentType by file name (after any ``.gz``) when none is given.
_TYPES_BY_SUFFIX = {
    ".tfrecord": "application/x-tfrecord", ".tfrecords": "application/x-tfrecord",
    ".csv": "text/csv", ".pbr": "application/x-recordio-protobuf",
    ".pb": "application/x-recordio-protobuf", ".rec": "application/x-recordio",
    ".jsonl": "application/jsonlines", ".txt": "text/plain", ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg", ".png": "image/png",
}
_WRITE_CHUNK = 1 << 20
_HEADER = struct.Struct("<II")


@dataclass
class LocalChannel:
    """One channel to emulate. ``paths``: files, directories (recursively) or globs, in order;
    for a manifest channel, ``manifest`` names the JSON-lines file instead."""

    name: str
    paths: Sequence[str] = ()
    content_type: Optional[str] = None
    gzip: bool = False
    record_wrapper: bool = False
    manifest: Optional[str] = None
    attributes: Optional[Sequence[str]] = None
    distribution: str = "FullyReplicated"
    shuffle_seed: Optional[int] = None


_LINK_HINT = "name the file itself (a path you give is followed)"


def _objects(paths: Sequence[str]) -> list:
    """[(key, path)] of the objects ``paths`` name, each directory's files sorted (a folder's
    files before its subfolders). A path given is read as named; a symbolic link inside a
    directory given, or reached by a glob's wildcards, is refused, naming it (as streamio's
    own walks do: :mod:`~streamio.sources.local_tree`)."""
    found = []
    for given in paths:
        text = os.fspath(given)
        if os.path.isfile(text):
            found.append((os.path.basename(text), text))
        elif os.path.isdir(text):
            with LocalTree(text, hint=_LINK_HINT) as tree:
                found.extend((rel, os.path.join(text, rel))
                             for rel, _ in tree.files(files_first=True))
        else:
            matches = []
            for p in sorted(_glob.glob(text, recursive=True)):
                check_glob_match(text, p, _LINK_HINT)
                if os.path.isfile(p):
                    matches.append(p)
            if not matches:
                raise UsageError(f"no files at {text!r}")
            found.extend((os.path.basename(p), p) for p in matches)
    return found


def _guess_type(paths: Sequence[str]) -> Optional[str]:
    for _, path in _objects(paths)[:1]:
        name = path[:-3] if path.endswith(".gz") else path
        return _TYPES_BY_SUFFIX.get(os.path.splitext(name)[1].lower())
    return None


def _wrap(payload: bytes) -> bytes:
    """One object as one RecordIO record (parts of at most 2**29 - 1 bytes, joined as is)."""
    if len(payload) <= LENGTH_MASK:
        parts = [(0, payload)]
    else:
        pieces = [payload[i:i + LENGTH_MASK] for i in range(0, len(payload), LENGTH_MASK)]
        parts = [(1 if k == 0 else 3 if k == len(pieces) - 1 else 2, p)
                 for k, p in enumerate(pieces)]
    return b"".join(_HEADER.pack(MAGIC, (cflag << 29) | len(p)) + p + b"\0" * (-len(p) & 3)
                    for cflag, p in parts)


def _gzip(payload: bytes) -> bytes:
    if payload[:2] == b"\x1f\x8b":
        return payload  # stored compressed already
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(payload) + c.flush()


class Emulator:
    """Emulate SageMaker's input side for ``channels`` under ``root`` (see the module doc)."""

    def __init__(self, root: str, channels: Sequence[LocalChannel], *, mode: str = "File",
                 hosts: int = 1, host_index: int = 0) -> None:
        if mode not in INPUT_MODES:
            raise UsageError(f"mode must be one of {', '.join(INPUT_MODES)}, not {mode!r}")
        if not channels:
            raise UsageError("name at least one channel")
        if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
            raise UsageError(f"hosts must be a positive int, not {hosts!r}")
        if not 0 <= host_index < hosts:
            raise UsageError(f"host_index must be in [0, {hosts}), not {host_index}")
        for ch in channels:
            check_channel_name(ch.name)  # a path under input/data, removed and rewritten there
            if ch.distribution not in DISTRIBUTIONS:
                raise UsageError(f"channel {ch.name}: distribution must be one of"
                                 f" {', '.join(DISTRIBUTIONS)}")
            if ch.manifest and mode != "Pipe":
                raise UsageError(f"channel {ch.name}: SageMaker serves augmented manifests in"
                                 " Pipe mode only")
            if ch.manifest and not ch.attributes:
                raise UsageError(f"channel {ch.name}: a manifest needs its attribute names")
            if ch.record_wrapper and mode != "Pipe":
                raise UsageError(f"channel {ch.name}: RecordIO wrapping applies to Pipe mode"
                                 " only (SageMaker: leave it None in File mode)")
        self.root = os.path.abspath(root)
        self.channels = list(channels)
        self.mode = mode
        self.hosts = hosts
        self.host_index = host_index

    @property
    def data_root(self) -> str:
        return os.path.join(self.root, "input", "data")

    # -- configuration ------------------------------------------------------------------------
    def channel_config(self, ch: LocalChannel) -> dict:
        entry = {
            "TrainingInputMode": self.mode,
            "S3DistributionType": ch.distribution,
            "RecordWrapperType": "RecordIO" if ch.record_wrapper else "None",
            # SageMaker: CompressionType applies to Pipe mode; File mode keeps the .gz files.
            "CompressionType": "Gzip" if ch.gzip and self.mode == "Pipe" else "None",
        }
        content_type = ch.content_type or (None if ch.manifest else _guess_type(ch.paths))
        if content_type:
            entry["ContentType"] = content_type
        if ch.shuffle_seed is not None:
            entry["ShuffleConfig"] = {"Seed": ch.shuffle_seed}
        if ch.attributes:
            entry["AttributeNames"] = list(ch.attributes)
        return entry

    def write_config(self) -> None:
        config_dir = os.path.join(self.root, "input", "config")
        os.makedirs(config_dir, exist_ok=True)
        os.makedirs(self.data_root, exist_ok=True)
        data = {ch.name: self.channel_config(ch) for ch in self.channels}
        hosts = [f"algo-{i + 1}" for i in range(self.hosts)]
        resource = {"current_host": hosts[self.host_index], "hosts": hosts,
                    "network_interface_name": "eth0"}
        # Resources first, each file renamed into place whole: a script that starts as soon as
        # inputdataconfig.json appears never reads half a file.
        for name, value in (("resourceconfig.json", resource), ("inputdataconfig.json", data)):
            path = os.path.join(config_dir, name)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(value, f, indent=2)
            os.replace(path + ".tmp", path)

    # -- what each host gets --------------------------------------------------------------------
    def _share(self, ch: LocalChannel, items: list, epoch: int) -> list:
        items = list(items)
        if ch.shuffle_seed is not None:
            random.Random(f"{ch.shuffle_seed}:{epoch}").shuffle(items)
        if ch.distribution == "ShardedByS3Key":
            items = items[self.host_index::self.hosts]
        return items

    def prepare(self) -> None:
        """Write the config files and the File-mode channel directories."""
        self.write_config()
        if self.mode == "Pipe":
            return
        for ch in self.channels:
            target = os.path.join(self.data_root, ch.name)
            if os.path.exists(target):
                shutil.rmtree(target)
            os.makedirs(target)
            for key, path in self._share(ch, _objects(ch.paths), 0):
                dest = os.path.join(target, key)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                if ch.gzip and not path.endswith(".gz"):
                    with open(path, "rb") as f, open(dest + ".gz", "wb") as out:
                        out.write(_gzip(f.read()))
                else:
                    shutil.copyfile(path, dest)

    # -- Pipe mode ------------------------------------------------------------------------------
    def _manifest_lines(self, ch: LocalChannel) -> list:
        base = os.path.dirname(os.path.abspath(ch.manifest))
        lines = []
        with open(ch.manifest, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        lines.append((number, json.loads(line)))
                    except ValueError as exc:
                        raise UsageError(f"{ch.manifest} line {number}: not JSON ({exc})") from None
        return [(number, base, entry) for number, entry in lines]

    def _payloads(self, ch: LocalChannel, epoch: int):
        """The epoch's objects (or manifest attribute values) as bytes, in stream order."""
        if ch.manifest:
            for number, base, entry in self._share(ch, self._manifest_lines(ch), epoch):
                for attr in ch.attributes or ():
                    if attr not in entry:
                        raise UsageError(f"{ch.manifest} line {number} has no attribute {attr!r}")
                    value = entry[attr]
                    if attr.endswith("-ref"):
                        if not isinstance(value, str) or "://" in value:
                            raise UsageError(f"{ch.manifest} line {number}: {attr} must be a"
                                             f" local path here, not {value!r}")
                        with open(os.path.join(base, value), "rb") as f:
                            yield f.read()
                    elif isinstance(value, str):
                        yield value.encode("utf-8")
                    else:
                        yield json.dumps(value, separators=(",", ":")).encode("utf-8")
            return
        for _, path in self._share(ch, _objects(ch.paths), epoch):
            with open(path, "rb") as f:
                payload = f.read()
            yield _gzip(payload) if ch.gzip else payload

    def serve_channel(self, ch: LocalChannel, epochs: int, *, start_epoch: int = 0,
                      open_timeout: float = 300.0, log: Optional[TextIO] = None) -> None:
        for epoch in range(start_epoch, start_epoch + epochs):
            fifo = os.path.join(self.data_root, f"{ch.name}_{epoch}")
            if os.path.exists(fifo):
                if not stat.S_ISFIFO(os.stat(fifo).st_mode):
                    raise UsageError(f"{fifo} exists and is not a FIFO")
            else:
                os.mkfifo(fifo)
            sent = 0
            try:
                fd = open_fifo_writer(fifo, open_timeout)
                try:
                    for payload in self._payloads(ch, epoch):
                        data = _wrap(payload) if ch.record_wrapper else payload
                        _write_all(fd, data)
                        sent += len(data)
                except BrokenPipeError:
                    if log:
                        print(f"{ch.name} epoch {epoch}: the reader left after {sent} bytes",
                              file=log)
                finally:
                    os.close(fd)
            finally:
                try:
                    os.unlink(fifo)
                except FileNotFoundError:
                    pass
            if log:
                print(f"{ch.name} epoch {epoch}: served {sent} bytes", file=log)

    def serve(self, epochs: int, *, start_epoch: int = 0, open_timeout: float = 300.0,
              log: Optional[TextIO] = None) -> None:
        """Serve every Pipe-mode channel for ``epochs`` epochs (a thread each, so a script may
        open its channels in any order); the first failure is raised once all have stopped."""
        errors: list = []

        def run(ch):
            try:
                self.serve_channel(ch, epochs, start_epoch=start_epoch,
                                   open_timeout=open_timeout, log=log)
            except BaseException as exc:  # reported below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(ch,), daemon=True) for ch in self.channels]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:_WRITE_CHUNK])
        view = view[n:]


# -- the command line -----------------------------------------------------------------------------
def _named(values: Optional[Sequence[str]], default: Optional[str]) -> dict:
    """``NAME=VALUE`` items (a bare VALUE belongs to ``default``) -> {name: [values]}."""
    out: dict = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        if not sep:
            if default is None:
                raise UsageError(f"{item!r}: say which channel, as NAME={item}")
            name, value = default, item
        out.setdefault(name, []).append(value)
    return out


def add_cli(sub) -> None:
    """Register ``streamio sagemaker-local`` on an argparse subparsers object."""
    p = sub.add_parser(
        "sagemaker-local",
        help="emulate SageMaker's input side: config files plus File-mode directories or"
             " Pipe-mode FIFOs",
        description="Write SageMaker's input configuration under ROOT and serve each channel as"
                    " the chosen input mode would (Pipe mode serves the epochs, then exits).")
    p.add_argument("--root", required=True, help="the directory that stands for /opt/ml")
    p.add_argument("--channel", action="append", metavar="NAME=PATH",
                   help="a channel's objects: a file, directory or glob (repeat to add more)")
    p.add_argument("--mode", default="File", choices=INPUT_MODES)
    p.add_argument("--content-type", action="append", metavar="[NAME=]TYPE",
                   help="ContentType (default: guessed from the file names)")
    p.add_argument("--gzip", action="store_true", help="objects stored gzip-compressed")
    p.add_argument("--record-wrapper", choices=("None", "RecordIO"), default="None")
    p.add_argument("--manifest", action="append", metavar="[NAME=]FILE",
                   help="an augmented manifest (JSON lines) for a Pipe-mode channel")
    p.add_argument("--attributes", help="the manifest's attribute names, comma-separated")
    p.add_argument("--distribution", default="FullyReplicated", choices=DISTRIBUTIONS)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("--shuffle-seed", type=int, default=None,
                   help="ShuffleConfig.Seed: the object order changes every epoch")
    p.add_argument("--hosts", type=int, default=1, help="hosts in the emulated job")
    p.add_argument("--host-index", type=int, default=0, help="which host this is (0-based)")
    p.add_argument("--open-timeout", type=float, default=300.0,
                   help="seconds to wait for the reader of each FIFO")
    p.set_defaults(func=cmd_sagemaker_local)


def cmd_sagemaker_local(args) -> int:
    import sys

    paths = _named(args.channel, None)
    manifests = _named(args.manifest, next(iter(paths), "train"))
    types = _named(args.content_type, next(iter(paths), next(iter(manifests), None)))
    names = list(dict.fromkeys(list(paths) + list(manifests)))
    if not names:
        raise UsageError("name a channel: --channel NAME=PATH (or --manifest NAME=FILE)")
    attributes = [a.strip() for a in args.attributes.split(",")] if args.attributes else None
    channels = [LocalChannel(
        name=name, paths=paths.get(name, []), content_type=(types.get(name) or [None])[-1],
        gzip=args.gzip, record_wrapper=args.record_wrapper == "RecordIO",
        manifest=(manifests.get(name) or [None])[-1],
        attributes=attributes if name in manifests else None,
        distribution=args.distribution, shuffle_seed=args.shuffle_seed) for name in names]
    emulator = Emulator(args.root, channels, mode=args.mode, hosts=args.hosts,
                        host_index=args.host_index)
    emulator.prepare()
    print(f"SageMaker input config written under {emulator.root}/input/config", file=sys.stderr)
    if args.mode == "Pipe":
        emulator.serve(args.epochs, start_epoch=args.start_epoch, open_timeout=args.open_timeout,
                       log=sys.stderr)
    else:
        for ch in channels:
            print(f"{ch.name}: files under {os.path.join(emulator.data_root, ch.name)}",
                  file=sys.stderr)
    return 0


__all__ = ["Emulator", "LocalChannel", "add_cli", "cmd_sagemaker_local"]

"""SageMaker channels as Datasets: one training script for File, FastFile and Pipe mode.

``sagemaker.channel("train")`` reads the container's input configuration (:mod:`.config`) and
builds the :class:`~streamio.Dataset` the channel's settings call for (docs/sagemaker.md):

* ``TrainingInputMode``: ``Pipe`` reads the FIFOs ``<name>_<epoch>`` (one per epoch, each
  ``iter()`` the next); ``File``/``FastFile`` the files under ``<root>/input/data/<name>/``
  (recursively, sorted, hidden files skipped; index files beside shards are left to the
  byte-range planner, not read as records; a symbolic link below the folder is refused unless
  ``follow_links=True``: see :func:`_walk_files`). The same records come out either way.
* ``ContentType`` picks the format and the decoder (:data:`CONTENT_TYPES`); explicit ``format=``
  and ``decoder=`` win. ``CompressionType: Gzip`` is recognised by the gzip magic bytes (File
  mode: by the name, ``.gz``).
* ``RecordWrapperType: RecordIO`` (Pipe mode): each object is unwrapped as it streams and the
  inner format framed (:mod:`.wrapping`); image content types keep one record per object.
* Augmented manifests (``AttributeNames``, Pipe mode, RecordIO wrapping): each JSON line's
  attributes arrive as consecutive records, regrouped into one record per line and decoded by
  :class:`AugmentedManifest` into a dict keyed by attribute name (``decoder=None``: each item is
  its line's ``{attribute: bytes}``).
* ``S3DistributionType``: ``FullyReplicated`` (every host gets all) keeps this host's share
  (``shard(num_hosts, host_index)``); ``ShardedByS3Key`` keeps all the host holds. Then
  ``to_torch()`` splits it over the host's local ranks (:class:`ChannelDataset`) and DataLoader
  workers, so every record is read once per epoch across the job.
* ``ShuffleConfig`` is SageMaker's: it reorders whole objects (and, with ShardedByS3Key, moves
  them between hosts) each Pipe-mode epoch; ``Dataset.shuffle()`` mixes records inside a bounded
  buffer (seeded from ``(seed, epoch, rank, worker)``). They compose: SageMaker's for the coarse
  order across objects, ours for the order of records.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..decoders import Csv, RecordIOProtobuf
from ..errors import DecodeError, UsageError, UsageTypeError
from ..formats import DEFAULT_MAX_RECORD_SIZE
from ..formats.index_file import without_index_files
from ..formats.whole_object import WholeObjectFramer  # format "object", registered there
from ..pipeline import Dataset
from ..sources import PipeChannel
from ..sources.local_tree import LocalTree
from .config import (SAGEMAKER_ROOT, ChannelConfig, ConfigError, ResourceConfig, channels,
                     check_channel_name, resources)
from .wrapping import ManifestAttributes, WrappedPipeChannel, split_manifest_record

_NOT_GIVEN: Any = object()

#: ContentType (before any ``;`` parameters) -> (format, reader options, per-object records).
#: Per-object types (images) make each object one record: format ``"object"`` for files, the
#: wrapping's own records in Pipe mode.
CONTENT_TYPES: dict = {
    "application/x-recordio-protobuf": ("recordio", {"multipart": "concat"}, False),
    "application/x-recordio": ("recordio", {}, False),
    "application/x-tfrecord": ("tfrecord", {}, False),
    "application/tfrecord": ("tfrecord", {}, False),
    "text/csv": ("csv", {}, False),
    "application/jsonlines": ("lines", {}, False),
    "application/x-jsonlines": ("lines", {}, False),
    "application/json": ("lines", {}, False),
    "text/plain": ("lines", {}, False),
    "application/x-image": ("object", {}, True),
    "image/jpeg": ("object", {}, True),
    "image/png": ("object", {}, True),
}


def _parse_content_type(content_type: str) -> tuple:
    base, _, rest = content_type.partition(";")
    params = {}
    for item in rest.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            params[key.strip().lower()] = value.strip()
    return base.strip().lower(), params


def _default_decoder(content_type: Optional[str]) -> Any:
    if content_type is None:
        return None
    base, params = _parse_content_type(content_type)
    if base == "application/x-recordio-protobuf":
        return RecordIOProtobuf()
    if base == "text/csv":
        # SageMaker's CSV convention: no header, the label first (label_size=0: no label).
        return Csv() if params.get("label_size") == "0" else Csv(label_column=0)
    return None


# -- augmented manifests ----------------------------------------------------------------------
class AugmentedManifest:
    """Decode a batch of ``"sagemaker-manifest"`` records into ``{attribute: column}``.

    ``attributes``: the attribute names in manifest order, or a mapping ``{name: how}`` where
    ``how`` is ``None``/``"bytes"`` (an object array of the raw bytes), ``"text"`` (str),
    ``"json"`` (parsed values, object array), a numpy dtype such as ``"int64"`` or ``"float32"``
    (numbers written as text, the way SageMaker sends label attributes), or an object with a
    ``decode_batch(list_of_bytes)`` method / a callable taking the list (e.g.
    ``streamio.Image(size=224)``), whose result is the column (a one-entry dict result too; a
    larger dict is merged in as ``"<name>/<key>"``).
    Non-``-ref`` attribute values arrive as their text: a JSON string as its characters, other
    JSON values as compact JSON.
    """

    def __init__(self, attributes: Any) -> None:
        if isinstance(attributes, Mapping):
            self.how = dict(attributes)
        elif isinstance(attributes, (list, tuple)) and attributes:
            self.how = {name: None for name in attributes}
        else:
            raise UsageTypeError("attributes must be a non-empty list of names or a mapping"
                            " {name: how}")
        for name in self.how:
            if not isinstance(name, str) or not name:
                raise UsageTypeError(f"attribute names must be non-empty strings, not {name!r}")
        self.names = tuple(self.how)

    def output_spec(self) -> None:
        return None

    def decode_batch(self, records: Sequence[bytes], *, source: Optional[str] = None,
                     first_index: int = 0) -> dict:
        columns: list = [[] for _ in self.names]
        for i, record in enumerate(records):
            try:
                parts = split_manifest_record(record)
            except DecodeError as exc:
                raise DecodeError(exc.reason, source=source,
                                  record_index=first_index + i) from None
            if len(parts) != len(self.names):
                raise DecodeError(f"{len(parts)} attributes where {len(self.names)} were"
                                  " expected", source=source, record_index=first_index + i)
            for column, part in zip(columns, parts):
                column.append(part)
        out: dict = {}
        for name, values in zip(self.names, columns):
            self._decode_column(name, values, out, source, first_index)
        return out

    def _decode_column(self, name: str, values: list, out: dict, source: Optional[str],
                       first_index: int) -> None:
        how = self.how[name]
        if how is None or how == "bytes":
            column = np.empty(len(values), dtype=object)
            column[:] = values
            out[name] = column
            return
        if how in ("text", "json"):
            column = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                try:
                    text = value.decode("utf-8")
                    column[i] = json.loads(text) if how == "json" else text
                except ValueError as exc:
                    raise DecodeError(f"not {how}: {exc}", source=source,
                                      record_index=first_index + i, field=name) from None
            out[name] = column
            return
        batch_decode = getattr(how, "decode_batch", None)
        if batch_decode is not None or callable(how):
            # A decoder (streamio.Image, say) learns where each value came from.
            result = (batch_decode(values, source=source, first_index=first_index)
                      if batch_decode is not None else how(values))
            if isinstance(result, Mapping) and len(result) == 1:
                out[name] = next(iter(result.values()))  # e.g. Image's {"image": ...}
            elif isinstance(result, Mapping):
                out.update({f"{name}/{key}": value for key, value in result.items()})
            else:
                out[name] = result
            return
        dtype = np.dtype(how)
        column = np.empty(len(values), dtype=dtype)
        for i, value in enumerate(values):
            try:
                column[i] = dtype.type(value.decode("ascii").strip())
            except (ValueError, UnicodeDecodeError):
                raise DecodeError(f"{value[:40]!r} is not a {dtype} number", source=source,
                                  record_index=first_index + i, field=name) from None
        out[name] = column


# -- the channel as a Dataset -------------------------------------------------------------
class ChannelDataset(Dataset):
    """The Dataset of a SageMaker channel; ``to_torch()`` splits over the host's local ranks
    (torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, see :func:`_local_rank`; the host's share
    was taken by :func:`channel`)."""

    _sm_hosts: int = 1

    def to_torch(self, **kwargs: Any) -> Any:
        if kwargs.get("rank") is None and kwargs.get("world_size") is None:
            local = _local_rank(self._sm_hosts)
            if local is not None:
                kwargs["rank"], kwargs["world_size"] = local
        return super().to_torch(**kwargs)


def _local_rank(num_hosts: int) -> Optional[tuple]:
    """(local rank, local world size) of this process: torchrun's variables, else the process
    group divided evenly over the hosts, else None (a single process)."""
    env = os.environ
    if "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env:
        return int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is optional
        return None
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        if world % num_hosts:
            raise UsageError(f"{world} ranks do not divide evenly over {num_hosts} hosts:"
                             " pass to_torch(rank=..., world_size=...) for this host's ranks")
        local_world = world // num_hosts
        return dist.get_rank() % local_world, local_world
    return None


def _walk_files(root: str, follow_links: bool = False) -> list:
    """The files under ``root`` (opened as named, so the channel's folder may itself be a link),
    hidden names skipped, in the order of their path components. A link below ``root`` is
    refused (a UsageError naming it: SageMaker downloads objects, never links, so one there was
    put there by someone else) unless ``follow_links``: then each file and directory is listed
    once (by device and inode: a link back up the tree, ``x -> .``, is not walked again, so a
    link loop ends; a dangling link is listed, so that opening it says what is wrong), and time
    and memory grow with the distinct files and directories, whatever the links."""
    hint = "pass channel(..., follow_links=True) to read what links point at"
    try:
        with LocalTree(root, follow_links=follow_links, hint=hint, once=True) as tree:
            return [os.path.join(root, rel) for rel, _ in tree.files()]
    except UsageError:
        raise
    except OSError as exc:
        raise ConfigError(f"cannot list {exc.filename or root}: {exc.strerror}") from exc


def _files(config: ChannelConfig, follow_links: bool = False) -> list:
    root = config.data_path
    if not os.path.isdir(root):
        raise ConfigError(f"channel {config.name!r} ({config.input_mode} mode) has no directory"
                          f" {root}", path=config.source, key=config.name)
    found = without_index_files(_walk_files(root, follow_links))
    if not found:
        raise ConfigError(f"channel {config.name!r} holds no files under {root}",
                          path=config.source, key=config.name)
    return found


def _format_for(config: ChannelConfig, format: Optional[str]) -> tuple:
    """(format, reader options, per-object) for the channel, explicit format first."""
    if format is not None:
        return format, {}, format == "object"
    if config.content_type is None:
        raise ConfigError(f"channel {config.name!r} has no ContentType: pass format=",
                          path=config.source, key="ContentType")
    base, _ = _parse_content_type(config.content_type)
    if base not in CONTENT_TYPES:
        raise ConfigError(f"channel {config.name!r}: ContentType {config.content_type!r} is not"
                          f" one streamio knows ({', '.join(sorted(CONTENT_TYPES))}): pass"
                          " format= (and decoder=)", path=config.source, key="ContentType")
    fmt, options, per_object = CONTENT_TYPES[base]
    return fmt, dict(options), per_object


def channel(name: str, decoder: Any = _NOT_GIVEN, *, format: Optional[str] = None,
            root: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            attribute_names: Optional[Sequence[str]] = None,
            open_timeout: Optional[float] = None, read_timeout: Optional[float] = None,
            follow_links: bool = False, **reader_options: Any) -> Dataset:
    """The SageMaker channel ``name`` as a :class:`~streamio.Dataset`, in any input mode.

    ``decoder``: default from the channel's ContentType (RecordIO-protobuf ->
    ``RecordIOProtobuf()``, CSV -> ``Csv(label_column=0)``, an augmented manifest ->
    :class:`AugmentedManifest`); ``None`` gives raw records (an augmented manifest's: a dict
    ``{attribute name: bytes}`` per JSON line). ``format``: overrides the
    ContentType's. ``root``: the directory that stands for ``/opt/ml`` (then only its files are
    read; pass ``env`` to consult variables too). ``attribute_names``: the augmented manifest's
    attributes where the configuration does not list them. ``open_timeout``/``read_timeout``:
    for Pipe mode's FIFOs (defaults: :class:`~streamio.PipeChannel`'s). ``follow_links``: File
    and FastFile mode read what symbolic links below the channel's folder point at (by default
    such a link is refused, naming it). Other keywords go to the
    reader (``on_error``, ``max_record_size``, ...). See the module docstring for every setting.
    """
    check_channel_name(name)
    configs = channels(root=root, env=env)
    if name not in configs:
        known = ", ".join(sorted(configs)) or "none"
        raise ConfigError(f"no channel {name!r} in the input configuration (channels: {known})",
                          path=next(iter(configs.values())).source if configs else None,
                          key=name)
    config = configs[name]
    hosts = resources(root=root, env=env)
    attributes = tuple(attribute_names) if attribute_names is not None else config.attribute_names
    timeouts = {k: v for k, v in (("open_timeout", open_timeout),
                                  ("read_timeout", read_timeout)) if v is not None}
    wrapped = config.record_wrapper == "RecordIO"
    if config.input_mode == "Pipe":
        prefix = config.data_path
        if attributes:
            if not wrapped:
                raise ConfigError(f"channel {name!r}: an augmented manifest can be split into"
                                  " its attributes only with RecordWrapperType RecordIO",
                                  path=config.source, key="RecordWrapperType")
            source: Any = PipeChannel(prefix, **timeouts)
            fmt, options = "sagemaker-manifest", {"attributes": len(attributes)}
            default = AugmentedManifest(list(attributes))
        else:
            fmt, options, per_object = _format_for(config, format)
            default = _default_decoder(config.content_type) if format is None else None
            if per_object:
                if not wrapped:
                    raise ConfigError(f"channel {name!r}: objects such as images cannot be told"
                                      " apart in a Pipe-mode stream without RecordWrapperType"
                                      " RecordIO", path=config.source, key="RecordWrapperType")
                source, fmt, options = PipeChannel(prefix, **timeouts), "recordio", \
                    {"multipart": "concat"}
            elif wrapped:
                line_format = fmt in ("csv", "lines")
                source = WrappedPipeChannel(prefix, separator=b"\n" if line_format else b"",
                                            **timeouts)
            else:
                source = PipeChannel(prefix, **timeouts)
        if config.compression == "Gzip":
            # Sniffed: gzip magic or plain bytes. SageMaker documents that it inflates such
            # channels on the way into processing containers; for training jobs it does not
            # say, so both are read.
            options.setdefault("compression", "infer")
    else:
        if attributes:
            raise ConfigError(f"channel {name!r}: augmented manifests are read in Pipe mode"
                              " only (as SageMaker serves them)", path=config.source,
                              key="TrainingInputMode")
        fmt, options, per_object = _format_for(config, format)
        default = _default_decoder(config.content_type) if format is None else None
        source = _files(config, follow_links)
    options.update(reader_options)
    chosen = default if decoder is _NOT_GIVEN else decoder
    ds = ChannelDataset(source, fmt, decoder=chosen, **options)
    ds._sm_hosts = hosts.num_hosts
    if fmt == "sagemaker-manifest" and chosen is None:
        # Raw manifest records are streamio's own length-prefixed grouping: hand out each
        # line's attributes by name instead.
        ds = ds.map(ManifestAttributes(attributes))
    if config.distribution == "FullyReplicated" and hosts.num_hosts > 1:
        ds = ds.shard(hosts.num_hosts, hosts.host_index)
    return ds


__all__ = ["AugmentedManifest", "CONTENT_TYPES", "ChannelConfig", "ChannelDataset",
           "ConfigError", "DEFAULT_MAX_RECORD_SIZE", "ResourceConfig", "SAGEMAKER_ROOT",
           "WholeObjectFramer", "channel", "channels", "resources", "split_manifest_record"]

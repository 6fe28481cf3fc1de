"""The SageMaker training container's input configuration, read as the platform writes it.

A training container finds its channels in two JSON files (and, where the SageMaker training
toolkit runs, in environment variables that repeat them)::

    <root>/input/config/inputdataconfig.json   {"train": {"TrainingInputMode": "Pipe",
                                                 "ContentType": "text/csv",
                                                 "S3DistributionType": "FullyReplicated",
                                                 "RecordWrapperType": "None",
                                                 "CompressionType": "None"}, ...}
    <root>/input/config/resourceconfig.json    {"current_host": "algo-1",
                                                 "hosts": ["algo-1", "algo-2"], ...}
    <root>/input/data/<channel>/               File / FastFile mode: the channel's objects
    <root>/input/data/<channel>_<epoch>        Pipe mode: one FIFO per epoch

``root`` is ``/opt/ml`` in a real container. The toolkit's variables: ``SM_INPUT_DATA_CONFIG``
(the first file's JSON), ``SM_CHANNEL_<NAME>`` (a File-mode channel's directory),
``SM_CURRENT_HOST`` and ``SM_HOSTS``. This module only reads; it opens no data.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..errors import ConfigError

#: Where SageMaker mounts everything in a training container.
SAGEMAKER_ROOT = "/opt/ml"
INPUT_MODES = ("File", "FastFile", "Pipe")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
WRAPPERS = ("None", "RecordIO")
COMPRESSIONS = ("None", "Gzip")
#: SageMaker's ChannelName pattern (CreateTrainingJob: ``[A-Za-z0-9\.\-_]+``, 1-64 characters).
#: The name becomes a path under ``input/data``, so nothing else may pass (``../../etc``).
CHANNEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class ChannelConfig:
    """One channel of ``inputdataconfig.json``, with SageMaker's defaults filled in.

    ``data_path`` is the channel's directory (File, FastFile) or its FIFO prefix (Pipe: epoch
    ``e`` is ``f"{data_path}_{e}"``). ``shuffle_seed`` is ``ShuffleConfig.Seed`` when the job set
    one. ``attribute_names`` are the augmented-manifest attributes, when the configuration names
    them (the local emulator writes them as ``AttributeNames``; pass ``attribute_names=`` to
    :func:`streamio.sagemaker.channel` where your config does not).
    """

    name: str
    input_mode: str = "File"
    content_type: Optional[str] = None
    distribution: str = "FullyReplicated"
    record_wrapper: str = "None"
    compression: str = "None"
    shuffle_seed: Optional[int] = None
    attribute_names: Optional[tuple] = None
    data_path: str = ""
    source: str = ""  # the file or variable this came from, for error messages
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ResourceConfig:
    """``resourceconfig.json``: this host and every host of the job, in the job's order."""

    current_host: str = "algo-1"
    hosts: tuple = ("algo-1",)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @property
    def host_index(self) -> int:
        return self.hosts.index(self.current_host)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError("SageMaker input configuration not found: is this a SageMaker training"
                          " container? (pass root= to read another directory; `streamio"
                          " sagemaker-local` writes one)", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration: {exc.strerror}", path=path) from exc
    return _parse_json(text, path)


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"not valid JSON: {exc}", path=where) from None


def _choice(entry: Mapping, key: str, choices: tuple, default: str, where: str, name: str) -> str:
    value = entry.get(key, default)
    if value is None:
        return default
    if value not in choices:
        raise ConfigError(f"channel {name!r}: {value!r} is not one of {', '.join(choices)}",
                          path=where, key=key)
    return value


def check_channel_name(name: Any, where: Optional[str] = None) -> str:
    """``name`` if it is a channel name SageMaker accepts (and not ``.`` or ``..``, which it
    does not produce and which would leave ``input/data``), else a :class:`ConfigError`."""
    if (not isinstance(name, str) or not CHANNEL_NAME.fullmatch(name)
            or name.strip(".") == ""):
        raise ConfigError(f"{name!r} is not a SageMaker channel name (1-64 letters, digits,"
                          " '.', '-', '_')", path=where, key=str(name))
    return name


def _channel(name: str, entry: Any, where: str, data_root: str, env: Mapping[str, str]
             ) -> ChannelConfig:
    check_channel_name(name, where)
    if not isinstance(entry, Mapping):
        raise ConfigError(f"channel {name!r} must be a JSON object, not {type(entry).__name__}",
                          path=where, key=name)
    mode = _choice(entry, "TrainingInputMode", INPUT_MODES, "File", where, name)
    content_type = entry.get("ContentType")
    if content_type is not None and not isinstance(content_type, str):
        raise ConfigError(f"channel {name!r}: ContentType must be a string", path=where,
                          key="ContentType")
    seed = None
    shuffle = entry.get("ShuffleConfig")
    if shuffle is not None:
        seed = shuffle.get("Seed") if isinstance(shuffle, Mapping) else None
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"channel {name!r}: ShuffleConfig needs an integer Seed",
                              path=where, key="ShuffleConfig")
    attributes = entry.get("AttributeNames")
    if attributes is not None:
        if (not isinstance(attributes, list) or not attributes
                or not all(isinstance(a, str) and a for a in attributes)):
            raise ConfigError(f"channel {name!r}: AttributeNames must be a non-empty list of"
                              " names", path=where, key="AttributeNames")
        attributes = tuple(attributes)
    # The toolkit's SM_CHANNEL_<NAME> names a File-mode channel's directory where it is set.
    env_dir = env.get(f"SM_CHANNEL_{name.upper()}")
    if mode == "Pipe":
        data_path = os.path.join(data_root, name)
    else:
        data_path = env_dir or os.path.join(data_root, name)
    return ChannelConfig(
        name=name, input_mode=mode, content_type=content_type,
        distribution=_choice(entry, "S3DistributionType", DISTRIBUTIONS, "FullyReplicated",
                             where, name),
        record_wrapper=_choice(entry, "RecordWrapperType", WRAPPERS, "None", where, name),
        compression=_choice(entry, "CompressionType", COMPRESSIONS, "None", where, name),
        shuffle_seed=seed, attribute_names=attributes, data_path=data_path, source=where,
        raw=dict(entry))


def _locate(root: Optional[str], env: Optional[Mapping[str, str]]) -> tuple:
    """(root, env): an explicit root reads only its files unless env is passed too."""
    if root is not None:
        return os.fspath(root), dict(env or {})
    return SAGEMAKER_ROOT, dict(os.environ if env is None else env)


def channels(*, root: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None) -> dict:
    """``{name: ChannelConfig}`` for every channel of the training job.

    Reads ``<root>/input/config/inputdataconfig.json`` (``root`` defaults to ``/opt/ml``), or
    ``SM_INPUT_DATA_CONFIG`` where the training toolkit set it and no ``root`` was given.
    ``env``: the variables to consult (default ``os.environ`` without ``root``, none with it).
    """
    root, env = _locate(root, env)
    data_root = os.path.join(root, "input", "data")
    if "SM_INPUT_DATA_CONFIG" in env:
        where = "$SM_INPUT_DATA_CONFIG"
        config = _parse_json(env["SM_INPUT_DATA_CONFIG"], where)
    else:
        where = os.path.join(root, "input", "config", "inputdataconfig.json")
        config = _read_json(where)
    if not isinstance(config, Mapping):
        raise ConfigError("the input data configuration must be a JSON object of channels",
                          path=where)
    return {name: _channel(name, entry, where, data_root, env) for name, entry in config.items()}


def resources(*, root: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None) -> ResourceConfig:
    """This host and the job's hosts (``resourceconfig.json``, or ``SM_CURRENT_HOST`` and
    ``SM_HOSTS``). A missing file means a single-host job (the local emulator and plain
    ``docker run`` have none)."""
    root, env = _locate(root, env)
    if "SM_HOSTS" in env or "SM_CURRENT_HOST" in env:
        where = "$SM_HOSTS"
        hosts = _parse_json(env.get("SM_HOSTS", "null"), where)
        current = env.get("SM_CURRENT_HOST")
    else:
        where = os.path.join(root, "input", "config", "resourceconfig.json")
        if not os.path.exists(where):
            return ResourceConfig()
        config = _read_json(where)
        if not isinstance(config, Mapping):
            raise ConfigError("the resource configuration must be a JSON object", path=where)
        hosts = config.get("hosts")
        current = config.get("current_host")
    if hosts is None and current is not None:
        hosts = [current]
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise ConfigError("hosts must be a non-empty list of host names", path=where,
                          key="hosts")
    repeated = sorted({h for h in hosts if hosts.count(h) > 1})
    if repeated:
        # A host named twice would take two shares' positions and read only one of them.
        raise ConfigError(f"hosts names {', '.join(map(repr, repeated))} more than once",
                          path=where, key="hosts")
    if current is None:
        current = hosts[0]
    if current not in hosts:
        raise ConfigError(f"current_host {current!r} is not among hosts {hosts}", path=where,
                          key="current_host")
    return ResourceConfig(current_host=current, hosts=tuple(hosts))


__all__ = ["CHANNEL_NAME", "ChannelConfig", "ConfigError", "ResourceConfig", "SAGEMAKER_ROOT",
           "channels", "check_channel_name", "resources"]

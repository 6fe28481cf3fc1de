"""One owner per concept (issue #23): a URL scheme is one descriptor in the scheme registry
(open, open at an offset, probe, key), every exception lives in ``errors.py``, and
``streamio.tools.pack`` is the module (the function is ``streamio.pack``)."""

import os
import types

import pytest

import streamio
from streamio import Dataset, write_records
from streamio.sources import FileSource, register_scheme
from streamio.sources.ranged import probe


@pytest.fixture
def mirror():
    """A transport registered the way a new one would be: ``mirror://PATH`` serves PATH, front
    to back and from a byte offset."""
    from streamio.sources.ranged import open_file_range
    from streamio.sources.schemes import SCHEMES

    def path_of(url):
        return url[len("mirror://"):]

    register_scheme("mirror", lambda url, **timeouts: FileSource(path_of(url), **timeouts),
                    open_range=lambda url, start, **timeouts: open_file_range(path_of(url), start))
    yield "mirror://"
    del SCHEMES["mirror"]


def test_a_registered_scheme_that_reads_ranges_is_split_by_byte_range(tmp_path, mirror):
    path = tmp_path / "big.tfrecord"
    write_records(str(path), "tfrecord", (bytes([i % 251]) * 2000 for i in range(3000)))
    size = os.path.getsize(path)
    url = mirror + str(path)
    assert probe(url, head=False) == (size, b"")
    counts = []
    for index in range(3):
        shard = Dataset(url, "tfrecord").shard(3, index).batch(500)
        counts.append(sum(len(batch) for batch in shard))
        # Each reader reads about a third of the file, not all of it (round-robin would).
        assert shard.stats()["bytes"] < 0.4 * size
    assert sum(counts) == 3000 and min(counts) > 900


def test_file_urls_and_paths_name_the_same_file(tmp_path):
    from streamio.sources.schemes import local_path, source_key

    path = str(tmp_path / "a.tfrecord")
    write_records(path, "tfrecord", [b"x", b"y"])
    assert local_path("file://" + path) == local_path(path) == path
    assert source_key("file://" + path) == source_key(path) == "path:" + os.path.realpath(path)
    assert source_key("https://example.invalid/a") == "url:https://example.invalid/a"
    assert local_path("s3://bucket/key") is None and local_path("-") is None
    assert [r for r in streamio.read_records("file://" + path, "tfrecord")] == [b"x", b"y"]


def test_every_exception_lives_in_errors_and_keeps_its_old_import_path():
    from streamio import errors
    from streamio.sagemaker import ConfigError as from_sagemaker
    from streamio.sagemaker.config import ConfigError as from_config
    from streamio.tools.pack import PackError as from_pack

    assert from_pack is errors.PackError and issubclass(errors.PackError, errors.StreamioError)
    assert from_config is from_sagemaker is errors.ConfigError
    assert issubclass(errors.ConfigError, errors.UsageError)
    assert {"PackError", "ConfigError"} <= set(errors.__all__)


def test_the_pack_module_is_not_shadowed_by_the_pack_function():
    import streamio.tools.diagnose
    import streamio.tools.pack

    assert isinstance(streamio.tools.pack, types.ModuleType)
    assert isinstance(streamio.tools.diagnose, types.ModuleType)
    assert streamio.pack is streamio.tools.pack.pack
    assert streamio.diagnose is streamio.tools.diagnose.diagnose

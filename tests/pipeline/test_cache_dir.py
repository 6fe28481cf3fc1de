"""``Dataset.cache(directory)`` in a directory someone else could write: another user (uid 65534,
``setpriv`` inside ``unshare --net``) who made the victim's cache directory first, or a link
there to a folder of theirs, or a directory others may write, is refused with a UsageError
naming it, before any cache file in it is written or served; a fresh directory is made 0700.
And sources with no identity on disk that can say something of themselves (HTTP ETag,
Last-Modified, size; S3 ETag): a changed object makes the cache stale, with a warning."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import warnings

import pytest

import streamio
from streamio import Dataset
from streamio.errors import StreamioWarning, UsageError

from hostile_http import HostileHTTPServer
from support.other_user import as_nobody, require_nobody

RECORDS = [b"v1-record-%d" % i for i in range(20)]


def _data() -> bytes:
    return b"".join(streamio.formats.encode_tfrecord(r) for r in RECORDS)


def _as_nobody(script: str, *args: str) -> subprocess.CompletedProcess:
    return as_nobody("sh", "-c", script, "sh", *args)


@pytest.fixture
def sticky_tmp():
    """A fresh folder like /tmp (world-writable, sticky): both users may make names in it."""
    require_nobody("to act as uid 65534")
    base = tempfile.mkdtemp(prefix="streamio-cachedir-", dir="/tmp")
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base)


def _no_cache_files_in(folder: str) -> bool:
    return not any("streamio-cache" in n for n in os.listdir(folder))


def test_a_cache_directory_another_user_made_first_is_refused(sticky_tmp):
    victim = os.path.join(sticky_tmp, "mycache")
    proc = _as_nobody('mkdir "$1" && chmod 777 "$1"', victim)
    assert proc.returncode == 0, proc.stderr
    ds = Dataset(_data(), "tfrecord").cache(victim)
    # The old cache wrote into it without a word (then the owner could swap cache files).
    with pytest.raises(UsageError, match=f"{victim} refused: it belongs to uid 65534"):
        list(ds)
    assert _no_cache_files_in(victim)


def test_a_link_to_another_users_folder_is_refused(sticky_tmp):
    theirs = os.path.join(sticky_tmp, "theirs")
    victim = os.path.join(sticky_tmp, "mycache")
    proc = _as_nobody('mkdir "$1" && chmod 777 "$1" && ln -s "$1" "$2"', theirs, victim)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(UsageError, match=f"{victim} refused: it is a symbolic link"):
        list(Dataset(_data(), "tfrecord").cache(victim))
    assert _no_cache_files_in(theirs)


def test_a_directory_others_may_write_or_that_others_can_replace_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    with pytest.raises(UsageError, match="others may write it"):
        list(Dataset(_data(), "tfrecord").cache(str(open_dir)))
    os.chmod(open_dir, 0o777)  # a world-writable parent without the sticky bit
    with pytest.raises(UsageError, match="others may write its parent .*not sticky"):
        list(Dataset(_data(), "tfrecord").cache(str(open_dir / "inner")))


def test_a_new_cache_directory_is_private_and_serves(tmp_path):
    where = tmp_path / "fresh" / "cache"
    ds = Dataset(_data(), "tfrecord").cache(str(where))
    assert list(ds) == RECORDS
    assert stat.S_IMODE(os.stat(where).st_mode) & 0o077 == 0
    assert list(ds) == RECORDS  # served from the file
    assert not _no_cache_files_in(str(where))


# -- sources with no identity on disk: what the server says of them ---------------------------
V2 = [b"v2-record-%d" % i for i in range(25)]


def _tfrecords(records) -> bytes:
    return b"".join(streamio.formats.encode_tfrecord(r) for r in records)


@pytest.mark.parametrize("validators", ["etag", "last_modified", "size only"])
def test_a_changed_http_object_makes_the_cache_stale(tmp_path, validators):
    """The fill records what the server says of the object (ETag, Last-Modified, size); a
    served epoch asks again (one one-byte request) and an object that changed is read again,
    with a warning naming it. The old cache served v1 for ever, silently."""
    with HostileHTTPServer() as server:
        url = server.add("/obj.tfrecord", _tfrecords(RECORDS), etag=validators == "etag",
                         last_modified=validators == "last_modified")
        ds = Dataset(url, "tfrecord").cache(str(tmp_path / "cache"))
        assert [bytes(r) for r in ds] == RECORDS  # fills
        with warnings_as_errors():
            assert [bytes(r) for r in ds] == RECORDS  # served: unchanged, no warning
        server.route("/obj.tfrecord").versions = [_tfrecords(V2)]
        with pytest.warns(StreamioWarning, match=r"stale: source .*obj\.tfrecord changed"):
            assert [bytes(r) for r in ds] == V2
        with warnings_as_errors():
            assert [bytes(r) for r in ds] == V2  # the refilled cache


def test_a_changed_s3_object_makes_the_cache_stale(tmp_path, monkeypatch):
    from support.s3 import moto_endpoint, s3_client

    with moto_endpoint() as endpoint:
        client = s3_client(endpoint, monkeypatch, "cachecheck")
        client.put_object(Bucket="cachecheck", Key="obj.tfrecord", Body=_tfrecords(RECORDS))
        ds = Dataset("s3://cachecheck/obj.tfrecord", "tfrecord").cache(str(tmp_path / "c"))
        assert [bytes(r) for r in ds] == RECORDS
        with warnings_as_errors():
            assert [bytes(r) for r in ds] == RECORDS
        client.put_object(Bucket="cachecheck", Key="obj.tfrecord", Body=_tfrecords(V2))
        with pytest.warns(StreamioWarning, match=r"stale: source s3://cachecheck/obj"):
            assert [bytes(r) for r in ds] == V2



@contextlib.contextmanager
def warnings_as_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield

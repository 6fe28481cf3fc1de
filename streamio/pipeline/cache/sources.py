"""What a directory cache can tell about its sources having changed since it was filled.

A cache file is served without reading the sources, so it records, when the fill begins, what
can be learnt about each source without reading it, and asks again before it is served:

* a **local regular file** (a path or ``file://`` URL): ``os.stat``'s size, ``st_mtime_ns``,
  inode and device (never opened: a FIFO is not a regular file);
* an **http(s) URL**: the ``ETag``, ``Last-Modified`` and size the server gives for a one-byte
  ``Range`` request (``bytes=0-0``; not ``HEAD``, which some servers refuse): one small request
  per object per served epoch;
* an **s3:// object**: its ``ETag``, ``LastModified`` and size (boto3's ``head_object``, the
  client smart_open uses; without boto3 nothing is recorded).

What cannot be known is not recorded: a FIFO, a Pipe-mode channel, stdin, bytes and file
objects have no identity outside their bytes, and a server that sends none of the three fields
gives nothing to compare. A source whose answer differs (or that no longer answers) makes the
cache stale: the caller warns and fills it again.
"""

from __future__ import annotations

import http.client
import os
import ssl
import stat
import urllib.parse
from typing import Any, Optional

__all__ = ["changed_source", "local_files", "remote_identities", "remote_ok", "remote_urls",
           "file_identities", "identity_ok"]

#: Seconds a check's request may take: a server that slow is treated as unreachable (stale).
CHECK_TIMEOUT = 30.0
_REDIRECTS = 5


# -- local files ------------------------------------------------------------------------------
def _sources(ds: Any, stages: tuple) -> list:
    """The sources ``ds`` reads through ``stages``, a mix's inputs too, in order."""
    found = [ds._all_sources[i] for i in ds._selection]
    for stage in stages:
        for inp in getattr(stage, "inputs", ()):  # a Mix stage's Datasets
            found.extend(_sources(inp, inp._stages))
    return found


def local_files(ds: Any, stages: tuple) -> list:
    """The local paths ``ds`` reads through ``stages``: its sources that name a path (a plain
    path or a ``file://`` URL), and those of a mix's inputs, in order, each once."""
    from ...sources.schemes import local_path

    paths = [local_path(s) for s in _sources(ds, stages)]
    return list(dict.fromkeys(p for p in paths if p is not None))


def _identity(path: str) -> Optional[list]:
    """``[size, mtime_ns, inode, device]`` of ``path`` if it names a regular file now (stat
    only: a FIFO is never opened), else None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # missing, unreadable directory, a NUL in the name
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def file_identities(paths: list) -> list:
    """``[path, size, mtime_ns, inode, device]`` of each path naming a regular file (the others,
    FIFOs and missing files, are not recorded: the fill's read reports a missing one)."""
    found = ((path, _identity(path)) for path in paths)
    return [[path, *identity] for path, identity in found if identity is not None]


# A file identity's numbers (os.stat's): size, mtime_ns (before 1970 is negative), inode, device.
_IDENTITY_RANGES = ((0, 2 ** 63), (-2 ** 63, 2 ** 63), (0, 2 ** 64), (0, 2 ** 64))


def identity_ok(entry: Any) -> bool:
    """``[path, size, mtime_ns, inode, device]``: a non-empty path without NUL, numbers in
    ``os.stat``'s ranges (``type() is int``: no bool, no float)."""
    if type(entry) is not list or len(entry) != 1 + len(_IDENTITY_RANGES):
        return False
    path, *numbers = entry
    return (type(path) is str and path != "" and "\0" not in path
            and all(type(x) is int and low <= x < high
                    for x, (low, high) in zip(numbers, _IDENTITY_RANGES)))


# -- remote objects ---------------------------------------------------------------------------
def remote_urls(ds: Any, stages: tuple) -> list:
    """The http(s) and s3:// URLs ``ds`` reads through ``stages``, in order, each once."""
    from ...sources.schemes import url_scheme

    urls = [s for s in _sources(ds, stages) if isinstance(s, str)
            and url_scheme(s) in ("http", "https", "s3")]
    return list(dict.fromkeys(urls))


def _http_identity(url: str) -> list:
    """``[etag, last_modified, size]`` from a ``Range: bytes=0-0`` request (redirects
    followed); raises OSError (or http.client's errors) if the server does not answer 200/206."""
    for _ in range(_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        kwargs: dict = {"timeout": CHECK_TIMEOUT}
        if parts.scheme == "https":
            kwargs["context"] = ssl.create_default_context()
        conn = cls(parts.hostname or "", parts.port, **kwargs)
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("GET", target, headers={"Range": "bytes=0-0",
                                                 "Accept-Encoding": "identity"})
            resp = conn.getresponse()
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                url = urllib.parse.urljoin(url, resp.getheader("Location"))
                continue
            if resp.status not in (200, 206):
                raise OSError(f"HTTP {resp.status}")
            size: Optional[int] = None
            total = (resp.getheader("Content-Range") or "").rpartition("/")[2]
            if resp.status == 206 and total.isdigit():
                size = int(total)
            elif resp.status == 200 and (resp.getheader("Content-Length") or "").isdigit():
                size = int(resp.getheader("Content-Length"))
            return [resp.getheader("ETag"), resp.getheader("Last-Modified"), size]
        finally:
            conn.close()  # the body (one byte, or a whole 200) is not wanted
    raise OSError("too many redirects")


def _s3_identity(url: str) -> list:
    import boto3  # smart_open's own client: the same credentials and endpoint

    parts = urllib.parse.urlsplit(url)
    head = boto3.client("s3").head_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"))
    modified = head.get("LastModified")
    return [head.get("ETag"), None if modified is None else modified.isoformat(),
            head.get("ContentLength")]


def _remote_identity(url: str) -> list:
    """``[etag, last_modified, size]`` of ``url`` now; raises if it cannot be asked."""
    if url.startswith("s3://"):
        return _s3_identity(url)
    return _http_identity(url)


def remote_identities(urls: list) -> list:
    """``[url, etag, last_modified, size]`` of each URL that gives at least one of the three;
    a URL that does not answer now is left out (the fill's read reports it)."""
    out = []
    for url in urls:
        try:
            found = _remote_identity(url)
        except Exception:  # noqa: BLE001 - boto3 and http.client raise many types
            continue
        if any(x is not None for x in found):
            out.append([url, *found])
    return out


def remote_ok(entry: Any) -> bool:
    """``[url, etag, last_modified, size]``: a URL string, two strings or None, a size (int)
    or None."""
    if type(entry) is not list or len(entry) != 4:
        return False
    url, etag, modified, size = entry
    return (type(url) is str and "://" in url and "\0" not in url
            and all(x is None or (type(x) is str and len(x) < 1024) for x in (etag, modified))
            and (size is None or (type(size) is int and 0 <= size < 2 ** 63)))


def changed_source(files: list, remote: list) -> Optional[str]:
    """The first recorded source (a local file, then a URL) that is missing, unreachable or not
    what it was; None if every one is as recorded."""
    for path, *identity in files:
        if _identity(path) != identity:
            return path
    for url, *identity in remote:
        try:
            if _remote_identity(url) != identity:
                return url
        except Exception:  # noqa: BLE001 - unreachable: cannot be vouched for
            return f"{url} (not reachable to check)"
    return None

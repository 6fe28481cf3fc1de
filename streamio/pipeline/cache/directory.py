"""The directory of ``Dataset.cache(directory)``: created private, or refused if another user
could have written it.

A cache file is served without reading the sources, so whoever can write the directory decides
what a later epoch trains on: another local user who made ``/tmp/mycache`` first (or a link
there to a folder of theirs) could keep an old cache file and put it back after the sources
moved on. The cache files' names are predictable (a hash of the reader's place), so they are
safe only in a directory no one else can write. :func:`private_directory` therefore creates the
directory with mode 0700 (parents as ``os.makedirs`` makes them), and refuses, with a
:class:`~streamio.UsageError` naming the directory and why, one that

* is a symbolic link, or not a directory;
* is not owned by this process's effective user;
* is writable by its group or by others;
* lies below a folder another user could rename it out of: a parent owned by another user
  than this one or root, or writable by others without the sticky bit (``/tmp`` itself is
  fine: sticky). A link among the parents is followed (the path the user gave), but it too
  must be owned by this user or root.
"""

from __future__ import annotations

import os
import stat

from ...errors import SourceError, UsageError

__all__ = ["private_directory"]


def _why_not_private(path: str, uid: int) -> str:
    """Why the existing ``path`` cannot hold a cache, or "" if it can."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return (f"it is a symbolic link (-> {os.readlink(path)}); give the directory it points at,"
                " if that is yours")
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}, not to this user (uid {uid})"
    if st.st_mode & 0o022:
        return (f"others may write it (mode {stat.filemode(st.st_mode)}); chmod go-w it, or"
                " give a directory of your own")
    return ""


def _why_parents_unsafe(path: str, uid: int) -> str:
    """Why a parent of ``path`` would let another user swap it, or ""."""
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        st = os.lstat(parent)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, uid):
            return f"its parent {parent} is a link of uid {st.st_uid}"
        st = os.stat(parent)
        if st.st_uid not in (0, uid):
            return f"its parent {parent} belongs to uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (f"others may write its parent {parent} (mode {stat.filemode(st.st_mode)},"
                    " not sticky), so they could replace it")
        up = os.path.dirname(parent)
        if up == parent:
            return ""
        parent = up


def private_directory(directory: str) -> None:
    """Create ``directory`` (mode 0700) if missing, then refuse it unless it is private to this
    user (the module docstring lists the checks)."""
    uid = os.geteuid()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except FileExistsError:
        pass  # a file or a dangling link there: refused below
    except OSError as exc:
        raise SourceError(f"cannot create the cache directory: {exc.strerror or exc}",
                          source=directory) from exc
    try:
        why = _why_not_private(directory, uid) or _why_parents_unsafe(directory, uid)
    except OSError as exc:
        raise SourceError(f"cannot check the cache directory: {exc.strerror or exc}",
                          source=directory) from exc
    if why:
        raise UsageError(f"cache directory {directory} refused: {why}. Another user who can"
                         " write it could put back an old cache file that a later epoch then"
                         " serves instead of the sources")

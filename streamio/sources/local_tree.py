"""Walking a folder a user names, without following the links someone else planted in it.

A dataset folder may be writable by others (a shared ``/data``, a world-writable scratch
folder). A link planted there (``cat/2.bin -> /root/secret``, ``dog/x -> /root``, a class folder
``zz -> /root``) would make a program that walks the folder read a file its own user may read
and the planter may not, and hand its bytes on (into shards others can read, into training).
The rule, the same for every place streamio walks a folder (``streamio pack``, SageMaker File
mode, ``Dataset("dir/")`` and globs):

* The path the user gives (the root) is opened as given: links in it are followed, as any
  program follows them; the user named it.
* Below the root, a symbolic link (to a file or a directory, at any depth) is refused with a
  :class:`~streamio.UsageError` naming it and where it points, unless the caller asked to follow
  links (``follow_links=True``; then each file and directory is visited once, by device and
  inode, so a link loop ends). Hidden names (a leading ``.``) are skipped before that check.
* :meth:`LocalTree.open` opens a file found below the root from the root's descriptor so that
  no component below the root can be a link, whenever it was swapped in: the open fails
  (``ELOOP``, ``ENOTDIR``) and the caller reports it as an unreadable file. On Linux 5.6+ that
  is one ``openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)`` (the kernel checks every
  component; called through ctypes, as Python's ``os`` has no ``openat2``); elsewhere one
  ``openat(O_NOFOLLOW)`` per component (directories also ``O_DIRECTORY``). Opening and reading
  20,000 files of 2 KB three folders deep (page cache warm, 15 alternating rounds, medians of
  per-round ratios against a plain ``open(path)``): 1.05x with ``openat2``, 1.42x per component;
  the walk itself (``scandir`` on descriptors) took 0.57x the time of ``os.walk`` + ``os.stat``.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Callable, Optional

from ..errors import UsageError

__all__ = ["LinkRefusedHint", "LocalTree", "check_glob_match", "check_no_links", "glob_root",
           "refuse_link", "shown"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _CLOEXEC
_RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x04, 0x08  # linux/openat2.h
_SYS_OPENAT2 = 437  # the same number on every Linux architecture (the unified syscall table)


def _load_openat2() -> Optional[Callable[[int, str, int], int]]:
    """``openat2(dir_fd, path, flags)`` refusing every link below ``dir_fd``, or None where the
    kernel (before 5.6), a seccomp filter or the platform does not allow it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)  # CDLL: the GIL is released during the call
        syscall = libc.syscall
        syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        return None

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                    ("resolve", ctypes.c_uint64)]

    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                        ctypes.c_size_t]
    hows: dict = {}  # flags -> its open_how, made once (only read by the kernel)

    def openat2(dir_fd: int, path: str, flags: int) -> int:
        how = hows.get(flags)
        if how is None:
            how = hows.setdefault(flags, OpenHow(flags | _CLOEXEC, 0,
                                                 _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH))
        fd = syscall(_SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.addressof(how),
                     ctypes.sizeof(how))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return fd

    root = os.open("/", _DIR_FLAGS)
    try:
        os.close(openat2(root, ".", os.O_RDONLY | _DIRECTORY))
    except OSError:  # ENOSYS (older kernel), EPERM (seccomp), ...
        return None
    finally:
        os.close(root)
    return openat2


#: None where the component-by-component open is used instead.
OPENAT2 = _load_openat2()

#: What a refusal tells the user to do instead (each caller names its own option).
LinkRefusedHint = str


def shown(path: str) -> str:
    """``path`` printable on any terminal (bytes that are not UTF-8 as ``\\xNN``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def refuse_link(path: str, hint: LinkRefusedHint, *, dir_fd: Optional[int] = None,
                name: Optional[str] = None) -> UsageError:
    """The error for a link found at ``path`` (read as ``name`` in ``dir_fd`` when given)."""
    try:
        target = os.readlink(name if name is not None else path, dir_fd=dir_fd)
        where = f" (-> {shown(target)})"
    except OSError:
        where = ""
    return UsageError(f"{shown(path)} is a symbolic link{where}: refused, since a link in a"
                      " folder others may write can point at files they may not read"
                      f"{'; ' + hint if hint else ''}")


class LocalTree:
    """A folder (``root``, opened as given) whose files are listed and opened without following
    links below it (``follow_links=False``) or following them, each file and directory once.
    ``hint``: what the refusal of a link tells the user to do. ``once``: following links, list
    a file met under several names once (directories are always walked once, so a loop ends).
    Close it (or use ``with``)."""

    def __init__(self, root: str, *, follow_links: bool = False, hint: LinkRefusedHint = "",
                 once: bool = False) -> None:
        self.root = os.fspath(root)
        self.follow_links = follow_links
        self.once = once
        self.hint = hint
        self.fd = os.open(self.root, _DIR_FLAGS)  # may raise: the caller says what is missing

    def __enter__(self) -> "LocalTree":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    # -- listing ----------------------------------------------------------------------------
    def _entries(self, fd: int, rel: str, seen: set) -> list:
        """``[(name, stat)]`` of the directory ``fd`` (``rel`` below the root), sorted, hidden
        names left out; a link is refused, or (following links) stat'ed through, and a file or
        directory met before is left out. A dangling link, when following, keeps its lstat."""
        out = []
        with os.scandir(fd) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    if not self.follow_links:
                        raise refuse_link(self.path(os.path.join(rel, entry.name)), self.hint,
                                          dir_fd=fd, name=entry.name)
                    try:
                        st = os.stat(entry.name, dir_fd=fd)
                    except OSError:
                        out.append((entry.name, st))  # opening it says what is wrong
                        continue
                if self.follow_links and (self.once or stat.S_ISDIR(st.st_mode)):
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                out.append((entry.name, st))
        out.sort(key=lambda pair: pair[0])
        return out

    def _open_dir(self, name: str, parent: int) -> int:
        return os.open(name, _DIR_FLAGS | (0 if self.follow_links else _NOFOLLOW), dir_fd=parent)

    def folders(self) -> list:
        """The names of the root's folders (not links to folders, unless following links),
        sorted, hidden ones left out."""
        seen: set = set()
        return [name for name, st in self._entries(self.fd, "", seen) if stat.S_ISDIR(st.st_mode)]

    def files(self, sub: str = "", *, recursive: bool = True, files_first: bool = False,
              seen: Optional[set] = None) -> list:
        """``[(rel, stat)]`` of everything under ``sub`` (a folder name below the root, "" the
        root) that is not a folder: regular files, FIFOs, and (when following links) dangling
        links; ``rel`` relative to the root. Order: the sorted names, a folder's contents in its
        name's place (``files_first``: a folder's files before its subfolders, as
        ``os.walk``). ``recursive=False``: the folder's own entries only."""
        seen = set() if seen is None else seen
        out: list = []
        fd = self.fd if not sub else self._open_dir(sub, self.fd)
        try:
            if self.follow_links:
                st = os.fstat(fd)
                seen.add((st.st_dev, st.st_ino))
            self._walk(fd, sub, recursive, files_first, seen, out)
        finally:
            if fd != self.fd:
                os.close(fd)
        return out

    def _walk(self, fd: int, rel: str, recursive: bool, files_first: bool, seen: set,
              out: list) -> None:
        # A stack of (descriptor, rel, entries left): descriptors held = the depth walked.
        stack = [(fd, rel, iter(self._ordered(self._entries(fd, rel, seen), files_first)))]
        try:
            while stack:
                dir_fd, dir_rel, entries = stack[-1]
                for name, st in entries:
                    rel_name = os.path.join(dir_rel, name) if dir_rel else name
                    if not stat.S_ISDIR(st.st_mode):
                        out.append((rel_name, st))
                        continue
                    if not recursive:
                        continue
                    child = self._open_dir(name, dir_fd)
                    stack.append((child, rel_name, iter(())))  # closed by the finally
                    listed = self._entries(child, rel_name, seen)
                    stack[-1] = (child, rel_name, iter(self._ordered(listed, files_first)))
                    break
                else:
                    done_fd = stack.pop()[0]
                    if done_fd != fd:
                        os.close(done_fd)
        finally:
            for dir_fd, _, _ in stack:
                if dir_fd != fd:
                    os.close(dir_fd)

    @staticmethod
    def _ordered(entries: list, files_first: bool) -> list:
        if not files_first:
            return entries
        return ([e for e in entries if not stat.S_ISDIR(e[1].st_mode)]
                + [e for e in entries if stat.S_ISDIR(e[1].st_mode)])

    # -- opening ----------------------------------------------------------------------------
    def open(self, rel: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the file ``rel`` below the root. Not following links, every
        component is opened from its parent's descriptor with ``O_NOFOLLOW``, so no component
        can be a link, whenever it was swapped in (``OSError`` ``ELOOP``/``ENOTDIR`` then);
        following links, ``rel`` is opened as a path below the root."""
        if self.follow_links:
            return os.open(rel, flags | _CLOEXEC, dir_fd=self.fd)
        if OPENAT2 is not None:  # the kernel refuses links, absolute paths and ".." out (EXDEV)
            return OPENAT2(self.fd, rel, flags | _NOFOLLOW)
        parts = [p for p in os.path.normpath(rel).split(os.sep) if p not in ("", os.curdir)]
        if not parts or os.path.isabs(rel) or os.pardir in parts:
            raise OSError(errno.EINVAL, "not a path below the folder", rel)
        fd = self.fd
        try:
            for part in parts[:-1]:
                child = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
                if fd != self.fd:
                    os.close(fd)
                fd = child
            return os.open(parts[-1], flags | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
        finally:
            if fd != self.fd:
                os.close(fd)

    def stat(self, rel: str) -> os.stat_result:
        """``fstat`` of :meth:`open` (``O_NONBLOCK``: a FIFO is not waited for)."""
        fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)


def check_no_links(root: str, rel: str, hint: LinkRefusedHint) -> None:
    """Refuse ``rel`` (a path below ``root``) if one of its components is a link now (lstat, one
    component at a time): for places that hand a path on to be opened later by name."""
    path = root
    for part in [p for p in rel.split(os.sep) if p not in ("", os.curdir)]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except OSError:
            return  # missing: opening it later says so
        if stat.S_ISLNK(st.st_mode):
            raise refuse_link(path, hint)



def glob_root(pattern: str) -> str:
    """The part of a glob ``pattern`` before its first wildcard component: the folder the user
    named (links in it are followed); "" for the working directory."""
    import glob

    parts = pattern.split(os.sep)
    literal = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        literal.append(part)
    root = os.sep.join(literal)
    return os.sep if not root and pattern.startswith(os.sep) else root


def check_glob_match(pattern: str, match: str, hint: LinkRefusedHint) -> None:
    """Refuse ``match`` (a result of ``glob(pattern)``) if a component the wildcards matched,
    or one below them, is a link: glob follows links, so ``data/*/x.rec`` would reach through
    a folder link someone planted in ``data/``."""
    root = glob_root(pattern)
    rel = match[len(root):] if root and match.startswith(root) else match
    check_no_links(root, rel, hint)

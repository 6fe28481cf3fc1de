"""Unix sockets between the processes of one user that other local users cannot use.

Three things keep another user of the host out of the shared stream (see
:mod:`streamio.sharing.stream` for what streamio promises):

- **Names others cannot compute.** A socket's name is an HMAC-SHA256 of public facts (the stream,
  the epoch, the job) keyed by a secret: the ``StreamDataset``'s random token, which only its own
  process and DataLoader workers hold, or for local ranks (separate processes that share nothing
  else) the **user key**: 32 random bytes in ``shared-stream.key`` in the user's private
  directory: ``~/.cache/streamio`` (the home directory from the password database, not from
  ``$HOME``, so that every rank finds the same one), or ``<tempdir>/streamio-<uid>`` where the
  home is missing, read-only or not the user's own. The directory has mode 0700 and is owned by
  the user, the file mode 0600. The first process that needs it writes it (``mkstemp`` in that
  directory, then ``link``, which fails if another got there first: no reader ever sees half a
  key). A directory or key that is not the user's own is never used: under the home it is passed
  over for the temporary directory; in the temporary directory (where another user can make
  ``streamio-<uid>`` first, to deny service) it is refused with a ``SourceError`` that says so.
- **Peer credentials on both ends** (``SO_PEERCRED``): the dealer closes a connection from a
  process of another uid at once; a reader that finds a listener of another uid at its address
  refuses it and says so.
- **Nothing received is code** (:mod:`._wire`).

Why not the ``torch.distributed`` store: its TCP store answers anyone who can reach its port,
so it cannot keep a secret from another local user. Why abstract sockets (Linux) and not socket
files in the private directory: a killed dealer leaves no file behind, and the secret names plus
the credential checks give the same protection; elsewhere the sockets are files in the private
directory (mode 0700: the kernel keeps other users out).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import socket
import stat
import struct
import sys
import tempfile
import time
from typing import Any, Optional

from ..errors import SourceError

KEY_BYTES = 32
KEY_NAME = "shared-stream.key"
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: How long a dealer waits for an address held by a process of its own user to come free (a
#: DataLoader worker of the previous iteration of this epoch number, still exiting).
IN_USE_GRACE_S = 10.0
_keys: dict = {}  # key path -> the key, read once per process


def _uid() -> int:
    # The effective uid: what SO_PEERCRED reports and what owns the files this process makes.
    return os.geteuid() if hasattr(os, "geteuid") else 0


def home_dir(uid: int) -> Optional[str]:
    """The home directory of ``uid`` from the password database (None where it has no entry)."""
    try:
        import pwd
        return pwd.getpwuid(uid).pw_dir or None
    except (ImportError, KeyError):
        return None


def _owned_private(path: str, uid: int, *, mode_mask: int) -> Optional[str]:
    """Why ``path`` is not a directory (not a link) of ``uid`` free of the ``mode_mask`` bits;
    None when it is."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & mode_mask:
        return (f"it is not a private directory of uid {uid} (owner uid {st.st_uid}, mode"
                f" {stat.filemode(st.st_mode)})")
    return None


def _make_private(path: str, uid: int) -> Optional[str]:
    """Create ``path`` (mode 0700) unless it exists; why it cannot serve, or None."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create it: {exc.strerror}"
    return _owned_private(path, uid, mode_mask=0o077)


def _home_private_dir(uid: int) -> Optional[str]:
    """``~/.cache/streamio`` when the home and ``.cache`` are this user's and no one else can
    write them (else another user could swap what lies below); None otherwise."""
    home = home_dir(uid)
    if not home or not os.path.isabs(home):
        return None
    try:
        if _owned_private(home, uid, mode_mask=0o022) is not None:
            return None
        cache = os.path.join(home, ".cache")
        if _make_private(cache, uid) is not None and \
                _owned_private(cache, uid, mode_mask=0o022) is not None:
            return None
        path = os.path.join(cache, "streamio")
        return path if _make_private(path, uid) is None else None
    except OSError:
        return None


def private_dir() -> str:
    """This user's private directory for the key: ``~/.cache/streamio`` where the home allows,
    else ``<tempdir>/streamio-<uid>``, created with mode 0700; the latter is refused unless it
    is a directory (not a link) of this user that no other user can enter."""
    uid = _uid()
    path = _home_private_dir(uid)
    if path is not None:
        return path
    path = os.path.join(tempfile.gettempdir(), f"streamio-{uid}")
    why = _make_private(path, uid)
    if why is not None:
        raise SourceError(
            f"refusing {path} for the shared stream's key: {why}; another user may have made it"
            " to learn or block the names of this job's sockets. Remove it, or point TMPDIR at a"
            " directory of your own (or give this user a writable home directory)")
    return path


def _read_key(path: str) -> Optional[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid() or st.st_mode & 0o077 \
            or len(key) != KEY_BYTES:
        raise SourceError(f"refusing the shared stream's key {path}: not a {KEY_BYTES}-byte file"
                          f" of uid {_uid()} that only it can read; remove it (a new one is made)")
    return key


def user_key() -> bytes:
    """This user's secret for the names of the sockets local ranks share (made once)."""
    directory = private_dir()
    path = os.path.join(directory, KEY_NAME)
    key = _keys.get(path)
    if key is None:
        key = _read_key(path)
        if key is None:
            fd, tmp = tempfile.mkstemp(prefix=".key-", dir=directory)  # mode 0600
            try:
                os.write(fd, os.urandom(KEY_BYTES))
                os.close(fd)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass  # another process of ours made it first: use that one
            finally:
                os.unlink(tmp)
            key = _read_key(path)
        _keys[path] = key
    return key


def socket_name(secret: bytes, label: str, *facts: Any) -> Any:
    """The address for ``facts`` under ``secret``: a Linux abstract name, elsewhere a socket
    file in :func:`private_dir`. Without the secret, one name says nothing about another."""
    text = "\n".join(map(str, facts)).encode("utf-8", "surrogateescape")
    digest = hmac.new(secret, text, hashlib.sha256).hexdigest()
    if sys.platform.startswith("linux"):
        return f"\0streamio-{label}-{digest[:32]}"
    return os.path.join(private_dir(), digest[:24] + ".sock")


def peer_credentials(sock: socket.socket) -> Optional[tuple]:
    """``(pid, uid)`` of the process at the other end (for a connected client: the one that
    listens), or None where the platform does not say (the private directory protects there)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))
    return pid, uid


def stranger(sock: socket.socket) -> Optional[tuple]:
    """``(pid, uid)`` when the peer runs as another user, else None."""
    creds = peer_credentials(sock)
    return creds if creds is not None and creds[1] != _uid() else None


def _holder(address: Any) -> Optional[tuple]:
    """``(pid, uid)`` of the process listening at ``address``; None when nobody answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(address)
        except OSError:
            return None
        return peer_credentials(probe)


def listen(address: Any, what: str) -> socket.socket:
    """A listening socket at ``address``. An address held by another user's process is refused
    at once; one held by a process of this user is waited for (up to :data:`IN_USE_GRACE_S`: a
    previous holder that is exiting), then named. A stale socket file (nobody listening) is
    replaced."""
    deadline = time.monotonic() + IN_USE_GRACE_S
    known = None  # the holder last seen (a full accept queue stops answering probes)
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address)
            sock.listen(64)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise SourceError(f"cannot serve {what}: {exc.strerror}") from exc
        holder = _holder(address)
        known = holder or known
        if holder is not None and holder[1] != _uid():
            raise SourceError(
                f"refusing to serve {what}: its address is held by pid {holder[0]} of uid"
                f" {holder[1]}, another user (a process that took this job's socket name)")
        if holder is None and not address.startswith("\0"):
            try:
                os.unlink(address)  # a socket file nobody listens on: left by a dead dealer
                continue
            except FileNotFoundError:
                continue
        if time.monotonic() > deadline:
            who = f"pid {known[0]} (this user)" if known is not None else "a process"
            raise SourceError(
                f"cannot serve {what}: its dealer address is still in use by {who} after"
                f" {IN_USE_GRACE_S:g} s - two readers of this job deal the same epoch (a DataLoader"
                " iterated twice at once, or another run with the same stream and job variables)")
        time.sleep(0.05)

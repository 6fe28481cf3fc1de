"""This process's open file descriptors, to check that a reader closed what it opened."""

from __future__ import annotations

import os


def open_fds() -> set:
    """The numbers of this process's open descriptors."""
    return set(os.listdir("/proc/self/fd"))


def fd_targets() -> list:
    """What this process's open descriptors point at (paths, ``pipe:[...]``...)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed since it was listed (the listing's own descriptor)
            pass
    return out

"""Acting as another local user (uid 65534) in cross-user tests: ``setpriv`` inside
``unshare --net`` (no network of its own to reach), skipped with the reason where not permitted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

NOBODY = ["unshare", "--net", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` as uid 65534; its output captured."""
    return subprocess.run([*NOBODY, *argv], capture_output=True, timeout=60)


def require_nobody(why: str = "to act as uid 65534") -> None:
    """Skip the test, saying why, unless this process may run commands as uid 65534."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip(f"needs Linux and root ({why})")
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("setpriv/unshare not installed")
    try:
        if as_nobody("true").returncode != 0:
            pytest.skip("unshare --net / setpriv not permitted here")
    except OSError:
        pytest.skip("unshare --net / setpriv not permitted here")

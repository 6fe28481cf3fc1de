"""A hang guard for tests of code that must not hang: a hang fails the test, not the run."""

from __future__ import annotations

import threading

import pytest


def bounded(fn, seconds=60.0):
    """Run ``fn()`` in a thread: its result or exception, or a test failure if it runs past
    ``seconds`` (the daemon thread is left behind; fixtures' teardown unblocks what it waits on)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds:g} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]

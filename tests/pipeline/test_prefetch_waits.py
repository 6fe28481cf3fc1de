"""No wait of a prefetching iterator is silent (issue #41, item 5: a ``to_tf()`` run that hung
600 s without a word). The producer thread is made to stall deterministically: its upstream
blocks on an Event, and each test starts only once the producer (not the consumer) is inside it.

* a consumer waiting for the producer's block says what it waits for (logger ``streamio``);
* a consumer whose producer thread is gone (a forked child) fails instead of waiting for ever;
* ``close()`` that gives up on a producer still blocked upstream says so.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

import streamio._util
from streamio.errors import UsageError
from streamio.pipeline import Prefetcher
from streamio.pipeline import prefetch as prefetch_module


class StalledUpstream:
    """Blocks of one item; the first ``next()`` blocks until ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.calls += 1
        if self.calls > 3:
            raise StopIteration
        if self.calls == 1:
            self.entered.set()
            self.release.wait(30)
        return [self.calls], None


def stalled_prefetcher() -> tuple:
    upstream = StalledUpstream()
    pre = Prefetcher(upstream, 2)
    # Only one thread runs the upstream at a time, and the consumer has not asked yet: the one
    # inside it is the producer thread.
    assert upstream.entered.wait(10)
    return pre, upstream


@pytest.fixture
def quick_log(monkeypatch):
    monkeypatch.setattr(streamio._util, "WAIT_LOG_AFTER_S", 0.2)


def test_a_consumer_waiting_for_a_stalled_producer_says_what_it_waits_for(quick_log, caplog):
    pre, upstream = stalled_prefetcher()
    timer = threading.Timer(1.5, upstream.release.set)
    timer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="streamio"):
            assert next(pre) == ([1], None)  # the wait still ends when the block comes
    finally:
        timer.cancel()
        upstream.release.set()
        pre.close()
    said = [r.getMessage() for r in caplog.records if r.name == "streamio"]
    assert any("waiting for the next block from the prefetch thread" in m
               and "streamio-prefetch" in m for m in said), said
    assert [b for b in pre] == []  # closed: nothing more, no hang


def test_a_forked_child_whose_producer_is_gone_fails_instead_of_waiting():
    """A fork copies the iterator but not its thread, which was making a block: the child's
    consumer used to wait for it for ever."""
    pre, upstream = stalled_prefetcher()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one next(), its outcome through the pipe
        os.close(read)
        try:
            next(pre)
            out = b"a block"
        except UsageError as exc:
            out = b"UsageError: " + str(exc).encode()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = repr(exc).encode()
        os.write(write, out[:4000])
        os._exit(0)
    os.close(write)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited for a producer thread that does not exist")
        with os.fdopen(read, "rb") as f:
            out = f.read().decode()
    finally:
        upstream.release.set()
        pre.close()
    assert out.startswith("UsageError: prefetch: the prefetch thread is gone"), out
    assert "forked" in out and "iterate the Dataset anew" in out, out


def test_close_that_leaves_a_blocked_producer_behind_says_so(monkeypatch, caplog):
    monkeypatch.setattr(prefetch_module, "CLOSE_JOIN_S", 0.2)
    pre, upstream = stalled_prefetcher()
    try:
        with caplog.at_level(logging.WARNING, logger="streamio"):
            started = time.monotonic()
            pre.close()
            assert time.monotonic() - started < 5  # bounded: close() goes on without it
            pre.close()  # said once
        said = [r.getMessage() for r in caplog.records if r.name == "streamio"]
        assert len(said) == 1 and "has not ended 0.2 s after it was told to stop" in said[0], said
        assert pre.alive
    finally:
        upstream.release.set()
    deadline = time.monotonic() + 10
    while pre.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pre.alive  # it ends on its own once its read returns


def test_a_quick_producer_says_nothing(quick_log, caplog):
    with caplog.at_level(logging.WARNING, logger="streamio"):
        pre = Prefetcher(iter([([i], None) for i in range(100)]), 4)
        assert [b[0][0] for b in pre] == list(range(100))
        pre.close()
    assert [r for r in caplog.records if r.name == "streamio"] == []

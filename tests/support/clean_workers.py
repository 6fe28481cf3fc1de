"""DataLoader workers that do not inherit the test process.

A DataLoader's workers are forked from the pytest process by default, and so inherit whatever
earlier tests left there: uncollected objects of libraries whose finalizers take a lock (an
abseil mutex in pyarrow, imported by other tests) that another thread held at the fork. A
worker that collects such an object aborts ("Mutex::Fer while waiting on Condition"), which
happened once in CI. ``CONTEXT`` starts workers from a forkserver instead: a fresh interpreter
that has imported torch and streamio only (with to_torch's adapter, which each worker would
otherwise import again: 0.1 s; not the test's ``__main__``), from which each worker is forked
cheaply.

Every test that runs DataLoader workers in the pytest process starts them from here: collecting
the suite imports TensorFlow (tests/adapters/test_resume_tf.py and others, at module level), and
with it keras, pandas and pyarrow, so a fork of the pytest process is never a clean one. The
worker's dataset is pickled to it: what it holds must be importable by name (no lambda, no
function local to a test). Tests that run workers in a fresh interpreter (tests/scripts/) keep
the default fork: their process holds only what the scenario imported."""

from __future__ import annotations

import contextlib
import multiprocessing
from typing import Iterator, Optional

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "streamio", "streamio.adapters.torch"])


def context_for(num_workers: int) -> Optional[multiprocessing.context.BaseContext]:
    """``multiprocessing_context=`` for a loader of ``num_workers``: ``CONTEXT``, or None without
    workers (a DataLoader refuses a context it would not use)."""
    return CONTEXT if num_workers else None


@contextlib.contextmanager
def forkserver_by_default() -> Iterator[None]:
    """For code that makes its own DataLoader (``streamio.diagnose``: no context to pass): the
    process-wide start method is the forkserver (the one ``CONTEXT`` uses, with its preloads)
    while the block runs, and what it was after. The server is started first: its start
    (importing torch, seconds on a busy machine) would otherwise be spent inside a timed run."""
    started = CONTEXT.Process()  # no target: runs nothing, once the server is up
    started.start()
    started.join()
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(before, force=True)

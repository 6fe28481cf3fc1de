"""DataLoader workers that do not inherit the test process.

A DataLoader's workers are forked from the pytest process by default, and so inherit whatever
earlier tests left there: uncollected objects of libraries whose finalizers take a lock (an
abseil mutex in pyarrow, imported by other tests) that another thread held at the fork. A
worker that collects such an object aborts ("Mutex::Fer while waiting on Condition"), which
happened once in CI. ``CONTEXT`` starts workers from a forkserver instead: a fresh interpreter
that has imported torch and streamio only (not the test's ``__main__``), from which each worker
is forked cheaply."""

from __future__ import annotations

import multiprocessing

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "streamio"])

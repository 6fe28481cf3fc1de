"""A garbage collection runs at any allocation, in whichever thread allocates, and may finalize
an epoch that was dropped inside a reference cycle (a traceback, a framework's object graph such
as TensorFlow's): its suspended readers then close, giving their read buffer back to the pool
and their counters to the epoch's stats. The pool and the stats each allocate while holding
their lock; a collection there used to run the finalizer into the lock its own thread held: a
hang for ever, without a word (found auditing the waits of ``to_tf()``, issue #41 item 5).
Each test holds the lock and collects, in a fresh interpreter with a deadline."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.examples import write_id_parts
from support.rank_jobs import script_env

ABANDON = """
import faulthandler, gc, glob, sys
faulthandler.dump_traceback_later(20, exit=True)
from streamio import Dataset
paths = sorted(glob.glob(sys.argv[1] + "/*.tfrecord*"))
gc.disable()
it = iter(Dataset(paths, "tfrecord").batch(4))
next(it)  # its reader is suspended, holding a read buffer lent by the pool
stats = it._stats
cycle = [it]
cycle.append(cycle)  # dropped inside a reference cycle: only the collector frees it
del it, cycle
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("abandoned")
    write_id_parts(str(root), [200])
    return str(root)


@pytest.mark.parametrize("lock", ["streamio._read_buffers._lock", "stats._lock"])
def test_a_collection_under_a_lock_finalizes_an_abandoned_epoch(files, lock):
    code = ABANDON + (f"import streamio._read_buffers\nwith {lock}:\n    gc.collect()\n"
                      "print('collected')\n")
    proc = subprocess.run([sys.executable, "-c", code, files], capture_output=True, timeout=120,
                          env=script_env())
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0 and proc.stdout.strip() == b"collected", err[-3000:]


def test_a_collection_in_the_prefetch_thread_finalizes_its_dropped_prefetcher():
    """The producer thread holds its queue's lock while it allocates (a queued block's tuple); a
    collection there may finalize its own Prefetcher, dropped inside a cycle, whose ``close()``
    takes that lock. Here the main thread plays the producer: it holds the lock and collects."""
    code = """
import faulthandler, gc
faulthandler.dump_traceback_later(20, exit=True)
from streamio.pipeline import Prefetcher
gc.disable()
pre = Prefetcher(iter([([i], None) for i in range(10)]), 2)
shared = pre._shared  # what the producer thread's frame holds: not the Prefetcher
cycle = [pre]
cycle.append(cycle)
del pre, cycle
with shared.ready:
    gc.collect()
print('collected')
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                          env=script_env())
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0 and proc.stdout.strip() == b"collected", err[-3000:]

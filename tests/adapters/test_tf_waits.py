"""The loop of issue #41 item 5 (a ``tf.function`` summing every batch of a ``to_tf()`` Dataset,
run again and again in one process; one such run once hung for 600 s, never reproduced since):
every run sums every record exactly once and ends. The waits it could hang in are bounded or
logged, each tested where it lives: tests/pipeline/test_prefetch_waits.py (a stalled prefetch
thread) and tests/adapters/test_tf_batches.py (a block call waiting on a stuck one)."""

from __future__ import annotations

import sys

import pytest

from conftest import SCRIPTS

pytest.importorskip("tensorflow")


def test_a_tf_function_sums_every_batch_in_every_run(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    try:
        import tf_sum_loop
    finally:
        sys.path.remove(str(SCRIPTS))
    out = tf_sum_loop.main(str(tmp_path), 5000, 5)  # raises if a run's sum is wrong
    assert out["runs"] == 5 and out["max_s"] < 60, out

"""The shuffle kernel (streamio/_c/shuffle.c: shuffle_exchange) against the reference plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.data_too_large])


# --- shuffle kernel -------------------------------------------------------------------------------

@SLOW_OK
@given(n=st.integers(1, 40), data=st.data())
def test_shuffle_exchange_equals_the_reference_plan(n, data):
    import sys

    import numpy as np

    shuffle = pytest.importorskip("streamio.pipeline.shuffle")
    slots = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=60)), dtype=np.int64)
    items = [("new", j) for j in range(len(slots))]
    old = [("old", i) for i in range(n)]
    baseline = [sys.getrefcount(x) for x in items + old]
    ref_buf = np.empty(n, dtype=object)
    ref_buf[:] = old
    c_buf = ref_buf.copy()
    expected = shuffle._ExchangePlan(slots % n, n).apply(
        ref_buf, np.fromiter(items, dtype=object, count=len(items))).tolist()
    got = speedups.shuffle_exchange(c_buf, slots, items)
    assert got == expected
    assert c_buf.tolist() == ref_buf.tolist()
    del got, expected, ref_buf, c_buf
    assert [sys.getrefcount(x) for x in items + old] == baseline  # no reference leaked or lost


def test_shuffle_exchange_rejects_bad_arguments_without_touching_the_buffer():
    import numpy as np

    buf = np.empty(3, dtype=object)
    buf[:] = ["a", "b", "c"]
    with pytest.raises(IndexError):
        speedups.shuffle_exchange(buf, np.array([0, 3]), ["x", "y"])
    assert buf.tolist() == ["a", "b", "c"]
    with pytest.raises(ValueError):
        speedups.shuffle_exchange(buf, np.array([0]), ["x", "y"])
    with pytest.raises(TypeError):
        speedups.shuffle_exchange(np.zeros(3), np.array([0]), ["x"])
    with pytest.raises(TypeError):
        speedups.shuffle_exchange(buf, np.array([0], dtype=np.int32), ["x"])


@SLOW_OK
@given(n=st.integers(1, 40), data=st.data())
def test_shuffle_exchange_int64_equals_the_reference_plan(n, data):
    import numpy as np

    shuffle = pytest.importorskip("streamio.pipeline.shuffle")
    if not hasattr(speedups, "shuffle_exchange_int64"):
        pytest.skip("this build has no shuffle_exchange_int64 kernel")
    slots = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=60)), dtype=np.int64)
    new = np.arange(1000, 1000 + len(slots), dtype=np.int64)
    ref_buf = np.arange(n, dtype=np.int64)
    c_buf = ref_buf.copy()
    expected = shuffle._ExchangePlan(slots % n, n).apply(ref_buf, new)
    out = np.full(len(slots), -1, dtype=np.int64)
    assert speedups.shuffle_exchange_int64(c_buf, slots, new, out) is None
    assert out.tolist() == expected.tolist()
    assert c_buf.tolist() == ref_buf.tolist()


def test_shuffle_exchange_int64_rejects_bad_arguments_without_touching_the_buffer():
    import numpy as np

    if not hasattr(speedups, "shuffle_exchange_int64"):
        pytest.skip("this build has no shuffle_exchange_int64 kernel")
    buf = np.arange(3, dtype=np.int64)
    out = np.zeros(2, dtype=np.int64)
    with pytest.raises(IndexError):
        speedups.shuffle_exchange_int64(buf, np.array([0, 3]), np.array([7, 8]), out)
    assert buf.tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        speedups.shuffle_exchange_int64(buf, np.array([0]), np.array([7, 8]), out)
    with pytest.raises(TypeError):
        speedups.shuffle_exchange_int64(buf, np.array([0, 1], dtype=np.int32), np.array([7, 8]),
                                        out)
    ro = np.arange(3, dtype=np.int64)
    ro.flags.writeable = False
    with pytest.raises(ValueError):  # the buffer is written: numpy refuses a read-only one
        speedups.shuffle_exchange_int64(ro, np.array([0, 1]), np.array([7, 8]), out)
    assert buf.tolist() == [0, 1, 2]


# -- hostile arguments (issue #10, finding 9): these are internal functions, but a crash is a
# crash; a size that overflows, or an argument whose __index__ changes the caller's lists while the
# kernel still reads them, ends in a Python exception or a correct result (tests/run_sanitized.sh
# runs these under ASan/UBSan) ------------------------------------------------------------------

def test_shuffle_exchange_items_are_held_while_exchanging():
    buf = np.empty(4, dtype=object)
    buf[:] = [f"old{i}" for i in range(4)]
    items = [f"new{i}" for i in range(3)]
    out = speedups.shuffle_exchange(buf, np.array([0, 2, -1], dtype=np.int64), items)
    assert out == ["old0", "old2", "old3"] and list(buf) == ["new0", "old1", "new1", "new2"]

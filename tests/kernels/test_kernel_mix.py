"""The mix kernel (streamio/_c/mix.c: interleave) against its reference
(streamio/pipeline/mix.py: interleave_reference): same items, same errors, no reference lost."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.pipeline.mix import interleave_reference

speedups = pytest.importorskip(
    "streamio._speedups", reason="C accelerator not built (python setup.py build_ext --inplace)")

SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.data_too_large])

# Items of every kind a mix hands over: records, raw batches (lists), decoded batches (dicts).
ITEMS = st.one_of(st.binary(max_size=8), st.lists(st.binary(max_size=3), max_size=3),
                  st.dictionaries(st.just("x"), st.integers(), max_size=1), st.integers())


def _outcome(fn, choices, parts, starts):
    try:
        return fn(choices, parts, starts)
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


@SLOW_OK
@given(k=st.integers(1, 6), data=st.data())
def test_interleave_equals_the_reference(k, data):
    choices = np.array(data.draw(st.lists(st.integers(0, k - 1), max_size=80)), dtype=np.uint8)
    parts = [data.draw(st.lists(ITEMS, min_size=int(np.count_nonzero(choices == j)),
                                max_size=int(np.count_nonzero(choices == j))))
             for j in range(k)]
    # Fresh objects (a drawn b"" or small int is shared by everyone: its count moves on its own).
    parts = [[[item] for item in part] for part in parts]
    # Items before the start (already placed) and after the last one needed (not yet).
    starts = [data.draw(st.integers(0, 3)) for _ in range(k)]
    parts = [[["before", i] for i in range(start)] + part + [["after"]] * data.draw(
        st.integers(0, 2)) for start, part in zip(starts, parts)]
    everything = [item for part in parts for item in part]
    baseline = [sys.getrefcount(item) for item in everything]
    expected = interleave_reference(choices, parts, starts)
    got = speedups.interleave(choices, parts, starts)
    assert got == expected
    assert all(a is b for a, b in zip(got, expected))  # the same objects, not copies
    # Each part's items come out in order, at the places its choices say.
    for j, (part, start) in enumerate(zip(parts, starts)):
        chosen = np.flatnonzero(choices == j)
        assert [got[t] for t in chosen] == part[start:start + len(chosen)]
    del got, expected
    assert [sys.getrefcount(item) for item in everything] == baseline  # none leaked or lost


@SLOW_OK
@given(data=st.data())
def test_interleave_refuses_what_the_reference_refuses(data):
    k = data.draw(st.integers(0, 4))
    choices = np.array(data.draw(st.lists(st.integers(0, 6), max_size=20)), dtype=np.uint8)
    parts = [data.draw(st.one_of(st.lists(st.integers(), max_size=6),
                                 st.tuples(st.integers()))) for _ in range(k)]
    starts = data.draw(st.lists(st.one_of(st.integers(-2, 8), st.just(1.0)),
                                min_size=max(0, k - 1), max_size=k + 1))
    assert _outcome(speedups.interleave, choices, parts, starts) == _outcome(
        interleave_reference, choices, parts, starts)


def test_interleave_checks_its_arguments():
    for fn in (speedups.interleave, interleave_reference):
        with pytest.raises(ValueError, match="at most 256 parts"):
            fn(np.zeros(0, np.uint8), [[]] * 257, [0] * 257)
        with pytest.raises(ValueError, match="choice 2 names no part"):
            fn(np.array([0, 2], np.uint8), [[1], []], [0, 0])
        with pytest.raises(ValueError, match=r"parts\[0\] holds 2 items from 1 for 2 choices"):
            fn(np.array([0, 0], np.uint8), [[1, 2]], [1])
        with pytest.raises(ValueError, match="starts has 2 entries for 1 parts"):
            fn(np.array([0], np.uint8), [[1]], [0, 0])
        with pytest.raises(TypeError):
            fn(np.array([0], np.uint8), ([1],), [0])
        with pytest.raises(TypeError, match=r"starts\[0\] must be an int"):
            fn(np.array([0], np.uint8), [[1]], [True])
    with pytest.raises(TypeError):
        speedups.interleave(np.array([0], np.int64), [[1]], [0])  # not uint8

"""The CSV number kernel (streamio/_c/csv.c: parse_csv_floats) against numpy.loadtxt and the
pure-Python parser."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

from support.kernels import Mutator, runs_beside  # noqa: E402

SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.data_too_large])


# --- decode kernels: CSV numbers ------------------------------------------------------------------

SIMPLE_NUMBER = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

number_text = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: repr(v).encode()),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda v: b"%.5f" % v),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: b"%e" % v),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: b"%.17g" % v),
    st.integers(-10 ** 25, 10 ** 25).map(lambda v: str(v).encode()),
    st.tuples(st.integers(0, 10 ** 19), st.integers(-400, 400)).map(
        lambda t: b"%de%d" % t),
    st.text("0123456789.eE+-", min_size=1, max_size=12).map(str.encode),  # grammar edges
    st.sampled_from([b"-0", b"+.5", b"5.", b"0000.000", b"1e-400", b"1e400", b"nan", b"inf",
                     b" 1", b"", b".", b"1e", b"--1", b"9007199254740993", b"0.1e-22",
                     b"4.9406564584124654e-324", b"1.7976931348623157e308"]),
)


@st.composite
def csv_table(draw):
    ncols = draw(st.integers(1, 5))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        fields = draw(st.lists(number_text, min_size=ncols, max_size=ncols))
        if draw(st.integers(0, 20)) == 0:  # a row of another width
            fields = fields[:-1] if draw(st.booleans()) else fields + [b"1"]
        rows.append(b",".join(fields))
    usecols = draw(st.one_of(st.none(), st.lists(st.integers(0, ncols - 1), unique=True,
                                                 min_size=1)))
    return rows, ncols, usecols


def _loadtxt(rows, ncols, usecols, double):
    import numpy as np

    try:
        table = np.loadtxt(rows, dtype=np.float64 if double else np.float32, delimiter=",",
                           quotechar=None, comments=None, ndmin=2, usecols=usecols,
                           encoding="latin-1")
    except ValueError:
        return None
    return table


@SLOW_OK
@given(table=csv_table(), double=st.booleans())
def test_parse_csv_floats_equals_numpy_loadtxt(table, double):
    rows, ncols, usecols = table
    got = speedups.parse_csv_floats(rows, ncols, b",", usecols, double)
    simple = all(len(row.split(b",")) == ncols for row in rows) and all(
        SIMPLE_NUMBER.fullmatch(row.split(b",")[c])
        for row in rows for c in (range(ncols) if usecols is None else usecols))
    assert (got is not None) == simple
    if got is None:
        return
    if not rows:  # loadtxt cannot know the width of an empty table
        assert got.shape == (0, ncols if usecols is None else len(usecols))
        return
    expected = _loadtxt(rows, ncols, usecols, double)
    assert expected is not None
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()  # bit for bit: -0.0, rounding, overflow to inf
    assert got.flags.writeable


def test_parse_csv_floats_takes_the_correctly_rounded_path_for_hard_numbers():
    import numpy as np

    hard = [b"9007199254740993", b"0.1e-22", b"1234567890123456789012", b"2.2250738585072011e-308",
            b"7.038531e-26", b"123456789e-30"]
    got = speedups.parse_csv_floats([b",".join(hard)], len(hard), double=True)
    assert got.tolist() == [[float(v) for v in hard]]
    got32 = speedups.parse_csv_floats([b",".join(hard)], len(hard))
    assert got32.tolist() == [[float(np.float32(float(v))) for v in hard]]


def test_parse_csv_floats_rejects_what_it_cannot_read_exactly():
    assert speedups.parse_csv_floats([b"1,2", b"3"], 2) is None  # a short row
    assert speedups.parse_csv_floats([b'"1",2'], 2) is None  # quotes: the general path's job
    assert speedups.parse_csv_floats([b"1;2"], 2, b";").tolist() == [[1.0, 2.0]]
    with pytest.raises(ValueError):
        speedups.parse_csv_floats([b"1"], 1, usecols=[1])
    assert speedups.parse_csv_floats([bytearray(b"1")], 1) is None  # only bytes rows
    assert speedups.parse_csv_floats([b"1"], 0) is None


def test_parse_csv_floats_lets_other_threads_run_on_large_batches():
    rows = [b"%d,%d.25,-%d.5e3" % (i, i, i) for i in range(50_000)]
    assert runs_beside(lambda: speedups.parse_csv_floats(rows, 3))
    got = speedups.parse_csv_floats(rows, 3, double=True)
    assert got[12345].tolist() == [12345.0, 12345.25, -12345.5e3]


# -- hostile arguments (issue #10, finding 9): these are internal functions, but a crash is a
# crash; a size that overflows, or an argument whose __index__ changes the caller's lists while the
# kernel still reads them, ends in a Python exception or a correct result (tests/run_sanitized.sh
# runs these under ASan/UBSan) ------------------------------------------------------------------

# -- sizes that overflow --------------------------------------------------------------------------

@pytest.mark.parametrize("ncols", [2 ** 61 + 1, 2 ** 62, 2 ** 63 - 1])
def test_parse_csv_floats_huge_ncols_raises_instead_of_writing_past_a_buffer(ncols):
    with pytest.raises((OverflowError, MemoryError)):
        speedups.parse_csv_floats([b"1,2"], ncols)


def test_parse_csv_floats_negative_ncols_is_a_value_error():
    with pytest.raises(ValueError):
        speedups.parse_csv_floats([b"1,2"], -1)


# -- __index__ that changes the caller's lists ------------------------------------------------------

def test_parse_csv_floats_usecols_index_that_empties_the_lists():
    rows = [b"1,2,3", b"4,5,6"]
    usecols = [0, 2]
    usecols.insert(1, Mutator(1, usecols, rows))
    got = speedups.parse_csv_floats(rows, 3, b",", usecols)
    # the kernel took its own copies of rows and usecols before converting any index
    np.testing.assert_array_equal(got, np.float32([[1, 2, 3], [4, 5, 6]]))

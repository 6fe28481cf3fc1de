"""The C kernels called with hostile arguments (issue #10, finding 9).

These are internal functions, but a crash is a crash: a size that overflows, or an argument whose
``__index__`` changes the caller's lists while the kernel is still reading them, must end in a
Python exception or a correct result, never in a read or write outside live memory. Without a
sanitizer a use-after-free may pass unnoticed, so run these (and tests/test_speedups.py) under an
AddressSanitizer/UBSan build too: tests/run_sanitized.sh (CC=clang for NULL + 0 checks).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

from streamio.decoders.example import parse_examples as example_reference  # noqa: E402
from streamio.decoders.example import parse_sequence_examples as sequence_reference  # noqa: E402
from streamio.decoders._wire import len_field  # noqa: E402
from streamio.decoders.recordio_protobuf import encode_recordio_protobuf  # noqa: E402
from streamio.decoders.recordio_protobuf import parse_recordio_protobuf as protobuf_reference  # noqa: E402,E501


_field = len_field  # a length-delimited protobuf field: tag, length, payload


def _example(key: bytes, value: float) -> bytes:
    # Example{features=1: Features{feature=1: entry{key=1, value=2: Feature{float_list=2}}}}
    float_list = _field(1, np.float32(value).tobytes())
    entry = _field(1, key) + _field(2, _field(2, float_list))
    return _field(1, _field(1, entry))


class Mutator:
    """An int whose ``__index__`` empties the given lists (dropping what they held) first."""

    def __init__(self, value: int, *victims: list) -> None:
        self.value = value
        self.victims = victims

    def __index__(self) -> int:
        for victim in self.victims:
            victim.clear()
        # Reuse the freed memory, so that a kernel still reading it sees garbage.
        _ = [bytes(64) for _ in range(1000)]
        gc.collect()
        return self.value


def _same_arrays(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_arrays(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


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


def test_parse_examples_kind_index_that_empties_names_and_records():
    records = [_example(b"x", 1.5), _example(b"x", -2.0)]
    expected = example_reference(list(records), (b"x",), (2,))
    names = [b"x"]
    kinds = [Mutator(2, names, records)]
    got = speedups.parse_examples(records, names, kinds)
    assert _same_arrays(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[1].tolist() == [[1], [1]]


def test_parse_sequence_examples_index_that_empties_both_pairs_and_records():
    # SequenceExample{context=1: Features{x: float}, feature_lists=2: {s: FeatureList{2 steps}}}
    def sequence(value: float) -> bytes:
        feature = _field(2, _field(1, np.float32(value).tobytes()))
        context = _field(1, _field(1, b"x") + _field(2, feature))
        lists = _field(1, _field(1, b"s") + _field(2, _field(1, feature) * 2))
        return _field(1, context) + _field(2, lists)

    records = [sequence(1.5), sequence(-2.0)]
    expected = sequence_reference(list(records), (b"x",), (2,), (b"s",), (2,))
    context_names, sequence_names = [b"x"], [b"s"]
    context_kinds = [Mutator(2, context_names, sequence_names, records)]
    sequence_kinds: list = []
    sequence_kinds.append(Mutator(2, sequence_kinds, context_names, sequence_names, records))
    got = speedups.parse_sequence_examples(records, context_names, context_kinds, sequence_names,
                                           sequence_kinds)
    # every argument was copied before the first __index__ ran: the result is the reference's
    assert all(_same_arrays(g, e) for g, e in zip(got, expected))
    assert got[1].tolist() == [[1], [1]] and got[3].tolist() == [[2], [2]]


def test_parse_recordio_protobuf_index_that_empties_names_and_records():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    records = list(encode_recordio_protobuf(x))
    expected = protobuf_reference(list(records), ((1, b"values"),), (2,))
    names: list = []
    kinds: list = []
    names.append((Mutator(1, names, records), b"values"))
    kinds.append(Mutator(2, kinds, names, records))
    got = speedups.parse_recordio_protobuf(records, names, kinds)
    assert all(_same_arrays(g, e) for g, e in zip(got, expected))
    assert got[1].tolist() == [[3]] * 4


def test_shuffle_exchange_items_are_held_while_exchanging():
    buf = np.empty(4, dtype=object)
    buf[:] = [f"old{i}" for i in range(4)]
    items = [f"new{i}" for i in range(3)]
    out = speedups.shuffle_exchange(buf, np.array([0, 2, -1], dtype=np.int64), items)
    assert out == ["old0", "old2", "old3"] and list(buf) == ["new0", "old1", "new1", "new2"]


# -- a map entry with a key and no value (NULL + 0 in the C parser before) -------------------------

def test_parse_examples_feature_entry_without_a_value_is_a_missing_feature():
    entry_key_only = _field(1, _field(1, _field(1, b"x")))
    records = [entry_key_only, _example(b"x", 3.0)]
    got = speedups.parse_examples(records, (b"x",), (2,))
    expected = example_reference(records, (b"x",), (2,))
    assert _same_arrays(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[1].tolist() == [[-1], [1]]


def test_parse_recordio_protobuf_entry_without_a_value_is_an_absent_tensor():
    entry_key_only = _field(1, _field(1, b"values"))
    records = [entry_key_only] + list(encode_recordio_protobuf(np.ones((1, 2), np.float32)))
    got = speedups.parse_recordio_protobuf(records, ((1, b"values"),), (2,))
    expected = protobuf_reference(records, ((1, b"values"),), (2,))
    assert all(_same_arrays(g, e) for g, e in zip(got, expected))

"""The CRC-32C kernel (streamio/_c/crc.c) against the crc32c package."""

from __future__ import annotations

import os
import random

import pytest

speedups = pytest.importorskip("streamio._speedups",
                               reason="C accelerator not built (python setup.py build_ext --inplace)")

import crc32c  # noqa: E402


# --- CRC-32C --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [speedups.crc32c, speedups.crc32c_portable, speedups.crc32c_sse42],
                         ids=["dispatched", "portable", "sse42"])
def test_crc32c_equals_the_crc32c_package_for_every_small_length_and_alignment(fn):
    rng = random.Random(1234)
    backing = bytes(rng.getrandbits(8) for _ in range(320))
    for length in range(301):
        for offset in (0, 1, 3, 7):  # unaligned starts take the byte-at-a-time prologue
            data = memoryview(backing)[offset:offset + length]
            start = rng.getrandbits(32)
            assert fn(data) == crc32c.crc32c(bytes(data)), (length, offset)
            assert fn(data, start) == crc32c.crc32c(bytes(data), start), (length, offset)


@pytest.mark.parametrize("fn", [speedups.crc32c, speedups.crc32c_portable, speedups.crc32c_sse42],
                         ids=["dispatched", "portable", "sse42"])
@pytest.mark.parametrize("length", [511, 512, 513, 575, 576, 577, 767, 768, 769, 1000, 24575, 24576,
                                    24577, 100_000, 3 * 8192 * 5 + 13, (1 << 20) + 5])
def test_crc32c_equals_the_crc32c_package_on_large_inputs(fn, length):
    # Lengths around 3*256 and 3*8192 cross the interleaved loops' block boundaries, those around
    # 512 (+64) the AVX-512 kernel's (it folds from 2 blocks of 256, then 64-byte steps); the
    # last ones are long enough to release the GIL.
    data = os.urandom(length + 1)[1:]
    assert fn(data) == crc32c.crc32c(data)
    assert fn(bytearray(data), 0xDEADBEEF) == crc32c.crc32c(data, 0xDEADBEEF)


def test_crc32c_check_value():
    # The CRC-32C check value from the catalogue of parametrised CRC algorithms.
    assert speedups.crc32c(b"123456789") == 0xE3069283
    assert speedups.crc32c_portable(b"123456789") == 0xE3069283
    assert speedups.crc32c_sse42(b"123456789") == 0xE3069283

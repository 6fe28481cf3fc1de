"""The TFRecord resynchronisation search, vectorised with numpy for when the C kernel is absent.

Resynchronising (``on_error="skip"`` after a damaged header) means finding the first offset
``q`` where a sound header starts: ``u64 length | u32 masked_crc32c(length bytes)`` with the
length within ``max_record_size``. Tested offset by offset in Python that is 4-9 MB/s; here a
block of offsets is tested at once, and the answer is the same as the loop's
(``tfrecord._find_tfrecord_sync_loop``, the specification; tests/formats/test_resync.py holds this
version to it with Hypothesis):

1. The length at every offset is read through an unaligned strided ``<u8`` view, copied into
   an aligned array a block at a time, and compared with the limit. On random bytes a length within 256 MiB needs five zero bytes in a
   row, so almost no offset survives.
2. A block that is one byte repeated (zeros, 0xFF padding) holds no sound header at all (no byte
   value makes one), so it is passed over after one compare. Elsewhere, where many offsets
   survive (small integers, mostly-zero data), an offset whose 12 bytes equal those of the
   offset before has the same verdict, so only the first of each such run is kept.
3. CRC-32C over a fixed 8 bytes is affine over GF(2): ``crc(a ^ b) = crc(a) ^ crc(b) ^
   crc(0)``. So the CRC of each surviving length is ``crc(0) ^ T0[l0] ^ T1[l1] ^ T2[l2] ^
   T3[l3]`` over its four 16-bit pieces, four table gathers per candidate.
"""

from __future__ import annotations

from typing import Optional

import crc32c as _crc32c
import numpy as np

_MASK_DELTA = 0xA282EAD8
_U64_MAX = (1 << 64) - 1
# Blocks of offsets tested at once: small first, so that the header after a damaged one, a
# record away, costs about what the loop costs (100-byte records: 11 us a resync, the loop's
# 11 us; 30 us with a first block of 4096), then doubling up to 64 Ki offsets. Larger blocks
# were slower (zeros: 630 MB/s at 64 Ki, 410 at 128 Ki): their bool temporaries pass glibc's
# 128 KiB mmap threshold, so every one is a fresh mapping paid for in page faults.
FIRST_BLOCK = 512
MAX_BLOCK = 1 << 16
# More than 1/8 of a block's offsets have a plausible length: drop repeated windows first.
_DENSE_FRACTION = 8

_tables: Optional[np.ndarray] = None


def _crc_tables() -> np.ndarray:
    """``(4, 65536)`` uint32: entry ``[k, v]`` is ``crc(m) ^ crc(0^8)`` for the 8-byte message
    ``m`` that is zero but for the little-endian u16 ``v`` at bytes ``2k, 2k+1``. Built on first
    use (2048 CRCs, then XORs), 1 MiB; two threads that race here build the same table."""
    global _tables
    if _tables is None:
        zero = _crc32c.crc32c(bytes(8))
        per_byte = np.empty((8, 256), np.uint32)
        msg = bytearray(8)
        for i in range(8):
            for b in range(256):
                msg[i] = b
                per_byte[i, b] = _crc32c.crc32c(bytes(msg)) ^ zero
            msg[i] = 0
        tables = np.empty((4, 65536), np.uint32)
        for k in range(4):
            # index v = hi << 8 | lo: the low byte sits at message byte 2k, the high at 2k + 1
            tables[k] = (per_byte[2 * k + 1][:, None] ^ per_byte[2 * k][None, :]).reshape(-1)
        _tables = tables
    return _tables


_SHIFTS = [np.uint64(16 * k) for k in range(4)]
_ZERO_CRC = np.uint32(_crc32c.crc32c(bytes(8)))
_R15, _L17, _DELTA = np.uint32(15), np.uint32(17), np.uint32(_MASK_DELTA)
# Fewer candidates than this: their CRCs one by one cost less than the vector set-up.
_FEW = 16


def _masked_crcs(lengths: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC-32C of each u64 ``lengths`` value's 8 little-endian bytes."""
    tables = _crc_tables()
    crc = tables[0].take(lengths.astype(np.uint16))  # astype keeps the low 16 bits
    for k in range(1, 4):
        crc ^= tables[k].take((lengths >> _SHIFTS[k]).astype(np.uint16))
    crc ^= _ZERO_CRC
    return ((crc >> _R15) | (crc << _L17)) + _DELTA


def _masked_crc(data) -> int:
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _first_in_block(buf, p: int, n: int, limit: int, scratch: tuple) -> int:
    """The first sound header among offsets ``[p, p + n)`` (bytes up to ``p + n + 11`` are in
    ``buf``), relative to ``p``, or -1. ``scratch``: a u64 and a u32 array of at least ``n``."""
    window = np.frombuffer(buf, np.uint8, count=n + 11, offset=p)
    if window[0] == window[-1] and not (window != window[0]).any():
        # One byte repeated (zeros, 0xFF padding): every offset holds the same 12 bytes, and
        # for none of the 256 byte values are they a sound header (tests/formats/test_resync.py).
        return -1
    # The u64 at every offset, unaligned: copied to an aligned array first, since numpy's
    # compares on unaligned data are 4x slower than that copy.
    lengths, crcs = scratch[0][:n], scratch[1][:n]
    np.copyto(lengths, np.ndarray((n,), "<u8", buffer=buf, offset=p, strides=(1,)))
    stored = np.ndarray((n,), "<u4", buffer=buf, offset=p + 8, strides=(1,))
    plausible = lengths <= np.uint64(limit)
    count = int(np.count_nonzero(plausible))
    if not count:
        return -1
    if count * _DENSE_FRACTION > n:
        # Same 12 bytes as the offset before, same verdict: keep the first offset of each run.
        np.copyto(crcs, stored)
        stored = crcs
        plausible[1:] &= (lengths[1:] != lengths[:-1]) | (crcs[1:] != crcs[:-1])
    cand = np.flatnonzero(plausible)
    if cand.size < _FEW:
        for q in cand.tolist():
            if _masked_crc(buf[p + q:p + q + 8]) == int(stored[q]):
                return q
        return -1
    hits = np.flatnonzero(_masked_crcs(lengths[cand]) == stored[cand])
    return int(cand[hits[0]]) if hits.size else -1


def find_tfrecord_sync_numpy(buf, pos: int, end: int, max_record_size: int) -> int:
    """Same contract and answers as ``tfrecord.find_tfrecord_sync``: the first ``q`` in
    ``[pos, end - 12]`` where a sound TFRecord header starts, or -1. ``buf`` is any contiguous
    bytes-like object; no view of it outlives the call (the caller may resize or release it
    afterwards). Memory: a few bytes per offset of one block (at most ``MAX_BLOCK``)."""
    if max_record_size < 0:
        return -1  # no u64 length is within a negative limit
    limit = min(max_record_size, _U64_MAX)
    last = end - 12  # the last offset whose 12 header bytes lie within [pos, end)
    if last < pos:
        return -1
    # Aligned copies reused from block to block, grown with the blocks: fresh large arrays
    # per block would each be a new mmap, paid again in page faults (that halved the speed on
    # zeros), and one of MAX_BLOCK up front costs a short search more than its scan.
    scratch = (np.empty(0, np.uint64), np.empty(0, np.uint32))
    p = pos
    block = FIRST_BLOCK
    while p <= last:
        n = min(block, last - p + 1)
        if len(scratch[0]) < n:
            scratch = (np.empty(n, np.uint64), np.empty(n, np.uint32))
        hit = _first_in_block(buf, p, n, limit, scratch)
        if hit >= 0:
            return p + hit
        p += n
        block = min(block * 2, MAX_BLOCK)
    return -1

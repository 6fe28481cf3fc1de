"""The RecordIO resynchronisation search, vectorised with numpy for when the C kernel is absent.

Resynchronising (``on_error="skip"`` after a damaged header) means finding the first offset
``q`` where a record can start: a 4-aligned stream offset holding ``u32 magic 0xCED7230A |
u32 lrec`` with cflag ``lrec >> 29`` 0 or 1 and length ``lrec & 0x1FFFFFFF`` within
``max_record_size``. The loop (``recordio._find_recordio_sync_loop``, the specification) finds
each magic number with ``re`` at GB/s, but pays about a microsecond of Python per magic number
it rejects: garbage made of magic numbers (every aligned word the magic, or the magic before a
middle part's cflag 2, or before a length over the limit, or at offsets that are not 4-aligned
in the stream) ran at 7-25 MB/s. Here the aligned words of a block are tested at once; the
answer is the same as the loop's (tests/formats/test_resync.py holds this version to it with
Hypothesis).
"""

from __future__ import annotations

import numpy as np

MAGIC = 0xCED7230A
LENGTH_MASK = (1 << 29) - 1
# Aligned words tested per block: small first, so that a header a few records after the damage
# costs about what the loop costs, then doubling. 16 Ki words (64 KiB) keeps each temporary
# under glibc's 128 KiB mmap threshold (see _tfrecord_sync.MAX_BLOCK).
FIRST_BLOCK = 256
MAX_BLOCK = 1 << 14

_MAGIC = np.uint32(MAGIC)
_CFLAG_SHIFT = np.uint32(29)
_ONE = np.uint32(1)
_MASK = np.uint32(LENGTH_MASK)


def find_recordio_sync_numpy(buf, pos: int, end: int, base: int, max_record_size: int) -> int:
    """Same contract and answers as ``recordio.find_recordio_sync``: the first ``q`` in
    ``[pos, end - 8]`` at a 4-aligned stream offset (``base + q``) with the magic number, cflag
    0 or 1 and a length within ``max_record_size``, or -1. ``buf`` is any contiguous bytes-like
    object; no view of it outlives the call. Memory: a few bytes per word of one block."""
    if max_record_size < 0:
        return -1  # no length is within a negative limit
    limit = np.uint32(min(max_record_size, LENGTH_MASK))
    last = end - 8  # the last offset whose 8 header bytes lie within [pos, end)
    q = pos + (-(base + pos) & 3)  # the first 4-aligned stream offset
    block = FIRST_BLOCK
    scratch = np.empty(0, np.uint32)
    while q <= last:
        n = min(block, (last - q) // 4 + 1)  # headers at q, q + 4, ..., q + 4 (n - 1)
        if len(scratch) <= n:
            scratch = np.empty(n + 1, np.uint32)
        # The n words and the lrec after the last: copied to an aligned array first, since
        # numpy's compares on unaligned data are several times slower than the copy.
        words = scratch[:n + 1]
        np.copyto(words, np.frombuffer(buf, "<u4", count=n + 1, offset=q))
        magic = np.flatnonzero(words[:n] == _MAGIC)
        if magic.size:
            lrec = words[magic + 1]
            sound = np.flatnonzero(((lrec >> _CFLAG_SHIFT) <= _ONE) & ((lrec & _MASK) <= limit))
            if sound.size:
                return q + 4 * int(magic[sound[0]])
        q += 4 * n
        block = min(block * 2, MAX_BLOCK)
    return -1

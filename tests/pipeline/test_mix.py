"""``streamio.mix``: weighted interleaving of Datasets, deterministic for a seed, resumable.

Real files (TFRecord of Examples, lines, gzip) and a real HTTP server on 127.0.0.1; the torch
test runs a DataLoader with 2 worker processes in a subprocess.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import random
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import streamio
from streamio.errors import CorruptRecordError, DecodeError, UsageError, UsageTypeError
from streamio.formats import encode_tfrecord
from streamio.pipeline import mix as mix_module
from streamio.reader import PROBE_READ_SIZE

from hostile_http import HostileHTTPServer
from support.recording import RecordingStream
from support.examples import ID_X, id_example, write_id_examples

SUBPROCESS_TIMEOUT = 240


def _lines(path, prefix: str, n: int) -> str:
    path.write_text("".join(f"{prefix}{i}\n" for i in range(n)))
    return str(path)


@pytest.fixture
def ab(tmp_path):
    """Two lines files: ``a0..a29999`` and ``b0..b9999``."""
    return _lines(tmp_path / "a.lines", "a", 30000), _lines(tmp_path / "b.lines", "b", 10000)


def _from(items, prefix: bytes) -> list:
    return [r for r in items if r.startswith(prefix)]


def _ids(items) -> list:
    return [int(i) for batch in items for i in np.atleast_1d(batch["id"])]


# -- order and ratio ------------------------------------------------------------------------------
def test_a_seed_gives_one_order_and_other_seeds_and_epochs_give_others(ab):
    a, b = ab

    def make(seed):
        return streamio.mix([streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")],
                            [0.75, 0.25], seed=seed)

    ds = make(7)
    first, second = list(ds), list(ds)  # epochs 0 and 1
    assert list(make(7)) == first  # a new Dataset, same seed: the same epoch 0
    assert second != first and list(make(8)) != first
    # Each input's own order is kept (no shuffle in them): the mix only interleaves.
    assert _from(first, b"a") == [f"a{i}".encode() for i in range(len(_from(first, b"a")))]


def test_the_order_is_the_documented_function_of_the_seed(tmp_path):
    """The order as streamio.pipeline.mix documents it, computed here from the spec alone: a
    PCG64 keyed by SeedSequence(seed, spawn_key=(epoch, rank, worker, stage position)), each
    64-bit output two uint32 choices (low half first), a choice picking the first input whose
    cumulative weight scaled to 2**32 is above it; a resume state or a shard replays this
    order, so it must not drift between versions."""
    a = _lines(tmp_path / "a.lines", "a", 30000)
    b = _lines(tmp_path / "b.lines", "b", 12000)
    weights = [0.7, 0.3]
    bounds = np.floor(np.cumsum(weights) * 2.0 ** 32)
    bounds[-1] = 2.0 ** 32
    for seed, epoch in ((3, 0), (11, 2)):
        bits = np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(epoch, 0, 0, 0)))
        choices = bits.random_raw(40000).astype("<u8").view("<u4")  # low half first
        picks = np.searchsorted(bounds, choices.astype(np.float64), side="right")
        taken, want = [0, 0], []
        for k in picks.tolist():
            if taken[k] == (30000, 12000)[k]:
                break  # first_exhausted: the first pick of an input that has run out
            want.append(f"{'ab'[k]}{taken[k]}".encode())
            taken[k] += 1
        else:
            raise AssertionError("no input ran out within the choices computed")
        mixed = streamio.mix([streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")],
                             weights, seed=seed)
        got = [list(mixed) for _ in range(epoch + 1)][epoch]
        assert len(want) > 16384 and got == want  # more than two draws of DRAW choices


def test_every_window_of_20000_items_holds_the_weights_within_2_percent(tmp_path):
    a = _lines(tmp_path / "a.lines", "a", 90000)
    b = _lines(tmp_path / "b.lines", "b", 30000)
    for seed in (0, 1, 2):
        items = list(streamio.mix([streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")],
                                  weights=[0.75, 0.25], seed=seed, stop="first_exhausted"))
        is_a = np.fromiter((r[0] == ord("a") for r in items), dtype=np.int64)
        assert len(is_a) >= 100_000
        sums = np.convolve(is_a, np.ones(20000, dtype=np.int64), mode="valid")  # every window
        share = sums / 20000
        assert 0.73 <= share.min() and share.max() <= 0.77, (seed, share.min(), share.max())


def test_the_numpy_fallback_places_items_as_the_c_kernel_does(ab, monkeypatch):
    """Without the C accelerator the mix is the same (its reference places the items)."""
    from streamio.pipeline import mix as mix_module

    a, b = ab

    def epoch():
        inputs = [streamio.Dataset(a, "lines").shuffle(100, seed=1), streamio.Dataset(b, "lines")]
        return list(streamio.mix(inputs, [0.6, 0.4], seed=3, stop="all_exhausted").batch(7))

    fast = epoch()
    monkeypatch.setattr(mix_module, "_TAKE", mix_module.mix_take_reference)
    assert epoch() == fast


def test_records_made_in_output_order_are_the_records_placed_the_earlier_way(tmp_path,
                                                                              monkeypatch):
    """Inputs that are their sources alone hand the kernel their reads' records where they lie
    (it makes them in output order): the same items, order, errors and record origins as when
    their readers make them first (mix.SPANS = False), for small and large records (completed
    in place), damaged records skipped, a gzip input, a decoder after the mix, and an error."""
    from streamio.pipeline import mix as mix_module

    rng = np.random.default_rng(3)
    sizes = rng.choice([0, 40, 178, 3000, 30_000], size=3000, p=[.05, .55, .385, .012, .003])
    records = [rng.bytes(int(n)) for n in sizes]
    a, b = str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord.gz")
    streamio.write_records(a, "tfrecord", records[:2000])
    streamio.write_records(b[:-3], "tfrecord", records[2000:])
    open(b, "wb").write(gzip.compress(open(b[:-3], "rb").read()))
    damaged = bytearray(open(a, "rb").read())
    for at in rng.integers(0, len(damaged), 6):
        damaged[int(at)] ^= 0x5A
    c = str(tmp_path / "c.tfrecord")
    open(c, "wb").write(bytes(damaged))
    examples = write_id_examples(tmp_path / "e.tfrecord", range(3000))
    more = write_id_examples(tmp_path / "f.tfrecord", range(3000, 4000))

    def epochs():
        plain = [streamio.Dataset(a, "tfrecord", read_size=8192), streamio.Dataset(b, "tfrecord"),
                 streamio.Dataset(c, "tfrecord", on_error="skip", read_size=65536)]
        yield list(streamio.mix(plain, [0.5, 0.3, 0.2], seed=1, stop="all_exhausted"))
        decoded = [streamio.Dataset(examples, "tfrecord", decoder=ID_X, read_size=4096),
                   streamio.Dataset(more, "tfrecord", decoder=ID_X)]
        yield _ids(streamio.mix(decoded, seed=2, stop="all_exhausted").batch(32))
        strict = [streamio.Dataset(c, "tfrecord", read_size=8192), streamio.Dataset(a, "tfrecord")]
        got = []
        with pytest.raises(CorruptRecordError) as info:
            for record in streamio.mix(strict, seed=4):
                got.append(record)
        yield got, info.value.offset, info.value.record_index

    kinds = collections.Counter()
    take = mix_module._TAKE

    def seeing(*args, **kwargs):  # the real kernel, counting the kinds of parts it is given
        kinds.update(type(part).__name__ for part in args[4])
        return take(*args, **kwargs)

    monkeypatch.setattr(mix_module, "_TAKE", seeing)
    made = list(epochs())
    assert kinds["tuple"] > 0  # records in their reads' buffers did reach the kernel
    monkeypatch.setattr(mix_module, "SPANS", False)
    kinds.clear()
    placed = list(epochs())
    assert kinds["tuple"] == 0
    assert made == placed
    assert len(made[0]) > 4000 and len(made[1]) == 4000 and made[2][0]


def test_weights_are_relative_and_equal_by_default(ab):
    a, b = ab
    inputs = [streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")]
    assert list(streamio.mix(inputs, [3, 1], seed=1)) == list(
        streamio.mix(inputs, [0.75, 0.25], seed=1))
    half = list(streamio.mix(inputs, seed=1))
    assert abs(len(_from(half, b"a")) - len(_from(half, b"b"))) < 400  # b (10000) ends first


@pytest.mark.parametrize("weights,share", [([1e308, 1e308], 0.5), ([1.5e308, 0.5e308], 0.75)])
def test_weights_near_the_float_maximum_are_relative_too(ab, weights, share):
    # Their sum overflows: this raised a bare OverflowError from math.fsum.
    a, b = ab
    inputs = [streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")]
    mixed = streamio.mix(inputs, weights, seed=1)
    assert list(mixed) == list(streamio.mix(inputs, [share, 1 - share], seed=1))


def test_a_weight_beyond_the_float_range_is_a_usage_error(ab):
    inputs = [streamio.Dataset(path, "lines") for path in ab]
    with pytest.raises(UsageError, match=r"weights\[0\] must be a finite number"):
        streamio.mix(inputs, [10 ** 400, 1])


def test_the_docstring_opens_with_what_the_default_stop_drops():
    # help(streamio.mix) must say up front that the default ends the epoch at the first input
    # that runs out (tf.data's sample_from_datasets goes on), and how to get every item.
    opening = " ".join(streamio.mix.__doc__.split("\n\n")[0].split())
    assert 'By default (``stop="first_exhausted"``) the epoch ends when the first input runs' \
           ' out, and the rest of the others is NOT delivered' in opening
    assert '``stop="all_exhausted"`` delivers every item of every input' in opening


# -- stop modes -----------------------------------------------------------------------------------
def test_first_exhausted_ends_where_the_first_input_runs_out(tmp_path):
    a = _lines(tmp_path / "a.lines", "a", 300)
    b = _lines(tmp_path / "b.lines", "b", 5000)
    inputs = [streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")]
    for seed in range(5):
        first = list(streamio.mix(inputs, [0.5, 0.5], seed=seed))
        every = list(streamio.mix(inputs, [0.5, 0.5], seed=seed, stop="all_exhausted"))
        # Every record of the input that ran out, and no more of the other than the ratio
        # allows: it ended when the mix next chose the exhausted input.
        assert _from(first, b"a") == [f"a{i}".encode() for i in range(300)]
        assert 200 < len(_from(first, b"b")) < 400
        # The same choices until then: all_exhausted goes on where first_exhausted stopped.
        assert every[:len(first)] == first and len(every) == 5300


def test_all_exhausted_delivers_every_record_of_every_input_once(tmp_path):
    sizes = {"a": 7000, "b": 1500, "c": 3000}
    paths = {k: _lines(tmp_path / f"{k}.lines", k, n) for k, n in sizes.items()}
    for seed in range(4):
        items = list(streamio.mix([streamio.Dataset(p, "lines") for p in paths.values()],
                                  [0.5, 0.3, 0.2], seed=seed, stop="all_exhausted"))
        assert len(items) == sum(sizes.values())
        for k, n in sizes.items():  # each input whole, in its own order
            assert _from(items, k.encode()) == [f"{k}{i}".encode() for i in range(n)]


def test_an_input_of_weight_zero_is_not_read(tmp_path, ab):
    a, b = ab
    missing = str(tmp_path / "never.lines")  # would raise SourceError if it were opened
    items = list(streamio.mix([streamio.Dataset(a, "lines"), streamio.Dataset(missing, "lines"),
                               streamio.Dataset(b, "lines")], [1, 0, 1], seed=0,
                              stop="all_exhausted"))
    assert len(items) == 40000


# -- memory ---------------------------------------------------------------------------------------
def _peak_bytes(ds) -> int:
    """The most memory Python held at once while one epoch of ``ds`` was read (items dropped as
    they come, as a training loop does)."""
    tracemalloc.start()
    try:
        for _ in ds:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_mix_of_many_inputs_holds_about_what_reading_them_in_turn_holds(tmp_path):
    """Each input reads a share of one reader's read size: eight inputs do not hold eight 1 MiB
    read buffers and eight 1 MiB blocks of records (30 MB here, against 5 MB for the files read
    in turn)."""
    paths = [_lines(tmp_path / f"{k}.lines", f"{k}{'x' * 90}", 12000) for k in "abcdefgh"]
    mixed = streamio.mix([streamio.Dataset(p, "lines") for p in paths], seed=0,
                         stop="all_exhausted")
    alone = streamio.Dataset(paths, "lines")
    assert _peak_bytes(mixed) < 2 * _peak_bytes(alone)
    # A mix of mixes too (each inner mix shares out the share it is given).
    halves = [streamio.mix([streamio.Dataset(p, "lines") for p in four], seed=1)
              for four in (paths[:4], paths[4:])]
    assert _peak_bytes(streamio.mix(halves, seed=0, stop="all_exhausted")) < 2 * _peak_bytes(
        alone)
    # An input given its own read size keeps it.
    big = streamio.mix([streamio.Dataset(p, "lines", read_size=1 << 20) for p in paths],
                       seed=0, stop="all_exhausted")
    assert _peak_bytes(big) > 3 * _peak_bytes(alone)


def test_a_mix_of_inputs_of_large_records_holds_about_twice_what_one_reader_holds(tmp_path):
    """Inputs whose records prove large read larger shares (twice one reader's read size
    in all, at most one reader's each): eight inputs hold about what two readers hold, not
    eight; two inputs read 1 MiB each, as each would alone."""
    paths = [_lines(tmp_path / f"{k}.lines", f"{k}{'x' * 4000}", 300) for k in "abcdefgh"]
    for inputs in (paths, paths[:2]):
        mixed = streamio.mix([streamio.Dataset(p, "lines") for p in inputs], seed=0,
                             stop="all_exhausted")
        alone = streamio.Dataset(inputs, "lines")
        # Two readers' buffers and blocks of records, and each input's first small read.
        assert _peak_bytes(mixed) < 2 * _peak_bytes(alone) + len(inputs) * PROBE_READ_SIZE


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0)), min_size=1, max_size=8)
       .filter(lambda w: sum(w) > 0))
def test_the_larger_shares_hold_twice_one_readers_size_each_at_most_one(weights):
    """What the mix promises of its inputs' read sizes once their records prove large."""
    budget = 1 << 20
    total = sum(weights)
    weights = tuple(w / total for w in weights)
    live = [k for k, w in enumerate(weights) if w > 0]
    equal = 1 / len(live)
    large = mix_module._large_shares(weights, equal, budget)
    for k, w in enumerate(weights):
        if w == 0:
            assert large[k] == 0
            continue
        share = max(mix_module.MIN_READ_SIZE, int(budget * max(w, equal)))
        assert share <= large[k] <= budget
    assert sum(large) <= 2 * budget
    # The bound is used: min(two readers' worth, one each) within rounding.
    assert sum(large) >= min(2, len(live)) * budget - len(live)
    if len(live) <= 2:
        assert all(large[k] == budget for k in live)


def test_inputs_of_large_records_read_larger_shares_and_give_the_same_items():
    """An input reads a share of one reader's 1 MiB (by its weight, or an equal share if that
    is more: 768 KiB and 512 KiB here); one whose first read shows large records reads a larger
    share from then on (two inputs: 1 MiB each, as each would alone), one of small records
    keeps its share. The items are those of the same mix read in other chunks."""
    rng = random.Random(3)
    large = [rng.randbytes(rng.randrange(4 << 10, 12 << 10)) for _ in range(600)]
    small = [rng.randbytes(rng.randrange(50, 300)) for _ in range(20000)]
    data = [b"".join(encode_tfrecord(r) for r in records) for records in (large, small)]

    def epoch(read_size=None):
        streams = [RecordingStream(d) for d in data]
        options = {} if read_size is None else {"read_size": read_size}
        items = list(streamio.mix([streamio.Dataset(s, "tfrecord", **options)
                                   for s in streams], [0.75, 0.25], seed=5,
                                  stop="all_exhausted"))
        return items, [s.sizes for s in streams]

    items, (big, little) = epoch()
    assert big[0] == PROBE_READ_SIZE and set(big[1:]) == {1 << 20}
    assert little[0] == PROBE_READ_SIZE and set(little[1:]) == {512 << 10}
    assert sorted(items) == sorted(large + small)
    # Chunks never change the items: inputs given their own read size (kept, not grown).
    again, sizes = epoch(read_size=100_000)
    assert again == items and all(set(s) == {100_000} for s in sizes)


def test_a_mix_with_a_decoder_cuts_its_output_into_blocks_of_one_length(tmp_path):
    """With a decoder after the mix (it decodes a block's batches in one call), the output
    blocks all have one length (after the first, cut before any input's block length is known),
    whatever the draws and wherever the inputs' blocks end: the decoder then allocates the same
    sizes block after block, which the C allocator reuses (blocks cut where an input's block
    ended made the heap grow and shrink, a tenth of a decoded epoch in page faults: see
    streamio.pipeline.mix). Without a decoder a block ends where an input's block of spans
    (small TFRecord records, made by the mix as it places them) does."""
    from streamio.pipeline.epoch import EpochRun
    from streamio.pipeline.stats import EpochStats

    a = write_id_examples(tmp_path / "a.tfrecord", range(30000))
    b = write_id_examples(tmp_path / "b.tfrecord", range(100000, 110000))

    def block_sizes(decoder):
        mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=decoder,
                                               read_size=96 * 1024),
                              streamio.Dataset(b, "tfrecord", decoder=decoder,
                                               read_size=64 * 1024)],
                             [0.75, 0.25], seed=3, stop="all_exhausted")
        sizes = [len(items) for items, _ in EpochRun(mixed, 0, EpochStats()).build()]
        assert sum(sizes) == 40000
        return sizes[1:-1]

    decoded = block_sizes(ID_X)
    assert len(decoded) > 10 and len(set(decoded)) == 1, decoded
    assert len(set(block_sizes(None))) > 10


def test_without_a_decoder_an_inputs_list_of_records_does_not_end_a_block(tmp_path):
    """Records the mix makes from an input's spans go out when that block is used up (test
    above); records an input's reader made, a read's list, were made a read earlier, so the
    end of a list does not cut the output: its blocks have one length but where the draws end
    (every DRAW choices), not one more block per input block."""
    from streamio.pipeline.epoch import EpochRun
    from streamio.pipeline.stats import EpochStats

    a = _lines(tmp_path / "a.lines", "a", 60000)
    b = _lines(tmp_path / "b.lines", "b", 20000)
    mixed = streamio.mix([streamio.Dataset(a, "lines", read_size=8 * 1024),
                          streamio.Dataset(b, "lines", read_size=8 * 1024)],
                         [0.75, 0.25], seed=3, stop="all_exhausted")
    sizes = [len(items) for items, _ in EpochRun(mixed, 0, EpochStats()).build()]
    assert sum(sizes) == 80000
    # The inputs gave about 100 blocks (8 KiB reads of 7-byte lines); every block is full
    # but the last before a new draw or an input's end, and the first (before any input's
    # block length was known).
    length, full = collections.Counter(sizes).most_common(1)[0]
    cuts = 80000 // mix_module.DRAW + 1
    assert length > 1000 and full >= len(sizes) - cuts - 3, sizes
    assert len(sizes) < 80000 // length + cuts + 3


def test_an_input_cached_when_read_alone_is_served_from_its_cache_in_a_mix(tmp_path, ab):
    """The mix's share of the read size is no part of what an input's cache is keyed on (the
    records do not depend on it): the file written by reading the input alone serves it."""
    a, b = ab
    (tmp_path / "cache").mkdir()
    cached = streamio.Dataset(a, "lines").cache(str(tmp_path / "cache"))
    assert len(list(cached)) == 30000  # fills the cache file
    # Bytes only a read of the file would see: the same length, its stat restored (a removed or
    # visibly changed file would make the cache stale, and the source be read again).
    st = os.stat(a)
    with open(a, "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(data.replace(b"a", b"z"))
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    items = list(streamio.mix([cached, streamio.Dataset(b, "lines")], [0.75, 0.25], seed=0,
                              stop="all_exhausted"))
    assert _from(items, b"a") == [f"a{i}".encode() for i in range(30000)]


# -- inputs with their own shuffle and decoder; stages after the mix ----------------------------
@pytest.fixture
def examples(tmp_path):
    """Two TFRecord files of id Examples: ids 0..5999 and 100000..101999."""
    return (write_id_examples(tmp_path / "a.tfrecord", range(6000)),
            write_id_examples(tmp_path / "b.tfrecord", range(100000, 102000)))


def test_inputs_keep_their_own_shuffle_and_the_shared_decoder_decodes_batches(examples):
    a, b = examples
    shuffled_a = streamio.Dataset(a, "tfrecord", decoder=ID_X).shuffle(500, seed=11)
    plain_b = streamio.Dataset(b, "tfrecord", decoder=ID_X)
    mixed = streamio.mix([shuffled_a, plain_b], [0.75, 0.25], seed=3, stop="all_exhausted")
    assert mixed.decoder is ID_X
    batches = list(mixed.batch(64).map(lambda batch: dict(batch, twice=batch["x"] * 2))
                   .prefetch(2))
    assert all(isinstance(batch, dict) and len(batch["id"]) <= 64 for batch in batches)
    assert all(np.array_equal(batch["twice"][:, 0], 2 * batch["id"]) for batch in batches)
    ids = _ids(batches)
    assert sorted(ids) == list(range(6000)) + list(range(100000, 102000))
    # The shuffled input's records come in the order it gives alone (same epoch), b's in order.
    alone = _ids(shuffled_a.with_context(epoch=0).batch(100))
    assert [i for i in ids if i < 100000] == alone != sorted(alone)
    assert [i for i in ids if i >= 100000] == list(range(100000, 102000))
    # Each epoch, each input shuffles anew.
    again = _ids(mixed.with_context(epoch=1).batch(64))
    assert [i for i in again if i < 100000] != alone


def test_different_decoders_give_batches_of_records_and_batched_inputs_mix_batches(examples):
    a, b = examples
    other = streamio.Example({"id": streamio.FixedLen([], "int64")})
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=ID_X),
                          streamio.Dataset(b, "tfrecord", decoder=other)], seed=0)
    assert mixed.decoder is None
    first = next(iter(mixed.batch(8)))
    assert isinstance(first, list) and all(isinstance(r, bytes) for r in first)
    # Batched inputs: the mix interleaves their (decoded) batches.
    batched = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=ID_X).batch(100),
                            streamio.Dataset(b, "tfrecord", decoder=other).batch(50)],
                           [0.5, 0.5], seed=0, stop="all_exhausted")
    assert batched.batch_size is not None
    items = list(batched)
    assert len(items) == 60 + 40
    assert sorted(_ids(items)) == list(range(6000)) + list(range(100000, 102000))
    with pytest.raises(UsageError, match="already batched"):
        batched.batch(4)


def test_csv_inputs_with_a_header_share_their_decoder_and_the_stats_count_both(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x,y\n" + "".join(f"{i},{i % 3}\n" for i in range(1000)))
    b.write_text("x,y\n" + "".join(f"{i + 5000},{i % 3}\n" for i in range(300)))
    decoder = streamio.Csv(header=True)
    mixed = streamio.mix([streamio.Dataset(str(a), "csv", decoder=decoder),
                          streamio.Dataset(str(b), "csv", decoder=decoder)], seed=0,
                         stop="all_exhausted").batch(100)
    rows = np.concatenate([batch["features"] for batch in mixed])
    assert sorted(rows[:, 0].astype(int)) == list(range(1000)) + list(range(5000, 5300))
    stats = mixed.stats()
    assert stats["records"] == 1300 and stats["batches"] == 13
    assert stats["sources_opened"] == 2 and stats["bytes"] == a.stat().st_size + b.stat().st_size
    # Different headers cannot share one decoder: the second is named.
    b.write_text("x,z\n1,2\n")
    with pytest.raises(DecodeError, match="header differs"):
        list(mixed)


def test_a_mix_of_mixes_and_a_shuffle_after_the_mix(ab, tmp_path):
    a, b = ab
    c = _lines(tmp_path / "c.lines", "c", 5000)
    inner = streamio.mix([streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")], seed=1,
                         stop="all_exhausted")
    outer = streamio.mix([inner, streamio.Dataset(c, "lines")], [0.8, 0.2], seed=2,
                         stop="all_exhausted").shuffle(1000, seed=5)
    items = list(outer)
    assert collections.Counter(r[:1] for r in items) == {b"a": 30000, b"b": 10000, b"c": 5000}
    assert len(set(items)) == 45000
    assert "streamio.mix([streamio.mix([Dataset(" in repr(outer)


# -- resume ---------------------------------------------------------------------------------------
def _resumable(a: str, b: str, mix_seed, chain: str):
    """A pipeline built anew each call, as a restarted process builds it (seeds drawn anew)."""
    inputs = [streamio.Dataset(a, "tfrecord", decoder=ID_X).shuffle(300),  # a drawn seed
              streamio.Dataset(b, "tfrecord", decoder=ID_X).shuffle(200, seed=9)]
    mixed = streamio.mix(inputs, [0.75, 0.25], seed=mix_seed, stop="all_exhausted")
    if chain == "batched":
        return mixed.shuffle(100, seed=4).batch(32).prefetch(3)
    if chain == "batch-shuffle":
        return mixed.batch(16).shuffle_batches(5, seed=5)
    return mixed.prefetch(2)  # unbatched: decoded examples, one per record


@pytest.mark.parametrize("chain", ["batched", "batch-shuffle", "records"])
@pytest.mark.parametrize("mix_seed", [None, 12])
def test_a_resumed_epoch_is_exactly_the_rest_of_the_uninterrupted_one(examples, chain,
                                                                      mix_seed):
    a, b = examples
    rng = np.random.default_rng(0)
    for _ in range(3):
        ds = _resumable(a, b, mix_seed, chain)
        epoch = int(rng.integers(0, 3))
        ds = ds.with_context(epoch=epoch)
        it = iter(ds)
        items = list(it)
        total = len(items)
        cut = int(rng.integers(0, total + 1))
        it = iter(ds)
        head = [next(it) for _ in range(cut)]
        state = json.loads(json.dumps(it.state_dict()))  # as a checkpoint file holds it
        it.close()
        rest = list(_resumable(a, b, mix_seed, chain).with_context(epoch=epoch)
                    .iter_from(state))
        key = _ids if chain != "records" else (lambda got: [int(x["id"]) for x in got])
        assert key(head) + key(rest) == key(items), (chain, mix_seed, cut)
        if chain != "records":
            assert sorted(key(items)) == list(range(6000)) + list(range(100000, 102000))


def test_load_state_dict_and_a_torch_reader_resume_a_mix(examples):
    a, b = examples
    it = iter(_resumable(a, b, None, "batched"))
    items = [next(it) for _ in range(40)]
    state = it.state_dict()
    items += list(it)
    again = _resumable(a, b, None, "batched")
    again.load_state_dict(json.loads(json.dumps(state)))
    assert _ids(items[:40] + list(again)) == _ids(items)
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(_resumable(a, b, 5, "batched").to_torch(),
                                         batch_size=None)
    whole = [int(i) for batch in loader for i in batch["id"]]
    reader = _resumable(a, b, 5, "batched").to_torch()
    batches = iter(torch.utils.data.DataLoader(reader, batch_size=None))
    head = [int(i) for _ in range(30) for i in next(batches)["id"]]
    saved = reader.state_dict()
    fresh = _resumable(a, b, 5, "batched").to_torch()  # as a restarted job builds it
    fresh.load_state_dict(saved)
    rest = [int(i) for batch in torch.utils.data.DataLoader(fresh, batch_size=None)
            for i in batch["id"]]
    assert head + rest == whole


def test_a_state_of_another_mix_is_refused(examples, tmp_path):
    a, b = examples
    c = write_id_examples(tmp_path / "c.tfrecord", range(50))

    def make(weights=(0.75, 0.25), stop="all_exhausted", second=b, seed=9):
        return streamio.mix([streamio.Dataset(a, "tfrecord"),
                             streamio.Dataset(second, "tfrecord").shuffle(10, seed=seed)],
                            list(weights), seed=1, stop=stop)

    it = iter(make())
    next(it)
    state = it.state_dict()
    make().iter_from(state).close()  # the same mix resumes
    for other in (make(weights=(0.5, 0.5)), make(stop="first_exhausted"), make(second=c),
                  make(seed=10)):
        with pytest.raises(UsageError, match="chain"):
            other.iter_from(state)


# -- shards and adapters --------------------------------------------------------------------------
def test_shards_of_a_mix_cover_every_record_once(tmp_path):
    parts = [write_id_examples(tmp_path / f"a{k}.tfrecord", range(k * 1000, k * 1000 + 900))
             for k in range(3)]  # whole files per shard (or byte ranges, for n > 3)
    one = write_id_examples(tmp_path / "b.tfrecord", range(50000, 52500))  # byte ranges
    gz = str(tmp_path / "c.tfrecord.gz")  # compressed: dealt round-robin
    with open(write_id_examples(tmp_path / "c.tfrecord", range(70000, 70700)), "rb") as f:
        with gzip.open(gz, "wb") as out:
            out.write(f.read())
    inputs = [streamio.Dataset(parts, "tfrecord", decoder=ID_X).shuffle(100, seed=1),
              streamio.Dataset(one, "tfrecord", decoder=ID_X),
              streamio.Dataset(gz, "tfrecord", decoder=ID_X)]
    mixed = streamio.mix(inputs, [0.6, 0.3, 0.1], seed=0, stop="all_exhausted").batch(50)
    expected = sorted([*range(0, 900), *range(1000, 1900), *range(2000, 2900),
                       *range(50000, 52500), *range(70000, 70700)])
    for n in (1, 2, 3, 4):
        shards = [_ids(mixed.shard(n, i)) for i in range(n)]
        assert sorted(i for shard in shards for i in shard) == expected, n
        if n > 1:
            assert all(shards), n


def test_a_mix_reads_an_http_input(examples):
    a, b = examples
    with HostileHTTPServer() as server:
        with open(b, "rb") as f:
            url = server.add("/b.tfrecord", f.read())
        mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=ID_X),
                              streamio.Dataset(url, "tfrecord", decoder=ID_X)],
                             [0.75, 0.25], seed=2, stop="all_exhausted").batch(40)
        items = list(mixed)
        assert sorted(_ids(items)) == list(range(6000)) + list(range(100000, 102000))
        it = iter(mixed.with_context(epoch=0))
        head = [next(it) for _ in range(77)]
        state = it.state_dict()
        it.close()
        rest = list(mixed.with_context(epoch=0).iter_from(state))
        assert _ids(head + rest) == _ids(items)


def test_to_torch_with_two_dataloader_workers_delivers_every_record_once(tmp_path):
    pytest.importorskip("torch")
    a = write_id_examples(tmp_path / "a.tfrecord", range(3000))
    b = [write_id_examples(tmp_path / f"b{k}.tfrecord", range(10000 + 500 * k, 10500 + 500 * k))
         for k in range(3)]
    code = (
        "import json, sys, torch, streamio\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from support.examples import ID_X\n"
        "ds = streamio.mix([streamio.Dataset(sys.argv[2], 'tfrecord', decoder=ID_X).shuffle(64),\n"
        "                   streamio.Dataset(sys.argv[3:], 'tfrecord', decoder=ID_X)],\n"
        "                  [0.7, 0.3], stop='all_exhausted').batch(32)\n"
        "loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=2)\n"
        "epochs = [[int(i) for b in loader for i in b['id']] for _ in range(2)]\n"
        "print(json.dumps({'epochs': epochs, 'tf': 'tensorflow' in sys.modules}))\n")
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code, tests_dir, a, *b], capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    expected = list(range(3000)) + list(range(10000, 11500))
    first, second = result["epochs"]
    assert sorted(first) == expected and sorted(second) == expected
    assert first != second  # the epochs are shuffled and mixed differently
    assert result["tf"] is False


def test_to_torch_refuses_a_single_stream_input_split_between_workers(tmp_path, examples):
    pytest.importorskip("torch")
    a, _ = examples
    channel = streamio.PipeChannel(str(tmp_path / "train"))
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord"),
                          streamio.Dataset(channel, "tfrecord")], seed=0)
    tds = mixed.to_torch()
    with pytest.raises(UsageError, match="single stream.*2 readers"):
        tds.plan(epoch=0, worker=0, num_workers=2)
    tds.plan(epoch=0, worker=0, num_workers=1)  # one reader reads it whole


def test_to_tf_reads_a_mix(examples):
    tf = pytest.importorskip("tensorflow")
    a, b = examples
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=ID_X),
                          streamio.Dataset(b, "tfrecord", decoder=ID_X)], [0.75, 0.25],
                         seed=0, stop="all_exhausted")
    got = [int(i) for batch in mixed.batch(256).to_tf() for i in batch["id"].numpy()]
    assert sorted(got) == list(range(6000)) + list(range(100000, 102000))
    batched = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=ID_X).batch(100),
                            streamio.Dataset(b, "tfrecord", decoder=ID_X).batch(100)],
                           seed=0, stop="all_exhausted")
    got = [int(i) for batch in batched.to_tf() for i in batch["id"].numpy()]
    assert sorted(got) == list(range(6000)) + list(range(100000, 102000))
    assert isinstance(tf.constant(1), tf.Tensor)


def test_splitting_a_mix_into_source_parts_is_refused_not_empty(examples):
    from streamio.pipeline.splits import plan_parts

    a, b = examples
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord"), streamio.Dataset(b, "tfrecord")])
    with pytest.raises(UsageError, match="mix"):
        plan_parts(mixed, 2)  # what streamio.ray reads: it would have found no sources


# -- errors ---------------------------------------------------------------------------------------
def test_a_corrupt_record_in_an_input_raises_its_error_after_the_items_before_it(tmp_path,
                                                                               examples):
    _, b = examples
    records = [id_example(i) for i in range(2000)]
    path = str(tmp_path / "bad.tfrecord")
    streamio.write_records(path, "tfrecord", records)
    data = bytearray(open(path, "rb").read())
    offset = sum(16 + len(r) for r in records[:1234])  # record 1234's frame
    data[offset + 12 + 5] ^= 0xFF  # a byte of its payload: its data CRC fails
    open(path, "wb").write(bytes(data))
    mixed = streamio.mix([streamio.Dataset(path, "tfrecord"), streamio.Dataset(b, "tfrecord")],
                         seed=0, stop="all_exhausted")
    got = []
    with pytest.raises(CorruptRecordError) as info:
        for record in mixed:
            got.append(record)
    assert info.value.source == path and info.value.record_index == 1234
    assert info.value.offset == offset
    assert [r for r in got if r in set(records)] == records[:1234]


@pytest.mark.parametrize("kernel", ["C", "reference"])
def test_a_damaged_payload_the_kernel_copies_raises_where_the_readers_scan_would(
        tmp_path, monkeypatch, kernel):
    """Records made from their reads' buffers have their CRCs checked by the mix's kernel as it
    copies them (the readers' scans leave them to it): a damaged payload anywhere in a read
    (its first record, its last, one between; in either input) gives the items before it, then
    the reader's own error (its source, offset and record index), exactly as when the readers
    check every record first (mix.SPANS = False); raw records (the kernel's loop for two
    inputs) and records with origins for a decoder after the mix (its general loop)."""
    from streamio.pipeline import mix as mix_module

    if kernel == "reference":
        monkeypatch.setattr(mix_module, "_TAKE", mix_module.mix_take_reference)
    rng = np.random.default_rng(11)
    ids = {"a": range(3000), "b": range(10_000, 11_000)}
    good = {name: write_id_examples(tmp_path / f"{name}.tfrecord", r) for name, r in ids.items()}
    frames = {name: [16 + len(id_example(i)) for i in r] for name, r in ids.items()}
    crcs = collections.Counter()
    take = mix_module._TAKE

    def seeing(*args, **kwargs):  # the kernel, counting the parts whose CRCs it checks
        crcs.update(len(part) == 3 for part in args[4] if type(part) is tuple)
        return take(*args, **kwargs)

    monkeypatch.setattr(mix_module, "_TAKE", seeing)

    def epoch(paths, decoded):
        inputs = [streamio.Dataset(p, "tfrecord", read_size=4096,
                                   decoder=ID_X if decoded else None) for p in paths]
        mixed = streamio.mix(inputs, [0.75, 0.25], seed=5, stop="all_exhausted")
        got = []
        with pytest.raises(CorruptRecordError) as info:
            for item in (mixed.batch(8) if decoded else mixed):
                got.append(item["id"].tolist() if decoded else item)
        err = info.value
        return got, err.source, err.offset, err.record_index, str(err)

    # Records 0-30ish come in the first read (a list); then every read's records are spans,
    # a 4 KiB read holding about 80: its first at a read's start, its last at its end.
    cases = [("a", 100), ("a", 2999), ("b", 500)] + [
        ("a" if j % 3 else "b", int(rng.integers(40, 999 if j % 3 == 0 else 2999)))
        for j in range(6)]
    for j, (name, k) in enumerate(cases):
        paths = dict(good)
        data = bytearray(open(good[name], "rb").read())
        offset = sum(frames[name][:k])
        data[offset + 12 + int(rng.integers(0, frames[name][k] - 12))] ^= 0x10  # payload or CRC
        paths[name] = str(tmp_path / f"bad-{j}-{name}.tfrecord")
        open(paths[name], "wb").write(bytes(data))
        decoded = j % 2 == 1
        made = epoch([paths["a"], paths["b"]], decoded)
        monkeypatch.setattr(mix_module, "SPANS", False)
        placed = epoch([paths["a"], paths["b"]], decoded)
        monkeypatch.setattr(mix_module, "SPANS", True)
        assert made == placed
        assert made[1:4] == (paths[name], offset, k)
    assert crcs[True] > 100 and crcs[False] == 0


def test_with_a_decoder_a_corrupt_record_still_comes_after_every_item_before_it(tmp_path,
                                                                               examples):
    """With the mix's decoder the output blocks are filled across the inputs' blocks: the
    block being filled when an input fails is delivered before the error."""
    _, b = examples
    path = write_id_examples(tmp_path / "bad.tfrecord", range(2000))
    data = bytearray(open(path, "rb").read())
    offset = sum(16 + len(id_example(i)) for i in range(1234))  # record 1234's frame
    data[offset + 12 + 5] ^= 0xFF  # a byte of its payload: its data CRC fails
    open(path, "wb").write(bytes(data))
    mixed = streamio.mix([streamio.Dataset(path, "tfrecord", decoder=ID_X),
                          streamio.Dataset(b, "tfrecord", decoder=ID_X)],
                         seed=0, stop="all_exhausted")
    assert mixed.decoder is ID_X  # blocks of one length (unbatched: decoded examples come out)
    got = []
    with pytest.raises(CorruptRecordError) as info:
        for item in mixed:
            got.append(int(item["id"]))
    assert info.value.source == path and info.value.record_index == 1234
    assert [i for i in got if i < 2000] == list(range(1234))


def test_a_decode_error_after_the_mix_names_the_input_record(tmp_path, examples):
    a, _ = examples
    records = [id_example(i) for i in range(500)]
    records[321] = b"\xff\xff not an Example"
    bad = str(tmp_path / "bad.tfrecord")
    streamio.write_records(bad, "tfrecord", records)
    mixed = streamio.mix([streamio.Dataset(a, "tfrecord", decoder=ID_X),
                          streamio.Dataset(bad, "tfrecord", decoder=ID_X)], seed=0).batch(16)
    with pytest.raises(DecodeError) as info:
        list(mixed)
    assert info.value.source == bad and info.value.record_index == 321


def test_bad_arguments_are_clear_errors(ab):
    a, b = ab
    inputs = [streamio.Dataset(a, "lines"), streamio.Dataset(b, "lines")]
    with pytest.raises(UsageError, match="weights has 3 entries for 2"):
        streamio.mix(inputs, [1, 2, 3])
    with pytest.raises(UsageError, match=r"weights\[1\].*>= 0"):
        streamio.mix(inputs, [1, -1])
    with pytest.raises(UsageError, match=r"weights\[0\]"):
        streamio.mix(inputs, [float("nan"), 1])
    with pytest.raises(UsageError, match="all zero"):
        streamio.mix(inputs, [0, 0])
    with pytest.raises(UsageTypeError, match=r"weights\[0\] must be a number"):
        streamio.mix(inputs, ["1", 1])
    with pytest.raises(UsageTypeError, match="input 1 is a str"):
        streamio.mix([inputs[0], a])
    with pytest.raises(UsageTypeError, match="list of streamio Datasets"):
        streamio.mix(inputs[0])
    with pytest.raises(UsageError, match="at least one"):
        streamio.mix([])
    with pytest.raises(UsageError, match="stop must be one of"):
        streamio.mix(inputs, stop="longest")
    with pytest.raises(UsageTypeError, match="seed must be an int"):
        streamio.mix(inputs, seed="7")
    with pytest.raises(UsageError, match="all batched or all unbatched"):
        streamio.mix([inputs[0].batch(4), inputs[1]])
    # Everything is checked when the mix is built: nothing was opened.
    assert isinstance(streamio.mix(inputs, np.array([1.0, 2.0])), streamio.Dataset)

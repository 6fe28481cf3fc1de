"""The mix kernel (streamio/_c/mix.c: mix_take) against its reference
(streamio/pipeline/mix.py: mix_take_reference): same items, origins, stops and errors, no
reference lost."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.formats import masked_crc32c
from streamio.pipeline.mix import mix_take_reference

speedups = pytest.importorskip(
    "streamio._speedups", reason="C accelerator not built (python setup.py build_ext --inplace)")

SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.data_too_large])
END = 1 << 32

# Items of every kind a mix hands over: records, raw batches (lists), decoded batches (dicts).
ITEMS = st.one_of(st.binary(max_size=8), st.lists(st.binary(max_size=3), max_size=3),
                  st.dictionaries(st.just("x"), st.integers(), max_size=1), st.integers())


def _bounds(data, k: int) -> np.ndarray:
    """Non-decreasing bounds ending at 2**32; some ranges empty, some a single number."""
    cuts = sorted(data.draw(st.lists(st.one_of(st.integers(0, END), st.sampled_from(
        [0, 1, END - 1, END])), min_size=k - 1, max_size=k - 1)))
    return np.array(cuts + [END], dtype=np.uint64)


def _call(fn, args: tuple) -> tuple:
    """What a call gives (the items by identity), and what it leaves in starts and
    origins_out."""
    draws, begin, limit, bounds, parts, starts, origins, out_ids = args[:8]
    out = args[8] if len(args) > 8 else None
    starts = list(starts)
    out_ids = None if out_ids is None else out_ids.copy()
    try:
        items, end, short = fn(draws, begin, limit, bounds, parts, starts, origins, out_ids,
                               *args[8:])
    except (TypeError, ValueError, BufferError) as exc:
        return (type(exc), str(exc)), starts, None
    assert out is None or items is out
    written = None if out_ids is None else out_ids[:end - begin].tolist()
    return ([id(x) for x in items], end, short), starts, written


@SLOW_OK
@given(k=st.integers(1, 12), track=st.booleans(), shared=st.booleans(), prefix=st.integers(0, 5),
       into=st.booleans(), data=st.data())
def test_mix_take_equals_the_reference(k, track, shared, prefix, into, data):
    """Same objects, origins, stop and starts as the reference, whether the kernel moves the
    items out of parts only `parts` holds (the mix's input blocks) or counts them (a part held
    elsewhere too, left as it was); appended to a given list after what it held."""
    ndraws = data.draw(st.integers(0, 60))
    draws = data.draw(st.binary(min_size=4 * ndraws, max_size=4 * ndraws))
    bounds = _bounds(data, k)
    # Fresh objects (a drawn b"" or small int is shared by everyone: its count moves on its own).
    blocks = [[[item] for item in data.draw(st.lists(ITEMS, max_size=12))] for _ in range(k)]
    starts = [data.draw(st.integers(0, len(part))) for part in blocks]
    origins = [np.arange(len(p), dtype=np.int64) + 100 * j for j, p in enumerate(blocks)]
    limit = data.draw(st.integers(0, 40))
    begin = data.draw(st.integers(0, ndraws))
    out_ids = np.full(limit, -1, dtype=np.int64)
    held = [object() for _ in range(prefix)]
    everything = [item for part in blocks for item in part] + held
    baseline = [sys.getrefcount(item) for item in everything]
    runs = {}
    for name, fn in (("reference", mix_take_reference), ("kernel", speedups.mix_take)):
        parts = [list(block) for block in blocks]  # each list held by `parts` alone...
        others = list(parts) if shared else None  # ...or not
        out = list(held) if into else None
        args = (draws, begin, limit, bounds, parts, starts, origins if track else None,
                out_ids if track else None) + ((out,) if into else ())
        runs[name] = _call(fn, args)
        (ids, end, short), after, _ = runs[name]
        took = [a - s for a, s in zip(after, starts)]
        if into:
            assert ids[:prefix] == [id(x) for x in held]  # appended after what it held
        for j, part in enumerate(parts):
            gone = range(starts[j], starts[j] + took[j])
            moved = name == "kernel" and not shared
            assert [x is None if i in gone and moved else x is blocks[j][i]
                    for i, x in enumerate(part)] == [True] * len(part)
        del parts, part, others, out, args
    assert runs["kernel"] == runs["reference"]
    (ids, end, short), after, _ = runs["kernel"]
    ids = ids[prefix if into else 0:]
    # Each draw picked the part its bounds say, and each part's items came out in order.
    u = np.frombuffer(draws, "<u4")
    taken = dict.fromkeys(range(k), 0)
    for t in range(begin, end):
        j = int(np.argmax(u[t] < bounds))
        assert ids[t - begin] == id(blocks[j][starts[j] + taken[j]])
        taken[j] += 1
    assert after == [s + taken[j] for j, s in enumerate(starts)]
    if short >= 0:  # the draw at `end` names a part with nothing left
        assert np.argmax(u[end] < bounds) == short
        assert starts[short] + taken[short] == len(blocks[short])
    else:
        assert len(ids) == limit or end == ndraws
    assert [sys.getrefcount(item) for item in everything] == baseline  # none leaked or lost


def _span_part(data, bad: bool, crcs: bool = False) -> tuple:
    """Records in a buffer as a reader's spans give them: ``(buffer, int64 pairs)``, with
    bytes before, between and after the records; ``bad``: one pair outside the buffer.
    ``crcs``: ``(buffer, pairs, True)``, each record followed by its masked CRC-32C (TFRecord's
    footer), some of them wrong; then also the indices of the records whose CRCs are wrong."""
    records = data.draw(st.lists(st.binary(max_size=6), max_size=12))
    gaps = data.draw(st.lists(st.binary(max_size=3), min_size=len(records) + 1,
                              max_size=len(records) + 1))
    wrong = data.draw(st.sets(st.integers(0, max(0, len(records) - 1)), max_size=2)) \
        if crcs and records else set()
    buffer, pairs = bytearray(gaps[0]), []
    for i, (record, gap) in enumerate(zip(records, gaps[1:])):
        pairs += [len(buffer), len(record)]
        footer = masked_crc32c(record) ^ (1 << data.draw(st.integers(0, 31)) if i in wrong
                                          else 0)
        buffer += record + (footer.to_bytes(4, "little") if crcs else b"") + gap
    if bad and records:
        i = data.draw(st.integers(0, len(records) - 1))
        pairs[2 * i:2 * i + 2] = data.draw(st.sampled_from([
            (len(buffer) + 1, 0), (0, len(buffer) + 1), (-1, 1), (0, -1),
            (len(buffer) - 1, 2), (1 << 62, 1 << 62)]
            + [(len(buffer) - 3, 0)] * crcs))  # its CRC would lie past the end
    if crcs:
        return (bytes(buffer), np.array(pairs, dtype=np.int64), True), records, wrong
    return (bytes(buffer), np.array(pairs, dtype=np.int64)), records


@SLOW_OK
@given(two=st.booleans(), k=st.integers(1, 4), track=st.booleans(), shared=st.booleans(),
       bad=st.booleans(), data=st.data())
def test_mix_take_makes_the_records_of_span_parts_as_the_reference_does(two, k, track, shared,
                                                                         bad, data):
    """Parts that are records still in a buffer (a mix of TFRecord inputs), beside lists or
    not, their CRCs to check or not, and two of them without origins (``two``: the kernel's own
    loop for the commonest mix, with CRCs, without, or one of each): the same records in the
    same order, the same stop, starts and origins as the reference; a pair outside its buffer
    refused at the draw that takes it; a record whose CRC is wrong stops the pass before its
    draw (its part is `short`, its start left at it); no reference to a list's items, a buffer
    or its pairs gained or lost."""
    if two:
        k, track = 2, False
    ndraws = data.draw(st.integers(0, 80))
    draws = data.draw(st.binary(min_size=4 * ndraws, max_size=4 * ndraws))
    bounds = _bounds(data, k)
    spanned = [two or data.draw(st.booleans()) for _ in range(k)]
    checked = [spanned[j] and data.draw(st.booleans()) for j in range(k)]
    wrong: list = [set()] * k  # each part's records whose CRCs are wrong
    parts_made, blocks = [], []
    for j in range(k):
        if checked[j]:
            part, records, wrong[j] = _span_part(data, bad, crcs=True)
            parts_made.append(part)
            blocks.append(records)
        elif spanned[j]:
            part, records = _span_part(data, bad)
            parts_made.append(part)
            blocks.append(records)
        else:
            block = [[item] for item in data.draw(st.lists(ITEMS, max_size=12))]
            parts_made.append(block)
            blocks.append(block)
    starts = [data.draw(st.integers(0, len(block))) for block in blocks]
    # The first record from its start on whose CRC is wrong (None if none).
    wrong = [min((i for i in w if i >= s), default=None) for w, s in zip(wrong, starts)]
    origins = [np.arange(len(b), dtype=np.int64) + 100 * j for j, b in enumerate(blocks)]
    limit = data.draw(st.integers(0, 60))
    begin = data.draw(st.integers(0, ndraws))
    everything = ([x for j, b in enumerate(blocks) if not spanned[j] for x in b]
                  + [x for j, p in enumerate(parts_made) if spanned[j] for x in p[:2] if len(x)])
    baseline = [sys.getrefcount(x) for x in everything]
    runs = {}
    for name, fn in (("reference", mix_take_reference), ("kernel", speedups.mix_take)):
        parts = [p if spanned[j] else list(p) for j, p in enumerate(parts_made)]
        others = list(parts) if shared else None
        out_ids = np.full(limit, -1, dtype=np.int64)
        given = list(starts)
        try:
            items, end, short = fn(draws, begin, limit, bounds, parts, given,
                                   origins if track else None, out_ids if track else None)
        except ValueError as exc:
            runs[name] = (str(exc), given)
        else:
            assert all(type(x) is bytes for x in items if not isinstance(x, list))
            runs[name] = ([x if type(x) is bytes else id(x) for x in items], end, short, given,
                          out_ids[:end - begin].tolist() if track else None)
            del items
        del parts, others
    assert runs["kernel"] == runs["reference"]
    assert [sys.getrefcount(x) for x in everything] == baseline
    if len(runs["kernel"]) == 2:  # refused: only for a pair outside its buffer
        assert bad and "lies outside its buffer" in runs["kernel"][0]
        assert runs["kernel"][1] == starts  # nothing taken
        return
    got, end, short, after, _ = runs["kernel"]
    # Each draw took the next record of the part its bounds say.
    u = np.frombuffer(draws, "<u4")
    taken = [0] * k
    for t in range(begin, end):
        j = int(np.argmax(u[t] < bounds))
        want = blocks[j][starts[j] + taken[j]]
        assert got[t - begin] == (want if spanned[j] else id(want))
        taken[j] += 1
    assert after == [s + n for s, n in zip(starts, taken)]
    for j in range(k):  # no record whose CRC is wrong was made
        assert wrong[j] is None or after[j] <= wrong[j]
    if short >= 0:
        assert np.argmax(u[end] < bounds) == short
        assert after[short] in (len(blocks[short]), wrong[short])
    else:
        assert end - begin == limit or end == ndraws


def test_mix_take_moves_items_out_of_a_part_only_parts_holds():
    """The mix's case: an input block held by `parts` alone gives its items up (None in their
    slots), so each item is held once, by the output, and nothing is counted twice; a block
    also held elsewhere is left whole."""
    draws = np.zeros(3, dtype="<u4").tobytes()
    one = np.array([END], np.uint64)
    made = [object() for _ in range(4)]
    parts = [list(made)]
    before = [sys.getrefcount(x) for x in made]
    out, end, short = speedups.mix_take(draws, 0, 3, one, parts, [0], None, None)
    assert out == made[:3] and (end, short) == (3, -1)
    assert parts[0] == [None, None, None, made[3]]
    assert [sys.getrefcount(x) for x in made] == before  # the part's references moved to out
    del out
    shared = list(made)
    parts = [shared]
    out, _, _ = speedups.mix_take(draws, 0, 3, one, parts, [0], None, None)
    assert shared == made and out == made[:3]
    # `shared` in place of the first part, and out's references counted up.
    assert [sys.getrefcount(x) for x in made] == [b + 1 for b in before[:3]] + before[3:]


def test_mix_take_appends_to_the_list_it_is_given_and_grows_it():
    """`out` a list: the items go after what it holds, however little room it has; the list
    itself is returned. A new list has room for `limit` items, so the next pass into it does
    not move it."""
    draws = np.zeros(50, dtype="<u4").tobytes()
    one = np.array([END], np.uint64)
    for fn in (speedups.mix_take, mix_take_reference):
        source = [[i] for i in range(50)]
        out = ["x"]
        got, end, _ = fn(draws, 0, 30, one, [source], [0], None, None, out)
        assert got is out and out == ["x"] + source[:30] and end == 30
        got, end, _ = fn(draws, 30, 30, one, [source], [30], None, None, out)
        assert got is out and out == ["x"] + source and end == 50
        with pytest.raises(ValueError, match=r"out is parts\[0\]"):
            fn(draws, 0, 1, one, [source], [0], None, None, source)
        with pytest.raises(TypeError, match="out must be a list or None"):
            fn(draws, 0, 1, one, [source], [0], None, None, ())


@SLOW_OK
@given(data=st.data())
def test_mix_take_refuses_what_the_reference_refuses(data):
    k = data.draw(st.integers(0, 4))
    draws = data.draw(st.binary(max_size=30))
    begin = data.draw(st.integers(-1, 8))
    limit = data.draw(st.integers(-1, 8))
    bounds = data.draw(st.one_of(
        st.builds(lambda v: np.array(v, dtype=np.uint64),
                  st.lists(st.sampled_from([0, 5, END - 1, END, END + 1]), max_size=5)),
        st.just(b"12345678")))
    parts = [data.draw(st.one_of(st.lists(st.integers(), max_size=6), st.tuples(st.integers())))
             for _ in range(k)]
    starts = data.draw(st.lists(st.one_of(st.integers(-2, 8), st.just(1.0)),
                                min_size=max(0, k - 1), max_size=k + 1))
    track = data.draw(st.booleans())
    origins = [np.zeros(data.draw(st.integers(0, 6)), np.int64) for _ in range(k)]
    out_ids = np.zeros(data.draw(st.integers(0, 6)), np.int64)
    args = (draws, begin, limit, bounds, parts, starts, origins if track else None,
            out_ids if track else None)
    assert _call(speedups.mix_take, args) == _call(mix_take_reference, args)


def test_mix_take_checks_its_arguments():
    one = np.array([END], np.uint64)
    for fn in (speedups.mix_take, mix_take_reference):
        def call(draws=b"\0" * 8, begin=0, limit=2, bounds=one, parts=None, starts=None,
                 origins=None, out_ids=None):
            return fn(draws, begin, limit, bounds, [[1, 2]] if parts is None else parts,
                      [0] if starts is None else starts, origins, out_ids)

        with pytest.raises(ValueError, match="whole 4-byte draws, not 5 bytes"):
            call(draws=b"12345")
        with pytest.raises(ValueError, match="begin 3 is outside the 2 draws"):
            call(begin=3)
        with pytest.raises(ValueError, match="limit must be >= 0, not -1"):
            call(limit=-1)
        with pytest.raises(ValueError, match="between 1 and 256 parts, not 257"):
            call(parts=[[]] * 257, starts=[0] * 257)
        with pytest.raises(ValueError, match="between 1 and 256 parts, not 0"):
            call(parts=[], starts=[])
        with pytest.raises(ValueError, match="bounds must be 2 uint64"):
            call(parts=[[1], [2]], starts=[0, 0])
        with pytest.raises(ValueError, match="non-decreasing"):
            call(bounds=np.array([5, 4, END], np.uint64), parts=[[]] * 3, starts=[0] * 3)
        with pytest.raises(ValueError, match="the last bound must be 2"):
            call(bounds=np.array([END - 1], np.uint64))
        with pytest.raises(ValueError, match="starts has 2 entries for 1 parts"):
            call(starts=[0, 0])
        with pytest.raises(TypeError, match="both None or neither"):
            call(origins=[np.zeros(2, np.int64)])
        with pytest.raises(ValueError, match="origins_out must hold 2 int64"):
            call(origins=[np.zeros(2, np.int64)], out_ids=np.zeros(1, np.int64))
        with pytest.raises(ValueError, match=r"origins\[0\] has 1 entries for 2 items"):
            call(origins=[np.zeros(1, np.int64)], out_ids=np.zeros(2, np.int64))
        with pytest.raises(ValueError, match=r"starts\[0\] is 3, outside parts\[0\] of 2"):
            call(starts=[3])
        with pytest.raises(TypeError, match=r"starts\[0\] must be an int"):
            call(starts=[True])
        with pytest.raises(TypeError, match=r"parts\[0\] must be a list or a \(buffer, spans"):
            call(parts=[(1, 2, 3, 4)])
        with pytest.raises(TypeError, match="a bytes-like object is required"):
            call(parts=[(1, 2, True)])
        with pytest.raises(ValueError, match=r"parts\[0\]'s spans must be int64 \(offset, len"):
            call(parts=[(b"abc", np.zeros(3, np.int64))])
        with pytest.raises(ValueError, match=r"parts\[0\]'s spans must be int64 \(offset, len"):
            call(parts=[(b"abc", np.zeros(4, np.int32))])
        with pytest.raises(TypeError, match="must be lists"):
            call(parts=([1, 2],))


def test_mix_take_stops_where_a_part_runs_out_and_moves_the_starts_on():
    """Draws of 0 pick part 0, draws of 2**32 - 1 part 1: the pass stops before the draw whose
    part has nothing left, says which, and the caller goes on from there."""
    draws = np.array([0, END - 1, 0, 0, END - 1], dtype="<u4").tobytes()
    bounds = np.array([1 << 31, END], np.uint64)
    a, b = [["a", i] for i in range(2)], [["b", i] for i in range(5)]
    for fn in (speedups.mix_take, mix_take_reference):
        parts, starts = [a, b], [0, 0]
        origins = [np.array([10, 11], np.int64), np.arange(20, 25, dtype=np.int64)]
        ids = np.zeros(4, np.int64)
        items, end, short = fn(draws, 0, 4, bounds, parts, starts, origins, ids)
        assert (items, end, short) == ([a[0], b[0], a[1]], 3, 0)
        assert a == [["a", 0], ["a", 1]]  # held here too: not moved out
        assert ids[:3].tolist() == [10, 20, 11] and starts == [2, 1]
        parts[0], starts[0] = [["a", 2]], 0  # its next block
        assert fn(draws, 3, 1, bounds, parts, starts, None, None) == ([["a", 2]], 4, -1)
        assert starts == [1, 1]

"""Resuming a stream shared by several readers mid-epoch (issue #25): block k of the stream goes
to reader k % readers, so the list of every reader's state resumes on the same layout exactly
(each reader delivers the uninterrupted epoch's remainder of its own share) and on any other
number of readers (or one reader with no feed) with every record exactly once over the runs.

Readers are threads of one process, each a Dataset reading through a ``SharedStreamFeed`` as a
DataLoader worker does (reader 0 runs the dealer); the stream is a file, a gzip file or a FIFO
fed by a writer process. An interrupted reader records its state and keeps reading: a reader
that stops early ends the dealer's epoch for every reader (by design), and a state taken
mid-epoch is what a killed job's checkpoint holds. States go through JSON."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from typing import Any, Callable, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import streamio
import streamio.sharing.dealer as dealer
from streamio.decoders import Example, FixedLen, encode_example
from streamio.errors import SourceError, UsageError
from streamio.pipeline.resume import seal
from streamio.sharing.stream import SharedStreamFeed

N = 1500
ALL = list(range(N))
RECORDS = [encode_example({"x": [i], "pad": b"p" * (i % 37)}) for i in range(N)]
_ID = {record: i for i, record in enumerate(RECORDS)}
_MODULE_FIXTURE = [HealthCheck.function_scoped_fixture]
THREAD_TIMEOUT = 20.0  # connect_timeout of a reader; every run must end well within JOIN_S
JOIN_S = 90.0

#: The pipelines: shuffle + batch + an Example decoder, raw records through a shuffle, and raw
#: batches through shuffle_batches.
CHAINS = {
    "decoded": lambda path, b, s: streamio.Dataset(
        path, "tfrecord", decoder=Example({"x": FixedLen((), np.int64)}))
    .shuffle(s, seed=3).batch(b),
    "records": lambda path, b, s: streamio.Dataset(path, "tfrecord").shuffle(s, seed=5),
    "batches": lambda path, b, s: streamio.Dataset(path, "tfrecord").batch(b)
    .shuffle_batches(4, seed=7),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("shared-elastic"))
    path = os.path.join(tmp, "all.tfrecord")
    streamio.write_records(path, "tfrecord", RECORDS)
    gz = os.path.join(tmp, "all.tfrecord.gz")
    streamio.write_records(gz, "tfrecord", RECORDS, compression="gzip")
    return {"file": path, "gzip": gz}


def _ids(item: Any) -> list:
    """The record ids of one item (a decoded batch, a raw batch or a raw record)."""
    if isinstance(item, dict):
        return item["x"].tolist()
    if isinstance(item, list):
        return [_ID[bytes(r)] for r in item]
    return [_ID[bytes(item)]]


def _reader(path: str, chain: str, batch: int, buffer: int, readers: int, index: int,
            token: str, epoch: int = 0, timeout: float = THREAD_TIMEOUT) -> Any:
    """Reader ``index`` of ``readers`` sharing the stream at ``path`` (one reader: no feed)."""
    ds = CHAINS[chain](path, batch, buffer).with_context(epoch=epoch, worker=index,
                                                         num_workers=readers)
    if readers > 1:
        ds = ds.with_feed(SharedStreamFeed(ds, token=token, epoch=epoch, worker=index,
                                           num_workers=readers, connect_timeout=timeout))
    return ds


class Reader:
    """What one reader delivered before its stop point (every item when it had none), and its
    state at that point (through JSON)."""

    def __init__(self) -> None:
        self.items: list = []
        self.state: Optional[dict] = None
        self.error: Optional[BaseException] = None

    @property
    def ids(self) -> list:
        return [i for item in self.items for i in item]


def _read(ds: Any, out: Reader, states: Any, stop: Optional[int]) -> None:
    try:
        if states is not None:
            ds.load_state_dict(states)
        it = iter(ds)
        if stop == 0:
            out.state = it.state_dict()
        for item in it:
            if out.state is None:
                out.items.append(_ids(item))
                if stop is not None and len(out.items) >= stop:
                    out.state = it.state_dict()
        if out.state is None:
            out.state = it.state_dict()
        out.state = json.loads(json.dumps(out.state))
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        out.error = exc


def _run(make: Callable, readers: int, states: Any = None, stops: Optional[list] = None) -> list:
    """One epoch on ``readers`` readers (``make(readers, index, token)``), each from ``states``
    if given, reader ``w`` recording its state after ``stops[w]`` items (None: at the end)."""
    token = secrets.token_hex(8)
    before = set(threading.enumerate())
    out = [Reader() for _ in range(readers)]
    threads = [threading.Thread(target=_read, daemon=True,
                                args=(make(readers, w, token), out[w], states,
                                      None if stops is None else stops[w]))
               for w in range(readers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            pytest.fail(f"a reader of {readers} still runs after {JOIN_S:g} s (a hang)")
    # A reader's iteration ends with its own share; the dealer serves the others to the end of
    # the stream (it drains a FIFO even when every reader was done), as the worker process that
    # holds it would: the next run starts once it is gone, as a restarted job would.
    for thread in set(threading.enumerate()) - before:
        if thread.name == "streamio-dealer":
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                pytest.fail(f"the dealer of {readers} readers still runs after {JOIN_S:g} s")
    for reader in out:
        if reader.error is not None:
            raise reader.error
    return out


def _all_ids(run: list) -> list:
    return [i for reader in run for i in reader.ids]


def _stops(full: list, cuts: list) -> list:
    """Stop points from fractions of each reader's whole share (None: finished)."""
    return [None if c is None else round(c * len(reader.items)) for c, reader in zip(cuts, full)]


def _resume_and_check(make: Callable, n: int, m: int, stops: list, feed: Callable = lambda: None,
                      full: Optional[list] = None) -> tuple:
    """n readers interrupted at ``stops``, resumed on m: every record once over the two runs,
    and (m == n) each resumed reader delivers its uninterrupted remainder exactly."""
    feed()
    part = _run(make, n, stops=stops)
    if full is not None:
        for w in range(n):  # the same records in the same order, run after run
            assert part[w].items == full[w].items[:len(part[w].items)], w
    feed()
    rest = _run(make, m, states=[reader.state for reader in part])
    assert sorted(_all_ids(part) + _all_ids(rest)) == ALL
    if m == n and full is not None:
        for w in range(n):
            assert part[w].items + rest[w].items == full[w].items, w
    return part, rest


cuts = st.lists(st.one_of(st.just(0.0), st.just(None), st.floats(0, 1)), min_size=4,
                max_size=4)


def _source(files: dict, fifo: Any, source: str) -> tuple:
    """``(path, feed)``: the stream's path, and what starts a run of it (a FIFO: a writer process
    of the same bytes, as a restarted job's channel replays them)."""
    if source != "fifo":
        return files[source], lambda: None
    path = str(fifo.tmp_path / "stream")
    if not os.path.exists(path):
        os.mkfifo(path)

    def feed() -> None:
        # A run whose readers had all finished reads nothing (one reader with no feed), and
        # leaves its writer waiting: it goes, as a restarted job's channel would.
        for proc in fifo.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        fifo.start(path, files["file"])

    return path, feed


@settings(max_examples=40, deadline=None, suppress_health_check=_MODULE_FIXTURE)
@given(source=st.sampled_from(["file", "gzip", "fifo"]), chain=st.sampled_from(sorted(CHAINS)),
       n=st.integers(1, 4), m=st.integers(1, 4), batch=st.integers(1, 9),
       buffer=st.integers(1, 300), cuts=cuts)
@example(source="file", chain="decoded", n=3, m=2, batch=7, buffer=100, cuts=[0.3, 0.5, 0.4, None])
@example(source="fifo", chain="records", n=2, m=2, batch=1, buffer=300, cuts=[0.9, 0.0, 1, 1])
@example(source="gzip", chain="batches", n=4, m=1, batch=9, buffer=1, cuts=[None, 0.2, 0.0, 1.0])
@example(source="fifo", chain="decoded", n=1, m=4, batch=3, buffer=50, cuts=[0.5, 0, 0, 0])
@example(source="file", chain="decoded", n=3, m=3, batch=2, buffer=200, cuts=[None, 0.5, None, 0])
@example(source="fifo", chain="batches", n=2, m=2, batch=4, buffer=1, cuts=[None, None, 0, 0])
@example(source="file", chain="records", n=2, m=3, batch=1, buffer=9, cuts=[None, None, 0, 0])
@example(source="fifo", chain="decoded", n=4, m=1, batch=1, buffer=1, cuts=[0.0, 0.0, 0.0, 0.0])
def test_n_readers_resume_on_m_readers_every_record_once(files, fifo, source, chain, n, m,
                                                         batch, buffer, cuts):
    """n readers interrupted at random points (0, mid-share, the last item, finished), resumed
    on m: every record once; on the same layout each reader's uninterrupted remainder exactly;
    the next epoch on the new layout whole."""
    path, feed = _source(files, fifo, source)
    make = lambda r, w, token, epoch=0: _reader(  # noqa: E731
        path, chain, batch, buffer, r, w, token, epoch)
    feed()
    full = _run(make, n)
    assert sorted(_all_ids(full)) == ALL
    _resume_and_check(make, n, m, _stops(full, cuts), feed, full)
    feed()
    nxt = _run(lambda r, w, token: make(r, w, token, epoch=1), m)
    assert sorted(_all_ids(nxt)) == ALL


def _interrupted_twice(files: dict, stops: list) -> tuple:
    """3 readers interrupted, resumed on 2 (once uninterrupted, for the exact checks) and
    interrupted again at ``stops``: ``(make, first, elastic, second)``."""
    make = lambda r, w, token: _reader(files["file"], "decoded", 5, 80, r, w, token)  # noqa
    first = _run(make, 3, stops=[9, 0, 14])
    states = [reader.state for reader in first]
    elastic = _run(make, 2, states=states)
    assert sorted(_all_ids(first) + _all_ids(elastic)) == ALL
    second = _run(make, 2, states=states, stops=stops)
    for w in range(2):
        assert second[w].items == elastic[w].items[:len(second[w].items)]
    return make, first, elastic, second


@pytest.mark.parametrize("stops", [[11, 4], [0, 30], [None, 6]])
def test_an_elastic_epoch_interrupted_again_resumes_on_its_own_layout_exactly(files, stops):
    make, first, elastic, second = _interrupted_twice(files, stops)
    third = _run(make, 2, states=[reader.state for reader in second])
    for w in range(2):
        assert second[w].items + third[w].items == elastic[w].items, w
    assert sorted(_all_ids(first) + _all_ids(second) + _all_ids(third)) == ALL


@pytest.mark.parametrize("m", [4, 1])
def test_an_elastic_epoch_one_reader_of_which_was_done_resumes_on_another_layout(files, m):
    make, first, _, second = _interrupted_twice(files, [None, 6])
    third = _run(make, m, states=[reader.state for reader in second])
    assert sorted(_all_ids(first) + _all_ids(second) + _all_ids(third)) == ALL


@pytest.mark.parametrize("n, first, m2, second, m", [
    (3, [9, 0, 14], 2, [11, 4], 4), (3, [9, 0, 14], 2, [11, 4], 3),
    (3, [9, 0, 14], 2, [11, 4], 1), (1, [30], 2, [11, 4], 3), (2, [10, 20], 3, [5, 6, 7], 2)])
def test_an_elastic_epoch_interrupted_again_resumes_on_another_layout(files, n, first, m2,
                                                                     second, m):
    """n readers (one: unshared) interrupted, resumed on m2 shared readers and interrupted
    again in each of them, resumed on m: every record once over the three runs (each of the m2
    states replays every original reader's share: one share read by several replays, each of
    which gets all of its blocks)."""
    make = lambda r, w, token: _reader(files["file"], "decoded", 5, 80, r, w, token)  # noqa
    one = _run(make, n, stops=first)
    two = _run(make, m2, states=[reader.state for reader in one], stops=second)
    three = _run(make, m, states=[reader.state for reader in two])
    assert sorted(_all_ids(one) + _all_ids(two) + _all_ids(three)) == ALL


@pytest.mark.parametrize("source", ["gzip", "fifo"])
def test_compressed_and_fifo_streams_resume(files, fifo, source):
    """A gzip file, and a FIFO a writer process feeds (a restarted job's writer sends the same
    bytes again); on one reader the resumed reader reads the FIFO itself, with no feed."""
    path, feed = _source(files, fifo, source)
    make = lambda r, w, token: _reader(path, "decoded", 4, 60, r, w, token)  # noqa: E731
    feed()
    full = _run(make, 3)
    assert sorted(_all_ids(full)) == ALL
    for m, stops in ((3, [20, 0, None]), (2, [5, 30, 12]), (1, [None, 17, 3])):
        _resume_and_check(make, 3, m, stops, feed, full)


def _with_a_stuck_reader(path: str) -> tuple:
    """Two readers of one shared stream (connect_timeout 2 s) in threads, not started: reader 1
    takes one item and then waits on ``release`` without closing. ``(threads, release,
    errors, feeds)``: what each reader raised, and its feed."""
    token = secrets.token_hex(8)
    release = threading.Event()
    errors: dict = {}
    feeds: dict = {}

    def read(w: int) -> None:
        ds = _reader(path, "records", 1, 1, 2, w, token, timeout=2.0)
        feeds[w] = ds._feed
        try:
            for k, _ in enumerate(ds):
                if w == 1 and k == 0:
                    release.wait(JOIN_S)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors[w] = exc

    threads = [threading.Thread(target=read, args=(w,), daemon=True) for w in range(2)]
    return threads, release, errors, feeds


def test_a_reader_that_stops_taking_blocks_ends_the_epoch_naming_it(files, monkeypatch):
    """The dealer holds at most BUFFER_BYTES of blocks not yet taken: reader 1 takes one item
    and then nothing (without closing), so reader 0 waits at the bound, and connect_timeout
    later the epoch ends with a SourceError naming reader 1 (not a hang)."""
    monkeypatch.setattr(dealer, "BUFFER_BYTES", 1)
    threads, release, errors, _ = _with_a_stuck_reader(files["file"])
    began = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        threads[0].join(30)
        took = time.monotonic() - began
        assert not threads[0].is_alive(), "reader 0 still waits (a hang)"
    finally:
        release.set()
        threads[1].join(30)
    assert took < 20
    assert isinstance(errors.get(0), SourceError), errors
    message = str(errors[0])
    assert "DataLoader worker 1" in message and "DataLoader worker 0" not in message
    assert "the bound" in message and files["file"] in message
    assert not threads[1].is_alive()
    assert isinstance(errors.get(1), SourceError), errors  # told too, once it reads again


def test_a_slow_reader_makes_the_others_wait_without_failing(files, monkeypatch):
    """At the bound a slow reader holds the others back, but an epoch whose every stall is
    shorter than connect_timeout ends whole, however long it takes in all."""
    monkeypatch.setattr(dealer, "BUFFER_BYTES", 1)
    token = secrets.token_hex(8)
    got: dict = {}

    def read(w: int) -> None:
        ds = _reader(files["file"], "records", 1, 1, 2, w, token, timeout=1.5)
        got[w] = []
        for k, record in enumerate(ds):
            if w == 1 and k % dealer.BLOCK_RECORDS == 0 and k < 5 * dealer.BLOCK_RECORDS:
                time.sleep(0.4)  # 2 s in all, 0.4 s at a time
            got[w] += _ids(record)

    run = [threading.Thread(target=read, args=(w,), daemon=True) for w in range(2)]
    for thread in run:
        thread.start()
    for thread in run:
        thread.join(JOIN_S)
        assert not thread.is_alive()
    assert sorted(got.get(0, []) + got.get(1, [])) == ALL


@pytest.fixture(scope="module")
def interrupted(files):
    """Mid-epoch states of 3 and of 2 readers sharing the file."""
    make = lambda r, w, token: _reader(files["file"], "records", 1, 50, r, w, token)  # noqa
    return {n: [reader.state for reader in _run(make, n, stops=[40, 25, 60][:n])]
            for n in (3, 2)}


def _one(files: dict, readers: int, index: int) -> Any:
    """A reader that refuses its states before it reaches for the dealer (a short timeout
    bounds a test that would wait for the other readers)."""
    return _reader(files["file"], "records", 1, 50, readers, index, secrets.token_hex(8),
                   timeout=3.0)


def _tampered(state: dict, stream: list) -> dict:
    """``state`` claiming another share, sealed again (``check`` recomputed), so the checks
    against the layout are what refuse it (unsealed, ``check`` does)."""
    return seal(dict(json.loads(json.dumps(state)), stream=stream))


def test_states_of_different_reader_counts_are_refused(files, interrupted):
    three, two = interrupted[3], interrupted[2]
    for states in ([three[0], three[1], two[1]], [two[0], three[1]], three[:2]):
        ds = _one(files, 2, 1)
        ds.load_state_dict(states)
        with pytest.raises(UsageError):
            next(iter(ds))


@pytest.mark.parametrize("stream", [[3, 3], [1, 0], [0, 0], [3, -1], "3,0", [3]])
def test_a_tampered_stream_field_is_refused(files, interrupted, stream):
    bad = _tampered(interrupted[3][0], stream)
    with pytest.raises(UsageError):
        _one(files, 3, 0).load_state_dict(bad)
    with pytest.raises(UsageError):
        _one(files, 3, 1).load_state_dict([bad] + interrupted[3][1:])


def test_another_readers_state_is_refused(files, interrupted):
    three = interrupted[3]
    # Reader 1's state given to reader 0, and a state that claims another share than its own.
    for state, index in ((three[1], 0), (_tampered(three[0], [3, 1]), 0),
                         (_tampered(three[2], [3, 0]), 2)):
        with pytest.raises(UsageError):
            _one(files, 3, index).load_state_dict(state)
        with pytest.raises(UsageError):
            next(iter(_one(files, 3, index).iter_from(state)))
    # The list with two readers' shares swapped, given to a reader of the same layout.
    swapped = [_tampered(three[0], [3, 1]), _tampered(three[1], [3, 0]), three[2]]
    ds = _one(files, 3, 1)
    ds.load_state_dict(swapped)
    with pytest.raises(UsageError):
        next(iter(ds))


def test_the_dealers_process_is_not_kept_forever_by_a_reader_that_stops(files):
    """Reader 0 (whose thread runs the dealer) has its whole share while reader 1 takes one
    item and then nothing, without closing: the dealer keeps serving it, but connect_timeout
    after the last block went out it gives up with a SourceError naming reader 1, and its
    thread ends (a process waiting for it to exit is not held forever)."""
    from streamio.sharing.stream import SharedStreamFeed

    threads, release, errors, feeds = _with_a_stuck_reader(files["file"])
    before = {t.ident for t in threading.enumerate()}
    for thread in threads:
        thread.start()
    try:
        threads[0].join(30)
        assert not threads[0].is_alive() and 0 not in errors, errors  # its share, whole
        assert isinstance(feeds[0], SharedStreamFeed)
        dealers = [t for t in threading.enumerate()
                   if t.name == "streamio-dealer" and t.ident not in before]
        began = time.monotonic()
        for t in dealers:
            t.join(30)
        assert dealers and not any(t.is_alive() for t in dealers)
        assert time.monotonic() - began < 20
    finally:
        release.set()
        threads[1].join(30)
    assert isinstance(errors.get(1), SourceError), errors
    assert "DataLoader worker 1" in str(errors[1]) and "connect_timeout" in str(errors[1])

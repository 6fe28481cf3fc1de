"""Elastic resume (issue #25) given lists of states that are wrong in ways
tests/pipeline/test_elastic.py (the randomised runs, missing and repeated shards) does not
cover: fields edited, a finished shard's state from another pipeline, another data set, a
pipeline given another seed, things that are not states. Each is a streamio error naming what is
wrong, never records lost or repeated in silence.
"""

from __future__ import annotations

import copy
import json

import pytest

import streamio
from streamio.errors import StreamioError, UsageError
from streamio.pipeline.resume import seal

from support.examples import ID_X, write_id_parts

FILE_SIZES = [37, 50, 13, 41, 29, 30]  # uneven: shard 2 of 4 (13 records) finishes first


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic-states")
    (root / "parts").mkdir()
    return {"files": write_id_parts(str(root / "parts"), FILE_SIZES),
            "other": write_id_parts(str(root), FILE_SIZES, first=10_000)}


def _pipeline(paths: list, shards: int, index: int, seed: int = 11) -> streamio.Dataset:
    ds = streamio.Dataset(paths, "tfrecord", decoder=ID_X)
    return ds.shuffle(64, seed=seed).batch(8).prefetch(2).with_context(epoch=0).shard(shards,
                                                                                      index)


def _interrupt(make, shards: int, takes: list) -> list:
    """Each of ``shards`` shards (``make(shards, i)``) takes ``takes[i]`` batches (or all it
    has): their states, through JSON."""
    states = []
    for i in range(shards):
        it = iter(make(shards, i))
        for _ in range(takes[i]):
            if next(it, None) is None:
                break
        states.append(json.loads(json.dumps(it.state_dict())))
        it.close()
    return states


def _finish(make, shards: int, states: list) -> list:
    return [i for j in range(shards) for batch in make(shards, j).iter_from(states)
            for i in batch["id"].tolist()]


@pytest.fixture(scope="module")
def four(sources):
    """The states of 4 shards after 2, 1, 3 (all it has: it finished) and 0 batches."""
    states = _interrupt(lambda n, i: _pipeline(sources["files"], n, i), 4, [2, 1, 3, 0])
    assert [s["finished"] for s in states] == [False, False, True, False]
    return states


def _edited(states: list, k: int, **fields) -> list:
    """State ``k`` with other fields, sealed again (``check`` recomputed): as a state taken from
    another pipeline or layout would be, so the checks behind ``check`` are what refuses it
    (an edit left unsealed is refused by ``check``: tests/pipeline/test_resume_state.py)."""
    out = copy.deepcopy(states)
    out[k] = seal({**out[k], **fields})
    return out


@pytest.mark.parametrize("case, match", [
    ("chain", "different pipeline"),
    ("finished-chain", "different pipeline"),
    ("swapped", "different pipeline"),
    ("beyond", "'delivered' is 1000000"),
])
def test_a_wrong_list_of_states_is_refused(sources, four, case, match):
    states = {"chain": _edited(four, 1, chain="0" * 32),
              # shard 2 (13 records: 2 batches) had finished: its state is checked all the same
              "finished-chain": _edited(four, 2, chain="0" * 32),
              # two shards' places swapped: each count would skip the other shard's records
              "swapped": _edited(_edited(four, 1, shards=four[2]["shards"]), 2,
                                 shards=four[1]["shards"]),
              "beyond": _edited(four, 1, delivered=10 ** 6)}[case]
    with pytest.raises(UsageError, match=match):
        _finish(lambda n, i: _pipeline(sources["files"], n, i), 3, states)


@pytest.mark.parametrize("bad", [None, 3, "state"])
def test_a_list_holding_something_else_than_states_is_refused(sources, four, bad):
    ds = _pipeline(sources["files"], 3, 0)
    with pytest.raises(StreamioError, match="resume state is a dict"):
        ds.iter_from([bad] + four[1:])
    with pytest.raises(StreamioError, match="resume state is a dict"):
        ds.load_state_dict(four[:2] + [bad] + four[3:])


def test_states_of_another_data_set_are_refused(sources, four):
    with pytest.raises(UsageError, match="different pipeline"):
        _finish(lambda n, i: _pipeline(sources["other"], n, i), 3, four)


def test_an_elastic_resume_refuses_a_pipeline_given_another_seed(sources, four):
    """As the same-layout resume does: a job restarted with shuffle(seed=12) is told the states
    are another pipeline's (seed 11), rather than finishing the epoch in seed 11's order and
    going on with seed 12 without a word."""
    def other_seed(n, i):
        return _pipeline(sources["files"], n, i, seed=12)

    with pytest.raises(UsageError, match="seed"):
        other_seed(4, 1).iter_from(four[1])  # the same layout refuses it
    with pytest.raises(UsageError, match="seed"):
        _finish(other_seed, 3, four)  # and so must another layout

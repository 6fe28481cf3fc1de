"""A resume state is input: every field of a valid state, mutated (other types, other values,
removed, an unknown one added), gives a UsageError naming that field, or resumes exactly the
epoch the state names; never a foreign exception, never a silently different epoch."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamio
from streamio import Dataset, Example, FixedLen
from streamio.errors import UsageError

N_RECORDS = 61
FIELDS = ("streamio_resume", "epoch", "delivered", "finished", "seeds", "chain", "check")


def _tag(record, rng):
    """A seeded map: the record with a draw from its own generator."""
    return record + b"|%d" % rng.integers(1000)


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("resume") / "data.tfrecord")
    records = [streamio.encode_example({"x": i}) for i in range(N_RECORDS)]
    streamio.write_records(path, "tfrecord", records)
    example = Example({"x": FixedLen([], "int64")})
    return {
        # drawn seeds (seed=None): the state's seeds are the epoch's
        "drawn": Dataset(path, "tfrecord").map(_tag, seed=5).shuffle(16).batch(4),
        # explicit seeds, a decoder and a batch shuffle: batches skipped undecoded ("lazy")
        "explicit": Dataset(path, "tfrecord", decoder=example).shuffle(16, seed=3).batch(4)
                                                              .shuffle_batches(3, seed=9),
    }


def _normal(item):
    if isinstance(item, dict):
        return {k: np.asarray(v).tolist() for k, v in item.items()}
    return item


_epochs: dict = {}


def _epoch(name, ds, epoch):
    key = (name, epoch)
    if key not in _epochs:
        _epochs[key] = [_normal(x) for x in ds.with_context(epoch=epoch)]
    return _epochs[key]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


@st.composite
def mutations(draw, state):
    field = draw(st.sampled_from(FIELDS + ("extra",)))
    mutated = json.loads(json.dumps(state))
    action = draw(st.sampled_from(["delete", "replace", "nudge"]))
    if field == "extra" or action == "replace":
        mutated[field] = draw(json_values)
    elif action == "delete":
        mutated.pop(field)
    elif field in ("epoch", "delivered", "streamio_resume"):
        mutated[field] += draw(st.sampled_from([-1, 1, 2 ** 63, 10 ** 30, -(2 ** 64)]))
    elif field == "finished":
        mutated[field] = draw(st.sampled_from([not state["finished"], 0, 1, "no", None]))
    elif field == "seeds":
        seeds = mutated["seeds"]
        i = draw(st.integers(0, len(seeds) - 1))
        seeds[i] = draw(st.sampled_from([None, 0, 7, -1, "x", 2 ** 70, True, 1.5])
                        if seeds[i] is None else
                        st.sampled_from([seeds[i] + 1, seeds[i] - 1, None, "x", -1, True]))
    else:  # chain, check: another digest, or a near miss
        mutated[field] = draw(st.sampled_from([mutated[field][::-1], "0" * 32,
                                               mutated[field][:31], mutated[field].upper()]))
    return field, mutated


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(["drawn", "explicit"]),
       epoch=st.integers(0, 3), taken=st.integers(0, 16))
def test_every_mutated_field_is_named_or_resumes_the_epoch_it_names(pipelines, data, name,
                                                                    epoch, taken):
    ds = pipelines[name]
    it = iter(ds.with_context(epoch=epoch))
    for _ in range(taken):
        next(it)
    state = it.state_dict()
    it.close()
    field, mutated = data.draw(mutations(state))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = [_normal(x) for x in ds.iter_from(mutated)]
    except UsageError as exc:
        wanted = {"extra": "extra"}.get(field, field)
        assert repr(wanted) in str(exc) or f"{wanted}" in str(exc), (field, mutated, exc)
        return
    # Accepted: exactly the rest of the epoch the state names, from the item it names.
    unchanged = json.dumps(mutated, sort_keys=True) == json.dumps(state, sort_keys=True)
    assert field in ("epoch", "delivered", "finished", "check") or unchanged, (field, mutated)
    if mutated["finished"]:
        assert got == []
    else:
        full = _epoch(name, ds, mutated["epoch"])
        assert mutated["delivered"] <= len(full)
        assert got == full[mutated["delivered"]:]


def test_the_issues_examples(pipelines):
    ds = pipelines["drawn"]
    it = iter(ds)
    next(it)
    state = it.state_dict()
    it.close()
    for field, value, message in [("finished", "no", "'finished'"),
                                  ("delivered", 10 ** 30, "'delivered'"),
                                  ("seeds", [None, "x", None], "'seeds'"),
                                  ("seeds", [state["seeds"][0] + 1] + state["seeds"][1:],
                                   "'seeds'")]:
        with pytest.raises(UsageError, match=message):
            list(ds.iter_from({**state, field: value}))
    # A count in range but past the end of the epoch: an error when the replay gets there.
    with pytest.raises(UsageError, match="'delivered' is 100000, but the epoch holds only 16"):
        list(ds.iter_from({**state, "delivered": 100_000}))
    explicit = pipelines["explicit"]
    it = iter(explicit)
    state = it.state_dict()
    it.close()
    with pytest.raises(UsageError, match=r"'seeds'\[0\] is 4, but .shuffle\(16, seed=3\)"):
        list(explicit.iter_from({**state, "seeds": [4, None, 9]}))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(
    st.text(max_size=200), json_values.map(json.dumps),
    st.builds(lambda epoch, inner: json.dumps({"epoch": epoch, "iterator": inner}),
              st.one_of(st.integers(0, 3), json_values), json_values)))
def test_torch_state_text_is_parsed_as_data(pipelines, text):
    """StreamDataset.load_state_dict parses a JSON text (a checkpoint): any text gives a
    UsageError or a resume, never another exception."""
    pytest.importorskip("torch")
    sd = pipelines["drawn"].to_torch()
    try:
        sd.load_state_dict({"streamio_torch": 1, "resume": text})
        next(iter(sd), None)
    except UsageError:
        pass

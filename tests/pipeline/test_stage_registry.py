"""A stage is one object: adding one is adding a class (plus the line that appends it).

The toy stages here live in this test module, outside the pipeline: the epoch, repr and resume
must take them without any edit to ``pipeline/`` (nothing matches a stage by its name or its
module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pytest

import streamio
from streamio.errors import UsageError, UsageTypeError
from streamio.pipeline import Stage
from streamio.pipeline.stages import Skip, close_blocks

N = 600


@dataclass(frozen=True)
class EveryOther(Stage):
    """Keeps the items at even positions of the epoch: deterministic, order-preserving."""

    phase: int

    resume_order = "preserve"
    reads_values = False

    def call(self) -> str:
        return f".every_other({self.phase})"

    def apply(self, blocks: Iterator[tuple], run: Any, position: int) -> Iterator[tuple]:
        def kept() -> Iterator[tuple]:
            seen = 0
            try:
                for items, ids in blocks:
                    start = (self.phase - seen) % 2
                    seen += len(items)
                    yield items[start::2], (None if ids is None else ids[start::2])
            finally:
                close_blocks(blocks)

        return kept()


@dataclass(frozen=True)
class RenamedSkip(Skip):
    """A built-in stage under another name and module: resume must not notice."""


class CountingDecoder:
    def __init__(self) -> None:
        self.records = 0

    def decode_batch(self, records, *, source=None, first_index=0):
        self.records += len(records)
        return {"x": np.array([int(r) for r in records], dtype=np.int64)}

    def output_spec(self):
        return None


@pytest.fixture
def lines(tmp_path):
    path = tmp_path / "n.lines"
    path.write_text("".join(f"{i}\n" for i in range(N)))
    return str(path)


def _rows(items) -> list:
    return [int(v) for item in items for v in np.atleast_1d(item["x"])]


def test_a_new_stage_runs_describes_itself_and_resumes(lines):
    ds = (streamio.Dataset(lines, "lines").with_context(epoch=0).shuffle(64, seed=3)
          .with_stage(EveryOther(1)).batch(7))
    assert repr(ds).endswith(".shuffle(64, seed=3).every_other(1).batch(7)")
    full = [list(map(bytes, b)) for b in ds]
    assert sum(map(len, full)) == N // 2
    it = iter(ds)
    head = [list(map(bytes, next(it))) for _ in range(11)]
    state = it.state_dict()
    rest = [list(map(bytes, b)) for b in ds.iter_from(state)]
    assert head + rest == full


def test_a_new_stage_after_batch_resumes_exactly_with_a_decoder(lines):
    ds = (streamio.Dataset(lines, "lines", decoder=CountingDecoder()).with_context(epoch=0)
          .batch(5)
          .shuffle_batches(8, seed=2).with_stage(EveryOther(0)))
    full = _rows(ds)
    it = iter(ds)
    head = _rows(next(it) for _ in range(9))
    rest = _rows(ds.iter_from(it.state_dict()))
    assert head + rest == full and len(full) == N // 2


def test_resume_asks_the_stage_not_its_name(lines):
    """A skip under another class name and module keeps the fast-forward that decodes none of
    the batches the consumer already has."""
    decoder = CountingDecoder()
    ds = (streamio.Dataset(lines, "lines", decoder=decoder).with_context(epoch=0).batch(10)
          .shuffle_batches(4, seed=1)
          .with_stage(RenamedSkip(3)))
    assert ".skip(3)" in repr(ds)
    full = _rows(ds)
    it = iter(ds)
    head = _rows(next(it) for _ in range(20))
    state = it.state_dict()
    decoder.records = 0
    rest = _rows(ds.iter_from(state))
    assert head + rest == full
    # None of the 20 batches the consumer already had is decoded again (the 3 batches the skip
    # drops are decoded, as in the uninterrupted epoch); a fast-forward that did not know the
    # stage would decode all 23.
    assert decoder.records == len(rest) + 3 * 10


def test_a_stage_that_does_not_say_its_order_cannot_resume(lines):
    @dataclass(frozen=True)
    class Opaque(EveryOther):
        resume_order = None

    ds = streamio.Dataset(lines, "lines").with_stage(Opaque(0))
    it = iter(ds)
    next(it)
    with pytest.raises(UsageError, match=r"cannot resume mid-epoch through \.every_other\(0\)"):
        it.state_dict()


def test_with_stage_takes_stages_only(lines):
    with pytest.raises(UsageTypeError, match="Stage"):
        streamio.Dataset(lines, "lines").with_stage(lambda blocks: blocks)

"""DataLoader workers hand fixed-dtype batches to the main process through a ring of
shared-memory slots per worker: only a descriptor crosses the pipe, a slot is reused only once
the main process has released every tensor over it, and the ring is a segment no other user can
open.

The DataLoader scenarios run in a fresh interpreter (tests/scripts/): this pytest process may
have imported TensorFlow, and forking workers from it can deadlock.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.multiprocessing  # noqa: E402,F401,F811 - registers torch's tensor reducers

from streamio.adapters import _torch_slots as slots  # noqa: E402
from streamio.errors import StreamioError  # noqa: E402

from conftest import SCRIPTS  # noqa: E402

SUBPROCESS_TIMEOUT = 240


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slots")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "torch_slots_check.py"), str(workdir)],
                          capture_output=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", ["released", "held", "released_again"])
def test_every_record_once_and_equal_to_the_in_process_batches(report, case):
    """int64/float32/int16/bool/empty columns over slots, a list of bytes beside them; the main
    process writes into its tensors (released) or keeps every batch of the epoch (held: the
    workers must not reuse a held slot, so the batches past the ring go the older way)."""
    result = report[case]
    assert result["ids"] == list(range(report["records"]))
    assert result["same_rows"]


def test_batches_cross_over_slots_and_rings_are_mapped_once_per_worker(report):
    assert report["released"]["rebuilt_over_slots"] == report["batches"]
    # Held batches keep their slots: each worker's ring serves its first SLOTS batches.
    assert report["held"]["rebuilt_over_slots"] == 2 * report["slots"]
    # Released again, the same two rings (persistent workers) serve every batch.
    assert report["released_again"]["rebuilt_over_slots"] == report["batches"]
    assert report["released_again"]["rings"] == 2


def test_rings_are_private_segments_with_no_name_left(report):
    assert len(report["mappings"]) == 2
    for mode, name in report["mappings"]:
        assert mode == "0o600"
        assert name.endswith("(deleted)") or name.startswith("/memfd:"), name


def test_a_descriptor_for_a_ring_never_mapped_is_a_streamio_error():
    """A batch pickled in a worker but unpickled elsewhere names a ring this process never
    received: a clear error, not a crash or someone else's memory."""
    layout = [("x", "<f4", (2,), 0, 8)]
    data = pickle.dumps((slots._rebuild_from_slot,
                         ("0123456789abcdef", 1, None, 0, 4096, 8, layout, {})))
    with pytest.raises(StreamioError, match="never mapped"):
        pickle.loads(data)[0](*pickle.loads(data)[1])


def test_a_descriptor_that_does_not_fit_its_ring_is_a_streamio_error():
    """Offsets, sizes and shapes come from the worker: one that reaches outside its slot (a
    bug, or bytes forged into the pipe) is a clear error, never memory beside the slot."""
    ring = torch.zeros(slots._HEADER + 64, dtype=torch.uint8)
    token = "fit-check-" + os.urandom(4).hex()
    slots._map_ring(token, os.getpid(), ring)
    good = slots._rebuild_from_slot(token, os.getpid(), None, 0, slots._HEADER, 64,
                                    [("x", "<f4", (4,), 16, 16)], {})
    assert good["x"].shape == (4,)
    del good
    for slot, start, size, layout in [
            (0, slots._HEADER, 64, [("x", "<f4", (4,), 56, 16)]),   # past the slot's end
            (0, slots._HEADER, 64, [("x", "<f4", (32,), 0, 128)]),  # a shape larger than it
            (0, slots._HEADER + 32, 64, [("x", "<f4", (2,), 0, 8)]),  # a slot past the ring
            (0, 16, 64, [("x", "<f4", (2,), 0, 8)]),                 # inside the header
            (-1, slots._HEADER, 64, [("x", "<f4", (2,), 0, 8)])]:    # no such slot
        with pytest.raises(StreamioError, match="does not fit"):
            slots._rebuild_from_slot(token, os.getpid(), None, slot, start, size, layout, {})


def test_outside_a_worker_a_batch_pickles_without_a_ring():
    from multiprocessing.reduction import ForkingPickler

    batch = {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    out = pickle.loads(bytes(ForkingPickler.dumps(slots._SlotBatch(batch))))
    assert type(out) is dict and torch.equal(out["x"], batch["x"])
    assert slots._ring is None


# -- one worker's ring and the main process's side, in this process ----------------------------------
@pytest.fixture
def in_worker(monkeypatch):
    """This process as a DataLoader worker that is also its own main process: a batch's
    descriptor is rebuilt here, over the same ring."""
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    monkeypatch.setattr(slots, "_ring", None)
    monkeypatch.setattr(slots, "_mapped", {})


def _cross(batch):
    """``(how it was rebuilt, the batch the main process gets)``."""
    fn, args = slots._SlotBatch(batch).__reduce__()
    return fn, fn(*args)


def _equal(got, batch):
    assert type(got) is dict and list(got) == list(batch)
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            assert torch.equal(got[name], value.detach()), name
        else:
            assert got[name] == value, name


def test_batches_whose_shapes_and_dtypes_change_each_arrive_as_they_were(in_worker):
    """A worker keeps each batch layout it has seen: the last, shorter batch of a share, a
    column whose dtype or width changes, and the first layout again all arrive exactly."""
    def batch(rows, width, dtype):
        return {"x": torch.arange(rows * width, dtype=dtype).reshape(rows, width),
                "y": torch.arange(rows, dtype=torch.int64) * 3, "names": [b"r"] * rows}
    held = []
    for rows, width, dtype in [(8, 4, torch.float32), (8, 4, torch.float32), (5, 4, torch.float32),
                               (8, 6, torch.float32), (8, 4, torch.int16), (8, 4, torch.float32),
                               (0, 4, torch.float32)]:
        sent = batch(rows, width, dtype)
        fn, got = _cross(sent)
        assert (fn is slots._rebuild_from_slot) == (rows > 0)  # no bytes: nothing to slot
        _equal(got, sent)
        held.append((sent, got))
    for sent, got in held:  # nothing overwrote a slot still held
        _equal(got, sent)


def test_a_slot_is_reused_only_after_the_last_tensor_over_it_is_released(in_worker):
    sent = {"x": torch.ones(4, 3), "y": torch.zeros(4, dtype=torch.int64)}
    _, got = _cross(sent)
    ring = slots._ring
    assert list(ring.array[:ring.slots]).count(1) == 1
    x = got["x"]
    del got
    assert list(ring.array[:ring.slots]).count(1) == 1  # x still views the slot
    x.add_(1)
    del x
    assert list(ring.array[:ring.slots]).count(1) == 0
    for _ in range(3 * ring.slots):  # released each time: the ring never runs out
        fn, got = _cross(sent)
        assert fn is slots._rebuild_from_slot
        _equal(got, sent)
        del got


def test_a_tensor_with_no_numpy_view_goes_the_older_way_and_holds_no_slot(in_worker):
    """A layout already seen, now with a tensor that requires grad (a collate_fn's doing): the
    batch goes through the pipe and the slot it had taken is free again."""
    sent = {"x": torch.ones(4, 3)}
    _, got = _cross(sent)
    del got
    ring = slots._ring
    fn, got = _cross({"x": torch.ones(4, 3, requires_grad=True)})
    assert fn is not slots._rebuild_from_slot
    assert torch.equal(got["x"].detach(), torch.ones(4, 3))
    assert list(ring.array[:ring.slots]).count(1) == 0

"""The fuzz harness (tests/fuzz/) stays whole: every kernel has a target, and the targets run.

The sanitizer campaign itself needs clang and atheris (``python tests/fuzz/run.py``, and a short
smoke of it in .ci/run); these tests run the same targets as plain functions on the normal build,
so a kernel added without a target, or a target whose comparison broke, fails the normal run.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

speedups = pytest.importorskip(
    "streamio._speedups", reason="C accelerator not built (python setup.py build_ext --inplace)")

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

import make_corpus  # noqa: E402
import targets  # noqa: E402


def _build_script():
    # loaded from its path: "build" is also the name of a PyPA package
    import importlib.util

    spec = importlib.util.spec_from_file_location("streamio_fuzz_build", FUZZ / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_kernel_has_a_fuzz_target():
    assert targets.public_kernels(speedups), "the extension exposes no kernel?"
    assert targets.uncovered_kernels(speedups) == [], (
        "add a Target for these kernels to tests/fuzz/targets.py (and seeds to make_corpus.py)")
    for target in targets.TARGETS.values():
        assert target.available(speedups), f"{target.name}: no {target.kernels[0]} in the build"
        assert make_corpus.seeds_for(target.name), f"{target.name} has no seeds"


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_target_agrees_on_its_seeds_and_on_random_bytes(name):
    """C and Python agree on the seeds (valid and mutated streams from streamio's writers) and
    on random bytes, through the same code the fuzzer runs."""
    run = targets.TARGETS[name].one_input(speedups)
    for seed in make_corpus.seeds_for(name):
        run(seed)
    rng = random.Random(name)
    for _ in range(200):
        run(rng.randbytes(rng.randrange(64)))


def test_a_kernel_that_disagrees_is_caught():
    """The comparison can fail: a scan kernel that stops one frame early, a CSV kernel that
    rounds differently, a shuffle kernel that forgets one exchange, a resize one bit off."""
    import numpy as np

    def short_scan(buf, pos, end, verify, limit, out):
        got = speedups.scan_tfrecords(buf, pos, end, verify, limit, out)
        if out:
            out.pop()
        return got

    def rounding_csv(*args):
        table = speedups.parse_csv_floats(*args)
        return table if table is None or not table.size else np.nextafter(table, np.inf)

    def lazy_shuffle(buf, slots, new, out):
        speedups.shuffle_exchange_int64(buf, slots[:-1], new[:-1], out[:-1])

    def off_by_one_resample(src, out, *args):
        speedups.resample(src, out, *args)
        out.flat[-1] ^= 1

    seeds = {"scan_tfrecords": short_scan, "parse_csv_floats": rounding_csv,
             "shuffle_exchange_int64": lazy_shuffle, "resample": off_by_one_resample}
    for name, broken in seeds.items():
        ck = SimpleNamespace(**{name: broken})
        with pytest.raises(targets.Mismatch):
            for seed in make_corpus.seeds_for(name):
                targets.TARGETS[name].run(ck, seed)


def test_the_sanitizer_build_reads_the_extensions_from_setup_py():
    exts = _build_script().extensions_from_setup_py()
    assert "streamio._speedups" in [ext.name for ext in exts]
    root = FUZZ.parents[1]
    for ext in exts:
        assert ext.sources and all((root / src).exists() for src in ext.sources)

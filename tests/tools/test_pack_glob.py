"""``streamio pack`` prints a reading command whose glob matches exactly the shards it wrote: one
shard (the old glob ``t-00000.tfrecord*.tfrecord`` matched nothing), several, and not a stray
shard of an earlier, larger run."""

from __future__ import annotations

import fnmatch
import subprocess
import sys

import pytest

from streamio import Dataset, Example, FixedLen, ImageRecord
from streamio.tools.pack import exact_globs

PIL = pytest.importorskip("PIL.Image")


def _tree(root, files: int) -> None:
    for i in range(files):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        PIL.new("RGB", (16, 16), (i, 0, 0)).save(folder / f"{i}.png")


@pytest.mark.parametrize("files,shard_size,fmt", [(6, "64MB", "tfrecord"), (24, "600B", "tfrecord"),
                                                  (5, "400B", "recordio")])
def test_the_printed_dataset_reads_exactly_the_shards_written(tmp_path, files, shard_size, fmt):
    _tree(tmp_path / "tree", files)
    out = tmp_path / "out"
    out.mkdir()
    suffix = ".tfrecord" if fmt == "tfrecord" else ".rec"
    # (A stray shard under the prefix before packing is refused: test_pack_hostile.py.)
    proc = subprocess.run([sys.executable, "-m", "streamio", "pack", str(tmp_path / "tree"),
                           str(out / "t"), "--shard-size", shard_size, "--format", fmt],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    written = sorted(str(p) for p in out.glob(f"t-000[0-8]*{suffix}"))
    assert (len(written) == 1) == (shard_size == "64MB") and len(written) < 9
    # What a rerun with fewer files leaves: the next number, not written by this run.
    (out / f"t-{len(written):05d}{suffix}").write_bytes(b"a stray shard of an earlier run")
    line = proc.stdout.split("read them with: ")[1].strip()
    ds = eval(line, {"Dataset": Dataset, "Example": Example, "FixedLen": FixedLen,
                     "ImageRecord": ImageRecord})
    assert sorted(ds.sources) == written
    assert sum(1 for _ in Dataset(list(ds.sources), fmt)) == files


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 12, 99, 100, 101, 1234])
def test_exact_globs_match_the_run_and_nothing_else(n):
    names = [f"d/t-{i:05d}.tfrecord" for i in range(n)]
    patterns = exact_globs(names)
    assert len(patterns) <= 5
    candidates = [f"d/t-{i:05d}.tfrecord" for i in range(n + 200)] + [
        f"d/t-{i:05d}.tfrecord.index" for i in range(3)]
    matched = [c for c in candidates if any(fnmatch.fnmatchcase(c, p) for p in patterns)]
    assert matched == names

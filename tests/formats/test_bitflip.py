"""One flipped bit costs one record (issue #10, finding 6), measured by benchmarks/bitflip.py.

TFRecord's length CRC catches a damaged length; RecordIO has none, so its framer takes a frame
only when the next frame's magic follows it, and looks for the records a damaged length would
have swallowed. Trials flip bits in frame headers (where the damage to framing is) and anywhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bitflip", Path(__file__).resolve().parents[2] / "benchmarks" / "bitflip.py")
bitflip = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bitflip)


@pytest.mark.parametrize("headers_only", [True, False], ids=["header-bits", "any-bit"])
def test_one_flipped_bit_loses_at_most_what_the_format_allows(headers_only):
    results = bitflip.run(50, seed=1, headers_only=headers_only)
    assert max(results["tfrecord"]) == 1 if headers_only else max(results["tfrecord"]) <= 1
    for fmt in ("recordio-dmlc", "recordio-concat"):
        assert max(results[fmt]) <= 2, (fmt, results[fmt])


def test_bitflip_script_prints_losses_per_format(capsys):
    assert bitflip.main(["--trials", "3"]) == 0
    printed = capsys.readouterr().out
    assert all(fmt in printed for fmt in bitflip.FORMATS) and "p99" in printed

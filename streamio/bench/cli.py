"""``streamio bench``: the command line, and dispatch to the separate benchmarks
(images, ranges, resume, ray), each a module of this package."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from .config import (BenchConfig, DEFAULT_ADAPTER_RECORDS, DEFAULT_BATCH_SIZE, DEFAULT_CSV_ROWS,
                     DEFAULT_EXAMPLES, DEFAULT_LARGE_RECORDS, DEFAULT_PANDAS_CHUNKSIZE,
                     DEFAULT_PEER_TIMEOUT, DEFAULT_PIPELINE_RECORDS, DEFAULT_RECORDIO_ROWS,
                     DEFAULT_ROUNDS, DEFAULT_SHUFFLE_BUFFER, WORKLOADS)
from .report import format_table
from .run import run_benchmark


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamio bench",
        description="Benchmark streamio against tf.data, the tfrecord package, pandas and raw"
                    " read() on the same bytes streamed through named pipes.")
    p.add_argument("--rounds", type=_positive, default=DEFAULT_ROUNDS,
                   help=f"rounds per case; medians are reported (default {DEFAULT_ROUNDS})")
    p.add_argument("--pipeline-records", type=_positive, default=DEFAULT_PIPELINE_RECORDS,
                   help=f"tf.train.Example records of the pipeline case (default {DEFAULT_PIPELINE_RECORDS})")
    p.add_argument("--adapter-records", type=_positive, default=DEFAULT_ADAPTER_RECORDS,
                   help="tf.train.Example records of the adapters case"
                        f" (default {DEFAULT_ADAPTER_RECORDS})")
    p.add_argument("--examples", type=_positive, default=DEFAULT_EXAMPLES,
                   help=f"tf.train.Example records (default {DEFAULT_EXAMPLES})")
    p.add_argument("--large-records", type=_positive, default=DEFAULT_LARGE_RECORDS,
                   help=f"100 KB TFRecords (default {DEFAULT_LARGE_RECORDS})")
    p.add_argument("--csv-rows", type=_positive, default=DEFAULT_CSV_ROWS,
                   help=f"CSV rows of 17 columns (default {DEFAULT_CSV_ROWS})")
    p.add_argument("--recordio-rows", type=_positive, default=DEFAULT_RECORDIO_ROWS,
                   help=f"RecordIO-protobuf rows of 128 floats (default {DEFAULT_RECORDIO_ROWS})")
    p.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--shuffle-buffer", type=_positive, default=DEFAULT_SHUFFLE_BUFFER)
    p.add_argument("--pandas-chunksize", type=_positive, default=DEFAULT_PANDAS_CHUNKSIZE)
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}; or 'images', 'ranges', 'resume' or 'cache' alone for"
                        " those benchmarks (their options: --workloads NAME --help)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every workload size (0.1 for a quick smoke run)")
    p.add_argument("--no-peers", action="store_true", help="run only the streamio side")
    p.add_argument("--peer-timeout", type=float, default=DEFAULT_PEER_TIMEOUT,
                   help="seconds one peer measurement may take")
    p.add_argument("--tmpdir", help="where to write the workloads (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


#: Workloads with options of their own, run alone: ``--workloads
#: images|ranges|resume|elastic|cache|mix|torch-workers --help`` (and ``ray``: streamio on Ray Data, in a
#: private network namespace).
SEPARATE_WORKLOADS = ("images", "ranges", "resume", "ray", "elastic", "cache", "mix",
                      "torch-workers")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark from command-line arguments; print the table; 0 on success."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        name = (arg.split("=", 1)[1] if arg.startswith("--workloads=")
                else argv[i + 1] if arg == "--workloads" and i + 1 < len(argv) else None)
        if name in SEPARATE_WORKLOADS:
            # These benchmarks have options of their own: each is its own module.
            import importlib

            module = importlib.import_module(f"streamio.bench.{name.replace('-', '_')}")
            return module.main(argv[:i] + argv[i + (1 if "=" in arg else 2):])
    args = build_parser().parse_args(argv)
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        build_parser().error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.scale <= 0:
        build_parser().error("--scale must be positive")

    def scaled(n: int) -> int:
        return max(1, int(n * args.scale))

    cfg = BenchConfig(rounds=args.rounds, examples=scaled(args.examples),
                      pipeline_records=scaled(args.pipeline_records),
                      adapter_records=scaled(args.adapter_records),
                      large_records=scaled(args.large_records), csv_rows=scaled(args.csv_rows),
                      recordio_rows=scaled(args.recordio_rows), batch_size=args.batch_size,
                      shuffle_buffer=args.shuffle_buffer, pandas_chunksize=args.pandas_chunksize,
                      workloads=workloads, peers=not args.no_peers, tmpdir=args.tmpdir,
                      keep=args.keep, json_path=args.json_path, peer_timeout=args.peer_timeout,
                      verbose=not args.quiet)
    report = run_benchmark(cfg)
    print(format_table(report))
    if cfg.json_path:
        with open(cfg.json_path, "w") as f:
            json.dump(report, f, indent=2, default=str)
            f.write("\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Run the image benchmark (issue 11): ``python benchmarks/images.py --help``.

A thin wrapper: the benchmark lives in :mod:`streamio.bench.images` so that ``streamio bench
--workloads images`` runs the same code.
"""

import sys

from streamio.bench.images import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

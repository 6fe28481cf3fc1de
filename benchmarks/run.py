"""Run the streamio benchmark: ``python benchmarks/run.py --help``.

A thin wrapper: the benchmark lives in :mod:`streamio.bench` so that ``streamio bench`` runs the
same code.
"""

import sys

from streamio.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

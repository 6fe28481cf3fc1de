"""A thin wrapper: ``streamio bench --workloads ranges`` runs the same code
(:mod:`streamio.bench.ranges`)."""

import sys

from streamio.bench.ranges import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A thin wrapper: ``streamio bench --workloads resume`` runs the same code
(:mod:`streamio.bench.resume`)."""

import sys

from streamio.bench.resume import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

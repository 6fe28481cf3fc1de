#!/usr/bin/env bash
# The multi-host harness's link-rate measurement (docs/multihost.md, "The link is the limit"):
# a storage host in its own network namespace serves a 200 MB TFRecord object over HTTP and S3
# (moto) through a veth shaped with `tc qdisc ... tbf rate 400mbit`; a compute host reads it
# with curl and with streamio, alternating, ROUNDS rounds; prints the medians.
#
# usage: benchmarks/multihost.sh [ROUNDS]     (default 5; needs root: unshare, ip, tc)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
PYTHON=${PYTHON:-python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! unshare --net --mount --pid --fork --kill-child --mount-proc \
        "$PYTHON" tests/multihost/driver.py link_rate "$WORK" --rounds "$ROUNDS" \
        > "$WORK/out.json" 2> "$WORK/driver.log"; then
    tail -n 40 "$WORK/driver.log" >&2
    exit 1
fi
if grep -q driver_error "$WORK/out.json"; then
    cat "$WORK/out.json" >&2
    exit 1
fi
"$PYTHON" tests/multihost/scenarios_link.py table "$WORK/out.json"

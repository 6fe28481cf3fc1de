#!/usr/bin/env bash
# The device check (docs/images.md, "The device check"): on a machine with an NVIDIA
# GPU, proves or disproves streamio's two GPU-host claims in one run of ~7 minutes and prints
# one table: the CUDA tests (to_device overlap, pinned memory, the prefetcher's resume, GPU
# JPEG decode), nvJPEG decode against the CPU path, and the image benchmark from one FIFO at
# 1, 2, 4, 8 and 14 decoders against the in-memory decode rate on as many threads.
#
#   bash benchmarks/device_wheels.sh            # here, with the network: wheels into .whl/
#   bash benchmarks/device_check.sh             # there (no network): installs from .whl/
#   bash benchmarks/device_check.sh --dry-run   # any CPU machine, a few minutes (CI runs it)
#
# Rows are printed as soon as they are known; with $OUT set, the table and the log are also
# written to $OUT/device_table.md and $OUT/log.txt after every row, so a run cut short by a
# timeout still leaves the rows it had.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# streamio from this tree whatever the install below does (map processes and FIFO writers too).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
DRY=0
args=()  # the rest goes to benchmarks/device_check.py (--only SECTION, to rerun one part)
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1; args+=(--dry-run) ;;
        *) args+=("$arg") ;;
    esac
done
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; LOG="$OUT/log.txt"; else LOG=/dev/null; fi
say() { echo "$*"; echo "$*" >> "$LOG"; }
start=$(date +%s)

if [ "$DRY" = 0 ]; then
    # Install what the machine lacks from the wheels in .whl/ (made by device_wheels.sh), never
    # from an index: each with --no-deps, so that nothing the machine has (its CUDA torch,
    # torchvision) is replaced. 90 s at most.
    missing=()
    have() { "$PY" -c "import $1" >/dev/null 2>&1; }
    have setuptools || missing+=(setuptools)
    have google.protobuf || missing+=(protobuf)
    have smart_open || missing+=(smart-open)
    have crc32c || missing+=(crc32c)
    have simplejpeg || missing+=(simplejpeg)
    have torchdata.stateful_dataloader || missing+=(torchdata)
    have backports.zstd || missing+=(backports.zstd)
    # streamio[image] wants Pillow >= 13 (the resample kernel reproduces its resize).
    "$PY" -c 'import PIL, sys; sys.exit(int(PIL.__version__.split(".")[0]) < 13)' \
        >/dev/null 2>&1 || missing+=("pillow>=13")
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing from .whl/: ${missing[*]}"
        timeout 60 "$PY" -m pip install -q --no-index --find-links .whl --no-deps "${missing[@]}" \
            >> "$LOG" 2>&1 || say "WARNING: pip install from .whl/ failed (see log); going on"
    fi
    # streamio itself, editable, with the machine's compiler (no build isolation: it would
    # need the network; --use-pep517, else pip falls back to `setup.py develop`, which recent
    # setuptools turns into a nested, isolated pip that tries the network: seen on the H200).
    # If the C extension does not build, the pure-Python fallback runs and the env section's
    # table row says so.
    timeout 90 "$PY" -m pip install -q --no-build-isolation --use-pep517 --no-index --no-deps -e . \
        >> "$LOG" 2>&1 || say "WARNING: pip install -e . failed (see log); testing from the tree"
    # The editable install builds the C extension into the tree; if it did not, try once more.
    "$PY" -c 'import streamio._speedups' >/dev/null 2>&1 \
        || timeout 60 "$PY" setup.py build_ext --inplace -q >> "$LOG" 2>&1 \
        || say "WARNING: the C extension did not build (see log): the pure-Python fallback runs"
    say "install: $(( $(date +%s) - start )) s"
fi

"$PY" benchmarks/device_check.py "${args[@]}"
rc=$?
say "device check: $(( $(date +%s) - start )) s in all"
exit $rc

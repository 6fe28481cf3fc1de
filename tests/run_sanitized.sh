#!/bin/sh
# Run test files against an AddressSanitizer + UBSan build of streamio._speedups.
#
#   tests/run_sanitized.sh [pytest args...]      (default: the C kernel tests)
#   CC=clang tests/run_sanitized.sh ...          (clang's UBSan also flags NULL + 0 arithmetic)
#
# The build happens in a scratch copy of the tree, so the normal in-place build is left alone.
# PYTHONMALLOC=malloc sends small objects to malloc, where ASan can see them (pymalloc's arenas
# hide use-after-free of small objects); leaks are not checked (CPython keeps objects until exit).
# pytest runs with -s: a sanitizer report goes to fd 2, which pytest's capture would swallow.
set -eu
cc=${CC:-gcc}
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$scratch"' EXIT
work=$scratch/tree
mkdir "$work"
# The tests look for the peers' files in ../shared/peer-fixtures, beside the tree.
[ ! -d "$root/../shared" ] || ln -s "$(cd "$root/../shared" && pwd)" "$scratch/shared"
cd "$root"
git ls-files -co --exclude-standard | grep -v '\.so$' | tar -cf - -T - | tar -xf - -C "$work"
cd "$work"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ "$cc" = clang ]; then
    san="$san -shared-libasan"
    preload=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
else
    preload="$($cc -print-file-name=libasan.so) $($cc -print-file-name=libubsan.so)"
fi
for lib in $preload; do  # -print-file-name echoes a bare name when it finds no such file
    [ -f "$lib" ] || { echo "$0: sanitizer runtime $lib not found (clang's is in" \
        "libclang-rt-dev, which tests/fuzz/build.py --install installs)" >&2; exit 1; }
done
CC="$cc" CFLAGS="$san -O1 -g" LDSHARED="$cc -shared $san" \
    python setup.py build_ext --inplace -q >/dev/null
export LD_PRELOAD="$preload" PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 \
    UBSAN_OPTIONS=print_stacktrace=1 PYTHONPATH="$work"
# The extension is optional (setup.py): a failed build leaves none, and the tests would skip.
python -c 'import sys, streamio._speedups as s; sys.exit(not s.__file__.startswith(sys.argv[1]))' \
    "$work/" || { echo "$0: the sanitized streamio._speedups did not build or import" >&2; exit 1; }
[ $# -gt 0 ] || set -- tests/kernels/test_kernel*.py
python -m pytest -q -s -p no:cacheprovider "$@"

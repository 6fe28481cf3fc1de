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
work=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
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
CC="$cc" CFLAGS="$san -O1 -g" LDSHARED="$cc -shared $san" \
    python setup.py build_ext --inplace -q >/dev/null
[ $# -gt 0 ] || set -- tests/test_speedups.py tests/test_speedups_hostile.py
LD_PRELOAD="$preload" PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 \
UBSAN_OPTIONS=print_stacktrace=1 PYTHONPATH="$work" \
    python -m pytest -q -s -p no:cacheprovider "$@"

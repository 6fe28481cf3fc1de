#!/usr/bin/env python3
"""One coverage-guided fuzz target under ASan/UBSan (atheris + libFuzzer).

    python tests/fuzz/fuzz.py TARGET [libFuzzer flags] [CORPUS_DIR ...]   # fuzz
    python tests/fuzz/fuzz.py TARGET CRASH_FILE                         # replay one input

TARGET is a name from targets.TARGETS. The script restarts itself with the sanitizer runtime
preloaded (sanitized.py), loads the sanitizer build (build.py) and hands libFuzzer every flag
after TARGET (-max_total_time=, -runs=, -artifact_prefix=, -jobs=, ...). A crash, a sanitizer
report or a C-vs-Python mismatch (an uncaught exception) stops it with a non-zero status and
writes the input to ``<artifact_prefix>crash-<sha1>``.
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sanitized  # noqa: E402


def launcher(name: str) -> str:
    """An executable that runs this target: libFuzzer starts copies of argv[0] with its own flags
    (-jobs, -fork, -minimize_crash), so argv[0] must name the target and the interpreter."""
    path = sanitized.DEFAULT_OUT / "bin" / f"fuzz-{name}"
    text = f'#!/bin/sh\nexec "{sys.executable}" "{os.path.abspath(__file__)}" {name} "$@"\n'
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)  # atomic: parallel jobs may write it at the same time
    return str(path)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    sanitized.reexec_under_sanitizers()
    import atheris

    # Off by default: instrumenting the references costs ~10x in executions per second.
    python_coverage = os.environ.get("STREAMIO_FUZZ_PYTHON_COVERAGE", "0") == "1"
    modules = sanitized.load()
    ck = modules["streamio._speedups"]
    import targets

    name = sys.argv[1]
    if name not in targets.TARGETS:
        sys.exit(f"unknown target {name!r}; targets: {', '.join(targets.TARGETS)}")
    target = targets.TARGETS[name]
    if not target.available(ck):
        print(f"SKIP {name}: this build has no {target.kernels[0]} kernel")
        sys.exit(0)
    if (python_coverage or not target.kernels) and target.references:
        # The Python references are instrumented too: inputs that reach new reference paths
        # are kept, which is where C and Python are most likely to part ways.
        with atheris.instrument_imports(include=list(target.references)):
            for module in target.references:
                importlib.import_module(module)
    else:
        for module in target.references:
            importlib.import_module(module)
    if sys.modules.get("streamio._speedups") is not ck:
        sys.exit("streamio did not pick up the sanitizer build of the kernels")
    atheris.Setup([launcher(name)] + sys.argv[2:], target.one_input(ck))
    atheris.Fuzz()


if __name__ == "__main__":
    main()

"""Build the C extension(s) with AddressSanitizer, UBSan and libFuzzer coverage, out of tree.

    python tests/fuzz/build.py [--install] [--out build/fuzz]

The Extensions are read from ``setup.py`` itself (it is run with ``setuptools.setup`` replaced
by a function that keeps its arguments), so the sources list, include dirs and macros are the
ones the normal build uses, however the C files are split. They are compiled with clang
``-fsanitize=fuzzer-no-link,address,undefined`` into ``<out>/lib`` (``build/`` is gitignored);
the in-place build under ``streamio/`` is never touched. ``<out>/modules.json`` maps each
module name to its ``.so``, for ``tests/fuzz/sanitized.py`` to load.

``--install`` first installs what is missing: clang (apt-get, as root) and atheris (pip; the
atheris wheel ships libFuzzer and the ASan/UBSan runtime as ``asan_with_fuzzer.so``), and
clang's own shared ASan runtime, for ``CC=clang tests/run_sanitized.sh`` (CI runs both).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "build" / "fuzz"
SANITIZE = "-fsanitize=fuzzer-no-link,address,undefined"
# -O1 keeps the code close to the source for readable reports; -fno-wrapv because CPython's own
# flags (sysconfig CFLAGS) carry -fwrapv, which defines signed overflow and so hides it from UBSan;
# -UNDEBUG so any assert() in the C code is live. UBSan checks stay recoverable so that a long
# campaign can suppress a known finding (UBSAN_OPTIONS=suppressions=...); sanitized.py makes
# them fatal with halt_on_error=1, so a finding leaves a reproducer.
COMPILE_FLAGS = [SANITIZE, "-g", "-O1",
                 "-fno-omit-frame-pointer", "-fno-wrapv", "-UNDEBUG"]
# The runtime is not linked into the .so: LD_PRELOAD of atheris's asan_with_fuzzer.so provides it
# (one copy of ASan, UBSan and libFuzzer in the process; see sanitized.py).
LINK_FLAGS = [SANITIZE]


def setup_arguments() -> dict:
    """The keyword arguments ``setup.py`` passes to ``setup()``, without building anything."""
    captured: dict = {}
    cwd = os.getcwd()
    os.chdir(ROOT)  # setup.py opens README.md and checks for C files relative to the root
    try:
        with mock.patch("setuptools.setup", lambda **kw: captured.update(kw)):
            runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    finally:
        os.chdir(cwd)
    return captured


def extensions_from_setup_py() -> list:
    """The Extensions the normal build compiles (however many, whatever their sources)."""
    return list(setup_arguments().get("ext_modules") or [])


def install_missing() -> None:
    if shutil.which("clang") is None:
        # llvm: llvm-symbolizer, so sanitizer reports name files and lines
        apt_install("clang", "llvm")
    if clang_asan_runtime() is None:
        if os.geteuid() == 0:
            apt_install("libclang-rt-dev")
        else:  # the fuzz build does not need it
            print("note: clang's ASan runtime is missing (apt-get install libclang-rt-dev, as "
                  "root); CC=clang tests/run_sanitized.sh needs it", file=sys.stderr)
    try:
        import atheris  # noqa: F401
    except ImportError:  # the "fuzz" extra of setup.py says which atheris
        wanted = setup_arguments().get("extras_require", {}).get("fuzz") or ["atheris"]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *wanted], check=True)


def build(out: Path) -> dict:
    from setuptools import Distribution

    exts = extensions_from_setup_py()
    if not exts:
        sys.exit("setup.py declares no ext_modules: nothing to build")
    sanitized = []
    for ext in exts:
        ext = copy.copy(ext)
        ext.optional = False  # a failed sanitizer build must fail loudly, not fall back to Python
        ext.extra_compile_args = [a for a in (ext.extra_compile_args or [])
                                  if not a.startswith("-O")] + COMPILE_FLAGS
        ext.extra_link_args = list(ext.extra_link_args or []) + LINK_FLAGS
        sanitized.append(ext)
    lib, tmp = out / "lib", out / "tmp"
    env_before = dict(os.environ)
    os.environ.update(CC="clang", LDSHARED="clang -shared")
    cwd = os.getcwd()
    os.chdir(ROOT)  # Extension sources are relative to the root
    try:
        dist = Distribution({"name": "streamio-fuzz", "ext_modules": sanitized,
                             "script_name": "setup.py"})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib, cmd.build_temp, cmd.inplace, cmd.force = str(lib), str(tmp), 0, 1
        dist.run_command("build_ext")
        modules = {ext.name: str(lib / cmd.get_ext_filename(ext.name)) for ext in sanitized}
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env_before)
    for name, path in modules.items():
        if not Path(path).exists():
            sys.exit(f"the build did not produce {path} for {name}")
    (out / "modules.json").write_text(json.dumps(modules, indent=1) + "\n")
    return modules


def apt_install(*packages: str) -> None:
    if os.geteuid() != 0:
        sys.exit(f"missing: apt-get install {' '.join(packages)} (needs root)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def clang_asan_runtime() -> str | None:
    """clang's shared ASan runtime, which ``CC=clang tests/run_sanitized.sh`` preloads (the fuzz
    build uses atheris's), or None: Debian 12 ships it in libclang-rt-dev, which clang only
    recommends."""
    found = subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.so"],
                           capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.isfile(found) else None  # else a bare name


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--install", action="store_true",
                        help="apt-get install clang and pip install atheris if missing")
    args = parser.parse_args(argv)
    if args.install:
        install_missing()
    if shutil.which("clang") is None:
        sys.exit("clang not found (run with --install, or apt-get install clang)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, path in build(args.out.resolve()).items():
        print(f"sanitizer build: {name} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run Python against the sanitizer build of the extension (see build.py).

The .so is compiled with ASan/UBSan/libFuzzer instrumentation but not linked against their
runtime: the process must start with atheris's ``asan_with_fuzzer.so`` preloaded (one copy of
ASan, UBSan and libFuzzer, the one atheris drives), and with ``PYTHONMALLOC=malloc`` so Python
objects come from ASan's malloc, with red zones, instead of pymalloc's arenas where a small
overflow lands in a neighbour unseen.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "build" / "fuzz"
MARKER = "STREAMIO_FUZZ_SANITIZED"  # set in the environment once the runtime is preloaded

# detect_leaks=0: CPython keeps objects alive until exit on purpose (LeakSanitizer would report
# them all). allocator_may_return_null=1: a huge allocation the kernel asks for is a MemoryError
# for the code to handle, as without ASan, not an abort. UBSan errors abort with a stack.
ASAN_OPTIONS = ("detect_leaks=0:allocator_may_return_null=1:detect_stack_use_after_return=1:"
                "check_initialization_order=1:strict_string_checks=1:handle_abort=1")
UBSAN_OPTIONS = "halt_on_error=1:print_stacktrace=1"


def runtime_library() -> str:
    """atheris's combined ASan + UBSan + libFuzzer runtime."""
    import atheris

    path = os.path.join(atheris.path(), "asan_with_fuzzer.so")
    if not os.path.exists(path):
        raise SystemExit(f"atheris has no {path}: reinstall atheris (pip install atheris)")
    return path


def _symbolizer() -> str:
    found = shutil.which("llvm-symbolizer")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/llvm-*/bin/llvm-symbolizer"))
    return candidates[-1] if candidates else ""


def sanitizer_env(base: Dict[str, str] | None = None) -> Dict[str, str]:
    """The environment a sanitized run needs (added to ``base``, default os.environ)."""
    env = dict(os.environ if base is None else base)
    preload = runtime_library()
    env["LD_PRELOAD"] = ":".join(p for p in (preload, env.get("LD_PRELOAD", "")) if p)
    env["PYTHONMALLOC"] = "malloc"
    env.setdefault("ASAN_OPTIONS", ASAN_OPTIONS)
    env.setdefault("UBSAN_OPTIONS", UBSAN_OPTIONS)
    symbolizer = _symbolizer()
    if symbolizer:
        env.setdefault("ASAN_SYMBOLIZER_PATH", symbolizer)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env[MARKER] = "1"
    return env


def reexec_under_sanitizers() -> None:
    """Restart this script with the runtime preloaded, unless that is already done."""
    if os.environ.get(MARKER) == "1":
        return
    os.execve(sys.executable, [sys.executable] + sys.argv, sanitizer_env())


def load(out: Path = DEFAULT_OUT) -> Dict[str, ModuleType]:
    """Import the sanitizer build's modules under their real names, before ``streamio`` is
    imported, so that the framers and decoders (which bind the kernels at import) use them too."""
    listing = out / "modules.json"
    if not listing.exists():
        raise SystemExit(f"no sanitizer build in {out}: run python tests/fuzz/build.py")
    modules = {}
    for name, path in json.loads(listing.read_text()).items():
        if name in sys.modules:
            raise RuntimeError(f"{name} was imported before the sanitizer build was loaded")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules

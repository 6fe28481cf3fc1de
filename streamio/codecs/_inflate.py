"""Which DEFLATE implementation inflates gzip/zlib streams.

The standard :mod:`zlib` always works. ISA-L (``pip install isal``, module ``isal.isal_zlib``) and
zlib-ng (``pip install zlib-ng``, module ``zlib_ng.zlib_ng``) are drop-ins with zlib's
``decompressobj`` API that inflate the same bytes faster; ``pip install 'streamio[fast-inflate]'``
installs ISA-L, which was the fastest here (``benchmarks/inflate.py``: ISA-L ~3.5x zlib, zlib-ng
~3x, on this machine), so the first of these that imports is used, zlib last.
"""

from __future__ import annotations

import importlib
import zlib
from typing import Any, Dict, Optional

from ..errors import MissingDependencyError, UsageError

#: Fastest first, as measured by benchmarks/inflate.py; zlib is the fallback that always exists.
PREFERENCE = ("isal", "zlib-ng", "zlib")
_MODULES = {"isal": "isal.isal_zlib", "zlib-ng": "zlib_ng.zlib_ng", "zlib": "zlib"}
_PACKAGES = {"isal": "isal", "zlib-ng": "zlib-ng", "zlib": "zlib"}
_loaded: Dict[str, Optional[Any]] = {"zlib": zlib}
_default: Optional[Any] = None


def _try(name: str) -> Optional[Any]:
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(_MODULES[name])
        except ImportError:
            _loaded[name] = None
    return _loaded[name]


def backend(name: str) -> Any:
    """The inflate module called ``name`` (``"isal"``, ``"zlib-ng"`` or ``"zlib"``)."""
    if name not in _MODULES:
        raise UsageError(f"inflate backend must be one of {PREFERENCE}, not {name!r}")
    module = _try(name)
    if module is None:
        raise MissingDependencyError(_PACKAGES[name], "fast-inflate")
    return module


def available() -> list:
    """The names of the inflate backends that import here, fastest first."""
    return [name for name in PREFERENCE if _try(name) is not None]


def default_backend() -> Any:
    """The fastest installed backend (decided once per process)."""
    global _default
    if _default is None:
        _default = backend(available()[0])
    return _default


def backend_name(module: Any) -> str:
    for name, mod in _loaded.items():
        if mod is module:
            return name
    return getattr(module, "__name__", "?")


__all__ = ["PREFERENCE", "available", "backend", "backend_name", "default_backend"]

"""Moved to :mod:`streamio.sharing._wire` (the shared stream imports no framework); this name
stays importable and is the same module object, so monkeypatching either reaches both."""

import sys

from ..sharing import _wire as moved

sys.modules[__name__] = moved

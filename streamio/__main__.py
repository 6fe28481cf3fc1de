"""``python -m streamio`` is the ``streamio`` command."""

import sys

from .cli import main

sys.exit(main())

"""Command-line tools built on the library, beside it (not on the hot path): ``pack`` (small files
into record shards) and ``diagnose`` (where the input time goes)."""

from .diagnose import Diagnosis, diagnose
from .pack import PackError, PackResult, pack

__all__ = ["Diagnosis", "PackError", "PackResult", "diagnose", "pack"]

"""Command-line tools built on the library, beside it (not on the hot path), one module each:
:mod:`.pack` (small files into record shards), :mod:`.diagnose` (where the input time goes),
:mod:`.index` (index files), :mod:`.serve_pipe` (emulate SageMaker Pipe mode), :mod:`.demo`
(``streamio demo``) and :mod:`.preview` (``streamio head``'s record preview).

The package re-exports nothing: ``streamio.tools.pack`` is the module, and the functions are
``streamio.pack`` and ``streamio.diagnose`` (or ``streamio.tools.pack.pack``).
"""

"""Forkserver processes that never import the parent's ``__main__``.

multiprocessing starts every ``forkserver`` (and ``spawn``) child by running the parent's main
script again as ``__mp_main__``, so that functions defined there can be found by name. A script
without an ``if __name__ == "__main__":`` guard (most training scripts, every notebook export)
then runs its own training loop inside the child, which dies with multiprocessing's bootstrap
error. The map stage does not need that import: it ships its function by value (cloudpickle),
and everything else a child runs is streamio's own. So its children are started with the
preparation data minus the two keys that ask for ``__main__`` (``init_main_from_path`` and
``init_main_from_name``), and the forkserver is not asked to preload ``__main__`` either.

``_MainlessPopen._launch`` is ``multiprocessing.popen_forkserver.Popen._launch`` (CPython 3.9 to
3.13 share it) with that one change; nothing else of multiprocessing is altered, and processes
other code starts from the same forkserver still import their ``__main__`` as usual.
"""

from __future__ import annotations

import io
import os
from multiprocessing import context, forkserver, popen_forkserver, spawn, util
from typing import Any

__all__ = ["MainlessProcess", "MAIN_KEYS"]

#: Preparation data that makes a child run the parent's main module.
MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


class _MainlessPopen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in MAIN_KEYS:
            prep_data.pop(key, None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            context.reduction.dump(prep_data, buf)
            context.reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        # As the stdlib does: a duplicate of the data pipe's write end is the parent's
        # sentinel for the child.
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class MainlessProcess(context.ForkServerProcess):
    """A ``forkserver`` Process whose child does not import the parent's ``__main__``."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _MainlessPopen(process_obj)

"""Stress for the C kernels (tests/kernels/): another thread beside a call, arguments that change
the caller's lists mid-call."""

from __future__ import annotations

import gc
import sys
import threading
import time


def runs_beside(call) -> bool:
    """Whether another Python thread got to run while ``call()`` was inside the C kernel.

    The switch interval is raised so that the interpreter itself never takes the GIL from this
    thread: the helper thread can only run if the kernel releases the GIL. The helper gives the
    GIL back after each step (a short sleep), so the kernel can always take it again.
    """
    steps = [0]
    stop = threading.Event()

    def helper():
        while not stop.is_set():
            steps[0] += 1
            time.sleep(0.0002)

    old = sys.getswitchinterval()
    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    sys.setswitchinterval(30.0)
    try:
        for _ in range(20):  # the helper may be asleep during one call: it cannot be in all
            before = steps[0]
            call()
            if steps[0] != before:
                return True
        return False
    finally:
        sys.setswitchinterval(old)
        stop.set()
        thread.join()


class Mutator:
    """An int whose ``__index__`` empties the given lists (dropping what they held) first."""

    def __init__(self, value: int, *victims: list) -> None:
        self.value = value
        self.victims = victims

    def __index__(self) -> int:
        for victim in self.victims:
            victim.clear()
        # Reuse the freed memory, so that a kernel still reading it sees garbage.
        _ = [bytes(64) for _ in range(1000)]
        gc.collect()
        return self.value

"""Serves FILE on the Pipe-mode FIFOs PREFIX_0 .. PREFIX_<epochs-1> at about RATE bytes/s, from
its own process: a deliberately slow source. A reader that leaves early ends that epoch.

usage: throttled_channel.py PREFIX FILE EPOCHS RATE [DELAY]
DELAY: seconds to wait before each epoch's FIFO appears (a slow start, like a download).
"""

import os
import sys
import time

prefix, path, epochs, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
data = open(path, "rb").read()
piece = 4096
for epoch in range(epochs):
    time.sleep(delay)
    fifo = f"{prefix}_{epoch}"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_WRONLY)  # waits for the reader
    start = time.monotonic()
    try:
        for pos in range(0, len(data), piece):
            view = memoryview(data)[pos:pos + piece]
            while view:
                view = view[os.write(fd, view):]
            ahead = (pos + piece) / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)
        os.unlink(fifo)

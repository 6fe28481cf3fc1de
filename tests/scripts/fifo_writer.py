"""Writes a file into a FIFO in odd-sized pieces, from its own process (as SageMaker would).

usage: fifo_writer.py FIFO FILE [PIECE_SIZES...] [--delay-first S] [--stall-after N --stall S]
Piece sizes cycle; defaults to odd sizes that never line up with record boundaries.
"""

import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("fifo")
p.add_argument("file")
p.add_argument("pieces", nargs="*", type=int, default=[1, 7, 4093, 65537, 3, 1 << 20])
p.add_argument("--delay-first", type=float, default=0.0)
p.add_argument("--stall-after", type=int, default=-1, help="bytes after which to stall")
p.add_argument("--stall", type=float, default=0.0, help="seconds to stall (writer stays open)")
args = p.parse_args()

data = open(args.file, "rb").read()
if args.delay_first:
    time.sleep(args.delay_first)
fd = os.open(args.fifo, os.O_WRONLY)
pos, k = 0, 0
try:
    while pos < len(data):
        n = args.pieces[k % len(args.pieces)]
        k += 1
        if 0 <= args.stall_after < pos + n and args.stall_after >= pos:
            n = max(1, args.stall_after - pos)
        view = memoryview(data)[pos:pos + n]
        while view:
            view = view[os.write(fd, view):]
        pos += n
        if pos == args.stall_after:
            time.sleep(args.stall)
except BrokenPipeError:
    pass
finally:
    os.close(fd)

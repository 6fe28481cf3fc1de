"""One stream shared by the DataLoader workers (and ranks) of one host.

A FIFO or a single stream can have only one reader: :mod:`streamio.sharing.stream` makes one
worker its dealer, which reads the stream through the pipeline's public seam
(:meth:`streamio.pipeline.EpochRun.for_sources`) and deals blocks of records to every worker
over private local sockets; each worker's epoch reads them as its feed
(:meth:`streamio.Dataset.with_feed`). It imports no framework (torch imports it).
``_local_ipc`` (who may connect, where the sockets live) and ``_wire`` (the protocol, parsed
as data) are private to this room.
"""

from .stream import (BLOCK_BYTES, BLOCK_RECORDS, DEFAULT_CONNECT_TIMEOUT, READ_AHEAD,
                     SharedStreamFeed, dealer_address, stream_address)

__all__ = ["BLOCK_BYTES", "BLOCK_RECORDS", "DEFAULT_CONNECT_TIMEOUT", "READ_AHEAD",
           "SharedStreamFeed", "dealer_address", "stream_address"]

"""The streamio benchmark: streamio against its peers on the same bytes, in one run.

``python benchmarks/run.py`` (or ``streamio bench``) generates the workloads in a temporary
directory, streams each through a named pipe fed by a writer *process* (``os.open`` on the FIFO,
then the file's bytes), and runs streamio and its peers on the same bytes, alternating, for
several rounds. It prints the medians, the ratios against streamio's targets, and writes the
same facts as JSON (``--json PATH``).

Workloads (sizes adjustable; the defaults finish in a few minutes on a 2-core machine):

1. ``examples``: ``tf.train.Example`` records (float32[32] ``x`` + int64 ``label``, ~178 bytes
   framed) into batches of 256. streamio reads the FIFO; ``tf.data`` and the ``tfrecord``
   package read the regular file (neither can read a FIFO: the run tries once and records the
   error).
2. ``large``: 100 KB TFRecords, raw bytes, CRCs verified: ``read_records`` vs a plain
   ``os.read(fd, 1 MiB)`` loop on the same FIFO.
3. ``csv``: rows of 17 numeric columns, label first, into float32 batches: streamio and
   ``pandas.read_csv(chunksize=...)`` on the FIFO, ``tf.data`` TextLine + ``decode_csv`` on the file.
4. ``recordio``: SageMaker RecordIO-protobuf dense float32 rows (128 features + label) in batches.
5. ``pipeline``: ``shuffle(10k) + batch + prefetch`` vs the bare decode loop, on 600k Examples of
   its own (an epoch of 150k is short enough for a drift in the machine's speed to show).
6. ``adapters``: what users run end to end, on 200k Examples of its own (one file, and the same
   records in 4 part files), next to the numpy rate. ``to_tf()`` reading the FIFO against
   ``tf.data`` (``TFRecordDataset.batch.map(parse_example, AUTOTUNE).prefetch(AUTOTUNE)``) on
   the file, both read by two graph-mode consumers that sum ``reduce_sum(x)`` over each batch:
   ``step``, a Python loop calling a ``tf.function`` step that takes the next batch from the
   iterator (``model.fit`` with its default ``steps_per_execution=1``), and ``graph``, the
   whole epoch iterated inside one ``tf.function`` (a custom training loop; ``model.fit`` with
   a large ``steps_per_execution`` comes close). And ``to_torch()`` through a ``DataLoader``
   (``batch_size=None``) with ``num_workers`` 0 and 2 over the part files, against the numpy
   rate on the same files. These run in their own TensorFlow and torch worker processes.

Also: ``read_records`` alone on the examples FIFO (records/s) next to a raw ``read()`` of the
same pipe, and the peak RSS of every measurement (the kernel's high-water mark, reset before
each one).

TensorFlow runs in a separate worker process, and so do torch and the ``tfrecord`` package (it
registers protobuf messages under TensorFlow's names): the streamio measurements never share a
process with them (except the adapters' own cases, which need them). pandas runs in the
streamio process (it shares nothing with streamio's hot path). Workloads whose streamio decoder
or pipeline is not importable are skipped with the reason, so the benchmark runs at every stage
of the project.

The package, one module per job: :mod:`.config` (defaults, targets, result records),
:mod:`.workloads` (the generated records), :mod:`.measure` (a FIFO fed by a writer process, peak
memory), :mod:`.cases` (the streamio side), :mod:`.peers` (tf.data, the tfrecord package, torch in
their worker processes), :mod:`.run` (the rounds), :mod:`.report` (medians, ratios, the table) and
:mod:`.cli`. The benchmarks with options of their own are modules beside them: :mod:`.images`,
:mod:`.ranges`, :mod:`.resume`, :mod:`.elastic`, :mod:`.ray` (streamio on Ray Data) and :mod:`.device` (the GPU
checks).
"""

from .cli import main
from .config import DEFAULT_EXAMPLES, BenchConfig
from .report import format_table, full_scale
from .run import run_benchmark

__all__ = ["BenchConfig", "DEFAULT_EXAMPLES", "format_table", "full_scale", "main", "run_benchmark"]

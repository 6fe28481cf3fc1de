"""The streamio benchmark: streamio against its peers on the same bytes, in one run.

``python benchmarks/run.py`` (or ``streamio bench``) generates the workloads in a temporary
directory, streams each through a named pipe fed by a writer *process* (``os.open`` on the FIFO,
then the file's bytes), runs streamio and its peers on the same bytes, alternating, for several
rounds, and prints the medians and the ratios against streamio's targets (``--json PATH``: the
same as JSON). Workloads (sizes adjustable, the defaults take a few minutes on 2 cores; each
peer's exact pipeline and the figures: docs/performance.md, "streamio against its peers"):

- ``examples``: ``tf.train.Example`` (float32[32] ``x`` + int64 ``label``, ~178 bytes framed) in
  batches of 256; tf.data and the ``tfrecord`` package read the regular file (neither can read a
  FIFO: each run tries once and records the error). Also ``read_records`` alone vs a raw read.
- ``large``: 100 KB TFRecords, CRCs verified, vs an ``os.read(fd, 1 MiB)`` loop on the FIFO;
  ``csv``: 17 numeric columns, label first, vs pandas on the FIFO and tf.data on the file;
  ``recordio``: SageMaker RecordIO-protobuf dense float32 rows (128 features + label).
- ``pipeline``: ``shuffle(10k) + batch + prefetch`` vs the bare decode loop, 600k Examples.
- ``adapters`` (200k Examples; one file, and 4 part files; next to the numpy rate): ``to_tf()``
  on the FIFO vs tf.data on the file, each summed by a ``step`` consumer (a Python loop over a
  ``tf.function`` step: ``model.fit``, ``steps_per_execution=1``) and a ``graph`` one (the epoch
  in one ``tf.function``: a custom loop, or a large ``steps_per_execution``); ``to_torch()``
  through a ``DataLoader``, ``num_workers`` 0 and 2 over the part files.

Every measurement records its peak RSS (the kernel's high-water mark, reset before each one).
TensorFlow, torch and the ``tfrecord`` package (it registers protobuf messages under TensorFlow's
names) run in worker processes, apart from streamio's measurements but for the adapters'; pandas
runs in streamio's. A workload whose decoder or pipeline is not importable is skipped, saying why.
Modules: ARCHITECTURE.md, "Where things live" (:mod:`.elastic`: elastic resume's cost).
"""

from .cli import main
from .config import DEFAULT_EXAMPLES, BenchConfig
from .report import format_table, full_scale
from .run import run_benchmark

__all__ = ["BenchConfig", "DEFAULT_EXAMPLES", "format_table", "full_scale", "main", "run_benchmark"]

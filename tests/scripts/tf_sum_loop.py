"""The loop of issue #41 item 5 (one ``to_tf()`` run once hung for 600 s): a ``tf.function``
summing every batch of a TFRecord file of Examples through ``to_tf()``, run RUNS times in one
process, each run timed; a run over 60 s dumps every thread's traceback to stderr
(``faulthandler``). Used by tests/adapters/test_tf_waits.py with a small file, and by hand
under load for docs/performance.md:

    nice python -c "while 1: pass" &  nice python -c "while 1: pass" &
    python tests/scripts/tf_sum_loop.py WORKDIR 100000 30     # then kill the two loops

usage: tf_sum_loop.py WORKDIR RECORDS RUNS  -> one JSON object on stdout (times in s)
"""

import faulthandler
import json
import os
import sys
import time

import numpy as np


def main(workdir: str, records: int, runs: int) -> dict:
    import streamio
    from streamio import Dataset, Example, FixedLen

    path = os.path.join(workdir, f"x{records}.tfrecord")
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        streamio.write_records(path, "tfrecord", (
            streamio.encode_example({"x": rng.random(16, dtype=np.float32), "y": np.int64(i)})
            for i in range(records)))
    import tensorflow as tf

    spec = Example({"x": FixedLen([16], "float32"), "y": FixedLen([], "int64")})
    times = []
    for _ in range(runs):
        faulthandler.dump_traceback_later(60, repeat=True, file=sys.stderr)
        started = time.monotonic()
        tfds = Dataset(path, "tfrecord", decoder=spec).batch(256).to_tf()

        @tf.function
        def total():
            s = tf.constant(0, tf.int64)
            n = tf.constant(0, tf.int64)
            for batch in tfds:
                s += tf.reduce_sum(batch["y"])
                n += tf.cast(tf.shape(batch["y"])[0], tf.int64)
            return s, n

        s, n = total()
        times.append(time.monotonic() - started)
        faulthandler.cancel_dump_traceback_later()
        if (int(n), int(s)) != (records, records * (records - 1) // 2):
            raise SystemExit(f"run {len(times)}: summed {int(n)} records to {int(s)}")
    return {"runs": runs, "max_s": max(times), "median_s": sorted(times)[runs // 2],
            "min_s": min(times), "times_s": times}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))

"""The driver of driver.py's Ray scenario, on host 0 of a cluster whose head runs there and a
worker node on host 1: ``streamio.ray.read`` of the storage host's files over HTTP and objects
over S3 (which node read each row), and ``streamio.ray.write`` to the storage host's S3, read
back with streamio. Prints one JSON object.

usage: ray_job.py HTTP_URLS_JSON S3_URLS_JSON S3_OUT_PREFIX
"""

import json
import sys

import numpy as np
import ray

import streamio
import streamio.ray as sray
from support.examples import ID_X


def where(batch):  # which node each row went through
    node = ray.get_runtime_context().get_node_id()
    return {"id": batch["id"], "node": np.full(len(batch["id"]), node)}


def main():
    http_urls, s3_urls, out_prefix = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    ray.init(address="auto", log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    result = {"nodes": sorted(nodes.values()), "read": {}, "write": None}
    for name, urls in (("http", http_urls), ("s3", s3_urls)):
        rows = sray.read(urls, "tfrecord", decoder=ID_X, parallelism=6) \
            .map_batches(where, batch_format="numpy").take_all()
        result["read"][name] = {"ids": [int(r["id"]) for r in rows],
                                "addresses": sorted({nodes[r["node"]] for r in rows})}
    try:
        raw = sray.read(s3_urls, "tfrecord", parallelism=6)  # one binary column, "record"
        shards = sray.write(raw, out_prefix, "tfrecord")
        back = []
        for batch in streamio.Dataset(shards, "tfrecord", decoder=ID_X).batch(256):
            back.extend(batch["id"].tolist())
        result["write"] = {"shards": shards, "ids": back, "error": None}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["write"] = {"error": f"{type(exc).__name__}: {str(exc)[:3000]}"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

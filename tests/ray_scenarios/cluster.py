"""A 2-node Ray cluster on one machine (``ray.cluster_utils.Cluster``, both nodes on 127.0.0.1):
streamio read tasks spread over both nodes, every record once. Run by tests/adapters/test_ray.py
inside a private network namespace, apart from scenarios.py (one Ray per process)."""

from __future__ import annotations

import numpy as np
import pytest

import ray
import streamio.ray as sray
from ray.cluster_utils import Cluster
from streamio import Example, FixedLen, encode_example, write_records

DECODER = Example({"y": FixedLen((), "int64")})


@pytest.fixture(scope="module")
def cluster():
    node = {"num_cpus": 1, "object_store_memory": 128 << 20, "include_dashboard": False,
            "node_ip_address": "127.0.0.1"}
    c = Cluster(initialize_head=True, head_node_args=dict(node, resources={"head": 1}))
    c.add_node(**dict(node, resources={"worker": 1}))
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield c
    ray.shutdown()
    c.shutdown()


def test_two_nodes_read_every_record_once(cluster, tmp_path):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    for f in range(4):
        write_records(tmp_path / f"p{f}.tfrecord", "tfrecord",
                      [encode_example({"y": f * 500 + i}) for i in range(500)])
    ds = sray.read(str(tmp_path), "tfrecord", decoder=DECODER, parallelism=4)

    def where(batch):  # which node each block went through
        return {"y": batch["y"], "node": np.full(len(batch["y"]), ray.get_runtime_context()
                                                 .get_node_id())}

    rows = ds.map_batches(where, batch_format="numpy").take_all()
    assert sorted(int(r["y"]) for r in rows) == list(range(2000))
    assert len({r["node"] for r in rows}) == 2  # both nodes did work

"""streamio.ray's Datasink with a URL prefix: ``write(ds, "s3://bucket/out/part")`` uploads its
shards to the object store (a real S3 server: moto's, on 127.0.0.1), not to a local directory
named ``s3:`` under the write task's working directory (found by the multi-host harness,
tests/multihost/: on a cluster each node kept its shards on its own disk). The write tasks are
called as Ray calls them, without a cluster (the cluster path runs in tests/multihost/)."""

from __future__ import annotations

import types

import pytest

from support.s3 import moto_endpoint, s3_client

pytest.importorskip("ray")
pytest.importorskip("smart_open")
pa = pytest.importorskip("pyarrow")

import streamio  # noqa: E402
from streamio.adapters.ray import Datasink  # noqa: E402

RECORDS = [b"record-%d" % i * (i % 7 + 1) for i in range(300)]


def write_tasks(sink, tasks=2):
    sink.on_write_start(None)
    returns = [sink.write([pa.table({"record": RECORDS[t::tasks]})],
                          types.SimpleNamespace(task_idx=t)) for t in range(tasks)]
    sink.on_write_complete(types.SimpleNamespace(write_returns=returns))
    return sink.shards


@pytest.mark.parametrize("index", [False, True])
def test_a_url_prefix_uploads_the_shards(tmp_path, monkeypatch, index):
    monkeypatch.chdir(tmp_path)
    with moto_endpoint() as endpoint:
        client = s3_client(endpoint, monkeypatch, "out")
        shards = write_tasks(Datasink("s3://out/run/part", "tfrecord", index=index))
        assert shards == ["s3://out/run/part-00000-00000.tfrecord",
                          "s3://out/run/part-00001-00000.tfrecord"]
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="out")["Contents"])
        expected = ["run/part-00000-00000.tfrecord", "run/part-00001-00000.tfrecord"]
        if index:
            expected = sorted(expected + [k + ".index" for k in expected])
        assert keys == expected
        back = list(streamio.Dataset(shards, "tfrecord"))
    assert sorted(back) == sorted(RECORDS)
    assert list(tmp_path.iterdir()) == []  # nothing written locally (no ./s3:/out/...)


def test_a_scheme_without_a_writer_is_refused_at_once():
    with pytest.raises(streamio.UsageError, match="ftp://"):
        Datasink("ftp://host/out/part")

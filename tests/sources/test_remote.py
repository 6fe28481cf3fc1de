"""s3:// through smart_open, against a real S3-protocol server on 127.0.0.1 (moto's server mode)."""

from __future__ import annotations

import pytest

import streamio
from streamio.errors import SourceError

from conftest import FIXTURES
from fixtures.make_fixtures import payloads

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint, monkeypatch):
    # boto3 reads these; streamio itself reads no environment variables.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3")
    client.create_bucket(Bucket="streamio-test")
    return client


def test_s3_object_streams_and_decompresses(bucket):
    data = (FIXTURES / "tf" / "gzip.tfrecord.gz").read_bytes()
    bucket.put_object(Bucket="streamio-test", Key="train/part-0.tfrecord.gz", Body=data)
    records = list(streamio.read_records("s3://streamio-test/train/part-0.tfrecord.gz", "tfrecord"))
    assert records == payloads()


def test_missing_s3_key_is_a_source_error_naming_the_uri(bucket):
    with pytest.raises(SourceError, match="s3://streamio-test/absent"):
        list(streamio.read_records("s3://streamio-test/absent", "tfrecord"))

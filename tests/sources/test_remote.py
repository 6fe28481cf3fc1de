"""s3:// through smart_open, against a real S3-protocol server on 127.0.0.1 (moto's server mode)."""

from __future__ import annotations

import pytest

import streamio
from streamio.errors import SourceError

from conftest import FIXTURES
from fixtures.make_fixtures import payloads
from support.s3 import moto_endpoint, s3_client

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_endpoint() as url:
        yield url


@pytest.fixture
def bucket(s3_endpoint, monkeypatch):
    return s3_client(s3_endpoint, monkeypatch, "streamio-test")


def test_s3_object_streams_and_decompresses(bucket):
    data = (FIXTURES / "tf" / "gzip.tfrecord.gz").read_bytes()
    bucket.put_object(Bucket="streamio-test", Key="train/part-0.tfrecord.gz", Body=data)
    records = list(streamio.read_records("s3://streamio-test/train/part-0.tfrecord.gz", "tfrecord"))
    assert records == payloads()


def test_missing_s3_key_is_a_source_error_naming_the_uri(bucket):
    with pytest.raises(SourceError, match="s3://streamio-test/absent"):
        list(streamio.read_records("s3://streamio-test/absent", "tfrecord"))

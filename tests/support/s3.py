"""A real S3-protocol server on 127.0.0.1 (moto's server mode), for the s3:// tests."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str]:
    """The server's URL while the block runs (skips the test where moto is not installed)."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str, monkeypatch, bucket: str):
    """A boto3 client of ``endpoint`` holding a new, empty ``bucket``. The environment variables
    are boto3's (smart_open reaches S3 through it); streamio itself reads none."""
    boto3 = pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    return client

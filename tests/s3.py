"""A real S3 API server on the loopback interface for the tests (moto's standalone server, in a process
of its own), and the environment a user would set to reach it: ``AWS_ENDPOINT_URL`` and keys for s3fs
and boto3, ``S3_ENDPOINT`` for TensorBoard's own S3 reader. Nothing of phaseprof is replaced.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

_SERVE = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the test closes this pipe
server.stop()
"""


class S3Server:
    """``start()``, ``stop()`` (the store goes away) and ``start()`` again on the same port."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(self.port)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError("the S3 server did not start (pip install 'moto[server]')")
        self.port = int(line)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the S3 server does not answer")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.wait(30)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._proc = None

    def environment(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "S3_ENDPOINT": self.endpoint,
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint)

    def upload_tree(self, local: os.PathLike, bucket: str, prefix: str) -> list[str]:
        """Copy a local logdir into ``s3://bucket/prefix`` as a user would (``aws s3 cp --recursive``)."""
        client = self.client()
        keys = []
        for directory, _, files in os.walk(local):
            for name in files:
                path = os.path.join(directory, name)
                key = "/".join([prefix, os.path.relpath(path, local).replace(os.sep, "/")])
                client.upload_file(path, bucket, key)
                keys.append(key)
        return sorted(keys)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3():
    """The server, started once for the session (the store clients of this process keep their endpoint),
    with the environment set for this process and its children."""
    server = S3Server()
    server.start()
    saved = {k: os.environ.get(k) for k in server.environment()}
    os.environ.update(server.environment())
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_buckets = iter(range(1_000_000))


@pytest.fixture
def bucket(s3):
    """A new empty bucket's name."""
    name = f"logs{next(_buckets)}"
    s3.client().create_bucket(Bucket=name)
    return name

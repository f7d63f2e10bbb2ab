"""A real S3 API server on the loopback interface for the tests (moto's standalone server, in a process
of its own), and the environment a user would set to reach it: ``AWS_ENDPOINT_URL`` and keys for s3fs
and boto3, ``S3_ENDPOINT`` for TensorBoard's own S3 reader. Nothing of phaseprof is replaced.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from tests import processes

# werkzeug's log line per request is turned off: written under the logging module's lock, it is work a
# real store does not do in its readers' way (and the tests read none of it).
_SERVE = """
import logging
import sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.WARNING)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the test closes this pipe
server.stop()
"""


#: moto's setting for a server that checks every request's credentials from the first one, as a
#: real store does (by default it takes any): keys it never issued are refused (InvalidAccessKeyId).
CHECKS_CREDENTIALS = {"INITIAL_NO_AUTH_ACTION_COUNT": "0"}


class S3Server:
    """``start()``, ``stop()`` (the store goes away) and ``start()`` again on the same port; what the
    tests do to a store (as `tests.stores.Emulator` does to the others)."""

    scheme = "s3"
    secrets = ("testing",)
    tensorboard_args = ()

    def __init__(self, outlives_tests: bool = False, env: dict[str, str] | None = None) -> None:
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._outlives_tests = outlives_tests  # a session's: exempt from `tests.processes`'s check
        #: The server's environment beside this process's (moto's own settings: ``env=CHECKS_CREDENTIALS``).
        self._env = env or {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id (while it runs)."""
        return self._proc.pid

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(self.port)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      env={**os.environ, **self._env})
        if self._outlives_tests:
            processes.outlives_tests(self._proc.pid)
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
        processes.no_longer_exempt(self._proc.pid)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._proc = None

    def environment(self, endpoint: str = "") -> dict[str, str]:
        """What points a client at ``endpoint`` (this server's by default)."""
        endpoint = endpoint or self.endpoint
        return {"AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT": endpoint,
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint)

    def url(self, bucket: str, prefix: str) -> str:
        return f"s3://{bucket}/{prefix}"

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, bucket: str, key: str) -> None:
        self.client().delete_object(Bucket=bucket, Key=key)

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


class Relay:
    """A TCP relay on 127.0.0.1 to the store at ``port``, for what a reader asks of the store: every
    request (method and target, in order) and the bytes the store sends back, in all and by the client
    that asked (`by_client`). Point a client's endpoint at ``endpoint``."""

    def __init__(self, port: int, hold: str | None = None):
        self.target = port
        self.received = 0
        self.requests: list[tuple[str, str]] = []
        #: Bytes the store sent, by the first word of the User-Agent of the connection's requests
        #: (``aiobotocore/…``: s3fs, phaseprof's reader; ``Boto3/…``: TensorBoard's own).
        self.by_client: dict[str, int] = {}
        #: Requests whose target holds this text wait (unsent) until `release`.
        self._hold, self._released = hold, threading.Event()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            connection = {"client": "?"}  # shared by the connection's two directions
            threading.Thread(target=self._pipe, args=(client, upstream, self._asked, connection),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self._answered, connection),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, seen, connection: dict) -> None:
        state = {"buffer": b"", "body": 0, "connection": connection}
        try:
            while data := src.recv(1 << 16):
                seen(data, state)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _answered(self, data: bytes, state: dict) -> None:
        with self._lock:
            self.received += len(data)
            client = state.setdefault("connection", {"client": "?"})["client"]
            self.by_client[client] = self.by_client.get(client, 0) + len(data)

    def _asked(self, data: bytes, state: dict) -> None:
        """Each request's first line, from the client's bytes: header blocks, each body skipped."""
        buffer = state["buffer"] + data
        while True:
            if state["body"]:
                skip = min(state["body"], len(buffer))
                buffer, state["body"] = buffer[skip:], state["body"] - skip
                if state["body"]:
                    break
            head, found, rest = buffer.partition(b"\r\n\r\n")
            if not found:
                break
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            target = urllib.parse.unquote(target)
            agent = next((line.partition(":")[2].split() for line in lines[1:]
                          if line.lower().startswith("user-agent:")), None)
            if agent:
                state.setdefault("connection", {})["client"] = agent[0].partition("/")[0]
            with self._lock:
                self.requests.append((method, target))
            if self._hold is not None and self._hold in target:
                self._released.wait(300)
            length = next((line.partition(":")[2] for line in lines[1:] if line.lower().startswith("content-length:")),
                          "0")
            buffer, state["body"] = rest, int(length.strip() or 0)
        state["buffer"] = buffer

    def release(self) -> None:
        """Send the held requests on, and every later one at once."""
        self._released.set()

    def take(self) -> tuple[int, list[tuple[str, str]]]:
        """The bytes received and the requests made since the last take."""
        with self._lock:
            n, self.received = self.received, 0
            asked, self.requests = self.requests, []
            self.by_client = {}
        return n, asked


@pytest.fixture(scope="session")
def s3():
    """The server, started once for the session (the store clients of this process keep their endpoint),
    with the environment set for this process and its children."""
    yield from session_server(S3Server(outlives_tests=True))


def session_server(server):
    """Start ``server`` for the session, its ``environment()`` set for this process and its
    children (the fixtures of each store); stopped, and the environment put back, at the end."""
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


_ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                  b"<Message>Access Denied</Message><RequestId>phaseprof-tests</RequestId></Error>")


class Gate:
    """An HTTP relay on 127.0.0.1 to the store at ``port`` that answers every write (PUT, POST,
    DELETE) as S3 does when a policy denies it, 403 with S3's ``AccessDenied`` XML error, while
    ``deny_writes`` is set; reads pass. ``stop()``: the store is gone (connections refused)."""

    def __init__(self, port: int, deny_writes: bool = True):
        import http.server

        self.target = port
        self.deny_writes = deny_writes
        self.denied = 0
        self._connections: list[socket.socket] = []
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                gate._connections.append(self.connection)

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if gate.deny_writes and self.command in ("PUT", "POST", "DELETE"):
                    gate.denied += 1
                    self._answer(403, [("Content-Type", "application/xml")], _ACCESS_DENIED)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", gate.target, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                    dropped = ("content-length", "transfer-encoding", "connection", "server",
                               "date")
                    kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in dropped]
                    self._answer(answer.status, kept, data, answer.getheader("Content-Length"))
                finally:
                    upstream.close()

            def _answer(self, status: int, headers, data: bytes, length: str | None = None) -> None:
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                # a HEAD's answer names the object's length, and carries no body
                head = self.command == "HEAD" and length
                self.send_header("Content-Length", length if head else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = relay

        import http.client

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """No more connections: each is refused from now on, and those open are cut."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(30)
        for connection in self._connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class BlackHole:
    """A store that accepts connections and never answers: a TCP listener on 127.0.0.1 that accepts
    every connection, reads nothing and sends nothing, until `close`."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self._server.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                client, _ = self._server.accept()
                self._held.append(client)
                self.accepted += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._server.close()
        self._thread.join(30)
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()


def sizes(server: S3Server, bucket: str, prefix: str = "") -> dict[str, int]:
    """Each object's key under ``prefix`` (relative to it) and size."""
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"][len(prefix):]: o["Size"] for page in pages for o in page.get("Contents", [])}

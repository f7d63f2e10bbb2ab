"""The other object stores on the loopback, for the tests that `tests.s3` runs against S3: Google
Cloud Storage served by gcp-storage-emulator (pip, the ``test`` extra) and Azure Blob Storage by
Azurite (npm, pinned in tests/azurite/; ``npm ci --prefix tests/azurite`` installs it), each in a
process group of its own on a free port, in memory (a restart empties it, as moto's does). The
user's environment reaches them: ``STORAGE_EMULATOR_HOST`` for gcsfs, Azurite's documented
development account in ``AZURE_STORAGE_CONNECTION_STRING`` for adlfs. Nothing of phaseprof is
replaced. `store` runs a test once per store: s3://, gs:// and az://.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import processes
from tests.s3 import _buckets as s3_buckets
from tests.s3 import session_server

AZURITE = Path(__file__).with_name("azurite") / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's development account, as its documentation publishes it (no secret: every Azurite has it).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")

_GCS_SERVE = """
import sys
from gcp_storage_emulator.server import create_server
server = create_server("127.0.0.1", int(sys.argv[1]), in_memory=True)
server.start()
print("listening on", server._api._httpd.server_address[1], flush=True)
sys.stdin.read()  # until the test closes this pipe (or dies)
"""


class Emulator:
    """A store's emulator: ``start()``, ``stop()`` (the store goes away, its objects with it) and
    ``start()`` again on the same port; and what the tests do to a store as a user would (make a
    bucket, put, delete, list), through the store's own fsspec client."""

    scheme = ""
    #: What must never appear in a message the user sees (a credential).
    secrets: tuple[str, ...] = ()
    #: What `tensorboard` needs to read this store here.
    tensorboard_args: tuple[str, ...] = ()

    def __init__(self, outlives_tests: bool = False) -> None:
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._drain: threading.Thread | None = None
        self._outlives_tests = outlives_tests

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        """Start it and wait until it answers (its first line names the port it listens on)."""
        self._proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
        if self._outlives_tests:
            processes.outlives_tests(self._proc.pid)
        said = []
        for line in self._proc.stdout:
            said.append(line)
            if listening := re.search(r"listen\w* on \S*?(\d+)$", line.strip()):
                self.port = int(listening.group(1))
                # what it says from now on is read and dropped: a full pipe would stop it
                self._drain = threading.Thread(target=self._proc.stdout.read, daemon=True)
                self._drain.start()
                break
        else:
            self.stop()
            raise RuntimeError(f"the {self.scheme}:// emulator did not start: {''.join(said)[-2000:]}")
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {self.scheme}:// emulator does not answer") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(30)
        processes.no_longer_exempt(self._proc.pid)
        if self._drain is not None:
            self._drain.join(30)  # at the end of its output now
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._proc = None

    def environment(self, endpoint: str = "") -> dict[str, str]:
        """What points a client at ``endpoint`` (this emulator's by default)."""
        raise NotImplementedError

    def fs(self):
        """A client of its own (fsspec's instance cache would hand back one from before a restart)."""
        import fsspec

        return fsspec.filesystem(self.scheme, skip_instance_cache=True)

    def url(self, bucket: str, prefix: str) -> str:
        return f"{self.scheme}://{bucket}/{prefix}"

    def create_bucket(self, bucket: str) -> None:
        self.fs().mkdir(bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.fs().pipe_file(f"{bucket}/{key}", data)

    def delete(self, bucket: str, key: str) -> None:
        self.fs().rm_file(f"{bucket}/{key}")

    def upload_tree(self, local: os.PathLike, bucket: str, prefix: str) -> list[str]:
        """Copy a local logdir under ``prefix`` of ``bucket``, a file at a time."""
        fs, keys = self.fs(), []
        for directory, _, files in os.walk(local):
            for name in files:
                path = os.path.join(directory, name)
                key = "/".join([prefix, os.path.relpath(path, local).replace(os.sep, "/")])
                fs.put_file(path, f"{bucket}/{key}")
                keys.append(key)
        return sorted(keys)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        found = self.fs().find(f"{bucket}/{prefix}".rstrip("/"), withdirs=False)
        return sorted(k.partition("/")[2] for k in found)


class GcsEmulator(Emulator):
    """gcp-storage-emulator, in a Python process of its own."""

    scheme = "gs"
    #: TensorBoard reads gs:// logdirs with its data server (``--load_fast``), whose own GCS client
    #: knows only Google's endpoint, not ``STORAGE_EMULATOR_HOST``: here it reads through fsspec
    tensorboard_args = ("--load_fast=false",)

    def command(self) -> list[str]:
        return [sys.executable, "-c", _GCS_SERVE, str(self.port)]

    def environment(self, endpoint: str = "") -> dict[str, str]:
        # Google's clients ask a metadata server for credentials: pointed at a closed loopback
        # port, they find none at once and go on without any (the emulator wants none)
        nowhere = "127.0.0.1:9"
        return {"STORAGE_EMULATOR_HOST": endpoint or self.endpoint, "NO_GCE_CHECK": "true",
                "GCE_METADATA_HOST": nowhere, "GCE_METADATA_IP": nowhere,
                "GOOGLE_CLOUD_PROJECT": "phaseprof-tests"}


class Azurite(Emulator):
    """Azurite's Blob service (``azurite-blob``), in memory."""

    scheme = "az"
    secrets = (AZURITE_KEY,)

    def command(self) -> list[str]:
        if not AZURITE.exists():
            raise RuntimeError(f"{AZURITE} is missing: npm ci --prefix tests/azurite")
        return [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--silent"]

    def environment(self, endpoint: str = "") -> dict[str, str]:
        connection = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                      f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint or self.endpoint}/{AZURITE_ACCOUNT};")
        return {"AZURE_STORAGE_CONNECTION_STRING": connection}


@pytest.fixture(scope="session")
def gcs():
    yield from session_server(GcsEmulator(outlives_tests=True))


@pytest.fixture(scope="session")
def azurite():
    if shutil.which("node") is None:
        raise RuntimeError("Azurite needs Node.js: apt-get install nodejs npm")
    yield from session_server(Azurite(outlives_tests=True))


#: The stores `store` runs a test against, and their fixtures.
STORES = {"s3": "s3", "gs": "gcs", "az": "azurite"}


@pytest.fixture(params=list(STORES))
def store(request):
    """Each store in turn (s3://, gs://, az://), started for the session."""
    return request.getfixturevalue(STORES[request.param])


@pytest.fixture
def store_bucket(store):
    """A new empty bucket (a container in Azure's words) in `store`; named from the one count the
    `bucket` fixture uses too, so two tests never share a bucket of the session's S3 server."""
    name = f"logs{next(s3_buckets)}"
    store.create_bucket(name)
    return name

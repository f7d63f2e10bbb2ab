"""Shared fixtures: the recorded traces in tests/data, and real TensorBoard servers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Tests read their traces afresh: no analysis cache is read or written beside fixtures (the cache's
# own tests turn it on). Subprocesses (the CLI, TensorBoard) inherit this.
os.environ["PHASEPROF_CACHE"] = "off"
DATA = ROOT / "tests" / "data"


class Traces:
    """The traces under tests/data (see its README): ``traces.folder("cpu", "base")``,
    ``traces.files("gpu", "hta_sampled_2rank")``. Asking for one that is not there fails the test:
    a missing fixture must never pass for a test that ran."""

    root = DATA

    def folder(self, *parts: str) -> Path:
        """A scenario folder holding at least one trace."""
        self.files(*parts)
        return DATA.joinpath(*parts)

    def files(self, *parts: str) -> list[Path]:
        """The gzipped traces of a scenario folder, sorted by name (never empty)."""
        path = DATA.joinpath(*parts)
        found = sorted(path.glob("*.json.gz"))
        if not found:
            pytest.fail(f"test data missing: no trace in {path.relative_to(ROOT)} (see tests/data/README.md)",
                        pytrace=False)
        return found

    def all(self) -> list[Path]:
        """Every trace under tests/data."""
        found = sorted(DATA.rglob("*.json.gz"))
        if not found:
            pytest.fail(f"test data missing: no trace under {DATA.relative_to(ROOT)}", pytrace=False)
        return found


@pytest.fixture(scope="session")
def traces() -> Traces:
    return Traces()


class TensorBoard:
    """A real ``tensorboard --logdir … --port 0`` subprocess; ``url`` is where it serves."""

    def __init__(self, logdir: os.PathLike, *args: str):
        import re
        import subprocess
        import sys
        import threading
        import time

        self.log: list[str] = []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        found = threading.Event()
        self.url = ""
        self.started = time.monotonic()

        def read() -> None:
            for line in self._proc.stdout:
                self.log.append(line)
                m = re.search(r"(http://[^ ]+:\d+/)", line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(90):
            self.close()
            raise RuntimeError("tensorboard did not start:\n" + "".join(self.log))

    def get(self, path: str, timeout: float = 30):
        import urllib.request

        return urllib.request.urlopen(self.url.rstrip("/") + path, timeout=timeout)

    def json(self, path: str):
        with self.get(path) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except Exception:  # noqa: BLE001
            self._proc.kill()


@pytest.fixture
def tensorboard_server():
    """Start real TensorBoard servers: ``server = tensorboard_server(logdir, *flags)``; all are
    stopped at the end of the test."""
    started: list[TensorBoard] = []

    def start(logdir, *args):
        tb = TensorBoard(logdir, *args)
        started.append(tb)
        return tb

    yield start
    for tb in started:
        tb.close()

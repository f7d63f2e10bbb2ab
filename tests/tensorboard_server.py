"""A real ``tensorboard --logdir … --port 0`` process, for the end-to-end and browser tests and the
benchmarks (``benchmarks/_measure.py``), and waiting for phaseprof's loading to finish."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

RUNS = "/data/plugin/phaseprof/runs"


def _interruptible() -> None:
    """Ctrl-C reaches TensorBoard as it would from a terminal, even when the tests themselves run in
    a shell's background job (which starts them with SIGINT ignored, a disposition children inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class TensorBoard:
    """``tensorboard --logdir LOGDIR --port 0 *args`` run by ``python``; ``url`` is where it serves,
    ``log`` what it printed."""

    def __init__(self, logdir: os.PathLike | str, *args: str, python: str = sys.executable, cwd: str | None = None,
                 env: dict[str, str] | None = None, start_timeout: float = 120):
        self.log: list[str] = []
        self.url = ""
        self.started = time.monotonic()
        self._proc = subprocess.Popen([python, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", "0", *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                      env=None if env is None else {**os.environ, **env},
                                      preexec_fn=_interruptible)
        found = threading.Event()

        def read() -> None:
            for line in self._proc.stdout:
                self.log.append(line)
                m = re.search(r"(http://[^ ]+:\d+/)", line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(start_timeout):
            self.close()
            raise RuntimeError("tensorboard did not start:\n" + "".join(self.log))

    @property
    def proc(self) -> subprocess.Popen:
        return self._proc

    def open(self, path: str, timeout: float = 60):
        """The response to ``GET path`` (raises `urllib.error.HTTPError` for an error status)."""
        return urllib.request.urlopen(self.url.rstrip("/") + path, timeout=timeout)

    def json(self, path: str):
        with self.open(path) as r:
            return json.loads(r.read())

    def wait_loaded(self, files: int = 1, timeout: float = 300) -> dict:
        """The `/runs` answer once at least ``files`` trace files are known and every one is loaded."""
        return wait_loaded(lambda: self.json(RUNS), files, timeout)

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(30)


@contextmanager
def loaded(logdir: os.PathLike | str, *args: str, files: int = 1, **options) -> Iterator[TensorBoard]:
    """A `TensorBoard` on ``logdir`` once at least ``files`` traces are known and all are loaded;
    stopped on leaving."""
    tb = TensorBoard(logdir, *args, **options)
    try:
        tb.wait_loaded(files)
        yield tb
    finally:
        tb.close()


def wait_loaded(runs: Callable[[], dict], files: int = 1, timeout: float = 300) -> dict:
    """Poll ``runs()`` (a `/runs` answer) until at least ``files`` trace files are known and all are
    loaded (ready or failed); returns that answer. The deadline is generous: it only turns a hang into
    a failure, on however loaded a machine."""
    deadline = time.monotonic() + timeout
    while True:
        answer = runs()
        loading = answer["loading"]
        if loading["files"] >= files and loading["done"] == loading["files"]:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"traces not loaded in {timeout} s: {loading}")
        time.sleep(0.2)

"""Shared fixtures: the recorded traces in tests/data, real TensorBoard servers
(`tests.tensorboard_server`), and the check that no process a test starts outlives it
(`tests.processes`)."""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.tensorboard_server import TensorBoard

ROOT = Path(__file__).resolve().parent.parent

# Tests read their traces afresh: no analysis cache is read or written beside fixtures (the cache's
# own tests turn it on). Subprocesses (the CLI, TensorBoard) inherit this.
os.environ["PHASEPROF_CACHE"] = "off"
DATA = ROOT / "tests" / "data"
processes.become_subreaper()  # a process whose parent a test killed stays in view

# The tests start hundreds of Python processes (the CLI, TensorBoard, training jobs). Where the
# environment sets PYTHONDONTWRITEBYTECODE, each would compile phaseprof's modules again (~1 s of CPU
# a process): compile them once here; Python still reads bytecode under that setting.
if sys.dont_write_bytecode:
    for package in ("phaseprof", "plugin", "training_hooks"):
        compileall.compile_dir(ROOT / package, quiet=1)


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    """Fails a test that leaves a process running: its new descendants get `processes.LEFTOVER_S` to
    exit on their own, then are killed and named. Set up after the fixtures of wider scope (a
    module's browser is no process of the test's) and before, so torn down after, the test's other
    fixtures (a TensorBoard server they started is stopped before the check)."""
    before = processes.running_descendants()
    yield
    left = processes.left_behind(before)
    if left:
        waited = f"{processes.LEFTOVER_S:.0f} s"
        pytest.fail(f"process(es) this test started still ran {waited} after it ended, now killed: "
                    + "; ".join(left), pytrace=False)


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


@pytest.fixture
def tensorboard_server():
    """Start real TensorBoard servers: ``server = tensorboard_server(logdir, *flags, env={...})``; all
    are stopped at the end of the test."""
    started: list[TensorBoard] = []

    def start(logdir, *args, **options):
        tb = TensorBoard(logdir, *args, **options)
        started.append(tb)
        return tb

    yield start
    for tb in started:
        tb.close()


from tests.s3 import bucket, s3  # noqa: E402, F401 - fixtures: a real S3 server on the loopback, a bucket in it
from tests.stores import azurite, gcs, store, store_bucket  # noqa: E402, F401 - gs:// and az:// too

"""The tests' own machinery stops what it starts: a torchrun job is killed with its ranks, and a
test that leaves a process running (even one whose parent already exited) fails, naming it, and the
process is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import processes
from tests.capture_job import Job

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def gone(pid: int, deadline_s: float = 120) -> bool:
    """Whether ``pid`` has exited (a zombie counts) within the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_killing_a_torchrun_job_kills_its_ranks(tmp_path):
    job = Job(tmp_path, ranks=2, active=3, step_s=0.02)
    try:
        job.ready()
        ranks = processes.children(job.proc.pid)  # torchrun's agent starts the ranks
        assert len(ranks) == 2
    finally:
        job.kill()
    assert [pid for pid in ranks if not gone(pid)] == []


def test_a_process_left_running_fails_the_test_that_started_it_and_is_killed(tmp_path):
    said = tmp_path / "leaked.pid"
    env = {**os.environ, "PHASEPROF_TEST_LEAK": str(said), "PHASEPROF_TEST_LEFTOVER_S": "2"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-o",
            "python_functions=leaves_*",  # the inner test, which the suite itself never collects
            f"{__file__}::leaves_a_process_running",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 passed, 1 error" in done.stdout, done.stdout[-3000:]
    assert "still ran 2 s after it ended, now killed" in done.stdout, done.stdout[-3000:]
    orphan = int(said.read_text())
    assert f"{orphan} sleep 3600" in done.stdout, done.stdout[-3000:]
    assert gone(orphan)


def leaves_a_process_running():
    """Run by the test above, in a pytest of its own (named so that the suite does not collect it):
    starts ``sleep`` from a shell that exits at once, so its parent is gone when the test ends."""
    started = subprocess.run(
        ["sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    with open(os.environ["PHASEPROF_TEST_LEAK"], "w") as fh:
        fh.write(started.stdout.strip())

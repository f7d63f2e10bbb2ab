"""A training process that forks (a ``fork`` multiprocessing Pool, ended by ``terminate()``, which
sends its workers SIGTERM; a child that runs its atexit handlers): the children never close, end or
signal the parent's profiler, uploader or heartbeat; the parent's run goes on intact, with one
summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from phaseprof.contract import CAPTURE_DIR, TRACE_FILE_RE
from tests.child_loop import TINY_LOOP

pytestmark = pytest.mark.slow

TRAIN = (
    textwrap.dedent("""
    import json, multiprocessing, os, sys, time
    import torch
    from phaseprof import PhaseProfiler

    logdir, out = sys.argv[1], sys.argv[2]
    beat = os.path.join(logdir, "r", *%(capture)r.split("/"), "rank0.json")

    def busy(x):
        time.sleep(3600)  # still at work when the pool is terminated

    def square(x):
        return x * x

    %(loop)s

    prof = PhaseProfiler(logdir=logdir, run="r", wait=0, warmup=1, active=2, repeat=2)
    prof.attach(model, optimizer)
    train(3)  # the first trace
    pool = multiprocessing.get_context("fork").Pool(2)
    assert pool.map(square, range(4)) == [0, 1, 4, 9]
    pool.map_async(busy, range(2))  # one worker busy, one idle: both get SIGTERM
    time.sleep(0.5)
    pool.terminate()
    pool.join()
    print("joined", flush=True)
    child = os.fork()  # a child that ends as a Python program does: its atexit handlers run
    if child == 0:
        import atexit
        atexit._run_exitfuncs()
        os._exit(0)  # not exit(): torch's profiler library hangs in its C++ destructors here
    assert os.waitpid(child, 0)[1] == 0
    train(3)  # the second trace, after the children are gone
    beats = []
    deadline = time.monotonic() + 300  # the heartbeat, rewritten after the pool ended
    while "://" not in logdir and (not beats or beats[-1]["step"] < prof.step_num):
        assert time.monotonic() < deadline, "no heartbeat"
        if os.path.exists(beat):
            beats.append(json.load(open(beat)))
        time.sleep(0.1)
    prof.close()
    json.dump({"pid": os.getpid(), "beat": beats[-1] if beats else None}, open(out, "w"))
""")
    % {"capture": CAPTURE_DIR, "loop": TINY_LOOP}
)


def run_forking_loop(logdir: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    """The loop in a subprocess of its own session; a hang is killed with its group, and fails."""
    out = tmp_path / "out.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAIN, logdir, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"the parent never got past pool.join() or close(): {stdout[-2000:]} {stderr[-3000:]}"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), json.loads(
        out.read_text()
    )


def assert_one_summary(out: str) -> None:
    assert out.count("joined") == 1
    assert out.count("step(s) timed") == 1, out
    assert "phaseprof run r: 6 step(s) timed, 2 trace file(s) written" in out, out
    assert "not done" not in out, out


def test_a_forked_pool_terminated_leaves_the_parents_local_run_intact(tmp_path):
    done, seen = run_forking_loop(str(tmp_path / "profile"), tmp_path)
    assert_one_summary(done.stdout)
    assert (
        seen["beat"] is not None and seen["beat"]["ended"] is False
    )  # alive until the parent closed
    run_dir = tmp_path / "profile" / "r"
    ended = json.loads((run_dir / CAPTURE_DIR / "rank0.json").read_text())
    assert ended["ended"] is True and ended["step"] == 6
    traces = [p for p in run_dir.iterdir() if TRACE_FILE_RE.search(p.name)]
    assert len(traces) == 2 and all(str(seen["pid"]) in p.name for p in traces)
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1


def test_a_forked_pool_terminated_leaves_the_parents_run_in_a_store_intact(
    s3, bucket, tmp_path, monkeypatch
):
    monkeypatch.setenv("PHASEPROF_STAGING", str(tmp_path / "staging"))
    done, seen = run_forking_loop(f"s3://{bucket}/prof", tmp_path)
    assert_one_summary(done.stdout)
    keys = s3.keys(bucket, "prof/r/")
    traces = [k for k in keys if TRACE_FILE_RE.search(k)]
    assert len(traces) == 2 and all(str(seen["pid"]) in k for k in traces), keys
    assert len([k for k in keys if "events.out.tfevents." in k]) == 1, keys
    assert (
        list((tmp_path / "staging").iterdir()) == []
    )  # every file confirmed uploaded, staging removed

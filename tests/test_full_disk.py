"""A logdir on a disk that fills while the run goes on (a 64 KiB tmpfs, filled by another file, then
emptied): one warning, each cause once in the summary with its count, no temporary file left, every
step timed, and every step's scalars in the event file once there is room again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid

import pytest

from phaseprof.contract import CAPTURE_DIR, STEP_TAG
from tests.child_loop import TINY_LOOP
from tests.test_training_hooks import read_scalars

pytestmark = pytest.mark.slow

TRAIN = (
    textwrap.dedent("""
    import errno, json, os, sys, time, warnings
    import torch
    from phaseprof import PhaseProfiler

    logdir = sys.argv[1]
    beat = os.path.join(logdir, "r", *%(capture)r.split("/"), "rank0.json")
    %(loop)s

    def beat_step():
        try:
            with open(beat) as fh:
                return json.load(fh)["step"]
        except (OSError, ValueError):
            return -1

    def wait_for(done):  # without training: the event file grows with every step
        deadline = time.monotonic() + 300
        while not done():
            assert time.monotonic() < deadline
            time.sleep(0.05)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the three traces (steps 20-23, 44-47, 68-71) fall in the time the disk is full
        prof = PhaseProfiler(logdir=logdir, run="r", wait=20, warmup=1, active=3, repeat=3)
        prof.attach(model, optimizer)
        train(6)
        wait_for(lambda: beat_step() >= 5)  # scalars and the heartbeat are on disk
        filler = os.path.join(logdir, "filler")
        with open(filler, "wb", buffering=0) as fh:  # the disk fills
            try:
                while True:
                    fh.write(b"x" * 512)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        train(80)
        for _ in range(2):  # two looks of the capture watcher at least, whatever the load
            prof._capture.tick()
        os.remove(filler)  # room again
        freed_at = prof.step_num
        train(1)
        wait_for(lambda: beat_step() > freed_at)  # the heartbeat is written again
        train(5)
        prof.close()
    ours = [str(w.message) for w in caught if str(w.message).startswith("phaseprof")]
    print(json.dumps({"steps": prof.step_num, "full": freed_at, "warnings": ours}))
""")
    % {"capture": CAPTURE_DIR, "loop": TINY_LOOP}
)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs, unmounted at the end. Mounting it needs root, as the project's machines and
    CI run the suite; elsewhere the test fails and says so (the suite skips nothing)."""
    where = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a small tmpfs here (run as root): {mounted.stderr.strip()}",
            pytrace=False,
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a small tmpfs is Linux's")
def test_a_disk_that_fills_and_empties_loses_no_step_and_leaves_no_temporary_file(small_disk):
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, str(small_disk)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "1000"},
    )  # the summary's lines unwrapped
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    out = done.stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert len(seen["warnings"]) == 1, seen["warnings"]
    steps = seen["steps"]
    assert f"phaseprof run r: {steps} step(s) timed" in out, out
    # each cause once, however often it failed: a full disk fails every tick of the capture watcher
    causes = [
        re.sub(r" \(\d+ times\)$", "", line)
        for line in out.splitlines()
        if line.startswith("not done:")
    ]
    assert causes and len(causes) == len(set(causes)), out
    assert len([c for c in causes if "capture channel failed" in c]) == 1, out
    assert re.search(
        r"capture channel failed: OSError: .*No space left on device.* \(\d+ times\)", out
    ), out
    left = [
        os.path.relpath(os.path.join(d, f), small_disk)
        for d, _, files in os.walk(small_disk)
        for f in files
        if f.endswith((".tmp", ".part"))
    ]
    assert left == []
    run_dir = small_disk / "r"
    assert [step for step, _ in read_scalars(run_dir)[STEP_TAG]] == list(range(steps))
    assert json.loads((run_dir / CAPTURE_DIR / "rank0.json").read_text())["ended"] is True

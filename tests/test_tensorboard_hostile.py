"""A real TensorBoard on a hostile logdir: FIFOs named like traces, a gzip bomb, names that are not
UTF-8, a large trace still loading when TensorBoard is told to stop."""

from __future__ import annotations

import os
import signal
import time
import urllib.parse

import pytest

from tests.hostile import encode, training_trace, write
from tests.logdir import settled

pytestmark = pytest.mark.slow

RUNS = "/data/plugin/phaseprof/runs"


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def big_trace(path, events: int = 400_000) -> None:
    """A plain trace of ``events`` ops in one step: a few seconds of loading."""
    op = '{"ph":"X","cat":"cpu_op","name":"aten::op%d","pid":100,"tid":100,"ts":%d,"dur":1,"args":{}}'
    body = ",".join(op % (i % 50, 10 + 2 * i) for i in range(events))
    step = '{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":100,"tid":100,"ts":0,"dur":%d,"args":{}}'
    write(path, ('{"traceEvents":[' + step % (2 * events + 20) + "," + body + "]}").encode())


def hostile_logdir(root) -> None:
    write(root / "good" / "w.1.pt.trace.json.gz", encode(training_trace(3), gz=True))
    os.makedirs(root / "fifos")
    os.mkfifo(root / "fifos" / "a.1.pt.trace.json")
    os.mkfifo(root / "fifos" / "b.2.pt.trace.json.gz")
    spaces = __import__("gzip").compress(b" " * (1 << 20), 9)
    write(root / "bomb" / "w.1.pt.trace.json.gz", __import__("gzip").compress(b'{"traceEvents": [', 9) + spaces * 1024)
    odd = os.path.join(os.fsencode(root), b"odd\xff")
    os.makedirs(odd)
    write(os.fsdecode(os.path.join(odd, b"w\xfe.1.pt.trace.json")), encode(training_trace(2)))
    for dirpath, _, files in os.walk(root):
        for name in files:
            settled(os.path.join(dirpath, name))


def wait_loaded(tb, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = tb.json(RUNS)
        if runs["loading"]["files"] >= 5 and runs["loading"]["done"] == runs["loading"]["files"]:
            return runs
        time.sleep(0.2)
    raise AssertionError(f"not loaded in {timeout} s: {runs}")


def test_hostile_logdir_good_runs_load_and_bad_files_are_reported(tmp_path, tensorboard_server):
    hostile_logdir(tmp_path)
    tb = tensorboard_server(tmp_path)
    runs = wait_loaded(tb)
    by_name = {r["run"]: r for r in runs["runs"]}
    assert set(by_name) == {"good", "fifos", "bomb", "odd\\xff"}
    for name in ("good", "odd\\xff"):
        (worker,) = by_name[name]["workers"]
        assert [s["state"] for s in worker["spans"]] == ["ready"], name
    errors = {e["path"]: e["error"] for e in runs["errors"]}
    assert errors[os.path.join("fifos", "a.1.pt.trace.json")].startswith("not a regular file (a FIFO)")
    assert errors[os.path.join("fifos", "b.2.pt.trace.json.gz")].startswith("not a regular file (a FIFO)")
    assert errors[os.path.join("bomb", "w.1.pt.trace.json.gz")].startswith("inflates past ")
    steps = tb.json("/data/plugin/phaseprof/steps?run=" + urllib.parse.quote("odd\\xff"))
    assert [s["step"] for s in steps["steps"]] == [1, 2]
    for route in ("steps?run=fifos", "steps?run=bomb", "ranks?run=fifos", "compare?run=bomb&a=1&b=2"):
        try:
            tb.get("/data/plugin/phaseprof/" + route).close()
        except __import__("urllib.error").error.HTTPError as e:
            assert e.code in (400, 404), (route, e.code)
    assert "Traceback" not in "".join(tb.log)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_tensorboard_stops_within_two_seconds_while_loading_and_leaves_no_process(tmp_path, tensorboard_server, sig):
    hostile_logdir(tmp_path)
    for i in range(3):
        big_trace(tmp_path / "big" / f"w{i}.1.pt.trace.json")
        settled(tmp_path / "big" / f"w{i}.1.pt.trace.json")
    tb = tensorboard_server(tmp_path)
    deadline = time.monotonic() + 60
    while not descendants(tb._proc.pid) and time.monotonic() < deadline:
        tb.json(RUNS)  # loading starts in worker processes
        time.sleep(0.1)
    time.sleep(1.0)  # well inside a load
    workers = descendants(tb._proc.pid)
    assert workers, "no loading process started"
    assert tb.json(RUNS)["loading"]["done"] < 8  # still loading
    start = time.monotonic()
    tb._proc.send_signal(sig)
    tb._proc.wait(10)
    took = time.monotonic() - start
    time.sleep(0.5)  # the kernel delivers parent-death signals asynchronously
    assert took < 2.0, f"TensorBoard took {took:.2f} s to exit"
    assert not [p for p in workers if alive(p)], "loading processes outlived TensorBoard"

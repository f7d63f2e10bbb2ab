"""A real TensorBoard on a hostile logdir: FIFOs named like traces, a gzip bomb, names that are not
UTF-8, large traces still loading when TensorBoard is told to stop."""

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


def test_hostile_logdir_good_runs_load_and_bad_files_are_reported(tmp_path, tensorboard_server):
    hostile_logdir(tmp_path)
    tb = tensorboard_server(tmp_path)
    runs = tb.wait_loaded(files=5)
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
            tb.open("/data/plugin/phaseprof/" + route).close()
        except __import__("urllib.error").error.HTTPError as e:
            assert e.code in (400, 404), (route, e.code)
    assert "Traceback" not in "".join(tb.log)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_tensorboard_stops_while_loading_without_waiting_for_the_loads_and_leaves_no_process(
        tmp_path, tensorboard_server, sig):
    """Stopped in the middle of loading, TensorBoard ends at once: the loads under way are abandoned
    (none finishes: its analysis would be cached beside its trace), and no loading process is left.
    Judged by what happened, not by a clock, so that it holds on a loaded machine."""
    from phaseprof.contract import ANALYSIS_DIR

    hostile_logdir(tmp_path)
    big = [tmp_path / "big" / f"w{i}.1.pt.trace.json" for i in range(3)]
    for path in big:
        big_trace(path, events=800_000)  # seconds of loading each
        settled(path)
    tb = tensorboard_server(tmp_path, env={"PHASEPROF_CACHE": ""})  # a finished load leaves its entry
    deadline = time.monotonic() + 300
    while True:  # until a loading process works on a big trace
        runs = tb.json(RUNS)
        loading = [s["file"] for r in runs["runs"] if r["run"] == "big" for w in r["workers"] for s in w["spans"]
                   if s["state"] == "loading"]
        workers = descendants(tb.proc.pid)
        if loading and workers:
            break
        assert time.monotonic() < deadline, f"no big trace started loading: {runs}"
        time.sleep(0.1)
    tb.proc.send_signal(sig)
    # a generous deadline (a TensorBoard that waited for its loads is caught below, by the analyses
    # those loads would have written, not by this clock)
    tb.proc.wait(600)
    deadline = time.monotonic() + 300  # parent-death signals arrive asynchronously
    while [p for p in workers if alive(p)]:
        assert time.monotonic() < deadline, "loading processes outlived TensorBoard"
        time.sleep(0.1)
    finished = [name for name in loading if (tmp_path / "big" / ANALYSIS_DIR / f"{name}.analysis").exists()]
    assert not finished, f"TensorBoard waited for the loads under way: {finished}"

"""Analysis at the source: PhaseProfiler compresses and analyses each trace it writes in a background
process and stores the analysis beside it, where TensorBoard and the report find it."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from zlib_ng import gzip_ng

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import ANALYSIS_DIR
from phaseprof.trace_files import compress_into_place
from phaseprof.training_hooks.faults import Faults
from phaseprof.training_hooks.source_analysis import SourceAnalysis
from tests.timing import train_step


def train(logdir, **options) -> PhaseProfiler:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in range(12)]
    prof = PhaseProfiler(logdir=str(logdir), run="r", wait=1, warmup=1, active=3, repeat=2, **options)
    prof.attach(model, optimizer)
    for x, y in prof.data(batches):
        train_step(model, optimizer, x, y, F.cross_entropy)
    prof.close()
    return prof


def finished(process: subprocess.Popen, deadline_s: float = 300) -> int:
    """The exit status of a background process, lifted out of idle priority whenever seen there: at
    idle priority it runs only on CPU time nothing else wants, which a machine running CPU hogs
    beside the tests never has. (Lifting needs root, or a nice limit that allows it; a machine
    where it is refused is left to give the process its idle time.)"""
    deadline = time.monotonic() + deadline_s
    while True:
        with contextlib.suppress(OSError):  # gone already, or not ours to lift
            if os.sched_getscheduler(process.pid) == os.SCHED_IDLE:
                os.sched_setscheduler(process.pid, os.SCHED_OTHER, os.sched_param(0))
        try:
            return process.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            assert time.monotonic() < deadline, f"{process.args} still running after {deadline_s:.0f} s"


def test_each_trace_is_analysed_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "")  # the cache on, for the profiler's analyses and the reader
    prof = train(tmp_path)
    for process in prof._traces.background.running:
        assert finished(process) == 0
    traces = sorted(os.path.basename(p) for p in prof._traces.written)
    assert len(traces) == 2
    entries = tmp_path / "r" / ANALYSIS_DIR
    assert sorted(p.name for p in entries.glob("*.analysis")) == [t + ".analysis" for t in traces]
    stamps = {p.name: p.stat().st_mtime_ns for p in entries.glob("*.analysis")}

    report = analyze(str(tmp_path))  # from the entries
    assert {p.name: p.stat().st_mtime_ns for p in entries.glob("*.analysis")} == stamps  # read, not rewritten
    monkeypatch.setenv("PHASEPROF_CACHE", "off")
    assert report == analyze(str(tmp_path))  # what reading the traces afresh gives
    assert [s["step"] for s in report["runs"][0]["workers"][0]["steps"]] == [2, 3, 4, 7, 8, 9]


def test_off_with_a_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "")
    prof = train(tmp_path, analyze_traces=False)
    assert not prof._traces.background.analyse
    assert len(prof._traces.written) == 2
    assert not list((tmp_path / "r" / ANALYSIS_DIR).glob("*.analysis"))  # (it holds the capture channel)


def test_the_loop_exports_and_a_background_process_compresses(tmp_path, monkeypatch):
    """The training process only exports each trace; the gzip is written by the background process,
    and is in place, whole, when close() returns, readable by the standard library's gzip."""
    compressed_here = []
    real_open = gzip_ng.open
    monkeypatch.setattr(gzip_ng, "open", lambda *a, **k: compressed_here.append(a) or real_open(*a, **k))
    prof = train(tmp_path, analyze_traces=False)
    assert compressed_here == []
    assert len(prof._traces.written) == 2
    for trace in prof._traces.written:
        assert trace.endswith(".pt.trace.json.gz")
        with gzip.open(trace, "rb") as f:
            assert json.load(f)["traceEvents"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir() if ".pt.trace." in p.name) == sorted(
        os.path.basename(t) for t in prof._traces.written)  # no export or partial file left


def test_a_trace_is_compressed_in_the_loop_when_no_process_can_start(tmp_path, monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.warns(RuntimeWarning, match="could not start the background process"):
        prof = train(tmp_path)
    assert len(prof._traces.written) == 2 and all(os.path.isfile(t) for t in prof._traces.written)
    assert [s["step"] for s in analyze(str(tmp_path))["runs"][0]["workers"][0]["steps"]] == [2, 3, 4, 7, 8, 9]


# -- the background processes on their own: a stand-in for Popen, no training loop -----------------


class Process:
    """A stand-in for the background process: records its command; ``work`` is what it does when
    started (compress the trace it is given, or nothing), ``returncode`` None while it runs."""

    made: list[Process] = []
    work = staticmethod(lambda command: None)
    returncode_at_start: int | None = 0
    release: threading.Event | None = None  # set: Popen returns only once the test releases it

    def __init__(self, command, **options) -> None:
        if self.release is not None:
            assert self.release.wait(60), "never released"
        self.args, self.options = command, options
        self.pid = 4242 + len(self.made)
        self.returncode = self.returncode_at_start
        self.waited: list[float] = []
        self.made.append(self)
        self.work(command)

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.waited.append(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


@pytest.fixture
def processes(monkeypatch):
    """Popen replaced by `Process`, its class attributes reset; waits for the threads that start
    them."""
    monkeypatch.setattr(subprocess, "Popen", Process)
    monkeypatch.setattr(Process, "made", [])
    yield Process
    if Process.release is not None:
        Process.release.set()
    for thread in threading.enumerate():
        if thread.name == "phaseprof-trace":
            thread.join(60)


def _started() -> None:
    """Waits until the threads that start the processes have ended."""
    for thread in threading.enumerate():
        if thread.name == "phaseprof-trace":
            thread.join(60)


def _exported(tmp_path, text: str = '{"traceEvents": []}') -> str:
    path = tmp_path / "w.1.pt.trace.json.part"
    path.write_text(text)
    return str(path)


def _background(command) -> None:
    """What `phaseprof cache --background --compress` does first."""
    if "--compress" in command:
        compress_into_place(command[command.index("--compress") + 1])


def test_a_trace_to_analyse_is_handed_to_one_quiet_background_process(tmp_path, processes):
    background = SourceAnalysis(Faults(str(tmp_path)))
    background.start(str(tmp_path / "w.1.pt.trace.json.gz"))
    background.wait_for_analyses(60)
    (process,) = processes.made
    assert process.args == [sys.executable, "-m", "phaseprof.cli", "cache", "--background",
                            str(tmp_path / "w.1.pt.trace.json.gz")]
    # nothing it prints reaches the training's terminal, nothing it reads is the training's input
    assert process.options == dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, close_fds=True)
    quiet = SourceAnalysis(Faults(str(tmp_path)), analyse=False)
    quiet.start(str(tmp_path / "w.2.pt.trace.json.gz"))
    _started()
    assert len(processes.made) == 1  # analyses off: no process for a trace written compressed


def test_the_process_compresses_the_trace_then_analyses_it_unless_told(tmp_path, processes,
                                                                     monkeypatch):
    monkeypatch.setattr(Process, "work", staticmethod(_background))
    faults = Faults(str(tmp_path))
    background = SourceAnalysis(faults)
    exported = _exported(tmp_path)
    trace = background.compress(exported)
    assert trace == str(tmp_path / "w.1.pt.trace.json.gz")
    _started()
    background.wait_for_traces(deadline_s=1)  # compressed already, by its process
    with gzip.open(trace, "rt") as f:
        assert json.load(f) == {"traceEvents": []}
    assert not os.path.exists(exported) and faults.lines == []
    assert processes.made[0].args[-2:] == ["--compress", exported]

    monkeypatch.setattr(Process, "work", staticmethod(lambda command: None))
    SourceAnalysis(faults, analyse=False).compress(_exported(tmp_path))
    SourceAnalysis(faults, awaited=True).compress(_exported(tmp_path))
    _started()
    assert processes.made[1].args[-3:] == ["--compress", exported, "--no-analysis"]
    assert processes.made[2].args[-3:] == ["--compress", exported, "--awaited"]


def test_a_trace_whose_process_died_is_compressed_in_the_training_process(tmp_path, processes,
                                                                         monkeypatch):
    monkeypatch.setattr(Process, "returncode_at_start", 1)  # exits at once, the trace untouched
    faults = Faults(str(tmp_path))
    background = SourceAnalysis(faults)
    trace = background.compress(_exported(tmp_path, '{"traceEvents": [1]}'))
    background.wait_for_traces()
    with gzip.open(trace, "rt") as f:
        assert json.load(f) == {"traceEvents": [1]}
    assert os.listdir(tmp_path) == ["w.1.pt.trace.json.gz"] and faults.lines == []


def test_a_trace_is_compressed_here_when_no_process_starts_and_one_line_says_why(tmp_path,
                                                                                monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    faults = Faults(str(tmp_path))
    background = SourceAnalysis(faults)
    with pytest.warns(RuntimeWarning, match="could not start the background process"):
        trace = background.compress(_exported(tmp_path))
        _started()
    background.wait_for_traces(deadline_s=1)  # compressed already, on the thread
    assert os.listdir(tmp_path) == ["w.1.pt.trace.json.gz"] and os.path.isfile(trace)
    assert faults.lines == ["could not start the background process for w.1.pt.trace.json.part: "
                            "OSError: no more processes"]
    # a trace gone already (the process finished it after all) is no fault; one that cannot be
    # compressed is named
    background.compress(str(tmp_path / "gone.pt.trace.json.part"))
    os.mkfifo(tmp_path / "fifo.pt.trace.json.part")
    background.compress(str(tmp_path / "fifo.pt.trace.json.part"))
    _started()
    assert faults.lines[1:] == [
        "could not start the background process for gone.pt.trace.json.part: OSError: no more "
        "processes",
        "could not start the background process for fifo.pt.trace.json.part: OSError: no more "
        "processes",
        "could not compress fifo.pt.trace.json.part: ValueError: not a regular file (a FIFO); only "
        "a regular file is compressed"]


def test_close_waits_for_the_traces_until_its_deadline_then_names_those_still_compressing(
        tmp_path, processes, monkeypatch):
    monkeypatch.setattr(Process, "returncode_at_start", None)  # runs, never done
    faults = Faults(str(tmp_path))
    background = SourceAnalysis(faults)
    exported = _exported(tmp_path)
    background.compress(exported)
    _started()
    with pytest.warns(RuntimeWarning):
        background.wait_for_traces(deadline_s=0.2)
    assert faults.lines == ["w.1.pt.trace.json.gz is still being compressed by process 4242: "
                            "TimeoutError: not done after 0 s"]
    assert os.path.exists(exported)  # left to its process
    background.wait_for_traces(deadline_s=0.2)  # the traces waited for are forgotten
    assert len(faults.lines) == 1

    monkeypatch.setattr(Process, "release", threading.Event())  # Popen not returned yet ...
    later = threading.Timer(5, Process.release.set)  # ... for a while: close does not wait for it
    later.start()
    background.compress(exported)
    background.wait_for_traces(deadline_s=0.2)
    later.cancel()
    assert faults.lines[1] == ("w.1.pt.trace.json.gz is still being compressed by its process, "
                               "still starting: TimeoutError: not done after 0 s")


def test_the_threads_that_start_the_processes_are_named_and_never_keep_the_training_alive(
        tmp_path, processes, monkeypatch):
    """Named for phaseprof in a dump of the training's threads; daemons, so that a process that
    never starts cannot keep the training process from exiting."""
    monkeypatch.setattr(Process, "release", threading.Event())
    background = SourceAnalysis(Faults(str(tmp_path)))
    before = set(threading.enumerate())
    background.start(str(tmp_path / "a.pt.trace.json.gz"))
    background.compress(_exported(tmp_path))
    started = [t for t in threading.enumerate() if t not in before]
    assert [(t.name, t.daemon) for t in started] == [("phaseprof-trace", True)] * 2


def test_the_analyses_are_waited_for_until_their_deadline(tmp_path, processes, monkeypatch):
    monkeypatch.setattr(Process, "returncode_at_start", None)
    background = SourceAnalysis(Faults(str(tmp_path)), awaited=True)
    background.start(str(tmp_path / "a.pt.trace.json.gz"))
    background.start(str(tmp_path / "b.pt.trace.json.gz"))
    _started()
    first, second = processes.made
    assert first.args[-2:] == [str(tmp_path / "a.pt.trace.json.gz"), "--awaited"]
    assert background.running == [first, second]
    background.wait_for_analyses(30)
    # the first not done by the deadline: no more waiting
    assert len(first.waited) == 1 and 0 < first.waited[0] <= 30 and second.waited == []
    first.returncode = 0
    assert background.running == [second]
    background.wait_for_analyses(30)
    assert second.waited and 0 < second.waited[0] <= 30
    second.returncode = 0
    assert background.running == []
    background.start(str(tmp_path / "c.pt.trace.json.gz"))
    _started()
    assert background.running == [processes.made[2]]

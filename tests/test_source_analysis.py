"""Analysis at the source: PhaseProfiler compresses and analyses each trace it writes in a background
process and stores the analysis beside it, where TensorBoard and the report find it."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import time

import pytest
import torch
import torch.nn.functional as F
from zlib_ng import gzip_ng

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import ANALYSIS_DIR
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

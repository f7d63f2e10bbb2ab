"""Analysis at the source: PhaseProfiler analyses each trace it writes in a background process and
stores the analysis beside it, where TensorBoard and the report find it."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import ANALYSIS_DIR


def train(logdir, **options) -> PhaseProfiler:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in range(12)]
    prof = PhaseProfiler(logdir=str(logdir), run="r", wait=1, warmup=1, active=3, repeat=2, **options)
    prof.attach(model, optimizer)
    for x, y in prof.data(batches):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    prof.close()
    return prof


def test_each_trace_is_analysed_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "")  # the cache on, for the profiler's analyses and the reader
    prof = train(tmp_path)
    for process in prof._traces.analysis.running:
        assert process.wait(120) == 0
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
    assert prof._traces.analysis is None
    assert len(prof._traces.written) == 2
    assert not list((tmp_path / "r" / ANALYSIS_DIR).glob("*.analysis"))  # (it holds the capture channel)

"""A trace's last step cut by the trace's end is named and left out, as warm-up steps are.

The real case: a ResNet-50 trace (num_workers=4) whose last step held an 85 ms tail with no host
event, the GPU draining its queue until the trace ended; kept in, it made an "other, 99% untraced"
finding and a slow-step finding and raised the mean step by 6.7 ms. Here the second ResNet-50 span
of tests/data (steps 16..21) is cut the same way: the trace stops 90% into step 21, keeping the
device work already launched."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from phaseprof.cli.report import report
from phaseprof.plugin.analysis.memory_ops import memory_devices, run_memory
from phaseprof.plugin.analysis.operators import run_ops
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests.logdir import write_trace
from tests.test_findings import finding, kinds, summary_of
from tests.test_kernel_table import _rendered
from tests.tracebuilder import Loop

RESNET = "worker0.1623143566756.pt.trace.json.gz"  # steps 16..21 of ResNet-50 on a V100
DEVICE = {"Kernel", "Memcpy", "Memset"}
STOP_AT = 0.9  # of step 21's host window: in its optimizer, while the GPU runs ~25 ms behind


def _cut(traces, tmp_path):
    """The span with the trace stopped at `STOP_AT` of step 21: host events ending later are gone, and
    so is device work they launched; the step's marker ends with the trace (its last device work)."""
    source = traces.folder("gpu", "kineto_resnet50_num_workers_0") / RESNET
    trace = json.loads(gzip.decompress(source.read_bytes()))
    every = trace.pop("traceEvents")
    events = [e for e in every if e.get("ph") == "X"]
    mark = next(e for e in events if e["name"] == "ProfilerStep#21")
    stop = mark["ts"] + STOP_AT * mark["dur"]
    # memory events and the like: those before the stop
    other = [e for e in every if e.get("ph") != "X" and e.get("ts", stop) <= stop]
    host = [e for e in events if e["cat"] not in DEVICE and e is not mark and e["ts"] + e["dur"] <= stop]
    launched = {e["args"]["correlation"] for e in host if "correlation" in e.get("args", {})}
    device = [e for e in events if e["cat"] in DEVICE and e["args"].get("correlation") in launched]
    end = max(e["ts"] + e["dur"] for e in host + device)
    assert end - stop > 0.05 * (end - mark["ts"])  # the GPU drains its queue well past the last host event
    return write_trace(tmp_path / RESNET, [dict(mark, dur=end - mark["ts"])] + host + device + other,
                       **trace)


def _worker(path) -> Worker:
    (run,) = discover(str(path.parent))
    (f,) = [f for files in run.workers.values() for f in files]
    return Worker(f.worker, [analyze_file(f)])


@pytest.fixture(scope="module")
def cut(traces, tmp_path_factory):
    return _cut(traces, tmp_path_factory.mktemp("cut"))


def test_a_last_step_cut_by_the_trace_is_named_and_left_out_of_the_mean_and_findings(cut):
    w = _worker(cut)
    assert w.numbers == [16, 17, 18, 19, 20, 21] and w.cut.tolist() == [False] * 5 + [True]
    s = summary_of(cut)
    assert s.cut_steps == [21] and not s.warmup_steps
    note = finding(s, "cut-steps")
    assert note.evidence.steps == [21] and note.saving_ms is None
    assert note.evidence.step_wall_ms == pytest.approx(w.wall_us[5] / 1000, abs=0.001)
    assert "ended with the trace" in note.text
    # the mean, the noise and the findings are those of steps 16..20
    assert s.mean_wall_ms == pytest.approx(np.mean(w.wall_us[:5]) / 1000, abs=0.001)
    assert 21 not in (s.outliers or []) and s.slowest.step != 21
    assert 21 not in s.noise.slow and 21 not in s.noise.fast
    for f in s.findings:
        if f.kind != "cut-steps":
            assert f.evidence.step != 21 and 21 not in (f.evidence.steps or []), (f.kind, f.text)
    assert "slow-step" not in kinds(s) or finding(s, "slow-step").evidence.step != 21


def test_the_run_wide_tables_leave_the_cut_step_out_and_say_so(cut):
    ops = run_ops(_worker(cut))
    assert ops.left_out == [21] and ops.steps == 5
    assert ops.left_out_why == ("step 21 cut by the trace's end: left out, as the summary's means and "
                                "findings leave them out")


def test_the_memory_table_over_every_step_leaves_the_cut_step_out_and_says_so(cut):
    w = _worker(cut)
    answer = run_memory("r", w)
    assert answer.step is None and answer.steps == 5 and answer.left_out == [21]
    assert answer.left_out_why == ("step 21 cut by the trace's end: left out, as the summary's means and "
                                   "findings leave them out")
    # per device and op: the steps 16..20's own tables, events and bytes summed, peaks the highest
    expected: dict = {}
    for row in range(5):
        ref = w.refs[row]
        for d in memory_devices(ref.span, ref.index):
            for r in d.ops:
                e = expected.setdefault((d.device, r.op), [0, 0, 0, 0])
                e[0] += r.events
                e[1] += r.allocated_total
                e[2] = max(e[2], r.peak_total)
                e[3] = max(e[3], d.peak_bytes or 0)
    got = {(d.device, r.op): [r.events, r.allocated_total, r.peak_total, d.peak_bytes]
           for d in answer.devices for r in d.ops}
    assert got and got.keys() == expected.keys()
    for key, (events, allocated, peak, _) in expected.items():
        assert got[key][:3] == [events, allocated, peak], key
    for d in answer.devices:
        assert d.peak_bytes == max(v[3] for k, v in expected.items() if k[0] == d.device)
    ref = w.refs[5]
    assert any(d.ops for d in memory_devices(ref.span, ref.index))  # step 21 had memory of its own


def test_no_trace_in_the_test_data_has_a_cut_step(traces):
    # among them hta_nccl_16rank and hta_ns_resolution, whose GPU runs 90..160 ms past every step's host
    # window, the last step's too: their steps' windows close before the trace's device work ends
    for path in traces.all():
        assert not analyze_file_of(path).cut.any(), path


def analyze_file_of(path):
    (run,) = discover(str(path.parent))
    (f,) = [f for files in run.workers.values() for f in files if f.path == str(path)]
    return analyze_file(f)


def _trailing_loop() -> Loop:
    """Five steps whose GPU keeps up, then a step whose GPU work runs ~18 ms past its 2 ms host window."""
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 30_000, [("gemm", 1_000)] * 10))
    return loop.step(5, ("phaseprof::forward", 2_000, [("gemm", 2_000)] * 10))


def test_a_last_step_whose_window_closes_before_its_gpu_work_ends_is_not_cut(tmp_path):
    # its marker ends with its host work: the step is whole, the GPU runs on after it (as in every
    # step of hta_nccl_16rank); the trace ends with device work, but not where the step ends
    path = write_trace(tmp_path / "w.1.pt.trace.json", _trailing_loop().events)
    s = summary_of(path)
    assert not s.cut_steps and "cut-steps" not in kinds(s)
    assert not _worker(path).cut.any()


def test_a_last_step_whose_window_ends_with_the_trace_after_only_gpu_work_is_cut(tmp_path):
    loop = _trailing_loop()
    mark = next(e for e in loop.events if e.get("name") == "ProfilerStep#5")
    mark["dur"] = loop.gpu_free - mark["ts"]  # the profiler closed it when the trace ended
    path = write_trace(tmp_path / "w.1.pt.trace.json", loop.events)
    w = _worker(path)
    assert w.cut.tolist() == [False] * 5 + [True] and w.wall_us[5] > 10 * 2_000
    s = summary_of(path)
    assert s.cut_steps == [5] and s.mean_wall_ms == pytest.approx(30.0, abs=0.001)


def test_the_terminal_marks_the_cut_step_left_out_of_the_means(cut):
    text = _rendered(report(str(cut)))
    assert "t: cut by the trace's end, left out of the means" in " ".join(text.split())
    assert any(line.strip().startswith("21 t") for line in text.splitlines())

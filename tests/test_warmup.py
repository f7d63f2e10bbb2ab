"""Warm-up steps (one-off setup) are named and left out of every summary, as compiling steps are.

The real case: a trace whose first step took ~28x the median, spent creating streams, events and
cuDNN handles and searching cuDNN's algorithms. Kept in, it made the first finding "forward is 76%
of an 882 ms step". Here that step is prepended to a real ResNet-50 trace (tests/data/gpu)."""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np
import pytest

from phaseprof.cli.compare import compare_paths
from phaseprof.plugin.analysis.kernels import kernels_answer
from phaseprof.plugin.analysis.modules import modules_answer
from phaseprof.plugin.analysis.operators import run_ops
from phaseprof.plugin.analysis.ranks import ranks
from phaseprof.plugin.analysis.warmup import FAR, SETUP_SHARE, _of_the_others, warmup
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests.logdir import settled, write_trace
from tests.test_findings import finding, kinds, loop_summary, summary_of
from tests.tracebuilder import Loop

RESNET = "worker0.1623143089861.pt.trace.json.gz"  # steps 5..10 of ResNet-50 on a V100, num_workers=0

SETUP = [  # (name, offset µs, duration µs) inside the prepended step, on the loop's thread
    ("cudaStreamCreateWithFlags", 1_000, 900_000),
    ("cudaEventCreateWithFlags", 905_000, 400_000),
    ("cudnnCreate", 1_310_000, 600_000),
    ("cudnnFindConvolutionForwardAlgorithmEx", 2_000_000, 2_100_000),
]


def _resnet_with_a_warmup_step(traces, tmp_path, name=RESNET):
    """The first ResNet-50 span with a step 4 of one-off setup (~4.8 s, 28x the median) before step 5."""
    source = traces.folder("gpu", "kineto_resnet50_num_workers_0") / RESNET
    trace = json.loads(gzip.decompress(source.read_bytes()))
    events = trace.pop("traceEvents")
    first = next(e for e in events if e.get("name") == "ProfilerStep#5")
    pid, tid = first["pid"], first["tid"]
    start, dur = first["ts"] - 4_900_000, 4_800_000
    added = [{"ph": "X", "cat": "Operator", "name": "ProfilerStep#4", "pid": pid, "tid": tid, "ts": start, "dur": dur,
              "args": {}},
             {"ph": "X", "cat": "Operator", "name": "aten::cudnn_convolution", "pid": pid, "tid": tid,
              "ts": start + 1_990_000, "dur": 2_200_000, "args": {}}]
    added += [{"ph": "X", "cat": "Runtime", "name": n, "pid": pid, "tid": tid, "ts": start + at, "dur": us,
               "args": {"correlation": 9_000_000 + k}} for k, (n, at, us) in enumerate(SETUP)]
    return write_trace(tmp_path / name, added + events, **trace)


@pytest.fixture(scope="module")
def warm(traces, tmp_path_factory):
    """`_resnet_with_a_warmup_step`, written once for the tests that only read it: run ``warm``."""
    path = _resnet_with_a_warmup_step(traces, tmp_path_factory.mktemp("logdir") / "warm")
    settled(path)
    return path


def test_a_warmup_step_of_one_off_setup_is_named_and_left_out(traces, warm):
    original = summary_of(traces.folder("gpu", "kineto_resnet50_num_workers_0") / RESNET)
    s = summary_of(warm)
    assert s.steps == 7 and s.warmup_steps == [4]
    note = finding(s, "warmup-steps")
    assert note.evidence.steps == [4] and note.saving_ms is None
    assert note.evidence.setup_ms == pytest.approx(sum(us for _, _, us in SETUP) / 1000)
    assert note.evidence.ops[0] == "cudnnFindConvolutionForwardAlgorithmEx"
    assert "cudaStreamCreateWithFlags" in note.evidence.ops
    # the findings and figures are those of steps 5..10: data first, as without the warm-up step
    first = s.findings[0]
    assert (first.kind, first.phase, s.dominant_phase) == ("data-loader", "data", "data")
    assert s.mean == original.mean and s.costs == original.costs
    assert s.mean_wall_ms == original.mean_wall_ms and s.median_wall_ms == original.median_wall_ms
    assert s.slowest == original.slowest and s.noise == original.noise and 4 not in (s.outliers or [])
    assert s.top_ops == original.top_ops
    assert [f.text for f in s.findings if f.kind != "warmup-steps"] == [f.text for f in original.findings]


def test_the_gate_and_the_rank_table_leave_the_warmup_step_out(traces, warm):
    base = traces.folder("gpu", "kineto_resnet50_num_workers_0") / RESNET
    report = compare_paths(str(base), str(warm), source="traces")
    assert report.new.steps == report.base.steps == 6
    assert report.slower == [] and all(abs(c.delta_ms) < 1e-6 for c in report.changes)
    assert all(abs(o.delta_self_host_ms) < 1e-6 for o in report.ops)
    (run,) = discover(str(warm.parent))
    (f,) = [f for files in run.workers.values() for f in files]
    w = Worker(f.worker, [analyze_file(f)])
    (row,) = ranks("r", [w]).ranks
    assert row.steps == 6
    assert row.wall_ms == pytest.approx(np.mean(w.wall_us[w.numbers.index(5):]) / 1000, abs=0.001)


def test_the_first_step_of_a_trace_far_beyond_the_others_is_warmup_a_later_one_is_not(tmp_path):
    loop = Loop()
    for n in range(7):  # step 0 three times the others (no setup call recorded), step 4 nearly so
        forward = {0: 32_000, 4: 30_000}.get(n, 10_000 + 100 * n)
        loop.step(n, ("phaseprof::forward", forward), ("phaseprof::backward", 5_000))
    s = loop_summary(tmp_path, loop)
    assert s.warmup_steps == [0]
    note = finding(s, "warmup-steps")
    # no setup call recorded: the note says why the step is left out (the first of its trace), whole
    assert note.text == ("step 0 warmed up (step 0 took 37.00 ms, 2.4x the median step kept (15.30 ms); the first "
                         "step of its trace): left out of the means, costs, slowest step, outliers and findings, as "
                         "compiling steps are")
    assert (note.evidence.steps, note.evidence.step, note.evidence.step_wall_ms) == ([0], 0, 37.0)
    assert (note.evidence.median_wall_ms, note.evidence.setup_ms, note.evidence.ops) == (15.3, 0.0, None)
    assert s.slowest.step == 4 and s.noise.slow == [4] and "slow-step" in kinds(s)


def test_a_first_step_no_slower_than_a_later_one_is_not_warmup(tmp_path):
    # a busy machine: the first step is slow, and so is a later one
    loop = Loop()
    for n in range(7):
        forward = {0: 30_000, 4: 32_000}.get(n, 10_000 + 100 * n)
        loop.step(n, ("phaseprof::forward", forward), ("phaseprof::backward", 5_000))
    s = loop_summary(tmp_path, loop)
    assert s.warmup_steps is None and s.noise.slow == [0, 4]


def test_setup_calls_make_a_later_step_warmup_only_when_they_explain_its_excess(tmp_path):
    stream = [("cudaStreamCreateWithFlags", 100, 18_000, "cuda_runtime")]
    few = [("cudaEventCreateWithFlags", 100, 2_000, "cuda_runtime")]
    loop = Loop()
    for n in range(7):  # step 2: 18 ms of setup in a 35 ms step; step 5: 2 ms of setup in a 35 ms step
        ops = stream if n == 2 else few if n == 5 else []
        forward = 30_000 if n in (2, 5) else 10_000 + 100 * n
        loop.step(n, ("phaseprof::forward", forward, [], ops), ("phaseprof::backward", 5_000))
    s = loop_summary(tmp_path, loop)
    assert s.warmup_steps == [2]
    assert s.slowest.step == 5 and 2 not in s.outliers


def test_no_step_is_warmup_on_the_real_traces(traces):
    for folder in ("kineto_resnet50_num_workers_0", "hta_ns_resolution", "hta_sampled_2rank"):
        for path in traces.files("gpu", folder):
            assert summary_of(path).warmup_steps is None, path


def test_compiling_steps_are_left_out_of_the_gate_and_the_rank_table_too(tmp_path):
    def loop(compiles: bool) -> Loop:
        out = Loop()
        for n in range(7):
            phases = [("phaseprof::compile", 2_000_000)] if compiles and n == 0 else []
            out.step(n, *phases, ("phaseprof::forward", 10_000 + 10 * n), ("phaseprof::backward", 5_000))
        return out

    base = write_trace(tmp_path / "base" / "w.1.pt.trace.json", loop(False).events[:])
    new = write_trace(tmp_path / "new" / "w.1.pt.trace.json", loop(True).events)
    s = summary_of(new)
    assert s.compiling_steps == [0] and s.warmup_steps is None
    report = compare_paths(str(base), str(new), source="traces")
    assert report.new.steps == 6 and report.base.steps == 7
    assert report.slower == [] and not any(c.phase == "compile" and c.delta_ms for c in report.changes)
    (run,) = discover(str(new.parent))
    (f,) = [f for files in run.workers.values() for f in files]
    (row,) = ranks("r", [Worker(f.worker, [analyze_file(f)])]).ranks
    assert row.steps == 6 and row.wall_ms < 20


def test_comparing_whole_workers_leaves_the_warmup_step_out(warm):
    from tests.test_plugin import BASE, make_app

    plugin, client = make_app(warm.parent.parent)
    try:
        assert plugin._store.wait(300)
        body = json.loads(client.get(f"{BASE}/compare?run_a=warm&run_b=warm").get_data())
        assert body["a"]["steps"] == body["b"]["steps"] == [5, 6, 7, 8, 9, 10]
        step = json.loads(client.get(f"{BASE}/compare?run_a=warm&step_a=4&run_b=warm").get_data())
        assert step["a"]["steps"] == [4]  # asked for by number, the warm-up step is there
    finally:
        plugin._store.close()


def test_the_terminal_marks_the_warmup_step_left_out_of_the_means(warm):
    from tests.test_report_cli import report as run_report

    text = run_report(str(warm)).stdout
    assert "w: warm-up (one-off setup), left out of the means" in " ".join(text.split())
    row = next(line for line in text.splitlines() if line.strip().startswith("4 w"))
    assert "4,800.00" in row or "4800.00" in row


def _worker_of(path) -> Worker:
    (run,) = discover(str(path.parent))
    (f,) = [f for files in run.workers.values() for f in files if f.path == str(path)]
    return Worker(f.worker, [analyze_file(f)])


def test_the_run_wide_tables_leave_the_warmup_step_out_and_say_so(traces, warm):
    # the Operators, run-kernel and Modules tables over every profiled step: those of steps 5..10, as
    # without the warm-up step (its 4.8 s of cudnnFind and stream creation once topped the operators)
    base = _worker_of(traces.folder("gpu", "kineto_resnet50_num_workers_0") / RESNET)
    w = _worker_of(warm)
    ops, original = run_ops(w), run_ops(base)
    assert ops.left_out == [4] and original.left_out == [] and original.left_out_why is None
    assert ops.left_out_why == "step 4 warmed up: left out, as the summary's means and findings leave them out"
    assert (ops.steps, ops.wall_ms, ops.gpu_ms, ops.ops) == (original.steps, original.wall_ms, original.gpu_ms,
                                                             original.ops)
    assert "cudnnFindConvolutionForwardAlgorithmEx" not in {r.name for r in ops.ops}
    kernels = kernels_answer("r", w, w.full().tolist(), None, None)
    assert kernels.left_out == [4] and kernels.steps == 6
    assert kernels.kernels == kernels_answer("r", base, base.full().tolist(), None, None).kernels
    modules = modules_answer("r", w, w.full().tolist(), None)
    assert modules.left_out == [4] and modules.modules == modules_answer("r", base, base.full().tolist(),
                                                                         None).modules
    # one step asked for by number is that step, warm-up or not
    one = kernels_answer("r", w, [w.row_of(4)], 4, None)
    assert one.steps == 1 and one.left_out == []


def _warmup_step_by_step(wall_us, setup, first_of_trace, rows):
    """The rule as first written: the median and the largest of the others taken afresh per step."""
    out = np.zeros(len(wall_us), dtype=bool)
    if len(rows) < 2:
        return out
    walls = wall_us[rows]
    for k, row in enumerate(rows.tolist()):
        others = float(np.median(np.delete(walls, k)))
        excess = float(wall_us[row]) - others
        if others <= 0 or wall_us[row] < FAR * others:
            continue
        first = bool(first_of_trace[row]) and wall_us[row] > np.delete(walls, k).max()
        out[row] = first or setup[row] >= SETUP_SHARE * excess
    if out[rows].all():
        out[:] = False
    return out


def test_the_rule_from_one_sort_judges_every_step_as_the_median_of_the_others_did():
    rng = np.random.default_rng(7)
    cases = 0
    for n in [*range(2, 40), 101, 256, 1001]:
        for shape in ("spread", "ties", "warm", "nan", "int"):
            total = n + int(rng.integers(0, 4))
            wall = rng.lognormal(3.0, 0.3, total)
            if shape == "ties":  # few distinct values, zeros among them: the middle ones tie
                wall = rng.integers(0, 3, total).astype(np.float64) * 10.0
            elif shape == "warm":  # steps far beyond the rest, setup shares either side of the line
                wall[rng.random(total) < 0.2] *= rng.uniform(1.5, 40.0)
            elif shape == "nan":
                wall[rng.integers(0, total, int(rng.integers(1, 3)))] = np.nan
            elif shape == "int":
                wall = rng.integers(0, 50, total)
            setup = rng.uniform(0.0, 1.0, total) * np.nan_to_num(wall.astype(np.float64))
            first = rng.random(total) < 0.3
            rows = np.sort(rng.choice(total, n, replace=False))
            expected = _warmup_step_by_step(wall, setup, first, rows)
            assert np.array_equal(warmup(wall, setup, first, rows), expected), (n, shape)
            cases += int(expected.any())
    assert cases > 50  # the cases reach the steps judged warm-up, not only the ones ruled out


def _calls(n: int) -> int:
    """Python and C function calls made by judging ``n`` steps."""
    rng = np.random.default_rng(n)
    wall = rng.lognormal(3.0, 0.3, n)
    wall[0] *= 30
    count = 0

    def tally(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(tally)
    try:
        warmup(wall, np.zeros(n), np.arange(n) == 0, np.arange(n))
    finally:
        sys.setprofile(None)
    return count


def test_judging_more_steps_makes_no_more_calls():
    # whole-array work over all steps: the number of calls does not grow with the steps (it did by
    # two numpy calls of all the others per step, n^2 work in all)
    assert _calls(4_000) == _calls(250)


def test_the_median_and_the_largest_of_the_others_are_numpy_s_for_every_step():
    # the one-sort figures the rule judges each step by, against np.median and np.max of the others:
    # every rank, ties, and a NaN (the others' median is NaN unless the step itself is the NaN)
    rng = np.random.default_rng(11)
    for n in [2, 3, 4, 5, 8, 9, 30, 31]:
        for walls in (rng.lognormal(3.0, 0.3, n), rng.integers(0, 3, n).astype(np.float64),
                      np.where(np.arange(n) == n // 2, np.nan, rng.lognormal(3.0, 0.3, n))):
            median, most = _of_the_others(walls)
            for k in range(n):
                others = np.delete(walls, k)
                np.testing.assert_equal([median[k], most[k]], [np.median(others), np.max(others)])


def test_setup_calls_of_exactly_half_the_excess_make_a_step_warmup():
    # step 3: 300 µs against the others' 100, of which setup calls took 100 µs = SETUP_SHARE of 200
    walls = np.array([100.0, 100.0, 100.0, 300.0, 100.0])
    first = np.zeros(5, dtype=bool)
    rows = np.arange(5)
    assert warmup(walls, np.array([0, 0, 0, SETUP_SHARE * 200.0, 0]), first, rows).tolist() == [
        False, False, False, True, False]
    assert not warmup(walls, np.array([0, 0, 0, SETUP_SHARE * 200.0 - 0.01, 0]), first, rows).any()


def test_two_steps_are_enough_to_judge_and_one_is_not():
    first = np.array([False, True])
    assert warmup(np.array([100.0, 300.0]), np.zeros(2), first, np.arange(2)).tolist() == [False, True]
    assert not warmup(np.array([100.0, 300.0]), np.zeros(2), first, np.array([1])).any()


def test_steps_under_a_microsecond_are_judged_like_any_other():
    # the others' median is 0.5 µs: above 0, so it can rule; the first step took ten times it
    walls = np.array([5.0, 0.5, 0.5, 0.5])
    first = np.array([True, False, False, False])
    assert warmup(walls, np.zeros(4), first, np.arange(4)).tolist() == [True, False, False, False]
    assert not warmup(np.array([5.0, 0.0, 0.0, 0.0]), np.zeros(4), first, np.arange(4)).any()

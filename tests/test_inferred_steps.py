"""Steps where the trace marks none: one inferred step per iteration of the loop.

``torch.autograd.profiler.profile()`` around a training loop writes no ``ProfilerStep#N``; the loop's
own marks (DataLoader, zero_grad, optimizer step, the gradient seed) repeat once per iteration.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.analysis.steps import step_rows
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import AUTOGRAD, annotation, op, thread_names

NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def analyse(tmp_path, events):
    return analyze_trace(read_trace(str(write_trace(tmp_path / "loop.json", thread_names() + events))))


def train_under_autograd_profiler(path, iterations: int, device: str) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(16 * iterations, 32), torch.randint(0, 4, (16 * iterations,)))
    loader = DataLoader(data, batch_size=16)
    options = {"use_device": "cuda"} if device == "cuda" else {}
    with torch.autograd.profiler.profile(**options) as prof:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    prof.export_chrome_trace(str(path))


def devices() -> list[str]:
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_autograd_profiler_around_n_iterations_reads_as_n_inferred_steps(tmp_path):
    iterations = 5
    for device in devices():
        path = tmp_path / f"{device}.json"
        train_under_autograd_profiler(path, iterations, device)
        span = analyze_trace(read_trace(str(path)))
        assert [s.number for s in span.steps] == list(range(iterations)), device
        assert all(s.inferred_step and not s.empty for s in span.steps)
        for a, b in zip(span.steps, span.steps[1:]):
            assert a.end == b.start  # iterations follow each other without gaps or overlap
        for i, s in enumerate(span.steps):
            assert {"forward", "backward"} <= s.inferred
            for phase in ("data", "forward", "backward", "optimizer"):
                assert span.host_us[i, span.phases.index(phase)] > 0, (device, s.number, phase)
            if device == "cuda":
                for phase in ("forward", "backward", "optimizer"):
                    assert span.gpu_us[i, span.phases.index(phase)] > 0, (s.number, phase)
        rows = step_rows(Worker("w", [span]))
        assert all(r.inferred_step for r in rows)


def test_gradient_accumulation_keeps_one_step_per_optimizer_step(tmp_path):
    events = []
    for k in range(3):  # zero_grad after the step, two micro-batches per optimizer step
        t = 10_000 * k
        for micro in (0, 4_000):
            events += [
                annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + micro, 500),
                op("aten::linear", t + micro + 600, 1_000),
                op("aten::ones_like", t + micro + 1_700, 50),
                op("autograd::engine::evaluate_function: AddmmBackward0", t + micro + 1_800, 1_500, tid=AUTOGRAD),
            ]
        events += [annotation("Optimizer.step#SGD.step", t + 8_000, 800),
                   annotation("Optimizer.zero_grad#SGD.zero_grad", t + 8_900, 100)]
    events.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 30_000, 50))
    span = analyse(tmp_path, events)
    assert [(s.start, s.end) for s in span.steps] == [(0, 10_000), (10_000, 20_000), (20_000, 30_000)]
    j = span.phases.index("backward")
    assert span.host_us[:, j] == pytest.approx([2 * 1_600] * 3)  # two backward segments in each


def test_a_wrapped_optimizer_marks_one_step_per_iteration(tmp_path):
    """A wrapping optimizer (Accelerate's, Lightning's) runs the inner optimizer's step inside its own,
    and both write an ``Optimizer.step#`` mark: the inner one is part of the outer, not an iteration."""
    events = []
    for k in range(3):
        t = 10_000 * k
        events += [annotation("Optimizer.zero_grad#AcceleratedOptimizer.zero_grad", t, 100),
                   op("aten::linear", t + 200, 3_000),
                   annotation("Optimizer.step#AcceleratedOptimizer.step", t + 8_000, 1_000),
                   annotation("Optimizer.step#AdamW.step", t + 8_000, 900)]  # starts with the outer one
    events.append(annotation("Optimizer.zero_grad#AcceleratedOptimizer.zero_grad", 30_000, 100))
    span = analyse(tmp_path, events)
    assert [(s.start, s.end) for s in span.steps] == [(0, 10_000), (10_000, 20_000), (20_000, 30_000)]
    assert span.host_us[:, span.phases.index("optimizer")] == pytest.approx([1_100] * 3)


def test_a_loop_marked_only_by_its_optimizer_steps_has_a_step_between_each_two(tmp_path):
    """Nothing but the optimizer's step repeats (a hand-written loop, no DataLoader, no zero_grad):
    each optimizer step ends an iteration, so four of them bound three whole steps, the last included."""
    events = []
    for k in range(4):
        t = 10_000 * k
        events += [op("aten::linear", t + 200, 3_000), annotation("Optimizer.step#SGD.step", t + 8_000, 1_000)]
    span = analyse(tmp_path, events)
    assert [(s.number, s.start, s.end) for s in span.steps] == [
        (0, 9_000, 19_000), (1, 19_000, 29_000), (2, 29_000, 39_000)]
    assert all(s.inferred_step for s in span.steps)
    assert span.host_us[:, span.phases.index("optimizer")] == pytest.approx([1_000] * 3)


def test_a_trace_begun_inside_an_iteration_steps_from_the_loops_head(tmp_path):
    """The trace opens on the optimizer step of an iteration already under way: steps start where the
    loop's head (the DataLoader's next batch) comes after an optimizer step, not at the optimizer steps."""
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    events = [annotation("Optimizer.step#SGD.step", 8_000, 1_000)]
    for k in range(1, 4):
        t = 10_000 * k
        events += [annotation(loader, t, 500), op("aten::linear", t + 600, 1_000),
                   annotation("Optimizer.step#SGD.step", t + 8_000, 1_000)]
    events.append(annotation(loader, 40_000, 50))
    span = analyse(tmp_path, events)
    assert [(s.start, s.end) for s in span.steps] == [(10_000, 20_000), (20_000, 30_000), (30_000, 40_000)]


def test_nested_marks_never_make_a_step_end_before_it_starts(tmp_path):
    span = analyse(tmp_path, [annotation("Optimizer.step#SGD.step", 0, 12),
                              annotation("Optimizer.step#SGD.step", 1, 0)])
    assert all(s.end >= s.start for s in span.steps)
    assert span.host_us.sum(axis=1) == pytest.approx([s.end - s.start for s in span.steps])


def test_a_loop_marked_only_by_its_backward_seeds(tmp_path):
    events = []
    for k in range(3):  # forward and backward only: no DataLoader, no optimizer
        t = 10_000 * k
        events += [
            op("aten::linear", t, 3_000),
            op("aten::ones_like", t + 3_100, 50),
            op("autograd::engine::evaluate_function: AddmmBackward0", t + 3_200, 4_000),
        ]
    span = analyse(tmp_path, events)
    # a step starts with the loop thread's first op after the previous backward
    assert [(s.start, s.end) for s in span.steps] == [(0, 10_000), (10_000, 20_000), (20_000, 27_200)]
    assert span.host_us[:, span.phases.index("forward")] == pytest.approx([3_100] * 3)
    assert span.host_us[:, span.phases.index("backward")] == pytest.approx([4_100] * 3)


def test_a_single_iteration_stays_one_step(tmp_path):
    span = analyse(tmp_path, [
        annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 500),
        op("aten::linear", 600, 1_000),
        annotation("Optimizer.step#SGD.step", 2_000, 800),
    ])
    assert len(span.steps) == 1 and not span.steps[0].inferred_step


@pytest.mark.parametrize("case", ["base", "noannot", "accum", "workers2", "compile"])
def test_inferred_steps_match_the_profiler_steps_they_replace(case, traces, tmp_path):
    # The same real run read twice: with its ProfilerStep#N ranges, and with them stripped.
    (src,) = traces.files("cpu", case)
    data = json.loads(gzip.decompress(src.read_bytes()))
    events = data["traceEvents"]
    data["traceEvents"] = [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(data["traceEvents"]) < len(events)
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(data))
    marked, inferred = analyze_trace(read_trace(str(src))), analyze_trace(read_trace(str(stripped)))
    assert len(inferred.steps) == len(marked.steps) >= 3
    assert all(s.inferred_step for s in inferred.steps) and not any(s.inferred_step for s in marked.steps)
    for phase in ("data", "forward", "backward", "optimizer"):
        a = marked.host_us[:, marked.phases.index(phase)]
        b = inferred.host_us[:, inferred.phases.index(phase)]
        assert (np.abs(b - a) <= np.maximum(0.02 * a, 500)).all(), (case, phase, a, b)


def test_the_windows_of_an_evaluation_pass_between_inferred_steps_are_empty_steps(tmp_path):
    # The eval loader's batches repeat the loop's mark inside the pass: the windows they open hold
    # nothing but the pass, so they are empty steps (kept visible, out of the averages), its time
    # kept out of them.
    ev = []
    for t0 in (0, 1000):
        ev += [annotation(NEXT, t0, 100), op("aten::mm", t0 + 200, 300)]
    ev += [annotation("phaseprof::eval", 2000, 2000)]
    for t0 in (2000, 3000):
        ev += [annotation(NEXT, t0 + 10, 100), op("aten::mm", t0 + 200, 300)]
    for t0 in (4000, 5000):
        ev += [annotation(NEXT, t0, 100), op("aten::mm", t0 + 200, 300)]
    span = analyse(tmp_path, ev + [annotation(NEXT, 6000, 100)])
    assert [(s.start, s.end) for s in span.steps] == [(0, 1000), (1000, 2010), (2010, 3010), (3010, 4000),
                                                      (4000, 5000), (5000, 6000)]
    assert [s.empty for s in span.steps] == [False, False, True, True, False, False]
    assert [s.events for s in span.steps] == [2, 2, 0, 0, 2, 2]
    assert [s.apart for s in span.steps] == [{}, {"eval": 10.0}, {"eval": 1000.0}, {"eval": 990.0}, {}, {}]
    assert span.host_us[[2, 3]].sum() == 0


def test_work_of_another_thread_after_the_loops_last_batch_makes_no_step(tmp_path):
    # the loop's final __next__ (no batch left) is no step, even when another thread of the process
    # (the autograd engine, a pin-memory thread) still works after it
    ev = []
    for t0 in (0, 1000):
        ev += [annotation(NEXT, t0, 100), op("aten::mm", t0 + 200, 300)]
    ev += [annotation(NEXT, 2000, 100), op("aten::copy_", 2050, 450, tid=AUTOGRAD)]
    span = analyse(tmp_path, ev)
    assert [(s.start, s.end) for s in span.steps] == [(0, 1000), (1000, 2000)]

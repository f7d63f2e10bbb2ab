"""Traces that grow along one dimension each (steps, events per step, nesting depth, streams,
ranks, phase ranges in one step): what `benchmarks/scaling.py` times and `tests/test_scaling.py`
counts the analysis's operations on. Each builder writes its trace(s) under a folder and returns
what ``phaseprof report`` is given."""

from __future__ import annotations

from pathlib import Path

from tests.hostile import training_step
from tests.logdir import write_trace
from tests.tracebuilder import AUTOGRAD, annotation, kernel, launch, op, step, thread_names


def steps(n: int, folder: Path) -> Path:
    """``n`` steps of a small training loop with GPU work (data, forward, backward, optimizer)."""
    events = [e for i in range(n)
              for e in training_step(i + 1, 1000.0 + 100 * i, 10 * i + 1)]
    return write_trace(folder / "w.1.pt.trace.json", thread_names() + events)


def empty_steps(n: int, folder: Path) -> Path:
    """``n`` steps holding one 10 µs op each (`benchmarks/empty_steps.py`'s shape)."""
    events = [e for s in range(n)
              for e in (step(s, s * 100.0, 90.0), op("aten::add", s * 100.0 + 5, 10))]
    return write_trace(folder / "w.1.pt.trace.json", thread_names() + events)


def events_per_step(n: int, folder: Path, steps: int = 8) -> Path:
    """``steps`` steps whose forward holds ``n`` ops, each launching a kernel."""
    events, t, corr = thread_names(), 0.0, 0
    for s in range(steps):
        start = t
        events.append(annotation("## forward ##", t, 3.0 * n))
        for _ in range(n):
            corr += 1
            events += [op("aten::mm", t, 2.0), launch(t + 0.5, corr),
                       kernel("gemm", t + 1.0, 2.0, corr)]
            t += 3.0
        events.append(annotation("## optimizer ##", t, 10.0))
        t += 10.0
        events.append(step(s, start, t - start))
        t += 5.0
    return write_trace(folder / "w.1.pt.trace.json", events)


def depth(n: int, folder: Path, steps: int = 2) -> Path:
    """``steps`` steps, each a forward of ``n`` nested ``nn.Module:`` records (torch's module
    records): each level runs an op after its child returns, whose gradient function the autograd
    thread runs later (the backward attribution's sequence numbers)."""
    events, t, seq = thread_names(), 0.0, 0
    for s in range(steps):
        start = t
        opened = []
        for level in range(n):
            opened.append((level, t))
            t += 1.0
        for level, began in reversed(opened):
            seq += 1
            events.append(op("aten::mm", t, 1.0, **{"Sequence number": seq}))
            t += 2.0
            events.append(op(f"nn.Module: Linear_{level % 3}", began, t - began,
                             cat="python_function"))
        for k in range(seq - n + 1, seq + 1):
            events.append(op("autograd::engine::evaluate_function: MmBackward0", t, 1.0,
                             tid=AUTOGRAD, **{"Sequence number": k}))
            t += 2.0
        events.append(step(s, start, t - start))
        t += 5.0
    return write_trace(folder / "w.1.pt.trace.json", events)


def streams(n: int, folder: Path, steps: int = 8) -> Path:
    """``steps`` steps, each launching one kernel on each of ``n`` streams."""
    events, t, corr = thread_names(), 0.0, 0
    for s in range(steps):
        start = t
        events.append(annotation("## forward ##", t, 2.0 * n))
        for k in range(n):
            corr += 1
            events += [launch(t, corr), kernel("gemm", t + 1.0, 5.0, corr, stream=7 + k)]
            t += 2.0
        events.append(step(s, start, t - start))
        t += 10.0
    return write_trace(folder / "w.1.pt.trace.json", events)


def ranks(n: int, folder: Path, steps: int = 3) -> Path:
    """A distributed run of ``n`` ranks, one trace each of ``steps`` training steps."""
    for rank in range(n):
        events = [e for i in range(steps)
                  for e in training_step(i + 1, 1000.0 + 100 * i + rank, 10 * i + 1)]
        write_trace(folder / f"rank{rank}.1.pt.trace.json", thread_names() + events,
                    distributedInfo={"backend": "nccl", "rank": rank, "world_size": n})
    return folder


def ranges(n: int, folder: Path) -> Path:
    """One step of ``n`` phase ranges back to back (forward and backward in turn), an op in each."""
    events = thread_names()
    for k in range(n):
        t = 10.0 + 10.0 * k
        name = "## forward ##" if k % 2 == 0 else "## backward ##"
        events += [annotation(name, t, 10.0), op("aten::add", t + 1, 5)]
    events.append(step(0, 0.0, 20.0 + 10.0 * n))
    return write_trace(folder / "w.1.pt.trace.json", events)


#: Each dimension: its builder, the size `benchmarks/scaling.py` builds at 1x (then 4x, 16x) and
#: the size `tests/test_scaling.py` counts at 1x (then 4x).
DIMENSIONS = {
    "steps": (steps, 1000, 100),
    "empty steps": (empty_steps, 1000, 200),
    "events per step": (events_per_step, 1000, 100),
    "nesting depth": (depth, 160, 400),
    "streams": (streams, 16, 8),
    "ranks": (ranks, 4, 2),
    "phase ranges in a step": (ranges, 1250, 200),
}

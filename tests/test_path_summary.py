"""The critical path as the user reads it: a step's path with its segments joined, the mean path
over steps, what fills it most (ties broken in `BOUNDS` order) and its items, longest first. The
built steps are those of tests/test_critical_path.py, whose paths are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis.path_summary import BOUNDS, TOP_ITEMS, PathFigures, path_figures
from phaseprof.plugin.analysis.steps import step_detail
from tests.logdir import write_trace
from tests.test_critical_path import (
    STEPS,
    T0,
    _all_reduce,
    _blocking_copy,
    _built,
    _data_stall,
    _sync,
)
from tests.test_cut_step import _worker
from tests.tracebuilder import Loop, annotation, kernel, launch, op, step, thread_names


@pytest.mark.parametrize("one_step", [_data_stall, _blocking_copy, _all_reduce])
def test_the_mean_path_of_steps_alike_is_each_steps_path(tmp_path, one_step):
    w, summary = _built(tmp_path, one_step)
    mean = summary.critical_path
    for k in range(1, STEPS):  # the first step is a warm-up step: its path may differ
        path = step_detail(w, k, "run").critical_path
        assert (mean.length_ms, mean.bound, mean.phases) == (path.length_ms, path.bound, path.phases)
        assert mean.items == path.items and mean.segments == [] and path.segments
        # consecutive pieces of one lane, kind and name are one segment
        for a, b in zip(path.segments, path.segments[1:]):
            assert (a.lane, a.kind, a.name) != (b.lane, b.kind, b.name) or a.end_ms != b.start_ms


def test_a_step_without_device_work_has_no_critical_path(tmp_path):
    loop = Loop()
    for n in range(3):
        loop.step(n, ("phaseprof::forward", 1_000, [], [("aten::mm", 10, 500)]))
    path = write_trace(tmp_path / "w.1.pt.trace.json", loop.events)
    assert step_detail(_worker(path), 1, "run").critical_path is None


def test_what_fills_the_path_most_is_its_bound_and_a_tie_goes_to_the_first_in_order():
    f = PathFigures()
    f.bounds.update({"host": 5.0, "data": 5.0, "launch": 4.0})
    assert f.bound() == "data"
    f.bounds["host"] = 5.5
    assert f.bound() == "host"
    f.bounds.update(dict.fromkeys(BOUNDS, 1.0))
    assert f.bound() == "host-blocked"


def test_the_items_are_the_longest_per_step_and_ties_go_by_kind_and_name():
    f = PathFigures()
    f.steps, f.length, f.phases = 2, 10_000.0, {"forward": 6_000.0, "other": 4_000.0}
    f.items = {("op", "b"): 4_000.0, ("op", "a"): 4_000.0, ("kernel", "z"): 2_000.0}
    f.items.update({("launch", f"k{j:02}"): 1.0 * (j + 1) for j in range(TOP_ITEMS)})
    answer = f.answer([])
    assert (answer.length_ms, answer.phases) == (5.0, {"forward": 3.0, "other": 2.0})
    assert len(answer.items) == TOP_ITEMS == 20
    assert [(i.kind, i.name, i.ms, i.share) for i in answer.items[:4]] == [
        ("op", "a", 2.0, 0.4), ("op", "b", 2.0, 0.4), ("kernel", "z", 1.0, 0.2), ("launch", "k19", 0.01, 0.002)]
    assert answer.items[-1].name == "k03"  # the three shortest left out
    # no step: figures as they are; a path of no length: no share
    empty = PathFigures()
    empty.items = {("op", "a"): 0.0}
    answer = empty.answer([])
    assert (answer.length_ms, answer.bound, answer.items[0].share) == (0.0, "host-blocked", 0.0)


def _short_data(events, n, t, corr):
    """11 ms: a data-stall step (`_data_stall`) with 1 ms of data loading, not 20."""
    events += [step(n, t, 11_000), annotation("phaseprof::data", t, 1_000),
               annotation("phaseprof::forward", t + 1_000, 9_000)]
    for k in range(10):
        corr += 1
        at = t + 1_000 + 800 * k
        events += [op("aten::mm", at, 700), launch(at + 10, corr, dur=5), kernel("gemm", at + 30, 300, corr)]
    events += [op("aten::item", t + 10_000, 1_000), _sync(t + 10_010, 100)]
    return corr, 11_000


def test_the_mean_paths_bound_weighs_every_step(tmp_path):
    # four 30 ms steps held up by data loading (20 ms data, 10 ms host), then an 11 ms step of 1 ms
    # data and 10 ms host: data fills the mean path most, whatever the last step's path
    def mixed(events, n, t, corr):
        return (_data_stall if n < STEPS - 1 else _short_data)(events, n, t, corr)

    w, summary = _built(tmp_path, mixed)
    assert step_detail(w, STEPS - 1, "run").critical_path.bound == "host"
    mean = summary.critical_path
    assert mean.bound == "data" and mean.length_ms == pytest.approx((4 * 30 + 11) / 5)


def test_a_gap_between_kernels_on_the_path_is_named_kernel_wait(tmp_path):
    # kernel 0 (launched at 10) runs 100-200 µs, kernel 1 (launched at 20, queued) 210-300: a 10 µs
    # kernel wait between them; the loss read waits for kernel 1 until 300. The kernels come first
    # in the file: "gemm" is the trace's first name
    events = [kernel("gemm", T0 + 100, 100, 1), kernel("gemm", T0 + 210, 90, 2),
              *thread_names(), step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000),
              launch(T0 + 10, 1), launch(T0 + 20, 2), _sync(T0 + 50, 252)]
    write_trace(tmp_path / "w.1.pt.trace.json", events)
    path = step_detail(_worker(tmp_path / "w.1.pt.trace.json"), 0, "run").critical_path
    assert [(s.lane, s.kind, s.name) for s in path.segments] == [
        ("host", "phase", "forward"), ("GPU 0 stream 7", "launch", "cudaLaunchKernel"),
        ("GPU 0 stream 7", "kernel", "gemm"), ("GPU 0 stream 7", "idle", "kernel wait"),
        ("GPU 0 stream 7", "kernel", "gemm"), ("host", "sync", "cudaStreamSynchronize"),
        ("host", "phase", "forward")]
    gap = path.segments[3]
    assert (gap.start_ms, gap.end_ms) == (0.2, 0.21)
    items = {(i.kind, i.name): i.ms for i in path.items}
    assert (items[("kernel", "gemm")], items[("idle", "kernel wait")]) == (0.19, 0.01)


def test_a_paths_time_per_phase_and_kind_adds_up_to_its_time_per_phase(tmp_path):
    w, _ = _built(tmp_path, _data_stall)
    f = path_figures(w, np.array([2]))
    assert f.steps == 1 and f.phases == {"data": 20_000.0, "forward": 9_000.0, "other": 1_000.0}
    for phase, us in f.phases.items():
        assert sum(v for (p, _), v in f.phase_kinds.items() if p == phase) == pytest.approx(us, abs=1e-6)
    assert f.phase_kinds[("data", "phase")] == 20_000.0


def test_the_share_of_a_path_under_a_microsecond_is_its_items_part():
    f = PathFigures()
    f.steps, f.length, f.items = 1, 0.5, {("kernel", "gemm"): 0.5}
    assert f.answer([]).items[0].share == 1.0

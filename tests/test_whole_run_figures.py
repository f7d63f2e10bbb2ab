"""The whole-run figures computed from scalars directly (no event files, no training loop): which
steps they cover, the order of the phases, each spread's figures, the slowest steps and the time
outside the steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phaseprof.contract import EVAL_TAG, PROFILER_TAG, STEP_GPU_TAG, STEP_TAG, gpu_tag, host_tag
from phaseprof.plugin.analysis.whole_run import SLOWEST, scalars_of, whole_run


def series(rows: dict[str, list[float | None]], first: int = 0) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value)]`` from one value per step (None: no point at that step)."""
    return {tag: [(first + i, v) for i, v in enumerate(values) if v is not None] for tag, values in rows.items()}


def run(rows: dict[str, list[float | None]], first: int = 0, rank: int | None = None):
    return whole_run(scalars_of(series(rows, first)), rank=rank)


def test_scalars_of_puts_each_point_at_its_step_and_nan_where_a_tag_has_none():
    s = scalars_of({"a": [(5, 1.0), (2, 2.0)], "b": [(9, 3.0)], "c": []})
    assert s.steps.tolist() == [2, 5, 9]
    assert s.steps.dtype == np.int64
    np.testing.assert_array_equal(s.values["a"], [2.0, 1.0, np.nan])
    np.testing.assert_array_equal(s.values["b"], [np.nan, np.nan, 3.0])
    assert np.isnan(s.values["c"]).all() and len(s.values["c"]) == 3
    assert np.isnan(s.wall_time).all() and len(s.wall_time) == 3 and s.files == []


def test_no_step_times_is_no_whole_run():
    assert run({host_tag("forward"): [1.0, 2.0]}) is None
    assert whole_run(scalars_of({STEP_TAG: [], host_tag("forward"): [(0, 1.0)]})) is None


def test_the_first_step_is_left_out_and_the_runs_bounds_are_kept():
    w = run({STEP_TAG: [100.0, 10.0, 20.0, 30.0]}, first=3, rank=2)
    assert w.rank == 2
    assert (w.first_step, w.last_step, w.steps) == (3, 6, 3)
    assert w.left_out == ["step 3 (first)"]
    (step,) = w.phases
    assert (step.phase, step.clock, step.steps) == ("step", "host", 3)
    assert step.max_ms == 30.0 and step.mean_ms == 20.0 and step.median_ms == 20.0
    assert step.total_s == 0.06


def test_compiling_steps_are_left_out_and_said():
    w = run({STEP_TAG: [5.0, 900.0, 10.0, 800.0, 20.0], host_tag("compile"): [0.0, 850.0, 0.0, 700.0, None]})
    assert w.steps == 2 and w.left_out == ["step 0 (first)", "2 compiling step(s)"]
    assert [s.step for s in w.slowest] == [4, 2]
    assert {p.phase for p in w.phases} >= {"step", "compile"}
    assert next(p for p in w.phases if p.phase == "step").max_ms == 20.0


def test_steps_with_no_step_time_are_not_steps():
    w = run({STEP_TAG: [None, 1.0, None, 2.0, 3.0], host_tag("forward"): [7.0, 0.5, 7.0, 1.0, 1.5]})
    assert (w.first_step, w.last_step, w.steps) == (1, 4, 2)  # step 1 is the first timed one: left out
    forward = next(p for p in w.phases if p.phase == "forward")
    assert forward.steps == 2 and forward.max_ms == 1.5


def test_spreads_come_host_first_in_phase_order_then_the_users_then_gpu():
    n = 6
    w = run({gpu_tag("forward"): [1.0] * n, host_tag("zeta"): [1.0] * n, host_tag("backward"): [1.0] * n,
             STEP_GPU_TAG: [3.0] * n, host_tag("alpha"): [1.0] * n, host_tag("forward"): [1.0] * n,
             gpu_tag("backward"): [1.0] * n, STEP_TAG: [5.0] * n, host_tag("data"): [1.0] * n,
             EVAL_TAG: [0.0] * n, PROFILER_TAG: [0.0] * n, "phaseprof/not a phase": [1.0] * n})
    assert [(p.phase, p.clock) for p in w.phases] == [
        ("step", "host"), ("data", "host"), ("forward", "host"), ("backward", "host"), ("alpha", "host"),
        ("zeta", "host"), ("step", "gpu"), ("forward", "gpu"), ("backward", "gpu")]


def test_each_spread_is_over_the_steady_steps_with_linear_percentiles():
    values = [1000.0] + [float(v) for v in range(1, 101)]  # step 0 (left out), then 1..100 ms
    w = run({STEP_TAG: values, host_tag("forward"): [v / 3 for v in values]})
    step, forward = w.phases
    want = np.arange(1.0, 101.0)
    median, p90, p99 = np.percentile(want, [50, 90, 99])
    assert (step.steps, step.mean_ms, step.median_ms, step.p90_ms, step.p99_ms, step.max_ms, step.total_s) == (
        100, 50.5, median, round(p90, 4), round(p99, 4), 100.0, 5.05)
    assert p90 != median and p99 != p90  # the percentiles differ: a swapped one would show
    assert forward.median_ms == round(median / 3, 4) and forward.max_ms == round(100 / 3, 4)
    assert forward.p99_ms == round(np.percentile(want / 3, 99), 4)


def test_a_host_phase_missing_at_a_step_took_nothing_there_and_a_gpu_phase_counts_where_timed():
    w = run({STEP_TAG: [9.0, 4.0, 6.0, 8.0, 10.0], host_tag("loss"): [None, None, None, 2.0, 4.0],
             gpu_tag("forward"): [None, None, 3.0, None, 5.0], gpu_tag("backward"): [1.0, None, None, None, None]})
    spreads = {(p.phase, p.clock): p for p in w.phases}
    loss = spreads[("loss", "host")]
    assert loss.steps == 4 and loss.mean_ms == 1.5 and loss.median_ms == 1.0
    gpu = spreads[("forward", "gpu")]
    assert gpu.steps == 2 and gpu.mean_ms == 4.0
    assert ("backward", "gpu") not in spreads  # timed only at the step left out
    slowest = w.slowest[0]
    assert slowest.step == 4 and slowest.phases == {"loss": 4.0}


def test_figures_are_rounded_to_a_tenth_of_a_microsecond():
    w = run({STEP_TAG: [1.0, 1.123456789, 1.123456789]})
    (step,) = w.phases
    assert step.max_ms == 1.1235 and step.mean_ms == 1.1235 and step.total_s == 0.0022
    assert w.slowest[0].wall_ms == 1.1235


def test_the_slowest_steps_name_the_phase_furthest_above_its_median():
    steps = [50.0, 10.0, 11.0, 30.0, 12.0, 13.0, 25.0, 14.0, 15.0]
    forward = [1.0, 5.0, 5.0, 6.0, 5.0, 5.0, 20.0, 5.0, 5.0]
    data = [1.0, 2.0, 2.0, 22.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    w = run({STEP_TAG: steps, host_tag("forward"): forward, host_tag("data"): data})
    assert len(w.slowest) == SLOWEST == 5
    assert [s.step for s in w.slowest] == [3, 6, 8, 7, 5]
    first, second = w.slowest[:2]
    assert first.wall_ms == 30.0 and first.phase == "data" and first.phase_over_median_ms == 20.0
    assert first.phases == {"data": 22.0, "forward": 6.0}
    assert second.phase == "forward" and second.phase_over_median_ms == 15.0


def test_slow_steps_of_equal_time_keep_step_order_and_with_no_phase_the_step_is_named():
    w = run({STEP_TAG: [1.0, 5.0, 7.0, 5.0, 7.0, 2.0, 5.0, 3.0]})
    assert [s.step for s in w.slowest] == [2, 4, 1, 3, 6]
    assert all(s.phase == "step" and s.phase_over_median_ms == 0.0 and s.phases == {} for s in w.slowest)


def test_time_outside_the_steps_counts_in_full_with_its_share_of_the_run():
    w = run({STEP_TAG: [100.0, 10.0, 10.0, 10.0, 10.0, 10.0],
             PROFILER_TAG: [0.0, 0.0, 30.0, None, 0.0, 0.0],
             EVAL_TAG: [40.0, 0.0, 20.0, 0.0, 60.0, 0.0]})
    run_ms = 150.0 + 30.0 + 120.0
    assert w.profiler.total_ms == 30.0 and w.profiler.steps == 1 and w.profiler.median_ms == 30.0
    assert w.profiler.max_ms == 30.0 and w.profiler.max_step == 2
    assert w.profiler.share == round(30.0 / run_ms, 5)
    ev = w.eval
    assert (ev.total_ms, ev.steps, ev.median_ms, ev.max_ms, ev.max_step) == (120.0, 3, 40.0, 60.0, 4)
    assert ev.share == round(120.0 / run_ms, 5) == 0.4


def test_time_kept_apart_of_none_is_zero_and_a_missing_tag_is_none():
    w = run({STEP_TAG: [1.0, 2.0, 3.0], PROFILER_TAG: [0.0, 0.0, 0.0]})
    assert w.eval is None
    p = w.profiler
    assert (p.total_ms, p.steps, p.median_ms, p.max_ms, p.max_step, p.share) == (0.0, 0, 0.0, 0.0, 0, 0.0)
    assert not math.isnan(p.share)


def test_the_largest_time_kept_apart_is_the_first_step_that_had_it():
    w = run({STEP_TAG: [1.0] * 5, EVAL_TAG: [0.0, 8.0, 3.0, 8.0, 0.0]}, first=10)
    assert w.eval.max_step == 11 and w.eval.max_ms == 8.0 and w.eval.median_ms == 8.0


@pytest.mark.parametrize("rank", [None, 0, 7])
def test_the_rank_is_carried(rank):
    assert run({STEP_TAG: [1.0, 2.0]}, rank=rank).rank == rank


def test_among_many_slow_steps_of_equal_time_the_earliest_are_listed():
    times = [1.0] + [5.0] * 40 + [7.0] * 3 + [5.0] * 40
    w = run({STEP_TAG: times})
    assert [s.step for s in w.slowest] == [41, 42, 43, 1, 2]


def test_time_kept_apart_under_a_millisecond_counts_and_shares_keep_five_decimals():
    w = run({STEP_TAG: [1.0, 2.0, 2.0], EVAL_TAG: [0.0, 0.5, 0.0]})
    assert (w.eval.steps, w.eval.median_ms, w.eval.max_step) == (1, 0.5, 1)
    assert w.eval.share == round(0.5 / 5.5, 5) == 0.09091


def test_a_run_of_zero_times_has_zero_shares():
    w = run({STEP_TAG: [0.0, 0.0], PROFILER_TAG: [0.0, 0.0]})
    assert w.profiler.share == 0.0 and w.profiler.total_ms == 0.0


def test_scalars_with_no_points_have_integer_steps_and_no_run():
    s = scalars_of({STEP_TAG: []})
    assert s.steps.dtype == np.int64 and len(s.steps) == 0
    assert whole_run(s) is None

"""`phaseprof compare BASE NEW` as CI runs it: a subprocess, its exit status, its table and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
import warnings

import msgspec
import numpy as np
import pytest

from phaseprof.cli.compare_table import _said
from phaseprof.contract import COMPILE, STEP_TAG, host_tag
from phaseprof.plugin.analysis import regression
from phaseprof.plugin.analysis.compare import changed_ops, grew_most, mean_side, median_row
from phaseprof.plugin.analysis.compare import compare as compare_sides
from phaseprof.plugin.analysis.regression import compare_figures, median_draws, quantiles
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.answers import Change, Delta, Times
from phaseprof.plugin.reading.decode import read_trace
from tests.conftest import ROOT
from tests.logdir import write_events, write_scalars, write_trace
from tests.tracebuilder import Loop, annotation, op, step


def compare(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "phaseprof.cli", "compare", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "COLUMNS": "200"})


def traced_run(path, forward_us=2000.0, backward_us=3000.0, seed=0, steps=12, noise=0.05, compiling=()):
    """A run's trace with ``steps`` steps of a forward (one aten::mm) and a backward, each
    jittered by ``noise`` (relative, normal); the steps in ``compiling`` first compile for 2 s."""
    rng = np.random.default_rng(seed)
    events = []
    t0 = 0.0
    for s in range(steps):
        f = forward_us * (1 + noise * rng.standard_normal())
        b = backward_us * (1 + noise * rng.standard_normal())
        c = 2_000_000.0 if s in compiling else 0.0
        if c:
            events.append(annotation("phaseprof::compile", t0 + 50, c))
        events += [step(s, t0, 300 + c + f + b), annotation("phaseprof::forward", t0 + c + 100, f),
                   op("aten::mm", t0 + c + 110, f - 20), annotation("phaseprof::backward", t0 + c + 100 + f, b),
                   op("autograd::engine::evaluate_function: MmBackward0", t0 + c + 110 + f, b - 20)]
        t0 += 20_000.0 + c
    return write_trace(path / "w.1.pt.trace.json", events)


# --- the statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [5, 6, 11, 40])
def test_exact_bootstrap_of_the_median_matches_resampling(n):
    x = np.random.default_rng(n).lognormal(size=n)
    exact = median_draws(x, np.random.default_rng(0), 40_000)
    rng = np.random.default_rng(1)
    resampled = np.median(x[rng.integers(0, n, (40_000, n))], axis=1)
    q = [0.025, 0.25, 0.5, 0.75, 0.975]
    assert np.allclose(np.quantile(exact, q), np.quantile(resampled, q), rtol=0.05)


def _runs(rng, levels, steps=60):
    return [level * (1 + 0.01 * rng.standard_normal(steps)) for level in levels]


# Student's t, (1 - alpha/2) quantiles: published tables (NIST/SEMATECH e-Handbook 1.3.6.7.2,
# Abramowitz & Stegun table 26.10), to the digits given there.
T_TABLE = [(1, 0.10, 6.314), (1, 0.05, 12.706), (1, 0.01, 63.657), (2, 0.05, 4.303), (2, 0.01, 9.925),
           (3, 0.05, 3.182), (5, 0.10, 2.015), (5, 0.05, 2.571), (5, 0.002, 5.893), (10, 0.05, 2.228),
           (10, 0.01, 3.169), (20, 0.05, 2.086), (30, 0.05, 2.042), (60, 0.01, 2.660), (100, 0.05, 1.984),
           (100, 0.001, 3.390)]


@pytest.mark.parametrize("df, alpha, table", T_TABLE)
def test_the_t_quantile_is_exact(df, alpha, table):
    from phaseprof.plugin.analysis.student_t import t_quantile_two_sided

    assert t_quantile_two_sided(df, alpha) == pytest.approx(table, abs=0.0005)


def test_the_t_quantile_holds_for_any_degrees_of_freedom():
    """Welch's degrees of freedom are fractions: the tail beyond the quantile is alpha (mpmath's
    incomplete beta, at 30 digits, as the reference), and the quantile falls toward the normal's."""
    import mpmath

    from phaseprof.plugin.analysis.student_t import t_quantile_two_sided

    mpmath.mp.dps = 30
    for df in (0.5, 1.3, 2.5, 4.7, 17.25, 1e4):
        for alpha in (0.5, 0.05, 1e-3, 1e-6):
            q = mpmath.mpf(t_quantile_two_sided(df, alpha))
            tail = mpmath.betainc(mpmath.mpf(df) / 2, mpmath.mpf(1) / 2, 0, df / (df + q * q), regularized=True)
            assert float(tail) == pytest.approx(alpha, rel=1e-8), (df, alpha)
    assert t_quantile_two_sided(1e6, 0.05) == pytest.approx(1.959966, abs=2e-6)  # the normal's 1.959964
    quantiles = [t_quantile_two_sided(df, 0.05) for df in (1, 1.5, 2, 3, 5, 10, 100)]
    assert quantiles == sorted(quantiles, reverse=True)


def test_the_welch_interval_of_two_runs_a_side_uses_the_exact_t_quantile():
    """Runs whose medians spread alike on both sides (logarithms 10, 20 and 15, 30): Welch's degrees
    of freedom are exactly 2, and the interval is the ratio of geometric means times exp(±t·se)."""
    from phaseprof.plugin.analysis.regression import run_interval

    base = [np.full(5, 10.0), np.full(5, 20.0)]
    new = [np.full(5, 15.0), np.full(5, 30.0)]
    low, high = run_interval(base, new, 0.05)
    se = np.log(2) / np.sqrt(2)
    assert low == pytest.approx(1.5 * np.exp(-4.302652729749464 * se) - 1, rel=1e-9)
    assert high == pytest.approx(1.5 * np.exp(4.302652729749464 * se) - 1, rel=1e-9)


def test_runs_that_drift_apart_are_not_a_regression_but_every_run_slower_is():
    rng = np.random.default_rng(3)
    base = _runs(rng, [1.0, 1.0, 1.01, 0.99])

    def verdict(new_levels):
        (change,) = compare_figures([("forward", "host", base, _runs(rng, new_levels))], base_step_ms=1.0,
                                    threshold=0.05, confidence=0.95, min_share=0.01)
        return change

    # each new run a little slower, by a different amount: four numbers that do not show +5% with
    # 95% confidence, though the bootstrap of their steps alone would say so
    drift = verdict([1.06, 1.08, 1.07, 1.12])
    assert drift.change > 0.05 and not drift.slower and drift.low < 0.05
    slower = verdict([1.2, 1.21, 1.19, 1.2])
    assert slower.slower and slower.low > 0.05


def test_a_sides_figure_and_its_interval_weigh_each_run_by_its_steps():
    # new: a run of 10 steps at 1 ms and one of 30 at 2 ms; weighted by steps, 1.75 ms a step. The
    # bootstrap draws one run twice, or both: 1, 2 or 1.75 ms, against a steady base of 1 ms.
    base = [np.full(40, 1.0)]
    new = [np.full(10, 1.0), np.full(30, 2.0)]
    (change,) = compare_figures([("forward", "host", base, new)], base_step_ms=1.0, threshold=0.05,
                                confidence=0.95, min_share=0.01)
    assert (change.base_ms, change.new_ms, change.change) == (1.0, 1.75, 0.75)
    assert (change.low, change.high) == (0.0, 1.0)


def test_the_interval_holds_its_confidence_split_between_both_tails_and_jointly_over_the_figures():
    # a steady base of 2 ms against 1..5 ms: the median of a resample of five steps is the lowest
    # (-50%) with probability 5.8%, at most the second lowest (0%) with 31.7%; the highest likewise
    base, new = [np.full(9, 2.0)], [np.arange(1.0, 6.0)]

    def intervals(confidence, figures):
        out = compare_figures([("forward", "host", base, new)] * figures, base_step_ms=2.0, threshold=0.05,
                              confidence=confidence, min_share=0.01)
        return [(c.low, c.high) for c in out]

    # 80%: 10% in each tail, beyond the lowest and highest draws' 5.8%
    assert intervals(0.8, 1) == [(0.0, 1.0)]
    # two figures hold jointly at 80%: each at 90%, 5% in each tail, within the extremes' 5.8%
    assert intervals(0.8, 2) == [(-0.5, 1.5)] * 2
    # 85%: 7.5% in each tail, beyond the extremes' 5.8%
    assert intervals(0.85, 1) == [(0.0, 1.0)]


def one_change(base, new, base_step_ms=10.0, threshold=0.05, confidence=0.95, min_share=0.01):
    (change,) = compare_figures([("forward", "host", base, new)], base_step_ms=base_step_ms, threshold=threshold,
                                confidence=confidence, min_share=min_share)
    return change


def steady(ms, steps=9):
    return [np.full(steps, ms)]


def test_a_change_in_full_rounded_to_the_tenth_of_a_microsecond():
    base, new = [np.full(9, 1.234567)], [np.full(9, 2.345678)]
    assert one_change(base, new) == Change(
        phase="forward", clock="host", base_ms=1.2346, new_ms=2.3457, delta_ms=1.1111, change=0.9, low=0.9, high=0.9,
        base_steps=9, new_steps=9, slower=True, faster=False)
    faster = one_change(new, base, base_step_ms=1.0)
    assert (faster.delta_ms, faster.change, faster.low, faster.high) == (-1.1111, -0.4737, -0.4737, -0.4737)
    assert faster.faster and not faster.slower


def test_slower_and_faster_need_the_whole_interval_beyond_the_threshold_and_a_change_worth_acting_on():
    # the interval's bound on the threshold is not beyond it
    assert not one_change(steady(2.0), steady(3.0), threshold=0.5).slower
    assert not one_change(steady(2.0), steady(1.0), threshold=0.5).faster
    assert one_change(steady(2.0), steady(1.0), threshold=0.49).faster
    # 5% faster is within a 10% threshold
    assert not one_change(steady(2.0), steady(1.9), threshold=0.1, min_share=0.0).faster
    # the change must be at least min_share of the base step (0.05 x 10 ms): 0.5 ms is, 0.4 ms is not
    assert one_change(steady(1.0), steady(1.5), min_share=0.05).slower
    assert not one_change(steady(1.0), steady(1.4), min_share=0.05).slower
    # an unchanged figure is neither, whatever the threshold
    same = one_change(steady(1.0), steady(1.0), threshold=-0.5, min_share=0.0)
    assert (same.change, same.low, same.high, same.slower, same.faster) == (0.0, 0.0, 0.0, False, False)
    small = one_change(steady(1.0), steady(1.2), threshold=-0.5)
    assert small.slower and not small.faster


def test_figures_under_a_millisecond_are_ratios_like_any_other():
    assert (one_change(steady(0.4), steady(0.5)).low, one_change(steady(0.4), steady(0.5)).high) == (0.25, 0.25)


def test_a_phase_absent_from_the_base_changes_by_a_share_of_the_base_step():
    # no base time: the interval is of the delta as a share of the base step (0.5 of 0.8 ms)
    c = one_change(steady(0.0), steady(0.5), base_step_ms=0.8)
    assert (c.base_ms, c.change, c.low, c.high, c.slower) == (0.0, None, 0.625, 0.625, True)
    # a base median of 0 among steps of 1 ms: its draws of 1 ms count against the new side
    c = one_change([np.array([0, 0, 0, 0, 0, 1, 1, 1, 1.0])], steady(0.5), base_step_ms=0.8)
    assert (c.base_ms, c.change, c.low, c.high, c.slower) == (0.0, None, -0.625, 0.625, False)
    # nor a base step to measure it by: no change to speak of
    c = one_change([np.array([0, 0, 0, 0, 0, 1, 1, 1, 1.0])], steady(0.5), base_step_ms=0.0)
    assert (c.change, c.low, c.high, c.slower) == (None, 0.0, 0.0, False)


def test_a_base_whose_draws_reach_zero_has_no_upper_bound_never_nan():
    # a median of 1 ms among base steps of 0 ms: a draw of the base is 0 often enough that the
    # upper end of the ratio's draws is inf, and so is the interval's bound (null in JSON)
    c = one_change([np.array([0, 0, 0, 0, 1, 1, 1, 1, 1.0])], steady(0.5))
    assert (c.base_ms, c.new_ms, c.change, c.low, c.high, c.faster) == (1.0, 0.5, -0.5, -0.5, np.inf, False)
    assert json.loads(msgspec.json.encode(c))["high"] is None
    assert _said(c).endswith("interval -50.0% … +∞)")


def test_draws_of_zero_on_either_side_warn_nothing():
    # b / a over draws of 0 divides by zero, and 0 / 0 is invalid: the terminal shows no numpy warning
    zeros_then_ones = [np.array([0, 0, 0, 0, 1, 1, 1, 1, 1.0])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = one_change(zeros_then_ones, steady(0.5))
        same = one_change(zeros_then_ones, zeros_then_ones)
    assert (c.high, same.change, same.high) == (np.inf, 0.0, np.inf)


def test_a_quantile_next_to_an_infinite_draw_is_the_finite_draw_it_sits_on():
    draws = np.array([0.0, 1.0, np.inf, np.inf])
    # positions 0.75, 1 (on the last finite draw), 1.5 and 2.7 of the sorted draws
    assert quantiles(draws, [0.25, 1 / 3, 0.5, 0.9]).tolist() == [0.75, 1.0, np.inf, np.inf]
    assert quantiles(np.array([1.0, 2.0, 4.0]), [0.25, 0.5]).tolist() == [1.5, 2.0]
    assert quantiles(np.full(3, np.inf), [0.0]).tolist() == [np.inf]


def test_fewer_than_five_steps_a_side_give_a_figure_but_no_interval():
    few = one_change(steady(1.0, steps=4), steady(2.0))
    assert (few.change, few.low, few.high, few.base_steps, few.new_steps, few.slower) == (1.0, None, None, 4, 9, False)
    few = one_change(steady(1.0), steady(2.0, steps=4))
    assert (few.low, few.high, few.slower) == (None, None, False)
    enough = one_change(steady(1.0, steps=5), steady(2.0, steps=5))
    assert (enough.low, enough.high, enough.slower) == (1.0, 1.0, True)
    gone = one_change(steady(1.0), [])
    assert (gone.new_ms, gone.new_steps, gone.low, gone.faster) == (0.0, 0, None, False)


def test_the_same_inputs_give_the_same_interval():
    rng = np.random.default_rng(5)
    base, new = [rng.lognormal(0, 0.3, 40)], [rng.lognormal(0.1, 0.3, 40)]
    first = one_change(base, new)
    assert first.low != first.high
    assert all(one_change(base, new) == first for _ in range(3))


def test_the_bootstrap_median_of_four_steps_has_the_exact_resampling_distribution():
    # the median of a resample of 1, 2, 3, 4: every one of the 4^4 resamples, counted
    x = np.array([1.0, 2.0, 3.0, 4.0])
    every = np.array(np.meshgrid(x, x, x, x)).reshape(4, -1).T
    values, counts = np.unique(np.median(every, axis=1), return_counts=True)
    draws = median_draws(x, np.random.default_rng(0), 200_000)
    drawn = np.array([(draws == v).mean() for v in values])
    assert set(np.unique(draws)) <= set(values)
    assert drawn == pytest.approx(counts / counts.sum(), abs=0.005)


def _two_stage_draws(runs, rng, draws):
    """The two-stage bootstrap of a side in full: every run's medians drawn, all runs resampled."""
    within = np.stack([median_draws(r, rng, draws) for r in runs])
    weights = np.array([len(r) for r in runs], dtype=np.float64)
    pick = rng.integers(0, len(runs), size=(draws, len(runs)))
    picked = within[pick, np.arange(draws)[:, None]]
    return (picked * weights[pick]).sum(axis=1) / weights[pick].sum(axis=1)


@pytest.mark.parametrize("runs, steps",
                         [(regression.RUNS_DRAWN + 1, 2), (400, 2), (300, 7), (1_000, 3)])
def test_the_bootstrap_of_many_runs_draws_as_resampling_all_of_them_does(runs, steps):
    rng = np.random.default_rng(runs + steps)
    levels = rng.lognormal(1, 0.2, runs)
    sides = [level * (1 + 0.05 * rng.standard_normal(steps)) for level in levels]
    full = _two_stage_draws(sides, np.random.default_rng(1), 4_000)
    drawn = regression.side_draws(sides, np.random.default_rng(2), 4_000)
    q = [0.005, 0.025, 0.25, 0.5, 0.75, 0.975, 0.995]
    width = np.quantile(full, 0.975) - np.quantile(full, 0.025)
    apart = np.abs(np.quantile(drawn, q) - np.quantile(full, q))
    assert apart == pytest.approx(0, abs=0.06 * width)


def _peak_bytes(runs: int) -> int:
    """Peak memory allocated while drawing a side of ``runs`` runs of 3 steps."""
    sides = list(np.random.default_rng(runs).lognormal(size=(runs, 3)))
    tracemalloc.start()
    try:
        regression.side_draws(sides, np.random.default_rng(0), 2_000)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_bootstrap_of_a_side_takes_no_more_memory_for_more_runs():
    # 10,000 runs a side once took 6.6 GB: runs x draws arrays
    assert _peak_bytes(4_000) < 1.5 * _peak_bytes(400)


def test_runs_whose_medians_cannot_be_logged_give_no_welch_interval():
    from phaseprof.plugin.analysis.regression import run_interval

    ones, zeros = np.ones(5), np.zeros(5)
    assert run_interval([zeros, ones], [ones, ones], 0.05) is None
    assert run_interval([ones, ones], [ones, zeros], 0.05) is None
    assert run_interval([ones, ones * 2], [ones * 3, ones], 0.05) is not None
    assert run_interval([ones * 0.5, ones * 0.5], [ones * 0.55, ones * 0.55], 0.05) == pytest.approx((0.1, 0.1))
    assert run_interval([ones, ones], [ones * 2, ones * 2], 0.05) == (1.0, 1.0)  # no spread: the ratio itself


def test_the_welch_degrees_of_freedom_of_three_runs_a_side():
    """Three runs a side spread alike (logarithms a step of ln 2 apart): Welch's degrees of freedom
    are 2 (3 - 1) = 4, and t(0.975, 4) = 2.776 (NIST's table)."""
    from phaseprof.plugin.analysis.regression import run_interval

    base = [np.full(5, 10.0), np.full(5, 20.0), np.full(5, 40.0)]
    new = [np.full(5, 15.0), np.full(5, 30.0), np.full(5, 60.0)]
    se = np.sqrt(2 * np.log(2) ** 2 / 3)
    low, high = run_interval(base, new, 0.05)
    assert low == pytest.approx(1.5 * np.exp(-2.776445105 * se) - 1, rel=1e-8)
    assert high == pytest.approx(1.5 * np.exp(2.776445105 * se) - 1, rel=1e-8)


# --- traced steps ------------------------------------------------------------------------------


def test_same_code_passes_with_several_seeds(tmp_path):
    for seed in range(5):
        traced_run(tmp_path / f"base{seed}", seed=seed)
        traced_run(tmp_path / f"new{seed}", seed=100 + seed)
        out = compare(tmp_path / f"base{seed}", tmp_path / f"new{seed}")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "no phase slower by more than 5% with 95% confidence" in out.stdout


def test_slower_forward_fails_naming_forward_and_its_op(tmp_path):
    traced_run(tmp_path / "base", forward_us=2000, seed=1)
    traced_run(tmp_path / "new", forward_us=2600, seed=2)
    out = compare(tmp_path / "base", tmp_path / "new")
    assert out.returncode == 1, out.stdout + out.stderr
    verdict = out.stdout.strip().splitlines()[-1]
    assert verdict.startswith("SLOWER by more than 5%") and "forward +" in out.stdout
    assert "backward" not in out.stdout.split("SLOWER")[1]
    ops = out.stdout.split("ops that changed most")[1]
    assert "aten::mm" in ops


def test_threshold(tmp_path):
    traced_run(tmp_path / "base", forward_us=2000, seed=1)
    traced_run(tmp_path / "new", forward_us=2400, seed=2)  # forward +20%, the step about +8%
    strict = json.loads(compare(tmp_path / "base", tmp_path / "new", "--threshold", "0.05", "--json").stdout)
    assert "forward" in strict["slower"]
    out = compare(tmp_path / "base", tmp_path / "new", "--threshold", "50%")
    assert out.returncode == 0
    assert "no phase slower by more than 50%" in out.stdout


def test_json(tmp_path):
    traced_run(tmp_path / "base", forward_us=2000, seed=1)
    traced_run(tmp_path / "new", forward_us=3000, seed=2)
    out = compare(tmp_path / "base", tmp_path / "new", "--json")
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["source"] == "traces" and data["threshold"] == 0.05 and data["confidence"] == 0.95
    assert data["base"]["steps"] == data["new"]["steps"] == 12
    assert data["slower"] == ["step", "forward"]
    changes = {(c["phase"], c["clock"]): c for c in data["changes"]}
    fwd = changes[("forward", "host")]
    assert fwd["slower"] and fwd["low"] > 0.05 and fwd["low"] <= fwd["change"] <= fwd["high"]
    assert fwd["change"] == pytest.approx(fwd["new_ms"] / fwd["base_ms"] - 1, abs=1e-3)
    assert fwd["change"] == pytest.approx(0.5, abs=0.1)
    assert not changes[("backward", "host")]["slower"]
    assert data["ops"][0]["name"] == "aten::mm" and data["ops"][0]["delta_self_host_ms"] > 0.5


def test_faster_is_not_a_failure(tmp_path):
    traced_run(tmp_path / "base", forward_us=3000, seed=1)
    traced_run(tmp_path / "new", forward_us=2000, seed=2)
    out = compare(tmp_path / "base", tmp_path / "new", "--json")
    assert out.returncode == 0
    changes = {(c["phase"], c["clock"]): c for c in json.loads(out.stdout)["changes"]}
    assert changes[("forward", "host")]["faster"]


def test_unusable_input_exits_2(tmp_path):
    traced_run(tmp_path / "base")
    out = compare(tmp_path / "base", tmp_path / "missing")
    assert out.returncode == 2 and "missing: no such file or directory" in out.stderr
    (tmp_path / "empty").mkdir()
    out = compare(tmp_path / "base", tmp_path / "empty", "--json")
    assert out.returncode == 2 and "no readable trace files" in json.loads(out.stdout)["errors"][0]["error"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "w.1.pt.trace.json").write_text("{")
    out = compare(tmp_path / "base", tmp_path / "bad")
    assert out.returncode == 2 and "not valid JSON" in out.stderr
    traced_run(tmp_path / "short", steps=3)
    out = compare(tmp_path / "base", tmp_path / "short")
    assert out.returncode == 2 and "3 step(s) to compare; at least 5" in out.stderr
    out = compare(tmp_path / "base", tmp_path / "base", "--source", "scalars")
    assert out.returncode == 2 and "no phaseprof scalars" in out.stderr
    out = compare(tmp_path / "base", tmp_path / "base", "--threshold", "five")
    assert out.returncode == 2


def test_scalars_are_preferred_when_both_sides_have_them(tmp_path):
    for side in ("base", "new"):
        traced_run(tmp_path / side)
        write_scalars(tmp_path / side, range(40))
    data = json.loads(compare(tmp_path / "base", tmp_path / "new", "--json").stdout)
    assert data["source"] == "scalars" and data["base"]["steps"] == 39  # the first step left out
    assert data["base"]["left_out"] == ["step 0 (first)"]
    assert data["slower"] == []
    assert {c["phase"] for c in data["changes"]} >= {"step", "data", "forward", "backward", "optimizer", "other"}


def _compiled_run(run_dir, steps: int, compiling: int, seed: int) -> None:
    """The scalars of a short run whose steps 0 .. ``compiling``-1 each compile for 2 s (torch.compile
    recompiling as shapes change), every step else a 10 ms forward and backward (±1%)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(steps):
        forward, backward = 4 * (1 + 0.01 * rng.standard_normal()), 6 * (1 + 0.01 * rng.standard_normal())
        compile_ms = 2000.0 if s < compiling else 0.0
        values = {host_tag("forward"): forward, host_tag("backward"): backward,
                  STEP_TAG: forward + backward + compile_ms}
        if compile_ms:
            values[host_tag(COMPILE)] = compile_ms
        rows.append((s, values))
    write_events(run_dir, rows)


def test_scalars_leave_the_first_and_compiling_steps_out_and_say_so(tmp_path):
    """New recompiles in 7 of its 12 steps, base in 3, and their steady steps are alike. With every timed
    step counted, new's median step is a compiling one (+19,950%) and its interval spans -99% … +20,000%:
    a gate that cannot tell. Left out, the step is the same on both sides, within a narrow interval."""
    _compiled_run(tmp_path / "base", steps=12, compiling=3, seed=1)
    _compiled_run(tmp_path / "new", steps=12, compiling=7, seed=2)
    out = compare(tmp_path / "base", tmp_path / "new", "--json")
    data = json.loads(out.stdout)
    assert out.returncode == 0 and data["source"] == "scalars" and data["slower"] == []
    assert (data["base"]["steps"], data["new"]["steps"]) == (9, 5)
    assert data["base"]["left_out"] == ["step 0 (first)", "2 compiling step(s)"]
    assert data["new"]["left_out"] == ["step 0 (first)", "6 compiling step(s)"]
    step = next(c for c in data["changes"] if (c["phase"], c["clock"]) == ("step", "host"))
    assert step["base_ms"] == pytest.approx(10, rel=0.05) and step["new_ms"] == pytest.approx(10, rel=0.05)
    assert -0.05 < step["low"] < step["high"] < 0.05
    table = compare(tmp_path / "base", tmp_path / "new").stdout
    assert "5 steady steps of 1 worker(s), left out: step 0 (first), 6 compiling step(s)" in table


def test_traced_steps_leave_the_compiling_ones_out_and_say_so(tmp_path):
    traced_run(tmp_path / "base", seed=1)
    traced_run(tmp_path / "new", seed=2, compiling=(1, 2))
    data = json.loads(compare(tmp_path / "base", tmp_path / "new", "--json").stdout)
    assert data["source"] == "traces" and data["slower"] == []
    assert data["new"]["left_out"] == ["2 compiling step(s)"] and data["new"]["steps"] == 10
    assert data["base"]["left_out"] == [] and data["base"]["steps"] == 12


def test_runs_of_a_side_that_left_out_other_steps_are_named(tmp_path):
    for side in ("base", "new"):
        _compiled_run(tmp_path / side / "a", steps=12, compiling=3, seed=1)
        _compiled_run(tmp_path / side / "b", steps=12, compiling=0 if side == "base" else 3, seed=2)
    data = json.loads(compare(tmp_path / "base", tmp_path / "new", "--json").stdout)
    assert data["base"]["left_out"] == ["a: step 0 (first)", "a: 2 compiling step(s)", "b: step 0 (first)"]
    assert data["new"]["left_out"] == ["step 0 (first)", "2 compiling step(s)"]  # both runs alike: once


# --- real training runs ----------------------------------------------------------------------------

TRAIN = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.nn.functional as F
    from phaseprof import PhaseProfiler
    from tests.timing import train_step

    logdir, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    for spec in sys.argv[3:]:  # <side>/<run>:<seed>:<sleep in forward, ms>
        run, seed, sleep_ms = spec.split(":")
        torch.manual_seed(int(seed))
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        if float(sleep_ms):
            model.register_forward_hook(lambda *_, s=float(sleep_ms) / 1000: time.sleep(s))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(steps)]
        prof = PhaseProfiler(logdir=os.path.join(logdir, os.path.dirname(run)), run=os.path.basename(run),
                             wait=1, warmup=1, active=2)
        prof.attach(model, optimizer)
        for x, y in prof.data(batches):
            train_step(model, optimizer, x, y, F.cross_entropy)
        prof.close()
""")

#: Each side of a comparison is several runs, the two sides' runs taking turns in one process (ABBA…):
#: the load of a shared machine drifts, and taking turns lets the drift fall on both sides alike (what a
#: CI job gets from training base and new on one runner a few times each, in turns).
TURNS = 4


def _train_in_turns(logdir, pairs: list[tuple[str, str, int, float, float]], steps: int = 60) -> None:
    """``pairs``: (base side, new side, seed, base sleep ms, new sleep ms); each side gets `TURNS` runs."""
    specs = []
    for base, new, seed, sleep_base, sleep_new in pairs:
        for turn in range(TURNS):  # base first, then new first, …: what comes second does not always
            order = ((base, sleep_base), (new, sleep_new))
            specs += [f"{side}/{turn}:{seed}:{sleep}" for side, sleep in (order if turn % 2 == 0 else order[::-1])]
    out = subprocess.run([sys.executable, "-c", TRAIN, str(logdir), str(steps), *specs], capture_output=True,
                         text=True, timeout=900, cwd=ROOT)  # where the script finds tests.timing
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow
def test_real_runs_same_code_passes_and_a_sleep_in_forward_fails(tmp_path):
    seeds = [0, 1, 2]
    _train_in_turns(tmp_path, [(f"base-{s}", f"new-{s}", s, 0.0, 0.0) for s in seeds]
                    + [("ref", "slow", 7, 0.0, 3.0)])  # a 3 ms sleep in forward
    for s in seeds:
        out = compare(tmp_path / f"base-{s}", tmp_path / f"new-{s}", "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        data = json.loads(out.stdout)
        # every run of a side less its first step (left out: not steady)
        assert data["source"] == "scalars" and data["base"]["steps"] >= TURNS * 59 and data["slower"] == []

    out = compare(tmp_path / "ref", tmp_path / "slow", "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert "forward" in data["slower"]
    phases = [c for c in data["changes"] if c["phase"] != "step" and c["clock"] == "host"]
    grew = max(phases, key=lambda c: c["delta_ms"])
    assert grew["phase"] == "forward" and grew["delta_ms"] >= 2.5
    text = compare(tmp_path / "ref", tmp_path / "slow").stdout
    assert "forward +" in text.split("SLOWER by more than 5%:")[1]


# --- what the gate refuses: times that are not times, thresholds that are not numbers --------

def _scalar_run(run_dir, step_ms, phases: dict[str, float], steps: int = 30, seed: int = 0) -> None:
    """A run's every-step scalars as the training hook writes them: each phase's ms and the step's,
    ±1% when positive and finite, else written as they are at every step (-10, 0, inf)."""
    rng = np.random.default_rng(seed)

    def jittered(ms: float) -> float:
        return ms * (1 + 0.01 * rng.standard_normal()) if np.isfinite(ms) and ms > 0 else ms

    rows = [(s, {**{host_tag(p): jittered(ms) for p, ms in phases.items()},
                 STEP_TAG: jittered(step_ms)}) for s in range(steps)]
    write_events(run_dir, rows)


@pytest.mark.parametrize("step_ms, shown", [(-10.0, "-10"), (0.0, "0"), (float("inf"), "inf")])
def test_step_times_not_finite_and_positive_are_refused_naming_the_side(tmp_path, step_ms, shown):
    """Before: all negative read "-200% faster" and all zero passed (exit 0); all +inf printed +inf%
    but new_ms null in --json."""
    _scalar_run(tmp_path / "base", 10.0, {"forward": 4.0, "backward": 6.0}, seed=1)
    _scalar_run(tmp_path / "new", step_ms, {"forward": 4.0, "backward": 6.0}, seed=2)
    out = compare(tmp_path / "base", tmp_path / "new")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"phaseprof compare: {tmp_path / 'new'}: new side: 29 of 29 step times (ms per step) are "
        f"not finite and positive (the first: {shown}); corrupt scalars or traces"]
    as_json = compare(tmp_path / "base", tmp_path / "new", "--json")
    (error,) = json.loads(as_json.stdout)["errors"]
    assert as_json.returncode == 2 and "new side: 29 of 29 step times" in error["error"]
    out = compare(tmp_path / "new", tmp_path / "base")  # the same on the base side, named so
    assert out.returncode == 2
    assert f"{tmp_path / 'new'}: base side: 29 of 29 step times" in out.stderr


@pytest.mark.parametrize("value", [-2.0, float("inf"), float("-inf")])
def test_phase_times_negative_or_not_finite_are_refused_naming_the_phase(tmp_path, value):
    _scalar_run(tmp_path / "base", 10.0, {"forward": 4.0, "backward": 6.0}, seed=1)
    _scalar_run(tmp_path / "new", 10.0, {"forward": value, "backward": 6.0}, seed=2)
    out = compare(tmp_path / "base", tmp_path / "new")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert ("new side: 29 of 29 forward times (ms per step) are not finite and not negative "
            f"(the first: {value:g})") in out.stderr


@pytest.mark.parametrize("threshold", ["nan", "inf%", "nan%"])
def test_a_threshold_that_is_not_a_finite_percentage_is_refused(tmp_path, threshold):
    """Before: ``nan`` and ``inf%`` passed argument checking, then the table died with a Traceback
    (exit 1, read as "slower" by CI), and ``--json`` printed "threshold": null, exit 0."""
    _scalar_run(tmp_path / "base", 10.0, {"forward": 4.0}, seed=1)
    _scalar_run(tmp_path / "new", 10.0, {"forward": 4.0}, seed=2)
    for json_flag in ((), ("--json",)):
        out = compare(tmp_path / "base", tmp_path / "new", f"--threshold={threshold}", *json_flag)
        assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
        assert f"argument --threshold: {threshold!r}" in out.stderr.splitlines()[-1]
    for option in ("--min-share", "--confidence"):  # the other shares too
        assert compare(tmp_path / "base", tmp_path / "new", f"{option}={threshold}").returncode == 2


def test_a_phase_only_one_side_recorded_is_not_comparable_never_slower(tmp_path):
    """New times its data loading (a phase base never recorded: its time was in the step, untimed):
    before, "data 0.000 → 10 ms, slower" failed the gate."""
    _scalar_run(tmp_path / "base", 20.0, {"forward": 4.0, "backward": 6.0}, seed=1)
    _scalar_run(tmp_path / "new", 20.0, {"data": 10.0, "forward": 4.0, "backward": 6.0}, seed=2)
    for base, new in (("base", "new"), ("new", "base")):  # recorded by new only, then by base only
        out = compare(tmp_path / base, tmp_path / new, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        data = json.loads(out.stdout)
        assert data["slower"] == []
        changes = {(c["phase"], c["clock"]): c for c in data["changes"]}
        data_phase = changes.pop(("data", "host"))
        assert not (data_phase["comparable"] or data_phase["slower"] or data_phase["faster"])
        assert (data_phase["change"], data_phase["low"], data_phase["high"]) == (None,) * 3
        assert data_phase["base_steps" if base == "base" else "new_steps"] == 0
        assert all(c["comparable"] for c in changes.values())
        table = compare(tmp_path / base, tmp_path / new)
        assert table.returncode == 0
        row = next(line for line in table.stdout.splitlines() if line.lstrip().startswith("data"))
        # phase, clock, base ms, new ms, change, interval, mark: "-" for the side that lacks it
        cells = [cell.strip() for cell in row.split("│")]
        recorded = 3 if base == "base" else 2
        assert float(cells[recorded]) == pytest.approx(10, rel=0.05)
        assert cells[2:recorded] + cells[recorded + 1:] == ["-", "-", "-", "not comparable"]
        assert "not comparable, recorded by one side only: data" in table.stdout
        assert table.stdout.strip().splitlines()[-1].startswith("no phase slower by more than 5%")


# --- two sets of steps compared (plugin/analysis/compare.py: /compare, the slowest step) ---


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory) -> Worker:
    """Steps 1, 2 and 4 of a hand-built loop (step 3 holds no work): forward's aten::mm wraps the
    launch of a kernel of 30, 60 and 300 µs, backward's aten::add takes 20, 10 and 400 µs."""
    loop = Loop()
    for number, forward, kernel_us, mm_us, backward, add_us in (
        (1, 100.0, 30.0, 40.0, 200.0, 20.0),
        (2, 150.0, 60.0, 80.0, 100.0, 10.0),
        (3, None, 0, 0, 0, 0),
        (4, 120.0, 300.0, 50.0, 450.0, 400.0),
    ):
        if forward is None:
            loop.t += 50.0
            loop.step(number)
            continue
        loop.step(
            number,
            ("phaseprof::forward", forward, [("k1", kernel_us)], [("aten::mm", 0.0, mm_us)]),
            ("phaseprof::backward", backward, [], [("aten::add", 5.0, add_us)]),
        )
    path = write_trace(tmp_path_factory.mktemp("compare") / "w.1.pt.trace.json", loop.events)
    return Worker("w", [analyze_trace(read_trace(str(path)))])


def test_each_side_is_its_mean_step_over_the_steps_holding_work(four_steps):
    w = four_steps
    a = mean_side(w, np.array([0, 1, 2]), ["forward", "backward", "data"], "A")
    assert a.label == "A" and a.steps == [1, 2]  # step 3 holds no work
    assert a.wall_ms == 0.275  # (300 + 250) / 2 µs
    assert a.phases["forward"] == Times(host_ms=0.125, gpu_ms=0.045)
    assert a.phases["backward"] == Times(host_ms=0.15, gpu_ms=0.0)
    assert a.phases["data"] == Times(host_ms=0.0, gpu_ms=0.0)  # a phase the worker lacks
    nothing = mean_side(w, np.array([2]), ["forward"])
    assert nothing.steps == [] and nothing.wall_ms == 0.0 and nothing.label == ""


def test_a_comparison_gives_both_sides_their_deltas_and_the_ops_that_changed_most(four_steps):
    w = four_steps
    c = compare_sides(
        (w, np.array([0, 1, 2])), (w, np.array([3])), ["forward", "backward"], labels=("A", "B")
    )
    assert (c.a.label, c.b.label, c.a.steps, c.b.steps, c.phases) == (
        "A",
        "B",
        [1, 2],
        [4],
        ["forward", "backward"],
    )
    assert c.b.wall_ms == 0.57 and c.delta.wall_ms == 0.295
    assert c.delta.phases == {
        "forward": Times(host_ms=-0.005, gpu_ms=0.255),
        "backward": Times(host_ms=0.3, gpu_ms=0.0),
    }
    # by host and GPU self time together: add's 0.385 ms on the host before mm's 0.01 + 0.255
    assert [(o.phase, o.name) for o in c.ops] == [
        ("backward", "aten::add"),
        ("forward", "aten::mm"),
        ("forward", "cudaLaunchKernel"),
    ]
    mm = c.ops[1]
    assert (
        mm.a_calls,
        mm.b_calls,
        mm.a_self_host_ms,
        mm.b_self_host_ms,
        mm.delta_self_host_ms,
    ) == (
        1.0,
        1.0,
        0.055,
        0.045,
        -0.01,
    )  # mm's self time: (40 - 5) and (80 - 5) µs of launch, then 50 - 5
    assert (mm.a_host_ms, mm.b_host_ms, mm.delta_host_ms) == (0.06, 0.05, -0.01)
    assert (mm.a_self_gpu_ms, mm.b_self_gpu_ms, mm.delta_self_gpu_ms) == (0.045, 0.3, 0.255)
    assert (mm.a_gpu_ms, mm.b_gpu_ms, mm.delta_gpu_ms) == (0.045, 0.3, 0.255)
    by_gpu = compare_sides(
        (w, np.array([0, 1])), (w, np.array([3])), ["forward", "backward"], by="gpu"
    )
    assert [o.name for o in by_gpu.ops][:1] == ["aten::mm"]
    assert (by_gpu.a.label, by_gpu.b.label) == ("", "")


def test_a_comparison_lists_the_top_ops_then_the_op_asked_for(four_steps):
    w = four_steps
    sides = (w, np.array([0, 1])), (w, np.array([3]))
    assert [o.name for o in compare_sides(*sides, ["forward"], top=1).ops] == ["aten::add"]
    asked = compare_sides(*sides, ["forward"], top=1, op="cudaLaunchKernel").ops
    assert [o.name for o in asked] == ["aten::add", "cudaLaunchKernel"]
    assert [o.name for o in compare_sides(*sides, ["forward"], top=1, op="aten::add").ops] == [
        "aten::add"
    ]


def test_changed_ops_fill_a_missing_side_with_zeros_and_rank_by_the_clock_asked():
    a = {
        ("forward", "mm"): np.array([2.0 / 3, 100.0, 150.0, 10.0, 20.0]),
        ("forward", "gone"): np.array([1.0, 2000.0, 2000.0, 0.0, 0.0]),
    }
    b = {
        ("forward", "mm"): np.array([4.0 / 3, 100.0, 150.0, 900.0, 950.0]),
        ("backward", "new"): np.array([2.0, 30.0, 30.0, 0.0, 700.0]),
    }
    rows = changed_ops(a, b)
    assert [r.name for r in rows] == ["gone", "mm", "new"]
    gone, mm, new = rows
    assert (gone.b_calls, gone.b_self_host_ms, gone.delta_self_host_ms, gone.delta_host_ms) == (
        0.0,
        0.0,
        -2.0,
        -2.0,
    )
    assert (new.a_calls, new.a_host_ms, new.b_gpu_ms, new.delta_gpu_ms) == (0.0, 0.0, 0.7, 0.7)
    assert (mm.a_calls, mm.b_calls) == (0.67, 1.33)  # calls per step, to the hundredth
    assert (mm.delta_self_gpu_ms, mm.delta_gpu_ms) == (0.89, 0.93)
    # the GPU clock: self GPU time first, then GPU time (new's 0.7 ms launched, none its own)
    assert [r.name for r in changed_ops(a, b, by="gpu")] == ["mm", "new", "gone"]
    # equal changes: by phase, then name
    tie = {
        ("b", "y"): np.array([1.0, 10.0, 0, 0, 0]),
        ("b", "x"): np.array([1.0, 10.0, 0, 0, 0]),
        ("a", "z"): np.array([1.0, 0.0, 0, 10.0, 0]),
    }
    assert [(r.phase, r.name) for r in changed_ops({}, tie)] == [("a", "z"), ("b", "x"), ("b", "y")]
    assert [(r.phase, r.name) for r in changed_ops(tie, {}, by="gpu")] == [
        ("a", "z"),
        ("b", "x"),
        ("b", "y"),
    ]


def test_the_median_step_is_the_lower_middle_one_of_those_holding_work(four_steps):
    w = four_steps  # walls: 300, 250, (empty), 570 µs
    assert median_row(w, np.array([0, 1, 2, 3])) == 0
    assert median_row(w, np.array([0, 1])) == 1  # the lower of two
    assert median_row(w, np.array([3, 2])) == 3
    assert median_row(w, np.array([2])) is None


def test_the_median_of_steps_of_equal_times_is_the_first_of_them_in_step_order(tmp_path):
    # 17 steps of 100, 200 and 300 µs in turn: the 9th in time order is the 4th 200 µs step,
    # step 7 (a sort that does not keep step order among equals picks another: 13 with numpy's)
    loop = Loop()
    for number in range(17):
        loop.step(number, ("phaseprof::forward", 100.0 + 100.0 * ((7 * number) % 3)))
    w = Worker(
        "w",
        [analyze_trace(read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", loop.events))))],
    )
    assert w.numbers[median_row(w, np.arange(17))] == 7


def test_the_phase_that_grew_most_is_the_one_whose_host_time_grew_most():
    delta = Delta(
        wall_ms=1.0,
        phases={
            "forward": Times(host_ms=-3.0, gpu_ms=5.0),  # its GPU time grew: not what is asked
            "backward": Times(host_ms=0.12345, gpu_ms=0.0),
            "data": Times(host_ms=0.1, gpu_ms=0.0),
        },
    )
    assert grew_most(delta) == ("backward", 0.123)

"""The whole run from its every-step scalars: how many steps were timed, each phase's median, p90,
p99 and maximum over its steady steps, the slowest of them, and the time spent outside the steps:
the evaluation passes and the profiler's own time.

The traced steps are a window of a few steps; the scalars are every step of the run, so these are
the figures to quote for the run as a whole (and to compare ranks by). Like the summary printed on
close, they leave out the first step and the steps that compiled (`phaseprof.steady`), and say so:
one compiling step can take longer than a thousand steady ones. Percentiles interpolate linearly
between the closest ranks (numpy's default).
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import (
    COMPILE,
    EVAL_TAG,
    HOOK_TAG,
    NOT_PHASE_TAGS,
    PHASES,
    PROFILER_TAG,
    STEP_GPU_TAG,
    STEP_TAG,
    host_tag,
    parse_tag,
)
from phaseprof.steady import steady_steps

from ..answers import ApartTime, PhaseSpread, SlowStep, WholeRun
from ..reading.scalars import Scalars

#: Slowest steps listed.
SLOWEST = 5


def scalars_of(series: dict[str, list[tuple[int, float]]]) -> Scalars:
    """`Scalars` from ``tag -> [(step, value)]`` (what TensorBoard's data provider gives)."""
    steps = np.array(sorted({s for points in series.values() for s, _ in points}), dtype=np.int64)
    values = {}
    for tag, points in series.items():
        column = np.full(len(steps), np.nan)
        if points:
            at = np.searchsorted(steps, np.array([s for s, _ in points], dtype=np.int64))
            column[at] = [v for _, v in points]
        values[tag] = column
    return Scalars(steps=steps, wall_time=np.full(len(steps), np.nan), values=values, files=[])


def whole_run(scalars: Scalars, rank: int | None = None) -> WholeRun | None:
    """The figures of one set of scalars, or None if it holds no step times."""
    step_ms = scalars.values.get(STEP_TAG)
    if step_ms is None:
        return None
    timed = ~np.isnan(step_ms)
    if not timed.any():
        return None
    everything = scalars.steps[timed]
    compile_ms = scalars.values.get(host_tag(COMPILE))
    steady, left_out = steady_steps(everything, compile_ms[timed] if compile_ms is not None else None)
    timed[timed] = steady
    numbers = scalars.steps[timed]
    host: dict[str, np.ndarray] = {}
    spreads = [_spread("step", "host", step_ms[timed])]
    gpu_spreads = []
    if STEP_GPU_TAG in scalars.values:
        gpu_spreads.append(_spread("step", "gpu", scalars.values[STEP_GPU_TAG][timed]))
    for tag in sorted(scalars.values, key=_phase_order):
        if tag in (STEP_TAG, STEP_GPU_TAG) or tag in NOT_PHASE_TAGS:
            continue
        parsed = parse_tag(tag)
        if parsed is None:
            continue
        phase, on_gpu = parsed
        column = scalars.values[tag][timed]
        if on_gpu:
            gpu_spreads.append(_spread(phase, "gpu", column))
        else:  # a phase first seen later in the run took no time in the steps before
            host[phase] = np.nan_to_num(column, nan=0.0)
            spreads.append(_spread(phase, "host", host[phase]))
    spreads = [s for s in spreads + gpu_spreads if s is not None]
    profiler, evaluation = scalars.values.get(PROFILER_TAG), scalars.values.get(EVAL_TAG)
    hook = scalars.values.get(HOOK_TAG)
    run_ms = sum(float(np.nansum(v)) for v in (step_ms, profiler, evaluation, hook)
                 if v is not None)
    return WholeRun(rank=rank, steps=int(timed.sum()), first_step=int(everything[0]),
                    last_step=int(everything[-1]), phases=spreads, slowest=_slowest(numbers, step_ms[timed], host),
                    profiler=_apart(scalars.steps, profiler, run_ms),
                    eval=_apart(scalars.steps, evaluation, run_ms), left_out=left_out,
                    hook=_apart(scalars.steps, hook, run_ms))


def _phase_order(tag: str) -> tuple:
    parsed = parse_tag(tag)
    phase = parsed[0] if parsed else tag
    return (PHASES.index(phase) if phase in PHASES else len(PHASES), phase)


def _spread(phase: str, clock: str, values: np.ndarray) -> PhaseSpread | None:
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    median, p90, p99 = np.percentile(values, [50, 90, 99])
    return PhaseSpread(phase=phase, clock=clock, steps=len(values), mean_ms=_r(values.mean()), median_ms=_r(median),
                       p90_ms=_r(p90), p99_ms=_r(p99), max_ms=_r(values.max()), total_s=_r(values.sum() / 1000.0))


def _slowest(numbers: np.ndarray, step_ms: np.ndarray, host: dict[str, np.ndarray]) -> list[SlowStep]:
    order = np.argsort(-step_ms, kind="stable")[:SLOWEST]
    medians = {p: float(np.median(v)) for p, v in host.items()}
    out = []
    for i in order.tolist():
        phases = {p: _r(v[i]) for p, v in host.items()}
        over = {p: float(v[i]) - medians[p] for p, v in host.items()}
        worst = max(over, key=over.get) if over else "step"
        out.append(SlowStep(step=int(numbers[i]), wall_ms=_r(step_ms[i]), phases=phases, phase=worst,
                            phase_over_median_ms=_r(over.get(worst, 0.0))))
    return out


def _apart(steps: np.ndarray, column: np.ndarray | None, run_ms: float) -> ApartTime | None:
    """The figures of one tag of time outside the steps (``run_ms``: steps and apart time together)."""
    if column is None:
        return None
    values = np.nan_to_num(column, nan=0.0)
    some = values[values > 0]
    total = float(values.sum())
    k = int(np.argmax(values))
    return ApartTime(total_ms=_r(total), steps=len(some), median_ms=_r(np.median(some)) if len(some) else 0.0,
                       max_ms=_r(values[k]), max_step=int(steps[k]), share=round(total / run_ms, 5) if total else 0.0)


def _r(value: float) -> float:
    return round(float(value), 4)

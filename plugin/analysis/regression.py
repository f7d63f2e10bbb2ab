"""Did NEW get slower than BASE? Per phase, the change of the median step time with a confidence
interval, from the per-step times of each side.

A side is one or more runs (or ranks). Its figure is the median time per step of each run, averaged
over its runs (weighted by their steps): for one run, the median. The interval is a bootstrap of the
ratio NEW / BASE - 1 in two stages, as the data came: the runs are resampled (runs differ from one
another — another moment's load, another node — more than their steps suggest), then each run's
steps. The median of a run's resampled steps is drawn exactly rather than by resampling: the median
of a resample of n values is the empirical quantile at the k-th order statistic of n uniforms,
which is Beta(k, n + 1 - k) distributed, so each draw costs O(1) for any number of steps (100,000
steps cost what 10 do). The seed is fixed: the same inputs always give the same verdict.

A side of more than ``RUNS_DRAWN`` runs (the ranks of a large job count as runs) would need runs x
draws numbers, gigabytes at 10,000 runs: each draw then resamples ``RUNS_DRAWN`` of its runs, each
picked run's steps drawn on their own, and the draws' spread about their mean is narrowed by
sqrt(RUNS_DRAWN / runs), to the spread of a mean of all the runs (the m-out-of-n bootstrap, Bickel,
Götze and van Zwet 1997). Memory and time then stay those of ``RUNS_DRAWN`` runs; the intervals
agree with the full bootstrap's to a few hundredths of their width (tests/test_compare.py).

With two runs or more on each side the interval is also never narrower than a Welch *t* interval
on the logarithms of the runs' figures. The bootstrap of a few runs cannot reach past the runs it
was given (its most extreme draw repeats the most extreme run), so with four runs a side it claims
more confidence than four numbers hold: one run that caught a burst of load then reads as a change.
The *t* interval widens with fewer runs as it should; with many runs the two agree.

A figure counts as *slower* only when the whole interval lies above the threshold (NEW is slower by
more than the threshold with that confidence) and the change is also at least ``min_share`` of the
base step (a phase of 0.01 ms that doubles is not a regression anyone would act on). Intervals hold
jointly over all figures compared (Bonferroni), so comparing more phases does not raise the chance
of a false alarm. With one run per side, run-to-run drift (another machine, another load) cannot be
in the interval: that is what the threshold is for, and why several runs per side, taking turns
on one machine, make the sharper gate.

A figure only one side has (no run of the other recorded it: a phase it never ran) is not
comparable: 0 ms against a time would read as a regression of the whole time, when the two runs
only measured different things. It is shown, never gated.
"""

from __future__ import annotations

import numpy as np

from ..answers import Change
from .student_t import t_quantile_two_sided

#: Draws of the bootstrap per figure.
DRAWS = 20_000
SEED = 0
#: Fewer steps than this on a side give no interval (the figure is shown, never gated).
MIN_STEPS = 5
#: A side of more runs than this resamples this many of them per draw (see `_many_runs_draws`).
RUNS_DRAWN = 100


def median_draws(values: np.ndarray, rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    """``draws`` bootstrap replicates of the median of ``values``, drawn exactly (see module doc)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    return _median_draws_of(x, np.zeros(draws, dtype=np.int64), np.full(draws, len(x)), rng)


def _median_draws_of(ordered: np.ndarray, start: np.ndarray, steps: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
    """A bootstrap replicate of the median of each run ``ordered[start:start + steps]`` (sorted;
    ``start`` and ``steps`` of one shape, the draws' shape), drawn exactly (see module doc)."""
    out = np.empty(steps.size)
    # the draws grouped by their runs' number of steps: numpy draws a Beta of one (a, b) fast
    order = np.argsort(steps, axis=None, kind="stable")
    lengths, counts = np.unique(steps.ravel()[order], return_counts=True)
    for n, at in zip(lengths.tolist(), np.split(order, np.cumsum(counts)[:-1])):
        first = start.ravel()[at]
        k = (n + 1) // 2
        u = rng.beta(k, n + 1 - k, size=len(at))
        # the k-th order statistic of n uniforms is u: the value at rank ceil(u * n) of the steps
        lower = ordered[first + np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)]
        if n % 2:
            out[at] = lower
            continue
        # even n: the mean of the k-th and (k+1)-th order statistics; the next one is the least of
        # the n - k uniforms above the k-th
        u2 = u + (1.0 - u) * rng.beta(1, n - k, size=len(at))
        upper = ordered[first + np.clip(np.ceil(u2 * n).astype(np.int64) - 1, 0, n - 1)]
        out[at] = (lower + upper) / 2.0
    return out.reshape(steps.shape)


def _sorted_runs(runs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All ``runs``' steps in one array, each run's sorted: (steps, each run's start, its steps)."""
    steps = np.array([len(r) for r in runs], dtype=np.int64)
    start = np.cumsum(steps) - steps
    flat = np.concatenate(runs).astype(np.float64) if runs else np.zeros(0)
    return flat[np.lexsort((flat, np.repeat(np.arange(len(runs)), steps)))], start, steps


def run_medians(runs: list[np.ndarray]) -> np.ndarray:
    """Each (non-empty) run's median, as ``np.median`` gives it, in whole-array steps."""
    ordered, start, steps = _sorted_runs(runs)
    return (ordered[start + (steps - 1) // 2] + ordered[start + steps // 2]) / 2.0


def side_draws(runs: list[np.ndarray], rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    """Bootstrap replicates of a side's figure: runs resampled, then each run's steps."""
    if len(runs) > RUNS_DRAWN:
        return _many_runs_draws(runs, rng, draws)
    within = np.stack([median_draws(r, rng, draws) for r in runs])  # (runs, draws)
    if len(runs) == 1:
        return within[0]
    weights = np.array([len(r) for r in runs], dtype=np.float64)
    pick = rng.integers(0, len(runs), size=(draws, len(runs)))
    return (within[pick, np.arange(draws)[:, None]] * weights[pick]).sum(axis=1) / weights[pick].sum(axis=1)


def _many_runs_draws(runs: list[np.ndarray], rng: np.random.Generator, draws: int) -> np.ndarray:
    """`side_draws` of more than `RUNS_DRAWN` runs, in memory and time that do not grow with them:
    each draw resamples `RUNS_DRAWN` runs and each picked run's steps, and the draws' spread about
    their mean is narrowed by sqrt(RUNS_DRAWN / runs), the spread of a mean of all the runs (the
    m-out-of-n bootstrap)."""
    ordered, start, steps = _sorted_runs(runs)
    pick = rng.integers(0, len(runs), size=(draws, RUNS_DRAWN))
    weights = steps[pick].astype(np.float64)
    within = _median_draws_of(ordered, start[pick], steps[pick], rng)
    figure = (within * weights).sum(axis=1) / weights.sum(axis=1)
    centre = figure.mean()
    return centre + (figure - centre) * np.sqrt(RUNS_DRAWN / len(runs))


def quantiles(draws: np.ndarray, ps: list[float]) -> np.ndarray:
    """``np.quantile`` of draws that may hold ``inf`` (a base draw of 0): a quantile that reaches into
    them is ``inf``, a true bound, where numpy's interpolation next to an ``inf`` gives NaN."""
    finite = np.isfinite(draws)
    m = int(finite.sum())
    if m == len(draws):
        return np.quantile(draws, ps)
    # numpy's linear method sits at position (n - 1) * p of the sorted draws; up to the last finite
    # one its neighbours are finite once the infs are capped at the largest finite draw
    capped = np.where(finite, draws, draws[finite].max() if m else 0.0)
    return np.where((len(draws) - 1) * np.asarray(ps) > m - 1, np.inf, np.quantile(capped, ps))


def side_figure(runs: list[np.ndarray]) -> float:
    """The median time per step of each run, averaged over the runs weighted by their steps."""
    runs = [r for r in runs if len(r)]
    steps = sum(len(r) for r in runs)
    # summed one run after the other, as Python sums floats
    return sum((run_medians(runs) * [len(r) for r in runs]).tolist()) / steps if steps else 0.0


def run_interval(base: list[np.ndarray], new: list[np.ndarray], alpha: float) -> tuple[float, float] | None:
    """A (1 - alpha) Welch *t* interval of NEW / BASE - 1 from the runs' medians (on their logarithms);
    None with fewer than two runs a side or a run whose median is not positive."""
    if len(base) < 2 or len(new) < 2:
        return None
    a, b = run_medians(base), run_medians(new)
    if (a <= 0).any() or (b <= 0).any():
        return None
    la, lb = np.log(a), np.log(b)
    va, vb = la.var(ddof=1) / len(la), lb.var(ddof=1) / len(lb)
    se = np.sqrt(va + vb)
    diff = lb.mean() - la.mean()
    if se == 0:
        return float(np.expm1(diff)), float(np.expm1(diff))
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))  # Welch-Satterthwaite
    q = t_quantile_two_sided(float(df), alpha)
    return float(np.expm1(diff - q * se)), float(np.expm1(diff + q * se))


def compare_figures(figures: list[tuple[str, str, list[np.ndarray], list[np.ndarray]]], *, base_step_ms: float,
                    threshold: float, confidence: float, min_share: float) -> list[Change]:
    """A `Change` per (phase, clock, base runs' per-step ms, new runs' per-step ms), intervals joint
    at ``confidence``; a figure with no step on one side is not comparable."""
    figures = [(p, c, [r for r in a if len(r)], [r for r in b if len(r)]) for p, c, a, b in figures]
    steps = [(sum(map(len, a)), sum(map(len, b))) for _, _, a, b in figures]
    gated = [n for n in steps if min(n) >= MIN_STEPS]  # (a figure one side lacks has 0 steps there)
    alpha = (1.0 - confidence) / max(len(gated), 1)
    rng = np.random.default_rng(SEED)
    floor = min_share * base_step_ms
    out = []
    for (phase, clock, base, new), (n_base, n_new) in zip(figures, steps):
        base_ms, new_ms = side_figure(base), side_figure(new)
        if not (n_base and n_new):
            out.append(Change(
                phase=phase, clock=clock, base_ms=round(base_ms, 4), new_ms=round(new_ms, 4),
                delta_ms=round(new_ms - base_ms, 4), change=None, low=None, high=None,
                base_steps=n_base, new_steps=n_new, slower=False, faster=False, comparable=False))
            continue
        delta = new_ms - base_ms
        change = delta / base_ms if base_ms > 0 else None
        low = high = None
        if n_base >= MIN_STEPS and n_new >= MIN_STEPS:
            a, b = side_draws(base, rng), side_draws(new, rng)
            if base_ms > 0:
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(a > 0, b / a - 1.0, np.inf)
            else:  # nothing on the base side: the change as a share of the base step
                ratio = (b - a) / base_step_ms if base_step_ms > 0 else np.zeros(len(a))
            low, high = (float(v) for v in quantiles(ratio, [alpha / 2, 1 - alpha / 2]))
            runs = run_interval(base, new, alpha)
            if runs is not None:
                low, high = min(low, runs[0]), max(high, runs[1])
        big_enough = abs(delta) >= floor
        out.append(Change(
            phase=phase, clock=clock, base_ms=round(base_ms, 4), new_ms=round(new_ms, 4), delta_ms=round(delta, 4),
            change=None if change is None else round(change, 4),
            low=None if low is None else round(low, 4), high=None if high is None else round(high, 4),
            base_steps=n_base, new_steps=n_new,
            slower=low is not None and low > threshold and delta > 0 and big_enough,
            faster=high is not None and high < -threshold and delta < 0 and big_enough,
        ))
    return out

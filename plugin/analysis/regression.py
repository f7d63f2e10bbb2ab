"""Did NEW get slower than BASE? Per phase, the change of the median step time with a confidence
interval, from the per-step times of each side.

The interval is a bootstrap of the ratio of medians (NEW / BASE - 1), drawn exactly rather than by
resampling: the median of a resample of n values is the empirical quantile at the k-th order
statistic of n uniforms, which is Beta(k, n + 1 - k) distributed, so each draw costs O(1) for any
number of steps (100,000 steps cost what 10 do). The seed is fixed: the same inputs always give the
same verdict.

A figure counts as *slower* only when the whole interval lies above the threshold (NEW is slower by
more than the threshold with that confidence) and the change is also at least ``min_share`` of the
base step (a phase of 0.01 ms that doubles is not a regression anyone would act on). Intervals hold
jointly over all figures compared (Bonferroni), so comparing more phases does not raise the chance
of a false alarm. Steps are taken as independent draws; run-to-run drift (another machine, another
load) is not in the interval: that is what the threshold is for.
"""

from __future__ import annotations

import numpy as np

from ..answers import Change

#: Draws of the bootstrap per figure.
DRAWS = 20_000
SEED = 0
#: Fewer steps than this on a side give no interval (the figure is shown, never gated).
MIN_STEPS = 5


def median_draws(values: np.ndarray, rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    """``draws`` bootstrap replicates of the median of ``values``, drawn exactly (see module doc)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    k = (n + 1) // 2
    u = rng.beta(k, n + 1 - k, size=draws)
    lower = x[np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)]
    if n % 2:
        return lower
    # even n: the mean of the k-th and (k+1)-th order statistics; the next one is the least of the
    # n - k uniforms above the k-th
    u2 = u + (1.0 - u) * rng.beta(1, n - k, size=draws)
    upper = x[np.clip(np.ceil(u2 * n).astype(np.int64) - 1, 0, n - 1)]
    return (lower + upper) / 2.0


def compare_figures(figures: list[tuple[str, str, np.ndarray, np.ndarray]], *, base_step_ms: float,
                    threshold: float, confidence: float, min_share: float) -> list[Change]:
    """A `Change` per (phase, clock, base per-step ms, new per-step ms), intervals joint at ``confidence``."""
    gated = [f for f in figures if len(f[2]) >= MIN_STEPS and len(f[3]) >= MIN_STEPS]
    alpha = (1.0 - confidence) / max(len(gated), 1)
    rng = np.random.default_rng(SEED)
    floor = min_share * base_step_ms
    out = []
    for phase, clock, base, new in figures:
        base_ms = float(np.median(base)) if len(base) else 0.0
        new_ms = float(np.median(new)) if len(new) else 0.0
        delta = new_ms - base_ms
        change = delta / base_ms if base_ms > 0 else None
        low = high = None
        if len(base) >= MIN_STEPS and len(new) >= MIN_STEPS:
            a, b = median_draws(base, rng), median_draws(new, rng)
            if base_ms > 0:
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(a > 0, b / a - 1.0, np.inf)
            else:  # nothing on the base side: the change as a share of the base step
                ratio = (b - a) / base_step_ms if base_step_ms > 0 else np.zeros(len(a))
            low, high = (float(v) for v in np.quantile(ratio, [alpha / 2, 1 - alpha / 2]))
        big_enough = abs(delta) >= floor
        out.append(Change(
            phase=phase, clock=clock, base_ms=round(base_ms, 4), new_ms=round(new_ms, 4), delta_ms=round(delta, 4),
            change=None if change is None else round(change, 4),
            low=None if low is None else round(low, 4), high=None if high is None else round(high, 4),
            base_steps=len(base), new_steps=len(new),
            slower=low is not None and low > threshold and delta > 0 and big_enough,
            faster=high is not None and high < -threshold and delta < 0 and big_enough,
        ))
    return out

"""Noise-aware outliers: robust spread around the median, slow and fast, and too few to judge."""

from __future__ import annotations

import pytest

from phaseprof.plugin.analysis.noise import MIN_VALUES, noise, outliers


def test_a_steady_run_with_one_slow_and_one_fast_step():
    walls = [95.6, 95.7, 95.5, 95.8, 95.6, 140.0, 35.1]
    assert outliers(walls) == ([5], [6])


def test_a_swing_within_the_floor_is_noise_however_steady_the_rest():
    # HTA's V100 run: the slowest steady step is 0.1 ms (0.1%) over the median: no news
    walls = [35.12, 72.08, 95.70, 95.55, 95.70]
    n = noise(walls)
    assert not n.slow(95.70)
    assert n.fast(35.12) and n.fast(72.08)
    assert n.median == 95.55 and n.band == pytest.approx(0.05 * 95.55)


def test_spread_follows_the_typical_steps_not_the_outliers():
    # the median absolute deviation is not dragged by the outlier it is looking for
    walls = [100, 110, 90, 105, 95, 400]
    n = noise(walls)
    assert n.median == pytest.approx(102.5)
    assert n.slow(400) and not n.slow(110)


def test_too_few_steps_to_judge():
    assert MIN_VALUES == 3
    n = noise([100.0, 300.0])
    assert not n.judged and not n.slow(300.0) and not n.fast(100.0)
    assert outliers([100.0, 300.0]) == ([], [])
    assert noise([]).count == 0

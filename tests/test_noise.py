"""Noise-aware outliers: robust spread around the median, slow and fast, and too few to judge."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis.noise import (
    CEILING_SHARE,
    FLOOR_SHARE,
    MIN_VALUES,
    Noise,
    lower_median,
    noise,
    outliers,
)


def test_a_steady_run_with_one_slow_and_one_fast_step():
    walls = [95.6, 95.7, 95.5, 95.8, 95.6, 140.0, 35.1]
    assert outliers(walls) == ([5], [6])


def test_a_swing_within_the_floor_is_noise_however_steady_the_rest():
    # HTA's V100 run: the slowest steady step is 0.1 ms (0.1%) over the median: no news
    walls = [35.12, 72.08, 95.70, 95.55, 95.70]
    n = noise(walls)
    assert not n.slow(95.70)
    assert n.fast(35.12) and n.fast(72.08)
    assert n.median == 95.55 and n.band == pytest.approx(FLOOR_SHARE * 95.55)


def test_the_band_is_three_robust_standard_deviations_between_floor_and_ceiling():
    walls = [100, 102, 98, 104, 96, 101, 99]  # median 100, median absolute deviation 2
    n = noise(walls)
    assert n.median == 100 and n.band == pytest.approx(3 * 1.4826 * 2)
    assert n.slow(109) and not n.slow(108)


def test_spread_follows_the_typical_steps_not_the_outliers():
    # the median absolute deviation is not dragged by the outlier it is looking for
    walls = [100, 110, 90, 105, 95, 400]
    n = noise(walls)
    assert n.median == 100  # the lower middle value: a step of the run
    assert n.slow(400) and not n.slow(110)


def test_the_median_of_an_even_count_is_the_lower_middle_value():
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert lower_median([3.0, 1.0, 2.0]) == 2.0
    assert noise([10.0, 40.0, 20.0, 30.0, 50.0, 60.0]).median == 30.0


def test_steps_in_two_clusters_do_not_widen_the_band_past_a_quarter_of_the_median():
    # every other batch waits for data: steps of 70 and 160 ms. Their median absolute deviation is
    # 80 ms, three robust SDs ±355 ms around a 160 ms median: a step of 240 ms (1.5x) would be noise.
    walls = [70.0, 160.0] * 5 + [240.0]
    n = noise(walls)
    assert n.median == 160.0 and n.band == pytest.approx(CEILING_SHARE * 160.0)
    assert n.slow(240.0) and n.fast(70.0)


def test_a_step_twice_or_half_the_median_is_beyond_noise_in_any_sample():
    rng = np.random.default_rng(17)
    for _ in range(300):
        shape = rng.integers(3)
        size = int(rng.integers(MIN_VALUES, 40))
        if shape == 0:
            walls = rng.normal(100, rng.uniform(0, 60), size)
        elif shape == 1:  # two clusters
            walls = np.where(rng.random(size) < 0.5, rng.uniform(20, 80), rng.uniform(100, 300))
        else:
            walls = rng.lognormal(4, rng.uniform(0, 1.5), size)
        walls = np.abs(walls) + 1.0
        n = noise(walls)
        assert n.judged
        assert n.slow(2 * n.median) and n.fast(0.5 * n.median), (walls.tolist(), n)
        assert FLOOR_SHARE * n.median <= n.band + 1e-9 and n.band <= CEILING_SHARE * n.median + 1e-9


def test_too_few_steps_to_judge():
    assert MIN_VALUES == 5
    n = noise([100.0, 100.0, 100.0, 400.0])  # three steady steps and one four times slower: still too few
    assert not n.judged and not n.slow(400.0) and not n.fast(100.0)
    assert outliers([100.0, 300.0]) == ([], [])
    assert outliers([100.0, 100.0, 100.0, 100.0, 400.0]) == ([4], [])
    assert noise([]).count == 0


def test_a_step_on_the_edge_of_the_band_is_noise():
    # steady steps: the band is its floor, 5% of the 100 ms median; a step 5 ms off lies on its edge
    n = noise([100.0, 100.0, 100.0, 100.0, 200.0])
    assert (n.median, n.band) == (100.0, 5.0)
    assert not n.slow(105.0) and not n.fast(95.0)
    assert n.slow(105.001) and n.fast(94.999)
    assert outliers([100.0] * 4 + [105.0, 95.0]) == ([], [])


def test_missing_values_are_left_out():
    # a step without a figure (NaN, or None from JSON's null) moves neither the median nor the band
    steps = [100.0, 102.0, 98.0, 104.0, 96.0, 101.0, 99.0]
    for missing in (float("nan"), None):
        assert noise(steps + [missing]) == noise(steps)
        assert outliers(steps + [missing, 130.0]) == ([8], [])


def test_no_values_give_a_median_and_band_of_zero():
    assert noise([]) == Noise(median=0.0, band=0.0, count=0)
    assert noise([float("nan")] * 6) == Noise(median=0.0, band=0.0, count=0)

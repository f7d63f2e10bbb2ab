"""Student's t for the Welch intervals: the incomplete beta, the two-sided tail and its quantile,
against closed forms (t with 1 and 2 degrees of freedom, beta with small whole parameters) and
mpmath at 30 digits. The published table values are in test_compare."""

from __future__ import annotations

import math

import mpmath
import pytest

from phaseprof.plugin.analysis.student_t import (
    regularized_beta,
    t_quantile_two_sided,
    t_tail_two_sided,
)


@pytest.mark.parametrize("x", [0.05, 0.3, 0.5, 0.7, 0.95])
def test_the_incomplete_beta_of_small_whole_parameters_is_its_polynomial(x):
    assert regularized_beta(x, 1, 1) == pytest.approx(x, rel=1e-12)
    assert regularized_beta(x, 2, 1) == pytest.approx(x**2, rel=1e-12)
    assert regularized_beta(x, 1, 2) == pytest.approx(1 - (1 - x) ** 2, rel=1e-12)
    assert regularized_beta(x, 2, 2) == pytest.approx(3 * x**2 - 2 * x**3, rel=1e-12)


def test_the_incomplete_beta_agrees_with_mpmath_on_both_sides_of_its_symmetry():
    mpmath.mp.dps = 30
    for a, b in [(0.5, 0.5), (2.5, 0.5), (8.0, 0.5), (0.7, 3.2), (50.0, 0.5), (3.0, 30.0)]:
        for x in (0.01, 0.2, 0.5, 0.8, 0.99, 0.9999):
            exact = float(mpmath.betainc(a, b, 0, x, regularized=True))
            assert regularized_beta(x, a, b) == pytest.approx(exact, rel=1e-10), (x, a, b)


def test_the_incomplete_beta_is_0_and_1_at_its_ends():
    assert regularized_beta(0.0, 2.0, 0.5) == 0.0
    assert regularized_beta(1.0, 2.0, 0.5) == 1.0
    assert regularized_beta(0.3, 2.0, 0.5, y=0.0) == 1.0  # the caller's 1 - x rules


def test_a_precise_one_minus_x_is_used_where_the_subtraction_would_lose_it():
    # x = 1 - 1e-12 as a double is off by up to 1e-16 / 1e-12 = 1e-4 relative in 1 - x;
    # with y given exactly, the tail is I_y(b, a) to full precision
    mpmath.mp.dps = 30
    y = 1e-12 / 3
    exact = 1 - float(
        mpmath.betainc(0.5, 2.0, 0, mpmath.mpf(1) / 3 * mpmath.mpf("1e-12"), regularized=True)
    )
    assert regularized_beta(1 - y, 2.0, 0.5, y=y) == pytest.approx(exact, rel=1e-14)
    tail = 1 - regularized_beta(1 - y, 2.0, 0.5, y=y)
    assert tail == pytest.approx(
        float(
            mpmath.betainc(0.5, 2.0, 0, mpmath.mpf(1) / 3 * mpmath.mpf("1e-12"), regularized=True)
        ),
        rel=1e-6,
    )


@pytest.mark.parametrize("q", [0.1, 1.0, 2.5, 12.7, 300.0])
def test_the_tail_of_t_with_1_and_2_degrees_of_freedom_is_its_closed_form(q):
    assert t_tail_two_sided(1, q) == pytest.approx(
        1 - 2 / math.pi * math.atan(q), rel=1e-10
    )  # Cauchy
    assert t_tail_two_sided(2, q) == pytest.approx(1 - q / math.sqrt(2 + q * q), rel=1e-10)


def test_the_tail_at_many_degrees_of_freedom_agrees_with_mpmath():
    # x = df / (df + q²) is within 4e-5 of 1 there: its 1 - x is passed as q² / (df + q²)
    mpmath.mp.dps = 30
    for df in (1e3, 1e5, 1e6):
        for q in (1.96, 3.29):
            d, t = mpmath.mpf(df), mpmath.mpf(q)
            exact = float(
                mpmath.betainc(d / 2, mpmath.mpf(1) / 2, 0, d / (d + t * t), regularized=True)
            )
            assert t_tail_two_sided(df, q) == pytest.approx(exact, rel=1e-9), (df, q)
    # a small q: 1 - x is q² / df, 1e-11 or less, which 1 - x computed would give only to 1e-5
    for df in (1e5, 1e6):
        d, t = mpmath.mpf(df), mpmath.mpf("0.001")
        exact = float(
            mpmath.betainc(d / 2, mpmath.mpf(1) / 2, 0, d / (d + t * t), regularized=True)
        )
        assert t_tail_two_sided(df, 0.001) == pytest.approx(exact, rel=1e-10), df


@pytest.mark.parametrize("alpha", [0.5, 0.1, 0.05, 0.01, 1e-4])
def test_the_quantile_of_t_with_1_and_2_degrees_of_freedom_is_its_closed_form(alpha):
    assert t_quantile_two_sided(1, alpha) == pytest.approx(
        math.tan(math.pi / 2 * (1 - alpha)), rel=1e-10
    )
    p = 1 - alpha
    assert t_quantile_two_sided(2, alpha) == pytest.approx(
        p * math.sqrt(2 / (1 - p * p)), rel=1e-10
    )


@pytest.mark.parametrize(
    "df, alpha",
    [
        (0, 0.05),
        (-1, 0.05),
        (float("nan"), 0.05),
        (5, 0),
        (5, 1),
        (5, -0.1),
        (5, 1.5),
        (5, float("nan")),
    ],
)
def test_a_quantile_outside_its_domain_is_refused_naming_both_figures(df, alpha):
    with pytest.raises(ValueError) as caught:
        t_quantile_two_sided(df, alpha)
    assert str(caught.value) == f"need 0 < alpha < 1 and df > 0, not alpha={alpha}, df={df}"

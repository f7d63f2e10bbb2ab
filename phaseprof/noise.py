"""How far from typical a step (or a rank) must be before it is news: robust spread, not guesswork.

Step times are noisy (a shared machine, the allocator, the OS) and a few steps are no sample. A value
is beyond noise when it lies further from the median than ``K`` robust standard deviations
(1.4826 x the median absolute deviation, which is the standard deviation for normal data and is not
dragged by the outliers it is looking for), never closer than ``FLOOR_SHARE`` of the median (a 0.1 ms
swing in a 95 ms step is not worth a sentence however steady the other steps were) and never further
than ``CEILING_SHARE`` of it: steps in two clusters (every other batch waiting for data, two spans of
different speed) inflate the median absolute deviation to half the gap between the clusters, and a
band of ±105 ms around a 115 ms median would call a step twice the median "noise". A step a quarter
off the median step is news however noisy the others are. With fewer than ``MIN_VALUES`` values there
is nothing to judge against (three steps give a median absolute deviation from one difference), and
the answer says so.

The median is the lower middle value for an even count, so that "the median step" is always a step
of the run, and the figure a sentence compares against is that step's own.

Both sides use this one rule: the reports (``phaseprof.plugin.analysis``) and the training side's
slowdown trigger (``PhaseProfiler(capture_on_slowdown=True)``), so torch-free and light.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

#: Robust standard deviations from the median beyond which a value is an outlier.
K = 3.0
#: The noise band is at least this share of the median,
FLOOR_SHARE = 0.05
#: and at most this share.
CEILING_SHARE = 0.25
#: Fewer values than this are too few to judge.
MIN_VALUES = 5
#: MAD x this estimates the standard deviation of normal data.
_MAD_TO_SD = 1.4826


class Noise(msgspec.Struct, frozen=True):
    """The typical value of a sample and how far from it a value must lie to be beyond noise."""

    median: float
    band: float  # half-width of the noise band around the median
    count: int

    @property
    def judged(self) -> bool:
        """Enough values to tell an outlier from noise."""
        return self.count >= MIN_VALUES

    def slow(self, value: float) -> bool:
        """Above the band (a step or rank slower than noise explains)."""
        return self.judged and value > self.median + self.band

    def fast(self, value: float) -> bool:
        """Below the band."""
        return self.judged and value < self.median - self.band


def noise(values: Sequence[float] | np.ndarray, k: float = K) -> Noise:
    """The (lower) median of ``values`` and the band ``k x robust SD``, kept within
    ``[FLOOR_SHARE, CEILING_SHARE] x |median|``."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return Noise(median=0.0, band=0.0, count=0)
    median = lower_median(v)
    mad = float(np.median(np.abs(v - median)))
    band = min(max(k * _MAD_TO_SD * mad, FLOOR_SHARE * abs(median)), CEILING_SHARE * abs(median))
    return Noise(median=median, band=band, count=len(v))


def lower_median(values: Sequence[float] | np.ndarray) -> float:
    """The middle value; the lower of the two middle ones for an even count (always one of the values)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    return float(v[(len(v) - 1) // 2])


def outliers(values: Sequence[float] | np.ndarray) -> tuple[list[int], list[int]]:
    """Indices of the values above and below the noise band (slow, fast); none when too few."""
    n = noise(values)
    v = np.asarray(values, dtype=np.float64)
    slow = [i for i, x in enumerate(v.tolist()) if n.slow(x)]
    fast = [i for i, x in enumerate(v.tolist()) if n.fast(x)]
    return slow, fast

"""The noise rule of every report (`phaseprof.noise`): shared with the training side, whose
slowdown trigger (``capture_on_slowdown``) judges steps by the same rule."""

from phaseprof.noise import CEILING_SHARE, FLOOR_SHARE, MIN_VALUES, K, Noise, lower_median, noise, outliers

__all__ = ["CEILING_SHARE", "FLOOR_SHARE", "K", "MIN_VALUES", "Noise", "lower_median", "noise", "outliers"]

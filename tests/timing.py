"""Helpers of the tests that hold phaseprof's per-step figures against independent timers."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar of a run, by tag and step, read back by TensorBoard's own reader."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def within(measured: float, reference: float, rel: float = 0.05, abs_ms: float = 0.5) -> bool:
    """Within 5% or 0.5 ms of the reference."""
    return abs(measured - reference) <= max(rel * reference, abs_ms)


def agree(what: str, measured: list[float], reference: list[float]) -> None:
    """Every step within 5% or 0.5 ms of its reference, but a fifth of them at most: on a shared,
    loaded machine a preemption that falls between the two timers' clock reads (in the framework's
    own code around a phase) stretches that step's gap past it. The median gap must hold all the
    same, so a systematic error fails."""
    assert len(measured) == len(reference), (what, measured, reference)
    off = [i for i, (m, r) in enumerate(zip(measured, reference)) if not within(m, r)]
    median_gap = statistics.median(abs(m - r) for m, r in zip(measured, reference))
    assert len(off) <= max(1, len(measured) // 5) and median_gap <= max(0.5, 0.05 * statistics.median(reference)), (
        what, [(round(m, 3), round(r, 3)) for m, r in zip(measured, reference)])


class Timers:
    """Independent timers: ``(what, ms)`` in call order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, float]] = []

    def timed(self, what: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.log.append((what, (time.perf_counter() - t0) * 1e3))
        return out

    def per_step(self, what: str, calls: int) -> list[float]:
        """The sum of each run of ``calls`` consecutive timings of ``what``: one per step."""
        values = [ms for name, ms in self.log if name == what]
        return [sum(values[i:i + calls]) for i in range(0, len(values), calls)]

"""One finished step's phase times, as the loop thread hands them to the recorder."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepTimes:
    step: int  # the profiler's step number (ProfilerStep#<step> in traces)
    wall_time: float  # seconds since the epoch when the step ended
    host_log: list  # the step's host timeline, see `phases.Log`
    gpu_ms: dict[str, float] | None = None  # CUDA-event ms per phase, once resolved

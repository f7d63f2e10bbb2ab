"""One finished step's phase times, as the loop thread hands them to the recorder."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepTimes:
    step: int  # the profiler's step number (ProfilerStep#<step> in traces)
    wall_time: float  # seconds since the epoch when the step ended
    host_log: list  # the step's host timeline, see `tracker.Log`
    gpu_ms: dict[str, float] | None = None  # CUDA-event ms per phase, once resolved
    profiler_ns: int = 0  # the profiler's own time after the step (torch.profiler's step, trace export)
    training: bool = True  # False: the part-step open at close, with no training work (only its eval time counts)
    final: bool = False  # the part-step open at close: an evaluation pass still open ends with it

"""What each phase adds to the step's wall time, in the one measure that binds the step.

The host runs the loop and queues work for the GPU; a step takes about as long as the busier of the
two. The host's time on the critical path is its host time less what it spends waiting for the GPU
(synchronizing calls, a full launch queue); the GPU's is the time it is busy. When the GPU is busier
than the host's own work, the step is GPU-bound and a phase costs the device time of the work it
launched; otherwise the GPU waits on the host and a phase costs its host time (the GPU idle inside
it is what the GPU lost waiting for it). Without GPU activity every phase costs its host time.

Savings are estimated with the same two-resource picture: taking ``h`` of host work and ``g`` of GPU
work out of a step shortens it from ``max(H, G)`` to ``max(H - h, G - g)``.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

Measure = Literal["host", "gpu"]
HOST: Measure = "host"
GPU: Measure = "gpu"


class Figures(msgspec.Struct):
    """A worker's typical step: per-phase means (µs) over the steps it stands for."""

    phases: list[str]
    steps: list[int]  # the step numbers averaged
    wall_us: float
    cpu_us: np.ndarray  # per phase: host time (adds up to the wall time)
    gpu_us: np.ndarray  # device time of the work launched in the phase
    idle_us: np.ndarray  # host time with the GPU idle (NaN without GPU)
    wait_us: np.ndarray  # host time waiting for the GPU
    launches: np.ndarray  # device events launched
    exposed_comm_us: np.ndarray  # collective device time no other device work overlapped
    step_idle_us: float  # GPU idle in the step window (NaN without GPU)
    has_gpu: bool


class Costs(msgspec.Struct):
    """Each phase's cost in the binding measure, largest first; ``bound`` names that measure."""

    measure: Measure
    wall_us: float
    host_us: float  # host time on the critical path, all phases
    gpu_busy_us: float  # time the GPU was busy in the step window
    cost_us: dict[str, float]  # per phase, in ``measure``
    order: list[str]  # phases by cost, largest first

    def share(self, phase: str) -> float:
        return self.cost_us[phase] / self.wall_us if self.wall_us > 0 else 0.0


def phase_costs(f: Figures) -> Costs:
    """Rank the phases of ``f`` by what they add to the step (see the module docstring)."""
    host = f.cpu_us - f.wait_us
    busy = f.wall_us - f.step_idle_us if f.has_gpu and not np.isnan(f.step_idle_us) else 0.0
    measure = GPU if f.has_gpu and busy >= host.sum() else HOST
    cost = f.gpu_us if measure == GPU else f.cpu_us
    cost_us = {p: float(c) for p, c in zip(f.phases, cost.tolist())}
    order = sorted(f.phases, key=lambda p: -cost_us[p])
    return Costs(measure=measure, wall_us=f.wall_us, host_us=float(host.sum()), gpu_busy_us=float(busy),
                 cost_us=cost_us, order=order)


def saving_us(c: Costs, host_us: float = 0.0, gpu_us: float = 0.0) -> float:
    """How much shorter the step gets without ``host_us`` of host work and ``gpu_us`` of GPU work."""
    now = max(c.host_us, c.gpu_busy_us)
    return max(now - max(c.host_us - host_us, c.gpu_busy_us - gpu_us), 0.0)

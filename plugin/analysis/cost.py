"""What each phase adds to the step, in the one measure that binds the step.

The host runs the loop and queues work for the GPU; a step takes about as long as the busier of the
two. The host's time on the critical path is its host time less what it spends waiting for the GPU
(synchronizing calls, a full launch queue); the GPU's is its *compute* time: the union over all
streams of the compute work the step launched (communication, collectives, is not work: it waits on
other ranks or runs beside compute). When the GPU computes longer than the host's own work, the step
is GPU-bound, measured by the GPU, and a phase costs its part of the GPU compute time (an instant
shared by the phases whose compute runs in it, so the costs add up to the step's compute time);
otherwise the GPU waits on the host and a phase costs its host time (adding up to the wall time).
Without GPU activity every phase costs its host time. A share is always of the total in the same
measure: never a GPU figure over the host's.

Savings are estimated with the same two-resource picture: the GPU's time is its busy time, compute
plus the communication no compute overlaps (exposed); taking ``h`` of host work and ``g`` of GPU
time out of a step shortens it from ``max(H, G)`` to ``max(H - h, G - g)``.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

Measure = Literal["host", "gpu"]
HOST: Measure = "host"
GPU: Measure = "gpu"


class Figures(msgspec.Struct):
    """A worker's typical step: per-phase means (µs) over the steps it stands for. The GPU figures
    are the phases' parts of the step's (`model.GpuMeasures`): each adds up over the phases."""

    phases: list[str]
    steps: list[int]  # the step numbers averaged
    wall_us: float
    host_us: np.ndarray  # per phase: host time (adds up to the wall time)
    gpu_us: np.ndarray  # kernel time of the work launched in the phase (summed over streams)
    idle_us: np.ndarray  # host time with the GPU idle (NaN without GPU)
    wait_us: np.ndarray  # host time waiting for the GPU
    launches: np.ndarray  # device events launched
    busy_us: np.ndarray  # GPU busy time
    compute_us: np.ndarray  # GPU compute time
    comm_us: np.ndarray  # communication time
    exposed_comm_us: np.ndarray  # communication time with no compute on any stream
    step_idle_us: float  # GPU idle in the step window (NaN without GPU)
    has_gpu: bool
    #: per phase: launched device work not yet started (all streams), mean over its host time
    queue: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0))
    #: per phase: copies and sets with neither compute nor communication running
    exposed_memory_us: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0))


class Costs(msgspec.Struct):
    """Each phase's cost in the binding measure, largest first; ``measure`` names that measure and
    ``total_us`` the step's time in it (the wall time, or the GPU compute time): the costs add up to it."""

    measure: Measure
    wall_us: float
    total_us: float
    host_us: float  # host time on the critical path, all phases
    gpu_busy_us: float  # GPU busy time of the step: compute plus exposed communication and memory
    compute_us: float  # GPU compute time of the step's work
    cost_us: dict[str, float]  # per phase, in ``measure``
    order: list[str]  # phases by cost, largest first

    def share(self, phase: str) -> float:
        """The phase's cost as a share of the step's time in the same measure."""
        return self.cost_us[phase] / self.total_us if self.total_us > 0 else 0.0


def phase_costs(f: Figures) -> Costs:
    """Rank the phases of ``f`` by what they add to the step (see the module docstring)."""
    host = f.host_us - f.wait_us
    compute = float(f.compute_us.sum()) if f.has_gpu else 0.0
    measure = GPU if f.has_gpu and compute > 0 and compute >= host.sum() else HOST
    cost = f.compute_us if measure == GPU else f.host_us
    cost_us = {p: float(c) for p, c in zip(f.phases, cost.tolist())}
    order = sorted(f.phases, key=lambda p: -cost_us[p])
    # the GPU's busy time: compute, and communication and copies no compute hides
    exposed = float(f.exposed_comm_us.sum()) + float(f.exposed_memory_us.sum())
    busy = compute + exposed if f.has_gpu else 0.0
    return Costs(measure=measure, wall_us=f.wall_us, total_us=compute if measure == GPU else f.wall_us,
                 host_us=float(host.sum()), gpu_busy_us=busy, compute_us=compute, cost_us=cost_us, order=order)


def saving_us(c: Costs, host_us: float = 0.0, gpu_us: float = 0.0) -> float:
    """How much shorter the step gets without ``host_us`` of host work and ``gpu_us`` of GPU time."""
    now = max(c.host_us, c.gpu_busy_us)
    return max(now - max(c.host_us - host_us, c.gpu_busy_us - gpu_us), 0.0)

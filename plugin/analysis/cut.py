"""A trace's last step cut by the trace's end: left out of the summaries as warm-up steps are.

When the profiler stops while a step's device work is still queued, the trace's last step holds a
tail with no host event that ends with the trace: the host has left no trace of what it did, the
GPU drains its queue, and the step's wall time counts both. Kept in, such a step reads as a slow
step that is mostly untraced. The rule is narrow, because the GPU running on after the host is the
steady state of many loops (the host far ahead of a busy GPU, as in every step of a queue-bound
trace): the last step of a trace is cut when
  * its window ends where the trace ends, and the trace ends with device work (its last device
    event ends there), both within ``NOISE_SHARE`` of the step's wall time, and
  * after the step's last host event (other than its own marker and what encloses it) there is a
    tail longer than that noise in which device work runs and no host event starts or ends.
A step whose window closes before the trace's device work ends is complete, however far its work
trails.
"""

from __future__ import annotations

import numpy as np

from .nesting import Nesting
from .noise import FLOOR_SHARE
from .partition import Step

#: The trace's end within, and the tail beyond, this share of the step's wall time (the noise
#: floor every step figure is judged by).
NOISE_SHARE = FLOOR_SHARE


def cut_steps(steps: list[Step], n: Nesting, device_end: np.ndarray) -> np.ndarray:
    """Per step (bool): the trace's last step holding work when the trace's end cut it (see module);
    ``device_end``: the end of each device event."""
    out = np.zeros(len(steps), dtype=bool)
    holding = [k for k, s in enumerate(steps) if not s.empty]
    if not holding or holding[-1] != len(steps) - 1:
        return out
    last = steps[-1]
    noise = NOISE_SHARE * last.wall
    if not len(device_end) or not len(n.end):
        return out
    gpu_end = float(device_end.max())
    trace_end = max(float(n.end.max()), gpu_end)
    if trace_end - last.end > noise or trace_end - gpu_end > noise:
        return out
    # the host work in the step's window, less its marker and what encloses it
    inside = (n.end > last.start) & (n.ts < last.end) & ~((n.ts <= last.start) & (n.end >= last.end))
    if not inside.any():
        return out
    host_end = float(n.end[inside].max())
    out[-1] = last.end - host_end > noise and gpu_end - host_end > noise
    return out

"""A stream's idle time in a step, split by what it waited for, as Holistic Trace Analysis splits it.

Between two consecutive pieces of device work on a stream lies a gap. The gap is *host wait* when the
runtime call launching the work after it started after the work before it ended: the stream's queue
was empty, the host had not launched yet. Otherwise the work was queued, and the gap is *kernel
wait* when shorter than `KERNEL_WAIT_US` (the overhead of starting back-to-back kernels), else
*other* (work waiting for another stream's through an event, or a stall nothing in the trace
explains). Work whose launch is unknown is never host wait. The gaps are those between the pieces of
a step's work the step owns on the stream (one owner per GPU instant, `span.owned_pieces`), so a
step's three figures add up to its idle time on the stream: first to last activity there, less its
busy time. HTA computes the same over the whole trace, per stream; it keeps the trace's whole µs.
"""

from __future__ import annotations

import numpy as np

#: Gaps between queued kernels shorter than this are kernel wait: HTA's
#: ``consecutive_kernel_delay`` default, 30 in the units of its frames (the trace's µs).
KERNEL_WAIT_US = 30.0
HOST_WAIT, KERNEL_WAIT, OTHER = 0, 1, 2


def idle_split(step: np.ndarray, stream: np.ndarray, start: np.ndarray, end: np.ndarray,
               launch: np.ndarray, steps: int, streams: int) -> np.ndarray:
    """(steps, streams, 3) µs of host wait, kernel wait and other idle time per step and stream, from
    the owned pieces of device work (``step``, ``stream``, ``start``, ``end``; ``launch``: the start of
    each piece's runtime call, NaN where unknown). Times are relative to a base near the pieces (µs)."""
    if len(start) < 2:
        return np.zeros((steps, streams, 3))
    group = step.astype(np.int64) * streams + stream
    order = np.lexsort((start, group))
    group, start, end, launch = group[order], start[order], end[order], launch[order]
    # the furthest end so far in each group: a running maximum over groups laid end to end, each
    # shifted past the one before so that no group's reach carries into the next
    span = float(end.max() - min(start.min(), 0.0)) + 1.0
    shift = np.cumsum(np.r_[0, group[1:] != group[:-1]]) * span
    reach = np.maximum.accumulate(end + shift) - shift
    same = group[1:] == group[:-1]
    gap = np.where(same, np.maximum(start[1:] - reach[:-1], 0.0), 0.0)
    host = same & (launch[1:] > reach[:-1])  # NaN (launch unknown) compares false
    kind = np.where(host, HOST_WAIT, np.where(gap < KERNEL_WAIT_US, KERNEL_WAIT, OTHER))
    out = np.bincount(group[1:] * 3 + kind, weights=gap, minlength=steps * streams * 3)
    return out.reshape(steps, streams, 3)

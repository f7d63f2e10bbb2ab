"""Memory over a step: the allocated (and reserved) bytes after each `[memory]` event, with the
phases beneath, and the peak.

A trace may have no allocation baseline: the profiler's "Total Allocated" of the CPU counts only
what was allocated while it recorded, and 2021 traces carry no total at all (the running sum starts
at zero). Its curve starts at the first allocation the profiler saw, so the model's weights and
optimizer state, allocated before profiling began, are not in it: `has_baseline` tells, and the tab
says so beside the curve.

The curve is kept per span at load time (`memory_curve`), thinned to a bounded number of points per
step and device; thinning keeps each bucket's lowest and highest point, so the peak is exact and
equals the per-phase peaks of the step detail.
"""

from __future__ import annotations

import numpy as np

from ..answers import MemorySeries
from ..reading.events import Trace
from .model import MemoryCurve, SpanAnalysis
from .partition import Partition

#: At most about this many points per step and device (two per bucket).
MAX_POINTS = 2000


def running_allocated(trace: Trace) -> np.ndarray:
    """Allocated bytes after each memory event: the trace's "Total Allocated", or (2021 traces,
    which lack it) the running sum of allocations and frees per device in time order."""
    mem = trace.memory
    total = mem.total
    if not len(total) or not (total < 0).any():
        return total
    order = np.lexsort((mem.ts, mem.device))
    running = np.empty_like(total)
    nbytes = mem.nbytes[order]
    dev = mem.device[order]
    csum = np.cumsum(nbytes)
    first = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1]])
    offsets = np.repeat(csum[first] - nbytes[first], np.diff(np.r_[first, len(dev)]))
    running[order] = csum - offsets
    return np.where(total < 0, running, total)


def has_baseline(trace: Trace, allocated: np.ndarray) -> list[bool]:
    """Per memory device: whether its allocated bytes count memory allocated before the trace's first
    memory event, i.e. that event's total is more than its own bytes (by over 1% of them). False where
    the trace gives no total (the running sum starts at zero)."""
    mem = trace.memory
    out = []
    for d in range(len(trace.memory_devices)):
        on = np.flatnonzero(mem.device == d)
        if not len(on):
            out.append(False)
            continue
        first = on[np.argmin(mem.ts[on])]
        before = int(allocated[first]) - int(mem.nbytes[first])
        out.append(bool(mem.total[first] >= 0 and before > 0.01 * abs(int(mem.nbytes[first]))))
    return out


def memory_curve(trace: Trace, part: Partition, allocated: np.ndarray) -> MemoryCurve:
    """The memory events inside steps, per (step, device) in time order, thinned to `MAX_POINTS`."""
    mem = trace.memory
    step, _ = part.locate(mem.ts)
    inside = np.flatnonzero(step >= 0)
    order = inside[np.lexsort((mem.ts[inside], mem.device[inside], step[inside]))]
    s, d, ts = step[order], mem.device[order], mem.ts[order]
    keep = np.zeros(len(order), dtype=bool)
    bounds = np.flatnonzero(np.r_[True, (s[1:] != s[:-1]) | (d[1:] != d[:-1]), True]) if len(order) else [0]
    values = allocated[order]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        n = hi - lo
        if n <= MAX_POINTS:
            keep[lo:hi] = True
            continue
        buckets = np.minimum((np.arange(n) * (MAX_POINTS // 2)) // n, MAX_POINTS // 2 - 1)
        first = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
        v = values[lo:hi]
        # per bucket: the positions of its lowest and highest value
        for pick in (np.minimum, np.maximum):
            extreme = pick.reduceat(v, first)[buckets]
            hit = np.flatnonzero(v == extreme)
            _, at = np.unique(buckets[hit], return_index=True)
            keep[lo + hit[at]] = True
        keep[lo] = keep[hi - 1] = True
    kept = order[keep]
    return MemoryCurve(step=s[keep].astype(np.int32), device=d[keep].astype(np.int32), ts=ts[keep],
                       allocated=allocated[kept], reserved=mem.reserved[kept])


def memory_series(span: SpanAnalysis, i: int) -> list[MemorySeries]:
    """The curve of each memory device over step ``i`` of ``span``."""
    c = span.memory_curve
    rows = c.rows(i)
    start = span.steps[i].start
    out = []
    for d, device in enumerate(span.memory_devices):
        mask = c.device[rows] == d
        if not mask.any():
            continue
        ts = c.ts[rows][mask]
        allocated = c.allocated[rows][mask]
        reserved = c.reserved[rows][mask]
        top = int(np.argmax(allocated))
        out.append(MemorySeries(
            device=device,
            t_ms=np.round((ts - start) / 1000.0, 4).tolist(),
            allocated=allocated.tolist(),
            # a device whose trace records no reserved bytes, or only zeros (the CPU), shows none
            reserved=reserved.tolist() if (reserved >= 0).all() and reserved.any() else None,
            peak_bytes=int(allocated[top]),
            peak_ms=round(float(ts[top] - start) / 1000.0, 4),
            baseline=bool(span.memory_baseline[d]) if d < len(span.memory_baseline) else True,
        ))
    return out

"""Device work by kernel name: how often each ran, how long, which op and phase launched it.

The table is built once per span (`kernel_table`) from the same launch attribution as the phase
figures, so a step's kernels add up to that step's GPU time, phase by phase.
"""

from __future__ import annotations

import numpy as np

from ..answers import KernelRow
from ..reading.events import KERNEL, MEMCPY, MEMSET, Trace
from .model import KernelTable
from .worker import Worker

KINDS = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset"}


def kernel_table(trace: Trace, owner: np.ndarray, dev_step: np.ndarray, dev_phase: np.ndarray) -> KernelTable:
    """Group the device events of ``trace`` by (step, phase, name, launching op, kind).

    ``owner`` is the name code of the op that launched each device event (-1 where unknown);
    ``dev_step`` / ``dev_phase`` its step index and phase code by launch (-1 outside every step).
    """
    dev = trace.device
    keep = dev_step >= 0
    nn = max(len(trace.names), 1)
    parts = (dev_step[keep].astype(np.int64), dev_phase[keep].astype(np.int64), dev.name[keep].astype(np.int64),
             owner[keep].astype(np.int64) + 1, dev.kind[keep].astype(np.int64))
    radix = (max(int(dev_step.max(initial=0)) + 1, 1), max(int(dev_phase.max(initial=0)) + 1, 1), nn, nn + 1, 3)
    key = np.zeros(int(keep.sum()), dtype=np.int64)
    for column, size in zip(parts, radix):
        key = key * size + column
    unique, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.ravel()
    dur = dev.dur[keep]
    count = len(unique)
    max_us = np.zeros(count)
    np.maximum.at(max_us, inverse, dur)
    fields = []
    rest = unique
    for size in reversed(radix):
        fields.append(rest % size)
        rest = rest // size
    kind, op, name, phase, step = fields
    return KernelTable(
        step=step.astype(np.int32), phase=phase.astype(np.int32), name=name.astype(np.int32),
        op=(op - 1).astype(np.int32), kind=kind.astype(np.int8),
        calls=np.bincount(inverse, minlength=count).astype(np.int64),
        us=np.bincount(inverse, weights=dur, minlength=count), max_us=max_us,
    )


def kernel_rows(w: Worker, rows: list[int], phase: str | None = None) -> tuple[list[KernelRow], float]:
    """Kernels of the steps ``rows`` of worker ``w`` (launched in ``phase``, or in any), most GPU time
    first, and the GPU time they add up to (µs)."""
    acc: dict[tuple[str, str], dict] = {}
    for span, _, indices in w.by_span(rows):
        t = span.kernels
        rows = np.isin(t.step, indices)
        if phase is not None:
            rows &= t.phase == (span.phases.index(phase) if phase in span.phases else -2)
        for k in np.flatnonzero(rows).tolist():
            name, kind = span.names[t.name[k]], KINDS[int(t.kind[k])]
            entry = acc.setdefault((name, kind), {"calls": 0, "total": 0.0, "max": 0.0, "ops": {}, "phases": {}})
            total = float(t.us[k])
            entry["calls"] += int(t.calls[k])
            entry["total"] += total
            entry["max"] = max(entry["max"], float(t.max_us[k]))
            op = span.names[t.op[k]] if t.op[k] >= 0 else "(unknown)"
            entry["ops"][op] = entry["ops"].get(op, 0.0) + total
            p = span.phases[t.phase[k]]
            entry["phases"][p] = entry["phases"].get(p, 0.0) + total
    gpu = sum(e["total"] for e in acc.values())
    out = []
    for (name, kind), e in acc.items():
        ops = sorted(e["ops"], key=lambda o: -e["ops"][o])
        phases = sorted(e["phases"], key=lambda p: -e["phases"][p])
        out.append(KernelRow(
            name=name, kind=kind, calls=e["calls"], total_us=_us(e["total"]), mean_us=_us(e["total"] / e["calls"]),
            max_us=_us(e["max"]), share=round(e["total"] / gpu, 4) if gpu else 0.0, op=ops[0], phase=phases[0],
            ops=ops, phases=phases,
        ))
    out.sort(key=lambda r: (-r.total_us, r.name))
    return out, gpu


def _us(value: float) -> float:
    """µs rounded to the nanosecond."""
    return round(float(value), 3)

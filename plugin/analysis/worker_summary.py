"""A worker's profiled steps in a few numbers: means and shares per phase, the slowest step and
what grew in it, outliers, the top ops of the dominant phase, and the findings drawn from them.

Averages leave out empty steps (a loop that ended inside the profiler's active window leaves an
empty last step).
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import OTHER

from ..answers import MeanOp, PhaseMean, Slowest, Summary
from .compare import compare, grew_most, median_row
from .findings import findings
from .worker import Worker, ms

#: A step this many times slower than the median is an outlier.
OUTLIER_FACTOR = 1.5
#: Top ops listed, and grown ops named for the slowest step.
TOP_OPS = 10
GROWN_OPS = 5


def summarize(w: Worker, top: int = TOP_OPS) -> Summary:
    """Means, shares, the slowest step and why, outliers, top ops of the dominant phase, findings."""
    phases = w.phases
    full = w.full()
    out = Summary(steps=len(w.refs), empty_steps=[w.numbers[k] for k in np.flatnonzero(w.empty).tolist()],
                  gpu=w.has_gpu, phases=phases, findings=[])
    if not len(full):
        out.findings = findings(out, w, full)
        return out
    walls = w.wall_us[full].tolist()
    mean_wall = sum(walls) / len(walls)
    cpu = w.cpu_us[full].mean(axis=0)
    gpu = w.gpu_us[full].mean(axis=0)
    on_gpu = full[w.on_gpu[full]]
    idle = w.gpu_idle_us[on_gpu].mean(axis=0).tolist() if len(on_gpu) else [None] * len(phases)
    out.mean = {
        p: PhaseMean(cpu_ms=ms(cpu[j]), gpu_ms=ms(gpu[j]), gpu_idle_ms=None if idle[j] is None else ms(idle[j]),
                     share=round(float(cpu[j]) / mean_wall, 4) if mean_wall else 0.0)
        for j, p in enumerate(phases)
    }
    out.mean_wall_ms = ms(mean_wall)
    out.median_wall_ms = ms(float(np.median(walls)))
    out.dominant_phase = max((p for p in phases if p != OTHER),
                             key=lambda p: out.mean[p].cpu_ms + out.mean[p].gpu_ms, default=OTHER)
    out.slowest = _slowest(w, full)
    median = float(np.median(walls))
    out.outliers = [w.numbers[k] for k in full.tolist() if len(full) >= 3 and w.wall_us[k] > OUTLIER_FACTOR * median]
    out.top_ops = _top_ops(w, full, out.dominant_phase, top)
    out.inferred_phases = sorted({p for k in full.tolist() for p in _step(w, k).inferred})
    out.findings = findings(out, w, full)
    return out


def _step(w: Worker, row: int):
    ref = w.refs[row]
    return ref.span.steps[ref.index]


def _slowest(w: Worker, full: np.ndarray) -> Slowest:
    slowest = int(full[int(np.argmax(w.wall_us[full]))])
    out = Slowest(step=w.numbers[slowest], wall_ms=ms(w.wall_us[slowest]))
    typical = median_row(w, full)
    if typical is None or typical == slowest:
        return out
    why = compare((w, np.array([typical])), (w, np.array([slowest])), w.phases, top=50)
    phase, grew = grew_most(why.delta)
    grown = sorted((o for o in why.ops if o.phase == phase), key=lambda o: -o.delta_self_cpu_ms)
    out.median_step = w.numbers[typical]
    out.vs_median_ms = ms(w.wall_us[slowest] - w.wall_us[typical])
    out.phase = phase
    out.phase_delta_ms = grew
    out.ops = [o for o in grown if o.delta_self_cpu_ms > 0][:GROWN_OPS]
    return out


def _top_ops(w: Worker, full: np.ndarray, phase: str, top: int) -> list[MeanOp]:
    """The ops of ``phase`` with the most self time per step (GPU time on GPU traces)."""
    rows = [
        MeanOp(name=name, calls=round(float(calls), 2), self_cpu_ms=ms(self_cpu), cpu_ms=ms(cpu),
               self_gpu_ms=ms(self_gpu), gpu_ms=ms(gpu))
        for (p, name), (calls, self_cpu, cpu, self_gpu, gpu) in w.op_means(full).items()
        if p == phase
    ]
    by_gpu = w.has_gpu and any(r.self_gpu_ms > 0 for r in rows)
    rows.sort(key=lambda r: -(r.self_gpu_ms if by_gpu else r.self_cpu_ms))
    return rows[:top]

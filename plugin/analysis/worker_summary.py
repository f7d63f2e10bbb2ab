"""A worker's profiled steps in a few numbers: means and shares per phase, what each phase costs,
the slowest step and what grew in it (when beyond noise), outliers both ways, the top ops of the
costliest phase, and the findings drawn from them.

Averages leave out empty steps (a loop that ended inside the profiler's active window leaves an
empty last step), steps in which torch.compile compiled (as the training side's summary does) and
warm-up steps (one-off setup: `warmup`) and a last step the trace's end cut (`cut`), see
`Worker.steady`; the findings say so. The steps are
judged against their noise once (`StepNoise`): the outliers, the slowest step and the findings all
read that judgement. Evaluation passes and ``prof.paused()`` blocks are in no step: the summary only
totals them, apart.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import EVAL, OUT_OF_STEP, PAUSED

from ..answers import MeanOp, PhaseMean, Slowest, StepNoise, Summary
from .compare import compare, grew_most, median_row
from .cost import GPU, Costs, Figures, phase_costs
from .findings import findings
from .noise import MIN_VALUES, Noise, noise
from .path_summary import mean_path
from .steps import gpu_time
from .worker import Worker, ms

#: Top ops listed, and grown ops named for the slowest step.
TOP_OPS = 10
GROWN_OPS = 5


def summarize(w: Worker, top: int = TOP_OPS) -> Summary:
    """Means, shares, costs, the slowest step and why, outliers, top ops of the costliest phase, findings."""
    phases = w.phases
    full = w.steady()
    out = Summary(steps=len(w.refs), empty_steps=[w.numbers[k] for k in np.flatnonzero(w.empty).tolist()],
                  gpu=w.has_gpu, phases=phases, findings=[])
    apart = w.apart_us.sum(axis=0)
    out.eval_ms = ms(apart[OUT_OF_STEP.index(EVAL)]) or None
    out.paused_ms = ms(apart[OUT_OF_STEP.index(PAUSED)]) or None
    compiling = [w.numbers[k] for k in w.full().tolist() if w.compiling[k]]
    if compiling and len(full) < len(w.full()):
        out.compiling_steps = compiling
    warmup = [w.numbers[k] for k in w.full().tolist() if w.warmup[k]]
    if warmup:
        out.warmup_steps = warmup
    cut = [w.numbers[k] for k in w.full().tolist() if w.cut[k] and not (w.compiling[k] or w.warmup[k])]
    if cut and len(full) < len(w.full()):
        out.cut_steps = cut
    if not len(full):
        out.findings = findings(out, w, full, None, None)
        return out
    walls = w.wall_us[full].tolist()
    mean_wall = sum(walls) / len(walls)
    cpu = w.host_us[full].mean(axis=0)
    gpu = w.gpu_us[full].mean(axis=0)
    on_gpu = full[w.on_gpu[full]]
    idle = w.gpu_idle_us[on_gpu].mean(axis=0).tolist() if len(on_gpu) else [None] * len(phases)
    busy, compute = w.gpu_busy_us[full].mean(axis=0), w.gpu_compute_us[full].mean(axis=0)
    comm, exposed = w.comm_us[full].mean(axis=0), w.exposed_comm_us[full].mean(axis=0)
    total_busy = float(busy.sum())
    out.mean = {
        p: PhaseMean(host_ms=ms(cpu[j]), gpu_ms=ms(gpu[j]), gpu_idle_ms=None if idle[j] is None else ms(idle[j]),
                     share=round(float(cpu[j]) / mean_wall, 4) if mean_wall else 0.0,
                     gpu_busy_ms=ms(busy[j]), gpu_compute_ms=ms(compute[j]), comm_ms=ms(comm[j]),
                     exposed_comm_ms=ms(exposed[j]),
                     gpu_share=round(float(busy[j]) / total_busy, 4) if total_busy > 0 else None)
        for j, p in enumerate(phases)
    }
    out.gpu_time = gpu_time(w, full)
    out.critical_path = mean_path(w, full)
    out.mean_wall_ms = ms(mean_wall)
    figures = typical_step(w, full)
    costs = phase_costs(figures)
    out.measure = costs.measure
    out.costs = {p: ms(costs.cost_us[p]) for p in phases}
    out.cost_total_ms = ms(costs.total_us)
    band = noise(walls)
    typical = median_row(w, full)
    out.noise = _judged(w, full, band, typical)
    out.median_wall_ms = out.noise.median_ms
    out.slowest = _slowest(w, full, band, typical)
    out.outliers = [n for n in (w.numbers[k] for k in full.tolist()) if n in out.noise.slow or n in out.noise.fast]
    out.inferred_phases = sorted({p for k in full.tolist() for p in _step(w, k).inferred})
    out.findings = findings(out, w, full, figures, costs)
    out.dominant_phase = next((f.phase for f in out.findings if f.phase is not None), None)
    out.top_ops = _top_ops(w, full, out.dominant_phase, costs, top) if out.dominant_phase else []
    return out


def typical_step(w: Worker, full: np.ndarray) -> Figures:
    """The worker's mean step over ``full`` (its steady steps), as the cost model reads it."""
    on_gpu = full[w.on_gpu[full]]
    nan = np.full(len(w.phases), np.nan)
    return Figures(
        phases=w.phases,
        steps=[w.numbers[k] for k in full.tolist()],
        wall_us=float(w.wall_us[full].mean()),
        host_us=w.host_us[full].mean(axis=0),
        gpu_us=w.gpu_us[full].mean(axis=0),
        idle_us=w.gpu_idle_us[on_gpu].mean(axis=0) if len(on_gpu) else nan,
        wait_us=w.wait_us[full].mean(axis=0),
        launches=w.launches[full].mean(axis=0),
        busy_us=w.gpu_busy_us[full].mean(axis=0),
        compute_us=w.gpu_compute_us[full].mean(axis=0),
        comm_us=w.comm_us[full].mean(axis=0),
        exposed_comm_us=w.exposed_comm_us[full].mean(axis=0),
        step_idle_us=float(np.nanmean(w.step_gpu_idle_us[on_gpu])) if len(on_gpu) else float("nan"),
        has_gpu=bool(len(on_gpu)),
        queue=w.queued_us[full].sum(axis=0) / np.maximum(w.host_us[full].sum(axis=0), 1e-9),
        exposed_memory_us=w.exposed_memory_us[full].mean(axis=0),
    )


def _step(w: Worker, row: int):
    ref = w.refs[row]
    return ref.span.steps[ref.index]


def _judged(w: Worker, full: np.ndarray, band: Noise, typical: int) -> StepNoise:
    """The steps ``full`` against their noise ``band``: the one definition of an outlier."""
    rows, walls = full.tolist(), w.wall_us.tolist()  # Python floats: no numpy scalar per step
    return StepNoise(judged=band.judged, steps=len(rows), min_steps=MIN_VALUES, median_step=w.numbers[typical],
                     median_ms=ms(w.wall_us[typical]), band_ms=ms(band.band) if band.judged else None,
                     slow=[w.numbers[k] for k in rows if band.slow(walls[k])],
                     fast=[w.numbers[k] for k in rows if band.fast(walls[k])])


def _slowest(w: Worker, full: np.ndarray, band: Noise, typical: int) -> Slowest:
    """The slowest step; what grew in it against the median step only when it is beyond noise."""
    slowest = int(full[int(np.argmax(w.wall_us[full]))])
    wall = float(w.wall_us[slowest])
    verdict = "too-few-steps" if not band.judged else "beyond-noise" if band.slow(wall) else "within-noise"
    out = Slowest(step=w.numbers[slowest], wall_ms=ms(wall), noise=verdict,
                  noise_ms=ms(band.band) if band.judged else None)
    if verdict != "beyond-noise" or typical == slowest:
        return out
    why = compare((w, np.array([typical])), (w, np.array([slowest])), w.phases, top=50)
    phase, grew = grew_most(why.delta)
    grown = sorted((o for o in why.ops if o.phase == phase), key=lambda o: (-o.delta_self_host_ms, o.name))
    out.median_step = w.numbers[typical]
    out.vs_median_ms = ms(wall - w.wall_us[typical])
    out.phase = phase
    out.phase_delta_ms = grew
    out.ops = [o for o in grown if o.delta_self_host_ms > 0][:GROWN_OPS]
    return out


def _top_ops(w: Worker, full: np.ndarray, phase: str, costs: Costs, top: int) -> list[MeanOp]:
    """The ops of ``phase`` with the most self time per step: GPU time where the step is GPU-bound."""
    rows = [
        MeanOp(name=name, calls=round(float(calls), 2), self_host_ms=ms(self_cpu), host_ms=ms(cpu),
               self_gpu_ms=ms(self_gpu), gpu_ms=ms(gpu))
        for (p, name), (calls, self_cpu, cpu, self_gpu, gpu) in w.op_means(full).items()
        if p == phase
    ]
    by_gpu = costs.measure == GPU
    rows.sort(key=lambda r: (-(r.self_gpu_ms if by_gpu else r.self_host_ms), r.name))  # ties by name
    return rows[:top]

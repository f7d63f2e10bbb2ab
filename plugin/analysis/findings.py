"""Plain-language findings on a worker's summary: what a performance engineer would say first on
seeing the numbers. Each is a typed `Finding` that names the figures it rests on."""

from __future__ import annotations

import numpy as np

from phaseprof.contract import BACKWARD, DATA, FORWARD, OPTIMIZER, OTHER

from ..answers import Evidence, Finding, Summary
from .worker import Worker

#: A step this many times slower than the median deserves a finding.
SLOW_STEP_FACTOR = 1.5
#: Data loading above this share of the step deserves a finding.
DATA_SHARE = 0.10
#: A phase with at least this share of the step and the GPU idle this much of it is CPU-bound.
PHASE_SHARE = 0.10
IDLE_SHARE = 0.40
#: The GPU idle at most this share of the step is GPU-bound.
BUSY_IDLE_SHARE = 0.10
#: An optimizer launching this many device events per step, averaging under TINY_US each.
MANY_LAUNCHES = 100
TINY_US = 20.0


def _share(saving_ms: float, wall_ms: float) -> float | None:
    return round(saving_ms / wall_ms, 4) if wall_ms > 0 else None


def findings(summary: Summary, w: Worker, full: np.ndarray) -> list[Finding]:
    """The findings on ``summary`` of worker ``w`` (``full``: its rows holding work).

    ``saving_ms`` is the time per step at stake where it can be put in one figure, and ``share``
    that time as a share of the mean step.
    """
    if summary.mean is None:
        if not summary.steps:
            return []
        return [Finding(kind="no-work", phase=None, saving_ms=None, share=None, evidence=Evidence(steps=summary.steps),
                        text="no profiled step holds any work")]
    out = []
    means = summary.mean
    wall = summary.mean_wall_ms
    share = {p: v.share for p, v in means.items()}
    dominant = summary.dominant_phase
    if summary.top_ops and dominant != OTHER:
        top = summary.top_ops[0]
        on_gpu = summary.gpu and top.self_gpu_ms > 0
        cost_ms = top.self_gpu_ms if on_gpu else top.self_cpu_ms
        cost = f"{cost_ms:.2f} ms of GPU" if on_gpu else f"{cost_ms:.2f} ms of its own host time"
        out.append(Finding(
            kind="dominant-phase", phase=dominant, saving_ms=cost_ms, share=_share(cost_ms, wall),
            evidence=Evidence(phase_share=share.get(dominant, 0), ops=[top.name], op_ms=cost_ms,
                              op_time="gpu" if on_gpu else "self_cpu"),
            text=f"{dominant} is the largest phase ({share.get(dominant, 0):.0%} of the step's host time); "
                 f"its top op is {top.name} ({cost} per step)",
        ))
    if share.get(DATA, 0) >= DATA_SHARE:
        data_ms = means[DATA].cpu_ms
        out.append(Finding(
            kind="data-loading", phase=DATA, saving_ms=data_ms, share=_share(data_ms, wall),
            evidence=Evidence(phase_ms=data_ms, wall_ms=wall, phase_share=share[DATA]),
            text=f"data loading is {share[DATA]:.0%} of the step ({data_ms:.2f} ms of {wall:.2f} ms): "
                 "raise DataLoader num_workers, set pin_memory=True, or prefetch",
        ))
    if summary.gpu:
        out += _gpu_findings(summary, w, full)
    else:
        out.append(Finding(kind="no-gpu", phase=None, saving_ms=None, share=None, evidence=Evidence(),
                           text="no GPU activity in these traces: all figures are host (CPU) time"))
    slow = summary.slowest
    median = summary.median_wall_ms
    if slow is not None and slow.phase is not None and median > 0 and slow.wall_ms > SLOW_STEP_FACTOR * median:
        names = [o.name for o in (slow.ops or [])[:3]]
        ops = ", ".join(names)
        over = round(slow.wall_ms - summary.median_wall_ms, 3)
        out.append(Finding(
            kind="slow-step", phase=slow.phase, saving_ms=over, share=_share(over, wall),
            evidence=Evidence(step=slow.step, step_wall_ms=slow.wall_ms, median_wall_ms=summary.median_wall_ms,
                              phase_delta_ms=slow.phase_delta_ms, ops=names),
            text=f"step {slow.step} took {slow.wall_ms:.2f} ms, {slow.wall_ms / summary.median_wall_ms:.1f}x the "
                 f"median: its {slow.phase} grew by {slow.phase_delta_ms:.2f} ms" + (f" ({ops})" if ops else ""),
        ))
    if summary.inferred_phases:
        names = " and ".join(summary.inferred_phases)
        out.append(Finding(
            kind="inferred-phases", phase=None, saving_ms=None, share=None,
            evidence=Evidence(phases=summary.inferred_phases),
            text=f"{names} inferred from the ops (the trace marks no such ranges): "
                 "add PhaseProfiler or record_function ranges for exact boundaries",
        ))
    for number in summary.empty_steps:
        out.append(Finding(
            kind="empty-step", phase=None, saving_ms=None, share=None, evidence=Evidence(step=number),
            text=f"step {number} is empty (the loop ended inside the profiler's active window): left out of averages",
        ))
    return out


def _gpu_findings(summary: Summary, w: Worker, full: np.ndarray) -> list[Finding]:
    out = []
    means = summary.mean
    wall = summary.mean_wall_ms
    share = {p: v.share for p, v in means.items()}
    opt_launches = float(np.mean(w.launches[full, w.phases.index(OPTIMIZER)]))
    opt_gpu_us = means[OPTIMIZER].gpu_ms * 1000.0
    if opt_launches >= MANY_LAUNCHES and opt_gpu_us / max(opt_launches, 1) < TINY_US:
        out.append(Finding(
            kind="optimizer-launches", phase=OPTIMIZER, saving_ms=None, share=None,
            evidence=Evidence(launches=round(opt_launches, 1), mean_launch_us=round(opt_gpu_us / opt_launches, 2)),
            text=f"the optimizer launches {opt_launches:.0f} kernels per step averaging "
                 f"{opt_gpu_us / opt_launches:.1f} µs: try a fused or foreach optimizer (e.g. fused=True)",
        ))
    for p in (FORWARD, BACKWARD, OPTIMIZER, DATA):
        idle = means[p].gpu_idle_ms
        cpu = means[p].cpu_ms
        if idle is None or cpu <= 0 or share.get(p, 0) < PHASE_SHARE:
            continue
        idle_share = idle / cpu
        if idle_share >= IDLE_SHARE:
            out.append(Finding(
                kind="cpu-bound-phase", phase=p, saving_ms=idle, share=_share(idle, wall),
                evidence=Evidence(gpu_idle_ms=idle, phase_ms=cpu, idle_share=round(idle_share, 4)),
                text=f"GPU idle {idle_share:.0%} of {p} ({idle:.2f} of {cpu:.2f} ms): CPU-bound; "
                     "larger batches, CUDA graphs or torch.compile cut launch overhead",
            ))
    on_gpu = full[w.on_gpu[full]]
    step_idle = float(np.nanmean([_step_idle_us(w, k) for k in on_gpu.tolist()])) / 1000.0
    if wall > 0 and step_idle / wall <= BUSY_IDLE_SHARE:
        out.append(Finding(
            kind="gpu-bound", phase=None, saving_ms=None, share=None,
            evidence=Evidence(busy_share=round(1 - step_idle / wall, 4), gpu_idle_ms=round(step_idle, 3), wall_ms=wall),
            text=f"the GPU is busy {1 - step_idle / wall:.0%} of the step: GPU-bound; "
                 "mixed precision or a lighter model helps most",
        ))
    return out


def _step_idle_us(w: Worker, row: int) -> float:
    ref = w.refs[row]
    return float(ref.span.step_gpu_idle_us[ref.index])

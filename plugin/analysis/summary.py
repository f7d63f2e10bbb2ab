"""A worker's profiled steps in a few numbers and plain-language findings.

Averages leave out empty steps (a loop that ended inside the profiler's active window leaves an
empty last step). The findings are what a performance engineer would say first on seeing the
numbers; each names the figure it rests on.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import BACKWARD, DATA, FORWARD, OPTIMIZER, OTHER

from .compare import compare, grew_most, median_ref, op_means
from .model import SpanAnalysis
from .steps import StepRef, ms, phase_names, phase_table, step_refs

#: A step this many times slower than the median is an outlier.
OUTLIER_FACTOR = 1.5
#: Data loading above this share of the step deserves a finding.
DATA_SHARE = 0.10
#: A phase with at least this share of the step and the GPU idle this much of it is CPU-bound.
PHASE_SHARE = 0.10
IDLE_SHARE = 0.40
#: An optimizer launching this many device events per step, averaging under TINY_US each.
MANY_LAUNCHES = 100
TINY_US = 20.0


def summarize(spans: list[SpanAnalysis], top: int = 10) -> dict:
    """Means, shares, the slowest step and why, outliers, top ops of the dominant phase, findings."""
    phases = phase_names(spans)
    refs = step_refs(spans)
    full = [r for r in refs if not r.empty]
    has_gpu = any(s.has_gpu for s in spans)
    out: dict = {
        "steps": len(refs),
        "empty_steps": [r.number for r in refs if r.empty],
        "gpu": has_gpu,
        "phases": phases,
    }
    if not full:
        out["findings"] = ["no profiled step holds any work"] if refs else []
        return out
    walls = [r.wall_us for r in full]
    mean_wall = sum(walls) / len(walls)
    cpu = phase_table(full, phases, "cpu_us").mean(axis=0)
    gpu = phase_table(full, phases, "gpu_us").mean(axis=0)
    on_gpu = [r for r in full if r.span.has_gpu]
    idle = phase_table(on_gpu, phases, "gpu_idle_us").mean(axis=0) if on_gpu else [None] * len(phases)
    means = {
        p: {"cpu_ms": ms(cpu[j]), "gpu_ms": ms(gpu[j]), "gpu_idle_ms": None if idle[j] is None else ms(idle[j]),
            "share": round(float(cpu[j]) / mean_wall, 4) if mean_wall else 0.0}
        for j, p in enumerate(phases)
    }
    median = float(np.median(walls))
    dominant = max((p for p in phases if p != OTHER), key=lambda p: means[p]["cpu_ms"] + means[p]["gpu_ms"],
                   default=OTHER)
    slowest = max(full, key=lambda r: r.wall_us)
    typical = median_ref(full)
    why = compare([typical], [slowest], phases, top=50) if typical is not None and typical is not slowest else None
    out.update(
        mean_wall_ms=ms(mean_wall),
        median_wall_ms=ms(median),
        mean=means,
        dominant_phase=dominant,
        slowest=_slowest(slowest, typical, why),
        outliers=[r.number for r in full if len(full) >= 3 and r.wall_us > OUTLIER_FACTOR * median],
        top_ops=_top_ops(full, dominant, has_gpu, top),
        inferred_phases=sorted({p for r in full for p in r.span.steps[r.index].inferred}),
    )
    out["findings"] = findings(out, full)
    return out


def _slowest(slowest: StepRef, typical: StepRef | None, why: dict | None) -> dict:
    out = {"step": slowest.number, "wall_ms": ms(slowest.wall_us)}
    if why is not None and typical is not None:
        phase, grew = grew_most(why["delta"]["phases"])
        grown = sorted((o for o in why["ops"] if o["phase"] == phase), key=lambda o: -o["delta_self_cpu_ms"])
        out.update(
            median_step=typical.number,
            vs_median_ms=ms(slowest.wall_us - typical.wall_us),
            phase=phase,
            phase_delta_ms=grew,
            ops=[o for o in grown if o["delta_self_cpu_ms"] > 0][:5],
        )
    return out


def _top_ops(refs: list[StepRef], phase: str, by_gpu: bool, top: int) -> list[dict]:
    """The ops of ``phase`` with the most self time per step (GPU time on GPU traces)."""
    rows = [
        {"name": name, "calls": round(calls, 2), "self_cpu_ms": ms(self_cpu), "cpu_ms": ms(cpu),
         "self_gpu_ms": ms(self_gpu), "gpu_ms": ms(gpu)}
        for (p, name), (calls, self_cpu, cpu, self_gpu, gpu) in op_means(refs).items()
        if p == phase
    ]
    by_gpu = by_gpu and any(r["self_gpu_ms"] > 0 for r in rows)
    rows.sort(key=lambda r: -(r["self_gpu_ms"] if by_gpu else r["self_cpu_ms"]))
    return rows[:top]


def findings(summary: dict, refs: list[StepRef]) -> list[str]:
    """Plain-language findings from a summary."""
    out = []
    means = summary["mean"]
    wall = summary["mean_wall_ms"]
    share = {p: v["share"] for p, v in means.items()}
    dominant = summary["dominant_phase"]
    if summary["top_ops"] and dominant != OTHER:
        top = summary["top_ops"][0]
        on_gpu = summary["gpu"] and top["self_gpu_ms"] > 0
        cost = f"{top['self_gpu_ms']:.2f} ms of GPU" if on_gpu else f"{top['self_cpu_ms']:.2f} ms of its own host time"
        out.append(f"{dominant} is the largest phase ({share.get(dominant, 0):.0%} of the step's host time); "
                   f"its top op is {top['name']} ({cost} per step)")
    if share.get(DATA, 0) >= DATA_SHARE:
        out.append(
            f"data loading is {share[DATA]:.0%} of the step ({means[DATA]['cpu_ms']:.2f} ms of {wall:.2f} ms): "
            "raise DataLoader num_workers, set pin_memory=True, or prefetch"
        )
    if summary["gpu"]:
        opt_launches = np.mean([_launches(r, OPTIMIZER) for r in refs])
        opt_gpu = means[OPTIMIZER]["gpu_ms"] * 1000.0
        if opt_launches >= MANY_LAUNCHES and opt_gpu / max(opt_launches, 1) < TINY_US:
            out.append(
                f"the optimizer launches {opt_launches:.0f} kernels per step averaging "
                f"{opt_gpu / opt_launches:.1f} µs: try a fused or foreach optimizer (e.g. fused=True)"
            )
        for p in (FORWARD, BACKWARD, OPTIMIZER, DATA):
            idle = means[p]["gpu_idle_ms"]
            if idle is None or means[p]["cpu_ms"] <= 0 or share.get(p, 0) < PHASE_SHARE:
                continue
            idle_share = idle / means[p]["cpu_ms"]
            if idle_share >= IDLE_SHARE:
                out.append(
                    f"GPU idle {idle_share:.0%} of {p} ({idle:.2f} of {means[p]['cpu_ms']:.2f} ms): CPU-bound; "
                    "larger batches, CUDA graphs or torch.compile cut launch overhead"
                )
        step_idle = np.nanmean([r.span.step_gpu_idle_us[r.index] for r in refs if r.span.has_gpu]) / 1000.0
        if wall > 0 and step_idle / wall <= 0.1:
            out.append(f"the GPU is busy {1 - step_idle / wall:.0%} of the step: GPU-bound; "
                       "mixed precision or a lighter model helps most")
    else:
        out.append("no GPU activity in these traces: all figures are host (CPU) time")
    slow = summary["slowest"]
    if "phase" in slow and slow["wall_ms"] > OUTLIER_FACTOR * summary["median_wall_ms"]:
        ops = ", ".join(o["name"] for o in slow["ops"][:3])
        out.append(
            f"step {slow['step']} took {slow['wall_ms']:.2f} ms, "
            f"{slow['wall_ms'] / summary['median_wall_ms']:.1f}x the "
            f"median: its {slow['phase']} grew by {slow['phase_delta_ms']:.2f} ms" + (f" ({ops})" if ops else "")
        )
    if summary["inferred_phases"]:
        out.append(
            f"{' and '.join(summary['inferred_phases'])} inferred from the ops (the trace marks no such ranges): "
            "add PhaseProfiler or record_function ranges for exact boundaries"
        )
    for number in summary["empty_steps"]:
        out.append(f"step {number} is empty (the loop ended inside the profiler's active window): left out of averages")
    return out


def _launches(ref: StepRef, phase: str) -> int:
    span = ref.span
    return int(span.launches[ref.index, span.phases.index(phase)]) if phase in span.phases else 0

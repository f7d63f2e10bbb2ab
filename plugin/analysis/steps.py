"""Per-step figures of a worker (all its spans) as plain JSON-ready values.

Times are milliseconds rounded to the microsecond. Every step row names all canonical phases, plus
the user's own; host phase times add up to the step's wall time.
"""

from __future__ import annotations

import msgspec
import numpy as np

from phaseprof.contract import PHASES

from .model import SpanAnalysis

#: A phase whose GPU is idle at least this share of its host time is CPU-bound; at most the lower
#: share, GPU-bound; in between, balanced.
CPU_BOUND_IDLE = 0.5
GPU_BOUND_IDLE = 0.1


def ms(us: float) -> float:
    return round(float(us) / 1000.0, 3)


class StepRef(msgspec.Struct, frozen=True):
    """One step of a worker: which span holds it and where."""

    span: SpanAnalysis
    index: int

    @property
    def number(self) -> int:
        return self.span.steps[self.index].number

    @property
    def wall_us(self) -> float:
        s = self.span.steps[self.index]
        return s.end - s.start

    @property
    def empty(self) -> bool:
        return self.span.steps[self.index].empty


def phase_names(spans: list[SpanAnalysis]) -> list[str]:
    """Canonical phases, then user-named phases in order of first appearance."""
    names = list(PHASES)
    for span in spans:
        names += [p for p in span.phases if p not in names]
    return names


def by_span(refs: list[StepRef]) -> list[tuple[SpanAnalysis, list[int], list[int]]]:
    """``refs`` grouped by span: (span, positions in ``refs``, step indices in the span)."""
    groups: dict[int, tuple[SpanAnalysis, list[int], list[int]]] = {}
    for position, ref in enumerate(refs):
        entry = groups.setdefault(id(ref.span), (ref.span, [], []))
        entry[1].append(position)
        entry[2].append(ref.index)
    return list(groups.values())


def phase_table(refs: list[StepRef], phases: list[str], table: str, missing: float = 0.0) -> np.ndarray:
    """One per-phase table of the spans (``cpu_us``, ``gpu_us``, ``gpu_idle_us`` or ``launches``) as
    an array of ``len(refs)`` rows by ``phases``, phases aligned by name; ``missing`` where a span
    lacks a phase."""
    out = np.full((len(refs), len(phases)), missing, dtype=np.float64)
    for span, at, index in by_span(refs):
        columns = [phases.index(p) for p in span.phases]
        out[np.ix_(at, columns)] = getattr(span, table)[index]
    return out


def step_refs(spans: list[SpanAnalysis]) -> list[StepRef]:
    """All steps of a worker in step-number order."""
    refs = [StepRef(span, i) for span in spans for i in range(len(span.steps))]
    return sorted(refs, key=lambda r: (r.number, r.span.steps[r.index].start))


def verdict(cpu_us: float, idle_us: float, has_gpu: bool) -> str | None:
    """``cpu-bound`` / ``balanced`` / ``gpu-bound`` from how idle the GPU was during the phase."""
    if not has_gpu or cpu_us <= 0 or np.isnan(idle_us):
        return None
    share = idle_us / cpu_us
    if share >= CPU_BOUND_IDLE:
        return "cpu-bound"
    if share <= GPU_BOUND_IDLE:
        return "gpu-bound"
    return "balanced"


def step_rows(spans: list[SpanAnalysis]) -> list[dict]:
    return rows_of(step_refs(spans), phase_names(spans))


def rows_of(refs: list[StepRef], phases: list[str]) -> list[dict]:
    """The figures of each step: wall time, and host/GPU time, GPU idle and verdict per phase."""
    cpu = phase_table(refs, phases, "cpu_us")
    idle = phase_table(refs, phases, "gpu_idle_us", missing=np.nan)
    cpu_ms, gpu_ms, idle_ms = (_ms_list(t) for t in (cpu, phase_table(refs, phases, "gpu_us"), idle))
    launches = phase_table(refs, phases, "launches").astype(np.int64).tolist()
    rows = []
    for k, ref in enumerate(refs):
        span, i = ref.span, ref.index
        step = span.steps[i]
        out_phases = {
            name: {
                "cpu_ms": cpu_ms[k][j],
                "gpu_ms": gpu_ms[k][j],
                "gpu_idle_ms": idle_ms[k][j],
                "launches": launches[k][j],
                "verdict": verdict(cpu[k, j], idle[k, j], span.has_gpu),
                "inferred": name in step.inferred,
            }
            for j, name in enumerate(phases)
        }
        step_idle = span.step_gpu_idle_us[i]
        rows.append({
            "step": step.number,
            "span": span.file,
            "start_ms": ms(step.start),
            "wall_ms": ms(step.end - step.start),
            "gpu_ms": ms(span.step_gpu_us[i]),
            "gpu_idle_ms": None if np.isnan(step_idle) else ms(step_idle),
            "inferred": bool(step.inferred),
            "inferred_phases": sorted(step.inferred),
            "empty": step.empty,
            "phases": out_phases,
        })
    return rows


def _ms_list(us: np.ndarray) -> list[list[float | None]]:
    """µs -> ms rounded to the µs, as nested lists; NaN (no GPU) -> None."""
    out = np.round(us / 1000.0, 3).tolist()
    if np.isnan(us).any():
        out = [[None if v != v else v for v in row] for row in out]
    return out


def find_step(spans: list[SpanAnalysis], number: int) -> StepRef | None:
    for ref in step_refs(spans):
        if ref.number == number:
            return ref
    return None


def op_rows(span: SpanAnalysis, rows: slice | np.ndarray, limit: int | None = None) -> list[dict]:
    """Op table rows as dicts, by total host time, descending."""
    t = span.ops
    idx = np.arange(len(t.step))[rows]
    idx = idx[np.argsort(-t.total_us[idx], kind="stable")]
    if limit is not None:
        idx = idx[:limit]
    return [
        {
            "name": span.names[t.name[k]],
            "shapes": span.shapes[t.shapes[k]] or None,
            "calls": int(t.calls[k]),
            "self_cpu_ms": ms(t.self_us[k]),
            "cpu_ms": ms(t.total_us[k]),
            "self_gpu_ms": ms(t.self_gpu_us[k]),
            "gpu_ms": ms(t.gpu_us[k]),
        }
        for k in idx.tolist()
    ]


def step_detail(ref: StepRef, phases: list[str], op_limit: int | None = None) -> dict:
    """One step in full: its row, the ops of each phase, memory per phase, and its swimlanes."""
    span, i = ref.span, ref.index
    (row,) = rows_of([ref], phases)
    rows = span.ops.rows(i)
    phase_of_row = span.ops.phase[rows]
    ops = {}
    for name in phases:
        if name in span.phases:
            j = span.phases.index(name)
            ops[name] = op_rows(span, np.arange(rows.start, rows.stop)[phase_of_row == j], op_limit)
        else:
            ops[name] = []
    memory = {}
    for name in phases:
        memory[name] = {}
        if name not in span.phases:
            continue
        j = span.phases.index(name)
        for d, device in enumerate(span.memory_devices):
            peak = int(span.memory_peak[i, j, d])
            delta = int(span.memory_delta[i, j, d])
            if peak >= 0 or delta:
                memory[name][device] = {"peak_bytes": peak if peak >= 0 else None, "delta_bytes": delta}
    step = span.steps[i]
    lanes = span.lanes
    lr = lanes.rows(i)
    bands = [
        [int(lane), round((s - step.start) / 1000.0, 4), round((e - step.start) / 1000.0, 4), span.phases[p]]
        for lane, s, e, p in zip(lanes.lane[lr].tolist(), lanes.start[lr].tolist(), lanes.end[lr].tolist(),
                                 lanes.phase[lr].tolist())
    ]
    used = sorted({b[0] for b in bands})
    remap = {old: new for new, old in enumerate(used)}
    row.update(
        ops=ops,
        memory=memory,
        lanes={"labels": [lanes.labels[k] for k in used], "bands": [[remap[b[0]], *b[1:]] for b in bands]},
        gpu_names=span.gpu_names,
    )
    return row

"""Compare two sets of steps: one step with another, one run or worker with another.

Each side is summarised as its mean step (empty steps left out), then per-phase deltas (B - A) and
the ops whose time per step changed most. Ops are ranked by their *self* time, so that a change is
pinned on the op that made it rather than repeated on every op around it.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .steps import StepRef, by_span, ms, phase_table

#: Per (phase, op name): calls, self host µs, host µs, self GPU µs, GPU µs.
_FIELDS = ("calls", "self_cpu", "cpu", "self_gpu", "gpu")


def mean_step(refs: list[StepRef], phases: list[str]) -> dict:
    """Mean wall, host and GPU time per phase over ``refs``."""
    refs = [r for r in refs if not r.empty]
    n = max(len(refs), 1)
    cpu = phase_table(refs, phases, "cpu_us").sum(axis=0) / n
    gpu = phase_table(refs, phases, "gpu_us").sum(axis=0) / n
    return {
        "steps": [r.number for r in refs],
        "wall_ms": ms(sum(r.wall_us for r in refs) / n),
        "phases": {p: {"cpu_ms": ms(cpu[j]), "gpu_ms": ms(gpu[j])} for j, p in enumerate(phases)},
    }


def op_means(refs: list[StepRef]) -> dict[tuple[str, str], list[float]]:
    """(phase, op name) -> [calls, self host µs, host µs, self GPU µs, GPU µs] per step, averaged."""
    refs = [r for r in refs if not r.empty]
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(_FIELDS))
    for span, _, indices in by_span(refs):
        t = span.ops
        rows = np.isin(t.step, indices)
        key = t.phase[rows].astype(np.int64) * len(span.names) + t.name[rows]
        groups, inverse = np.unique(key, return_inverse=True)
        columns = [np.bincount(inverse.ravel(), weights=c[rows], minlength=len(groups))
                   for c in (t.calls, t.self_us, t.total_us, t.self_gpu_us, t.gpu_us)]
        for g, k in enumerate(groups.tolist()):
            acc = totals[(span.phases[k // len(span.names)], span.names[k % len(span.names)])]
            for f, column in enumerate(columns):
                acc[f] += float(column[g])
    n = max(len(refs), 1)
    return {k: [v / n for v in vals] for k, vals in totals.items()}


def compare(a: list[StepRef], b: list[StepRef], phases: list[str], top: int = 15) -> dict:
    """Side A, side B, per-phase deltas and the ``top`` ops that changed most (B - A)."""
    side_a, side_b = mean_step(a, phases), mean_step(b, phases)
    delta = {
        "wall_ms": round(side_b["wall_ms"] - side_a["wall_ms"], 3),
        "phases": {
            p: {k: round(side_b["phases"][p][k] - side_a["phases"][p][k], 3) for k in ("cpu_ms", "gpu_ms")}
            for p in phases
        },
    }
    return {"a": side_a, "b": side_b, "delta": delta, "ops": changed_ops(op_means(a), op_means(b))[:top]}


def changed_ops(ops_a: dict, ops_b: dict) -> list[dict]:
    """Op rows with both sides and deltas, the biggest change in self time first."""
    zero = [0.0] * len(_FIELDS)
    rows = []
    for key in ops_a.keys() | ops_b.keys():
        va, vb = ops_a.get(key, zero), ops_b.get(key, zero)
        row = {"phase": key[0], "name": key[1], "a_calls": round(va[0], 2), "b_calls": round(vb[0], 2)}
        for k, field in enumerate(_FIELDS[1:], start=1):
            row[f"a_{field}_ms"] = ms(va[k])
            row[f"b_{field}_ms"] = ms(vb[k])
            row[f"delta_{field}_ms"] = ms(vb[k] - va[k])
        rows.append(row)
    rows.sort(key=lambda r: -(abs(r["delta_self_cpu_ms"]) + abs(r["delta_self_gpu_ms"])))
    return rows


def median_ref(refs: list[StepRef]) -> StepRef | None:
    """The step whose wall time is the median (the lower one for an even count)."""
    refs = sorted((r for r in refs if not r.empty), key=lambda r: r.wall_us)
    return refs[(len(refs) - 1) // 2] if refs else None


def grew_most(delta_phases: dict[str, dict[str, float]]) -> tuple[str, float]:
    """The phase whose host time grew most, and by how much (ms)."""
    name = max(delta_phases, key=lambda p: delta_phases[p]["cpu_ms"])
    return name, float(np.round(delta_phases[name]["cpu_ms"], 3))

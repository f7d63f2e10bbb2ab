"""Every op of a worker over all its profiled steps, as ``key_averages()`` would list them: calls,
self and total host time, self and total GPU time, per-step means and shares, and the steps each
op ran in. Built from the per-step op tables each span keeps, so the totals are exactly the sum of
the step details' op rows.
"""

from __future__ import annotations

import numpy as np

from ..answers import OpsAnswer, RunOpRow
from .steps import ms, op_stack
from .worker import Worker

GROUPS = ("name", "shapes")


def run_ops(w: Worker, phase: str | None = None, group: str = "name") -> OpsAnswer:
    """The ops of the non-empty steps of ``w`` (of ``phase`` only, when given), by self host time,
    less the warm-up and compiling steps (`Worker.run_wide`); ``run`` and ``worker`` of the answer are
    left for the caller to name."""
    kept, left_out, why = w.run_wide(w.full().tolist())
    steps = np.array(kept, dtype=np.int64)
    if phase is None:
        wall_us = float(w.wall_us[steps].sum())
        gpu_us = float(w.gpu_us[steps].sum())
    else:
        j = w.phases.index(phase) if phase in w.phases else None
        wall_us = float(w.host_us[steps, j].sum()) if j is not None else 0.0
        gpu_us = float(w.gpu_us[steps, j].sum()) if j is not None else 0.0
    acc: dict[tuple[str, str | None], list] = {}
    for span, _, indices in w.by_span(steps.tolist()):
        t = span.ops
        picked = np.isin(t.step, indices)
        if phase is not None:
            picked &= t.phase == (span.phases.index(phase) if phase in span.phases else -2)
        picked = np.flatnonzero(picked)
        if not len(picked):
            continue
        # group the span's picked by (name[, shapes]) with numpy, then merge groups across spans by text
        key = t.name[picked].astype(np.int64)
        if group == "shapes":
            key = key * max(len(span.shapes), 1) + t.shapes[picked]
        keys, inverse = np.unique(key, return_inverse=True)
        inverse = inverse.ravel()
        sums = [np.bincount(inverse, weights=c[picked], minlength=len(keys))
                for c in (t.calls, t.self_us, t.total_us, t.self_gpu_us, t.gpu_us)]
        # per group, the call path of the row with most host time on one path
        main = np.full(len(keys), -1, np.int64)
        main_us = np.zeros(len(keys))
        order = np.lexsort((-t.stack_us[picked], inverse))
        first = order[np.r_[True, inverse[order][1:] != inverse[order][:-1]]] if len(order) else order
        main[inverse[first]] = t.stack[picked][first]
        main_us[inverse[first]] = t.stack_us[picked][first]
        numbers = np.array([s.number for s in span.steps], dtype=np.int64)[t.step[picked]]
        # (group, step number) pairs, each once; step numbers may lie anywhere in 64 bits
        by_step = np.unique(np.column_stack([inverse.astype(np.int64), numbers]), axis=0)
        by_phase = np.bincount(inverse.astype(np.int64) * len(span.phases) + t.phase[picked], weights=t.self_us[picked],
                               minlength=len(keys) * len(span.phases)).reshape(len(keys), len(span.phases))
        present = np.zeros((len(keys), len(span.phases)), bool)
        present[inverse, t.phase[picked]] = True
        step_lists: list[list[int]] = [[] for _ in keys]
        for g, n in by_step.tolist():
            step_lists[g].append(n)
        for g, k in enumerate(keys.tolist()):
            if group == "shapes":
                name, shapes = span.names[k // max(len(span.shapes), 1)], span.shapes[k % max(len(span.shapes), 1)]
            else:
                name, shapes = span.names[k], None
            entry = acc.setdefault((name, shapes), [0.0, 0.0, 0.0, 0.0, 0.0, set(), {}, 0.0, {}])
            for f in range(5):
                entry[f] += float(sums[f][g])
            if main[g] >= 0 and main_us[g] > entry[7]:
                entry[7], entry[8] = float(main_us[g]), op_stack(span, int(main[g]))
            entry[5].update(step_lists[g])
            for j in np.flatnonzero(present[g]).tolist():
                p = span.phases[j]
                entry[6][p] = entry[6].get(p, 0.0) + float(by_phase[g, j])
    n = max(len(steps), 1)
    out = [
        RunOpRow(
            name=name, shapes=shapes, calls=int(calls), self_host_ms=ms(self_cpu), host_ms=ms(cpu),
            self_gpu_ms=ms(self_gpu), gpu_ms=ms(gpu), calls_per_step=round(calls / n, 3),
            self_host_ms_per_step=ms(self_cpu / n), self_gpu_ms_per_step=ms(self_gpu / n),
            self_host_share=round(self_cpu / wall_us, 4) if wall_us else 0.0,
            self_gpu_share=(round(self_gpu / gpu_us, 4) if gpu_us else 0.0) if w.has_gpu else None,
            steps=sorted(ran), phases=sorted(phases, key=lambda p: -phases[p]), **stack,
        )
        for (name, shapes), (calls, self_cpu, cpu, self_gpu, gpu, ran, phases, _, stack) in acc.items()
    ]
    out.sort(key=lambda r: (-r.self_host_ms, r.name))
    return OpsAnswer(run="", worker=w.name, phase=phase, group=group, steps=len(steps), wall_ms=ms(wall_us),
                     gpu_ms=ms(gpu_us), ops=out, left_out=left_out, left_out_why=why)

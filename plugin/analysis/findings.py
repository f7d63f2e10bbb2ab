"""A worker's findings as typed records, largest estimated saving first, then notes.

The advice on each costly phase and its parts comes from `advice` (over the cost model of `cost`);
this module adds what the steps say among themselves (a slow step beyond noise, fast ones, too few to
judge) and what the reader must know about the figures (inferred phases or steps, empty steps, no
GPU, steps left out because they compiled, time kept out of the steps). The first finding's phase is
the summary's dominant phase. docs/findings.md lists every kind.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import COMPILE

from ..answers import Evidence, Finding, Summary
from .advice import Context, advise
from .cost import Costs, Figures
from .noise import MIN_VALUES, noise
from .worker import Worker, ms


def findings(summary: Summary, w: Worker, full: np.ndarray, figures: Figures | None,
             costs: Costs | None) -> list[Finding]:
    """The findings on ``summary`` of worker ``w`` (``full``: the rows it stands for)."""
    if summary.mean is None or figures is None or costs is None:
        if not summary.steps:
            return []
        return [_note("no-work", "no profiled step holds any work", steps=list(w.numbers)), *_outside(summary, w)]
    total = costs.total_us  # the step's time in the measure that binds it: savings are shares of it
    ctx = Context(ops=w.op_means(full), kernels=w.kernel_means(full), loader=w.loader, gpu_names=w.gpu_names)
    ranked = [
        Finding(kind=a.kind, phase=a.phase, saving_ms=None if a.saving_us is None else ms(a.saving_us),
                share=None if a.saving_us is None else _share(a.saving_us, total),
                evidence=a.evidence, text=a.text)
        for a in advise(figures, costs, ctx)
    ]
    ranked += _steps_beyond_noise(summary, w, full, costs)
    ranked.sort(key=lambda f: -(f.saving_ms or 0.0))  # stable: a phase's cost finding before a tie
    return ranked + _notes(summary, w, full)


def _steps_beyond_noise(summary: Summary, w: Worker, full: np.ndarray, costs: Costs) -> list[Finding]:
    walls = w.wall_us[full]
    band = noise(walls)
    out = []
    slow = summary.slowest
    if slow is not None and slow.noise == "beyond-noise" and slow.phase is not None:
        # Spread over the steps, the slow step costs each its excess / N; never more than its phase costs.
        saving = min((slow.vs_median_ms or 0.0) * 1000.0 / len(full), costs.cost_us.get(slow.phase, 0.0))
        ops = ", ".join(o.name for o in (slow.ops or [])[:3])
        out.append(Finding(
            kind="slow-step", phase=slow.phase, saving_ms=ms(saving), share=_share(saving, costs.wall_us),
            evidence=Evidence(step=slow.step, step_wall_ms=slow.wall_ms, median_wall_ms=ms(band.median),
                              noise_ms=ms(band.band), phase_delta_ms=slow.phase_delta_ms,
                              ops=[o.name for o in (slow.ops or [])[:3]] or None),
            text=f"step {slow.step} took {slow.wall_ms:.2f} ms, {slow.vs_median_ms:.2f} ms over the median step "
                 f"{slow.median_step} (beyond the steps' noise of ±{ms(band.band):.2f} ms): its {slow.phase} grew by "
                 f"{slow.phase_delta_ms:.2f} ms" + (f" ({ops})" if ops else "")))
    fast = [k for k in full.tolist() if band.fast(float(w.wall_us[k]))]
    if fast:
        numbers = ", ".join(str(w.numbers[k]) for k in fast)
        fastest = min(fast, key=lambda k: w.wall_us[k])
        ratio = f", {w.wall_us[fastest] / band.median:.2f}x the median" if band.median > 0 else ""
        out.append(Finding(
            kind="fast-steps", phase=None, saving_ms=None, share=None,
            evidence=Evidence(steps=[w.numbers[k] for k in fast], step=w.numbers[fastest],
                              step_wall_ms=ms(w.wall_us[fastest]), median_wall_ms=ms(band.median),
                              noise_ms=ms(band.band)),
            text=f"step{'s' if len(fast) > 1 else ''} {numbers} took far less than the median step "
                 f"({ms(band.median):.2f} ms; step {w.numbers[fastest]} {ms(w.wall_us[fastest]):.2f} ms{ratio}), "
                 f"beyond the steps' noise of ±{ms(band.band):.2f} ms: warm-up, or work (or waiting) that "
                 "landed in other steps; the means include them"))
    return out


def _notes(summary: Summary, w: Worker, full: np.ndarray) -> list[Finding]:
    out = []
    if 0 < len(full) < MIN_VALUES:
        out.append(_note("too-few-steps", f"{len(full)} profiled step{'s' if len(full) > 1 else ''} holding work: too "
                                          f"few to tell slow or fast steps from noise (at least {MIN_VALUES})",
                         steps=[w.numbers[k] for k in full.tolist()]))
    if not summary.gpu:
        out.append(_note("no-gpu", "no GPU activity in these traces: all figures are host (CPU) time"))
    out += _gpu_past_host(summary, w, full)
    inferred_steps = [w.numbers[k] for k in full.tolist() if _step(w, k).inferred_step]
    if inferred_steps:
        out.append(_note("inferred-steps", f"the trace marks no steps: {len(inferred_steps)} steps inferred, one per "
                                           "iteration of the loop's repeated marks (DataLoader, optimizer, backward); "
                                           "torch.profiler's schedule with prof.step() marks them exactly",
                         steps=inferred_steps))
    if summary.inferred_phases:
        names = " and ".join(summary.inferred_phases)
        out.append(_note("inferred-phases", f"{names} inferred from the ops (the trace marks no such ranges): add "
                                            "PhaseProfiler or record_function ranges for exact boundaries",
                         phases=list(summary.inferred_phases)))
    for number in summary.empty_steps:
        out.append(_note("empty-step", f"step {number} is empty (the loop ended inside the profiler's active window): "
                                       "left out of averages", step=number))
    if summary.compiling_steps:
        steps = summary.compiling_steps
        j = w.phases.index(COMPILE)
        rows = [k for k, n in enumerate(w.numbers) if n in steps]
        out.append(_note("compiling-steps", f"step{'s' if len(steps) > 1 else ''} {_numbers(steps)} compiled "
                                            f"(torch.compile: {ms(w.cpu_us[rows, j].sum()):,.2f} ms in the compile "
                                            "phase): left out of the means, costs, slowest step, outliers and "
                                            "findings, as the training side's summary leaves them out",
                         steps=steps, phases=[COMPILE]))
    return out + _outside(summary, w)


#: GPU work running on after its step's host window by more than this share of its GPU window is noted.
PAST_HOST_SHARE = 0.05


def _gpu_past_host(summary: Summary, w: Worker, full: np.ndarray) -> list[Finding]:
    """Steps whose GPU work outlasts their host window: the host ran ahead of the GPU."""
    past, window = w.past_host_us[full], w.gpu_window_us[full]
    ahead = full[(past > PAST_HOST_SHARE * window) & (past > 0)]
    if not len(ahead):
        return []
    steps = [w.numbers[k] for k in ahead.tolist()]
    measured = (f"; the step is GPU-bound, so it is measured by the GPU ({summary.cost_total_ms:,.2f} ms of GPU "
                "compute per step)" if summary.measure == "gpu" and summary.cost_total_ms is not None else "")
    return [_note("gpu-past-host", f"the GPU work of step{'s' if len(steps) > 1 else ''} {_numbers(steps)} runs on "
                                   f"after the step's host window ends (by {ms(w.past_host_us[ahead].mean()):,.2f} ms "
                                   f"on average, at most {ms(w.past_host_us[ahead].max()):,.2f} ms): the host runs "
                                   "ahead of the GPU, and a step's GPU figures count the work it launched wherever "
                                   f"it ran{measured}",
                  steps=steps, past_host_ms=ms(w.past_host_us[ahead].mean()))]


def _outside(summary: Summary, w: Worker) -> list[Finding]:
    """What the profiled window held outside the steps: evaluation passes, ``prof.paused()`` blocks."""
    if not (summary.eval_ms or summary.paused_ms):
        return []
    held = w.outside_us.sum(axis=1) > 0
    steps = [n for n, h in zip(w.numbers, held.tolist()) if h]
    parts = []
    if summary.eval_ms:
        parts.append(f"evaluation passes {summary.eval_ms:,.2f} ms")
    if summary.paused_ms:
        parts.append(f"prof.paused() blocks {summary.paused_ms:,.2f} ms")
    where = f"step{'s' if len(steps) > 1 else ''} {_numbers(steps)}"
    return [_note("outside-steps", f"time kept out of the steps ran inside the profiled window ({where}): "
                                   f"{' and '.join(parts)}; not counted in any step's time, phases or findings",
                  steps=steps, eval_ms=summary.eval_ms, paused_ms=summary.paused_ms)]


def _numbers(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers)


def _note(kind: str, text: str, **evidence) -> Finding:
    return Finding(kind=kind, phase=None, saving_ms=None, share=None, evidence=Evidence(**evidence), text=text)


def _step(w: Worker, row: int):
    ref = w.refs[row]
    return ref.span.steps[ref.index]


def _share(saving_us: float, wall_us: float) -> float | None:
    return round(saving_us / wall_us, 4) if wall_us > 0 else None

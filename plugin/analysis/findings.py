"""A worker's findings as typed records, largest estimated saving first, then notes.

The advice on each costly phase and its parts comes from `advice` (over the cost model of `cost`);
this module adds what the steps say among themselves (a slow step beyond noise, fast ones, too few to
judge, read from the summary's one judgement of the steps, `Summary.noise`) and what the reader must
know about the figures (inferred phases or steps, empty steps, no GPU, steps left out because they
compiled, warmed up or were cut by the trace's end, time kept out of the steps). The first finding's phase is
the summary's dominant phase. docs/findings.md lists every kind.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import COMPILE

from ..answers import Evidence, Finding, Summary
from .advice import Context, advise
from .blocking import Blocked
from .cost import GPU, Costs, Figures
from .noise import MIN_VALUES, lower_median
from .path_summary import PathFigures, path_figures
from .warmup import SETUP_CALL
from .worker import Worker, ms


def findings(summary: Summary, w: Worker, full: np.ndarray, figures: Figures | None,
             costs: Costs | None) -> list[Finding]:
    """The findings on ``summary`` of worker ``w`` (``full``: the rows it stands for)."""
    if summary.mean is None or figures is None or costs is None:
        if not summary.steps:
            return []
        return [_note("no-work", "no profiled step holds any work", steps=list(w.numbers)), *_apart(summary, w)]
    total = costs.total_us  # the step's time in the measure that binds it: savings are shares of it
    ctx = Context(ops=w.op_means(full), kernels=w.kernel_means(full), loader=w.loader, gpu_names=w.gpu_names,
                  gpu_capabilities=w.gpu_capabilities, cpus=w.cpus,
                  untraced_us=dict(zip(w.phases, w.untraced_us[full].mean(axis=0).tolist())),
                  blocking=w.blocking_means(full))
    ranked = [
        Finding(kind=a.kind, phase=a.phase, saving_ms=None if a.saving_us is None else ms(a.saving_us),
                share=None if a.saving_us is None else _share(a.saving_us, total),
                evidence=a.evidence, text=a.text)
        for a in advise(figures, costs, ctx)
    ]
    paths = path_figures(w, full)
    if paths is not None:
        ranked = [_what_if(f, paths, ctx.blocking, float(w.wall_us[full].mean()), figures, costs)
                  for f in ranked]
    ranked += _steps_beyond_noise(summary, w, full, costs)
    ranked.sort(key=lambda f: -(f.saving_ms or 0.0))  # stable: a phase's cost finding before a tie
    return ranked + _notes(summary, w, full)


#: Findings on the host's waiting for the device, and which of the calls that held it they name.
_WAITING = {"host-blocked": lambda b: True, "sync": lambda b: True,
            "pageable-copies": lambda b: b.copy is not None and "Pageable" in b.copy}
#: Findings on work of some kinds in their phase: what of the path is of those kinds.
_PATH_KINDS = {"exposed-communication": ("collective",), "pageable-copies": ("copy", "sync")}
#: Findings with nothing on the path to remove (their saving is of calls the path does not name).
_OFF_PATH = ("allocator",)


def _what_if(f: Finding, paths: PathFigures, blocking: list[Blocked], wall_us: float,
             figures: Figures, costs: Costs) -> Finding:
    """``f`` with its what-if bound (`Finding.what_if_ms`: the length of a chain of the step's work
    with what the finding names at zero, which the step cannot get shorter than), and its saving
    clamped to the mean step less it. The chain: for the host's waiting, the host's own work in
    program order (the step's length long) less the time those calls were held; in a step measured
    by the GPU, the GPU's busy time less the phase's (or its exposed communication); else the
    critical path less the time on it of the phase's work (or of its communication or copies)."""
    if f.phase is None or f.kind in _OFF_PATH:
        return f
    n = max(paths.steps, 1)
    held = sum(float(b.blocked_us) for b in blocking
               if f.kind in _WAITING and b.phase == f.phase and _WAITING[f.kind](b))
    if held > 0:
        step_us = length = wall_us
        chain, gone = "the host thread's {length} ms step less the {gone} ms it was held", held
    elif costs.measure == GPU:
        j = figures.phases.index(f.phase)
        step_us = length = costs.gpu_busy_us
        chain = "the GPU's {length} ms of busy time less the {gone} ms of this phase's"
        gone = float(figures.exposed_comm_us[j] if f.kind == "exposed-communication"
                     else figures.busy_us[j])
    else:
        step_us, length = wall_us, paths.length / n
        chain = "the {length} ms critical path less the {gone} ms on it this finding is about"
        gone = (sum(paths.phase_kinds.get((f.phase, k), 0.0) for k in _PATH_KINDS[f.kind]) / n
                if f.kind in _PATH_KINDS else paths.phases.get(f.phase, 0.0) / n)
    bound = max(float(length - gone), 0.0)
    f.what_if_ms = ms(bound)
    most = max(step_us - bound, 0.0)
    if f.saving_ms is not None and f.saving_ms > ms(most):
        f.saving_ms = ms(most)
        f.share = _share(most, costs.total_us)
    f.evidence.removed_ms = ms(gone)
    said = chain.format(length=f"{ms(length):,.2f}", gone=f"{f.evidence.removed_ms:,.2f}")
    f.text += f"; with it gone the step would still take at least {f.what_if_ms:,.2f} ms ({said})"
    return f


def _steps_beyond_noise(summary: Summary, w: Worker, full: np.ndarray, costs: Costs) -> list[Finding]:
    judged = summary.noise
    if judged is None or not judged.judged:
        return []
    band, median = judged.band_ms or 0.0, judged.median_ms
    out = []
    slow = summary.slowest
    if slow is not None and slow.noise == "beyond-noise" and slow.phase is not None:
        # Spread over the steps, the slow step costs each its excess / N; never more than its phase costs.
        saving = min((slow.vs_median_ms or 0.0) * 1000.0 / len(full), costs.cost_us.get(slow.phase, 0.0))
        ops = ", ".join(o.name for o in (slow.ops or [])[:3])
        out.append(Finding(
            kind="slow-step", phase=slow.phase, saving_ms=ms(saving), share=_share(saving, costs.wall_us),
            evidence=Evidence(step=slow.step, step_wall_ms=slow.wall_ms, median_wall_ms=median,
                              noise_ms=band, phase_delta_ms=slow.phase_delta_ms,
                              ops=[o.name for o in (slow.ops or [])[:3]] or None),
            text=f"step {slow.step} took {slow.wall_ms:.2f} ms, {slow.vs_median_ms:.2f} ms over the median step "
                 f"{slow.median_step} ({median:.2f} ms; beyond the steps' noise of ±{band:.2f} ms): its "
                 f"{slow.phase} grew by {slow.phase_delta_ms:.2f} ms" + (f" ({ops})" if ops else "")))
    if judged.fast:
        rows = [w.row_of(n) for n in judged.fast]
        fastest = min(rows, key=lambda k: w.wall_us[k])
        ratio = f", {ms(w.wall_us[fastest]) / median:.2f}x the median" if median > 0 else ""
        out.append(Finding(
            kind="fast-steps", phase=None, saving_ms=None, share=None,
            evidence=Evidence(steps=list(judged.fast), step=w.numbers[fastest], step_wall_ms=ms(w.wall_us[fastest]),
                              median_wall_ms=median, noise_ms=band),
            text=f"step{'s' if len(rows) > 1 else ''} {_numbers(judged.fast)} took far less than the median step "
                 f"{judged.median_step} ({median:.2f} ms; step {w.numbers[fastest]} {ms(w.wall_us[fastest]):.2f} ms"
                 f"{ratio}), beyond the steps' noise of ±{band:.2f} ms: work (or waiting) that landed in other "
                 "steps, or a warm-up the rules did not recognise; the means include them"))
    return out


def _notes(summary: Summary, w: Worker, full: np.ndarray) -> list[Finding]:
    out = []
    if 0 < len(full) < MIN_VALUES:
        out.append(_note("too-few-steps", f"{len(full)} profiled step{'s' if len(full) > 1 else ''} to judge: too "
                                          f"few steps to tell slow or fast steps from noise (at least {MIN_VALUES})",
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
                                            f"(torch.compile: {ms(w.host_us[rows, j].sum()):,.2f} ms in the compile "
                                            "phase): left out of the means, costs, slowest step, outliers and "
                                            "findings, as the training side's summary leaves them out",
                         steps=steps, phases=[COMPILE]))
    if summary.warmup_steps:
        out.append(_warmup(summary.warmup_steps, w, full))
    if summary.cut_steps:
        out.append(_cut(summary.cut_steps, w, full))
    return out + _apart(summary, w)


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


def _warmup(steps: list[int], w: Worker, full: np.ndarray) -> Finding:
    """The warm-up steps left out, how long they took against the steps kept, and their setup calls."""
    rows = [w.row_of(n) for n in steps]
    setup = float(w.setup_us[rows].sum())
    longest = max(rows, key=lambda k: w.wall_us[k])
    median = ms(lower_median(w.wall_us[full]))
    calls: dict[str, float] = {}
    for span, _, indices in w.by_span(rows):
        t = span.ops
        picked = np.isin(t.step, indices)
        for name, us in zip(t.name[picked].tolist(), t.self_us[picked].tolist()):
            if SETUP_CALL.match(span.names[name]):
                calls[span.names[name]] = calls.get(span.names[name], 0.0) + us
    top = sorted(calls, key=lambda n: (-calls[n], n))[:3]
    what = (f"{ms(setup):,.2f} ms of one-off setup calls ({', '.join(top)})" if top
            else "the first step of its trace")
    return _note("warmup-steps",
                 f"step{'s' if len(steps) > 1 else ''} {_numbers(steps)} warmed up (step {w.numbers[longest]} "
                 f"took {ms(w.wall_us[longest]):,.2f} ms"
                 + (f", {ms(w.wall_us[longest]) / median:.1f}x the median step kept ({median:,.2f} ms)" if median > 0
                    else "") + f"; {what}): left out of the means, costs, slowest step, outliers and "
                 "findings, as compiling steps are",
                 steps=list(steps), step=w.numbers[longest], step_wall_ms=ms(w.wall_us[longest]),
                 median_wall_ms=median, setup_ms=ms(setup), ops=top or None)


def _cut(steps: list[int], w: Worker, full: np.ndarray) -> Finding:
    """The last steps of their traces that the traces' ends cut (`cut`), left out."""
    rows = [w.row_of(n) for n in steps]
    longest = max(rows, key=lambda k: w.wall_us[k])
    median = ms(lower_median(w.wall_us[full]))
    return _note("cut-steps",
                 f"step{'s' if len(steps) > 1 else ''} {_numbers(steps)} ended with the trace (step "
                 f"{w.numbers[longest]}: {ms(w.wall_us[longest]):,.2f} ms, the median step kept "
                 f"{median:,.2f} ms): after its last host event only the GPU ran, until the trace "
                 "ended, so the step's end is not known: left out of the means, costs, slowest step, "
                 "outliers and findings, as warm-up steps are",
                 steps=list(steps), step=w.numbers[longest], step_wall_ms=ms(w.wall_us[longest]),
                 median_wall_ms=median)


def _apart(summary: Summary, w: Worker) -> list[Finding]:
    """What the profiled window held outside the steps: evaluation passes, ``prof.paused()`` blocks."""
    if not (summary.eval_ms or summary.paused_ms):
        return []
    held = w.apart_us.sum(axis=1) > 0
    steps = [n for n, h in zip(w.numbers, held.tolist()) if h]
    parts = []
    if summary.eval_ms:
        parts.append(f"evaluation passes {summary.eval_ms:,.2f} ms")
    if summary.paused_ms:
        parts.append(f"prof.paused() blocks {summary.paused_ms:,.2f} ms")
    where = f"step{'s' if len(steps) > 1 else ''} {_numbers(steps)}"
    return [_note("kept-apart", f"time kept out of the steps ran inside the profiled window ({where}): "
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

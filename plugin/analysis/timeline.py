"""Every step of a run from the per-step scalars the training hook writes, aligned for charting: the
phases of each step, and apart from them the time kept outside the steps (evaluation passes, the
profiler's own time)."""

from __future__ import annotations

from phaseprof.contract import EVAL_TAG, HOOK_TAG, PHASES, PROFILER_TAG, parse_tag

from ..answers import TimelineAnswer

_STEP = "step"


def windows(numbers: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive step numbers as ``(first, last)`` pairs (the profiled windows)."""
    out: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def timeline(run: str, series: dict[str, list[tuple[int, float]]], profiled: list[int],
             kept_all: bool) -> TimelineAnswer:
    """Arrays aligned on the union of steps of all tags; ``None`` where a tag has no value.

    ``series`` maps a scalar tag (``phaseprof/<phase>[_gpu]_ms``, ``phaseprof/eval_ms``,
    ``phaseprof/profiler_ms``, ``phaseprof/hook_ms``)
    to its ``(step, value)`` points; ``kept_all`` says whether TensorBoard
    kept every sample (else the series are downsampled).
    """
    cpu: dict[str, dict[int, float]] = {}
    gpu: dict[str, dict[int, float]] = {}
    apart: dict[str, dict[int, float]] = {EVAL_TAG: {}, PROFILER_TAG: {}, HOOK_TAG: {}}
    steps: set[int] = set()
    for tag, points in series.items():
        parsed = parse_tag(tag)
        if parsed is None:
            if tag not in apart:
                continue
            target = apart[tag]
        else:
            phase, is_gpu = parsed
            target = (gpu if is_gpu else cpu).setdefault(phase, {})
        for step, value in points:
            target[step] = value
            steps.add(step)
    ordered = sorted(steps)
    phases = [p for p in PHASES if p in cpu or p in gpu]
    phases += sorted(p for p in cpu.keys() | gpu.keys() if p not in PHASES and p != _STEP)

    def column(values: dict[int, float]) -> list[float | None]:
        return [None if (v := values.get(s)) is None else round(float(v), 3) for s in ordered]

    return TimelineAnswer(
        run=run,
        phases=phases,
        steps=ordered,
        cpu={p: column(cpu[p]) for p in phases if p in cpu},
        gpu={p: column(gpu[p]) for p in phases if p in gpu},
        wall=column(cpu.get(_STEP, {})),
        wall_gpu=column(gpu.get(_STEP, {})),
        eval=column(apart[EVAL_TAG]),
        profiler=column(apart[PROFILER_TAG]),
        profiled=windows(profiled),
        downsampled=not kept_all,
        hook=column(apart[HOOK_TAG]) if HOOK_TAG in series else None,
    )

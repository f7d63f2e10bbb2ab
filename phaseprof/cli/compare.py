"""`phaseprof compare BASE NEW`: the regression gate. Reads both sides, compares every phase's time
per step (`analysis.regression`), and names the ops that changed most.

A side is a logdir, a run directory or one trace file; all its runs and workers are pooled. Its
steps come from the every-step scalars when both sides have them (every step of the run), else from
the traced steps (the profiler's active window). Either way the steps that are not steady are left out,
as the summaries leave them out, and each side says which: one compiling step can outweigh a thousand
steady ones. Input that cannot answer the question (a missing
path, nothing readable, too few steps, times that are not times: a step time that is not finite and
positive, a phase time that is not finite or is negative) raises `UnusableInput`: the gate must
never pass for want of data, nor on corrupt data. A phase only one side recorded is not comparable
(`analysis.regression`), never slower.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import COMPILE, NOT_PHASE_TAGS, PHASES, STEP_GPU_TAG, STEP_TAG, host_tag, parse_tag
from phaseprof.plugin.analysis.compare import changed_ops
from phaseprof.plugin.analysis.model import SpanAnalysis
from phaseprof.plugin.analysis.regression import MIN_STEPS, compare_figures, side_figure
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.answers import Change, ChangedOp, FileError, GateReport, GateSide
from phaseprof.plugin.cache import read_only
from phaseprof.plugin.reading import storage
from phaseprof.plugin.reading.discovery import discover, display
from phaseprof.plugin.reading.errors import TraceError
from phaseprof.plugin.reading.scalars import Scalars, read_scalars
from phaseprof.plugin.spans import analyze_file
from phaseprof.steady import steady_steps

SCALARS, TRACES = "scalars", "traces"
#: Changed ops listed.
TOP_OPS = 15


class UnusableInput(Exception):
    """A side that cannot be compared; ``str()`` names the path and why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class _Side:
    def __init__(self, path: str) -> None:
        try:
            if not storage.exists(path):
                raise UnusableInput(path, "no such file or directory")
        except storage.StorageError as e:
            raise UnusableInput(path, str(e).removeprefix(f"{path}: ")) from None
        self.path = path
        unreadable: list[tuple[str, str]] = []
        self.runs = discover(path, unreadable)
        self.errors: list[FileError] = [FileError(path=display(p), error=why) for p, why in unreadable]
        self.spans: list[SpanAnalysis] = []
        self.keys: list[tuple[str, str]] = []  # (run, worker) of each span
        self.workers: set[tuple[str, str]] = set()
        for run in self.runs:
            for f in run.files:
                try:
                    self.spans.append(analyze_file(f, shapes=False, beside=not read_only()))
                    self.keys.append((run.name, f.worker))
                    self.workers.add((run.name, f.worker))
                except TraceError as e:
                    self.errors.append(FileError(path=f.path, error=e.reason))
        self.scalars: list[Scalars] = []
        self.writers: list[str] = []  # who wrote each of `scalars`: the run, or one of its ranks
        for run in self.runs:
            for rank, directory in run.scalar_dirs():
                if (s := read_scalars(directory)) is not None:
                    self.scalars.append(s)
                    self.writers.append(run.name if rank is None else f"{run.name} rank {rank}")

    def workers_of(self) -> list[Worker]:
        """The spans as workers (a run's worker is not another run's)."""
        by: dict[tuple[str, str], list[SpanAnalysis]] = {}
        for key, span in zip(self.keys, self.spans):
            by.setdefault(key, []).append(span)
        return [Worker(name, spans) for (_, name), spans in by.items()]

    def figures(self, source: str) -> tuple[list[dict[tuple[str, str], np.ndarray]], list[str]]:
        """Each run's (or rank's, or worker's) figures over its steady steps, and what was left out, in words."""
        if source == TRACES:
            workers = self.workers_of()
            return [_traced_figures(w) for w in workers], _traced_left_out(workers)
        runs, said = zip(*(_scalar_figures(s) for s in self.scalars))
        if len({tuple(words) for words in said}) == 1:  # one writer, or all alike: say it once
            return list(runs), list(said[0])
        return list(runs), [f"{who}: {w}" for who, words in zip(self.writers, said) for w in words]

    def describe(self, steps: int, source: str, left_out: list[str]) -> GateSide:
        workers = len(self.workers) if source == TRACES else len(self.scalars)
        return GateSide(path=self.path, runs=[r.name for r in self.runs], workers=workers, steps=steps,
                        has_scalars=bool(self.scalars), has_traces=bool(self.spans), left_out=left_out)


def compare_paths(base: str, new: str, *, threshold: float = 0.05, confidence: float = 0.95,
                  min_share: float = 0.01, source: str | None = None) -> GateReport:
    """Compare ``new`` against ``base``; ``source`` forces "scalars" or "traces" (default: scalars
    when both sides have them)."""
    a, b = _Side(base), _Side(new)
    if source is None:
        source = SCALARS if a.scalars and b.scalars else TRACES
    for side in (a, b):
        if source == SCALARS and not side.scalars:
            raise UnusableInput(side.path, "no phaseprof scalars (events.out.tfevents.* with phaseprof/ tags)")
        if source == TRACES and not side.spans:
            what = "; ".join(f"{e.path}: {e.error}" for e in side.errors[:3])
            raise UnusableInput(side.path, "no readable trace files" + (f" ({what})" if what else ""))
    (runs_a, left_a), (runs_b, left_b) = a.figures(source), b.figures(source)
    for side, which, runs in ((a, "base", runs_a), (b, "new", runs_b)):
        _check_times(side.path, which, runs)
    steps_a, steps_b = (sum(len(r[("step", "host")]) for r in runs) for runs in (runs_a, runs_b))
    for side, steps in ((a, steps_a), (b, steps_b)):
        if steps < MIN_STEPS:
            raise UnusableInput(side.path, f"{steps} step(s) to compare; at least {MIN_STEPS} are needed")
    keys = _order({k for r in runs_a + runs_b for k in r})
    figures = [(phase, clock, _per_run(runs_a, (phase, clock)), _per_run(runs_b, (phase, clock)))
               for phase, clock in keys]
    base_step = side_figure([r[("step", "host")] for r in runs_a])
    changes = compare_figures(figures, base_step_ms=base_step, threshold=threshold, confidence=confidence,
                              min_share=min_share)
    ops: list[ChangedOp] = []
    if a.spans and b.spans:
        ops = changed_ops(_op_means(a.workers_of()), _op_means(b.workers_of()))[:TOP_OPS]
    return GateReport(
        base=a.describe(steps_a, source, left_a), new=b.describe(steps_b, source, left_b), source=source,
        threshold=threshold, confidence=confidence, min_share=min_share, changes=changes,
        slower=[label(c) for c in changes if c.slower], ops=ops, errors=a.errors + b.errors,
    )


def label(change: Change) -> str:
    """``forward``, ``forward (gpu)``, ``step``: how a figure is named in lists and messages."""
    return _named(change.phase, change.clock)


def _named(phase: str, clock: str) -> str:
    return phase + (" (gpu)" if clock == "gpu" else "")


def _order(keys) -> list[tuple[str, str]]:
    """The step first, canonical phases in step order, then the user's; host before GPU."""
    rank = {"step": -1, **{p: i for i, p in enumerate(PHASES)}}
    return sorted(keys, key=lambda k: (k[1] == "gpu", rank.get(k[0], len(PHASES)), k[0]))


def _check_times(path: str, which: str, runs: list[dict[tuple[str, str], np.ndarray]]) -> None:
    """Refuse (`UnusableInput`, naming the side and the figure) per-step times that cannot be
    times: a step time that is not finite and positive, a phase's (or the GPU's) that is not finite
    or is negative. Corrupt scalars would otherwise pass the gate ("-200% faster") or fail it for
    nothing."""
    for key in _order({k for r in runs for k in r}):
        ms = np.concatenate([r[key] for r in runs if key in r])
        step = key == ("step", "host")
        bad = ~np.isfinite(ms) | ((ms <= 0) if step else (ms < 0))
        if bad.any():
            figure = _named(*key)
            wanted = "finite and positive" if step else "finite and not negative"
            raise UnusableInput(path, f"{which} side: {int(bad.sum())} of {len(ms)} {figure} times "
                                      f"(ms per step) are not {wanted} (the first: "
                                      f"{float(ms[bad][0]):g}); corrupt scalars or traces")


def _per_run(runs: list[dict[tuple[str, str], np.ndarray]], key: tuple[str, str]) -> list[np.ndarray]:
    """Each run's per-step ms of one figure; a phase a run never ran took no time in its steps,
    unless no run of the side ran it: then the side has no figure (none: not comparable)."""
    if not any(key in r for r in runs):
        return []
    empty = np.zeros(0)
    return [r.get(key, np.zeros(len(r[("step", "host")])) if key[1] == "host" else empty) for r in runs]


def _scalar_figures(s: Scalars) -> tuple[dict[tuple[str, str], np.ndarray], list[str]]:
    """Per (phase, clock), the per-step ms of every steady timed step of one run (or rank): the first
    step and the compiling ones left out, as `whole_run` leaves them (`phaseprof.steady`); and which
    were, in words."""
    out: dict[tuple[str, str], np.ndarray] = {("step", "host"): np.zeros(0)}
    left_out: list[str] = []
    timed = s.values.get(STEP_TAG)
    if timed is not None:
        has_step = ~np.isnan(timed)
        compile_ms = s.values.get(host_tag(COMPILE))
        steady, left_out = steady_steps(s.steps[has_step], compile_ms[has_step] if compile_ms is not None else None)
        has_step[has_step] = steady
        for tag, column in s.values.items():
            if tag in NOT_PHASE_TAGS:
                continue
            if tag in (STEP_TAG, STEP_GPU_TAG):
                key = ("step", "gpu" if tag == STEP_GPU_TAG else "host")
            else:
                parsed = parse_tag(tag)
                if parsed is None:
                    continue
                key = (parsed[0], "gpu" if parsed[1] else "host")
            if key[1] == "host":  # a phase first seen later in the run took no time in earlier steps
                values = column[has_step]
                out[key] = np.where(np.isnan(values), 0.0, values)  # an infinity stays: refused
            else:  # GPU times exist only where CUDA events were read
                out[key] = column[has_step & ~np.isnan(column)]
    return out, left_out


def _traced_figures(w: Worker) -> dict[tuple[str, str], np.ndarray]:
    """Per (phase, clock), the per-step ms of the traced steps of one worker: the steps its summary
    stands for (`Worker.steady`: no empty, compiling or warm-up step)."""
    rows = w.steady()
    on_gpu = rows[w.on_gpu[rows]]
    out = {("step", "host"): w.wall_us[rows] / 1000.0}
    for j, p in enumerate(w.phases):
        out[(p, "host")] = w.host_us[rows, j] / 1000.0
    if len(on_gpu):
        out[("step", "gpu")] = w.gpu_us[on_gpu].sum(axis=1) / 1000.0
        for j, p in enumerate(w.phases):
            out[(p, "gpu")] = w.gpu_us[on_gpu, j] / 1000.0
    return out


def _traced_left_out(workers: list[Worker]) -> list[str]:
    """What `_traced_figures` left out of all ``workers``' traced steps, in words."""
    compiling = warmup = 0
    for w in workers:
        full = w.full()
        if len(w.steady()) < len(full):  # `Worker.steady` keeps every step when none is steady
            compiling += int(w.compiling[full].sum())
            warmup += int((w.warmup[full] & ~w.compiling[full]).sum())
    return ([f"{compiling} compiling step(s)"] if compiling else []) + \
        ([f"{warmup} warm-up step(s)"] if warmup else [])


def _op_means(workers: list[Worker]) -> dict[tuple[str, str], np.ndarray]:
    """(phase, op) -> mean per step of the `Worker.op_means` columns, over the steady steps of all workers."""
    totals: dict[tuple[str, str], np.ndarray] = {}
    steps = 0
    for w in workers:
        rows = w.steady()
        for key, v in w.op_means(rows).items():
            totals[key] = totals.get(key, 0.0) + v * len(rows)
        steps += len(rows)
    return {k: v / max(steps, 1) for k, v in totals.items()}

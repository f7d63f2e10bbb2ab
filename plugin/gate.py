"""`phaseprof compare BASE NEW`: the regression gate. Reads both sides, compares every phase's time
per step (`analysis.regression`), and names the ops that changed most.

A side is a logdir, a run directory or one trace file; all its runs and workers are pooled. Its
steps come from the every-step scalars when both sides have them (every step of the run), else from
the traced steps (the profiler's active window). Input that cannot answer the question (a missing
path, nothing readable, too few steps) raises `UnusableInput`: the gate must never pass for want of data.
"""

from __future__ import annotations

import os

import msgspec
import numpy as np

from phaseprof.contract import PHASES, SCALAR_PREFIX, STEP_GPU_TAG, STEP_TAG, parse_tag

from .analysis.compare import changed_ops, op_means
from .analysis.model import SpanAnalysis
from .analysis.regression import MIN_STEPS, Change, compare_figures
from .analysis.steps import phase_names, phase_table, step_refs
from .reading.discovery import discover
from .reading.errors import TraceError
from .reading.scalars import Scalars, read_scalars
from .report import analyze_file

SCALARS, TRACES = "scalars", "traces"
#: Scalars under the prefix that time no phase of a step: the profiler's own time, evaluation passes.
_OUT_OF_STEP_TAGS = (SCALAR_PREFIX + "profiler_ms", SCALAR_PREFIX + "eval_ms")
#: Changed ops listed.
TOP_OPS = 15


class UnusableInput(Exception):
    """A side that cannot be compared; the message names the path and why."""


class Side(msgspec.Struct):
    """What one side of the comparison was made of."""

    path: str
    runs: list[str]  # run names relative to the path
    workers: int  # workers (ranks) pooled
    steps: int  # steps compared
    has_scalars: bool
    has_traces: bool


class GateReport(msgspec.Struct):
    """The answer of ``phaseprof compare``: exit status 1 when `slower` is not empty."""

    base: Side
    new: Side
    source: str  # "scalars" (every step of the runs) or "traces" (the traced steps)
    threshold: float
    confidence: float
    min_share: float
    changes: list[Change]  # the step first, then each phase; host, then GPU figures
    slower: list[str]  # figures slower than the threshold with confidence: "forward", "step (gpu)", …
    ops: list[dict]  # the ops whose time per step changed most (both sides traced), biggest change first
    errors: list[dict]  # files that could not be read (the rest was compared)


class _Side:
    def __init__(self, path: str) -> None:
        if not os.path.exists(path):
            raise UnusableInput(f"{path}: no such file or directory")
        self.path = path
        self.runs = discover(path)
        self.errors: list[dict] = []
        self.spans: list[SpanAnalysis] = []
        self.workers: set[tuple[str, str]] = set()
        for run in self.runs:
            for f in run.files:
                try:
                    self.spans.append(analyze_file(f, shapes=False))
                    self.workers.add((run.name, f.worker))
                except TraceError as e:
                    self.errors.append({"path": f.path, "error": e.reason})
        self.scalars: list[Scalars] = [s for run in self.runs if run.has_scalars
                                       if (s := read_scalars(run.path)) is not None]

    def describe(self, steps: int, source: str) -> Side:
        workers = len(self.workers) if source == TRACES else len(self.scalars)
        return Side(path=self.path, runs=[r.name for r in self.runs], workers=workers, steps=steps,
                    has_scalars=bool(self.scalars), has_traces=bool(self.spans))


def compare_paths(base: str, new: str, *, threshold: float = 0.05, confidence: float = 0.95,
                  min_share: float = 0.01, source: str | None = None) -> GateReport:
    """Compare ``new`` against ``base``; ``source`` forces "scalars" or "traces" (default: scalars
    when both sides have them)."""
    a, b = _Side(base), _Side(new)
    if source is None:
        source = SCALARS if a.scalars and b.scalars else TRACES
    for side in (a, b):
        if source == SCALARS and not side.scalars:
            raise UnusableInput(f"{side.path}: no phaseprof scalars (events.out.tfevents.* with phaseprof/ tags)")
        if source == TRACES and not side.spans:
            what = "; ".join(f"{e['path']}: {e['error']}" for e in side.errors[:3])
            raise UnusableInput(f"{side.path}: no readable trace files" + (f" ({what})" if what else ""))
    fa, fb = (_scalar_figures(s.scalars) if source == SCALARS else _traced_figures(s.spans) for s in (a, b))
    steps_a, steps_b = len(fa[("step", "host")]), len(fb[("step", "host")])
    for side, steps in ((a, steps_a), (b, steps_b)):
        if steps < MIN_STEPS:
            raise UnusableInput(f"{side.path}: {steps} step(s) to compare; at least {MIN_STEPS} are needed")
    figures = []
    for key in _order(fa.keys() | fb.keys()):
        empty = np.zeros(0)
        # a phase one side never ran took no time there
        va = fa.get(key, np.zeros(steps_a) if key[1] == "host" else empty)
        vb = fb.get(key, np.zeros(steps_b) if key[1] == "host" else empty)
        figures.append((key[0], key[1], va, vb))
    changes = compare_figures(figures, base_step_ms=float(np.median(fa[("step", "host")])), threshold=threshold,
                              confidence=confidence, min_share=min_share)
    ops = []
    if a.spans and b.spans:
        ops = changed_ops(op_means(step_refs(a.spans)), op_means(step_refs(b.spans)))[:TOP_OPS]
    return GateReport(
        base=a.describe(steps_a, source), new=b.describe(steps_b, source), source=source, threshold=threshold,
        confidence=confidence, min_share=min_share, changes=changes,
        slower=[label(c) for c in changes if c.slower], ops=ops, errors=a.errors + b.errors,
    )


def label(change: Change) -> str:
    """``forward``, ``forward (gpu)``, ``step``: how a figure is named in lists and messages."""
    return change.phase + (" (gpu)" if change.clock == "gpu" else "")


def _order(keys) -> list[tuple[str, str]]:
    """The step first, canonical phases in step order, then the user's; host before GPU."""
    rank = {"step": -1, **{p: i for i, p in enumerate(PHASES)}}
    return sorted(keys, key=lambda k: (k[1] == "gpu", rank.get(k[0], len(PHASES)), k[0]))


def _scalar_figures(sets: list[Scalars]) -> dict[tuple[str, str], np.ndarray]:
    """Per (phase, clock), the per-step ms of every step of every run pooled."""
    parts: dict[tuple[str, str], list[np.ndarray]] = {}
    for s in sets:
        timed = s.values.get(STEP_TAG)
        if timed is None:
            continue
        has_step = ~np.isnan(timed)
        for tag, column in s.values.items():
            if tag in _OUT_OF_STEP_TAGS:
                continue
            if tag in (STEP_TAG, STEP_GPU_TAG):
                key = ("step", "gpu" if tag == STEP_GPU_TAG else "host")
            else:
                parsed = parse_tag(tag)
                if parsed is None:
                    continue
                key = (parsed[0], "gpu" if parsed[1] else "host")
            if key[1] == "host":  # a phase first seen later in the run took no time in earlier steps
                values = np.nan_to_num(column[has_step], nan=0.0)
            else:  # GPU times exist only where CUDA events were read
                values = column[has_step & ~np.isnan(column)]
            parts.setdefault(key, []).append(values)
    return {k: np.concatenate(v) for k, v in parts.items()}


def _traced_figures(spans: list[SpanAnalysis]) -> dict[tuple[str, str], np.ndarray]:
    """Per (phase, clock), the per-step ms of the traced steps of every worker pooled (empty steps
    left out)."""
    phases = phase_names(spans)
    out: dict[tuple[str, str], np.ndarray] = {}
    by_worker: dict[str, list[SpanAnalysis]] = {}
    for s in spans:
        by_worker.setdefault(s.worker, []).append(s)
    host, gpu, wall, step_gpu = [], [], [], []
    for worker_spans in by_worker.values():
        refs = [r for r in step_refs(worker_spans) if not r.empty]
        host.append(phase_table(refs, phases, "cpu_us") / 1000.0)
        wall.append(np.array([r.wall_us for r in refs]) / 1000.0)
        on_gpu = [r for r in refs if r.span.has_gpu]
        gpu.append(phase_table(on_gpu, phases, "gpu_us") / 1000.0)
        step_gpu.append(np.array([r.span.step_gpu_us[r.index] for r in on_gpu]) / 1000.0)
    host_t, gpu_t = np.concatenate(host), np.concatenate(gpu)
    out[("step", "host")] = np.concatenate(wall)
    for j, p in enumerate(phases):
        out[(p, "host")] = host_t[:, j]
    if len(gpu_t):
        out[("step", "gpu")] = np.concatenate(step_gpu)
        for j, p in enumerate(phases):
            out[(p, "gpu")] = gpu_t[:, j]
    return out

"""`Analysis`: one entry to every analysis of a logdir, the one path from a logdir to each answer.

TensorBoard's routes, ``phaseprof report`` and `phaseprof.analyze` all ask an `Analysis`; a
notebook does too::

    from phaseprof import Analysis

    a = Analysis("./profile")                 # a local folder or a store's URL (s3://, gs://, az://)
    [r.run for r in a.runs().runs]            # the runs under it
    a.steps("baseline").summary.findings[0].text
    a.kernels("baseline", step=12).to_pandas()

Each method returns the msgspec Struct its route returns (`phaseprof.plugin.answers`; its
``to_dict()`` gives plain data, its ``to_pandas()`` a table where one fits, with pandas installed).
A name the logdir does not hold raises `NotFound`, a malformed argument `BadArgument`.

Where the analyses come from is a `Source`: `Files` reads each trace once, in this process, when
first asked (notebooks, the CLI); TensorBoard's `TraceStore` loads them in worker processes in
the background and keeps them up to date.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

import msgspec
import numpy as np

from phaseprof.contract import FRAMEWORK_PHASES, PHASE_REGISTRY, USER_PHASE_COLOURS

from .analysis.collectives import collectives_answer
from .analysis.compare import compare
from .analysis.kernels import kernels_answer
from .analysis.memory import memory_series
from .analysis.memory_ops import memory_devices, run_memory
from .analysis.model import SpanAnalysis
from .analysis.modules import modules_answer
from .analysis.operators import GROUPS, run_ops
from .analysis.ranks import ranks
from .analysis.steps import apart_bands, ms, step_detail, step_rows
from .analysis.timeline import timeline
from .analysis.whole_run import scalars_of, whole_run
from .analysis.worker import Worker, phase_names, rank_of, rank_order
from .analysis.worker_summary import summarize
from .answers import (
    CollectivesAnswer,
    CompareAnswer,
    FileError,
    KernelsAnswer,
    Loading,
    MemoryAnswer,
    MemoryEventsAnswer,
    ModulesAnswer,
    OpsAnswer,
    PhaseStyle,
    RanksAnswer,
    RunInfo,
    RunsAnswer,
    SpanInfo,
    StepDetail,
    StepsAnswer,
    TimelineAnswer,
    WholeRun,
    WorkerInfo,
)
from .cache import read_only
from .reading.discovery import Run, TraceFile, discover, display
from .reading.errors import TraceError
from .reading.scalars import read_scalars
from .serving.store import ERROR, LOADING, PENDING, READY, Span, cut_step
from .spans import analyze_file

T = TypeVar("T")

#: Per-step scalars, by the folder holding them: tag -> its (step, value) points.
Series = dict[str, list[tuple[int, float]]]


class NotFound(LookupError):
    """A run, worker or step that the logdir does not hold (TensorBoard answers 404)."""


class BadArgument(ValueError):
    """An argument no answer can be made for (TensorBoard answers 400)."""


class Target(NamedTuple):
    """What a run / worker / step name the analysis of."""

    run: Run
    worker: Worker | None = None
    step: int | None = None  # the step number asked for
    rows: list[int] | None = None  # the worker's rows of that step


class Side(NamedTuple):
    """One side of a comparison: a run, and optionally one of its workers and one step."""

    run: str
    worker: str | None = None
    step: int | None = None


class Source(Protocol):
    """Where an `Analysis` finds runs and their analyses (`Files`, `serving.store.TraceStore`)."""

    logdir: str

    def refresh(self, force: bool = False) -> None: ...
    def runs(self) -> list[Run]: ...
    def run(self, name: str) -> Run | None: ...
    def span(self, f: TraceFile) -> Span: ...
    def analyses(self, run: Run, worker: str) -> list[SpanAnalysis]: ...
    def worker(self, run: Run, worker: str) -> Worker: ...
    def derived(self, run: Run, worker: str, compute: Callable[..., T] | None, *params) -> T: ...
    def step_trace(self, f: TraceFile, number: int) -> bytes | None: ...
    def unreadable(self) -> list[tuple[str, str]]: ...
    def progress(self) -> Loading: ...
    def logdir_error(self) -> str | None: ...
    def of_run(self, run: Run, compute: Callable[..., T], *params) -> T: ...


class Files:
    """The runs under ``path``, each trace file read and analysed once, in this process, when first
    asked for. ``shapes=False``: op tables without input shapes (cheaper, when nothing shows them);
    ``on_read(f)`` / ``on_done(f)``: told as each file is read (a progress bar)."""

    def __init__(self, path: str, *, shapes: bool = True, on_read: Callable[[TraceFile], None] | None = None,
                 on_done: Callable[[TraceFile], None] | None = None) -> None:
        self.logdir = path
        self._shapes = shapes
        self._on_read, self._on_done = on_read, on_done
        self._beside = not read_only()
        #: Folders under the path that could not be listed: (real path, why).
        self.unlisted: list[tuple[str, str]] = []
        self._runs = discover(path, self.unlisted)
        self._spans: dict[str, Span] = {}
        self._derived: dict[tuple, object] = {}

    def refresh(self, force: bool = False) -> None:
        """Nothing: the files are those found when it was made."""

    def runs(self) -> list[Run]:
        return list(self._runs)

    def run(self, name: str) -> Run | None:
        return next((r for r in self._runs if r.name == name), None)

    def span(self, f: TraceFile) -> Span:
        """The file's analysis, read now if it was not; a file that cannot be read is a span in
        ``error`` naming why (one bad file never hides the others)."""
        span = self._spans.get(f.path)
        if span is None:
            if self._on_read:
                self._on_read(f)
            try:
                span = Span(file=f, state=READY, analysis=analyze_file(f, shapes=self._shapes,
                                                                       beside=self._beside))
            except TraceError as e:
                span = Span(file=f, state=ERROR, error=e.reason)
            except Exception as e:  # noqa: BLE001 - one file must never hide the others
                span = Span(file=f, state=ERROR, error=f"internal error while analysing: {type(e).__name__}: {e}")
            finally:
                if self._on_done:
                    self._on_done(f)
            self._spans[f.path] = span
        return span

    def analyses(self, run: Run, worker: str) -> list[SpanAnalysis]:
        spans = (self.span(f) for f in run.workers.get(worker, []))
        return [s.analysis for s in spans if s.analysis is not None]

    def worker(self, run: Run, worker: str) -> Worker:
        return self.derived(run, worker, None)

    def derived(self, run: Run, worker: str, compute: Callable[..., T] | None, *params) -> T:
        key = (run.name, worker, compute, params)
        if key not in self._derived:
            self._derived[key] = (Worker(worker, self.analyses(run, worker)) if compute is None
                                  else compute(self.worker(run, worker), *params))
        return self._derived[key]

    def of_run(self, run: Run, compute: Callable[..., T], *params) -> T:
        """``compute(the run's name, the `Worker` of each worker with a readable span, *params)``."""
        key = (run.name, None, compute, params)
        if key not in self._derived:
            workers = [w for w in (self.worker(run, name) for name in run.workers) if w.spans]
            self._derived[key] = compute(run.name, workers, *params)
        return self._derived[key]

    def step_trace(self, f: TraceFile, number: int) -> bytes | None:
        return cut_step((f, number), self._beside)

    def logdir_error(self) -> str | None:
        """None: a path that cannot be listed is the caller's error (`phaseprof report` says so)."""
        return None

    def unreadable(self) -> list[tuple[str, str]]:
        """Folders under the path that could not be listed: (path relative to it, why)."""
        root = os.path.realpath(self.logdir)
        return [(display(os.path.relpath(path, root)), why) for path, why in self.unlisted]

    def progress(self) -> Loading:
        spans = list(self._spans.values())
        size = sum(s.file.size for s in spans)
        return Loading(files=len(spans), done=len(spans), bytes=size, bytes_done=size)


def file_scalars(directories: list[str]) -> dict[str, Series]:
    """Each folder's phaseprof scalars, read from its event files (a folder without any: absent)."""
    out = {}
    for directory in directories:
        scalars = read_scalars(directory)
        if scalars is None:
            continue
        out[directory] = {tag: [(int(s), float(v)) for s, v in zip(scalars.steps.tolist(), column.tolist())
                                if v == v]  # NaN: no value at that step
                          for tag, column in scalars.values.items()}
    return out


class Analysis:
    """Every analysis of one logdir (see the module's docstring).

    Args:
        logdir: a local folder or a store's URL; read through `Files` unless ``source`` is given.
        source: where runs and their analyses come from (TensorBoard passes its `TraceStore`).
        scalars: reads the per-step scalars of folders (TensorBoard passes its data provider's);
            by default from the event files.
        kept: each rank's whole-run figures by (run, rank), with the scalar points they were made
            of, kept across calls (TensorBoard passes one dict for all its requests).
    """

    def __init__(self, logdir: str | None = None, *, source: Source | None = None,
                 scalars: Callable[[list[str]], dict[str, Series]] | None = None,
                 kept: dict[tuple[str, int], tuple[Series, WholeRun | None]] | None = None) -> None:
        if source is None:
            if logdir is None:
                raise BadArgument("Analysis needs a logdir or a source")
            source = Files(logdir)
        self.source = source
        self._scalars = scalars or file_scalars
        self._kept = {} if kept is None else kept

    # --- what is there ----------------------------------------------------------------------------

    def runs(self) -> RunsAnswer:
        """The runs under the logdir, their workers and trace files, loading progress and the files
        that could not be read.

        Returns:
            `RunsAnswer` (``GET /runs``).
        """
        out, problems = [], []
        for run in self.source.runs():
            workers = []
            for worker, files in run.workers.items():
                spans = [self.source.span(f) for f in files]
                problems += [FileError(path=os.path.join(run.name, s.file.name), error=s.error)
                             for s in spans if s.error]
                workers.append(WorkerInfo(
                    worker=worker,
                    rank=rank_of(worker, [s.analysis for s in spans if s.analysis is not None]),
                    state=LOADING if any(s.state in (PENDING, LOADING) for s in spans) else READY,
                    spans=[SpanInfo(file=s.file.name, size=s.file.size, state=s.state,
                                    steps=len(s.analysis.steps) if s.analysis else None, error=s.error,
                                    gpu=s.analysis.has_gpu if s.analysis else None)
                           for s in spans],
                ))
            out.append(RunInfo(run=run.name, has_scalars=bool(run.scalar_dirs()), workers=workers))
        problems += [FileError(path=path, error=why) for path, why in self.source.unreadable()]
        return RunsAnswer(runs=out, loading=self.source.progress(), errors=problems,
                          phases=[PhaseStyle(name=p.name, colour=p.colour)
                                  for p in PHASE_REGISTRY + FRAMEWORK_PHASES],
                          user_phase_colours=list(USER_PHASE_COLOURS), logdir_error=self.source.logdir_error())

    def target(self, run: str, worker: str | None = None, step: int | None = None, *,
               with_worker: bool = True) -> Target:
        """What ``run`` / ``worker`` / ``step`` name (the worker defaults to the run's lowest rank,
        else its first worker); `NotFound` if the logdir holds no such thing. ``with_worker=False``:
        the run (and step number) only."""
        self.source.refresh()
        found = self.source.run(run)
        if found is None:
            raise NotFound(f"no run named {run!r}")
        if not with_worker:
            return Target(found, step=step)
        workers = found.workers
        if not workers:
            raise NotFound(f"run {found.name!r} has no trace files (yet)")
        if worker is None:
            worker = min(workers, key=lambda w: rank_order(rank_of(w, self.source.analyses(found, w)), w))
        elif worker not in workers:
            raise NotFound(f"run {found.name!r} has no worker {worker!r}")
        w = self.source.worker(found, worker)
        if step is None:
            return Target(found, w)
        rows = [k for k, n in enumerate(w.numbers) if n == step]
        if not rows:
            raise NotFound(f"worker {worker!r} of run {found.name!r} has no step {step}")
        return Target(found, w, step, rows)

    # --- steps ------------------------------------------------------------------------------------

    def steps(self, run: str, worker: str | None = None) -> StepsAnswer:
        """Every profiled step of a worker and its summary (findings, means, the slowest step).

        Args:
            run: the run's name; worker: one of its workers (default: its lowest rank).
        Returns:
            `StepsAnswer` (``GET /steps``).
        """
        t = self.target(run, worker)
        return StepsAnswer(run=t.run.name, worker=t.worker.name, workers=list(t.run.workers),
                           phases=t.worker.phases, gpu=t.worker.has_gpu,
                           steps=self.source.derived(t.run, t.worker.name, step_rows),
                           summary=self.source.derived(t.run, t.worker.name, summarize))

    def step(self, run: str, step: int, worker: str | None = None) -> StepDetail:
        """One step in full: its phases, the ops and memory of each, its swimlanes.

        Returns:
            `StepDetail` (``GET /step``).
        """
        t = self.target(run, worker, step)
        return step_detail(t.worker, t.rows[0], t.run.name)

    def trace(self, run: str, step: int, worker: str | None = None) -> bytes:
        """One step's events as Chrome-trace JSON, cut out of its file (already encoded).

        Returns:
            the JSON bytes of a `StepTrace` (``GET /trace``).
        """
        t = self.target(run, worker, step)
        ref = t.worker.refs[t.rows[0]]
        f = next(f for f in t.run.workers[t.worker.name] if f.name == ref.span.file)
        try:
            body = self.source.step_trace(f, step)
        except TraceError as e:
            raise NotFound(f"the trace of step {step} cannot be read again: {e.reason}") from None
        if body is None:
            raise NotFound(f"{f.name} no longer holds step {step}")
        return body

    # --- tables over steps ------------------------------------------------------------------------

    def ops(self, run: str, worker: str | None = None, phase: str | None = None,
            group: str = "name") -> OpsAnswer:
        """Every op over the worker's profiled steps (the warm-up, compiling and cut ones left out).

        Args:
            phase: one phase only; group: ``name`` or ``shapes`` (by name and input shapes).
        Returns:
            `OpsAnswer` (``GET /ops``).
        """
        if group not in GROUPS:
            raise BadArgument(f"parameter 'group' must be one of {', '.join(GROUPS)}, not {group!r}")
        t = self.target(run, worker)
        answer = self.source.derived(t.run, t.worker.name, run_ops, _phase(t.worker, phase), group)
        answer.run = t.run.name
        return answer

    def kernels(self, run: str, worker: str | None = None, step: int | None = None,
                phase: str | None = None) -> KernelsAnswer:
        """The GPU kernels of one step, or of the worker's profiled steps.

        Returns:
            `KernelsAnswer` (``GET /kernels``).
        """
        t = self.target(run, worker, step)
        rows = t.rows[:1] if t.rows is not None else t.worker.full().tolist()
        return kernels_answer(t.run.name, t.worker, rows, t.step, _phase(t.worker, phase))

    def modules(self, run: str, worker: str | None = None, step: int | None = None) -> ModulesAnswer:
        """The model's modules (``nn.Module`` ranges) of one step, or of the profiled steps.

        Returns:
            `ModulesAnswer` (``GET /modules``).
        """
        t = self.target(run, worker, step)
        rows = t.rows[:1] if t.rows is not None else t.worker.full().tolist()
        return modules_answer(t.run.name, t.worker, rows, t.step)

    def memory(self, run: str, step: int, worker: str | None = None) -> MemoryAnswer:
        """One step's allocated memory over time, per device, beside its phases.

        Returns:
            `MemoryAnswer` (``GET /memory``).
        """
        t = self.target(run, worker, step)
        w = t.worker
        ref = w.refs[t.rows[0]]
        span, i = ref.span, ref.index
        lanes = span.lanes
        rows = lanes.rows(i)
        main = lanes.lane[rows] == 0  # the loop's thread: its phase segments
        start = span.steps[i].start
        bands = [(round((a - start) / 1000.0, 4), round((b - start) / 1000.0, 4), span.phases[p])
                 for a, b, p in zip(lanes.start[rows][main].tolist(), lanes.end[rows][main].tolist(),
                                    lanes.phase[rows][main].tolist())]
        return MemoryAnswer(run=t.run.name, worker=w.name, step=step, wall_ms=ms(span.steps[i].wall),
                            recorded=any(len(s.memory_curve.step) for s in w.spans),
                            devices=memory_series(span, i), bands=bands, apart=apart_bands(span, i))

    def memory_events(self, run: str, worker: str | None = None,
                      step: int | None = None) -> MemoryEventsAnswer:
        """Memory by op: of one step (with its allocations and frees), or over the profiled steps.

        Returns:
            `MemoryEventsAnswer` (``GET /memory_events``).
        """
        t = self.target(run, worker, step)
        if t.rows is None:
            return run_memory(t.run.name, t.worker)
        ref = t.worker.refs[t.rows[0]]
        return MemoryEventsAnswer(run=t.run.name, worker=t.worker.name, step=step,
                                  devices=memory_devices(ref.span, ref.index))

    # --- across workers and runs ------------------------------------------------------------------

    def collectives(self, run: str, worker: str | None = None, step: int | None = None) -> CollectivesAnswer:
        """Every collective call of the run's workers, their bandwidths, and who waited for whom.

        Args:
            worker: the worker whose calls are listed (default: the lowest rank); step: one step.
        Returns:
            `CollectivesAnswer` (``GET /collectives``).
        """
        t = self.target(run, with_worker=False)
        if worker is not None and worker not in t.run.workers:
            raise NotFound(f"run {t.run.name!r} has no worker {worker!r}")
        workers = [w for w in (self.source.worker(t.run, name) for name in t.run.workers) if w.spans]
        if step is not None and not any(step in w.numbers for w in workers):
            raise NotFound(f"no worker of run {t.run.name!r} has step {step}")
        return collectives_answer(t.run.name, workers, worker, step)

    def ranks(self, run: str) -> RanksAnswer:
        """The run's ranks side by side, and each rank's every timed step from its scalars.

        Returns:
            `RanksAnswer` (``GET /ranks``).
        """
        t = self.target(run, with_worker=False)
        answer = self.source.of_run(t.run, ranks)  # made once per change of the run's spans
        dirs = t.run.rank_scalars
        if not dirs:
            return answer
        series = self._scalars(list(dirs.values()))
        figures = []
        for rank, directory in sorted(dirs.items()):  # made again only when its scalars changed
            points = series.get(directory)
            key = (t.run.name, rank)
            kept = self._kept.get(key)
            if kept is None or kept[0] != points:
                kept = self._kept[key] = (points, whole_run(scalars_of(points), rank) if points else None)
            if kept[1] is not None:
                figures.append(kept[1])
        # the kept answer is shared by every request: each gets a copy of its own
        return msgspec.structs.replace(answer, whole_run=answer.whole_run + figures)

    def compare(self, a: Side | str, b: Side | str, op: str | None = None, device: str = "cpu") -> CompareAnswer:
        """Two runs, workers or steps side by side, phase by phase and op by op.

        Args:
            a, b: a run's name, or a `Side` (run, worker, step); a side without a step stands for
                its worker's steady steps (no warm-up or compiling step). op: one op only;
                device: ``cpu`` (host and GPU time) or ``gpu`` (ops ranked by GPU time).
        Returns:
            `CompareAnswer` (``GET /compare``).
        """
        if device not in ("cpu", "gpu"):
            raise BadArgument(f"device must be cpu or gpu, not {device!r}")
        sides = [self.target(*(s if isinstance(s, Side) else Side(s))) for s in (a, b)]
        phases = phase_names(sides[0].worker.spans + sides[1].worker.spans)
        return compare(_side(sides[0]), _side(sides[1]), phases, labels=(_label(sides[0]), _label(sides[1])),
                       op=op, by="gpu" if device == "gpu" else "both")

    def whole_run(self, run: str) -> list[WholeRun]:
        """Every timed step of the run from its scalars: the run's own, or one entry per rank.

        Returns:
            a `WholeRun` per set of scalars (``phaseprof report``'s ``whole_run``).
        """
        t = self.target(run, with_worker=False)
        dirs = t.run.scalar_dirs()
        series = self._scalars([d for _, d in dirs]) if dirs else {}
        out = []
        for rank, directory in dirs:
            figures = whole_run(scalars_of(series[directory]), rank) if series.get(directory) else None
            if figures is not None:
                out.append(figures)
        return out

    def timeline(self, run: str) -> TimelineAnswer:
        """Every step of the run as its scalars timed it (the run's own, else its lowest rank's),
        with the profiled steps marked.

        Returns:
            `TimelineAnswer` (``GET /timeline``).
        """
        t = self.target(run, with_worker=False)
        series: Series = {}
        for _, directory in t.run.scalar_dirs():
            series = self._scalars([directory]).get(directory, {})
            if series:
                break
        if not series:
            raise NotFound(f"run {t.run.name!r} has no phaseprof scalars (yet)")
        dense = max(series.values(), key=len)
        kept_all = not dense or len(dense) >= dense[-1][0] - dense[0][0] + 1
        profiled = []
        for name in t.run.workers:
            w = self.source.worker(t.run, name)
            profiled += [w.numbers[k] for k in w.full().tolist()]
        return timeline(t.run.name, series, profiled, kept_all)


def _phase(w: Worker, phase: str | None) -> str | None:
    """``phase`` if it is one of the worker's phases (`NotFound` otherwise); None stays None."""
    if phase is not None and phase not in w.phases:
        raise NotFound(f"worker {w.name!r} has no phase named {phase!r}")
    return phase


def _side(target: Target) -> tuple[Worker, np.ndarray]:
    """One side of a comparison: the worker and its rows (the step asked for, else the steps its
    summary stands for: no compiling or warm-up step)."""
    rows = target.rows if target.rows is not None else target.worker.steady()
    return target.worker, np.array(rows, dtype=np.int64)


def _label(target: Target) -> str:
    label = f"{target.run.name} · {target.worker.name}"
    return label if target.step is None else f"{label} · step {target.step}"



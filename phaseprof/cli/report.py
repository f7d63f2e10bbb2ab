"""`analyze(path)`: the whole analysis of a logdir, a run directory or one trace file, as plain data.

`report` builds it as a typed `answers.Report` (what ``phaseprof report`` prints, as a table or as
JSON); `analyze` gives the same as plain dicts and lists, for notebook users::

    from phaseprof import analyze
    report = analyze("./profile")
    report["runs"][0]["workers"][0]["steps"][0]["phases"]["backward"]["gpu_ms"]
    report["runs"][0]["whole_run"][0]["phases"]   # every step of the run, from its scalars

One file that cannot be read becomes an entry in ``errors`` naming it and the reason; the other
files are still analysed.
"""

from __future__ import annotations

import os
from typing import Protocol

import msgspec

from phaseprof.plugin.analysis.collectives import collectives_answer
from phaseprof.plugin.analysis.kernels import kernels_answer
from phaseprof.plugin.analysis.modules import modules_answer
from phaseprof.plugin.analysis.steps import step_detail, step_rows
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.analysis.worker_summary import summarize
from phaseprof.plugin.answers import FileError, Report, RunReport, WholeRun, WorkerReport
from phaseprof.plugin.cache import read_only
from phaseprof.plugin.reading import storage
from phaseprof.plugin.reading.discovery import Run, TraceFile, discover, display
from phaseprof.plugin.reading.errors import TraceError
from phaseprof.plugin.spans import analyze_file, problems_of


class Progress(Protocol):
    """Told what is read, e.g. to draw a progress bar."""

    def start(self, files: list[TraceFile]) -> None: ...

    def reading(self, f: TraceFile) -> None: ...

    def read(self, f: TraceFile) -> None: ...


def analyze(path: str, run: str | None = None, step: int | None = None, *, kernels: bool = False,
            modules: bool = False, collectives: bool = False, progress: Progress | None = None) -> dict:
    """The report on ``path`` (see `report`) as plain dicts and lists, exactly as ``--json`` prints it."""
    return msgspec.json.decode(msgspec.json.encode(report(path, run, step, kernels=kernels, modules=modules,
                                                          collectives=collectives, progress=progress)))


def report(path: str, run: str | None = None, step: int | None = None, *, kernels: bool = False,
           modules: bool = False, collectives: bool = False, progress: Progress | None = None) -> Report:
    """The report on ``path``: runs, workers (ranks), their steps and summaries, every timed step of
    each run from its scalars (``whole_run``), and errors.

    ``run`` keeps one run (its name relative to ``path``); ``step`` keeps one step and adds its
    detail (ops per phase, memory, swimlanes) as the worker's ``detail``. ``kernels`` adds each
    worker's kernel table (``/kernels``' answer) over that step, or over every step holding work;
    ``modules`` its module table (``/modules``' answer) likewise. ``collectives`` adds each run's
    collective table, its ranks' compute / communication / overlap and who waits for whom
    (``/collectives``' answer), over that step or every step.
    """
    errors: list[FileError] = []
    try:
        found = storage.exists(path)
    except storage.StorageError as e:
        return Report(runs=[], errors=[FileError(path=display(path), error=str(e).removeprefix(f"{path}: "))])
    if not found:
        return Report(runs=[], errors=[FileError(path=display(path), error="no such file or directory")])
    unreadable: list[tuple[str, str]] = []
    runs = discover(path, unreadable)
    errors += [FileError(path=_display_path(path, directory), error=why) for directory, why in unreadable]
    if run is not None:
        runs = [r for r in runs if r.name == run]
        if not runs:
            errors.append(FileError(path=display(os.path.join(path, run)),
                                    error=f"no run named {display(run)!r} under {display(path)}"))
    if progress:
        progress.start([f for r in runs for f in r.files])
    out_runs = [_run_report(path, r, step, errors, progress, kernels, modules, collectives) for r in runs]
    if not any(r.workers or r.whole_run for r in out_runs) and not errors:
        errors.append(FileError(path=display(path), error="no trace files found (*.pt.trace.json[.gz])"))
    return Report(runs=out_runs, errors=errors)


def _run_report(root: str, run: Run, step: int | None, errors: list[FileError],
                progress: Progress | None, kernels: bool, modules: bool, collectives: bool) -> RunReport:
    workers, analysed = [], []
    for worker, files in run.workers.items():
        spans = []
        for f in files:
            if progress:
                progress.reading(f)
            shown = _display_path(root, f.path)
            try:
                span = analyze_file(f, shapes=step is not None, beside=not read_only())
            except TraceError as e:
                errors.append(FileError(path=shown, error=e.reason))
                continue
            except Exception as e:  # noqa: BLE001 - one file must never hide the others
                errors.append(FileError(path=shown, error=f"internal error while analysing: {type(e).__name__}: {e}"))
                continue
            finally:
                if progress:
                    progress.read(f)
            problem = problems_of(span)
            if problem:
                errors.append(FileError(path=shown, error=problem))
            spans.append(span)
        if not spans:
            continue
        w = Worker(worker, spans)
        analysed.append(w)
        rows = None if step is None else [k for k, n in enumerate(w.numbers) if n == step]
        entry = WorkerReport(worker=worker, rank=w.rank, world_size=w.world_size, gpu=w.has_gpu,
                             gpu_names=w.gpu_names, spans=[s.file for s in spans], steps=step_rows(w, rows),
                             summary=summarize(w))
        if step is not None:
            row = w.row_of(step)
            if row is None:
                errors.append(FileError(path=run.name, error=f"worker {worker} has no step {step}"))
            else:
                entry.detail = step_detail(w, row, run.name)
        if kernels and (step is None or row is not None):
            entry.kernels = kernels_answer(run.name, w, w.full().tolist() if step is None else [row], step, None)
        if modules and (step is None or row is not None):
            entry.modules = modules_answer(run.name, w, w.full().tolist() if step is None else [row], step)
        workers.append(entry)
    out = RunReport(run=run.name, workers=workers, whole_run=_whole_run(run))
    if collectives and analysed:
        out.collectives = collectives_answer(run.name, analysed, None, step)
    return out


def _whole_run(run: Run) -> list[WholeRun]:
    """Every timed step of the run from its scalars: the run's own, or one entry per rank."""
    dirs = run.scalar_dirs()
    if not dirs:
        return []
    from phaseprof.plugin.analysis.whole_run import whole_run
    from phaseprof.plugin.reading.scalars import read_scalars

    out = []
    for rank, directory in dirs:
        scalars = read_scalars(directory)
        figures = whole_run(scalars, rank) if scalars is not None else None
        if figures is not None:
            out.append(figures)
    return out


def _display_path(root: str, path: str) -> str:
    """A file or directory found under ``root`` as the user would name it: relative to what they
    passed, when inside it."""
    if storage.is_remote(path):
        return display(path)
    base = root if os.path.isdir(root) else os.path.dirname(root)
    rel = os.path.relpath(path, os.path.realpath(base))
    return display(os.path.join(base, rel) if not rel.startswith("..") else path)

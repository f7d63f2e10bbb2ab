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

import contextlib
import os
from typing import NamedTuple, Protocol

import msgspec

from phaseprof.plugin.answers import FileError, Report, RunReport, WorkerReport
from phaseprof.plugin.facade import Analysis, Files, NotFound
from phaseprof.plugin.reading import storage
from phaseprof.plugin.reading.discovery import Run, TraceFile, display
from phaseprof.plugin.spans import problems_of


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
    each run from its scalars (``whole_run``), and errors, each asked of one `facade.Analysis`.

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
    files = Files(path, shapes=step is not None, on_read=progress.reading if progress else None,
                  on_done=progress.read if progress else None)
    analysis = Analysis(source=files)
    errors += [FileError(path=_display_path(path, directory), error=why) for directory, why in files.unlisted]
    runs = files.runs()
    if run is not None:
        runs = [r for r in runs if r.name == run]
        if not runs:
            errors.append(FileError(path=display(os.path.join(path, run)),
                                    error=f"no run named {display(run)!r} under {display(path)}"))
    if progress:
        progress.start([f for r in runs for f in r.files])
    asked = _Asked(step, kernels, modules, collectives)
    out_runs = [_run_report(path, analysis, r, asked, errors) for r in runs]
    if not any(r.workers or r.whole_run for r in out_runs) and not errors:
        errors.append(FileError(path=display(path), error="no trace files found (*.pt.trace.json[.gz])"))
    return Report(runs=out_runs, errors=errors)


class _Asked(NamedTuple):
    """What the report holds beside each worker's steps and summary."""

    step: int | None
    kernels: bool
    modules: bool
    collectives: bool


def _run_report(root: str, analysis: Analysis, run: Run, asked: _Asked, errors: list[FileError]) -> RunReport:
    workers = []
    for worker, files in run.workers.items():
        spans = [analysis.source.span(f) for f in files]
        for s in spans:
            problem = s.error or problems_of(s.analysis)
            if problem:
                errors.append(FileError(path=_display_path(root, s.file.path), error=problem))
        if not any(s.analysis for s in spans):
            continue
        w = analysis.source.worker(run, worker)
        answer = analysis.steps(run.name, worker)
        steps = [r for r in answer.steps if asked.step is None or r.step == asked.step]
        entry = WorkerReport(worker=worker, rank=w.rank, world_size=w.world_size, gpu=w.has_gpu,
                             gpu_names=w.gpu_names, spans=[s.file for s in w.spans], steps=steps,
                             summary=answer.summary)
        if asked.step is not None and w.row_of(asked.step) is None:
            errors.append(FileError(path=run.name, error=f"worker {worker} has no step {asked.step}"))
            workers.append(entry)
            continue
        if asked.step is not None:
            entry.detail = analysis.step(run.name, asked.step, worker)
        if asked.kernels:
            entry.kernels = analysis.kernels(run.name, worker, asked.step)
        if asked.modules:
            entry.modules = analysis.modules(run.name, worker, asked.step)
        workers.append(entry)
    out = RunReport(run=run.name, workers=workers, whole_run=analysis.whole_run(run.name))
    if asked.collectives and workers:
        with contextlib.suppress(NotFound):  # no worker has the step: each said so above
            out.collectives = analysis.collectives(run.name, None, asked.step)
    return out


def _display_path(root: str, path: str) -> str:
    """A file or directory found under ``root`` as the user would name it: relative to what they
    passed, when inside it."""
    if storage.is_remote(path):
        return display(path)
    base = root if os.path.isdir(root) else os.path.dirname(root)
    rel = os.path.relpath(path, os.path.realpath(base))
    return display(os.path.join(base, rel) if not rel.startswith("..") else path)

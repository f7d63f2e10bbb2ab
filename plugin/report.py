"""`analyze(path)`: the whole analysis of a logdir, a run directory or one trace file, as plain data.

This is what ``phaseprof report --json`` prints and what notebook users call::

    from phaseprof import analyze
    report = analyze("./profile")
    report["runs"][0]["workers"][0]["steps"][0]["phases"]["backward"]["gpu_ms"]

One file that cannot be read becomes an entry in ``errors`` naming it and the reason; the other
files are still analysed.
"""

from __future__ import annotations

import os
from typing import Protocol

from .analysis.model import SpanAnalysis
from .analysis.ranks import rank_of
from .analysis.span import analyze_trace
from .analysis.steps import find_step, phase_names, step_detail, step_rows
from .analysis.summary import summarize
from .reading.decode import TraceError, read_trace
from .reading.discovery import Run, TraceFile, discover


class Progress(Protocol):
    """Told what is read, e.g. to draw a progress bar."""

    def start(self, files: list[TraceFile]) -> None: ...

    def reading(self, f: TraceFile) -> None: ...

    def read(self, f: TraceFile) -> None: ...


def analyze_file(f: TraceFile, shapes: bool = True) -> SpanAnalysis:
    """Read and analyse one trace file; raises `TraceError` if it cannot be read. ``shapes=False``:
    op tables without input shapes (cheaper; for reports that do not show them)."""
    return analyze_trace(read_trace(f.path, shapes=shapes), worker=f.worker)


def problems_of(span: SpanAnalysis) -> str | None:
    """One line on the malformed events a readable file held, if any."""
    if not span.skipped_events:
        return None
    return f"{span.skipped_events} malformed event(s) skipped; first: {span.first_problem}"


def analyze(path: str, run: str | None = None, step: int | None = None, *, progress: Progress | None = None) -> dict:
    """The report on ``path``: runs, workers (ranks), their steps and summaries, and errors.

    ``run`` keeps one run (its name relative to ``path``); ``step`` keeps one step and adds its
    detail (ops per phase, memory, swimlanes) under the worker's ``"detail"`` key.
    """
    errors: list[dict] = []
    if not os.path.exists(path):
        return {"runs": [], "errors": [{"path": path, "error": "no such file or directory"}]}
    runs = discover(path)
    if run is not None:
        runs = [r for r in runs if r.name == run]
        if not runs:
            errors.append({"path": os.path.join(path, run), "error": f"no run named {run!r} under {path}"})
    if progress:
        progress.start([f for r in runs for f in r.files])
    out_runs = []
    for r in runs:
        out_runs.append(_run_report(path, r, step, errors, progress))
    if not any(r["workers"] for r in out_runs) and not errors:
        errors.append({"path": path, "error": "no trace files found (*.pt.trace.json[.gz])"})
    return {"runs": out_runs, "errors": errors}


def _run_report(root: str, run: Run, step: int | None, errors: list[dict], progress: Progress | None) -> dict:
    workers = []
    for worker, files in run.workers.items():
        spans = []
        for f in files:
            if progress:
                progress.reading(f)
            shown = _display_path(root, f)
            try:
                span = analyze_file(f, shapes=step is not None)
            except TraceError as e:
                errors.append({"path": shown, "error": e.reason})
                continue
            except Exception as e:  # noqa: BLE001 - one file must never hide the others
                errors.append({"path": shown, "error": f"internal error while analysing: {type(e).__name__}: {e}"})
                continue
            finally:
                if progress:
                    progress.read(f)
            problem = problems_of(span)
            if problem:
                errors.append({"path": shown, "error": problem})
            spans.append(span)
        if not spans:
            continue
        rows = step_rows(spans)
        entry = {
            "worker": worker,
            "rank": rank_of(worker, spans),
            "world_size": next((s.world_size for s in spans if s.world_size is not None), None),
            "gpu": any(s.has_gpu for s in spans),
            "gpu_names": next((s.gpu_names for s in spans if s.gpu_names), []),
            "spans": [s.file for s in spans],
            "steps": rows,
            "summary": summarize(spans),
        }
        if step is not None:
            entry["steps"] = [r for r in rows if r["step"] == step]
            ref = find_step(spans, step)
            if ref is None:
                errors.append({"path": run.name, "error": f"worker {worker} has no step {step}"})
            else:
                entry["detail"] = step_detail(ref, phase_names(spans))
        workers.append(entry)
    return {"run": run.name, "workers": workers}


def _display_path(root: str, f: TraceFile) -> str:
    """The file as the user would name it: relative to what they passed, when inside it."""
    base = root if os.path.isdir(root) else os.path.dirname(root)
    rel = os.path.relpath(f.path, os.path.realpath(base))
    return os.path.join(base, rel) if not rel.startswith("..") else f.path

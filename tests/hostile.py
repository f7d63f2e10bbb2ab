"""Hostile and unusual trace files, built in the test: what the regression and fuzz tests feed
the reader, the analysis, the CLI and TensorBoard."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
from rich.console import Console

from phaseprof.cli.report import analyze, report
from phaseprof.cli.terminal import render
from phaseprof.plugin.analysis.compare import compare
from phaseprof.plugin.analysis.ranks import ranks
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.decode import TraceError, read_trace
from tests.tracebuilder import MAIN, PID, annotation, kernel, launch, memory, op, step


def training_step(number: int, t0: float, corr0: int) -> list[dict]:
    """One step of a small training loop with GPU work: data, forward, backward, optimizer."""
    return [
        step(number, t0, 100),
        annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 1, 9),
        annotation("## forward ##", t0 + 10, 30),
        op("aten::mm", t0 + 12, 10),
        launch(t0 + 14, corr0),
        kernel("gemm", t0 + 20, 15, corr0),
        annotation("## backward ##", t0 + 45, 30),
        op("autograd::engine::evaluate_function: MmBackward0", t0 + 46, 20),
        launch(t0 + 50, corr0 + 1),
        kernel("gemm_bwd", t0 + 55, 12, corr0 + 1),
        annotation("Optimizer.step#SGD.step", t0 + 80, 15),
        launch(t0 + 82, corr0 + 2),
        kernel("sgd", t0 + 85, 3, corr0 + 2),
        memory(t0 + 83, 256, 1024),
    ]


def training_trace(steps: int = 3) -> list[dict]:
    events = []
    for i in range(steps):
        events += training_step(i + 1, 1000.0 + 100 * i, 10 * i + 1)
    return events


def encode(events, *, wrap: bool = True, bom: bool = False, gz: bool = False, **top) -> bytes:
    data = json.dumps({"traceEvents": events, **top} if wrap else events).encode()
    if bom:
        data = b"\xef\xbb\xbf" + data
    return gzip.compress(data, 1) if gz else data


def write(path: os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def check_report(report: dict) -> None:
    """What holds for every input: only one-line errors that name a file and are not internal
    failures, and a report that encodes as JSON (what ``report --json`` prints)."""
    import msgspec

    for e in report["errors"]:
        assert e["path"] and e["error"], e
        assert "\n" not in e["error"], e
        assert "internal error" not in e["error"], e
    msgspec.json.encode(report)


def check_terminal(typed_report) -> None:
    """The report as the terminal shows it: whatever the names hold, no markup error, no control
    sequence of a name's (plain output holds no escape at all; a colour terminal gets rich's own
    styles but never a link), and no name longer than a line."""
    for terminal in (False, True):
        out = io.StringIO()
        console = Console(file=out, width=120, force_terminal=terminal, color_system="truecolor" if terminal else None)
        render(typed_report, console, evidence=True)
        text = out.getvalue()
        assert "\x1b]" not in text and "\x07" not in text, text[:2000]
        assert terminal or "\x1b" not in text, text[:2000]
        assert len(text) < 60_000, len(text)  # names cut to a width, repeated notes once


def exercise(path: os.PathLike) -> dict:
    """Read one hostile file every way the product does: the report with and without a step's
    detail, in the terminal too, and the comparisons the TensorBoard routes make. Returns the report."""
    result = analyze(str(path))
    check_report(result)
    check_terminal(report(str(path)))
    steps = [s["step"] for r in result["runs"] for w in r["workers"] for s in w["steps"]]
    if steps:
        check_report(analyze(str(path), step=steps[0]))
        check_terminal(report(str(path), step=steps[0]))
        try:
            span = analyze_trace(read_trace(str(path)))
        except TraceError:
            pass
        else:
            w = Worker("w", [span])
            rows = np.arange(len(w.numbers))
            compare((w, rows[:1]), (w, rows[-1:]), w.phases)
            ranks("run", [w, Worker("v", [span])])
    return result


#: Names that are markup, links or control sequences to a terminal, or too long for a line.
HOSTILE_NAMES = ["[/bold]x", "[link=http://evil.example]click[/link]", "\x1b[31mred", "\x1b]8;;http://x\x07here",
                 "\x1b[2J", "phaseprof::[/oops]", "phaseprof::\x1b[2J", ":smile:", "N" * 100_000]


def exercise_entry(analysis) -> None:
    """Every reader of a cached analysis (the routes' answers, the report's summaries), on a forged one."""
    import msgspec

    from phaseprof.plugin.analysis.kernels import kernel_rows
    from phaseprof.plugin.analysis.memory import memory_series
    from phaseprof.plugin.analysis.operators import GROUPS, run_ops
    from phaseprof.plugin.analysis.steps import step_detail, step_rows
    from phaseprof.plugin.analysis.worker_summary import summarize

    w = Worker("w", [analysis])
    for group in GROUPS:
        for phase in [None, *w.phases]:
            run_ops(w, phase, group)
    ranks("run", [w, Worker("v", [analysis])])
    rows = np.arange(len(w.refs))
    msgspec.json.encode([summarize(w), step_rows(w, None)])
    for k in rows.tolist():
        step_detail(w, k, "run")
        memory_series(w.refs[k].span, w.refs[k].index)
    compare((w, rows[:1]), (w, rows[-1:]), w.phases)
    kernel_rows(w, rows.tolist(), None)


__all__ = ["MAIN", "PID", "HOSTILE_NAMES", "encode", "exercise", "exercise_entry", "training_trace", "training_step",
           "write", "check_report", "check_terminal"]

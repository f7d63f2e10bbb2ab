"""Hostile and unusual trace files, built in the test: what the regression and fuzz tests feed
the reader, the analysis, the CLI and TensorBoard."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np

from phaseprof.plugin.analysis.compare import compare
from phaseprof.plugin.analysis.ranks import ranks
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.decode import TraceError, read_trace
from phaseprof.plugin.report import analyze
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


def exercise(path: os.PathLike) -> dict:
    """Read one hostile file every way the product does: the report with and without a step's
    detail, and the comparisons the TensorBoard routes make. Returns the report."""
    report = analyze(str(path))
    check_report(report)
    steps = [s["step"] for r in report["runs"] for w in r["workers"] for s in w["steps"]]
    if steps:
        check_report(analyze(str(path), step=steps[0]))
        try:
            span = analyze_trace(read_trace(str(path)))
        except TraceError:
            pass
        else:
            w = Worker("w", [span])
            rows = np.arange(len(w.numbers))
            compare((w, rows[:1]), (w, rows[-1:]), w.phases)
            ranks("run", [w, Worker("v", [span])])
    return report


__all__ = ["MAIN", "PID", "encode", "exercise", "training_trace", "training_step", "write", "check_report"]

"""Each trace's analysis written beside it, on the node that wrote the trace, in the background.

After a trace is written, a separate process (``phaseprof cache --background <trace>``: the
TensorBoard-side reader, never imported into the training process) reads it at idle priority and
writes its analysis to ``<run>/.phaseprof/`` (see `phaseprof.contract.ANALYSIS_DIR`). Every rank
thus analyses its own traces on its own node, and TensorBoard or ``phaseprof report`` later read a
few kilobytes per span instead of the trace.

Starting the process is all the loop pays: a ``posix_spawn`` at the end of the active window,
where the profiler has just spent far longer writing the trace (and outside every step's time).
"""

from __future__ import annotations

import os
import subprocess
import sys

from .faults import Faults


class SourceAnalysis:
    """Starts one background analysis per written trace; never raises into the loop."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults
        self._running: list[subprocess.Popen] = []

    def start(self, trace: str) -> None:
        self._running = [p for p in self._running if p.poll() is None]  # reap the finished
        try:
            self._running.append(subprocess.Popen(
                [sys.executable, "-m", "phaseprof.cli", "cache", "--background", trace],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
            ))
        except Exception as e:  # noqa: BLE001 - TensorBoard reads the trace itself then
            self._faults.report(f"could not start the analysis of {os.path.basename(trace)}", e)

    @property
    def running(self) -> list[subprocess.Popen]:
        """Analyses still running (they outlive the training loop if they must)."""
        self._running = [p for p in self._running if p.poll() is None]
        return list(self._running)

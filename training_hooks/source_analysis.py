"""Each trace finished in the background, on the node that wrote it: compressed into place, then
analysed, by a separate process (``phaseprof cache --background [--compress] <trace>``: the
TensorBoard-side reader, never imported into the training process).

Compressing a trace takes longer than torch's export of it (a 26 MB trace: seconds), and it used to
run inside the step boundary that ends the active window, blocking training. Now the loop pays only
torch's export of the uncompressed bytes and the start of a thread that starts that process; the
process compresses at a low priority (niceness 10), then analyses at idle priority, and writes the
analysis to ``<run>/.phaseprof/`` (see `phaseprof.contract.ANALYSIS_DIR`). Every rank thus
finishes its own traces on its own node, and TensorBoard or ``phaseprof report`` later read a few
kilobytes per span instead of the trace.

`wait_for_traces` (on close) waits until every trace is in place, so that a run is complete on disk
when ``close()`` returns; a trace whose process could not start or died is compressed in the
training process after all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from phaseprof.trace_files import compress_into_place, compressed_name

from .faults import Faults

#: How long close() waits for the traces still being compressed before it reports them as pending.
WAIT_S = 120.0


@dataclass
class _Pending:
    """An exported trace handed to the background: the thread that starts its process, the process."""

    exported: str
    thread: threading.Thread | None = None
    process: subprocess.Popen | None = field(default=None)


class SourceAnalysis:
    """Starts one background process per written trace; never raises into the loop. ``analyse``:
    analyse each trace after compressing it (``analyze_traces``).

    The process is started from a short-lived thread: ``Popen`` returns only once the child has
    exec'd, which on a loaded machine takes tens of ms that the loop need not wait for."""

    def __init__(self, faults: Faults, analyse: bool = True, awaited: bool = False) -> None:
        self._faults = faults
        self.analyse = analyse
        self.awaited = awaited  # close() waits for the analyses (a store run uploads them): never idle priority
        self._running: list[subprocess.Popen] = []
        self._pending: list[_Pending] = []  # exported traces not yet compressed into place
        self._starting: list[threading.Thread] = []  # `start`'s: their process may not exist yet

    def start(self, trace: str) -> None:
        """Analyse ``trace``, a finished trace file (not compressed)."""
        if self.analyse:
            thread = threading.Thread(target=self._spawn, args=([trace],), name="phaseprof-trace",
                                      daemon=True)
            self._starting = [t for t in self._starting if t.is_alive()] + [thread]
            thread.start()

    def compress(self, exported: str) -> str:
        """Compress ``exported`` into place in the background (then analyse it); the trace's path."""
        self._pending = [p for p in self._pending if os.path.exists(p.exported)]
        pending = _Pending(exported)
        pending.thread = threading.Thread(target=self._compress, args=(pending,), name="phaseprof-trace", daemon=True)
        self._pending.append(pending)
        pending.thread.start()
        return compressed_name(exported)

    def _compress(self, pending: _Pending) -> None:
        pending.process = self._spawn(["--compress", pending.exported])
        if pending.process is None:  # compressed here, on this thread, as before there was a process
            self._compress_here(pending.exported)

    def _compress_here(self, exported: str) -> None:
        try:
            compress_into_place(exported)
        except FileNotFoundError:  # the process finished it after all
            pass
        except Exception as e:  # noqa: BLE001
            self._faults.report(f"could not compress {os.path.basename(exported)}", e)

    def wait_for_traces(self, deadline_s: float = WAIT_S) -> None:
        """Until every trace handed to `compress` is in place (compressing those whose process died
        here), or ``deadline_s`` has passed: then those still compressing are reported."""
        deadline = time.monotonic() + deadline_s
        for pending in self._pending:
            pending.thread.join(max(0.0, deadline - time.monotonic()))
            while os.path.exists(pending.exported):
                process = pending.process
                if process is not None and process.poll() is not None:  # died before it was done
                    self._compress_here(pending.exported)
                    break
                if time.monotonic() > deadline:
                    who = f"process {process.pid}" if process is not None else "its process, still starting"
                    self._faults.report(f"{os.path.basename(compressed_name(pending.exported))} is still being "
                                        f"compressed by {who}", TimeoutError(f"not done after {deadline_s:.0f} s"))
                    break
                time.sleep(0.02)
        self._pending = []

    def wait_for_analyses(self, deadline_s: float) -> None:
        """Until every background process has finished (its trace analysed), or ``deadline_s`` has
        passed: a run written to a store uploads the analyses they write."""
        deadline = time.monotonic() + deadline_s
        for thread in self._starting:  # a process still being started is not running yet
            thread.join(max(0.0, deadline - time.monotonic()))
        for process in self.running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def _spawn(self, args: list[str]) -> subprocess.Popen | None:
        command = [sys.executable, "-m", "phaseprof.cli", "cache", "--background", *args]
        if not self.analyse:
            command.append("--no-analysis")
        if self.awaited:
            command.append("--awaited")
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, close_fds=True)
        except Exception as e:  # noqa: BLE001 - compressed here, and TensorBoard reads the trace itself
            self._faults.report(f"could not start the background process for {os.path.basename(args[-1])}", e)
            return None
        self._running = [p for p in self._running if p.poll() is None] + [process]  # the finished reaped
        return process

    @property
    def running(self) -> list[subprocess.Popen]:
        """Background processes still running (they outlive the training loop if they must)."""
        self._running = [p for p in self._running if p.poll() is None]
        return list(self._running)

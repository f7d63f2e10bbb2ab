"""Where the profiler's traces go: one file per active cycle (span) in ``<logdir>/<run>/``, named
``<worker>.<time_ns>.pt.trace.json[.gz]`` as torch's ``tensorboard_trace_handler`` names them.

This writes them itself rather than through that handler because the handler cannot tell when a
trace was lost: when the disk fills, torch's exporter logs "Failed to write to log file!" and
returns normally, leaving a ``.tmp`` file or an empty ``.gz`` behind. Here each trace is exported
under a temporary name and checked; a plain JSON trace is then renamed into place, a gzipped one is
compressed into place by a background process (`source_analysis`, `phaseprof.trace_files`), so that
the loop pays for no more than torch's own export of the uncompressed trace, a reader (a live
TensorBoard) never sees a partial file, and a failure is reported instead of passing silently.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import torch
import torch.distributed as dist

from phaseprof.contract import trace_file_name
from phaseprof.trace_files import EXPORTED_SUFFIX

from .faults import Faults
from .source_analysis import SourceAnalysis


def worker_name() -> str:
    """``<host>_<pid>``, prefixed with ``rank<N>.`` when torch.distributed is initialised."""
    name = f"{socket.gethostname()}_{os.getpid()}"
    if dist.is_available() and dist.is_initialized():
        name = f"rank{dist.get_rank()}.{name}"
    return name


class TraceWriter:
    """The profiler's ``on_trace_ready``: never raises into the training loop. ``background``
    compresses gzipped traces and analyses each trace (`SourceAnalysis`)."""

    def __init__(self, run_dir: str, worker: str, use_gzip: bool, faults: Faults, background: SourceAnalysis) -> None:
        self.run_dir = run_dir
        self.worker = worker
        self.gzip = use_gzip
        self.faults = faults
        self.background = background
        self.written: list[str] = []

    def __call__(self, prof: torch.profiler.profile) -> None:
        span = time.time_ns()
        name = trace_file_name(self.worker, span, self.gzip)
        path = os.path.join(self.run_dir, name)
        exported = os.path.join(self.run_dir, trace_file_name(self.worker, span, False) + EXPORTED_SUFFIX)
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            prof.export_chrome_trace(exported)  # written as <exported>.tmp, renamed when complete
            if not os.path.isfile(exported):
                raise OSError(f"torch.profiler could not write them in {self.run_dir} "
                              "(is the disk full?)")
            if self.gzip:
                path = self.background.compress(exported)  # then analysed there
            else:
                os.replace(exported, path)
                self.background.start(path)
        except Exception as e:  # noqa: BLE001 - a lost trace must not stop training
            for leftover in (exported, exported + ".tmp", path + ".part"):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
            self.faults.report("could not write traces", e)  # one cause, however many it costs
        else:
            self.written.append(path)

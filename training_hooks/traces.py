"""Where the profiler's traces go: one file per active cycle (span) in ``<logdir>/<run>/``, named
``<worker>.<time_ns>.pt.trace.json[.gz]`` as torch's ``tensorboard_trace_handler`` names them.

This writes them itself rather than through that handler because the handler cannot tell when a
trace was lost: when the disk fills, torch's exporter logs "Failed to write to log file!" and
returns normally, leaving a ``.tmp`` file or an empty ``.gz`` behind. Here each trace is exported
under a temporary name, checked, compressed, and renamed into place, so a reader (a live
TensorBoard) never sees a partial file, and a failure is reported instead of passing silently.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import socket
import time

import torch
import torch.distributed as dist

from phaseprof.contract import trace_file_name

from .faults import Faults
from .source_analysis import SourceAnalysis

#: zlib's default level: nearly as small as torch's level 9, in a fraction of the time (the export
#: runs inside the training loop's step).
GZIP_LEVEL = 6


def worker_name() -> str:
    """``<host>_<pid>``, prefixed with ``rank<N>.`` when torch.distributed is initialised."""
    name = f"{socket.gethostname()}_{os.getpid()}"
    if dist.is_available() and dist.is_initialized():
        name = f"rank{dist.get_rank()}.{name}"
    return name


class TraceWriter:
    """The profiler's ``on_trace_ready``: never raises into the training loop."""

    def __init__(self, run_dir: str, worker: str, use_gzip: bool, faults: Faults,
                 analysis: SourceAnalysis | None = None) -> None:
        self.run_dir = run_dir
        self.worker = worker
        self.gzip = use_gzip
        self.faults = faults
        self.analysis = analysis  # started on each trace written
        self.written: list[str] = []

    def __call__(self, prof: torch.profiler.profile) -> None:
        span = time.time_ns()
        name = trace_file_name(self.worker, span, self.gzip)
        path = os.path.join(self.run_dir, name)
        exported = os.path.join(self.run_dir, trace_file_name(self.worker, span, False) + ".part")
        compressed = path + ".part"
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            prof.export_chrome_trace(exported)  # written as <exported>.tmp, renamed when complete
            if not os.path.isfile(exported):
                raise OSError(f"torch.profiler could not write {exported} (is the disk full?)")
            if self.gzip:
                with open(exported, "rb") as src, gzip.open(compressed, "wb", compresslevel=GZIP_LEVEL) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(compressed, path)
                os.remove(exported)
            else:
                os.replace(exported, path)
        except Exception as e:  # noqa: BLE001 - a lost trace must not stop training
            for leftover in (exported, exported + ".tmp", compressed):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
            self.faults.report(f"could not write trace {name}", e)
        else:
            self.written.append(path)
            if self.analysis is not None:
                self.analysis.start(path)

"""The ranges that mark open phases in traces: ``record_function`` for torch.profiler, NVTX for
Nsight Systems, both named ``phaseprof::<phase>`` (`phaseprof.contract.range_name`).

record_function ranges are opened only while torch.profiler records: nothing reads them outside
its active window, and each costs several microseconds. NVTX ranges are opened throughout on CUDA
builds, since a tool such as Nsight Systems may capture any part of the run; with no tool attached
a push is a cheap no-op. On CPU builds torch's NVTX functions raise ("NVTX functions not
installed"), so they are probed once and left out.
"""

from __future__ import annotations

import torch
from torch.autograd.profiler import record_function

from phaseprof.contract import range_name


def _nvtx_works() -> bool:
    try:
        torch.cuda.nvtx.range_push("phaseprof")
        torch.cuda.nvtx.range_pop()
    except RuntimeError:
        return False
    return True


class Ranges:
    """The ranges of the open phases, pushed and popped in strict LIFO order."""

    def __init__(self) -> None:
        self.nvtx = _nvtx_works()
        self._open: list[record_function | None] = []

    def push(self, phase: str, record: bool) -> None:
        name = range_name(phase)
        if self.nvtx:
            torch.cuda.nvtx.range_push(name)
        span = None
        if record:
            span = record_function(name)
            span.__enter__()
        self._open.append(span)

    def pop(self) -> None:
        span = self._open.pop()
        if span is not None:
            span.__exit__(None, None, None)
        if self.nvtx:
            torch.cuda.nvtx.range_pop()

    def pop_all(self) -> None:
        while self._open:
            self.pop()

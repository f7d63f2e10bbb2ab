"""GPU time per phase from CUDA events, read a few steps later: nothing on the per-step path waits
for the GPU (no ``torch.cuda.synchronize()``, no blocking event or stream wait).

An event is recorded on the current stream at every phase boundary. The time between two events is
how long the stream took to get from one boundary to the next: the device time of the work enqueued
in between, plus any time the stream sat idle waiting for the host to enqueue it (for a phase that
enqueues nothing it is near zero when the GPU is behind, and close to the host time when the GPU
waits). A step is resolved once its events have completed (``Event.query()``), usually one or
two steps later; its events are then reused.
"""

from __future__ import annotations

from collections import deque

import torch

from .records import StepTimes

#: A step whose events are still pending after this many later steps is written without GPU times,
#: so a stalled stream cannot make memory grow.
MAX_PENDING_STEPS = 64


class CudaPhaseTimer:
    def __init__(self) -> None:
        self._free: list[torch.cuda.Event] = []
        self._marks: list[tuple[torch.cuda.Event, str | None]] = []  # (event, phase that ran up to it)
        self._pending: deque[tuple[StepTimes, list[tuple[torch.cuda.Event, str | None]]]] = deque()

    def mark(self, phase: str | None) -> None:
        """A boundary: the stream's time since the previous mark belongs to ``phase`` (None: the step starts)."""
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        self._marks.append((event, phase))

    def end_step(self, record: StepTimes) -> list[StepTimes]:
        """Queue ``record`` until its GPU times are known; returns the earlier steps now resolved, in order."""
        self._pending.append((record, self._marks))
        self._marks = []
        done = []
        while self._pending:
            oldest, marks = self._pending[0]
            if all(event.query() for event, _ in marks):  # a phase may have switched streams
                oldest.gpu_ms = _phase_ms(marks)
                self._free.extend(event for event, _ in marks)
            elif len(self._pending) <= MAX_PENDING_STEPS:
                break
            self._pending.popleft()
            done.append(oldest)
        return done

    def finish(self) -> list[StepTimes]:
        """Every pending step, resolved: waits for their events (on close, never per step)."""
        done = []
        while self._pending:
            record, marks = self._pending.popleft()
            for event, _ in marks:
                event.synchronize()
            record.gpu_ms = _phase_ms(marks)
            done.append(record)
        return done


def _phase_ms(marks: list[tuple[torch.cuda.Event, str | None]]) -> dict[str, float]:
    times: dict[str, float] = {}
    for (start, _), (end, phase) in zip(marks, marks[1:]):
        times[phase] = times.get(phase, 0.0) + start.elapsed_time(end)
    return times

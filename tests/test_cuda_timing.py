"""GPU time per phase from CUDA events (`training_hooks.cuda_timing`), without a GPU: a test double
of ``torch.cuda.Event`` on a simulated stream that runs behind the host. What must hold: each phase
gets the stream time between its boundaries, a step is resolved only once its events completed
(steps later, in order), nothing on the per-step path waits for the GPU, events are reused, and a
stalled stream cannot make the pending steps grow without bound."""

from __future__ import annotations

import pytest
import torch

from phaseprof.training_hooks import cuda_timing
from phaseprof.training_hooks.cuda_timing import MAX_PENDING_STEPS, CudaPhaseTimer
from phaseprof.training_hooks.records import StepTimes


class Stream:
    """The simulated GPU: work enqueued by the host (``enqueue``) runs in order, and the device
    finishes it only when the test says (``run_until``); ``waits`` counts host waits on it."""

    def __init__(self) -> None:
        self.enqueued_ms = 0.0  # where the stream's queue ends, in device ms
        self.done_ms = 0.0  # how far the device has got
        self.waits = 0
        self.created = 0

    def enqueue(self, ms: float) -> None:
        self.enqueued_ms += ms

    def run_until(self, ms: float) -> None:
        self.done_ms = max(self.done_ms, ms)


class FakeEvent:
    """What the timer uses of ``torch.cuda.Event``: ``record()`` on the current stream, ``query()``
    (done yet? never blocks), ``elapsed_time(end)`` (ms, both done), ``synchronize()`` (blocks)."""

    stream: Stream

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing, "events without timing cannot measure"
        self.at: float | None = None
        self.stream.created += 1

    def record(self) -> None:
        self.at = self.stream.enqueued_ms

    def query(self) -> bool:
        assert self.at is not None, "queried before it was recorded"
        return self.stream.done_ms >= self.at

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time of an event not completed (CUDA raises)"
        return end.at - self.at

    def synchronize(self) -> None:
        self.stream.waits += 1
        self.stream.run_until(self.at)


@pytest.fixture
def stream(monkeypatch) -> Stream:
    s = Stream()
    monkeypatch.setattr(FakeEvent, "stream", s, raising=False)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    def no_sync(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize() on the per-step path")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    return s


def run_step(timer: CudaPhaseTimer, stream: Stream, number: int, phases: dict[str, float]) -> list[StepTimes]:
    """One step: a boundary before each phase's work and one at the end, each phase enqueuing its ms."""
    timer.mark(None)
    for phase, ms in phases.items():
        stream.enqueue(ms)
        timer.mark(phase)
    return timer.end_step(StepTimes(step=number, wall_time=0.0, host_log=[]))


STEP = {"data": 1.0, "forward": 3.0, "backward": 6.0, "optimizer": 2.0}  # 12 ms of device time a step


def test_each_phase_gets_the_stream_time_between_its_boundaries_once_its_events_completed(stream):
    timer = CudaPhaseTimer()
    assert run_step(timer, stream, 0, STEP) == []  # the GPU has not run it yet
    assert run_step(timer, stream, 1, STEP) == []
    stream.run_until(12.0)  # step 0 done, step 1 not
    (done,) = run_step(timer, stream, 2, STEP)
    assert done.step == 0 and done.gpu_ms == pytest.approx(STEP)
    stream.run_until(36.0)  # steps 1 and 2 done: resolved together, in order
    resolved = run_step(timer, stream, 3, {"forward": 5.0, "forward_again": 0.0})
    assert [r.step for r in resolved] == [1, 2]
    assert all(r.gpu_ms == pytest.approx(STEP) for r in resolved)
    assert stream.waits == 0  # nothing on the per-step path waited for the GPU


def test_a_phase_entered_twice_in_a_step_adds_up(stream):
    timer = CudaPhaseTimer()
    timer.mark(None)
    for phase, ms in (("forward", 2.0), ("backward", 4.0), ("forward", 1.5), ("backward", 3.0)):
        stream.enqueue(ms)
        timer.mark(phase)
    timer.end_step(StepTimes(step=0, wall_time=0.0, host_log=[]))
    stream.run_until(stream.enqueued_ms)
    (done,) = run_step(timer, stream, 1, STEP)
    assert done.gpu_ms == pytest.approx({"forward": 3.5, "backward": 7.0})


def test_events_of_resolved_steps_are_reused(stream):
    timer = CudaPhaseTimer()
    for n in range(200):
        run_step(timer, stream, n, STEP)
        stream.run_until(stream.enqueued_ms - 2 * 12.0)  # the GPU two steps behind
    assert stream.created <= 5 * (len(STEP) + 1)  # a few steps' worth of events, not one per boundary
    assert stream.waits == 0


def test_a_stalled_stream_lets_steps_go_without_gpu_times_instead_of_growing(stream):
    timer = CudaPhaseTimer()
    written = []
    for n in range(MAX_PENDING_STEPS + 10):
        written += run_step(timer, stream, n, STEP)  # the device never runs
    assert [r.step for r in written] == list(range(10))  # the oldest go, in order, once too many wait
    assert all(r.gpu_ms is None for r in written)
    assert stream.waits == 0
    stream.run_until(stream.enqueued_ms)
    written += run_step(timer, stream, MAX_PENDING_STEPS + 10, STEP)
    assert [r.step for r in written] == list(range(MAX_PENDING_STEPS + 10))
    assert written[-1].gpu_ms == pytest.approx(STEP)


def test_closing_waits_for_the_pending_steps_once(stream):
    timer = CudaPhaseTimer()
    for n in range(3):
        run_step(timer, stream, n, STEP)
    finished = timer.finish()  # at close, and only there, the events are waited for
    assert [r.step for r in finished] == [0, 1, 2] and all(r.gpu_ms == pytest.approx(STEP) for r in finished)
    assert stream.waits > 0
    assert cuda_timing.CudaPhaseTimer().finish() == []

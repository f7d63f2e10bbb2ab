"""Helpers of the tests that hold phaseprof's per-step figures against independent timers.

A test's timer reads ``perf_counter`` as close as it can to phaseprof's own clock reads, just inside
its hooks and wrappers: forward hooks (`time_forward`), ``torch.autograd.backward``
(`Timers.timing_backward`), the optimizer's ``step`` and ``zero_grad`` (`time_optimizer`), a
GradScaler's calls (`TimedGradScaler`); phaseprof's marks (its trace ranges) stay outside them, as
they stay outside its phases. What runs between the two
reads is a little of the framework's code, microseconds, so phaseprof's figure for a phase of a step
must equal the timer's sum over that step: within 5% or 0.5 ms, on **every** step.

A step may differ by more only where the thread is shown to have been interrupted in that code:
off the CPU (a preemption by another process, a wait for the GIL) or in Python's garbage collector.
Every timer reads the thread's CPU time (``thread_time_ns``) beside ``perf_counter``, and so does
phaseprof's clock while the test watches it (`Timers.watching`: its value is unchanged), which also
records each collection on the loop's thread (``gc.callbacks``). The time the thread was interrupted
between each timer read and phaseprof's adjacent read is then known, and only that time may widen
the tolerance, only in the direction it stretches the gap (a timer inside phaseprof's phase reads
less, one around it reads more). The tests' simulated work burns CPU (`busy`) rather than sleeping,
so a step whose figure holds misattributed work has its gap on the CPU, outside the collector, and
fails.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing import event_accumulator

from phaseprof.contract import BACKWARD, DATA, FORWARD, OPTIMIZER, STEP_TAG, TRACE_FILE_RE
from phaseprof.training_hooks import tracker


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar of a run, by tag and step, read back by TensorBoard's own reader."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def traced_steps(run_dir: Path) -> list[int]:
    """The step numbers of a run's one plain-JSON trace (its ``ProfilerStep#N`` ranges)."""
    (trace,) = run_dir.glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events
                  if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X")


def assert_two_ranks(logdir: Path, steps: int) -> None:
    """A run of two ranks in ``logdir``: each rank's trace and its scalars (``<run>/rank<N>/``, one
    step per optimizer step), and ``phaseprof report --json`` shows both ranks with their steps and
    phases."""
    (run,) = [path for path in logdir.iterdir() if path.is_dir()]  # every rank writes one run
    workers = sorted(TRACE_FILE_RE.match(path.name)["worker"] for path in run.glob("*.pt.trace.json.gz"))
    assert [worker.split(".")[0] for worker in workers] == ["rank0", "rank1"], workers
    assert not list(run.glob("events.out.tfevents.*"))
    for rank in (0, 1):
        assert sorted(scalars(run / f"rank{rank}")[STEP_TAG]) == list(range(steps))
    out = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", str(logdir), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["errors"] == []
    (found,) = report["runs"]
    assert found["run"] == run.name and sorted(w["rank"] for w in found["workers"]) == [0, 1]
    for worker in found["workers"]:
        assert worker["world_size"] == 2 and len(worker["steps"]) >= 2
        for step in worker["steps"]:
            assert all(step["phases"][phase]["host_ms"] > 0 for phase in (DATA, FORWARD, BACKWARD, OPTIMIZER))
    whole = {w["rank"]: {p["phase"]: p for p in w["phases"] if p["clock"] == "host"} for w in found["whole_run"]}
    # every step of each rank but its first, left out as in the summary printed on close
    assert sorted(whole) == [0, 1] and all(rank["step"]["steps"] == steps - 1 for rank in whole.values())


def within(measured: float, reference: float, rel: float = 0.05, abs_ms: float = 0.5) -> bool:
    """Within 5% or 0.5 ms of the reference."""
    return abs(measured - reference) <= tolerance(reference, rel, abs_ms)


def tolerance(reference: float, rel: float = 0.05, abs_ms: float = 0.5) -> float:
    """How far a figure may be from its reference: 5% or 0.5 ms."""
    return max(rel * reference, abs_ms)


def train_step(model, optimizer, data, target, loss=F.nll_loss) -> None:
    """One training step as PyTorch's examples write it (zero_grad, forward, loss, backward, optimizer
    step): the plain step the tests' loops profile, around whatever else they put between steps."""
    optimizer.zero_grad()
    loss(model(data), target).backward()
    optimizer.step()


def busy(seconds: float) -> None:
    """Work that burns ``seconds`` of the thread's CPU time, as decoding or metrics do (a sleep would
    leave the CPU, and time off the CPU is what excuses a step)."""
    end = time.thread_time_ns() + int(seconds * 1e9)
    while time.thread_time_ns() < end:
        pass


@dataclass
class Span:
    """One timed call: perf_counter and thread CPU ns at its start and end; ``inside``: the timer
    runs inside phaseprof's phase (its reads enclose the timer's), else around it."""

    what: str
    t0: int
    c0: int
    t1: int
    c1: int
    inside: bool

    @property
    def ms(self) -> float:
        return (self.t1 - self.t0) / 1e6


def time_forward(module, timers: Timers, what: str) -> None:
    """Time ``module``'s training calls (grad enabled, training mode) from its first forward pre-hook
    to its first forward hook: just inside the hooks phaseprof adds when it attaches (so set these
    before), around whatever wraps the module's ``forward`` (Accelerate's autocast). Like
    phaseprof's, the hooks run outside what torch.compile traces."""
    started: list[tuple[int, int]] = []

    @torch.compiler.disable
    def pre(module, args):
        if module.training and torch.is_grad_enabled():
            started.append(timers.start())

    @torch.compiler.disable
    def post(module, args, output):
        if started:
            timers.stop(what, started.pop())

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


def time_optimizer(optimizer, timers: Timers, what: str) -> None:
    """Time ``optimizer``'s ``step`` and ``zero_grad`` from just inside the wrappers phaseprof puts
    on the instance when it attaches (so set these before): all of ``step`` but the closure it may be
    given, which runs outside the optimizer phase. A step with a closure is two spans, one without
    it one."""
    step, zero_grad = optimizer.step, optimizer.zero_grad

    @functools.wraps(step)  # keeps what an LR scheduler marked on it
    def timed_step(closure=None, **kwargs):
        started = [timers.start()]

        def timed_closure():
            timers.stop(what, started[0])
            try:
                return closure()
            finally:
                started[0] = timers.start()

        try:
            return step(timed_closure if closure is not None else None, **kwargs)
        finally:
            timers.stop(what, started[0])

    @functools.wraps(zero_grad)
    def timed_zero_grad(*args, **kwargs):
        return timers.timed(what, zero_grad, *args, **kwargs)

    optimizer.step, optimizer.zero_grad = timed_step, timed_zero_grad


def timed(models: list, optimizers: list) -> Timers:
    """Fresh timers around each model's forward and each optimizer's ``step`` and ``zero_grad``:
    the set-up every compared loop shares (call it before phaseprof attaches)."""
    timers = Timers()
    for model in models:
        time_forward(model, timers, FORWARD)
    for optimizer in optimizers:
        time_optimizer(optimizer, timers, OPTIMIZER)
    return timers


def by_calls(spans: list, counts: list[int]) -> list[list]:
    """``spans`` cut into consecutive runs of ``counts[i]`` spans: one per step."""
    out, i = [], 0
    for n in counts:
        out.append(spans[i:i + n])
        i += n
    assert i == len(spans), (i, len(spans))
    return out


class TimedGradScaler(torch.amp.GradScaler):
    """A GradScaler whose ``unscale_``, ``step`` and ``update`` time themselves as ``what``: inside
    the wrappers phaseprof puts on them (its step ends after them)."""

    def __init__(self, timers: Timers, what: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timers, self.what = timers, what

    def unscale_(self, optimizer):
        return self.timers.timed(self.what, super().unscale_, optimizer)

    def step(self, optimizer, *args, **kwargs):
        return self.timers.timed(self.what, super().step, optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        return self.timers.timed(self.what, super().update, new_scale)


class Timers:
    """Independent timers (`Span` in call order), and phaseprof's clock reads while `watching`."""

    def __init__(self) -> None:
        self.log: list[Span] = []
        self._read_ns: list[int] = []  # phaseprof's clock reads on the loop's thread, in order
        self._read_cpu: list[int] = []  # the thread's CPU time at each
        self._gc_ns: list[int] = []  # each garbage collection on the loop's thread: its start...
        self._gc_cpu: list[int] = []  # ...and the CPU time it took

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Read the thread's CPU time beside each of phaseprof's own clock reads (the tracker's
        ``perf_counter_ns``, whose value it returns unchanged), and record the garbage collections
        on this thread."""
        clock, read_ns, read_cpu, cpu = tracker.perf_counter_ns, self._read_ns, self._read_cpu, time.thread_time_ns
        thread, started = threading.get_ident(), [0, 0]

        def watched() -> int:
            ns = clock()
            read_ns.append(ns)
            read_cpu.append(cpu())
            return ns

        def collecting(phase: str, info: dict) -> None:
            if threading.get_ident() != thread:
                return
            if phase == "start":
                started[:] = clock(), cpu()
            else:
                self._gc_ns.append(started[0])
                self._gc_cpu.append(cpu() - started[1])

        tracker.perf_counter_ns = watched
        gc.callbacks.append(collecting)
        try:
            yield
        finally:
            tracker.perf_counter_ns = clock
            gc.callbacks.remove(collecting)

    @contextlib.contextmanager
    def timing_backward(self, what: str = BACKWARD) -> Iterator[None]:
        """Time ``torch.autograd.backward`` (what ``loss.backward()`` calls) from just inside the
        wrapper phaseprof puts on it when it attaches (so enter this before)."""
        backward = torch.autograd.backward
        assert not hasattr(backward, "__wrapped__"), "time backward before phaseprof attaches"

        @functools.wraps(backward)
        def timed(*args, **kwargs):
            return self.timed(what, backward, *args, **kwargs)

        torch.autograd.backward = timed
        try:
            yield
        finally:
            if torch.autograd.backward is timed:
                torch.autograd.backward = backward

    def start(self) -> tuple[int, int]:
        return time.perf_counter_ns(), time.thread_time_ns()

    def stop(self, what: str, started: tuple[int, int], inside: bool = True) -> None:
        t1 = time.perf_counter_ns()
        self.log.append(Span(what, started[0], started[1], t1, time.thread_time_ns(), inside))

    def timed(self, what: str, fn, *args, inside: bool = True, **kwargs):
        started = self.start()
        try:
            return fn(*args, **kwargs)
        finally:
            self.stop(what, started, inside)

    def spans(self, *what: str) -> list[Span]:
        """The timings of ``what`` in call order, but for those inside another of them."""
        spans = sorted((span for span in self.log if span.what in what), key=lambda span: span.t0)
        outermost: list[Span] = []
        for span in spans:
            if not outermost or span.t1 > outermost[-1].t1:
                outermost.append(span)
        return outermost

    def per_step(self, what: str | tuple[str, ...], calls: int) -> list[list[Span]]:
        """Each run of ``calls`` consecutive timings of ``what`` (a name or several): one per step."""
        spans = self.spans(*((what,) if isinstance(what, str) else what))
        return [spans[i:i + calls] for i in range(0, len(spans), calls)]

    def bands(self, span: Span) -> list[tuple[int, int, int, int]]:
        """The code between the span's reads and phaseprof's adjacent reads, before and after:
        ``(wall ns from, CPU ns from, wall ns to, CPU ns to)`` each; none where phaseprof read no
        clock there."""
        ns, cpu = self._read_ns, self._read_cpu
        if span.inside:  # phaseprof's last read before the timer started, its first after it stopped
            i, j = bisect.bisect_right(ns, span.t0) - 1, bisect.bisect_left(ns, span.t1)
            if i < 0 or j >= len(ns):
                return []
            return [(ns[i], cpu[i], span.t0, span.c0), (span.t1, span.c1, ns[j], cpu[j])]
        i, j = bisect.bisect_left(ns, span.t0), bisect.bisect_right(ns, span.t1) - 1  # phaseprof's reads within
        if i > j:
            return []
        return [(span.t0, span.c0, ns[i], cpu[i]), (ns[j], cpu[j], span.t1, span.c1)]

    def interrupted_ms(self, span: Span) -> float:
        """Time the thread spent off the CPU or collecting garbage in the span's `bands`."""
        return sum(max(0, (w1 - w0) - (c1 - c0) + self._collecting_ns(w0, w1))
                   for w0, c0, w1, c1 in self.bands(span)) / 1e6

    def _explain(self, spans: list[Span]) -> list[tuple]:
        """Each span's ms and its bands' wall, CPU and garbage-collection µs: where a gap came from."""
        return [(round(span.ms, 3), [((w1 - w0) // 1000, (c1 - c0) // 1000, self._collecting_ns(w0, w1) // 1000)
                                     for w0, c0, w1, c1 in self.bands(span)]) for span in spans]

    def _collecting_ns(self, w0: int, w1: int) -> int:
        """CPU time of the collections that started between two reads (a collection runs between
        two Python calls, so it never straddles a read)."""
        return sum(self._gc_cpu[bisect.bisect_left(self._gc_ns, w0):bisect.bisect_left(self._gc_ns, w1)])

    def agree(self, what: str, measured: list[float], reference: list[list[Span]],
              abs_ms: float = 0.5, rel: float = 0.05) -> int:
        """Every step's ``measured`` ms within ``rel`` (5%) or ``abs_ms`` of its reference spans' sum,
        or off by
        no more than the time the thread was shown interrupted between phaseprof's clock and the
        timers'. Returns how many steps needed that excuse (each is printed)."""
        assert self._read_ns, "watch phaseprof's clock (Timers.watching) while the loop runs"
        assert len(measured) == len(reference), (what, measured, [[s.ms for s in spans] for spans in reference])
        failed, excused, pairs = [], [], []
        for step, (m, spans) in enumerate(zip(measured, reference)):
            ref = sum(span.ms for span in spans)
            pairs.append((m, ref))
            gap, tol = m - ref, tolerance(ref, rel, abs_ms)
            if abs(gap) <= tol:
                continue
            # An interruption in the code between the clocks stretches phaseprof's figure beyond an
            # inner timer's, or an outer timer's beyond phaseprof's.
            allowed = sum(self.interrupted_ms(span) for span in spans if span.inside == (gap > 0))
            row = (step, round(m, 3), round(ref, 3), round(allowed, 3))
            if abs(gap) <= tol + allowed:
                excused.append(row)
            else:
                failed.append((*row, self._explain(spans)))
        assert not failed, (f"{what}: steps off beyond their tolerance (step, phaseprof ms, timers ms, ms shown "
                            f"interrupted between the clocks, [(span ms, [(wall, CPU, collector µs) before and "
                            f"after it])]): {failed}; all steps: {[(round(m, 3), round(ref, 3)) for m, ref in pairs]}")
        if excused:
            print(f"{what}: {len(excused)} step(s) excused by an interruption between the clocks: {excused}")
        return len(excused)

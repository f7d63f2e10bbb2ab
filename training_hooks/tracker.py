"""The phase tracker, the loop thread's hot path: opening and closing phases on the host clock, with
their trace ranges and CUDA marks, and cutting the timeline into steps.

Every instant of a step belongs to exactly one phase, the innermost one open (``other`` while none
is): the rule the trace analysis applies (docs/architecture.md), so the per-step scalars and the traces agree
and a step's phase times add up to its wall time. Each transition only reads the clock and appends
to the step's log; the sums are made later, off the loop's thread (`phase_ns`). This path runs ten
or so times a step between framework calls that evict it from the CPU's caches, so it touches as
few objects as it can: the budget of the whole hook is 30 µs a step. A phase's marks (its trace
range, its CUDA event) are made before the clock is read when it opens and after when it closes,
so its time leaves out their cost (a range pushed while torch.profiler records can cost hundreds of
µs on a busy machine): that goes to the phase around it.

Time kept out of the training steps (`phaseprof.contract.OUT_OF_STEP`: an evaluation pass, a
``prof.paused()`` block) is logged as a phase of those names, and while one is open no hook opens a
phase inside it: the recorder and the summary leave it out of the step.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns

from phaseprof.contract import BACKWARD, EVAL, FORWARD, OPTIMIZER, OTHER, OUT_OF_STEP

from .cuda_timing import CudaPhaseTimer
from .faults import Faults
from .ranges import Ranges

_get_ident = threading.get_ident
_TRAINING_WORK = frozenset((FORWARD, BACKWARD, OPTIMIZER))

#: What the log calls the time from the last step's end to close when no evaluation ran in it: an
#: evaluation pass still open at the last step boundary ended there (the loop's end, a save, are
#: not evaluation). In no step, and no pass.
AFTER_LAST = "after the last step"

#: What the log calls the hook's own time: from a hook's entry into `PhaseTracker.begin` or `end` to
#: its exit (its bookkeeping, trace ranges, CUDA marks), and the handover at a step boundary. In no
#: phase: a phase holds what the user's own timer around that call would, less the hook's time.
HOOK = "hook"

#: A step's host timeline: ``[t0, phase, t1, phase, t2, …]`` in perf_counter ns, each phase running
#: from the time before it to the time after it.
Log = list


class PhaseError(RuntimeError):
    """A phase was opened inside itself or closed out of order."""


class PhaseTracker:
    """The open phases and the current step's log, on the loop's thread. Hooks call `begin` and `end`;
    the user's ``with prof.phase(...)`` calls `open` and `close`; the profiler calls `start_step`
    (first), then `cut` and `start_step` at each step boundary, and `stop` on close."""

    __slots__ = ("stack", "running", "gpu", "apart", "_idle_pass", "_log", "_thread", "_live",
                 "_ranges", "_faults", "_record", "_marks")

    def __init__(self, thread: int, ranges: Ranges, faults: Faults) -> None:
        self.stack: list[str] = []  # open phases, outermost first
        self.running = True
        self._live: int | None = thread  # the loop's thread while running, then None: one test
        self.gpu: CudaPhaseTimer | None = None
        self.apart = False  # an out-of-step phase (eval, paused) is open
        self._idle_pass = False  # the step began inside a pass, and no evaluation forward ran since
        self._log: Log = []
        self._thread = thread
        self._ranges = ranges
        self._faults = faults
        self._record = False  # open record_function ranges (torch.profiler is recording)
        self._marks = ranges.nvtx  # anything beyond the clock: ranges or CUDA marks

    @property
    def thread(self) -> int:
        """The loop's thread: the only one whose calls are timed."""
        return self._thread

    # -- hooks: lenient, never raise --------------------------------------------------------------

    def begin(self, phase: str) -> bool:
        """Open ``phase`` for a hook, unless it is open already, the call is not on the loop's
        thread, or time is kept out of the step (only another out-of-step phase opens then);
        returns whether it opened it."""
        stack = self.stack
        if _get_ident() != self._live or phase in stack or (
                self.apart and phase not in OUT_OF_STEP):
            return False
        entered = perf_counter_ns()
        previous = stack[-1] if stack else OTHER
        if self._marks:  # inside the hook's time: the phase leaves out the cost of its own marks
            self._mark_open(phase, previous)
        stack.append(phase)
        if phase in OUT_OF_STEP:
            self.apart = True
        self._log.extend((previous, entered, HOOK, perf_counter_ns()))
        return True

    def end(self, phase: str, opened: bool) -> None:
        """Close what `begin` opened, with any phase still open inside it (as an exception unwinds
        ``with`` blocks)."""
        stack = self.stack
        if not opened or phase not in stack:
            return
        entered = perf_counter_ns()
        closing = stack[-1]
        if closing == phase:
            stack.pop()
            depth = 1
        else:
            depth = len(stack) - stack.index(phase)
            del stack[-depth:]
        if self.apart:
            self.apart = any(p in OUT_OF_STEP for p in stack)
        if self._marks:
            self._mark_close(phase, depth, closing)
        self._log.extend((closing, entered, HOOK, perf_counter_ns()))

    # -- evaluation passes ------------------------------------------------------------------------

    def enter_eval(self, since_work: bool) -> None:
        """An evaluation pass starts (or goes on): time is kept out of the step until `leave_eval`.
        ``since_work``: the pass began before its first forward (the eval loader's first batch,
        ``model.eval()``): when the step has done no training work and no phase is open, the
        time since the last phase closed is the pass's too."""
        self._idle_pass = False
        stack = self.stack
        if EVAL in stack or not self.begin(EVAL):
            return
        log = self._log
        if (since_work and len(stack) == 1 and log[-4] == OTHER
                and not _TRAINING_WORK.intersection(log[1::2])):
            log[-4] = EVAL  # the segment before the hook's own time in `begin`

    def leave_eval(self) -> None:
        """Training work starts on the loop's thread: close the evaluation pass, if one is open. (A
        call from another thread, such as a DataParallel replica's forward, changes nothing.)"""
        if EVAL in self.stack and _get_ident() == self._thread:
            self._idle_pass = False
            self.end(EVAL, True)

    # -- the user's phases: strict ----------------------------------------------------------------

    def open(self, phase: str) -> bool:
        """Open a phase of the user's; False when it does not open (inside an out-of-step phase)."""
        if _get_ident() != self._thread:
            raise PhaseError(f"phase {phase!r} opened on another thread than the loop's")
        if phase in self.stack:
            raise PhaseError(f"phase {phase!r} is already open: a phase cannot be nested in itself")
        return self.begin(phase)

    def close(self, phase: str) -> None:
        stack = self.stack
        if not stack or stack[-1] != phase:
            # An evaluation pass the hooks opened inside the user's phase ends with it.
            if phase in stack and all(p in OUT_OF_STEP for p in stack[stack.index(phase) + 1:]):
                self.end(phase, True)
                return
            inner = f"phase {stack[-1]!r} is still open inside it" if phase in stack else "it is not open"
            raise PhaseError(f"cannot close phase {phase!r}: {inner} (phases close innermost first)")
        self.end(phase, True)

    # -- steps ------------------------------------------------------------------------------------

    def cut(self, now: int, by_hook: bool = False) -> Log:
        """The log of the step ending at ``now``, its open phases' ranges closed (they reopen in
        `start_step`) so that no range straddles the step boundary in the trace. ``by_hook``: a hook
        ends the step (an optimizer's step): the time since its last phase closed is the hook's."""
        log = self._log
        phase = self.stack[-1] if self.stack else OTHER
        log += (HOOK if by_hook else phase, now)
        self._log = []
        if self._marks:
            try:
                if self.gpu is not None:
                    self.gpu.mark(phase)
                self._ranges.pop_all()
            except Exception as e:  # noqa: BLE001
                self._faults.report("internal error closing the step's ranges", e)
        return log

    def start_step(self, now: int, record: bool, gpu: CudaPhaseTimer | None,
                   hook_since: int | None = None) -> None:
        """Start a step's clock at ``now`` (the time since `cut` belongs to no step); ``record``:
        whether torch.profiler records it; ``gpu``: the CUDA timer, if CUDA is in use;
        ``hook_since``: the step's time begins there, with the hook's own until ``now`` (the
        handover at the step boundary)."""
        self._log += (now,) if hook_since is None else (hook_since, HOOK, now)
        self._idle_pass = EVAL in self.stack
        self._record = record
        self.gpu = gpu
        self._marks = record or self._ranges.nvtx or gpu is not None
        if self._marks:
            try:
                if gpu is not None:
                    gpu.mark(None)
                for phase in self.stack:
                    self._ranges.push(phase, record)
            except Exception as e:  # noqa: BLE001
                self._faults.report("internal error reopening ranges", e)

    def stop(self, now: int) -> Log:
        """The log of the last step, at close; phases left open are closed. An evaluation pass left
        open at the last step boundary with no evaluation forward since ended at that boundary."""
        ended_at_cut = EVAL in self.stack and self._idle_pass
        log = self.cut(now)
        if ended_at_cut:
            log[1::2] = [AFTER_LAST if phase == EVAL else phase for phase in log[1::2]]
        self.running = False
        self._live = None
        self.stack.clear()
        self.apart = False
        return log

    # -- ranges and CUDA marks --------------------------------------------------------------------

    def _mark_open(self, phase: str, previous: str) -> None:
        try:
            self._ranges.push(phase, self._record)
            if self.gpu is not None:
                self.gpu.mark(previous)
        except Exception as e:  # noqa: BLE001
            self._faults.report(f"internal error opening phase {phase!r}", e)

    def _mark_close(self, phase: str, depth: int, closing: str) -> None:
        try:
            for _ in range(depth):
                self._ranges.pop()
            if self.gpu is not None:
                self.gpu.mark(closing)
        except Exception as e:  # noqa: BLE001
            self._faults.report(f"internal error closing phase {phase!r}", e)


def phase_ns(log: Log) -> dict[str, int]:
    """Host ns per phase of one step's log, in order of first appearance."""
    times: dict[str, int] = {}
    for i in range(1, len(log), 2):
        phase = log[i]
        times[phase] = times.get(phase, 0) + log[i + 1] - log[i - 1]
    return times

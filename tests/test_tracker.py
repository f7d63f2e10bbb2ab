"""The phase tracker on its own: the step's log, which calls open or close a phase, the marks (trace
ranges, CUDA marks) each transition makes, and faults in them that never reach the loop.

Ranges, faults and the CUDA timer are stand-ins that record what they are asked to do; the clock is
the real one, so the tests assert the log's shape (which phase ran between which two reads) and the
order of its times, never their values.
"""

from __future__ import annotations

import threading
import time

import pytest

from phaseprof.contract import BACKWARD, EVAL, FORWARD, OPTIMIZER, OTHER, PAUSED
from phaseprof.training_hooks.tracker import HOOK, PhaseError, PhaseTracker, phase_ns


class Ranges:
    """Records pushes and pops; ``fail`` makes every call raise."""

    def __init__(self, nvtx: bool = False, fail: bool = False) -> None:
        self.nvtx = nvtx
        self.fail = fail
        self.calls: list[tuple] = []

    def push(self, phase: str, record: bool) -> None:
        self.calls.append(("push", phase, record))
        if self.fail:
            raise OSError("push failed")

    def pop(self) -> None:
        self.calls.append(("pop",))
        if self.fail:
            raise OSError("pop failed")

    def pop_all(self) -> None:
        self.calls.append(("pop_all",))
        if self.fail:
            raise OSError("pop_all failed")


class Faults:
    def __init__(self) -> None:
        self.reports: list[tuple[str, BaseException]] = []

    def report(self, what: str, error: BaseException) -> None:
        self.reports.append((what, error))


class Gpu:
    """A CUDA timer that records its marks (the phase that ran up to each)."""

    def __init__(self) -> None:
        self.marks: list[str | None] = []

    def mark(self, phase: str | None) -> None:
        self.marks.append(phase)


def tracker(nvtx: bool = False, fail: bool = False) -> tuple[PhaseTracker, Ranges, Faults]:
    ranges, faults = Ranges(nvtx, fail), Faults()
    return PhaseTracker(threading.get_ident(), ranges, faults), ranges, faults


def phases(log: list) -> list[str]:
    """The phases of a log, in order (its odd places), less the hook's own time between them."""
    return [phase for phase in log[1::2] if phase != HOOK]


def times_in_order(log: list) -> bool:
    times = log[0::2]
    return all(isinstance(t, int) for t in times) and times == sorted(times)


def on_another_thread(call):
    result = []
    t = threading.Thread(target=lambda: result.append(call()))
    t.start()
    t.join(timeout=60)
    return result[0]


def test_a_step_log_holds_each_phase_between_two_clock_reads():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    assert t.begin(FORWARD)
    t.end(FORWARD, True)
    assert t.begin(BACKWARD)
    t.end(BACKWARD, True)
    log = t.cut(10**30)
    assert phases(log) == [OTHER, FORWARD, OTHER, BACKWARD, OTHER]
    assert log[0] == 0 and log[-1] == 10**30 and times_in_order(log)
    assert t.stack == []
    t.start_step(10**30, False, None)
    assert t.cut(10**30 + 1) == [10**30, OTHER, 10**30 + 1]  # the next step starts a log of its own


def test_a_phase_inside_another_splits_it_and_closing_the_outer_closes_both():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    assert t.begin(OPTIMIZER)
    assert t.begin("loss")
    assert t.begin("inner")
    assert t.stack == [OPTIMIZER, "loss", "inner"]
    t.end(OPTIMIZER, True)  # as an exception unwinds with blocks: everything inside closes too
    assert t.stack == []
    log = t.cut(10**30)
    # the time up to the close belongs to the innermost phase open
    assert phases(log) == [OTHER, OPTIMIZER, "loss", "inner", OTHER]
    assert times_in_order(log)


def test_closing_the_innermost_phase_leaves_the_outer_open():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.begin(FORWARD)
    t.begin("attention")
    t.end("attention", True)
    assert t.stack == [FORWARD]
    t.end(FORWARD, True)
    assert phases(t.cut(10**30)) == [OTHER, FORWARD, "attention", FORWARD, OTHER]


def test_a_hook_never_opens_a_phase_already_open_nor_after_stop_nor_off_the_loop_thread():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    assert t.begin(FORWARD)
    assert not t.begin(FORWARD)
    assert t.stack == [FORWARD]
    assert not on_another_thread(lambda: t.begin(BACKWARD))
    assert t.stack == [FORWARD]
    t.stop(10**30)
    assert not t.begin(FORWARD)
    assert t.stack == [] and not t.running


def test_end_closes_only_what_begin_opened():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.begin(FORWARD)
    t.end(FORWARD, False)  # a nested call that did not open it
    assert t.stack == [FORWARD]
    t.end(BACKWARD, True)  # not open: nothing to close
    assert t.stack == [FORWARD]
    assert phases(t._log) == [OTHER]


def test_time_kept_out_of_the_step_opens_no_training_phase_inside_it():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    assert t.begin(EVAL)
    assert t.apart
    assert not t.begin(FORWARD)
    assert t.begin(PAUSED)  # another out-of-step phase still opens
    t.end(PAUSED, True)
    assert t.apart  # eval is still open beneath
    t.end(EVAL, True)
    assert not t.apart
    assert t.begin(FORWARD)


def test_closing_a_phase_around_an_out_of_step_one_leaves_the_step_inside():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.begin("validate")
    t.begin(PAUSED)
    assert t.apart
    t.end("validate", True)
    assert not t.apart and t.stack == []


def test_an_evaluation_pass_before_any_training_work_takes_the_other_time_before_it():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.enter_eval(since_work=True)
    assert t.stack == [EVAL]
    t.leave_eval()
    assert phases(t.cut(10**30)) == [EVAL, EVAL, OTHER]


@pytest.mark.parametrize("case", ["not since work", "after training work", "inside a phase"])
def test_an_evaluation_pass_after_training_work_or_not_from_its_start_keeps_the_other_time(case):
    t, _, _ = tracker()
    t.start_step(0, False, None)
    if case == "after training work":
        t.begin(BACKWARD)
        t.end(BACKWARD, True)
    if case == "inside a phase":
        t.begin("validate")
    t.enter_eval(since_work=case != "not since work")
    t.leave_eval()
    expected = {"not since work": [OTHER, EVAL, OTHER],
                "after training work": [OTHER, BACKWARD, OTHER, EVAL, OTHER],
                "inside a phase": [OTHER, "validate", EVAL, "validate"]}[case]
    assert phases(t.cut(10**30)) == expected


def test_entering_an_evaluation_pass_twice_or_leaving_one_off_the_loop_thread_changes_nothing():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.enter_eval(since_work=True)
    t.enter_eval(since_work=True)
    assert t.stack == [EVAL]
    on_another_thread(t.leave_eval)
    assert t.stack == [EVAL] and t.apart
    t.leave_eval()
    assert t.stack == [] and not t.apart
    t.leave_eval()  # none open: nothing happens
    assert phases(t.cut(10**30)) == [EVAL, EVAL, OTHER]


def test_the_users_phases_are_strict():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    assert t.open("loss")
    with pytest.raises(PhaseError, match="'loss' is already open"):
        t.open("loss")
    error = on_another_thread(lambda: _raises(lambda: t.open("data")))
    assert isinstance(error, PhaseError) and "opened on another thread" in str(error)
    t.open("inner")
    with pytest.raises(PhaseError, match="cannot close phase 'loss': phase 'inner' is still open inside it"):
        t.close("loss")
    with pytest.raises(PhaseError, match="cannot close phase 'nothing': it is not open"):
        t.close("nothing")
    t.close("inner")
    t.close("loss")
    assert t.stack == []
    with pytest.raises(PhaseError, match="it is not open"):
        t.close("loss")


def _raises(call):
    try:
        call()
    except PhaseError as e:
        return e
    return None


def test_a_users_phase_opened_inside_time_kept_out_does_not_open():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.begin(PAUSED)
    assert t.open("loss") is False
    assert t.stack == [PAUSED]


def test_an_evaluation_pass_opened_inside_a_users_phase_closes_with_it():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.open("validate")
    t.enter_eval(since_work=True)
    t.close("validate")
    assert t.stack == [] and not t.apart
    assert phases(t.cut(10**30)) == [OTHER, "validate", EVAL, OTHER]


def test_no_marks_are_made_when_nothing_reads_them():
    t, ranges, _ = tracker(nvtx=False)
    t.start_step(0, False, None)
    t.begin(FORWARD)
    t.end(FORWARD, True)
    t.cut(10**30)
    assert ranges.calls == []


def test_each_phase_pushes_its_range_and_marks_the_gpu_with_the_phase_that_ran_up_to_it():
    t, ranges, faults = tracker()
    gpu = Gpu()
    t.start_step(0, True, gpu)
    assert gpu.marks == [None]  # the step starts
    t.begin(FORWARD)
    t.begin("attention")
    t.end(FORWARD, True)  # closes both: two ranges popped
    log = t.cut(10**30)
    assert ranges.calls == [("push", FORWARD, True), ("push", "attention", True), ("pop",), ("pop",),
                            ("pop_all",)]
    assert gpu.marks == [None, OTHER, FORWARD, "attention", OTHER]
    assert phases(log) == [OTHER, FORWARD, "attention", OTHER]
    assert faults.reports == []


def test_ranges_are_recorded_only_while_the_profiler_records_and_reopen_at_each_step():
    t, ranges, _ = tracker(nvtx=True)
    t.start_step(0, False, None)
    t.begin(FORWARD)
    t.cut(10)
    t.start_step(10, True, None)  # the profiler records this step: the open phase's range reopens
    t.begin("attention")
    assert ranges.calls == [("push", FORWARD, False), ("pop_all",), ("push", FORWARD, True),
                            ("push", "attention", True)]


def test_a_step_recorded_by_neither_the_profiler_nor_nvtx_nor_cuda_makes_no_marks():
    t, ranges, _ = tracker(nvtx=False)
    t.start_step(0, True, None)
    t.begin(FORWARD)
    t.cut(10)
    calls = len(ranges.calls)
    assert calls == 2  # pushed while recorded, popped at the cut
    t.start_step(10, False, None)
    t.begin("attention")
    t.end("attention", True)
    t.cut(20)
    assert len(ranges.calls) == calls


def test_faults_in_the_marks_are_reported_and_the_timing_goes_on():
    t, _, faults = tracker(nvtx=True, fail=True)
    t.start_step(0, False, None)
    assert [w for w, _ in faults.reports] == []
    assert t.begin(FORWARD)
    t.end(FORWARD, True)
    t.begin(BACKWARD)
    log = t.cut(10**30)
    t.start_step(10**30, False, None)  # reopening backward's range fails too
    assert phases(log) == [OTHER, FORWARD, OTHER, BACKWARD]
    assert [w for w, _ in faults.reports] == [
        "internal error opening phase 'forward'", "internal error closing phase 'forward'",
        "internal error opening phase 'backward'", "internal error closing the step's ranges",
        "internal error reopening ranges"]
    assert all(isinstance(e, OSError) for _, e in faults.reports)


def test_a_failing_gpu_mark_is_reported_where_it_happens():
    class Broken:
        def mark(self, phase):
            raise RuntimeError("CUDA error")

    t, _, faults = tracker()
    t.start_step(0, False, Broken())
    assert [w for w, _ in faults.reports] == ["internal error reopening ranges"]


def test_stop_closes_what_is_open_and_ends_the_last_steps_log():
    t, ranges, _ = tracker(nvtx=True)
    t.start_step(0, False, None)
    t.begin(EVAL)
    t.begin(PAUSED)
    log = t.stop(10**30)
    assert phases(log) == [OTHER, EVAL, PAUSED] and log[-1] == 10**30
    assert t.stack == [] and not t.apart and not t.running
    assert ranges.calls[-1] == ("pop_all",)


def test_the_tracker_belongs_to_the_thread_it_was_made_for():
    t, _, _ = tracker()
    assert t.thread == threading.get_ident()


def test_phase_ns_sums_each_phase_in_order_of_first_appearance():
    log = [100, OTHER, 130, FORWARD, 200, OTHER, 210, BACKWARD, 400, FORWARD, 450]
    times = phase_ns(log)
    assert times == {OTHER: 40, FORWARD: 120, BACKWARD: 190}
    assert list(times) == [OTHER, FORWARD, BACKWARD]
    assert sum(times.values()) == log[-1] - log[0]
    assert phase_ns([7]) == {}


def test_closing_a_middle_phase_closes_those_inside_it_and_leaves_the_outer_open_with_its_range():
    t, ranges, _ = tracker(nvtx=True)
    t.start_step(0, False, None)
    for phase in (OPTIMIZER, "loss", "inner"):
        t.begin(phase)
    t.end("loss", True)
    assert t.stack == [OPTIMIZER]
    assert ranges.calls[3:] == [("pop",), ("pop",)]  # loss's and inner's ranges; optimizer's stays
    t.begin("inner")
    t.end("inner", True)  # the innermost alone: one range
    assert ranges.calls[5:] == [("push", "inner", False), ("pop",)]
    assert t.stack == [OPTIMIZER]


def test_a_users_phase_inside_another_closes_with_the_evaluation_pass_opened_in_it():
    t, _, _ = tracker()
    t.start_step(0, False, None)
    t.open("epoch")
    t.open("validate")
    t.enter_eval(since_work=True)
    t.close("validate")
    assert t.stack == ["epoch"] and not t.apart
    t.open("a")
    t.open("b")
    with pytest.raises(PhaseError, match="cannot close phase 'epoch': phase 'b' is still open inside it"):
        t.close("epoch")


def test_the_hooks_own_time_and_its_marks_are_a_segment_of_their_own():
    """Each transition's bookkeeping and marks lie between two clock reads of their own: the hook's
    time, in no phase; a step ended by a hook ends with the hook's time, and the handover at the
    boundary begins the next step."""
    t, ranges, _ = tracker(nvtx=True)
    reads: list[int] = []
    push = ranges.push
    ranges.push = lambda *args: (reads.append(time.perf_counter_ns()), push(*args))
    t.start_step(time.perf_counter_ns(), False, None)
    t.begin(FORWARD)
    t.end(FORWARD, True)
    log = t.cut(time.perf_counter_ns(), by_hook=True)
    assert log[1::2] == [OTHER, HOOK, FORWARD, HOOK, HOOK] and times_in_order(log)
    assert log[2] < reads[0] < log[4]  # the forward's range was pushed in the hook's time
    t.start_step(20, False, None, hook_since=10)
    assert t.cut(30) == [10, HOOK, 20, OTHER, 30]

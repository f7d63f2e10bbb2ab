"""The training side of the capture channel (`training_hooks/capture.py`) in this process: one rank's
watcher over a run folder, on a fake clock, its looks made by the test (`Run.look`), a small real
torch.profiler started by `CaptureWatcher.begin` on a loop the test steps (`Run.run_to`, as
`PhaseProfiler._end_step` does). What is checked is what the asker reads: the heartbeat, the answers,
the trace's steps. The job tests of tests/test_capture.py run the same in a training job (slow)."""

from __future__ import annotations

import errno
import json
import os
import secrets
import threading
import time as real_time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from phaseprof.capture_channel import (
    ACCEPTED,
    BY_SLOWDOWN,
    REFUSED,
    STALE_REQUEST_S,
    TRACING,
    WRITTEN,
    DiskFolder,
    Request,
    capture_dir,
    farthest_start,
    plan_request,
    read_channel,
    write_request,
)
from phaseprof.capture_store import StoreError
from phaseprof.trace_files import compress_into_place, compressed_name
from phaseprof.training_hooks import capture
from phaseprof.training_hooks.capture import CaptureWatcher, Slowdown, recent_steps
from phaseprof.training_hooks.faults import Faults
from phaseprof.training_hooks.recorder import PhaseStats
from phaseprof.training_hooks.records import StepTimes
from phaseprof.training_hooks.traces import TraceWriter
from tests.test_traces import Background

MS = 1_000_000  # ns


class Clock:
    """The watcher's clock: wall time stands still until the test moves it (`Run.later`)."""

    def __init__(self) -> None:
        self.now = real_time.time()

    def time(self) -> float:
        return self.now

    monotonic = staticmethod(real_time.monotonic)


class Finisher(Background):
    """The background: each trace compressed here, at once; nothing left to wait for at close."""

    def wait_for_traces(self) -> None:
        pass


class Run:
    """Rank 0 of a run at step 100, its configured schedule over before step ``until``, with a
    watcher whose thread never looks by itself."""

    def __init__(self, tmp_path, monkeypatch, world_size: int = 1, slowdown: Slowdown | None = None,
                 until: int | None = 5, traces_dir: str | None = None,
                 background: Background | None = None) -> None:
        self.clock = Clock()
        monkeypatch.setattr(capture, "time", self.clock)
        monkeypatch.setattr(CaptureWatcher, "_run", lambda watcher: None)  # the test looks (`look`)
        self.dir = str(tmp_path / "run")
        faults = Faults(self.dir)
        writer = TraceWriter(traces_dir or self.dir, "host_1", background is not None, faults,
                             background or Finisher())
        self.prof = SimpleNamespace(
            _rank=0, run_dir=self.dir, _schedule={"active": 3}, _profile_until=until, step_num=100,
            _faults=faults, _recorder=SimpleNamespace(stats=PhaseStats()), _traces=writer,
            _options={"activities": [torch.profiler.ProfilerActivity.CPU]})
        self.watcher = CaptureWatcher(self.prof, world_size, slowdown)

    def look(self) -> None:
        self.watcher.tick()

    def later(self, seconds: float, steps: int = 0) -> None:
        self.clock.now += seconds
        self.prof.step_num += steps

    def channel(self):
        return read_channel(self.dir, now=self.clock.now)

    def ask(self, steps: int | None = None) -> Request:
        """A request as ``phaseprof capture`` writes it."""
        request = plan_request(self.dir, steps, now=self.clock.now)
        write_request(self.dir, request)
        return request

    def write(self, start: int, steps: int = 3, ago: float = 0.0, expires_s: float = 600.0,
              ranks: list[int] | None = None) -> Request:
        """A request written by hand, ``ago`` seconds before now."""
        written = self.clock.now - ago
        request = Request(id=secrets.token_hex(8), written=written, by="cli", steps=steps, start=start,
                          ranks=ranks, expires=written + expires_s)
        write_request(self.dir, request)
        return request

    def answer(self, request: Request):
        return self.channel().answers[request.id][0]

    def run_to(self, step: int) -> torch.profiler.profile | None:
        """Steps of the loop until ``step`` begins: at each boundary the capture's profiler steps
        or stops, or the next capture's begins; returns the one still running."""
        profiler = None
        while self.prof.step_num < step:
            torch.ones(4).sum()
            self.prof.step_num += 1
            if profiler is not None:
                if self.prof.step_num >= self.prof._profile_until:
                    profiler.stop()
                    profiler = None
                else:
                    profiler.step()
            if profiler is None and self.watcher.plan is not None:
                profiler = self.watcher.begin(self.prof)
        return profiler  # a capture's, still running

    def written(self, request: Request):
        """The answer once it says written (the trace in place); the capture must have begun."""
        self.look()
        assert self.answer(request).state in (TRACING, WRITTEN), self.answer(request)
        done = threading.Event()
        while not done.wait(0.01):
            self.look()
            if self.answer(request).state != TRACING:
                done.set()
        return self.answer(request)


def steps_in(path: Path) -> list[int]:
    events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))


def test_the_heartbeat_says_the_step_the_pace_and_the_end(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    beat = run.channel().beats[0]
    assert (beat.rank, beat.world_size, beat.step, beat.active, beat.schedule_until) == (0, 1, 100, 3, 5)
    assert beat.steps_per_s == 0.0 and beat.time == run.clock.now and beat.started == run.clock.now
    assert beat.look_s == 0.5 and beat.ended is False
    assert run.watcher._thread.name == "phaseprof-capture"  # as py-spy or a debugger lists it
    for steps in (10, 10, 10, 10, 60):  # the pace over the last five looks
        run.later(1.0, steps)
        run.look()
    assert run.channel().beats[0].step == 200 and run.channel().beats[0].steps_per_s == 22.5
    run.watcher.close()
    assert run.channel().beats[0].ended is True


def test_a_request_is_accepted_traced_on_the_steps_asked_and_answered_written(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    request = run.ask()
    assert request.start == 102  # the margin past step 100 at an unknown pace
    run.look()
    answer = run.answer(request)
    assert (answer.state, answer.first, answer.last, answer.files, answer.reason) == (ACCEPTED, 102, 104, [], None)
    run.run_to(106)
    answer = run.written(request)
    assert (answer.state, answer.first, answer.last, answer.reason) == (WRITTEN, 102, 104, None)
    (name,) = answer.files
    assert steps_in(Path(run.dir) / name) == [102, 103, 104]
    run.watcher.close()
    assert run.answer(request).state == WRITTEN


def test_a_single_process_that_saw_a_request_late_traces_from_its_next_step(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    request = run.ask(steps=5)
    run.later(0.5, 2)  # at step 102 when it looks: too late to warm up
    run.look()
    assert run.answer(request).reason == "5 steps asked, 3 traced: the configured window (active)"
    run.run_to(110)
    answer = run.written(request)
    assert (answer.state, answer.first, answer.last) == (WRITTEN, 104, 106)
    assert answer.reason == ("5 steps asked, 3 traced: the configured window (active); started at step 104, "
                             "not 102: the request was seen late")
    assert steps_in(Path(run.dir) / answer.files[0]) == [104, 105, 106]
    run.watcher.close()


def test_a_rank_of_several_that_cannot_warm_up_in_time_refuses(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, world_size=2)
    seen_late = run.ask()
    run.later(0.5, 1)  # at step 101: the warm-up step of 102 already began
    run.look()
    answer = run.answer(seen_late)
    assert (answer.state, answer.first, answer.last) == (REFUSED, 102, 104)
    assert answer.reason == "missed: rank 0 was at step 101 when it saw the request for step 102; ask again"
    in_time = run.write(start=110)
    run.look()
    assert run.answer(in_time).state == ACCEPTED
    run.prof.step_num = 109  # the loop passed the warm-up step before the capture could begin
    run.run_to(112)
    run.look()
    answer = run.answer(in_time)
    assert (answer.state, answer.files) == (REFUSED, [])
    assert answer.reason == "missed: rank 0 was at step 110 before it could warm up for step 110; ask again"
    run.watcher.close()


def test_requests_are_refused_with_why(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    stale = run.write(start=102, expires_s=600)
    run.later(STALE_REQUEST_S + 1)  # before the next look
    farthest = farthest_start(100, 0.0)
    reachable = run.write(start=farthest, ago=0.3)
    too_far = run.write(start=farthest + 1, ago=0.3)
    first = run.write(start=200, ago=0.2)
    overlapping = run.write(start=203, ago=0.1)  # its warm-up step is the other's last
    after = run.write(start=204)
    run.look()
    assert run.answer(stale).reason == f"stale: seen {STALE_REQUEST_S + 1:.0f} s after it was written"
    assert run.answer(reachable).state == ACCEPTED and run.answer(first).state == ACCEPTED
    assert run.answer(too_far).reason == (f"step {farthest + 1} is too far ahead of step 100 (more than 60 s at "
                                          "this rank's pace and 1000 steps)")
    assert run.answer(overlapping).reason == "another capture is running: steps 200–202"
    assert run.answer(after).state == ACCEPTED
    assert [run.answer(r).state for r in (stale, too_far, overlapping)] == [REFUSED] * 3
    assert run.watcher.plan.start == 200  # the first one due
    run.watcher.close()


def test_a_request_for_steps_the_schedule_profiles_is_refused(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, until=200)
    during = run.write(start=200)
    after = run.write(start=210)
    run.look()
    assert run.answer(during).reason == "the configured schedule is still profiling then (until step 199)"
    assert run.answer(after).state == ACCEPTED
    run.watcher.close()


def test_a_schedule_that_repeats_until_close_refuses_every_request(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, until=None)
    request = run.write(start=150)
    run.look()
    assert run.answer(request).reason == "the configured schedule is still profiling then (repeat=0)"
    run.watcher.close()


def test_requests_of_other_ranks_or_of_an_earlier_process_are_not_answered(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    others = run.write(start=102, ranks=[1, 2])
    earlier = run.write(start=110, ago=1.0)  # before this process started
    mine = run.write(start=120, ranks=[0])
    run.look()
    answers = run.channel().answers
    assert others.id not in answers and earlier.id not in answers
    assert answers[mine.id][0].state == ACCEPTED
    run.watcher.close()


def test_an_unreadable_request_is_ignored_with_one_warning_and_the_others_answered(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    folder = Path(capture_dir(run.dir))
    (folder / "request.0123456789abcdef.json").write_text("{not json")
    (folder / "request.not-a-request.json").write_text("{}")  # not a request's name: not read
    good = run.write(start=110)
    with pytest.warns(RuntimeWarning) as caught:
        run.look()
    (warning,) = [str(w.message) for w in caught]
    assert warning.startswith(f"phaseprof: ignored the capture request {folder / 'request.0123456789abcdef.json'}: ")
    assert run.answer(good).state == ACCEPTED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.look()  # read once: no warning again
    run.watcher.close()


def test_a_link_in_place_of_the_channel_turns_it_off_and_nothing_is_written_through_it(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    request = run.write(start=110)
    folder = Path(capture_dir(run.dir))
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)
    with pytest.warns(RuntimeWarning, match=r"the capture channel is off \(nothing is written there now\)"):
        run.look()
    run.later(1.0, 10)
    run.look()
    run.watcher.close()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["rank0.json", f"request.{request.id}.json"]
    beat = json.loads((elsewhere / "rank0.json").read_text(encoding="utf-8"))
    assert (beat["step"], beat["ended"]) == (100, False)  # never written again


def test_an_accepted_capture_whose_deadline_passes_first_expires_and_the_next_one_waits(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    first = run.write(start=110, expires_s=10)
    second = run.write(start=120, expires_s=60)
    third = run.write(start=130, expires_s=60)
    run.look()
    assert run.watcher.plan.start == 110
    run.later(10)
    run.look()  # at the deadline: still accepted
    assert run.answer(first).state == ACCEPTED
    run.later(1)
    run.look()
    assert run.answer(first).reason == ("expired: step 110 was not reached by the request's deadline, 10 s after it "
                                        "was written")
    assert run.answer(second).state == ACCEPTED and run.watcher.plan.start == 120
    run.run_to(125)  # the second traced, then the third is next
    assert run.watcher.plan.start == 130
    run.watcher.close()
    assert run.answer(second).state == WRITTEN
    assert run.answer(third).reason == "the run ended at step 125, before the capture"
    assert run.channel().beats[0].ended is True


def test_a_capture_whose_profiler_cannot_start_is_refused_and_training_goes_on(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    run.prof._options = {"no_such_option": True}
    request = run.ask()
    run.look()
    with pytest.warns(RuntimeWarning, match="torch.profiler failed to start a capture"):
        run.run_to(106)
    run.look()
    answer = run.answer(request)
    assert answer.state == REFUSED and answer.reason.startswith("torch.profiler failed to start: TypeError: ")
    (line,) = run.prof._faults.summary()
    assert line.startswith("torch.profiler failed to start a capture: TypeError: ")
    run.watcher.close()


def test_a_capture_whose_trace_cannot_be_written_is_refused(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file where the traces' folder should be")
    run = Run(tmp_path, monkeypatch, traces_dir=str(tmp_path / "file" / "run"))
    request = run.ask()
    run.look()
    with pytest.warns(RuntimeWarning, match="could not write traces"):
        run.run_to(106)
    run.look()
    answer = run.answer(request)
    assert (answer.state, answer.files) == (REFUSED, [])
    assert answer.reason == "the trace could not be written (see the profiler's summary)"
    run.watcher.close()


def test_a_run_that_closes_inside_a_capture_answers_the_steps_traced(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    request = run.ask(steps=3)
    run.look()
    profiler = run.run_to(103)  # steps 102 and 103 recorded; the run closes in 103
    profiler.stop()  # as PhaseProfiler.close does
    run.watcher.close()
    answer = run.answer(request)
    assert (answer.state, answer.first, answer.last) == (WRITTEN, 102, 103)
    assert steps_in(Path(run.dir) / answer.files[0]) == [102, 103]


def _steps(stats: PhaseStats, ms: list[float], first: int = 0) -> None:
    for i, value in enumerate(ms):
        stats.add(StepTimes(first + i, 1.0, [0, "forward", int(value * MS / 2), "backward", int(value * MS)]))


def test_recent_steps_are_the_last_rows_every_column_holds():
    stats = PhaseStats()
    _steps(stats, [10.0, 11.0, 12.0], first=5)
    assert recent_steps(stats, 2) == ([6, 7], [11.0, 12.0])
    assert recent_steps(stats, 10) == ([5, 6, 7], [10.0, 11.0, 12.0])
    stats.numbers.append(8)  # the recorder's thread midway through a row
    assert recent_steps(stats, 2) == ([6, 7], [11.0, 12.0])


SLOWDOWN = Slowdown(last=3, reference=10, min_reference=5, captures=2, every_s=5.0)


def test_a_slowdown_past_the_noise_writes_a_request_with_why(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, slowdown=SLOWDOWN)
    stats = run.prof._recorder.stats
    _steps(stats, [10.0] * 20 + [20.0, 20.0, 20.0], first=10)
    run.look()
    (request,) = run.channel().requests
    assert (request.by, request.steps, request.start) == (BY_SLOWDOWN, 3, 102)
    why = request.why
    assert (why.rank, why.steps, why.step_ms, why.median_ms, why.band_ms) == (0, [30, 31, 32], [20.0] * 3,
                                                                              10.0, 0.5)
    run.look()  # read back and accepted; no second one while it is pending
    assert run.answer(request).state == ACCEPTED and len(run.channel().requests) == 1
    run.watcher.close()


def test_no_slowdown_request_for_steady_steps_too_few_steps_or_one_slow_step(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, slowdown=SLOWDOWN)
    stats = run.prof._recorder.stats
    _steps(stats, [10.0] * 7)  # too few: 5 reference steps and 3 judged needed
    run.look()
    _steps(stats, [10.0] * 10, first=7)
    run.look()
    _steps(stats, [10.0, 20.0, 20.0], first=17)  # not all the last steps slow
    run.look()
    assert run.channel().requests == []
    _steps(stats, [20.0], first=20)
    run.look()
    assert len(run.channel().requests) == 1
    run.watcher.close()


def test_steps_just_after_the_configured_schedule_are_not_judged(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, slowdown=SLOWDOWN, until=20)
    stats = run.prof._recorder.stats
    _steps(stats, [10.0] * 17 + [20.0] * 3)  # the slow steps 17..19: profiled, not the run's time
    run.look()
    _steps(stats, [20.0] * 3, first=20)  # 20..22: 20 follows the schedule's last step
    run.look()
    assert run.channel().requests == []
    _steps(stats, [20.0], first=23)
    run.look()
    assert run.channel().requests[0].why.steps == [21, 22, 23]
    run.watcher.close()


def test_slowdown_captures_are_spaced_and_counted(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, slowdown=SLOWDOWN)
    stats = run.prof._recorder.stats
    _steps(stats, [10.0] * 20 + [20.0] * 3)
    run.look()
    (first,) = run.channel().requests
    run.look()
    run.run_to(106)
    assert run.written(first).state == WRITTEN
    _steps(stats, [10.0] * 20 + [20.0] * 3, first=200)
    run.later(4.0)
    run.look()
    assert len(run.channel().requests) == 1  # within `every_s` of the first
    run.later(1.5)
    run.look()
    second = [r for r in run.channel().requests if r.id != first.id]
    assert len(second) == 1 and second[0].why.steps == [220, 221, 222]
    run.look()
    run.run_to(run.answer(second[0]).last + 2)
    assert run.written(second[0]).state == WRITTEN
    _steps(stats, [10.0] * 20 + [20.0] * 3, first=400)
    run.later(10.0)
    run.look()
    assert len(run.channel().requests) == 2  # `captures` taken
    run.watcher.close()


def test_a_slowdown_right_after_a_capture_is_not_judged_on_the_steps_it_traced(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, slowdown=SLOWDOWN)
    request = run.ask()
    run.look()
    run.run_to(106)
    assert run.written(request).last == 104
    stats = run.prof._recorder.stats
    _steps(stats, [10.0] * 20 + [20.0] * 3, first=84)  # slow: 104..106, the last one traced first
    run.look()
    _steps(stats, [20.0], first=107)  # 105..107: 105 follows the capture's last step
    run.look()
    assert [r.id for r in run.channel().requests] == [request.id]
    _steps(stats, [20.0], first=108)
    run.look()
    (slowdown,) = [r for r in run.channel().requests if r.id != request.id]
    assert slowdown.why.steps == [106, 107, 108]
    run.watcher.close()


class Later(Background):
    """The background as it runs: each trace compressed into place only when close waits for it
    (``fail``: the compression fails, the export is lost)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail_later = fail

    def compress(self, exported: str) -> str:
        self.compressed.append(exported)
        return compressed_name(exported)

    def wait_for_traces(self) -> None:
        for exported in self.compressed:
            if self.fail_later:
                os.remove(exported)
            else:
                compress_into_place(exported)


def test_a_capture_still_compressing_at_close_is_answered_written_once_in_place(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, background=Later())
    request = run.ask()
    run.look()
    run.run_to(106)
    run.look()
    assert run.answer(request).state == TRACING  # the export not compressed yet
    run.watcher.close()
    answer = run.answer(request)
    assert answer.state == WRITTEN and answer.files[0].endswith(".pt.trace.json.gz")
    assert (Path(run.dir) / answer.files[0]).is_file()


def test_a_capture_whose_compression_failed_is_refused_at_close(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch, background=Later(fail=True))
    request = run.ask()
    run.look()
    run.run_to(106)
    run.watcher.close()
    answer = run.answer(request)
    assert (answer.state, answer.reason) == (REFUSED, "the trace could not be compressed (see the summary)")


def test_a_channel_whose_writes_fail_is_reported_and_training_goes_on(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)

    def write(folder, name, data):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(DiskFolder, "write", write)
    with pytest.warns(RuntimeWarning, match="the capture channel failed"):
        run.look()
    run.watcher.close()
    assert run.prof._faults.summary() == ["the capture channel failed: OSError: [Errno 5] Input/output error "
                                          "(2 times)"]  # the look's, then close's


def test_a_store_outage_is_one_line_that_leaves_the_summary_once_the_store_answers(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    request = run.write(start=110)
    written = DiskFolder.write

    def down(folder, name, data):
        raise StoreError("PUT failed", ConnectionError("connection refused"))

    monkeypatch.setattr(DiskFolder, "write", down)
    run.look()
    run.look()
    folder = capture_dir(run.dir)
    assert run.prof._faults.summary() == [
        f"the capture channel in {folder} failed (the store does not answer); captures are seen once it "
        "answers: StoreError: ConnectionError: connection refused"]
    assert request.id not in run.channel().answers  # waits in the store for the next look
    monkeypatch.setattr(DiskFolder, "write", written)
    run.watcher.close()  # one more look: the store answers
    assert run.prof._faults.summary() == []
    assert run.answer(request).reason == "the run ended at step 100, before the capture"
    assert run.channel().beats[0].ended is True


def test_a_store_still_down_at_close_leaves_its_line_and_writes_nothing(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)

    def down(folder, name, data):
        raise StoreError("PUT failed", PermissionError("denied"))

    monkeypatch.setattr(DiskFolder, "write", down)
    run.look()
    run.watcher.close()
    (line,) = run.prof._faults.summary()
    assert "(the store denies writing there)" in line
    assert run.channel().beats[0].ended is False

"""Traces of any step of a long run: the training side of the capture channel
(`phaseprof.capture_channel`).

A daemon thread (`CaptureWatcher`) wakes every `BEAT_S` seconds (`capture_store.poll_s()`, 3 s by
default, for a run in an object store, whose channel is objects there), off the loop: it
republishes this rank's heartbeat (its step, its pace, its interval between looks), reads new
requests under ``<run>/.phaseprof/capture/``,
accepts or refuses each (answering in the run), refuses accepted ones whose deadline passed before
their start, and, with ``capture_on_slowdown``, judges the last steps against the run's own noise
and writes a request itself. Each look reaches the folder afresh without following a link
(`channel_folder`): a link found there, at start or later, turns the channel off with one warning
(training goes on, traced as scheduled), and nothing is written through it. The loop thread pays
one attribute test per step (`CaptureWatcher.plan` is None while nothing is accepted); at the step
before an accepted capture it starts a ``torch.profiler.profile`` of its own (`begin`), whose
schedule warms up for one step and records the captured steps, numbered as the run numbers them,
into one trace written like the configured window's (and analysed in the background like it). A
capture never traces more steps than the configured ``active``, and never while the configured
schedule is still profiling.
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import torch
from torch.profiler import ProfilerAction

from phaseprof.capture_channel import (
    ACCEPTED,
    BEAT_S,
    BY_SLOWDOWN,
    FINAL,
    MAX_AHEAD_S,
    MAX_STEPS,
    MAX_TEXT,
    REFUSED,
    REQUEST_RE,
    STALE_REQUEST_S,
    TRACING,
    WRITTEN,
    Answer,
    Heartbeat,
    NotAFolder,
    Request,
    Unreadable,
    Why,
    answer_name,
    beat_name,
    capture_dir,
    check_request,
    decode,
    farthest_start,
    is_remote,
    open_folder,
    plan_request,
    write_request,
)
from phaseprof.capture_store import StoreError, poll_s
from phaseprof.noise import noise

from .upload import WHY, one_line, refusal

#: The longest close() waits for the watcher's last look (held by a store that does not answer).
CLOSE_S = 5.0

if TYPE_CHECKING:
    from .profiler import PhaseProfiler
    from .recorder import PhaseStats


@dataclass(frozen=True)
class Slowdown:
    """When ``capture_on_slowdown`` traces by itself: the ``last`` steps all stand above the noise
    band (`phaseprof.noise`, the reports' rule) of the ``reference`` steps before them (judged
    once ``min_reference`` are in); at most ``captures`` per run, at most one per ``every_s``
    seconds; each traces ``steps`` steps (default: the configured ``active``)."""

    last: int = 8
    reference: int = 200
    min_reference: int = 20
    captures: int = 3
    every_s: float = 600.0
    steps: int | None = None


@dataclass(eq=False)
class Plan:
    """An accepted request on this rank: trace steps ``start`` .. ``end - 1``."""

    request: Request
    start: int
    end: int
    state: str = ACCEPTED
    files: tuple[str, ...] = ()
    reason: str | None = None
    answered: str | None = None  # the state last written to the answer file
    began: bool = False  # its profiler started: its steps were profiled

    def action(self, step: int) -> ProfilerAction:
        """The capture's schedule, on the run's step numbers: warm up before, record, save at the last."""
        if step < self.start:
            return ProfilerAction.WARMUP
        if step < self.end - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE if step == self.end - 1 else ProfilerAction.NONE


class CaptureWatcher:
    """This rank's side of the capture channel, for one running PhaseProfiler."""

    def __init__(self, prof: PhaseProfiler, world_size: int, slowdown: Slowdown | None) -> None:
        self._prof = prof
        self.rank = prof._rank
        self.world_size = world_size
        self.run_dir = prof.run_dir
        self.folder = capture_dir(prof.run_dir)  # for messages: every look opens it afresh
        #: The run is in a store: its channel is objects there (`phaseprof.capture_store`), looked at
        #: every `poll_s()`; the first look is the thread's (the loop never waits for the store).
        self.remote = is_remote(prof.run_dir)
        #: Seconds between two looks (each heartbeat says it: the asker's lead covers it).
        self.look_s = poll_s() if self.remote else BEAT_S
        self._down: str | None = None  # while the store fails: its fault's line
        self._outages: list[str] = []  # the lines of outages that ended: withdrawn on close
        self.started = time.time()
        s = prof._schedule
        self.active = s["active"]
        self.schedule_until = prof._profile_until
        self.slowdown = slowdown
        #: The next accepted capture, for the loop thread; None while nothing is accepted.
        self.plan: Plan | None = None
        self._plans: list[Plan] = []
        self._seen: set[str] = set()
        self._paces: collections.deque[tuple[float, int]] = collections.deque(maxlen=5)
        self._pace = 0.0  # steps per second, as the last heartbeat said
        self._slowdowns: dict[str, float] = {}  # slowdown captures of this run: when each was asked
        self._lock = threading.Lock()  # one tick at a time (the thread's, close's last one)
        # a plan leaves ACCEPTED once: for the loop (tracing, missed) or the watcher (expired)
        self._states = threading.Lock()
        self._stop = threading.Event()
        self._compressions: list[threading.Thread] = []  # one `_written_once_in_place` a capture
        self._off = False  # a link was found on the way to the folder: nothing more is written
        if not self.remote:
            os.makedirs(self.run_dir, exist_ok=True)
            with open_folder(self.run_dir, create=True) as folder:  # NotAFolder: a link
                self._beat(folder)
        self._thread = threading.Thread(target=self._run, name="phaseprof-capture", daemon=True)
        self._thread.start()

    # -- the loop thread ----------------------------------------------------------------------------

    def begin(self, prof: PhaseProfiler) -> torch.profiler.profile | None:
        """At a step boundary, with no profiler running: the profiler of the next capture if its
        warm-up step is the step beginning now. Never raises."""
        plan = self.plan
        step = prof.step_num
        if plan is None or step < plan.start - 1:
            return None
        with self._states:
            self.plan = self._next_plan(after=plan)
            if plan.state != ACCEPTED:
                return None  # expired meanwhile
            plan.state = TRACING
        if step > plan.start - 1:
            if self.world_size > 1:
                plan.state, plan.reason = REFUSED, (f"missed: rank {self.rank} was at step {step} before it could "
                                                    f"warm up for step {plan.start}; ask again")
                return None
            late = f"started at step {step + 1}, not {plan.start}: the request was seen late"
            plan.reason = late if plan.reason is None else f"{plan.reason}; {late}"  # both facts stand
            plan.end += step + 1 - plan.start
            plan.start = step + 1
        written = len(prof._traces.written)

        def trace_ready(p: torch.profiler.profile) -> None:
            prof._traces(p)
            paths = prof._traces.written[written:]
            plan.files = tuple(os.path.basename(f) for f in paths)
            plan.end = min(plan.end, prof.step_num + 1)  # shorter if the run closed inside it
            if not plan.files:
                plan.state = REFUSED
                plan.reason = "the trace could not be written (see the profiler's summary)"
                return
            # The answer says "written" once the files are in place. The loop waits only for torch's
            # export, as for a scheduled window: the background gzip is awaited on a thread of its
            # own, and `close` waits for it.
            waiter = threading.Thread(target=self._written_once_in_place, args=(plan, paths),
                                      name="phaseprof-capture-gzip", daemon=True)
            self._compressions.append(waiter)
            waiter.start()

        try:
            profiler = torch.profiler.profile(schedule=plan.action, on_trace_ready=trace_ready, **prof._options)
            profiler.step_num = step  # ProfilerStep#<n> carries the run's step numbers
            profiler.start()
        except Exception as e:  # noqa: BLE001 - no trace, but training goes on
            plan.state, plan.reason = REFUSED, f"torch.profiler failed to start: {type(e).__name__}: {e}"
            prof._faults.report("torch.profiler failed to start a capture", e)
            return None
        plan.began = True
        prof._profile_until = plan.end
        return profiler

    # -- the watcher thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        if self.remote:
            self.tick()
        while not self._stop.wait(self.look_s):
            self.tick()

    def tick(self) -> None:
        """One look: heartbeat, new requests, answers, the slowdown rule. Never raises."""
        with self._lock:
            if self._off:
                return
            try:
                with open_folder(self.run_dir) as folder:
                    self._beat(folder)
                    self._read_requests(folder)
                    self._expire()
                    self._answer_all(folder)
                if self.slowdown is not None:
                    self._judge_slowdown(self.slowdown)
            except StoreError as e:
                self._store_failed(e)
                return
            except FileNotFoundError:  # (a folder swapped away for a moment: the next look tells)
                if not os.path.isdir(self.run_dir):
                    self._stop.set()  # the run's folder was removed (a test's, a cleanup): stop watching
            except NotAFolder as e:
                self._link_found(e)
            except Exception as e:  # noqa: BLE001 - the channel is down, training goes on
                self._prof._faults.report("the capture channel failed", e)
            if self._down is not None:  # the store answered: a later failure is another outage
                self._outages.append(self._down)  # (its line stays until close, then goes)
                self._down = None

    def _store_failed(self, e: StoreError) -> None:
        """The store failed a call: the first failure of an outage is one line of the summary, the
        next ones of it none; requests wait in the store for the next look. Never the run's
        warning: the run's files go to the same store, and the uploads' warning of its outage says
        more (where the files are kept meanwhile)."""
        if self._down is None:
            why = WHY[refusal(e.cause)]
            self._down = self._prof._faults.report(
                f"the capture channel in {self.folder} failed ({why}); captures are seen once it "
                "answers", StoreError(one_line(e.cause), e.cause), warn=False)

    def _link_found(self, e: NotAFolder) -> None:
        """A link (or a file) in a channel folder's place: never followed, nothing more written."""
        self._off = True
        self._stop.set()
        self._prof._faults.report("the capture channel is off (nothing is written there now)", e)

    def _written_once_in_place(self, plan: Plan, paths: list[str]) -> None:
        """``plan`` is written once its trace files are in place (gzipped in the background);
        if the run closes first, `close` settles it."""
        while not all(os.path.isfile(path) for path in paths):
            if self._stop.wait(0.05):
                return
        plan.state = WRITTEN

    def _settle_compressions(self) -> None:
        """At close: every capture's trace in place (its gzip awaited, as close awaits every
        trace's), then its answer: written, or refused if the gzip failed."""
        if not self._compressions:
            return
        for waiter in self._compressions:
            waiter.join()
        self._prof._traces.background.wait_for_traces()
        for plan in self._plans:
            if plan.state == TRACING and plan.files:
                paths = [os.path.join(self._prof._traces.run_dir, name) for name in plan.files]
                if all(os.path.isfile(path) for path in paths):
                    plan.state = WRITTEN
                else:
                    plan.state = REFUSED
                    plan.reason = "the trace could not be compressed (see the summary)"

    def close(self) -> None:
        """The run ends: captures still compressing are awaited, those not written are refused,
        the heartbeat says it ended. A look held by a store that does not answer is not waited for
        beyond `CLOSE_S` in all (a store that failed the last look gets one more in that time; while
        it fails nothing else is written: the heartbeat then goes stale, which says the same). The
        lines of the store's outages that ended leave the summary: nothing was lost."""
        self.plan = None
        self._stop.set()
        self._settle_compressions()
        deadline = time.monotonic() + CLOSE_S
        self._thread.join(timeout=CLOSE_S)
        if self._down is not None and not self._off:  # one more look, in the time left: the store
            look = threading.Thread(target=self.tick, name="phaseprof-capture-last", daemon=True)
            look.start()  # may be back, and its outage line then leaves the summary
            look.join(timeout=max(0.0, deadline - time.monotonic()))
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            self._close()
        finally:
            self._lock.release()
        for line in set(self._outages) - {self._down}:  # ended, nothing lost: not in the summary
            self._prof._faults.withdraw(line)

    def _close(self) -> None:
        step = self._prof.step_num
        for plan in self._plans:
            if plan.state not in FINAL:
                plan.state, plan.reason = REFUSED, f"the run ended at step {step}, before the capture"
        if self._off or self._down is not None:
            return
        try:
            with open_folder(self.run_dir) as folder:
                self._answer_all(folder)
                self._beat(folder, ended=True)
        except StoreError as e:
            self._store_failed(e)
        except NotAFolder as e:
            self._link_found(e)
        except Exception as e:  # noqa: BLE001
            self._prof._faults.report("the capture channel failed", e)

    def _beat(self, folder, ended: bool = False) -> None:
        now, step = time.time(), self._prof.step_num
        self._paces.append((now, step))
        (t0, s0), (t1, s1) = self._paces[0], self._paces[-1]
        self._pace = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
        beat = Heartbeat(rank=self.rank, world_size=self.world_size, step=step, time=now,
                         steps_per_s=self._pace, active=self.active,
                         schedule_until=self.schedule_until, started=self.started, ended=ended,
                         look_s=self.look_s)
        folder.write(beat_name(self.rank), msgspec.json.encode(beat))

    def _read_requests(self, folder) -> None:
        """Read the requests not seen yet: one listing, then one read each (a store failing midway:
        all of them are read again at the next look)."""
        names = [n for n in folder.names("request.") if n not in self._seen and REQUEST_RE.match(n)]
        requests = []
        now = time.time()
        for name in names:
            try:
                request = decode(folder.read(name), Request)
                requests.append(check_request(request, REQUEST_RE.match(name)["id"], now))
            except Unreadable as e:
                warnings.warn(f"phaseprof: ignored the capture request {folder.where(name)}: {e}",
                              RuntimeWarning, stacklevel=1)
        self._seen.update(names)
        for request in sorted(requests, key=lambda r: (r.written, r.id)):
            self._consider(request)

    def _consider(self, request: Request) -> None:
        if request.by == BY_SLOWDOWN and request.written >= self.started:
            self._slowdowns[request.id] = request.written
        if request.written < self.started or (request.ranks is not None and self.rank not in request.ranks):
            return  # asked of an earlier process of this run, or of other ranks
        plan = Plan(request, request.start, request.start + min(request.steps, self.active))
        self._plans.append(plan)
        if request.steps > self.active:
            plan.reason = f"{request.steps} steps asked, {self.active} traced: the configured window (active)"
        step = self._prof.step_num
        age = time.time() - request.written
        busy = [p for p in self._plans if p is not plan and p.state != REFUSED
                and p.start - 1 < plan.end and plan.start - 1 < p.end]
        if age > STALE_REQUEST_S:
            plan.state, plan.reason = REFUSED, f"stale: seen {age:.0f} s after it was written"
        elif plan.start > farthest_start(step, self._pace):
            plan.state, plan.reason = REFUSED, (
                f"step {plan.start} is too far ahead of step {step} (more than "
                f"{MAX_AHEAD_S:.0f} s at this rank's pace and {MAX_STEPS} steps)")
        elif busy:
            plan.state, plan.reason = REFUSED, (f"another capture is running: steps {busy[0].start}–"
                                                f"{busy[0].end - 1}")
        elif self.schedule_until is None or plan.start <= self.schedule_until:
            plan.state, plan.reason = REFUSED, ("the configured schedule is still profiling then"
                                                + (f" (until step {self.schedule_until - 1})" if self.schedule_until
                                                   else " (repeat=0)"))
        elif plan.start - 1 <= step and self.world_size > 1:
            plan.state, plan.reason = REFUSED, (f"missed: rank {self.rank} was at step {step} when it saw the "
                                                f"request for step {plan.start}; ask again")
        else:
            with self._states:
                if self.plan is None or plan.start < self.plan.start:
                    self.plan = plan  # a single process late for it starts at its next step

    def _expire(self) -> None:
        """Refuse the accepted captures whose deadline passed before they began: none blocks others
        for longer than its request's own window."""
        now = time.time()
        for plan in self._plans:
            deadline = plan.request.deadline()
            if plan.state != ACCEPTED or now <= deadline:
                continue
            with self._states:
                if plan.state != ACCEPTED:
                    continue  # the loop began it meanwhile
                waited = deadline - plan.request.written
                plan.state, plan.reason = REFUSED, (
                    f"expired: step {plan.start} was not reached by the request's deadline, "
                    f"{waited:.0f} s after it was written")
                if self.plan is plan:
                    self.plan = self._next_plan(after=plan)

    def _next_plan(self, after: Plan) -> Plan | None:
        waiting = [p for p in self._plans if p is not after and p.state == ACCEPTED and p.start > after.start]
        return min(waiting, key=lambda p: p.start, default=None)

    def _answer_all(self, folder) -> None:
        for plan in self._plans:
            if plan.answered != plan.state:
                state = plan.state
                last = plan.end - 1 if plan.end > plan.start else None
                reason = None if plan.reason is None else plan.reason[:MAX_TEXT]
                answer = Answer(id=plan.request.id, rank=self.rank, state=state, updated=time.time(),
                                first=plan.start if last is not None else None, last=last,
                                files=list(plan.files), reason=reason)
                folder.write(answer_name(plan.request.id, self.rank), msgspec.json.encode(answer))
                plan.answered = state

    def _judge_slowdown(self, rule: Slowdown) -> None:
        now = time.time()
        taken = self._slowdowns.values()
        if len(taken) >= rule.captures or (taken and now - max(taken) < rule.every_s):
            return
        if any(p.state not in FINAL for p in self._plans):
            return
        numbers, times = recent_steps(self._prof._recorder.stats, rule.reference + rule.last)
        if len(times) < rule.min_reference + rule.last:
            return
        traced = [p.end - 1 for p in self._plans if p.began]
        last_traced = max(traced + [(self.schedule_until or 0) - 1])
        if numbers[-rule.last] <= last_traced + 1:
            return  # the steps judged (or the one after a trace) were profiled: their time is not the run's
        band = noise(times[:-rule.last])
        tail = times[-rule.last:]
        if not all(band.slow(t) for t in tail):
            return
        why = Why(rank=self.rank, steps=numbers[-rule.last:], step_ms=[round(t, 3) for t in tail],
                  median_ms=round(band.median, 3), band_ms=round(band.band, 3))
        try:
            request = plan_request(self._prof.run_dir, steps=min(rule.steps or self.active, self.active),
                                   by=BY_SLOWDOWN, why=why)
        except ValueError:
            return  # another capture is pending, or the run is ending
        write_request(self._prof.run_dir, request)  # read back, and accepted, by the next look
        self._slowdowns[request.id] = request.written


def recent_steps(stats: PhaseStats, count: int) -> tuple[list[int], list[float]]:
    """The last ``count`` training steps the recorder tallied: their numbers and host ms. Read from
    the watcher thread while the recorder's thread appends: only rows every column already holds."""
    numbers = stats.numbers
    columns = list(stats.cpu.values())
    rows = min([len(numbers)] + [len(c) for c in columns])
    lo = max(0, rows - count)
    return numbers[lo:rows].tolist(), [math.fsum(c[i] for c in columns) for i in range(lo, rows)]


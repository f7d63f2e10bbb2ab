"""One step of a trace as a Chrome-trace document that chrome://tracing and Perfetto open, and the tab
draws: the step's host events on their threads, its device work on its streams, a flow arrow from
each launch to the work it launched, and the step's phases on a lane of their own.

"The step" is its host window [start, end): host events that start inside it, and the device work
launched inside it (which may run after the window ends: the CPU runs ahead). Time in the window kept
out of the step (an evaluation pass, ``prof.paused()``) is shown as such: on the phase lane under its
own name, and its events marked ``apart`` rather than with a phase.

Two stages, so that a step can be served without decoding its trace again: `StepCutter` cuts every
step's events out of a decoded trace as columns (`StepCut`, with the trace's string tables in
`StepTables`), and `document` turns one step's columns into the document. The step index
(`plugin/step_index.py`) keeps the columns of every step beside the analysis; a full read cuts the
one step asked for. Both go through `document`, so both give the same document.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from phaseprof.contract import OUT_OF_STEP

from ..answers import StepTrace, StepTraceInfo, TraceEvent
from ..reading.events import ANNOTATION, KERNEL, MEMCPY, OP, RUNTIME, Thread, Trace
from .nesting import Nesting, nest
from .partition import Partition, partition
from .span import launches
from .stacks import op_paths, stack, user_frame

#: Event categories as today's traces write them.
_HOST_CATEGORY = {OP: "cpu_op", ANNOTATION: "user_annotation", RUNTIME: "cuda_runtime"}
_DEVICE_CATEGORY = {KERNEL: "kernel", MEMCPY: "gpu_memcpy"}
_PHASE_LANE = "Step phases"
#: An event's label code (`StepCut.host_label`, `dev_label`): a phase code (>= 0), no label, or
#: ``APART - k`` for time kept out of the step of kind ``OUT_OF_STEP[k]``.
NO_LABEL, APART = -1, -2


def apart_label(kind: str) -> str:
    """How the phase lane names time kept out of the step."""
    return f"{kind} (outside the step)"


class StepTables(msgspec.Struct):
    """What the cuts of one trace's steps index into: its strings, threads and phases."""

    names: list[str]
    shapes: list[str]
    threads: list[Thread]
    phases: list[str]
    main_thread: int  # thread code of the loop's thread, -1 when the trace has no thread
    phase_tid: int  # the phase lane's thread id in the loop's process


class StepCut(msgspec.Struct):
    """One step's events as columns: host events in (thread, start, longest-first) order, device work
    in file order with the runtime call that launched it, and the phase lane's segments."""

    number: int
    start: float
    end: float
    inferred: list[str]  # phases of the step that were inferred
    host_ts: np.ndarray  # float64 µs
    host_dur: np.ndarray
    host_thread: np.ndarray  # int32 codes into StepTables.threads
    host_name: np.ndarray  # int32 codes into StepTables.names
    host_kind: np.ndarray  # int8
    host_shapes: np.ndarray  # int32 codes into StepTables.shapes (0: none)
    host_corr: np.ndarray  # int64
    host_label: np.ndarray  # int32 (NO_LABEL, a phase code, or APART - kind)
    host_stack: np.ndarray  # int32 index into `stacks` (-1: no Python frame covers the event)
    dev_ts: np.ndarray
    dev_dur: np.ndarray
    dev_device: np.ndarray  # int32
    dev_stream: np.ndarray  # int64
    dev_name: np.ndarray  # int32
    dev_kind: np.ndarray  # int8
    dev_corr: np.ndarray  # int64
    dev_label: np.ndarray  # int32 (a phase code, or APART - kind)
    dev_owner: np.ndarray  # int32 name code of the launching op, -1 unknown
    launch_thread: np.ndarray  # int32 thread code of the launching runtime call
    launch_ts: np.ndarray  # float64 its start
    seg_start: np.ndarray  # the phase lane: the step's phase segments
    seg_end: np.ndarray
    seg_phase: np.ndarray  # int32 phase codes
    out_start: np.ndarray  # time kept out of the step
    out_end: np.ndarray
    out_kind: np.ndarray  # int32 index into OUT_OF_STEP
    stacks: list[list[str]]  # with_stack: the step's distinct Python call stacks, innermost frame first


class StepCutter:
    """Cuts steps out of one decoded trace; what all steps share is computed once."""

    def __init__(self, trace: Trace, n: Nesting | None = None, part: Partition | None = None):
        self.n = n = n if n is not None else nest(trace.host)
        self.part = part = part if part is not None else partition(trace, n)
        self.trace = trace
        main = part.main_thread if trace.threads else -1
        self.tables = StepTables(names=trace.names, shapes=trace.shapes, threads=trace.threads, phases=part.phases,
                                 main_thread=main,
                                 phase_tid=_free_tid(trace.threads[main].pid, trace.threads) if main >= 0 else 0)
        self._by_ts = np.argsort(n.ts, kind="stable")
        self._sorted_ts = n.ts[self._by_ts]
        _, self._host_phase = part.locate(n.ts)
        self._host_out_step, self._host_out = part.locate_apart(n.ts)
        self._dur = n.end - n.ts
        self._launch = launch = launches(trace, n)
        self._dev_step, self._dev_phase = part.locate(launch.ts)
        self._dev_out_step, self._dev_out = part.locate_apart(launch.ts)
        self._owner = launch.op_name(n)
        self._paths, self._op_stack = op_paths(trace.python, n)  # with_stack: each event's call path

    def find(self, number: int) -> int | None:
        """The index of the first step numbered ``number``, None if there is none."""
        return next((i for i, s in enumerate(self.part.steps) if s.number == number), None)

    def cut(self, index: int) -> StepCut:
        """The columns of step ``index`` (an index into the partition's steps)."""
        n, part, trace = self.n, self.part, self.trace
        step = part.steps[index]
        lo, hi = np.searchsorted(self._sorted_ts, [step.start, step.end], side="left")
        host = np.sort(self._by_ts[lo:hi])
        out_here = self._host_out_step[host] == index
        phase = self._host_phase[host]
        host_label = np.where(phase >= 0, phase, np.where(out_here, APART - self._host_out[host], NO_LABEL))
        in_step = self._dev_step == index
        device = np.flatnonzero(in_step | (self._dev_out_step == index))
        dev_label = np.where(in_step[device], self._dev_phase[device], APART - self._dev_out[device])
        call = self._launch.runtime[device]
        dev = trace.device
        seg = np.flatnonzero(part.step == index)
        out = np.flatnonzero(part.apart_step == index)
        nodes = self._op_stack[host]
        distinct, host_stack = np.unique(nodes, return_inverse=True)
        if len(distinct) and distinct[0] < 0:  # events no frame covers
            host_stack = host_stack - 1
            distinct = distinct[1:]
        return StepCut(
            number=step.number, start=step.start, end=step.end, inferred=sorted(step.inferred),
            host_ts=n.ts[host], host_dur=self._dur[host], host_thread=n.thread[host].astype(np.int32),
            host_name=n.name[host].astype(np.int32), host_kind=n.kind[host].astype(np.int8),
            host_shapes=n.shapes[host].astype(np.int32), host_corr=trace.host.corr[n.order[host]].astype(np.int64),
            host_label=host_label.astype(np.int32), host_stack=host_stack.astype(np.int32).reshape(-1),
            dev_ts=dev.ts[device], dev_dur=dev.dur[device], dev_device=dev.device[device].astype(np.int32),
            dev_stream=dev.stream[device].astype(np.int64), dev_name=dev.name[device].astype(np.int32),
            dev_kind=dev.kind[device].astype(np.int8), dev_corr=dev.corr[device].astype(np.int64),
            dev_label=dev_label.astype(np.int32), dev_owner=self._owner[device].astype(np.int32),
            launch_thread=n.thread[call].astype(np.int32), launch_ts=n.ts[call],
            seg_start=part.start[seg], seg_end=part.end[seg], seg_phase=part.phase[seg].astype(np.int32),
            out_start=part.apart_start[out], out_end=part.apart_end[out],
            out_kind=part.apart_kind[out].astype(np.int32),
            stacks=[stack(self._paths, trace.names, int(node)) for node in distinct.tolist()])


def step_trace(trace: Trace, number: int) -> StepTrace | None:
    """The document of step ``number`` of ``trace`` (its first step of that number); None if absent."""
    cutter = StepCutter(trace)
    index = cutter.find(number)
    return None if index is None else document(cutter.tables, cutter.cut(index))


def document(tables: StepTables, cut: StepCut) -> StepTrace:
    """The Chrome-trace document of one step from its columns."""
    phases, names, threads = tables.phases, tables.names, tables.threads

    def label(code: int) -> dict[str, Any]:
        if code >= 0:
            return {"phase": phases[code]}
        return {"apart": OUT_OF_STEP[APART - code]} if code <= APART else {}

    events: list[TraceEvent] = []
    for t in sorted(set(cut.host_thread.tolist())):
        events.append(TraceEvent(ph="M", name="thread_name", pid=threads[t].pid, tid=threads[t].tid,
                                 args={"name": threads[t].label}))
    for ts, dur, th, name, kind, shapes, corr, code, at in zip(
            cut.host_ts.tolist(), cut.host_dur.tolist(), cut.host_thread.tolist(), cut.host_name.tolist(),
            cut.host_kind.tolist(), cut.host_shapes.tolist(), cut.host_corr.tolist(), cut.host_label.tolist(),
            cut.host_stack.tolist()):
        t = threads[th]
        args = label(code)
        if shapes > 0 and tables.shapes[shapes]:
            args["Input Dims"] = msgspec.Raw(tables.shapes[shapes].encode())
        if kind == RUNTIME:
            args["correlation"] = corr
        if at >= 0:
            args["stack"] = cut.stacks[at]
            args["frame"] = user_frame(cut.stacks[at])
        events.append(TraceEvent(ph="X", name=names[name], cat=_HOST_CATEGORY[kind], pid=t.pid, tid=t.tid,
                                 ts=ts, dur=dur, args=args))

    streams = sorted(set(zip(cut.dev_device.tolist(), cut.dev_stream.tolist())))
    for d in sorted({d for d, _ in streams}):
        events.append(TraceEvent(ph="M", name="process_name", pid=d, tid=0, args={"name": f"GPU {d}"}))
        events.append(TraceEvent(ph="M", name="process_sort_index", pid=d, tid=0, args={"sort_index": 1_000_000 + d}))
    for d, s in streams:
        events.append(TraceEvent(ph="M", name="thread_name", pid=d, tid=s, args={"name": f"stream {s}"}))
    for ts, dur, d, s, name, kind, corr, code, owner, th, call_ts in zip(
            cut.dev_ts.tolist(), cut.dev_dur.tolist(), cut.dev_device.tolist(), cut.dev_stream.tolist(),
            cut.dev_name.tolist(), cut.dev_kind.tolist(), cut.dev_corr.tolist(), cut.dev_label.tolist(),
            cut.dev_owner.tolist(), cut.launch_thread.tolist(), cut.launch_ts.tolist()):
        args = label(code)
        args.update({"correlation": corr, "device": d, "stream": s})
        if owner >= 0:
            args["launched by"] = names[owner]
        events.append(TraceEvent(ph="X", name=names[name], cat=_DEVICE_CATEGORY.get(kind, "gpu_memset"), pid=d,
                                 tid=s, ts=ts, dur=dur, args=args))
        t = threads[th]
        events.append(TraceEvent(ph="s", name="launch", cat="ac2g", id=corr, pid=t.pid, tid=t.tid, ts=call_ts))
        events.append(TraceEvent(ph="f", name="launch", cat="ac2g", id=corr, bp="e", pid=d, tid=s, ts=ts))

    if tables.main_thread >= 0:
        main, lane = threads[tables.main_thread], tables.phase_tid
        events.append(TraceEvent(ph="M", name="thread_name", pid=main.pid, tid=lane, args={"name": _PHASE_LANE}))
        events.append(TraceEvent(ph="M", name="thread_sort_index", pid=main.pid, tid=lane, args={"sort_index": -1}))
        inferred = set(cut.inferred)
        for a, b, p in zip(cut.seg_start.tolist(), cut.seg_end.tolist(), cut.seg_phase.tolist()):
            events.append(TraceEvent(ph="X", name=phases[p], cat="phase", pid=main.pid, tid=lane, ts=a, dur=b - a,
                                     args={"phase": phases[p], "inferred": phases[p] in inferred}))
        for a, b, k in zip(cut.out_start.tolist(), cut.out_end.tolist(), cut.out_kind.tolist()):
            kind = OUT_OF_STEP[k]
            events.append(TraceEvent(ph="X", name=apart_label(kind), cat="apart", pid=main.pid, tid=lane, ts=a,
                                     dur=b - a, args={"apart": kind}))
    info = StepTraceInfo(step=cut.number, start_us=cut.start, end_us=cut.end, phases=phases,
                         host_events=len(cut.host_ts), device_events=len(cut.dev_ts))
    return StepTrace(traceEvents=events, otherData=info)


def _free_tid(pid: int | str, threads) -> int:
    """A thread id no thread of process ``pid`` uses, for the phase lane."""
    used = {t.tid for t in threads if t.pid == pid}
    tid = 0
    while tid in used:
        tid -= 1
    return tid

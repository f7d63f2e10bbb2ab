"""One step of a trace as a Chrome-trace document that chrome://tracing and Perfetto open, and the tab
draws: the step's host events on their threads, its device work on its streams, a flow arrow from
each launch to the work it launched, and the step's phases on a lane of their own.

"The step" is its host window [start, end): host events that start inside it, and the device work
launched inside it (which may run after the window ends: the CPU runs ahead). Time in the window kept
out of the step (an evaluation pass, ``prof.paused()``) is shown as such: on the phase lane under its
own name, and its events marked ``outside`` rather than with a phase. Built on demand from a decoded
trace, since a span's analysis keeps figures, not events.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from phaseprof.contract import OUT_OF_STEP

from ..answers import StepTrace, StepTraceInfo, TraceEvent
from ..reading.events import ANNOTATION, KERNEL, MEMCPY, OP, RUNTIME, Trace
from .nesting import nest
from .partition import partition
from .span import launches
from .stacks import op_paths, stack, user_frame

#: Event categories as today's traces write them.
_HOST_CATEGORY = {OP: "cpu_op", ANNOTATION: "user_annotation", RUNTIME: "cuda_runtime"}
_DEVICE_CATEGORY = {KERNEL: "kernel", MEMCPY: "gpu_memcpy"}
_PHASE_LANE = "Step phases"


def outside_label(kind: str) -> str:
    """How the phase lane names time kept out of the step."""
    return f"{kind} (outside the step)"


def step_trace(trace: Trace, number: int) -> StepTrace | None:
    """The document of step ``number`` of ``trace`` (its first step of that number); None if absent."""
    n = nest(trace.host)
    part = partition(trace, n)
    index = next((i for i, s in enumerate(part.steps) if s.number == number), None)
    if index is None:
        return None
    step = part.steps[index]
    a, b = step.start, step.end
    phases = part.phases
    events: list[TraceEvent] = []

    host = np.flatnonzero((n.ts >= a) & (n.ts < b))
    _, host_phase = part.locate(n.ts[host])
    host_out_step, host_out = part.locate_outside(n.ts[host])
    threads = trace.threads
    used_threads = sorted(set(n.thread[host].tolist()))
    main = threads[part.main_thread] if threads else None
    for t in used_threads:
        events.append(TraceEvent(ph="M", name="thread_name", pid=threads[t].pid, tid=threads[t].tid,
                                 args={"name": threads[t].label}))
    dur = n.end - n.ts
    paths, op_stack = op_paths(trace.python, n)  # with_stack: each event's Python call stack
    for k, p, o in zip(host.tolist(), host_phase.tolist(), np.where(host_out_step == index, host_out, -1).tolist()):
        t = threads[n.thread[k]]
        kind = int(n.kind[k])
        args: dict[str, Any] = {"phase": phases[p]} if p >= 0 else {"outside": OUT_OF_STEP[o]} if o >= 0 else {}
        shapes = trace.shapes[n.shapes[k]] if n.shapes[k] > 0 else ""
        if shapes:
            args["Input Dims"] = msgspec.Raw(shapes.encode())
        if kind == RUNTIME:
            args["correlation"] = int(trace.host.corr[n.order[k]])
        if op_stack[k] >= 0:
            args["stack"] = stack(paths, trace.names, int(op_stack[k]))
            args["frame"] = user_frame(args["stack"])
        events.append(TraceEvent(ph="X", name=trace.names[n.name[k]], cat=_HOST_CATEGORY[kind], pid=t.pid, tid=t.tid,
                                 ts=float(n.ts[k]), dur=float(dur[k]), args=args))

    launch = launches(trace, n)
    dev_step, dev_phase = part.locate(launch.ts)
    out_step, out_kind = part.locate_outside(launch.ts)
    device = np.flatnonzero((dev_step == index) | (out_step == index))
    dev = trace.device
    owner = launch.op_name(n)
    streams = sorted({(int(dev.device[k]), int(dev.stream[k])) for k in device.tolist()})
    for d in sorted({d for d, _ in streams}):
        events.append(TraceEvent(ph="M", name="process_name", pid=d, tid=0, args={"name": f"GPU {d}"}))
        events.append(TraceEvent(ph="M", name="process_sort_index", pid=d, tid=0, args={"sort_index": 1_000_000 + d}))
    for d, s in streams:
        events.append(TraceEvent(ph="M", name="thread_name", pid=d, tid=s, args={"name": f"stream {s}"}))
    for k in device.tolist():
        d, s = int(dev.device[k]), int(dev.stream[k])
        corr = int(dev.corr[k])
        args = {"phase": phases[int(dev_phase[k])]} if dev_step[k] == index else {"outside": OUT_OF_STEP[out_kind[k]]}
        args.update({"correlation": corr, "device": d, "stream": s})
        if owner[k] >= 0:
            args["launched by"] = trace.names[owner[k]]
        events.append(TraceEvent(ph="X", name=trace.names[dev.name[k]], cat=_DEVICE_CATEGORY.get(int(dev.kind[k]),
                                 "gpu_memset"), pid=d, tid=s, ts=float(dev.ts[k]), dur=float(dev.dur[k]), args=args))
        call = int(launch.runtime[k])
        t = threads[n.thread[call]]
        events.append(TraceEvent(ph="s", name="launch", cat="ac2g", id=corr, pid=t.pid, tid=t.tid,
                                 ts=float(n.ts[call])))
        events.append(TraceEvent(ph="f", name="launch", cat="ac2g", id=corr, bp="e", pid=d, tid=s, ts=float(dev.ts[k])))

    if main is not None:
        phase_tid = _free_tid(main.pid, threads)
        events.append(TraceEvent(ph="M", name="thread_name", pid=main.pid, tid=phase_tid, args={"name": _PHASE_LANE}))
        events.append(TraceEvent(ph="M", name="thread_sort_index", pid=main.pid, tid=phase_tid,
                                 args={"sort_index": -1}))
        seg = np.flatnonzero(part.step == index)
        for k in seg.tolist():
            events.append(TraceEvent(ph="X", name=phases[part.phase[k]], cat="phase", pid=main.pid, tid=phase_tid,
                                     ts=float(part.start[k]), dur=float(part.end[k] - part.start[k]),
                                     args={"phase": phases[part.phase[k]],
                                           "inferred": phases[part.phase[k]] in step.inferred}))
        for k in np.flatnonzero(part.outside_step == index).tolist():
            kind = OUT_OF_STEP[part.outside_kind[k]]
            events.append(TraceEvent(ph="X", name=outside_label(kind), cat="outside", pid=main.pid, tid=phase_tid,
                                     ts=float(part.outside_start[k]),
                                     dur=float(part.outside_end[k] - part.outside_start[k]), args={"outside": kind}))
    info = StepTraceInfo(step=number, start_us=a, end_us=b, phases=phases, host_events=len(host),
                         device_events=len(device))
    return StepTrace(traceEvents=events, otherData=info)


def _free_tid(pid: int | str, threads) -> int:
    """A thread id no thread of process ``pid`` uses, for the phase lane."""
    used = {t.tid for t in threads if t.pid == pid}
    tid = 0
    while tid in used:
        tid -= 1
    return tid

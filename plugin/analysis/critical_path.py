"""The critical path of each step: the chain of dependent work that sets the step's length.

The step is a graph of work with the durations the trace recorded. On a host thread, work runs in
order (program order). A kernel, copy or set starts after its launch (the runtime call's start) and
after the work before it on its stream; a kernel waiting on another stream's work (a CUDA event)
starts after that work ends. A host call that waits for the device (`blocking`: a synchronize, a
copy to the host or through pageable memory) ends after the device work it waited for.

The path is found backwards from the step's end, following at each piece of work the dependency that
bound it, the one that ended last (every other dependency had slack):

- on the host, the thread's work back to the last call that waited for the device and was held by
  it (the device work it waited for ended after the call began); the path goes on from the end of
  that device work (the call's host time after it is the *sync* on the path);
- device work starts after the last to arrive of: the stream's previous work ending, its launch
  (the runtime call's start), and, when another stream's work on the device ended after both, that
  work (the event it waited for, or the device's queue); from a launch the path goes to the host,
  at the call's start, through a *launch* stretch (call start to device start); otherwise to that
  device work's end, the gap between being *idle* on the path (``kernel wait`` after the stream's
  own work within `idle.KERNEL_WAIT_US`, else ``other wait``);
- work on another host thread (autograd's backward thread) is followed through its outermost op,
  then the path goes on on the loop's thread;
- the walk stops at the step's start.

Each stretch of the path covers the time from its predecessor's end to its own end, so the path's
stretches tile the step's window: its length is the step's window, less the time kept out of the
step (evaluation passes, ``prof.paused()``) where the path is on the host then; that is the step's
wall time unless the path runs on the GPU through time kept apart.

Host time is named by the outermost op running (``op``; the user's call), by the runtime call when
it launches device work (``launch``), or by its phase where no op runs (``phase``). Each stretch
carries a phase: the phase at the host instant, or, for device work and the gaps before it, the
phase that launched it. A stretch is *blocked* where it lies inside the host window of a call the
path waits in: the host was held for it.
"""

from __future__ import annotations

import re
from bisect import bisect_right

import numpy as np

from ..reading.events import KERNEL, OP, RUNTIME, Trace
from .idle import KERNEL_WAIT_US
from .model import PathTable
from .nesting import Nesting
from .partition import Partition

#: What a stretch of the path is (`PathTable.kind` codes; `answers.PathShare.kind`).
KINDS = ("phase", "op", "kernel", "sync", "copy", "collective", "launch", "idle")
PHASE, OPK, KERNELK, SYNC, COPY, COLLECTIVE, LAUNCH, IDLE = range(len(KINDS))
#: Names of the stretches that are no event's (`PathTable.name` < 0): gaps on a stream.
KERNEL_GAP, OTHER_GAP, NO_PHASE = -2, -3, -4
GAP_NAMES = {KERNEL_GAP: "kernel wait", OTHER_GAP: "other wait", NO_PHASE: "outside the phases"}
#: Runtime calls that launch device work: host time in them on the path is launching.
LAUNCH_CALL = re.compile(r"^(cuda|hip|cu)(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|"
                         r"ModuleLaunchKernel|ExtModuleLaunchKernel|LaunchKernelExC)")
#: A device event ending this much after the call waiting for it ends is still the one it waited
#: for (the two clocks are read apart).
_END_SLACK_US = 1.0
# what bound a device event's start: its stream's work before it, its launch, another stream's
# work, or nothing known (the path goes on on the loop's thread)
_SAME, _LAUNCH, _CROSS, _HOST = range(4)


class _Host:
    """One thread's outermost ops, launch calls and held calls, each in time order."""

    def __init__(self, op_start, op_end, op_name, launch_start, launch_end, launch_name,
                 wait_start, wait_end, wait_device, wait_call):
        self.op_start, self.op_end, self.op_name = op_start, op_end, op_name
        self.launch_start, self.launch_end, self.launch_name = launch_start, launch_end, launch_name
        self.wait_start, self.wait_end = wait_start, wait_end  # lists: read one at a time
        self.wait_device, self.wait_call = wait_device, wait_call


def critical_paths(trace: Trace, n: Nesting, part: Partition, runtime: np.ndarray,
                   launch_ts: np.ndarray, blocks: np.ndarray, copy_of: np.ndarray,
                   comm: np.ndarray, dev_phase: np.ndarray, stream: np.ndarray,
                   labels: list[str]) -> PathTable:
    """The critical path of every step of ``part``. ``runtime`` / ``launch_ts``: each device event's
    runtime call and its start; ``blocks`` / ``copy_of``: per host event, a call that blocks the host
    and the device copy it waited for (`blocking.blocking_mask`); ``comm``: device events that are
    communication; ``dev_phase``: the phase that launched each; ``stream`` / ``labels``: its stream."""
    steps = part.steps
    dev = trace.device
    if not len(dev) or not steps:
        return PathTable.empty(labels)
    base = float(steps[0].start)
    d_start = dev.ts - base
    d_end = d_start + np.maximum(dev.dur, 0.0)
    d_launch = launch_ts - base
    pred_kind, pred = _device_predecessors(dev.device, stream, d_start, d_end, d_launch)
    d_kind = np.where(comm, COLLECTIVE, np.where(dev.kind == KERNEL, KERNELK, COPY))
    h_thread = np.where(runtime >= 0, n.thread[np.maximum(runtime, 0)], part.main_thread)
    hosts = _hosts(trace, n, part, blocks, copy_of, d_end, base)
    h_name = (np.where(runtime >= 0, n.name[np.maximum(runtime, 0)], -1) if len(n.name)
              else np.full(len(dev), -1))
    walk = _Walk(part, base, hosts, d_start, d_end, d_launch, pred_kind, pred, d_kind,
                 dev.name, stream, dev_phase, h_thread, h_name)
    cols: list[list] = [[] for _ in range(8)]
    for i in range(len(steps)):
        walk.step(i, cols)
    return _table(cols, labels)


def _device_predecessors(device: np.ndarray, stream: np.ndarray, start: np.ndarray, end: np.ndarray,
                         launch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per device event, what bound its start (`_SAME`, `_LAUNCH`, `_CROSS`, `_HOST`) and the device
    event it waited for (`_SAME`, `_CROSS`; -1 otherwise), on whole arrays."""
    m = len(start)
    order = np.lexsort((start, stream))
    s_sorted, e_sorted = stream[order], end[order]
    first = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
    span = float(end.max() - min(start.min(), 0.0)) + 1.0
    shift = np.cumsum(first) * span
    reach = np.maximum.accumulate(e_sorted + shift)
    # the event whose end is the furthest so far on its stream: the last place the reach grew
    grew = np.r_[True, reach[1:] > reach[:-1]]
    holder = np.maximum.accumulate(np.where(grew, np.arange(m), 0))
    prev = np.full(m, -1, np.int64)
    prev_end = np.full(m, -np.inf)
    has = ~first
    prev[order[has]] = order[holder[np.flatnonzero(has) - 1]]
    prev_end[order[has]] = (reach - shift)[np.flatnonzero(has) - 1]
    # the device's work that ended last at or before each start, on any stream
    by_end = np.lexsort((end, device))
    key_end = device[by_end] * span * 4 + end[by_end]
    at = np.searchsorted(key_end, device * span * 4 + start, side="right") - 1
    cand = by_end[np.maximum(at, 0)]
    cross = (at >= 0) & (device[cand] == device) & (stream[cand] != stream) & (cand != np.arange(m))
    cross_end = np.where(cross, end[cand], -np.inf)
    launched = np.where(np.isnan(launch), -np.inf, launch)
    # the dependency that arrived last bound the start: the stream's previous work, the launch, or
    # (waiting on an event) the other stream's work that ended last before it; ties to the stream
    kind = np.where(prev_end >= np.maximum(launched, cross_end), _SAME,
                    np.where(launched >= cross_end, _LAUNCH, _CROSS))
    kind = np.where(np.isinf(np.maximum(np.maximum(prev_end, launched), cross_end)), _HOST, kind)
    pred = np.where(kind == _SAME, prev, np.where(kind == _CROSS, cand, -1))
    return kind, pred


def _hosts(trace: Trace, n: Nesting, part: Partition, blocks: np.ndarray, copy_of: np.ndarray,
           d_end: np.ndarray, base: float) -> dict[int, _Host]:
    """Per thread of the loop's process: its outermost ops (no op or runtime call around them, step
    and phase markers aside), its launch calls, and its calls held by the device."""
    if not len(n.ts):
        return {}
    is_op = ((n.kind == OP) | (n.kind == RUNTIME)) & ~part.marker_names[n.name]
    inside = np.zeros(len(n.ts), dtype=bool)  # an op or runtime call encloses it
    for d in range(1, int(n.depth.max(initial=0)) + 1):  # a loop over depth, not over events
        at = np.flatnonzero(n.depth == d)
        up = n.parent[at]
        inside[at] = is_op[up] | inside[up]
    top = np.flatnonzero(is_op & ~inside & part.process_threads[n.thread])
    names = trace.names
    launching = np.array([bool(LAUNCH_CALL.match(x)) for x in names] or [False])
    calls = np.flatnonzero((n.kind == RUNTIME) & launching[n.name])
    # the calls held by the device: the device work each waited for ended after it began
    held = np.flatnonzero(blocks)
    waited = copy_of[held].copy()
    order = np.argsort(d_end, kind="stable")
    last = np.searchsorted(d_end[order], n.end[held] - base + _END_SLACK_US, side="right") - 1
    sync = waited < 0
    waited[sync] = np.where(last[sync] >= 0, order[np.maximum(last[sync], 0)], -1)
    ok = waited >= 0
    ok[ok] = d_end[waited[ok]] > n.ts[held[ok]] - base
    held, waited = held[ok], waited[ok]
    by_end = np.lexsort((n.end[held], n.thread[held]))
    held, waited = held[by_end], waited[by_end]
    out = {}
    threads = np.unique(n.thread[top])
    # each list is in thread order (the nesting's, and ``by_end``): a thread's part is one slice
    parts = [np.searchsorted(n.thread[x], np.r_[threads, threads + 1]).reshape(2, -1)
             for x in (top, calls, held)]
    for k, t in enumerate(threads.tolist()):
        o, c, h = (x[a[0, k]:a[1, k]] for x, a in zip((top, calls, held), parts))
        w = waited[parts[2][0, k]:parts[2][1, k]]
        out[t] = _Host(n.ts[o] - base, n.end[o] - base, n.name[o],
                       n.ts[c] - base, n.end[c] - base, n.name[c],
                       (n.ts[h] - base).tolist(), (n.end[h] - base).tolist(),
                       w.tolist(), n.name[h].tolist())
    return out


class _Walk:
    """The backward walk of one span's steps (lists, not arrays: a walk visits one piece at a time)."""

    def __init__(self, part, base, hosts, d_start, d_end, d_launch, pred_kind, pred, d_kind, d_name,
                 stream, d_phase, h_thread, h_name):
        self.part, self.base, self.hosts = part, base, hosts
        self.main = part.main_thread
        bounds = np.concatenate([part.start, part.end]) - base
        bounds.sort()
        self.bounds = bounds
        # arrays for the chains of device work, lists for the walk's reads one at a time
        self.a_start, self.a_end = d_start, d_end
        self.a_stream, self.a_phase = stream.astype(np.int64), d_phase.astype(np.int64)
        self.a_kind, self.a_name = d_kind.astype(np.int64), d_name.astype(np.int64)
        self.a_pred_kind = pred_kind.astype(np.int64)
        self.d_start, self.d_end, self.d_launch = d_start.tolist(), d_end.tolist(), d_launch.tolist()
        self.pred_kind, self.pred = pred_kind.tolist(), pred.tolist()
        self.stream, self.d_phase = stream.tolist(), d_phase.tolist()
        self.h_thread, self.h_name = h_thread.tolist(), h_name.tolist()

    def step(self, i: int, cols: list[list]) -> None:
        """Appends the path of step ``i`` to the columns ``cols`` (step, start, end, lane, kind,
        name, phase, blocked), times from the step's start, latest stretch first."""
        s = self.part.steps[i]
        s0, t = s.start - self.base, s.end - self.base
        steps, starts, ends, lanes, kinds, names, phases, blocked = cols
        d_start, d_launch, pred_kind, pred = self.d_start, self.d_launch, self.pred_kind, self.pred
        d_end, stream, d_phase = self.d_end, self.stream, self.d_phase
        first = len(starts)

        def add(a, b, lane, kind, name, phase, held):
            if held < b and a < held:  # the stretch began before the call holding the host
                add(held, b, lane, kind, name, phase, held)
                b = held
            starts.append(a)
            ends.append(b)
            lanes.append(lane)
            kinds.append(kind)
            names.append(name)
            phases.append(phase)
            blocked.append(b > held)

        limit: dict[int, int] = {}  # per thread: its held calls from this index on are behind us
        thread, device, held_from = self.main, -1, np.inf
        seen = set()
        while True:
            if device < 0:  # on the host, on ``thread``, at ``t``
                if t <= s0:
                    break
                host = self.hosts.get(thread)
                lo = s0
                if thread != self.main:
                    lo = max(s0, self._op_start(host, t)) if host is not None else t
                k = -1
                if host is not None and host.wait_end:
                    k = min(bisect_right(host.wait_end, t),
                            limit.get(thread, len(host.wait_end))) - 1
                if k >= 0 and host.wait_end[k] > lo:
                    limit[thread] = k
                    jump, d, call_start = host.wait_end[k], host.wait_device[k], host.wait_start[k]
                    self._host(cols, thread, jump, t)
                    arrive = max(min(d_end[d], jump), s0)
                    phase = int(self.part.locate(np.array([call_start + self.base]))[1][0])
                    add(arrive, jump, -1, SYNC, host.wait_call[k], phase, -np.inf)
                    if arrive <= s0 or d in seen:
                        break
                    seen.add(d)
                    device, t, held_from = d, arrive, call_start
                    continue
                self._host(cols, thread, lo, t)
                if lo <= s0:
                    break
                thread, t = self.main, lo
                continue
            chain = [device]  # on the device, from the end ``t`` of ``device`` back along its
            d = device  # dependencies on the device, while they are device work
            while d_start[d] > s0 and pred_kind[d] in (_SAME, _CROSS) and pred[d] not in seen:
                d = pred[d]
                seen.add(d)
                chain.append(d)
            self._chain(cols, chain, t, s0, held_from)
            a = d_start[d]
            if a <= s0:
                break
            if pred_kind[d] == _LAUNCH:
                at = max(min(d_launch[d], a), s0)
                add(at, a, stream[d], LAUNCH, self.h_name[d], d_phase[d], held_from)
                device, thread, t, held_from = -1, self.h_thread[d], at, np.inf
            else:
                device, thread, t, held_from = -1, self.main, a, np.inf
        steps.extend([i] * (len(starts) - first))
        for col in (starts, ends):
            col[first:] = [x - s0 for x in col[first:]]

    def _chain(self, cols, chain: list[int], t: float, s0: float, held: float) -> None:
        """The stretches of a chain of device work, each bound by the next (``chain[0]`` ending the
        chain at ``t``): each piece of work, and the gap before the one it bound."""
        c = np.array(chain)
        a = self.a_start[c]
        arrive = np.empty(len(c))
        arrive[0] = t
        arrive[1:] = np.minimum(self.a_end[c[1:]], a[:-1])
        arrive = np.maximum(arrive, s0)
        lane, phase = self.a_stream[c], self.a_phase[c]
        gap = np.where((self.a_pred_kind[c[:-1]] == _SAME) & (a[:-1] - arrive[1:] <= KERNEL_WAIT_US),
                       KERNEL_GAP, OTHER_GAP)
        idle = a[:-1] > arrive[1:]
        join = np.concatenate
        start = join([np.maximum(a, s0), arrive[1:][idle]])
        end = join([arrive, a[:-1][idle]])
        lane = join([lane, lane[:-1][idle]])
        phase = join([phase, phase[:-1][idle]])
        kind = join([self.a_kind[c], np.full(int(idle.sum()), IDLE)])
        name = join([self.a_name[c], gap[idle]])
        cut = (start < held) & (held < end)  # began before the call holding the host: split there
        if cut.any():
            start = join([start, np.full(int(cut.sum()), held)])
            end = join([np.where(cut, held, end), end[cut]])
            lane, phase = join([lane, lane[cut]]), join([phase, phase[cut]])
            kind, name = join([kind, kind[cut]]), join([name, name[cut]])
        _, starts, ends, lanes, kinds, names, phases, blocked = cols
        starts.extend(start.tolist())
        ends.extend(end.tolist())
        lanes.extend(lane.tolist())
        kinds.extend(kind.tolist())
        names.extend(name.tolist())
        phases.extend(phase.tolist())
        blocked.extend((end > held).tolist())

    def _op_start(self, host: _Host, t: float) -> float:
        """The start of the outermost op running just before ``t`` on the thread; ``t`` if none."""
        j = int(host.op_start.searchsorted(t, side="left")) - 1
        return float(host.op_start[j]) if j >= 0 and host.op_end[j] >= t else t

    def _host(self, cols, thread, a, b):
        """The host stretch ``[a, b)`` on ``thread``, cut where an outermost op, a launch call or a
        phase begins or ends; each piece named by what runs in it (appended latest first). Called
        per stretch: its searches are the arrays' own binary searches, O(log n) each."""
        if b <= a:
            return
        host = self.hosts.get(thread)
        cuts = [np.array([a, b])]
        if host is not None:
            for xs in (host.op_start, host.op_end, host.launch_start, host.launch_end):
                lo, hi = xs.searchsorted(a, "right"), xs.searchsorted(b, "left")
                cuts.append(xs[lo:hi])
        lo, hi = self.bounds.searchsorted(a, "right"), self.bounds.searchsorted(b, "left")
        cuts.append(self.bounds[lo:hi])
        points = np.unique(np.concatenate(cuts))
        mid = (points[:-1] + points[1:]) / 2
        phase = self.part.locate(mid + self.base)[1]
        kind = np.where(phase >= 0, PHASE, IDLE)
        name = np.where(phase >= 0, -1, NO_PHASE)
        if host is not None:
            for start, end, names, k in ((host.op_start, host.op_end, host.op_name, OPK),
                                         (host.launch_start, host.launch_end, host.launch_name, LAUNCH)):
                if not len(start):
                    continue
                j = start.searchsorted(mid, side="right") - 1
                covered = (j >= 0) & (end[np.maximum(j, 0)] > mid)
                kind = np.where(covered, k, kind)
                name = np.where(covered, names[np.maximum(j, 0)], name)
        _, starts, ends, lanes, kinds, names, phases, blocked = cols
        starts.extend(points[-2::-1].tolist())
        ends.extend(points[:0:-1].tolist())
        kinds.extend(kind[::-1].tolist())
        names.extend(name[::-1].tolist())
        phases.extend(phase[::-1].tolist())
        lanes.extend([-1] * len(mid))
        blocked.extend([False] * len(mid))


def _table(cols: list[list], labels: list[str]) -> PathTable:
    """The steps' paths (columns as `_Walk.step` fills them, each step latest stretch first) as one
    table in (step, time) order, consecutive stretches alike (lane, kind, name, phase, blocking)
    merged."""
    if not cols[0]:
        return PathTable.empty(labels)
    rows = len(cols[0])  # each column made an array once, of its type (no type inferred from a list)
    step = np.fromiter(cols[0], np.int32, rows)
    start, end = np.fromiter(cols[1], np.float64, rows), np.fromiter(cols[2], np.float64, rows)
    order = np.lexsort((end, start, step))
    step, start, end = step[order], start[order], end[order]
    keys = np.stack([step, *(np.fromiter(c, np.int64, rows)[order] for c in cols[3:])])
    new = np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0) | (start[1:] != end[:-1])]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(new)] - 1
    return PathTable(streams=labels, step=step[first], start=start[first], end=end[last],
                     lane=keys[1, first].astype(np.int32), kind=keys[2, first].astype(np.int8),
                     name=keys[3, first].astype(np.int32), phase=keys[4, first].astype(np.int32),
                     blocked=keys[5, first].astype(bool))

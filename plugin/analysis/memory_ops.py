"""Memory by op: each allocation and free of a step with the op that made it, and per op the bytes it
allocated and freed and how far its allocations rose, by itself (self) and with the ops it called
(total); the op at the step's peak.

The profiler writes a `[memory]` instant event on the thread that allocated or freed, inside the op
running there: an event's op is the innermost operator (``cpu_op``; not a step marker or phase
range) on its thread whose range holds its instant (none: "(no op)"). An op's *peak delta* is the
highest its running sum of bytes reaches over its events in time order (its own events: self; its
own and those of every op it called: total), 0 where it only freed: how much it grew memory at most,
whatever other threads did meanwhile. Per op name in a step, allocated and freed add up over its
calls, the peak deltas are the largest call's. Each event is in exactly one op's self figures (or
"(no op)"), so per step and device the ops' self allocated less freed is the step's net change: the
same events, in the same steps, as the curve and the per-phase figures (`span._memory`). The op at
the peak holds the step's first event at its highest allocated bytes, the point the curve's peak
marks.

Kept per span at load time: the per-op table, and the events of each step and device, at most
`MAX_EVENTS` of them (the largest, by bytes moved; the rest counted).
"""

from __future__ import annotations

import numpy as np

from ..answers import MemoryDevice, MemoryEventRow, MemoryEventsAnswer, MemoryOpRow
from ..reading.events import OP, Trace
from .model import MemoryEventTable, MemoryOpTable, SpanAnalysis
from .nesting import Nesting
from .partition import Partition
from .worker import Worker

#: Events kept per step and device (the largest by bytes moved when there are more).
MAX_EVENTS = 20_000
#: How an event outside every op is named.
NO_OP = "(no op)"


def event_ops(trace: Trace, n: Nesting, is_op: np.ndarray) -> np.ndarray:
    """Per memory event, the innermost op (``is_op``, per event of ``n``) holding it on its thread
    (index into ``n``; -1 none)."""
    mem = trace.memory
    out = np.full(len(mem), -1, np.int64)
    if not len(n.ts) or not len(mem):
        return out
    bounds = np.flatnonzero(np.r_[True, n.thread[1:] != n.thread[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        on = np.flatnonzero(mem.thread == n.thread[lo])
        if not len(on):
            continue
        ts = mem.ts[on]
        cand = lo + np.searchsorted(n.ts[lo:hi], ts, side="right") - 1
        cand[cand < lo] = -1
        for _ in range(int(n.depth[lo:hi].max()) + 1):  # up the ancestors until an op that holds it
            c = np.maximum(cand, 0)
            wrong = (cand >= 0) & (~is_op[c] | (n.end[c] < ts))
            if not wrong.any():
                break
            cand = np.where(wrong, n.parent[c], cand)
        out[on] = cand
    return out


def _peaks(key: np.ndarray, order_ts: np.ndarray, nbytes: np.ndarray, size: int) -> np.ndarray:
    """Per key, the highest running sum of ``nbytes`` over its events in time order (at least 0)."""
    out = np.zeros(size, np.int64)
    if not len(key):
        return out
    by = np.lexsort((order_ts, key))
    k, b = key[by], nbytes[by]
    csum = np.cumsum(b)
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    base = np.repeat(csum[first] - b[first], np.diff(np.r_[first, len(k)]))
    np.maximum.at(out, k, csum - base)
    return out


def memory_tables(trace: Trace, n: Nesting, part: Partition,
                  allocated: np.ndarray) -> tuple[MemoryOpTable, MemoryEventTable]:
    """The per-op memory table and the kept events of each step (see the module's docstring);
    ``allocated``: the allocated bytes after each memory event (`memory.running_allocated`)."""
    mem = trace.memory
    step, _ = part.locate(mem.ts)
    inside = np.flatnonzero(step >= 0)
    # operators, not the step markers and phase ranges the 2021 schema writes as operators too
    is_op = (n.kind == OP) & ~part.marker_names[n.name] if len(n.name) else np.zeros(0, dtype=bool)
    op = event_ops(trace, n, is_op)[inside]
    s, dev, ts, nbytes = step[inside].astype(np.int64), mem.device[inside].astype(np.int64), mem.ts[inside], \
        mem.nbytes[inside]
    devices = max(len(trace.memory_devices), 1)
    names = max(len(trace.names), 1)
    op_name = np.where(op >= 0, n.name[np.maximum(op, 0)] if len(n.name) else -1, -1).astype(np.int64)

    # self: each event in its innermost op
    row_key = (s * devices + dev) * (names + 1) + (op_name + 1)
    keys, row = np.unique(row_key, return_inverse=True)
    row = row.ravel()
    rows = len(keys)
    alloc_self = np.bincount(row, weights=np.maximum(nbytes, 0), minlength=rows)
    freed_self = np.bincount(row, weights=np.maximum(-nbytes, 0), minlength=rows)
    count = np.bincount(row, minlength=rows)
    has_op = op >= 0  # events outside every op run on their own ("(no op)", below), in no op's sum
    call_peak_self = _peaks(op[has_op] * devices + dev[has_op], ts[has_op], nbytes[has_op],
                            max(len(n.ts), 1) * devices)
    peak_self = np.zeros(rows, np.int64)
    np.maximum.at(peak_self, row[has_op], call_peak_self[op[has_op] * devices + dev[has_op]])
    no_op = np.flatnonzero(~has_op)  # "(no op)": one running sum per (step, device)
    if len(no_op):
        loose = _peaks(s[no_op] * devices + dev[no_op], ts[no_op], nbytes[no_op], max(len(part.steps), 1) * devices)
        np.maximum.at(peak_self, row[no_op], loose[s[no_op] * devices + dev[no_op]])

    # total: each event in every op holding it
    pairs_event, pairs_op = [], []
    holder = op.copy()
    depth = int(n.depth.max(initial=0)) + 1
    for _ in range(depth):
        ok = holder >= 0
        if not ok.any():
            break
        idx = np.flatnonzero(ok)
        keep = is_op[holder[idx]]
        pairs_event.append(idx[keep])
        pairs_op.append(holder[idx[keep]])
        holder = np.where(ok, n.parent[np.maximum(holder, 0)], -1)
    pe = np.concatenate(pairs_event) if pairs_event else np.zeros(0, np.int64)
    po = np.concatenate(pairs_op) if pairs_op else np.zeros(0, np.int64)
    # an op's total row: (step, device, its name); events of ops with no self row still count
    total_key = (s[pe] * devices + dev[pe]) * (names + 1) + (n.name[po].astype(np.int64) + 1 if len(po) else 0)
    all_keys = np.union1d(keys, total_key)
    at_self = np.searchsorted(all_keys, keys)
    at_total = np.searchsorted(all_keys, total_key)
    size = len(all_keys)

    def spread(values: np.ndarray) -> np.ndarray:
        out = np.zeros(size, values.dtype)
        out[at_self] = values
        return out

    alloc_total = np.bincount(at_total, weights=np.maximum(nbytes[pe], 0), minlength=size)
    freed_total = np.bincount(at_total, weights=np.maximum(-nbytes[pe], 0), minlength=size)
    call_peak_total = _peaks(po * devices + dev[pe], ts[pe], nbytes[pe], max(len(n.ts), 1) * devices)
    peak_total = np.zeros(size, np.int64)
    np.maximum.at(peak_total, at_total, call_peak_total[po * devices + dev[pe]])
    no_op_rows = (all_keys % (names + 1)) == 0  # "(no op)": total is self
    ops = MemoryOpTable(
        step=(all_keys // (names + 1) // devices).astype(np.int32),
        device=(all_keys // (names + 1) % devices).astype(np.int32),
        name=(all_keys % (names + 1) - 1).astype(np.int32),
        events=spread(count.astype(np.int64)),
        allocated_self=spread(alloc_self.astype(np.int64)),
        freed_self=spread(freed_self.astype(np.int64)),
        peak_self=spread(peak_self),
        allocated_total=np.where(no_op_rows, spread(alloc_self.astype(np.int64)), alloc_total.astype(np.int64)),
        freed_total=np.where(no_op_rows, spread(freed_self.astype(np.int64)), freed_total.astype(np.int64)),
        peak_total=np.where(no_op_rows, spread(peak_self), peak_total),
    )
    return ops, _kept_events(s, dev, ts, nbytes, mem.addr[inside], op_name, allocated[inside], len(part.steps),
                             devices)


def _kept_events(s, dev, ts, nbytes, addr, op_name, allocated, steps: int, devices: int) -> MemoryEventTable:
    """The events of each (step, device) in time order, at most `MAX_EVENTS` (the largest by bytes)."""
    order = np.lexsort((ts, dev, s))
    group = s[order] * devices + dev[order]
    keep = np.ones(len(order), dtype=bool)
    left_out = np.zeros((max(steps, 1), devices), np.int64)
    bounds = np.flatnonzero(np.r_[True, group[1:] != group[:-1], True]) if len(order) else np.zeros(1, np.int64)
    peak_at = np.full((max(steps, 1), devices), -1, np.int64)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        g = order[lo:hi]
        top = g[int(np.argmax(allocated[g]))]  # the first event at the highest allocated bytes
        peak_at[s[top], dev[top]] = top
        if hi - lo > MAX_EVENTS:
            small = np.argsort(-np.abs(nbytes[g]), kind="stable")[MAX_EVENTS:]
            small = small[g[small] != top]  # the peak stays
            keep[lo + small] = False
            left_out[s[g[0]], dev[g[0]]] = len(small)
    kept = order[keep]
    return MemoryEventTable(step=s[kept].astype(np.int32), device=dev[kept].astype(np.int32), ts=ts[kept],
                            nbytes=nbytes[kept], addr=addr[kept], op=op_name[kept].astype(np.int32),
                            allocated=allocated[kept], left_out=left_out[:steps],
                            peak_op=np.where(peak_at >= 0, op_name[np.maximum(peak_at, 0)], -2)[:steps]
                            .astype(np.int32) if len(op_name) else np.full((steps, devices), -2, np.int32))


def memory_devices(span: SpanAnalysis, i: int) -> list[MemoryDevice]:
    """Step ``i``'s memory events and per-op table of each device with events in it."""
    t, e = span.memory_ops, span.memory_events
    start = span.steps[i].start

    def name(code: int) -> str:
        return span.names[code] if code >= 0 else NO_OP

    out = []
    for d, device in enumerate(span.memory_devices):
        rows = t.rows(i)
        on = np.flatnonzero(t.device[rows] == d) + rows.start
        if not len(on):
            continue
        ev = e.rows(i)
        here = np.flatnonzero(e.device[ev] == d) + ev.start
        ops = [MemoryOpRow(op=name(int(t.name[k])), events=int(t.events[k]), allocated_self=int(t.allocated_self[k]),
                           freed_self=int(t.freed_self[k]), peak_self=int(t.peak_self[k]),
                           allocated_total=int(t.allocated_total[k]), freed_total=int(t.freed_total[k]),
                           peak_total=int(t.peak_total[k])) for k in on.tolist()]
        ops.sort(key=lambda r: (-r.peak_total, -r.allocated_total, r.op))
        events = [MemoryEventRow(t_ms=round((float(e.ts[k]) - start) / 1000.0, 4), bytes=int(e.nbytes[k]),
                                 addr=int(e.addr[k]) if e.addr[k] >= 0 else None, op=name(int(e.op[k])),
                                 allocated=int(e.allocated[k])) for k in here.tolist()]
        peak = int(np.argmax(e.allocated[here])) if len(here) else -1
        peak_code = int(e.peak_op[i, d]) if d < e.peak_op.shape[1] else -2
        out.append(MemoryDevice(
            device=device, ops=ops, events=events, left_out=int(e.left_out[i, d]) if d < e.left_out.shape[1] else 0,
            peak_bytes=int(e.allocated[here][peak]) if peak >= 0 else None,
            peak_ms=events[peak].t_ms if peak >= 0 else None,
            peak_op=name(peak_code) if peak_code != -2 else None))
    return out


def run_memory(run: str, w: Worker) -> MemoryEventsAnswer:
    """Memory by op over every profiled step of ``w`` the summary stands for (`Worker.run_wide`):
    per device and op, events and bytes summed over those steps, each peak the highest step's."""
    kept, left_out, why = w.run_wide(w.full().tolist())
    columns = ("events", "allocated_self", "freed_self", "peak_self", "allocated_total", "freed_total",
               "peak_total")
    peaks = {"peak_self", "peak_total"}
    ops: dict[tuple[str, str], dict[str, int]] = {}
    top: dict[str, tuple[int, str | None]] = {}  # device -> (peak bytes, the op at it)
    for span, _, indices in w.by_span(kept):
        t, e = span.memory_ops, span.memory_events
        for k in np.flatnonzero(np.isin(t.step, indices)).tolist():
            code = int(t.name[k])
            row = ops.setdefault((span.memory_devices[t.device[k]],
                                  span.names[code] if code >= 0 else NO_OP), dict.fromkeys(columns, 0))
            for c in columns:  # a peak is one step's: the highest; the rest add up over the steps
                v = int(getattr(t, c)[k])
                row[c] = max(row[c], v) if c in peaks else row[c] + v
        for k in np.flatnonzero(np.isin(e.step, indices)).tolist():
            device, i = span.memory_devices[e.device[k]], int(e.step[k])
            code = int(e.peak_op[i, e.device[k]])
            if int(e.allocated[k]) > top.get(device, (-1, None))[0]:
                top[device] = (int(e.allocated[k]), span.names[code] if code >= 0 else NO_OP)
    devices = []
    for device in sorted({d for d, _ in ops}):
        rows = [MemoryOpRow(op=op, **v) for (d, op), v in ops.items() if d == device]
        rows.sort(key=lambda r: (-r.peak_total, -r.allocated_total, r.op))
        peak, peak_op = top.get(device, (None, None))
        devices.append(MemoryDevice(device=device, ops=rows, events=[], left_out=0, peak_bytes=peak,
                                    peak_ms=None, peak_op=peak_op))
    return MemoryEventsAnswer(run=run, worker=w.name, step=None, devices=devices, steps=len(kept),
                              left_out=left_out, left_out_why=why)

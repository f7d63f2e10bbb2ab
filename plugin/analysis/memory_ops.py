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

import msgspec
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


class _RowKey(msgspec.Struct, frozen=True):
    """Packs (step, device, op name) into one int64 so that rows of the op table sort and group by
    one key: ``(step * devices + device) * (names + 1) + name + 1``, where name -1 is "(no op)"
    (an event outside every op) and so packs to the 0 remainder."""

    devices: int
    names: int

    def pack(self, step: np.ndarray, device: np.ndarray, name: np.ndarray) -> np.ndarray:
        return (step * self.devices + device) * (self.names + 1) + (name + 1)

    def step(self, key: np.ndarray) -> np.ndarray:
        return key // (self.names + 1) // self.devices

    def device(self, key: np.ndarray) -> np.ndarray:
        return key // (self.names + 1) % self.devices

    def name(self, key: np.ndarray) -> np.ndarray:
        """The op name code of each key: -1 for "(no op)"."""
        return key % (self.names + 1) - 1


class _Events(msgspec.Struct):
    """The memory events inside a step: step index, device, time, bytes (+ allocated, − freed) and
    the innermost op holding each (index into the nesting; -1: none)."""

    step: np.ndarray
    device: np.ndarray
    ts: np.ndarray
    nbytes: np.ndarray
    op: np.ndarray


def _holders(events: _Events, n: Nesting, is_op: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(event, op) pairs: each event with every op holding it, its own and each op above it on its
    thread (what the total figures count)."""
    pairs_event, pairs_op = [], []
    holder = events.op.copy()
    for _ in range(int(n.depth.max(initial=0)) + 1):
        ok = holder >= 0
        if not ok.any():
            break
        idx = np.flatnonzero(ok)
        keep = is_op[holder[idx]]
        pairs_event.append(idx[keep])
        pairs_op.append(holder[idx[keep]])
        holder = np.where(ok, n.parent[np.maximum(holder, 0)], -1)
    if not pairs_event:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(pairs_event), np.concatenate(pairs_op)


def _self_peaks(events: _Events, row: np.ndarray, rows: int, calls: int, devices: int,
                steps: int) -> np.ndarray:
    """Per self row, the largest call's peak delta over the events it made itself. Events outside
    every op ("(no op)") run on their own, one running sum per (step, device), in no op's sum."""
    peak = np.zeros(rows, np.int64)
    has_op = events.op >= 0
    call = events.op[has_op] * devices + events.device[has_op]  # one running sum per (call, device)
    per_call = _peaks(call, events.ts[has_op], events.nbytes[has_op], calls * devices)
    np.maximum.at(peak, row[has_op], per_call[call])
    loose = np.flatnonzero(~has_op)
    if len(loose):
        at = events.step[loose] * devices + events.device[loose]
        per_step = _peaks(at, events.ts[loose], events.nbytes[loose], steps * devices)
        np.maximum.at(peak, row[loose], per_step[at])
    return peak


def memory_tables(trace: Trace, n: Nesting, part: Partition,
                  allocated: np.ndarray) -> tuple[MemoryOpTable, MemoryEventTable]:
    """The per-op memory table and the kept events of each step (see the module's docstring);
    ``allocated``: the allocated bytes after each memory event (`memory.running_allocated`)."""
    mem = trace.memory
    step, _ = part.locate(mem.ts)
    inside = np.flatnonzero(step >= 0)
    # operators, not the step markers and phase ranges the 2021 schema writes as operators too
    is_op = (n.kind == OP) & ~part.marker_names[n.name] if len(n.name) else np.zeros(0, dtype=bool)
    e = _Events(step=step[inside].astype(np.int64), device=mem.device[inside].astype(np.int64),
                ts=mem.ts[inside], nbytes=mem.nbytes[inside], op=event_ops(trace, n, is_op)[inside])
    key = _RowKey(devices=max(len(trace.memory_devices), 1), names=max(len(trace.names), 1))
    op_name = (np.where(e.op >= 0, n.name[np.maximum(e.op, 0)], -1) if len(n.name)
               else np.full(len(e.op), -1)).astype(np.int64)
    calls, devices = max(len(n.ts), 1), key.devices
    grown, shrunk = np.maximum(e.nbytes, 0), np.maximum(-e.nbytes, 0)

    # self rows: each event in its innermost op, one row per (step, device, op name)
    self_keys, row = np.unique(key.pack(e.step, e.device, op_name), return_inverse=True)
    row = row.ravel()
    rows = len(self_keys)
    alloc_self = np.bincount(row, weights=grown, minlength=rows).astype(np.int64)
    freed_self = np.bincount(row, weights=shrunk, minlength=rows).astype(np.int64)
    count = np.bincount(row, minlength=rows).astype(np.int64)
    peak_self = _self_peaks(e, row, rows, calls, devices, max(len(part.steps), 1))

    # total rows: each event in every op holding it; an op with no event of its own still has one
    ev, holder = _holders(e, n, is_op)
    holder_name = n.name[holder].astype(np.int64) if len(holder) else np.zeros(0, np.int64)
    total_keys = key.pack(e.step[ev], e.device[ev], holder_name)
    all_keys = np.union1d(self_keys, total_keys)
    at_self, at_total = np.searchsorted(all_keys, self_keys), np.searchsorted(all_keys, total_keys)
    size = len(all_keys)

    def spread(values: np.ndarray) -> np.ndarray:
        """A self column on the rows of the whole table (0 where an op has no event of its own)."""
        out = np.zeros(size, values.dtype)
        out[at_self] = values
        return out

    alloc_total = np.bincount(at_total, weights=grown[ev], minlength=size).astype(np.int64)
    freed_total = np.bincount(at_total, weights=shrunk[ev], minlength=size).astype(np.int64)
    call = holder * devices + e.device[ev]
    per_call = _peaks(call, e.ts[ev], e.nbytes[ev], calls * devices)
    peak_total = np.zeros(size, np.int64)
    np.maximum.at(peak_total, at_total, per_call[call])
    no_op = key.name(all_keys) == -1  # "(no op)" holds nothing else: its total is its self
    ops = MemoryOpTable(
        step=key.step(all_keys).astype(np.int32),
        device=key.device(all_keys).astype(np.int32),
        name=key.name(all_keys).astype(np.int32),
        events=spread(count),
        allocated_self=spread(alloc_self),
        freed_self=spread(freed_self),
        peak_self=spread(peak_self),
        allocated_total=np.where(no_op, spread(alloc_self), alloc_total),
        freed_total=np.where(no_op, spread(freed_self), freed_total),
        peak_total=np.where(no_op, spread(peak_self), peak_total),
    )
    return ops, _kept_events(e.step, e.device, e.ts, e.nbytes, mem.addr[inside], op_name,
                             allocated[inside], len(part.steps), devices)


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

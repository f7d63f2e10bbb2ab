"""Host calls that wait for the device, and the device's launch queues: what tells a blocked host
from a starved GPU (launch-bound) from a busy one (GPU-bound).

A host call *blocks* when it returns only once the device has run work queued before it:
``cuda/hip{Stream,Device,Event}Synchronize``, and a copy call (``cudaMemcpy*``) whose device copy is
device-to-host or to or from pageable memory, an ``…Async`` one only when the call lasts until its
copy ends (the driver stages a pageable copy through the host; a pinned one returns at once). How
long it blocked is the call's host time. The op that made it is the outermost op of the chain of ops
around the call (``aten::to`` around ``aten::_to_copy`` around ``aten::copy_``; ``aten::item``
around ``aten::_local_scalar_dense``): the one the user's code called.

The launch queue of a stream at an instant is the device work launched on it (its runtime call has
started) and not yet started, as Holistic Trace Analysis counts it; its mean over a window is
weighted by time. The launch delay of a device event runs from its runtime call's start to its own
start.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from ..reading.events import OP, RUNTIME, Trace
from .model import BlockingTable, LaunchQueues, SpanAnalysis
from .nesting import Nesting
from .partition import Partition
from .stacks import stack, user_frame

SYNCHRONIZE = re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize$")
COPY_CALL = re.compile(r"^(cuda|hip)Memcpy(2D|3D)?(Async)?$")
#: Device copies the host waits for: to the host, or through pageable host memory.
BLOCKING_COPY = re.compile(r"DtoH|DeviceToHost|Pageable", re.I)
#: An async copy call ending this close to its copy's end (µs) lasted until the copy was done.
_COPY_END_SLACK_US = 1.0


def _matches(pattern: re.Pattern, names: list[str], codes: np.ndarray) -> np.ndarray:
    """Per name code of ``codes``: whether ``pattern`` is found in the name (each distinct name read
    once: the runtime calls and copies of a trace have a few dozen)."""
    distinct, inverse = np.unique(codes, return_inverse=True)
    found = np.array([bool(pattern.search(names[k])) for k in distinct.tolist()], dtype=bool)
    return found[inverse.ravel()] if len(codes) else np.zeros(0, dtype=bool)


def blocking_mask(
    trace: Trace, n: Nesting, runtime_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per host event of ``n``: whether it is a call that blocks the host, and the device copy it
    waited for (-1: none, a synchronize). ``runtime_of``: per device event, its runtime call."""
    copy_of = np.full(len(n.ts), -1, np.int64)
    known = runtime_of >= 0
    copy_of[runtime_of[known]] = np.flatnonzero(known)
    names = trace.names
    rt = np.flatnonzero(n.kind == RUNTIME)
    sync = np.zeros(len(n.ts), dtype=bool)
    sync[rt] = _matches(SYNCHRONIZE, names, n.name[rt])
    rt = rt[copy_of[rt] >= 0]
    at = rt[_matches(COPY_CALL, names, n.name[rt])]
    dev = trace.device
    d = copy_of[at]
    waits = _matches(BLOCKING_COPY, names, dev.name[d])
    is_async = _matches(re.compile("Async"), names, n.name[at])
    copy_end = dev.ts[d] + dev.dur[d]
    waits &= ~is_async | (n.end[at] + _COPY_END_SLACK_US >= copy_end)
    blocks = sync.copy()
    blocks[at[waits]] = True
    return blocks, np.where(blocks, copy_of, -1)


def _outermost_op(n: Nesting, at: np.ndarray) -> np.ndarray:
    """The outermost op of the unbroken chain of ops around each host event ``at`` (-1: none)."""
    op = np.full(len(at), -1, np.int64)
    cur = at.copy()
    for _ in range(int(n.depth.max(initial=0))):  # a loop over nesting depth, not over events
        parent = n.parent[cur]
        up = (parent >= 0) & (n.kind[np.maximum(parent, 0)] == OP)
        if not up.any():
            break
        cur = np.where(up, parent, cur)
        op = np.where(up, cur, op)
    return op


class _Queues:
    """Per stream, launched-but-unstarted device work as a step function of time."""

    def __init__(self, launch_ts: np.ndarray, start: np.ndarray, stream: np.ndarray, streams: int):
        t = np.concatenate([launch_ts, start])
        step = np.r_[np.ones(len(start), np.int64), -np.ones(len(start), np.int64)]
        col = np.concatenate([stream, stream])
        order = np.lexsort((step, t, col))  # at one instant, starts before launches
        self.t, self.col = t[order], col[order]
        # every launch is matched by a start, so the running count is back to 0 at each stream's end
        self.q = np.cumsum(step[order])
        self.area = np.r_[0.0, np.cumsum(self.q[:-1] * np.diff(self.t))] if len(t) else np.zeros(1)
        bounds = np.searchsorted(self.col, np.arange(streams + 1))
        self.slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    def _last(self, s: int, x: np.ndarray, side: str) -> np.ndarray:
        """Index within stream ``s``'s changes of its last change at or before (``right``) or before
        (``left``) each ``x``; -1 where none."""
        return np.searchsorted(self.t[self.slices[s]], x, side=side) - 1

    def length(self, s: int, x: np.ndarray) -> np.ndarray:
        """Stream ``s``'s queue just before each instant ``x``."""
        if self.slices[s].start == self.slices[s].stop:  # none of its work has a known launch
            return np.zeros(len(x), np.int64)
        k = self._last(s, x, "left")
        return np.where(k >= 0, self.q[self.slices[s].start + np.maximum(k, 0)], 0)

    def integral(self, s: int, x: np.ndarray) -> np.ndarray:
        """Queue-µs of stream ``s`` from its first change up to each instant ``x``."""
        if self.slices[s].start == self.slices[s].stop:
            return np.zeros(len(x))
        k = self._last(s, x, "right")
        start = self.slices[s].start
        kk = start + np.maximum(k, 0)
        # the area before change kk less that at the stream's first change, plus the run since kk
        inside = self.area[kk] - self.area[start] + self.q[kk] * (x - self.t[kk])
        return np.where(k >= 0, inside, 0.0)

    def maximum(self, s: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Stream ``s``'s longest queue in each window [a, b) (windows in time order, not
        overlapping)."""
        sl = self.slices[s]
        q = np.r_[0, self.q[sl], 0]  # a 0 before the first change, and one to end the last range
        first = self._last(s, a, "right") + 1  # the value in force at a, in ``q``
        last = self._last(s, b, "left") + 1  # the last change before b
        if not len(a):
            return np.zeros(0, np.int64)
        bounds = np.empty(2 * len(a), np.int64)
        bounds[0::2], bounds[1::2] = first, np.maximum(last + 1, first + 1)
        return np.maximum.reduceat(q, np.minimum(bounds, len(q) - 1))[0::2]


def launch_queues(
    trace: Trace,
    part: Partition,
    runtime: np.ndarray,
    launch_ts: np.ndarray,
    dev_step: np.ndarray,
    labels: list[str],
    stream: np.ndarray,
) -> tuple[LaunchQueues, _Queues]:
    """Per step and stream: the launch queue's mean and maximum over the step's host window, and the
    launch delay's median and 90th percentile of the work the step launched; per step and phase, the
    queue (all streams) summed over the phase's host time (queue-µs), so that means over several
    steps weigh each by its time. ``labels``/``stream``: every device event's stream."""
    dev = trace.device
    known = runtime >= 0
    streams = len(labels)
    base = (
        float(dev.ts.min()) if len(dev) else 0.0
    )  # times from the first event: float64 µs near the epoch
    queues = _Queues(launch_ts[known] - base, dev.ts[known] - base, stream[known], streams)
    steps = part.steps
    a = np.array([s.start for s in steps], dtype=np.float64) - base
    b = np.array([s.end for s in steps], dtype=np.float64) - base
    wall = np.maximum(b - a, 1e-9)
    mean = np.zeros((len(steps), streams))
    most = np.zeros((len(steps), streams), np.int64)
    seg_queued = np.zeros(len(part.start))
    for s in range(streams):  # a loop over streams, each on whole arrays of steps
        mean[:, s] = (queues.integral(s, b) - queues.integral(s, a)) / wall
        most[:, s] = queues.maximum(s, a, b)
        seg_queued += queues.integral(s, part.end - base) - queues.integral(s, part.start - base)
    phases = len(part.phases)
    key = part.step.astype(np.int64) * phases + part.phase
    p50, p90 = _delays(dev.ts - launch_ts, dev_step, stream, known, len(steps), streams)
    return LaunchQueues(
        streams=labels,
        mean=mean,
        max=most,
        delay_p50_us=p50,
        delay_p90_us=p90,
        phase_queued_us=np.bincount(key, weights=seg_queued, minlength=len(steps) * phases)
        .reshape(len(steps), phases),
    ), queues


def _delays(
    delay: np.ndarray,
    step: np.ndarray,
    stream: np.ndarray,
    known: np.ndarray,
    steps: int,
    streams: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Median and 90th percentile (linear between ranks, as numpy's) of the launch delays per
    (step, stream) of the work launched in a step; NaN where none."""
    out = np.full((2, steps * streams), np.nan)
    keep = known & (step >= 0)
    key = step[keep].astype(np.int64) * streams + stream[keep]
    d = delay[keep]
    order = np.lexsort((d, key))
    key, d = key[order], d[order]
    groups, first, count = np.unique(key, return_index=True, return_counts=True)
    for row, p in enumerate((0.5, 0.9)):
        at = first + p * (count - 1)  # the rank of the percentile within each group
        lo, hi = np.floor(at).astype(np.int64), np.ceil(at).astype(np.int64)
        out[row, groups] = d[lo] + (d[hi] - d[lo]) * (at - lo)
    return out[0].reshape(steps, streams), out[1].reshape(steps, streams)


def blocking_calls(
    trace: Trace,
    n: Nesting,
    part: Partition,
    blocks: np.ndarray,
    copy_of: np.ndarray,
    op_stack: np.ndarray,
    queues: _Queues,
    streams: int,
) -> BlockingTable:
    """Each call of the steps that blocked the host (`blocking_mask`), in (step, start) order, with
    the op that made it and the launched work not yet started when it began (all streams)."""
    at = np.flatnonzero(blocks)
    if len(n.thread):
        at = at[part.process_threads[n.thread[at]]]
    step, phase = part.locate(n.ts[at])
    at, step, phase = at[step >= 0], step[step >= 0], phase[step >= 0]
    order = np.lexsort((n.ts[at], step))
    at, step, phase = at[order], step[order], phase[order]
    op = _outermost_op(n, at)
    maker = np.where(op >= 0, op, at)
    dev = trace.device
    base = float(dev.ts.min()) if len(dev) else 0.0
    queued = np.zeros((len(at), max(streams, 1)), np.int64)
    for s in range(streams):
        queued[:, s] = queues.length(s, n.ts[at] - base)
    copy = copy_of[at]
    return BlockingTable(
        step=step.astype(np.int32),
        phase=phase.astype(np.int32),
        call=n.name[at].astype(np.int32),
        copy=np.where(copy >= 0, dev.name[np.maximum(copy, 0)], -1).astype(np.int32),
        op=np.where(op >= 0, n.name[np.maximum(op, 0)], -1).astype(np.int32),
        shapes=n.shapes[maker].astype(np.int32),
        stack=op_stack[maker].astype(np.int32),
        ts=n.ts[at].astype(np.float64),
        blocked_us=n.dur[at].astype(np.float64),
        queued=np.maximum(queued, 0).sum(axis=1),
        queue_stream=np.argmax(queued, axis=1).astype(np.int32)
        if streams
        else np.full(len(at), -1, np.int32),
    )


class Blocked(msgspec.Struct):
    """The calls of one kind that blocked the host in one phase, per step over several steps: made
    by
    ``op`` through the runtime ``call``, waiting for a ``copy`` (None: a synchronize); what is
    known of
    the longest one: the op's input ``shapes``, the launched work not yet started when it began
    (``queued``, most of it on ``queue_stream``) and the user's code that made it (``frame``)."""

    phase: str
    call: str
    copy: str | None
    op: str | None
    calls: float  # per step
    blocked_us: float  # per step
    longest_us: float
    shapes: str
    queued: int
    queue_stream: str | None
    frame: str | None  # with_stack


def mean_blocking(spans: list[tuple[SpanAnalysis, list[int]]], steps: int) -> list[Blocked]:
    """The blocking calls of ``spans`` (each with the step indices taken), grouped by phase, call,
    copy and op, per step over ``steps`` steps; most blocked time first."""
    groups: dict[tuple, Blocked] = {}
    n = max(steps, 1)
    for span, indices in spans:
        b = span.blocking
        picked = np.flatnonzero(np.isin(b.step, indices))
        if not len(picked):
            continue
        codes = np.stack([b.phase, b.call, b.copy, b.op])[:, picked].astype(np.int64)
        keys, inverse = np.unique(codes, axis=1, return_inverse=True)
        inverse = inverse.ravel()
        us = b.blocked_us[picked]
        calls = np.bincount(inverse, minlength=keys.shape[1])
        blocked = np.bincount(inverse, weights=us, minlength=keys.shape[1])
        by_length = np.lexsort((-us, inverse))  # per group, its longest call first
        longest = picked[by_length[np.r_[True, inverse[by_length][1:] != inverse[by_length][:-1]]]]
        names = span.names
        for g, (phase, call, copy, op) in enumerate(keys.T.tolist()):
            key = (
                span.phases[phase],
                names[call],
                names[copy] if copy >= 0 else None,
                names[op] if op >= 0 else None,
            )
            k = int(longest[g])
            this = Blocked(
                *key,
                calls=calls[g] / n,
                blocked_us=blocked[g] / n,
                longest_us=float(b.blocked_us[k]),
                shapes=span.shapes[b.shapes[k]],
                queued=int(b.queued[k]),
                queue_stream=span.queues.streams[b.queue_stream[k]]
                if b.queue_stream[k] >= 0
                else None,
                frame=user_frame(stack(span.call_paths, names, int(b.stack[k]))),
            )
            if (
                key in groups
            ):  # the same kind in another span: add up, keep the longest call's facts
                was = groups[key]
                this.calls, this.blocked_us = (
                    this.calls + was.calls,
                    this.blocked_us + was.blocked_us,
                )
                if was.longest_us >= this.longest_us:
                    this = msgspec.structs.replace(
                        was, calls=this.calls, blocked_us=this.blocked_us
                    )
            groups[key] = this
    return sorted(groups.values(), key=lambda x: (-x.blocked_us, x.phase, x.call))


def inputs_of(shapes: str) -> str:
    """An op's recorded input shapes without the inputs that are no tensor: ``[[88], [], []]`` ->
    ``[88]``."""
    try:
        dims = msgspec.json.decode(shapes)
    except msgspec.DecodeError:
        return shapes
    if not isinstance(dims, list):
        return shapes
    return ", ".join(str(d).replace(" ", "") for d in dims if d not in ([], None, ""))

"""Analyse one decoded trace: steps and phases, GPU attribution, memory, ops, swimlanes.

GPU work is attributed by its launch: device event -> ``correlation`` -> the runtime
call that launched it -> the phase covering that call's start on the host timeline. Record-function
ranges do not contain backward kernels (autograd launches them from its own thread), and the GPU
may run a step's work after the CPU has moved on; the launch instant is what ties work to a phase.
Work launched in time kept out of the steps (an evaluation pass, ``prof.paused()``) is in no step's
figures: it is counted apart, per step window and kind (`SpanAnalysis.apart_gpu_us`).
"""

from __future__ import annotations

import os
import re

import numpy as np

from phaseprof.contract import OUT_OF_STEP

from ..reading.discovery import display
from ..reading.events import ANNOTATION, KERNEL, OP, RUNTIME, Trace
from .blocking import blocking_calls, blocking_mask, launch_queues
from .collectives import collective_table
from .critical_path import critical_paths
from .cut import cut_steps
from .idle import idle_split
from .kernels import COLLECTIVE_KERNEL, kernel_table
from .memory import has_baseline, memory_curve, running_allocated
from .memory_ops import memory_tables
from .model import Apart, GpuMeasures, Lanes, OpTable, SpanAnalysis
from .modules import module_range_names, module_table
from .nesting import Nesting, nest
from .partition import Partition, partition
from .stacks import op_paths
from .untraced import untraced_us

#: Swimlane bands of one phase parted by less than this share of the step's wall time (a pixel or less
#: on a chart up to 1000 px wide) may be drawn as one band ...
_LANE_MERGE_SHARE = 0.001
#: ... as long as the gaps so filled add to at most this share of the lane's busy time in the step.
_LANE_BUSY_SLACK = 0.005
#: Runtime calls that block the host until the GPU (or the allocator) is done.
SYNC_CALLS = re.compile(r"^(cuda|hip)((Stream|Device|Event)Synchronize|Memcpy(2D)?|Malloc|Free)$")
#: A runtime call this many times slower than usual for its name (and at least _STALL_US) waited:
#: a full launch queue or an implicit synchronization. What it took beyond the usual is waiting.
_STALL_FACTOR = 4.0
_STALL_US = 50.0
#: Device work of collectives (NCCL/RCCL/gloo kernels: `kernels.COLLECTIVE_KERNEL`) is
#: communication by its name, and so is any device work launched under a collective op
#: (``record_param_comms`` wraps each c10d collective, with the copies it makes).
COLLECTIVE_OP = re.compile(r"^(nccl|gloo|mpi|ucc|c10d)(:|::)|^record_param_comms$")


def analyze_trace(trace: Trace, worker: str = "", n: Nesting | None = None,
                  part: Partition | None = None) -> SpanAnalysis:
    """Everything the reports and the TensorBoard tab show about one trace file (``n``, ``part``: its
    nesting and partition, when the caller has them already)."""
    n = n if n is not None else nest(trace.host)
    part = part if part is not None else partition(trace, n)
    steps, phases = part.steps, part.phases
    shape2 = (len(steps), len(phases))
    flat_size = shape2[0] * shape2[1]

    seg_key = part.step.astype(np.int64) * len(phases) + part.phase
    host_us = _sums(seg_key, part.end - part.start, shape2)

    launch = launches(trace, n)
    dev = trace.device
    has_gpu = len(dev) > 0
    dev_step, dev_phase = part.locate(launch.ts)
    attributed = dev_step >= 0
    dev_key = dev_step[attributed].astype(np.int64) * len(phases) + dev_phase[attributed]
    gpu_us = _sums(dev_key, dev.dur[attributed], shape2)
    busy = _Busy(dev.ts, dev.ts + dev.dur)
    seg_idle = (part.end - part.start) - busy.within(part.start, part.end)
    gpu_idle = _sums(seg_key, seg_idle, shape2)
    step_idle = np.bincount(part.step, weights=seg_idle, minlength=len(steps)).astype(np.float64)
    step_gpu = gpu_us.sum(axis=1)
    out_step, out_kind = part.locate_apart(launch.ts)
    away = out_step >= 0
    apart_gpu = _sums(out_step[away].astype(np.int64) * len(OUT_OF_STEP) + out_kind[away], dev.dur[away],
                        (len(steps), len(OUT_OF_STEP)))
    if not has_gpu:
        gpu_idle[:] = np.nan
        step_idle[:] = np.nan

    blocks, copy_of = blocking_mask(trace, n, launch.runtime)
    wait = np.minimum(_waits(trace, n, part, shape2, blocks), host_us)
    comm = communication(trace, n, launch)
    computing = (dev.kind == KERNEL) & ~comm  # compute: no copy or set, no collective's work
    compute_busy = _Busy(dev.ts[computing], dev.ts[computing] + dev.dur[computing])
    compute_idle = _sums(seg_key, (part.end - part.start) - compute_busy.within(part.start, part.end), shape2)
    if not has_gpu:
        compute_idle[:] = np.nan
    gpu = gpu_measures(trace, part, dev_step, dev_phase, comm, shape2, launch.ts)
    allocated = running_allocated(trace)
    peak, delta = _memory(trace, part, shape2, allocated)
    self_gpu, op_gpu = _op_gpu(trace, n, launch)
    paths, op_stack = op_paths(trace.python, n)
    queue_labels, queue_stream = streams(dev.device, dev.stream)
    queues, queue_steps = launch_queues(trace, part, launch.runtime, launch.ts, dev_step,
                                        queue_labels, queue_stream)
    blocking = blocking_calls(trace, n, part, blocks, copy_of, op_stack, queue_steps,
                              len(queue_labels))
    critical = critical_paths(trace, n, part, launch.runtime, launch.ts, blocks, copy_of, comm,
                           dev_phase, queue_stream, queue_labels)
    ops = _op_table(trace, n, part, self_gpu, op_gpu, op_stack)
    kernels = kernel_table(trace, launch.op_name(n), dev_step, dev_phase)
    collectives = collective_table(trace, n, part, launch.runtime, launch.ts, comm)
    memory_ops, memory_events = memory_tables(trace, n, part, allocated)
    lanes = _lanes(trace, n, part, launch, dev_step, dev_phase)
    return SpanAnalysis(
        file=display(os.path.basename(trace.path)),
        worker=worker,
        steps=steps,
        phases=phases,
        names=trace.names,
        shapes=trace.shapes,
        host_us=host_us,
        gpu_us=gpu_us,
        gpu_idle_us=gpu_idle,
        compute_idle_us=compute_idle,
        launches=np.bincount(dev_key, minlength=flat_size).reshape(shape2),
        wait_us=wait,
        gpu=gpu,
        untraced_us=untraced_us(n, part, shape2, _Busy),
        step_gpu_us=step_gpu,
        step_gpu_idle_us=step_idle,
        memory_devices=trace.memory_devices,
        memory_peak=peak,
        memory_delta=delta,
        ops=ops,
        call_paths=paths,
        modules=module_table(trace, n, part, launch.runtime, op_gpu),
        kernels=kernels,
        collectives=collectives,
        blocking=blocking,
        queues=queues,
        critical_path=critical,
        memory_curve=memory_curve(trace, part, allocated),
        memory_baseline=has_baseline(trace, allocated),
        memory_ops=memory_ops,
        memory_events=memory_events,
        lanes=lanes,
        apart=Apart(step=part.apart_step, kind=part.apart_kind, start=part.apart_start,
                        end=part.apart_end),
        apart_gpu_us=apart_gpu,
        has_gpu=has_gpu,
        cut=cut_steps(steps, n, dev.ts + dev.dur),
        rank=trace.rank,
        world_size=trace.world_size,
        gpu_names=[trace.gpu_names[d] for d in np.unique(dev.device).tolist() if 0 <= d < len(trace.gpu_names)],
        gpu_capabilities=[trace.gpu_capabilities[d] if d < len(trace.gpu_capabilities) else ""
                          for d in np.unique(dev.device).tolist() if 0 <= d < len(trace.gpu_names)],
        cpus=trace.cpus,
        skipped_events=trace.skipped,
        first_problem=trace.first_problem,
    )


def _sums(key: np.ndarray, weights: np.ndarray, shape2: tuple[int, int]) -> np.ndarray:
    """Sums of ``weights`` per (step, phase) key, as floats even when there is nothing to sum."""
    flat = np.bincount(key, weights=weights, minlength=shape2[0] * shape2[1]).astype(np.float64)
    return flat.reshape(shape2)


class Launch:
    """For each device event: the runtime call that launched it (sorted host index, -1 if unknown)
    and that call's start."""

    def __init__(self, runtime: np.ndarray, ts: np.ndarray):
        self.runtime = runtime
        self.ts = ts

    def owner(self, n: Nesting) -> np.ndarray:
        """The op that launched each device event: the one enclosing its runtime call, else the call
        itself (-1 where the launch is unknown); indices into ``n``."""
        if not len(n.parent):  # no host events: no launch is known
            return np.full(len(self.runtime), -1, dtype=np.int64)
        runtime = np.maximum(self.runtime, 0)
        owner = np.where(n.parent[runtime] >= 0, n.parent[runtime], runtime)
        return np.where(self.runtime >= 0, owner, -1)

    def op_name(self, n: Nesting) -> np.ndarray:
        """Name code of the op that launched each device event (-1 where unknown)."""
        owner = self.owner(n)
        if not len(n.name):
            return owner
        return np.where(owner >= 0, n.name[np.maximum(owner, 0)], -1)


def launches(trace: Trace, n: Nesting) -> Launch:
    dev = trace.device
    rt = np.flatnonzero(n.kind == RUNTIME)
    corr = trace.host.corr[n.order[rt]]
    rt, corr = rt[corr >= 0], corr[corr >= 0]
    runtime = np.full(len(dev), -1, dtype=np.int64)
    if len(rt) and len(dev):
        by = np.argsort(corr, kind="stable")
        by_corr, keys = rt[by], corr[by]
        pos = np.minimum(np.searchsorted(keys, dev.corr), len(keys) - 1)
        found = (keys[pos] == dev.corr) & (dev.corr >= 0)
        runtime[found] = by_corr[pos[found]]
    ts = np.full(len(dev), np.nan)
    found = runtime >= 0
    ts[found] = n.ts[runtime[found]]
    return Launch(runtime, ts)


class _Busy:
    """The union of device activity, for "how much of [a, b) was the GPU busy"."""

    def __init__(self, start: np.ndarray, end: np.ndarray):
        if not len(start):
            self.start = self.end = self.before = np.zeros(0)
            return
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
        reach = np.maximum.accumulate(end)
        new = np.r_[True, start[1:] > reach[:-1]]
        first = np.flatnonzero(new)
        self.start = start[first]
        self.end = np.maximum.reduceat(end, first)
        self.before = np.r_[0.0, np.cumsum(self.end - self.start)]  # busy time before interval k

    def _until(self, t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.start, t, side="right") - 1
        inside = np.clip(t - self.start[np.maximum(k, 0)], 0, (self.end - self.start)[np.maximum(k, 0)])
        return np.where(k >= 0, self.before[np.maximum(k, 0)] + inside, 0.0)

    def within(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not len(self.start):
            return np.zeros(len(a))
        return self._until(b) - self._until(a)


def _waits(trace: Trace, n: Nesting, part: Partition, shape2: tuple[int, int],
           blocks: np.ndarray) -> np.ndarray:
    """Host time per (step, phase) in runtime calls that waited for the GPU (see
    `SpanAnalysis.wait_us`; ``blocks``: per host event, a call that blocked the host,
    `blocking.blocking_mask`)."""
    out = np.zeros(shape2)
    rt = np.flatnonzero(n.kind == RUNTIME)
    if not len(rt):
        return out
    names, dur = n.name[rt], n.dur[rt]
    sync = np.array([bool(SYNC_CALLS.match(name)) for name in trace.names] or [False])
    usual = _medians_by(names, dur)
    stalled = (dur >= _STALL_FACTOR * usual) & (dur >= _STALL_US)
    waited = np.where(sync[names] | blocks[rt], dur, np.where(stalled, dur - usual, 0.0))
    step, phase = part.locate(n.ts[rt])
    inside = (step >= 0) & (waited > 0)
    np.add.at(out, (step[inside], phase[inside]), waited[inside])
    return out


def _medians_by(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per element, the median of ``value`` over the elements of its ``key`` (as `np.median` gives
    it: the middle value, or the mean of the two middle ones), by one sort of all: a median per key
    over a mask of the whole array was a pass per distinct key."""
    order = np.argsort(value)  # equal values may come in any order: the medians are the same
    k = key[order]
    small = len(k) and k.min() >= 0 and k.max() < np.iinfo(np.int16).max  # radix-sortable
    order = order[np.argsort(k.astype(np.int16) if small else k, kind="stable")]
    k, v = key[order], value[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    count = np.diff(np.r_[first, len(k)])
    lo, hi = first + (count - 1) // 2, first + count // 2
    median = (v[lo] + v[hi]) / 2  # the middle value itself where lo == hi: (x + x) / 2 == x
    return median[np.searchsorted(k[first], key)]


def communication(trace: Trace, n: Nesting, launch: Launch) -> np.ndarray:
    """Which device events are communication: collective kernels by name, and any work launched
    (through its runtime call) under a collective op on the host."""
    dev = trace.device
    by_name = np.array([bool(COLLECTIVE_KERNEL.search(name)) for name in trace.names] or [False])
    comm = by_name[dev.name] if len(dev) else np.zeros(0, dtype=bool)
    if not len(n.name) or not len(dev):
        return comm
    op_name = np.array([bool(COLLECTIVE_OP.match(name)) for name in trace.names] or [False])
    under = op_name[n.name]
    for d in range(1, int(n.depth.max(initial=0)) + 1):  # a loop over depth, not over events
        at = np.flatnonzero(n.depth == d)
        under[at] |= under[n.parent[at]]
    known = launch.runtime >= 0
    comm[known] |= under[launch.runtime[known]]
    return comm


def owned_pieces(start: np.ndarray, dur: np.ndarray, step: np.ndarray,
                 steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One owner per GPU instant: the device work of the steps cut where each step's work has all
    ended. An instant belongs to the earliest step whose work has not all ended by then (work of a
    later step running before it has is counted there, once); so the steps' GPU windows follow each
    other without overlap and their figures add up to the trace's. Returns the pieces: the event
    each is of (index into the arguments), its owner step, start and end."""
    end = start + dur
    last = np.full(steps, -np.inf)
    np.maximum.at(last, step, end)
    bound = np.maximum.accumulate(last)  # no instant before bound[s] belongs to a step after s
    first = np.minimum(np.searchsorted(bound, start, side="right"), step)
    # the owner of the instants just before each end
    final = np.minimum(np.searchsorted(bound, end, side="left"), step)
    count = final - first + 1
    src = np.repeat(np.arange(len(start)), count)
    k = np.arange(len(src)) - np.repeat(np.cumsum(count) - count, count)  # piece k of its event
    owner = first[src] + k
    cut_start = np.where(k == 0, start[src], bound[np.maximum(owner - 1, 0)])
    cut_end = np.where(owner == final[src], end[src], bound[owner])
    piece = (cut_end > cut_start) | (count[src] == 1)  # no piece for a step owning nothing
    return src[piece], owner[piece], cut_start[piece], cut_end[piece]


def gpu_measures(trace: Trace, part: Partition, dev_step: np.ndarray, dev_phase: np.ndarray, comm: np.ndarray,
                 shape2: tuple[int, int], launch_ts: np.ndarray) -> GpuMeasures:
    """GPU busy, compute, communication, memory and their exposed parts per step and phase, GPU busy
    per stream, its idle time split by what it waited for (`idle.idle_split`; ``launch_ts``: each
    device event's runtime call start), device time per kind of copy or set, and the GPU window of
    each step's work (see `GpuMeasures`). Work is communication (``comm``), else memory (copies and
    sets), else compute.

    One sweep over the starts and ends of the device events attributed to a step, in (step, time)
    order: between two consecutive ones lies a segment. For each kind of column (a phase's compute, a
    phase's communication, a phase's work of either kind, a stream) the runs of segments in which the
    column has work running are found by a running count per column; how many columns of a kind run
    in each segment follows from where runs begin and end. An instant's time is then shared equally
    among the phases running in it through a prefix sum over the segments, so each run's share is one
    difference: O(n log n) in the events, whatever the number of phases and streams."""
    steps, phases = shape2
    dev = trace.device
    keep = np.flatnonzero(dev_step >= 0)
    m = len(keep)
    step, phase = dev_step[keep].astype(np.int64), dev_phase[keep].astype(np.int64)
    # times from the first event: near the epoch a float64 µs is 0.25 µs coarse, and sums of many
    # differences would drift past the durations they are made of
    base = float(dev.ts[keep].min()) if m else 0.0
    src, step, start, end = owned_pieces(dev.ts[keep] - base, np.maximum(dev.dur[keep], 0.0), step,
                                         steps)
    keep, phase, m = keep[src], phase[src], len(src)
    labels, stream = streams(dev.device[keep], dev.stream[keep])
    talk = comm[keep]
    copying = (dev.kind[keep] != KERNEL) & ~talk  # copies and sets that are not a collective's

    t = np.concatenate([start, end])
    ends_last = np.r_[np.zeros(m, np.int8), np.ones(m, np.int8)]  # at one instant, starts before ends
    order = np.lexsort((ends_last, t, np.concatenate([step, step])))
    place_of = np.empty(2 * m, dtype=np.int64)
    place_of[order] = np.arange(2 * m)  # where each start (then each end) lies in the sweep
    seg_step = np.concatenate([step, step])[order]
    seg = np.where(seg_step[1:] == seg_step[:-1], np.diff(t[order]), 0.0)  # segment k: between places k, k+1

    def runs(column: np.ndarray, member: np.ndarray) -> tuple[np.ndarray, ...]:
        """The runs of work of each column (``column`` of the events ``member`` marks): their column,
        first and last place; and how many columns run in each segment."""
        idx = np.flatnonzero(member)
        col = np.concatenate([column[idx], column[idx]])
        place = np.concatenate([place_of[idx], place_of[m + idx]])
        by = np.lexsort((place, col))
        sign = np.r_[np.ones(len(idx), np.int64), -np.ones(len(idx), np.int64)][by]
        count = np.cumsum(sign)  # each column's count is back to 0 at the end of each step
        before = count - sign
        on, off = by[(before == 0) & (count > 0)], by[(count == 0) & (before > 0)]
        flips = np.bincount(place[on], minlength=2 * m) - np.bincount(place[off], minlength=2 * m)
        return col[on], place[on], place[off], np.cumsum(flips)[:-1]

    def shared(run: tuple[np.ndarray, ...], weight: np.ndarray, width: int) -> np.ndarray:
        """Per (step, column): the ``weight`` of the segments of its runs."""
        col, first, last, _ = run
        prefix = np.r_[0.0, np.cumsum(weight)]
        out = np.bincount(seg_step[first] * width + col, weights=prefix[last] - prefix[first],
                          minlength=steps * width)
        return out.reshape(steps, width)

    def each(n: np.ndarray) -> np.ndarray:
        """Each segment's time shared among the ``n`` columns running in it."""
        return np.where(n > 0, seg / np.maximum(n, 1), 0.0)

    everything = np.ones(m, dtype=bool)
    compute, talking = runs(phase, ~talk & ~copying), runs(phase, talk)
    memory = runs(phase, copying)
    either, on_stream = runs(phase, everything), runs(stream, everything)
    n_compute, n_comm, n_memory = compute[3], talking[3], memory[3]

    # device time of each kind of copy or set (its name: "Memcpy HtoD (Pageable -> Device)", …)
    kind_codes, kind_of = np.unique(dev.name[keep][copying], return_inverse=True)
    kinds = [trace.names[k] for k in kind_codes.tolist()]
    kind_us = np.bincount(step[copying] * len(kinds) + kind_of.ravel(),
                          weights=end[copying] - start[copying],
                          minlength=steps * len(kinds)).reshape(steps, len(kinds))
    return GpuMeasures(
        busy_us=shared(either, each(either[3]), phases),
        compute_us=shared(compute, each(n_compute), phases),
        comm_us=shared(talking, each(n_comm), phases),
        exposed_us=shared(talking, np.where(n_compute > 0, 0.0, each(n_comm)), phases),
        memory_us=shared(memory, each(n_memory), phases),
        memory_exposed_us=shared(memory, np.where(n_compute + n_comm > 0, 0.0, each(n_memory)),
                                 phases),
        memory_kinds=kinds,
        memory_kind_us=kind_us,
        streams=labels,
        stream_busy_us=shared(on_stream, seg, len(labels)),
        idle_split_us=idle_split(step, stream, start, end, launch_ts[keep] - base, steps, len(labels)),
        **_gpu_windows(part, step, start, end, base),
    )


def _gpu_windows(part: Partition, step: np.ndarray, start: np.ndarray, end: np.ndarray,
                 base: float) -> dict[str, np.ndarray]:
    """The `GpuMeasures` fields of each step's GPU window (device times ``start``/``end`` from
    ``base``): ``window_us`` from its first device start to its last end, ``window_start_us``
    where it opens (NaN without device work), ``past_host_us`` how far it ran past the host's
    end."""
    steps = len(part.steps)
    window = np.zeros(steps)
    past = np.zeros(steps)
    opens = np.full(steps, np.nan)
    if len(step):
        first = np.full(steps, np.inf)
        last = np.full(steps, -np.inf)
        np.minimum.at(first, step, start)
        np.maximum.at(last, step, end)
        has = np.isfinite(first)
        window[has] = last[has] - first[has]
        opens[has] = first[has] + base
        ends = np.array([s.end for s in part.steps]) - base
        past[has] = np.maximum(last[has] - ends[has], 0.0)
    return {"window_us": window, "window_start_us": opens, "past_host_us": past}


def _memory(trace: Trace, part: Partition, shape2: tuple[int, int],
            total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Peak allocated and net allocated bytes per (step, phase, device); ``total`` is the allocated
    bytes after each memory event."""
    mem = trace.memory
    devices = max(len(trace.memory_devices), 1)
    shape3 = (*shape2, devices)
    peak = np.full(shape3, -1, dtype=np.int64)
    delta = np.zeros(shape3, dtype=np.int64)
    if not len(mem):
        return peak, delta
    step, phase = part.locate(mem.ts)
    inside = step >= 0
    key = (step[inside].astype(np.int64) * shape2[1] + phase[inside]) * devices + mem.device[inside]
    np.maximum.at(peak.reshape(-1), key, total[inside])
    np.add.at(delta.reshape(-1), key, mem.nbytes[inside])
    return peak, delta


def _op_gpu(trace: Trace, n: Nesting, launch: Launch) -> tuple[np.ndarray, np.ndarray]:
    """Per host event of ``n``: the device time it launched itself, and with its children's."""
    # Device time belongs to the op that made the runtime call launching it ("self"), and through
    # it to that op's ancestors. A runtime call outside any op keeps it itself.
    self_gpu = np.zeros(len(n.ts))
    owner = launch.owner(n)
    ok = owner >= 0
    np.add.at(self_gpu, owner[ok], trace.device.dur[ok])
    gpu = self_gpu.copy()
    if ok.any():
        for d in range(int(n.depth.max()), 0, -1):
            at = np.flatnonzero((n.depth == d) & (gpu > 0))
            np.add.at(gpu, n.parent[at], gpu[at])
    return self_gpu, gpu


def _op_table(trace: Trace, n: Nesting, part: Partition, self_gpu: np.ndarray, gpu: np.ndarray,
              stack: np.ndarray) -> OpTable:
    name, kind, shapes = n.name, n.kind, n.shapes
    step, phase = part.locate(n.ts)
    # phase ranges and step markers are not ops: they *are* the phases and steps; nor are module ranges
    keep = (step >= 0) & ((kind == OP) | (kind == ANNOTATION) | (kind == RUNTIME)) & ~part.marker_names[name]
    keep &= ~module_range_names(trace.names)[name] if len(name) else keep
    if len(n.thread):
        keep &= part.process_threads[n.thread]
    # Group by (step, op) where an op is (phase, name, input shapes): both through dense counts,
    # linear in the number of events (a sort would not be).
    nn, ns = max(len(trace.names), 1), max(len(trace.shapes), 1)
    combos, combo = _dense((phase[keep].astype(np.int64) * nn + name[keep]) * ns + shapes[keep])
    unique, inverse = _dense(step[keep].astype(np.int64) * max(len(combos), 1) + combo)
    count = len(unique)
    u_combo = combos[unique % max(len(combos), 1)]
    row_stack, row_stack_us = _main_stacks(inverse, stack[keep], n.dur[keep], count)
    return OpTable(
        step=(unique // max(len(combos), 1)).astype(np.int32),
        phase=(u_combo // (nn * ns)).astype(np.int32),
        name=(u_combo // ns % nn).astype(np.int32),
        shapes=(u_combo % ns).astype(np.int32),
        calls=np.bincount(inverse, minlength=count),
        self_us=np.bincount(inverse, weights=n.self_us[keep], minlength=count),
        total_us=np.bincount(inverse, weights=n.dur[keep], minlength=count),
        self_gpu_us=np.bincount(inverse, weights=self_gpu[keep], minlength=count),
        gpu_us=np.bincount(inverse, weights=gpu[keep], minlength=count),
        stack=row_stack,
        stack_us=row_stack_us,
    )


def _main_stacks(row: np.ndarray, stack: np.ndarray, dur: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the call path (node) of most of its host time, and that time; -1 and 0 without one."""
    main, main_us = np.full(rows, -1, np.int32), np.zeros(rows)
    known = stack >= 0
    if not known.any():
        return main, main_us
    pairs, inverse = np.unique(row[known].astype(np.int64) * (int(stack.max()) + 1) + stack[known],
                               return_inverse=True)
    us = np.bincount(inverse.ravel(), weights=dur[known], minlength=len(pairs))
    pair_row, pair_stack = pairs // (int(stack.max()) + 1), pairs % (int(stack.max()) + 1)
    order = np.lexsort((-us, pair_row))  # per row, most time first
    first = order[np.r_[True, pair_row[order][1:] != pair_row[order][:-1]]]
    main[pair_row[first]] = pair_stack[first]
    main_us[pair_row[first]] = us[first]
    return main, main_us


def _dense(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for non-negative keys, by counting rather than
    sorting when the key range is small enough to count over."""
    if not len(key):
        return key, key
    if key.max() < (1 << 26):
        present = np.bincount(key) > 0
        unique = np.flatnonzero(present)
        index = np.cumsum(present) - 1
        return unique, index[key]
    unique, inverse = np.unique(key, return_inverse=True)
    return unique, inverse.ravel()


def streams(device: np.ndarray, stream: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct (device, stream) pairs of some device work, in (device, stream) order, as labels,
    and each event's index into them. Each column is coded on its own first: `np.unique` over rows
    sorts them as opaque records, several times slower."""
    devices, d = np.unique(device, return_inverse=True)
    ids, s = np.unique(stream, return_inverse=True)
    pairs, inverse = _dense(d.astype(np.int64).ravel() * len(ids) + s.ravel())
    devices, ids = devices.tolist(), ids.tolist()
    labels = [f"GPU {devices[p // len(ids)]} stream {ids[p % len(ids)]}" for p in pairs.tolist()]
    return labels, inverse


def _lanes(trace: Trace, n: Nesting, part: Partition, launch: Launch, dev_step: np.ndarray,
           dev_phase: np.ndarray) -> Lanes:
    """Per step: the loop's thread as phase segments, other threads' top-level work and each GPU
    stream's work coloured by the phase that launched it: each lane's busy intervals (`_busy_bands`)."""
    labels = [trace.threads[part.main_thread].label if trace.threads else "host"]
    pieces = [(part.step, np.zeros(len(part.step), np.int32), part.start, part.end, part.phase)]
    side = (n.parent < 0) & (n.thread != part.main_thread)
    if len(n.thread):
        side &= part.process_threads[n.thread]
    side_idx = np.flatnonzero(side)
    if len(side_idx):
        step, phase = part.locate(n.ts[side_idx])
        threads, lane = np.unique(n.thread[side_idx], return_inverse=True)  # a lane per thread
        lane = (len(labels) + lane.ravel()).astype(np.int32)
        labels += [trace.threads[t].label for t in threads.tolist()]
        ok = step >= 0
        pieces.append((step[ok], lane[ok], n.ts[side_idx][ok], n.end[side_idx][ok], phase[ok]))
    dev = trace.device
    ok = dev_step >= 0
    if ok.any():
        stream_labels, inverse = streams(dev.device[ok], dev.stream[ok])
        base = len(labels)
        labels += stream_labels
        pieces.append((dev_step[ok], (base + inverse).astype(np.int32), dev.ts[ok],
                       dev.ts[ok] + dev.dur[ok], dev_phase[ok]))
    step = np.concatenate([p[0] for p in pieces]).astype(np.int32)
    lane = np.concatenate([p[1] for p in pieces]).astype(np.int32)
    start = np.concatenate([p[2] for p in pieces])
    end = np.concatenate([p[3] for p in pieces])
    phase = np.concatenate([p[4] for p in pieces]).astype(np.int32)
    order = np.lexsort((start, lane, step))
    step, lane, start, end, phase = step[order], lane[order], start[order], end[order], phase[order]
    wall = np.array([s.end - s.start for s in part.steps])
    first = _all_busy_bands(step, lane, start, end, phase, wall * _LANE_MERGE_SHARE)
    band_end = np.maximum.reduceat(end, first) if len(first) else end[:0]
    return Lanes(labels=labels, step=step[first], lane=lane[first], start=start[first], end=band_end,
                 phase=phase[first])


def _all_busy_bands(step: np.ndarray, lane: np.ndarray, start: np.ndarray, end: np.ndarray,
                    phase: np.ndarray, pixel: np.ndarray) -> np.ndarray:
    """Where each band of every lane of every step begins (indices into intervals ordered by step,
    lane and start; ``pixel`` per step): `_busy_bands` of all lanes at once, in whole-array steps,
    but for the lanes with gaps short enough to join: each has its own slack, judged on its own."""
    if not len(step):
        return np.zeros(0, np.int64)
    new = np.r_[True, (step[1:] != step[:-1]) | (lane[1:] != lane[:-1])]
    group = np.cumsum(new) - 1
    # each lane's running maximum of the ends, exactly: on the ends' ranks (integers), each lane's
    # lifted above every lane before it, so that one running maximum restarts at every lane
    ends, rank = np.unique(end, return_inverse=True)
    lift = group * len(ends)
    reach = ends[np.maximum.accumulate(rank.astype(np.int64) + lift) - lift]
    gap = start[1:] - reach[:-1]
    same = ~new[1:] & (phase[1:] == phase[:-1])
    first = np.flatnonzero(np.r_[True, ~(same & (gap <= 0))])
    short = np.unique(group[1:][same & (gap > 0) & (gap < pixel[step[1:]])])
    if not len(short):
        return first
    begins = np.flatnonzero(new)
    stops = np.r_[begins[1:], len(step)]
    bands = [first[~np.isin(group[first], short)]]
    for a, b in zip(begins[short].tolist(), stops[short].tolist()):
        bands.append(a + _busy_bands(start[a:b], end[a:b], phase[a:b], pixel[step[a]]))
    return np.sort(np.concatenate(bands))


def _busy_bands(start: np.ndarray, end: np.ndarray, phase: np.ndarray, pixel: float) -> np.ndarray:
    """Where each band of one lane of one step begins (indices into its time-ordered intervals).

    A band is the union of the lane's intervals of one phase: only overlapping or touching intervals
    join, and so do intervals parted by a gap shorter than ``pixel`` (too short to see), smallest
    gaps first, as long as the gaps joined add to at most `_LANE_BUSY_SLACK` of the lane's busy time:
    the bands drawn are never busier than the trace by more than that.
    """
    reach = np.maximum.accumulate(end)
    gap = start[1:] - reach[:-1]
    same = phase[1:] == phase[:-1]
    joined = same & (gap <= 0)
    busy = float(np.sum(np.maximum(end - np.r_[start[0], np.maximum(start[1:], reach[:-1])], 0)))
    small = np.flatnonzero(same & (gap > 0) & (gap < pixel))
    if len(small):
        small = small[np.argsort(gap[small], kind="stable")]
        fits = np.cumsum(gap[small]) <= busy * _LANE_BUSY_SLACK
        joined[small[fits]] = True
    return np.r_[0, np.flatnonzero(~joined) + 1]

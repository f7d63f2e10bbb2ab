"""A worker's step rows and one step in full, as typed answers.

Every step row names all phases of its worker, canonical ones first; host phase times add up to
the step's wall time. Time in a step's window kept out of the step (evaluation, ``prof.paused()``)
is carried apart: per kind in the row, and where it lies in the detail.
"""

from __future__ import annotations

import numpy as np

from phaseprof.contract import EVAL, OUT_OF_STEP, PAUSED

from ..answers import (
    BlockingCall,
    GpuTime,
    IdleSplit,
    Lanes,
    LaunchQueue,
    MemoryFigures,
    OpRow,
    PhaseTimes,
    StepDetail,
    StepRow,
)
from .blocking import inputs_of
from .model import SpanAnalysis
from .path_summary import step_path
from .stacks import stack, user_frame
from .worker import Worker, ms

#: A phase whose GPU is idle (no device work at all) at least this share of its host time is
#: CPU-bound; one whose GPU computes (compute kernels: no copy, set or collective) all but at most
#: the lower share of it, GPU-bound; in between, balanced. A GPU busy only copying or communicating
#: is never called GPU-bound: that is the measure the verdict names.
CPU_BOUND_IDLE = 0.5
GPU_BOUND_IDLE = 0.1


def verdict(host_us: float, idle_us: float, compute_idle_us: float, has_gpu: bool) -> str | None:
    """``cpu-bound`` / ``balanced`` / ``gpu-bound`` from how idle the GPU was during the phase
    (``idle_us``: no device work; ``compute_idle_us``: no compute kernel)."""
    if not has_gpu or host_us <= 0 or idle_us != idle_us:  # NaN (on a Python float: no numpy call)
        return None
    if idle_us / host_us >= CPU_BOUND_IDLE:
        return "cpu-bound"
    if compute_idle_us / host_us <= GPU_BOUND_IDLE:
        return "gpu-bound"
    return "balanced"


def step_rows(w: Worker, rows: list[int] | None = None) -> list[StepRow]:
    """The figures of each step (all, or ``rows``): wall time, and host/GPU time, GPU idle and
    verdict per phase."""
    rows = list(range(len(w.refs))) if rows is None else rows
    # flat lists of Python floats (a numpy scalar per cell is slow; a list per row kept the garbage
    # collector busy), each row's cells at k * width
    width = len(w.phases)
    cpu, idle = w.host_us[rows], w.gpu_idle_us[rows]
    host_ms, gpu_ms, idle_ms = (_ms_list(t) for t in (cpu, w.gpu_us[rows], idle))
    busy_ms, compute_ms, comm_ms, exposed_ms = (
        _ms_list(t[rows]) for t in (w.gpu_busy_us, w.gpu_compute_us, w.comm_us, w.exposed_comm_us))
    launches = w.launches[rows].astype(np.int64).ravel().tolist()
    apart, apart_gpu = _ms_list(w.apart_us[rows]), _ms_list(w.apart_gpu_us[rows])
    ev, pa = OUT_OF_STEP.index(EVAL), OUT_OF_STEP.index(PAUSED)
    kinds = len(OUT_OF_STEP)
    phases = w.phases
    cpu_us, idle_us = cpu.ravel().tolist(), idle.ravel().tolist()
    compute_idle_us = w.compute_idle_us[rows].ravel().tolist()
    on_gpu = w.on_gpu[rows].tolist()
    step_gpu_us, step_idle_us = w.kernel_us[rows].tolist(), w.step_gpu_idle_us[rows].tolist()
    wall_us = w.wall_us[rows].tolist()
    out = []
    for k, row in enumerate(rows):
        ref = w.refs[row]
        step = ref.span.steps[ref.index]
        has_gpu = on_gpu[k]
        inferred = step.inferred
        a, b = k * width, (k + 1) * width
        cells = zip(phases, host_ms[a:b], gpu_ms[a:b], idle_ms[a:b], launches[a:b], cpu_us[a:b],
                    idle_us[a:b], compute_idle_us[a:b], busy_ms[a:b], compute_ms[a:b], comm_ms[a:b],
                    exposed_ms[a:b])
        out.append(StepRow(
            step=step.number,
            span=ref.span.file,
            start_ms=ms(step.start),
            wall_ms=ms(wall_us[k]),
            eval_ms=apart[k * kinds + ev],
            eval_gpu_ms=apart_gpu[k * kinds + ev],
            paused_ms=apart[k * kinds + pa],
            paused_gpu_ms=apart_gpu[k * kinds + pa],
            gpu_ms=ms(step_gpu_us[k]),
            gpu_idle_ms=None if step_idle_us[k] != step_idle_us[k] else ms(step_idle_us[k]),
            inferred=bool(inferred),
            inferred_phases=sorted(inferred),
            inferred_step=step.inferred_step,
            empty=step.empty,
            phases={
                name: PhaseTimes(
                    host_ms=host,
                    gpu_ms=gpu,
                    gpu_idle_ms=idle_cell,
                    launches=launched,
                    verdict=verdict(host_us, idle_cell_us, compute_idle, True) if has_gpu else None,
                    inferred=name in inferred,
                    gpu_busy_ms=busy,
                    gpu_compute_ms=compute,
                    comm_ms=comm,
                    exposed_comm_ms=exposed,
                )
                for (name, host, gpu, idle_cell, launched, host_us, idle_cell_us, compute_idle,
                     busy, compute, comm, exposed) in cells
            },
            gpu_time=gpu_time(w, np.array([row])) if has_gpu else None,
        ))
    return out


def gpu_time(w: Worker, rows: np.ndarray) -> GpuTime | None:
    """The GPU measures of the steps ``rows`` of ``w``, their means when several (per stream: mean
    busy per step); None when none of them ran on a GPU."""
    rows = rows[w.on_gpu[rows]]
    if not len(rows):
        return None
    n = len(rows)
    comm = float(w.comm_us[rows].sum()) / n
    exposed = float(w.exposed_comm_us[rows].sum()) / n
    streams: dict[str, float] = {}
    kinds: dict[str, float] = {}
    idle: dict[str, np.ndarray] = {}
    for row in rows.tolist():
        for label, us in w.streams(row).items():
            streams[label] = streams.get(label, 0.0) + us
        for label, split in w.idle_split(row).items():
            idle[label] = idle.get(label, 0.0) + split
        for name, us in w.memory_kinds(row).items():
            kinds[name] = kinds.get(name, 0.0) + us
    busy = float(w.gpu_busy_us[rows].sum()) / n
    return GpuTime(
        busy_ms=ms(busy),
        kernel_ms=ms(w.kernel_us[rows].sum() / n),
        window_ms=ms(w.gpu_window_us[rows].sum() / n),
        compute_ms=ms(w.gpu_compute_us[rows].sum() / n),
        comm_ms=ms(comm),
        exposed_comm_ms=ms(exposed),
        overlap=round(1.0 - exposed / comm, 4) if comm > 0 else None,
        past_host_ms=ms(w.past_host_us[rows].sum() / n),
        streams={label: ms(us / n) for label, us in streams.items()},
        queues=_queues(w, rows),
        memory_ms=ms(w.memory_us[rows].sum() / n),
        exposed_memory_ms=ms(w.exposed_memory_us[rows].sum() / n),
        idle_ms=ms(max(float(w.gpu_window_us[rows].sum()) / n - busy, 0.0)),
        memory_kinds={name: ms(us / n)
                      for name, us in sorted(kinds.items(), key=lambda kv: -kv[1])},
        idle_split={label: IdleSplit(host_wait_ms=ms(v[0] / n), kernel_wait_ms=ms(v[1] / n),
                                     other_ms=ms(v[2] / n)) for label, v in idle.items()},
    )


def _queues(w: Worker, rows: np.ndarray) -> dict[str, LaunchQueue]:
    """Per stream, the launch queue and delay of the steps ``rows``: means of the steps' figures (of
    the steps that launched on it, for the delays), the largest maximum."""
    sums: dict[str, list] = {}
    for row in rows.tolist():
        ref = w.refs[row]
        q = ref.span.queues
        for s, label in enumerate(q.streams):
            acc = sums.setdefault(label, [0.0, 0, [], []])
            acc[0] += float(q.mean[ref.index, s])
            acc[1] = max(acc[1], int(q.max[ref.index, s]))
            for k, table in ((2, q.delay_p50_us), (3, q.delay_p90_us)):
                if not np.isnan(table[ref.index, s]):
                    acc[k].append(float(table[ref.index, s]))
    n = max(len(rows), 1)
    return {label: LaunchQueue(mean=round(acc[0] / n, 2), max=acc[1],
                               delay_p50_ms=ms(np.mean(acc[2])) if acc[2] else None,
                               delay_p90_ms=ms(np.mean(acc[3])) if acc[3] else None)
            for label, acc in sums.items() if acc[1] > 0 or acc[2]}


def _ms_list(us: np.ndarray) -> list[float | None]:
    """µs -> ms rounded to the µs, as a flat list (row after row); NaN (no GPU) -> None."""
    out = np.round(us / 1000.0, 3).ravel().tolist()
    if np.isnan(us).any():
        out = [None if v != v else v for v in out]
    return out


def op_rows(span: SpanAnalysis, rows: slice | np.ndarray, limit: int | None = None) -> list[OpRow]:
    """Op table rows by self host time, descending (as ``key_averages().table(sort_by="self_cpu_time_total")``),
    then by total host time."""
    t = span.ops
    idx = np.arange(len(t.step))[rows]
    idx = idx[np.lexsort((-t.total_us[idx], -t.self_us[idx]))]
    if limit is not None:
        idx = idx[:limit]
    return [
        OpRow(
            name=span.names[t.name[k]],
            shapes=span.shapes[t.shapes[k]] or None,
            calls=int(t.calls[k]),
            self_host_ms=ms(t.self_us[k]),
            host_ms=ms(t.total_us[k]),
            self_gpu_ms=ms(t.self_gpu_us[k]),
            gpu_ms=ms(t.gpu_us[k]),
            **op_stack(span, int(t.stack[k])),
        )
        for k in idx.tolist()
    ]


def op_stack(span: SpanAnalysis, node: int) -> dict:
    """An op row's ``stack`` and ``frame`` (`answers.OpRow`) for call path ``node`` of ``span``."""
    if node < 0:
        return {}
    frames = stack(span.call_paths, span.names, node)
    return {"stack": frames, "frame": user_frame(frames)}


def step_detail(w: Worker, row: int, run: str, op_limit: int | None = None) -> StepDetail:
    """One step in full: its row, the ops of each phase, memory per phase, and its swimlanes."""
    ref = w.refs[row]
    span, i = ref.span, ref.index
    phases = w.phases
    (figures,) = step_rows(w, [row])
    rows = span.ops.rows(i)
    phase_of_row = span.ops.phase[rows]
    ops: dict[str, list[OpRow]] = {}
    memory: dict[str, dict[str, MemoryFigures]] = {}
    for name in phases:
        ops[name], memory[name] = [], {}
        if name not in span.phases:
            continue
        j = span.phases.index(name)
        ops[name] = op_rows(span, np.arange(rows.start, rows.stop)[phase_of_row == j], op_limit)
        for d, device in enumerate(span.memory_devices):
            peak = int(span.memory_peak[i, j, d])
            delta = int(span.memory_delta[i, j, d])
            if peak >= 0 or delta:
                memory[name][device] = MemoryFigures(peak_bytes=peak if peak >= 0 else None, delta_bytes=delta)
    step = span.steps[i]
    lanes = span.lanes
    lr = lanes.rows(i)
    bands = [
        (int(lane), round((s - step.start) / 1000.0, 4), round((e - step.start) / 1000.0, 4), span.phases[p])
        for lane, s, e, p in zip(lanes.lane[lr].tolist(), lanes.start[lr].tolist(), lanes.end[lr].tolist(),
                                 lanes.phase[lr].tolist())
    ]
    used = sorted({b[0] for b in bands})
    remap = {old: new for new, old in enumerate(used)}
    return StepDetail(
        **{f: getattr(figures, f) for f in StepRow.__struct_fields__},
        run=run,
        worker=w.name,
        ops=ops,
        memory=memory,
        lanes=Lanes(labels=[lanes.labels[k] for k in used], bands=[(remap[b[0]], *b[1:]) for b in bands]),
        gpu_names=span.gpu_names,
        apart=apart_bands(span, i),
        blocking=blocking_calls(span, i),
        critical_path=step_path(span, i),
    )


def blocking_calls(span: SpanAnalysis, i: int) -> list[BlockingCall]:
    """The host calls of step ``i`` of ``span`` that waited for the device, in time order."""
    b, names, start = span.blocking, span.names, span.steps[i].start
    out = []
    for k in range(*b.rows(i).indices(len(b.step))):
        frames = op_stack(span, int(b.stack[k]))
        out.append(BlockingCall(
            phase=span.phases[b.phase[k]], call=names[b.call[k]],
            copy=names[b.copy[k]] if b.copy[k] >= 0 else None,
            op=names[b.op[k]] if b.op[k] >= 0 else None,
            inputs=inputs_of(span.shapes[b.shapes[k]]) or None, frame=frames.get("frame"),
            start_ms=ms(b.ts[k] - start), blocked_ms=ms(b.blocked_us[k]), queued=int(b.queued[k]),
            queue_stream=(span.queues.streams[b.queue_stream[k]] if b.queue_stream[k] >= 0
                          else None)))
    return out


def apart_bands(span: SpanAnalysis, i: int) -> list[tuple[float, float, str]]:
    """Where step ``i`` of ``span`` held time kept out of it: ``(from ms, to ms, kind)`` from its start."""
    o = span.apart
    rows = o.rows(i)
    start = span.steps[i].start
    return [(round((a - start) / 1000.0, 4), round((b - start) / 1000.0, 4), OUT_OF_STEP[k])
            for a, b, k in zip(o.start[rows].tolist(), o.end[rows].tolist(), o.kind[rows].tolist())]

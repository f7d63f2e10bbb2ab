"""Files in a logdir as training writes them: traces, per-step scalars, and their age."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from phaseprof.contract import EVAL_TAG, HOOK_TAG, PROFILER_TAG, STEP_TAG, gpu_tag, host_tag
from tests.tracebuilder import annotation, kernel, launch, memory, op, step, thread_names


def write_trace(path: os.PathLike, events: list[dict], **top) -> Path:
    """Write a Kineto-style trace (object with ``traceEvents``) to ``path`` (gzipped if it ends .gz)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"schemaVersion": 1, **top, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_scalars(run_dir, steps, phases=("data", "forward", "backward", "optimizer", "other")):
    """Per-step phase scalars as the training hook writes them (simple values, one event per step)."""
    writer = EventFileWriter(str(run_dir))
    for s in steps:
        values = [summary_pb2.Summary.Value(tag=host_tag(p), simple_value=float(s + i)) for i, p in enumerate(phases)]
        values.append(summary_pb2.Summary.Value(tag=gpu_tag("forward"), simple_value=0.5))
        values.append(summary_pb2.Summary.Value(tag=STEP_TAG, simple_value=float(5 * s + 10)))
        writer.add_event(event_pb2.Event(step=s, wall_time=time.time(), summary=summary_pb2.Summary(value=values)))
    writer.close()


def write_events(run_dir, rows: list[tuple[int, dict[str, float]]]) -> None:
    """Scalars as the training hook writes them, one event per step: ``rows`` of (step, tag -> value)."""
    writer = EventFileWriter(str(run_dir))
    for s, tags in rows:
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in tags.items()]
        writer.add_event(event_pb2.Event(step=s, wall_time=time.time(), summary=summary_pb2.Summary(value=values)))
    writer.close()


def settled(path):
    """Backdate a file so the store does not wait for it to finish being written."""
    old = time.time() - 60
    os.utime(path, (old, old))


def two_rank_job(run_dir, collectives: bool) -> None:
    """Two ranks of a data-parallel job, six steps each, whose straggler is known: rank 1 loads its data
    for 15 ms a step, rank 0 for 10 ms (each ±0.2 ms). With ``collectives``, both meet at an all_reduce in
    backward, so rank 0 waits there the 5 ms rank 1 is late and their steps take equally long; without,
    rank 1's steps are 5 ms longer. Worker names sort against rank order, so only the rank can tell them
    apart."""
    workers = {0: "host-b_100", 1: "host-a_200"}
    events = {rank: thread_names() for rank in workers}
    start = 0.0
    for n in range(1, 7):
        data = {rank: 10_000 + 5_000 * rank + 100 * ((3 * n + rank) % 5 - 2) for rank in workers}
        walls = {}
        for rank, ev in events.items():
            t = start
            ev.append(annotation("phaseprof::data", t, data[rank]))
            t += data[rank]
            ev.append(annotation("phaseprof::forward", t, 8_000))
            t += 8_000
            backward_start, t = t, t + 10_000  # backward's own work
            if collectives:  # the all_reduce ends when the later rank has joined it
                done = start + max(data.values()) + 8_000 + 10_000 + 1_000
                ev.append(op("c10d::allreduce_", t, done - t))
                t = done
            t += 2_000
            ev.append(annotation("phaseprof::backward", backward_start, t - backward_start))
            ev.append(annotation("phaseprof::optimizer", t, 3_000))
            t += 3_000
            ev.append(step(n, start, t - start))
            walls[rank] = t - start
        start += max(walls.values()) + 500
    for rank, worker in workers.items():
        write_trace(run_dir / f"{worker}.1.pt.trace.json", events[rank],
                    distributedInfo={"backend": "gloo", "rank": rank, "world_size": 2})
    for f in run_dir.iterdir():
        settled(f)


def hook_ms(step: int) -> float:
    """`evaluation_run`'s ``phaseprof/hook_ms``: more in the profiled steps (their ranges)."""
    return 0.5 if step in (1, 2, 3, 4, 5) else 0.02 + 0.001 * step


def evaluation_run(run_dir) -> None:
    """A run as the training hook writes it when its profiled window holds an evaluation pass and a
    ``prof.paused()`` block, each launching device work: a trace of steps 1..5 (each 10 ms of
    training, 3 ms forward, 4 ms backward, 2 ms optimizer, 1 ms other, a kernel launched by each of
    forward and backward) and per-step scalars of steps 0..9.

    Step 2's window also holds the batch fetch that ended the epoch (data, 0.5 ms), then the
    evaluation pass: 0.5 ms of ``other`` (its loader's first batch: the hook counts it in the pass),
    then the ``phaseprof::eval`` range, 14 ms holding a forward range of the model in eval mode, a
    5 ms kernel and a memory event. Step 3's window ends with a 10 ms ``phaseprof::paused`` range
    (a checkpoint, launching a 1 ms copy kernel) before its last 1 ms of other. The scalars have the
    pass as ``phaseprof/eval_ms`` at step 2 (14.5 ms; another at step 7) and the profiler's own time
    after each step (30 ms after step 5, which wrote the trace)."""
    events = thread_names()
    t, corr = 0.0, 0

    def phase(name: str, dur: float, kernel_us: float = 0.0, kernel_name: str = "") -> None:
        nonlocal t, corr
        events.append(annotation(f"phaseprof::{name}", t, dur))
        if kernel_us:
            corr += 1
            events.extend([launch(t + 10, corr), kernel(kernel_name or f"{name}_gemm", t + 20, kernel_us, corr)])
        t += dur

    for number in range(1, 6):
        start = t
        if number == 2:
            phase("data", 500)
            events.append(op("aten::stack", t + 100, 300))  # the eval loader's first batch, before the pass
            t += 500
            events.append(annotation("phaseprof::eval", t, 14_000))
            events.append(annotation("phaseprof::forward", t + 100, 9_000))  # a forward inside the pass
            events.append(op("aten::conv2d", t + 200, 5_000))
            corr += 1
            events.extend([launch(t + 1_000, corr), kernel("eval_conv", t + 1_100, 5_000, corr),
                           memory(t + 1_500, 1 << 20, 5 << 20)])
            t += 14_000
        phase("forward", 3_000, 1_000)
        phase("backward", 4_000, 2_000)
        phase("optimizer", 2_000)
        if number == 3:
            events.append(annotation("phaseprof::paused", t, 10_000))
            events.append(op("aten::save", t + 100, 5_000))
            corr += 1
            events.extend([launch(t + 200, corr), kernel("checkpoint_copy", t + 300, 1_000, corr)])
            t += 10_000
        events.append(op("aten::item", t + 100, 50))  # other: 1 ms
        t += (500 if number == 2 else 1_000)
        events.append(step(number, start, t - start))
        t += 5  # the profiler's own time between two steps
    write_trace(Path(run_dir) / "w.1.pt.trace.json", events)

    writer = EventFileWriter(str(run_dir))
    for s in range(10):
        phases = {"forward": 3.0, "backward": 4.0, "optimizer": 2.0, "other": 1.0}
        if s == 2:
            phases.update(data=0.5, other=0.5)
        values = {host_tag(p): v for p, v in phases.items()}
        values[STEP_TAG] = sum(phases.values())
        values[PROFILER_TAG] = 30.0 if s == 5 else 0.05
        values[HOOK_TAG] = hook_ms(s)
        if s in (2, 7):
            values[EVAL_TAG] = 14.5 if s == 2 else 15.0
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                             for k, v in values.items()])
        writer.add_event(event_pb2.Event(step=s, wall_time=time.time(), summary=summary))
    writer.close()

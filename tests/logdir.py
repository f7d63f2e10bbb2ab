"""Files in a logdir as training writes them: traces, per-step scalars, and their age."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from phaseprof.contract import STEP_TAG, cpu_tag, gpu_tag
from tests.tracebuilder import annotation, op, step, thread_names


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
        values = [summary_pb2.Summary.Value(tag=cpu_tag(p), simple_value=float(s + i)) for i, p in enumerate(phases)]
        values.append(summary_pb2.Summary.Value(tag=gpu_tag("forward"), simple_value=0.5))
        values.append(summary_pb2.Summary.Value(tag=STEP_TAG, simple_value=float(5 * s + 10)))
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

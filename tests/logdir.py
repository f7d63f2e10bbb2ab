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

"""Untraced host time: the instants of a phase in which the loop's process recorded no event.

The profiler records ops, runtime calls and ``record_function`` ranges, not the Python between them:
a dataset's ``__getitem__`` decoding images, logging, a checkpoint written with plain file I/O. Such
time is in a phase's host time but in none of its ops, and naming "the ops with the most self time"
for it would blame the op that happened to sit beside the gap. An instant is untraced when no thread
of the loop's process is inside an op, a runtime call or an annotation that marks no phase (phase
ranges and step markers cover everything, so they do not count); the other threads count because on
CUDA builds the loop's thread waits, recording nothing, while autograd's own thread runs backward.
"""

from __future__ import annotations

import numpy as np

from ..reading.events import ANNOTATION, OP, RUNTIME
from .nesting import Nesting
from .partition import Partition


def untraced_us(n: Nesting, part: Partition, shape2: tuple[int, int], union) -> np.ndarray:
    """(steps, phases) host µs with no recorded event; ``union(start, end)`` builds the union of
    intervals with ``within(a, b)`` (how much of each [a, b) it covers)."""
    out = np.zeros(shape2)
    if not len(part.start):
        return out
    recorded = np.isin(n.kind, (OP, ANNOTATION, RUNTIME))
    if len(n.name):
        recorded &= ~part.marker_names[n.name]
    if len(n.thread):
        recorded &= part.process_threads[n.thread]
    covered = union(n.ts[recorded], n.end[recorded]).within(part.start, part.end)
    gaps = np.maximum(part.end - part.start - covered, 0.0)
    np.add.at(out, (part.step, part.phase), gaps)
    return out

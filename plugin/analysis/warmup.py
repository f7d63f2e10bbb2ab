"""Warm-up steps: steps whose time went to one-off setup, left out of summaries as compiling steps are.

The first steps of a training run create CUDA streams, events and library handles, load kernels, let
cuDNN's benchmark mode time every algorithm, and grow the caching allocator's pool with ``cudaMalloc``;
later steps reuse all of it. Such a step can take tens of times the others, and kept in the means it
makes the findings about itself ("forward is 76% of an 882 ms step" where forward takes 38 ms).

A step holding work is warm-up when it took at least ``FAR`` times the median of the worker's other
steps and either
  * one-off setup calls (`SETUP_CALL`, host time on any thread) account for at least
    ``SETUP_SHARE`` of its excess over that median, or
  * it is the first step of its trace (span), where the profiler, the process or the loader start up,
    and slower than every other step (on a busy machine a first step as slow as later ones is noise).
Steps that compiled are judged apart (`Worker.compiling`) and are not among the "others"; a worker
needs at least one other step to judge against.
"""

from __future__ import annotations

import re

import numpy as np

from .model import SpanAnalysis

#: A warm-up step took at least this many times the median of the other steps,
FAR = 2.0
#: and one-off setup calls took at least this share of its excess over that median (unless it is the
#: first step of its trace).
SETUP_SHARE = 0.5
#: Runtime and library calls a training loop makes once: stream, event and handle creation, device
#: queries, module loads, cuDNN's algorithm search, and the allocator's cudaMalloc.
SETUP_CALL = re.compile(
    r"^(cuda|hip)(StreamCreate|EventCreate|DeviceGetStreamPriorityRange|GetDeviceProperties|GetDeviceCount"
    r"|DeviceGetAttribute|SetDevice|FuncGetAttributes|FuncSetAttribute|HostAlloc|MallocHost|HostRegister"
    r"|Malloc(Async)?$)\w*"
    r"|^cu(Init|CtxCreate|DevicePrimaryCtxRetain|ModuleLoad|LibraryLoad|ModuleGetFunction)\w*"
    r"|^(cudnn|miopen)(Create|Find|Get\w*Algorithm)\w*"
    r"|^(cublas|cublasLt|hipblas|hipblasLt|rocblas|cufft|cusparse|cusolver)\w*[Cc]reate\w*"
)


def setup_us(span: SpanAnalysis) -> np.ndarray:
    """Per step of ``span``: host µs of its one-off setup calls (`SETUP_CALL`)."""
    setup = np.array([bool(SETUP_CALL.match(n)) for n in span.names] or [False])
    t = span.ops
    picked = setup[t.name]
    return np.bincount(t.step[picked], weights=t.self_us[picked], minlength=len(span.steps)).astype(np.float64)


def warmup(wall_us: np.ndarray, setup: np.ndarray, first_of_trace: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Which of all steps are warm-up (bool per step), judging only ``rows`` (steps holding work
    that did not compile) against each other."""
    out = np.zeros(len(wall_us), dtype=bool)
    if len(rows) < 2:
        return out
    walls = wall_us[rows]
    others, most = _of_the_others(walls)
    slow = ~((others <= 0) | (walls < FAR * others))  # (NaN: a median that cannot rule a step out)
    first = first_of_trace[rows] & (walls > most)
    out[rows] = slow & (first | (setup[rows] >= SETUP_SHARE * (walls.astype(np.float64) - others)))
    if out[rows].all():  # nothing left to stand for the run: judge none
        out[:] = False
    return out


def _of_the_others(walls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the median and the largest of all the other steps' ``walls`` (n >= 2), as
    ``np.median`` and ``max`` of the others would give them, from one sort rather than n."""
    n = len(walls)
    order = np.argsort(walls, kind="stable")  # NaN sorts last
    ordered = walls[order]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    # the others, in order, are ``ordered`` without position rank: their i-th is ordered[i] below
    # the step's rank and ordered[i + 1] from it on; their median is their (n - 2) // 2-th, with
    # the (n - 1) // 2-th averaged in when n - 1 is even
    low, high = (n - 2) // 2, (n - 1) // 2
    at_low = ordered[low + (rank <= low)]
    at_high = ordered[high + (rank <= high)]
    middle = [at_low, at_high] if high > low else [at_low]
    median = np.mean(np.stack(middle), axis=0, dtype=np.float64)
    lost = np.isnan(walls)
    # np.median of values holding a NaN is NaN: the others hold one unless the step was the only one
    median = np.where(lost.sum() - lost > 0, np.nan, median)
    most = np.where(rank == n - 1, ordered[n - 2], ordered[n - 1])
    return median, most

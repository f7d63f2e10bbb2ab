"""The analysis's cost grows in a straight line along every dimension a trace grows in (steps,
events per step, nesting depth, streams, ranks, phase ranges in a step): counted, not timed, so it
holds on a busy machine. `benchmarks/scaling.py` times the same traces at larger sizes."""

from __future__ import annotations

import os
import sys
import tracemalloc

import numpy as np
import pytest

from phaseprof.cli.report import analyze
from phaseprof.plugin.analysis.nesting import nest
from phaseprof.plugin.analysis.partition import partition
from phaseprof.plugin.reading.decode import read_trace
from tests.scaling_traces import DIMENSIONS

#: Per 4x: linear is 4, n log n about 4.5; a cost quadratic anywhere makes it near 16.
LIMIT = 4.5
NUMPY = f"{os.sep}numpy{os.sep}"


def operations(path) -> tuple[int, int, int]:
    """(calls, bytes allocated, elements given to numpy's functions) of ``report --json --modules
    --kernels --collectives`` on ``path``.

    Calls: every Python and C function called (a numpy call per step or per level shows). Bytes:
    the memory allocated between calls, summed (from each call to the next, the peak of traced
    memory over what was held at the first: numpy's arrays and Python's objects are traced, and
    temporaries freed before the next call count too), which grows with the elements an
    expression touches: a loop whose few numpy calls each touch all the events shows here.
    Elements: the sizes of the arrays given to numpy's functions written in Python (``np.median``,
    ``np.delete``, ``np.flatnonzero``, ``np.searchsorted``...): what a call per step over all the
    steps touches."""
    calls = allocated = last = touched = 0

    def hook(frame, event, arg) -> None:
        nonlocal calls, allocated, last, touched
        if event == "call" or event == "c_call":
            calls += 1
        if event == "call" and NUMPY in frame.f_code.co_filename:
            code = frame.f_code
            for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
                value = frame.f_locals.get(name)
                if isinstance(value, np.ndarray):
                    touched += value.size
        now, peak = tracemalloc.get_traced_memory()
        allocated += max(peak - last, 0)  # the temporaries made since, freed or not
        tracemalloc.reset_peak()
        last = now

    tracemalloc.start()
    try:
        last = tracemalloc.get_traced_memory()[0]
        sys.setprofile(hook)
        try:
            report = analyze(str(path), modules=True, kernels=True, collectives=True)
        finally:
            sys.setprofile(None)
    finally:
        tracemalloc.stop()
    assert not report["errors"], report["errors"]
    return calls, allocated, touched


@pytest.mark.parametrize("dimension", list(DIMENSIONS))
def test_the_analysis_grows_linearly(dimension, tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "off")
    build, _, small = DIMENSIONS[dimension]  # small sizes, for the suite's time
    counts = []
    for n in (small, 4 * small):
        folder = tmp_path / str(n)
        folder.mkdir()
        analyze(str(build(n, folder)))  # imports and first-call caches out of the count
        counts.append(operations(build(n, folder)))
    for what, at_1x, at_4x in zip(("calls", "bytes", "elements"), *counts):
        assert at_4x / at_1x <= LIMIT, (dimension, what, at_1x, at_4x)


def numpy_calls(path) -> int:
    """The numpy functions `partition` calls on ``path`` (numpy's Python functions and the C
    functions and array methods the profiler sees; ufuncs are not seen)."""
    trace = read_trace(str(path))
    n = nest(trace.host)
    calls = 0

    def hook(frame, event, arg) -> None:
        nonlocal calls
        if event == "call" and NUMPY in frame.f_code.co_filename:
            calls += 1
        elif event == "c_call":
            owner = type(getattr(arg, "__self__", None)).__module__
            module = getattr(arg, "__module__", None) or owner
            calls += bool(module and module.startswith("numpy"))

    partition(trace, n)  # first-call caches out of the count
    sys.setprofile(hook)
    try:
        partition(trace, n)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("dimension", ["steps", "empty steps"])
def test_the_phase_split_makes_no_numpy_call_per_step(dimension, tmp_path):
    """Steps are split over whole arrays (`partition._plain_steps`, `partition._ranged_steps`): a
    few numpy calls per step, each far above a step's work, made 64,000 steps cost seconds."""
    build, _, small = DIMENSIONS[dimension]
    calls = []
    for n in (small, 4 * small):
        (tmp_path / str(n)).mkdir()
        calls.append(numpy_calls(build(n, tmp_path / str(n))))
    assert calls[1] <= 1.1 * calls[0], (dimension, calls)

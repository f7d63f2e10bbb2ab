"""Untraced host time from built host events and phase segments whose answer is known: what counts as
recorded (ops, runtime calls and ranges of the loop's process; not phase ranges, step markers, Python
functions or other processes' threads) and how each segment's gaps add up per step and phase.
tests/test_findings.py has the finding the user reads from it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from phaseprof.plugin.analysis.span import _Busy
from phaseprof.plugin.analysis.untraced import untraced_us
from phaseprof.plugin.reading.events import ANNOTATION, OP, PYTHON, RUNTIME

MARKER, OTHER_NAME = 1, 0  # name codes: a phase range or step marker, and an op's name
LOOP, ELSEWHERE = 0, 1  # thread codes: a thread of the loop's process, and one of another process


def _part(segments) -> SimpleNamespace:
    """``segments``: (start, end, step, phase) each."""
    start, end, step, phase = (np.array(c) for c in zip(*segments)) if segments else ([np.zeros(0)] * 4)
    return SimpleNamespace(start=np.asarray(start, float), end=np.asarray(end, float),
                           step=np.asarray(step, int), phase=np.asarray(phase, int),
                           marker_names=np.array([False, True]), process_threads=np.array([True, False]))


def _host(events) -> SimpleNamespace:
    """``events``: (start, end, kind, name code, thread code) each."""
    ts, end, kind, name, thread = (np.array(c) for c in zip(*events)) if events else ([np.zeros(0)] * 5)
    return SimpleNamespace(ts=np.asarray(ts, float), end=np.asarray(end, float), kind=np.asarray(kind, int),
                           name=np.asarray(name, int), thread=np.asarray(thread, int))


def test_only_ops_runtime_calls_and_ranges_of_the_loops_process_are_recorded_time():
    events = [(0, 100, ANNOTATION, MARKER, LOOP),  # the phase's range: covers everything, counts not
              (10, 30, OP, OTHER_NAME, LOOP), (40, 50, ANNOTATION, OTHER_NAME, LOOP),
              (60, 65, RUNTIME, OTHER_NAME, LOOP),
              (70, 90, PYTHON, OTHER_NAME, LOOP),  # a Python function: its time is untraced
              (80, 95, OP, OTHER_NAME, ELSEWHERE)]  # another process's op
    out = untraced_us(_host(events), _part([(0, 100, 0, 0)]), (1, 1), _Busy)
    assert out.tolist() == [[100.0 - 20 - 10 - 5]]


def test_each_segments_gaps_add_up_in_its_step_and_phase():
    # an op covers 0-30 and 120-150; segments: step 0 phase 1 (0-100), step 1 phase 0 (100-150 and
    # 150-160, the phase resumed), step 1 phase 1 (160-170, covered by a runtime call)
    events = [(0, 30, OP, OTHER_NAME, LOOP), (120, 150, OP, OTHER_NAME, LOOP),
              (160, 170, RUNTIME, OTHER_NAME, LOOP)]
    segments = [(0, 100, 0, 1), (100, 150, 1, 0), (150, 160, 1, 0), (160, 170, 1, 1)]
    out = untraced_us(_host(events), _part(segments), (3, 2), _Busy)
    assert out.tolist() == [[0.0, 70.0], [20.0 + 10.0, 0.0], [0.0, 0.0]]


def test_without_host_events_every_segment_is_untraced_and_without_segments_nothing_is():
    out = untraced_us(_host([]), _part([(0, 40, 0, 0), (40, 50, 1, 0)]), (2, 1), _Busy)
    assert out.tolist() == [[40.0], [10.0]]
    out = untraced_us(_host([(0, 10, OP, OTHER_NAME, LOOP)]), _part([]), (2, 3), _Busy)
    assert out.shape == (2, 3) and not out.any()

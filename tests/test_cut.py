"""The rule that names a trace's last step cut by the trace's end, on built steps whose answer is
known: each of its conditions at its bound (the noise: 5% of the step's wall time). tests/test_cut_step.py
has the real trace cut this way and what the summary does with the step."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from phaseprof.plugin.analysis.cut import NOISE_SHARE, cut_steps
from phaseprof.plugin.analysis.partition import Step

#: Step 1's window is 100-200 µs: the noise is 5 µs.
STEPS = [Step(0, 0.0, 100.0, events=5), Step(1, 100.0, 200.0, events=5)]
MARKERS = [(0.0, 100.0), (100.0, 200.0)]  # the steps' own markers


def _cut(host, device_end, steps=STEPS) -> list[bool]:
    """``host``: (start, end) of each host event besides the markers; ``device_end``: device work's ends."""
    ts, end = (np.array(c, dtype=float) for c in zip(*(MARKERS + host)))
    return cut_steps(steps, SimpleNamespace(ts=ts, end=end), np.array(device_end, dtype=float)).tolist()


def test_the_last_step_whose_host_stops_early_while_the_gpu_runs_to_the_traces_end_is_cut():
    assert NOISE_SHARE == 0.05
    # host work 110-120, then 80 µs of device work alone until the trace (and the step) ends
    assert _cut([(110.0, 120.0)], [150.0, 200.0]) == [False, True]
    # the trace may end within the noise after the step, by host or device work
    assert _cut([(110.0, 120.0), (190.0, 205.0)], [200.0]) == [False, False]  # host until 190-205
    assert _cut([(110.0, 120.0)], [205.0]) == [False, True]
    assert _cut([(110.0, 120.0), (201.0, 205.0)], [204.0]) == [False, True]


def test_a_step_whose_window_closes_before_the_devices_work_ends_is_whole():
    # the GPU runs 10 µs past the step's window (more than the noise): the trace ends with the GPU,
    # not with the step
    assert _cut([(110.0, 120.0)], [210.0]) == [False, False]
    # the trace ends with host work 4 µs past the step, 6 µs after the device's last work
    assert _cut([(110.0, 120.0), (201.0, 204.0)], [198.0]) == [False, False]


def test_the_tail_must_outlast_the_noise_both_in_the_window_and_on_the_gpu():
    assert _cut([(110.0, 195.0)], [200.0]) == [False, False]  # 5 µs of tail: the noise, not more
    assert _cut([(110.0, 194.9)], [200.0]) == [False, True]
    # 8 µs of window after the host, but the GPU's last work ends 4 µs after it (the trace 4 µs later)
    assert _cut([(110.0, 192.0)], [196.0]) == [False, False]
    # the GPU ends 7 µs after the host, the window only 3 µs after it
    assert _cut([(110.0, 197.0)], [204.0]) == [False, False]
    # each at the noise exactly, the other past it: not cut
    assert _cut([(110.0, 195.0)], [201.0]) == [False, False]  # the window 5 µs after the host
    assert _cut([(110.0, 194.0)], [199.0]) == [False, False]  # the GPU 5 µs after the host
    # the trace's end 5 µs after the device's last work is within the noise
    assert _cut([(110.0, 120.0)], [195.0]) == [False, True]


def test_the_noise_is_a_share_of_the_steps_own_time_less_what_is_kept_apart():
    assert _cut([(110.0, 196.0)], [200.0]) == [False, False]  # 4 µs of 100: within the noise
    apart = [STEPS[0], Step(1, 100.0, 200.0, events=5, apart={"eval": 50.0})]
    assert _cut([(110.0, 196.0)], [200.0], apart) == [False, True]  # 4 µs of 50: past it


def test_the_steps_marker_what_encloses_it_and_its_neighbours_work_are_not_its_host_work():
    # only work ending at the window's start (step 0's), one enclosing the window (an outer range)
    # and one starting where the window ends: the step holds no host work of its own
    assert _cut([(90.0, 100.0), (50.0, 200.0), (200.0, 201.0)], [200.0]) == [False, False]
    # with work of its own besides: cut, each of those left out of its last host work
    assert _cut([(90.0, 100.0), (50.0, 200.0), (200.0, 201.0), (100.0, 120.0)], [200.0]) == [False, True]


def test_only_a_last_step_holding_work_can_be_cut():
    empty_last = [STEPS[0], Step(1, 100.0, 200.0, events=0)]
    assert _cut([(110.0, 120.0)], [200.0], empty_last) == [False, False]
    assert _cut([(110.0, 120.0)], [200.0], [Step(1, 100.0, 200.0, events=0)] * 2) == [False, False]
    assert _cut([(110.0, 120.0)], [200.0], [STEPS[1]]) == [True]
    assert _cut([(110.0, 120.0)], [], STEPS) == [False, False]  # no device work: nothing drains


def test_a_trace_without_host_events_cuts_nothing():
    assert cut_steps(STEPS, SimpleNamespace(ts=np.zeros(0), end=np.zeros(0)), np.array([200.0])).tolist() \
        == [False, False]

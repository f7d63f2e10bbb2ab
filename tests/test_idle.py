"""The idle split of a stream (host wait, kernel wait, other) from pieces of device work whose gaps
are known by construction: each rule of HTA's (launched after the work before it ended; queued and
under 30 µs; queued and longer), the furthest end so far, and steps and streams kept apart."""

from __future__ import annotations

import numpy as np

from phaseprof.plugin.analysis.idle import KERNEL_WAIT_US, idle_split

NAN = float("nan")


def _split(pieces, steps: int = 1, streams: int = 1) -> np.ndarray:
    """``pieces``: (step, stream, start, end, launch) each, in any order."""
    step, stream, start, end, launch = (np.array(c) for c in zip(*pieces))
    return idle_split(step.astype(np.int32), stream.astype(np.int64), start.astype(float),
                      end.astype(float), launch.astype(float), steps, streams)


def test_each_gap_is_host_wait_kernel_wait_or_other_by_htas_rules():
    # 100-200; 210-260 launched at 50 (queued): 10 µs kernel wait; 320-370 launched at 300, after
    # 260: 60 µs host wait; 500-600 launched at 310 (queued behind 320-370): 130 µs other
    out = _split([(0, 0, 500, 600, 310), (0, 0, 100, 200, 0), (0, 0, 320, 370, 300),
                  (0, 0, 210, 260, 50)])
    assert out.tolist() == [[[60.0, 10.0, 130.0]]]


def test_a_queued_gap_of_30_us_is_other_and_a_launch_at_the_end_of_the_work_before_is_queued():
    assert KERNEL_WAIT_US == 30.0
    # 0-10, then 40-50 (gap 30, launched at 10: not after the work before ended), then 79.5-90
    # (gap 29.5, launch unknown: never host wait)
    out = _split([(0, 0, 0, 10, 0), (0, 0, 40, 50, 10), (0, 0, 79.5, 90, NAN)])
    assert out.tolist() == [[[0.0, 29.5, 30.0]]]
    # a launch unknown after a long gap is other, not host wait
    assert _split([(0, 0, 0, 10, 0), (0, 0, 500, 510, NAN)]).tolist() == [[[0.0, 0.0, 490.0]]]


def test_a_gap_is_from_the_furthest_end_so_far_not_the_last_pieces():
    # 10-20 runs inside 0-100: no gap, not -80 µs; the gap to 130 is from 100 (30 µs, other) and
    # 135 was launched at 120, before 130-140 ended: 0 µs, not a host wait
    out = _split([(0, 0, 0, 100, 0), (0, 0, 10, 20, 5), (0, 0, 130, 140, NAN), (0, 0, 140, 150, 120)])
    assert out.tolist() == [[[0.0, 0.0, 30.0]]]
    # the same in a later step, after another step's work
    later = [(1, 0, 0, 100, 0), (1, 0, 10, 20, 5), (1, 0, 130, 140, NAN), (0, 0, 0, 5, 0), (0, 0, 7, 9, 0)]
    assert _split(later, steps=2).tolist() == [[[0.0, 2.0, 0.0]], [[0.0, 0.0, 30.0]]]


def test_steps_and_streams_keep_their_gaps_apart():
    # step 0 stream 0 runs to 1000; step 1 stream 0 has a 40 µs gap at 10-50 that step 0's reach
    # must not cover; step 0 stream 1 a 5 µs kernel wait; step 1 stream 1 one piece at 300, no gap
    # from step 1 stream 0's last piece; step 2 holds nothing
    out = _split([(1, 0, 50, 60, NAN), (0, 1, 20, 25, NAN), (1, 1, 300, 400, 290), (0, 0, 0, 1000, 0),
                  (1, 0, 0, 10, NAN), (0, 1, 5, 15, 0)], steps=3, streams=2)
    expected = np.zeros((3, 2, 3))
    expected[1, 0] = (0, 0, 40)
    expected[0, 1] = (0, 5, 0)
    assert out.shape == (3, 2, 3)
    assert out.tolist() == expected.tolist()


def test_a_steps_reach_never_carries_into_the_next_however_close_their_ends():
    # step 0 reaches 100; step 1's first piece ends at 0.5, from the same lowest start: 10 µs of
    # kernel wait after it, measured from 0.5, not from any of step 0's time
    out = _split([(0, 0, 0, 100, 0), (1, 0, 0, 0.5, 0), (1, 0, 10.5, 11, NAN)], steps=2)
    assert out.tolist() == [[[0.0, 0.0, 0.0]], [[0.0, 10.0, 0.0]]]


def test_times_before_the_base_keep_their_gaps_apart():
    # pieces may start before the base (negative µs): a step's reach still stays in its step
    out = _split([(0, 0, -100, -90, NAN), (0, 0, -50, -40, NAN), (1, 0, -200, -190, NAN),
                  (1, 0, -185, -180, NAN)], steps=2)
    assert out.tolist() == [[[0.0, 0.0, 40.0]], [[0.0, 5.0, 0.0]]]


def test_fewer_than_two_pieces_have_no_gap():
    out = _split([(0, 1, 0, 10, 0)], steps=2, streams=3)
    assert out.shape == (2, 3, 3) and not out.any()

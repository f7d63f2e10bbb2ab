"""How host events nest (`plugin/analysis/nesting.py`): depth, parent and self time of hand-placed
events on two threads, whatever their order in the file."""

from __future__ import annotations

import numpy as np

from phaseprof.plugin.analysis.nesting import nest
from phaseprof.plugin.reading.events import HostEvents


def host(*events: tuple[float, float, int]) -> HostEvents:
    """Host events from (start µs, duration µs, thread); each event's name code is its position."""
    n = len(events)
    ts, dur, thread = (
        np.array([e[k] for e in events], dtype=t)
        for k, t in enumerate((np.float64, np.float64, np.int32))
    )
    return HostEvents(
        ts=ts.reshape(n),
        dur=dur.reshape(n),
        thread=thread.reshape(n),
        name=np.arange(n, dtype=np.int32),
        kind=np.zeros(n, np.int8),
        corr=np.full(n, -1, np.int64),
        shapes=np.arange(n, dtype=np.int32) + 10,
        comm=np.zeros(n, np.int32),
        seq=np.full(n, -1, np.int64),
    )


def by_name(n) -> dict[int, tuple[int, int | None, float]]:
    """Event (its position in the file) -> (depth, its parent's position or None, self µs)."""
    return {
        int(n.name[k]): (
            int(n.depth[k]),
            None if n.parent[k] < 0 else int(n.name[n.parent[k]]),
            float(n.self_us[k]),
        )
        for k in range(len(n.order))
    }


def test_a_tree_on_two_threads_gets_depths_parents_and_self_time():
    # thread 0: 0 [0, 100) holds 1 [10, 40) and 2 [40, 90); 1 holds 3 [15, 25); then 4 [100, 110)
    # touching 0 (touching is not nesting). Thread 1: 5 [20, 60) holding 6 [30, 35), listed first.
    n = nest(
        host(
            (0, 100, 0),
            (10, 30, 0),
            (40, 50, 0),
            (15, 10, 0),
            (100, 10, 0),
            (20, 40, 1),
            (30, 5, 1),
        )
    )
    assert by_name(n) == {
        0: (0, None, 20.0),
        1: (1, 0, 20.0),
        2: (1, 0, 50.0),
        3: (2, 1, 10.0),
        4: (0, None, 10.0),
        5: (0, None, 35.0),
        6: (1, 5, 5.0),
    }
    assert n.order.tolist() == [0, 1, 3, 2, 4, 5, 6]
    assert n.ts.tolist() == [0, 10, 15, 40, 100, 20, 30]
    assert n.end.tolist() == [100, 40, 25, 90, 110, 60, 35]
    assert n.dur.tolist() == [100, 30, 10, 50, 10, 40, 5]
    assert n.thread.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert n.shapes.tolist() == [10, 11, 13, 12, 14, 15, 16] and n.kind.tolist() == [0] * 7


def test_an_event_on_another_thread_is_never_a_parent():
    # thread 1's event lies inside thread 0's in time, but on its own thread it is top level
    n = nest(host((0, 100, 0), (10, 20, 1), (12, 5, 1)))
    assert by_name(n) == {0: (0, None, 100.0), 1: (0, None, 15.0), 2: (1, 1, 5.0)}


def test_events_of_one_start_nest_longest_first():
    # listed child first: the longer event of a shared start is the parent
    n = nest(host((5, 1, 0), (5, 3, 0), (5, 2, 0), (20, 1, 0)))
    assert by_name(n) == {1: (0, None, 1.0), 2: (1, 1, 1.0), 0: (2, 2, 1.0), 3: (0, None, 1.0)}


def test_zero_length_events_are_siblings_not_parents():
    # two zero-length events at 10 inside 0 [0, 50), then one starting at 10 too: none nests in them
    n = nest(host((0, 50, 0), (10, 0, 0), (10, 0, 0), (10, 5, 0), (30, 0, 0)))
    assert by_name(n) == {
        0: (0, None, 45.0),
        3: (1, 0, 5.0),
        1: (2, 3, 0.0),
        2: (2, 3, 0.0),
        4: (1, 0, 0.0),
    }


def test_zero_length_events_alone_at_one_start_stay_at_one_level():
    n = nest(host((0, 50, 0), (10, 0, 0), (10, 0, 0), (20, 0, 0)))
    assert by_name(n) == {0: (0, None, 50.0), 1: (1, 0, 0.0), 2: (1, 0, 0.0), 3: (1, 0, 0.0)}


def test_self_time_stays_within_zero_and_the_duration():
    # children rounded each on its own add up to a hair more than their parent
    n = nest(host((0, 10, 0), (0, 5.5, 0), (5.5, 4.6, 0)))
    assert by_name(n)[0] == (0, None, 0.0)
    assert (n.self_us >= 0).all() and (n.self_us <= n.dur).all()


def test_no_events():
    n = nest(host())
    assert len(n.order) == len(n.depth) == len(n.parent) == len(n.self_us) == 0

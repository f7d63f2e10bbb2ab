"""The line a report gives a file read only in part (`plugin/reading/problems.py`): how many events,
why, and which came first."""

from __future__ import annotations

from phaseprof.plugin.reading.decode import read_trace
from phaseprof.plugin.reading.problems import Problems, quoted
from phaseprof.plugin.reading.trace_fields import Event
from tests.logdir import write_trace
from tests.tracebuilder import op, step


def test_nothing_wrong_says_nothing():
    problems = Problems()
    problems.add([], "has no 'ts'")
    problems.degrade_events([], "stream id is out of range")
    assert (problems.count, problems.describe(), problems.first) == (0, "", None)


def test_one_reason_one_event():
    problems = Problems()
    problems.skip(3, "aten::mm", "dur is not a number")
    assert problems.count == 1
    assert (
        problems.describe() == "1 event skipped: dur is not a number; first: event 3 ('aten::mm')"
    )


def test_reasons_are_counted_apart_and_the_first_event_named_whichever_kind():
    problems = Problems()
    problems.degrade(7, "", "correlation is not a number")
    problems.skip(9, "x", "ph is not a string")
    problems.skip(2, "y", "ph is not a string")
    problems.skip(4, "z", "is not a JSON object")
    problems.degrade(8, "w", "correlation is not a number")
    assert problems.count == 5
    assert problems.describe() == (
        "3 events skipped: ph is not a string (2), is not a JSON object (1); "
        "2 events read without a field: correlation is not a number; first: event 7"
    )


def test_decoded_events_are_named_by_their_place_in_the_file():
    a, b, c = (Event(ph="X", name=n) for n in ("a", "b", ""))
    problems = Problems()
    problems.events, problems.positions = [a, b, c], [4, 10, 12]
    problems.add([b, a], "has no 'ts'")
    problems.degrade_events([c, c], "grid is not [x, y, z]")
    assert problems.count == 4
    assert problems.describe() == (
        "2 events skipped: has no 'ts'; 2 events read without a field: grid is "
        "not [x, y, z]; first: event 10 ('X' 'b')"
    )
    unnamed = Problems()
    unnamed.events = [a, c]  # every event decoded: its index is its place
    unnamed.degrade_events([c], "block is not [x, y, z]")
    assert (
        unnamed.describe()
        == "1 event read without a field: block is not [x, y, z]; first: event 1 ('X')"
    )


def test_the_halves_of_a_split_file_add_up_and_the_first_half_names_the_first_event():
    first, second = Problems(), Problems()
    second.skip(50, "late", "has no 'dur'")
    second.degrade(51, "", "stream id is out of range")
    first.skip(5, "early", "has no 'dur'")
    first.merge(second)
    assert first.describe() == (
        "2 events skipped: has no 'dur'; 1 event read without a field: stream id is "
        "out of range; first: event 5 ('early')"
    )
    empty = Problems()
    empty.merge(second)
    assert empty.first == (50, "event 50 ('late')")


def test_names_are_quoted_on_one_line_and_cut_at_60_characters():
    assert quoted("aten::mm") == "'aten::mm'"
    assert quoted("a\nb") == "'a\\nb'"
    assert quoted("x" * 60) == repr("x" * 60)
    assert quoted("x" * 61) == repr("x" * 60 + "…")
    assert quoted("x" * 20, limit=10) == repr("x" * 10 + "…")


def test_a_trace_names_its_first_malformed_event_by_its_place_in_the_file(tmp_path):
    events = [
        step(1, 0, 100),
        op("ok", 1, 1),
        {**op("n" * 70, 2, 1), "dur": "2"},
        {**op("m", 3, 1), "ts": []},
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert trace.skipped == 2
    assert trace.first_problem == (
        f"2 events skipped: dur is not a number (1), ts is not a number (1); "
        f"first: event 2 ({quoted('n' * 70)})"
    )


def test_an_event_not_among_the_decoded_ones_is_named_without_a_place():
    a, b = Event(ph="X", name="a"), Event(ph="i", name="")
    problems = Problems()
    problems.events, problems.positions = [a], [3]
    problems.add([b], "has no 'ts'")
    assert problems.describe() == "1 event skipped: has no 'ts'; first: event -1 ('i')"
    alone = Problems()  # no decoded events at hand
    alone.degrade_events([a], "grid is not [x, y, z]")
    assert alone.describe().endswith("; first: event -1 ('X' 'a')")

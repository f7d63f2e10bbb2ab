"""The event-by-event pass (`plugin/reading/lenient.py`): a file the typed pass refuses is read
event by event, each bad field dropped or its event skipped, and counted by reason."""

from __future__ import annotations

import json
import time
import types

import pytest

from phaseprof.contract import CPUS_KEY
from phaseprof.plugin.reading.decode import TraceError, read_trace
from phaseprof.plugin.reading.lenient import capability, small_int, to_float, to_int, usable_cpus
from tests.logdir import write_trace
from tests.tracebuilder import kernel, launch, memory, op, step

#: One event the typed pass refuses, so that the file is read event by event.
REFUSED = {**op("refused", 1, 1), "dur": "1"}


def _read(tmp_path, events, **top):
    return read_trace(
        str(write_trace(tmp_path / "t.json", [step(1, 0, 1000), REFUSED, *events], **top))
    )


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({**op("a", 5, 1), "ph": 1}, "ph is not a string"),
        ({**op("a", 5, 1), "cat": None}, "cat is not a string"),
        ({**op("a", 5, 1), "name": ["a"]}, "name is not a string"),
        ({**op("a", 5, 1), "pid": True}, "pid is not a number or a string"),
        ({**op("a", 5, 1), "tid": 1.5}, "tid is not a number or a string"),
        ({**op("a", 5, 1), "ts": False}, "ts is not a number"),
        ({**op("a", 5, 1), "dur": {}}, "dur is not a number"),
        ([1], "is not a JSON object"),
    ],
)
def test_an_event_with_a_field_of_the_wrong_type_is_skipped_and_named(tmp_path, event, reason):
    trace = _read(tmp_path, [op("before", 2, 1), event, op("after", 8, 1)])
    assert [trace.names[n] for n in trace.host.name] == ["ProfilerStep#1", "before", "after"]
    reasons = (
        "dur is not a number"
        if reason == "dur is not a number"
        else f"dur is not a number (1), {reason} (1)"
    )
    assert trace.first_problem == f"2 events skipped: {reasons}; first: event 1 ('refused')"
    assert trace.skipped == 2


def test_an_event_read_event_by_event_keeps_every_field_it_could_read(tmp_path):
    events = [
        {**op("a", 5, 2, tid="7"), "pid": "CPU functions", "cat": ""},
        {**op("b", 1e300 * 10, 2)},
        {**launch(10, 3), "args": {"correlation": "3", "junk": [1]}},
        kernel("k", 20, 4, 3),
        {**op("c", 30, 1), "args": {"Sequence number": 2.0, "Input Dims": [[1]]}},
        {**op("d", 40, 1), "args": {"Sequence number": 2.5}},
        {**memory(50, 8, 8), "args": {**memory(50, 8, 8)["args"], "Bytes": "8"}},
        {**memory(60, 8, 16), "args": {**memory(60, 8, 16)["args"], "Total Allocated": None}},
        {**kernel("s", 70, 1, 9), "args": {"stream": "0x10", "correlation": 9}},
        {**kernel("t", 80, 1, 9), "args": {"stream": True, "correlation": 9}},
        {**op("e", 90, 1), "args": {"name": 5, "Collective name": 3}},
    ]
    trace = _read(tmp_path, events)
    names = [trace.names[n] for n in trace.host.name]
    assert names == ["ProfilerStep#1", "a", "c", "d", "e", "cudaLaunchKernel"]  # by category
    assert trace.host.seq.tolist() == [-1, -1, 2, -1, -1, -1]
    assert trace.host.corr.tolist() == [-1, -1, -1, -1, -1, 3]
    assert trace.shapes == ["", "[[1]]"]
    assert trace.device.stream.tolist() == [7, 16, 7]
    assert trace.memory.nbytes.tolist() == [8]  # "8" is no number of bytes: that event is skipped
    assert trace.memory.total.tolist() == [-1]
    assert trace.first_problem == (
        "3 events skipped: dur is not a number (1), has a 'ts' or 'dur' out of range (1), "
        "[memory] event without a usable 'ts' or 'Bytes' (1); "
        "3 events read without a field: sequence is not a number (1), "
        "Bytes is not a number (1), stream id is not a number (1); first: event 1 ('refused')"
    )


def test_what_a_file_read_event_by_event_says_of_itself_is_read_as_leniently(tmp_path):
    trace = _read(
        tmp_path,
        [],
        distributedInfo={"rank": "2", "world_size": 8},
        deviceProperties=[
            {"name": "A100", "computeMajor": 8, "computeMinor": 0},
            "junk",
            {"name": 7, "computeMajor": "9"},
        ],
        **{CPUS_KEY: {"count": 16}},
    )
    assert (trace.rank, trace.world_size, trace.cpus) == (2, 8, 16)
    assert (trace.gpu_names, trace.gpu_capabilities) == (["A100", "", ""], ["8.0", "", "9.0"])
    odd = _read(tmp_path, [], distributedInfo=[3], deviceProperties={"name": "x"}, **{CPUS_KEY: 4})
    assert (odd.rank, odd.world_size, odd.gpu_names, odd.cpus) == (None, None, [], None)


def test_a_bare_list_of_events_reads_event_by_event(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([step(1, 0, 100), REFUSED, op("a", 5, 1)]))
    trace = read_trace(str(path))
    assert [trace.names[n] for n in trace.host.name] == [
        "ProfilerStep#1",
        "a",
    ] and trace.skipped == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"schemaVersion": 1, "traceEvents": 5, "x": [1]}', "'traceEvents' is not a list"),
        ('{"schemaVersion": "1", "x": [1]}', "a JSON object without a 'traceEvents' list"),
        ('{"traceEvents": [], "distributedInfo": 3}', None),
    ],
)
def test_a_file_without_a_list_of_events_is_one_line(tmp_path, text, reason):
    path = tmp_path / "t.json"
    path.write_text(text)
    if reason is None:
        assert len(read_trace(str(path)).host) == 0
        return
    with pytest.raises(TraceError) as caught:
        read_trace(str(path))
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (7, 7),
        (-7, -7),
        ((1 << 63) - 1, (1 << 63) - 1),
        (1 << 63, None),
        (-(1 << 63), -(1 << 63)),
        (-(1 << 63) - 1, None),
        (True, None),
        (2.0, 2),
        (2.5, None),
        (2.0**63, None),
        (float("inf"), None),
        ("7", 7),
        (" +7 ", 7),
        ("-7", -7),
        ("stream 7", 7),
        ("stream7", 7),
        ("0x7f", 127),
        ("0X7F", 127),
        ("0x" + "f" * 16, None),
        ("9" * 19, None),
        ("9" * 18, int("9" * 18)),
        ("7a", None),
        ("", None),
        ("١٢", None),
        (None, None),
        ([7], None),
    ],
)
def test_integers_are_read_from_what_traces_write_for_them(value, number):
    assert to_int(value) == number


def test_floats_and_small_integers():
    assert to_float(1) == 1.0 and to_float(2.5) == 2.5 and to_float(10**400) is None
    assert to_float(True) is None and to_float("1") is None and to_float(float("nan")) is None
    assert small_int(0) == 0 and small_int((1 << 31) - 1) == (1 << 31) - 1
    assert small_int(1 << 31) is None and small_int(-1) is None and small_int("3") == 3


@pytest.mark.parametrize(
    ("major", "minor", "text"),
    [
        (8, 0, "8.0"),
        (8, None, "8.0"),
        (9, 0, "9.0"),
        (7, 5, "7.5"),
        (99, 9, "99.9"),
        (100, 0, ""),
        (8, 10, ""),
        (None, 1, ""),
        ("8", "6", "8.6"),
        (-1, 0, ""),
        (8, -1, "8.0"),
    ],
)
def test_a_compute_capability_is_major_dot_minor_within_reason(major, minor, text):
    assert capability(major, minor) == text


def test_the_usable_cpus_are_the_affinity_else_the_count():
    assert usable_cpus(12, 64) == 12 and usable_cpus(None, 64) == 64 and usable_cpus(0, 64) == 64
    assert usable_cpus("x", None) is None and usable_cpus(None, None) is None


def test_events_read_event_by_event_keep_their_process_and_lack_of_a_duration(tmp_path):
    no_dur = op("no_dur", 5, 1, correlation="not a number")  # read field by field
    del no_dur["dur"]
    trace = _read(tmp_path, [op("a", 2, 1, tid=7), {**op("b", 3, 1), "pid": "host"}, no_dur])
    assert {(t.pid, t.tid) for t in trace.threads} == {(100, 100), (100, 7), ("host", 100)}
    assert trace.first_problem == (
        "2 events skipped: dur is not a number (1), has no 'dur' (1); "
        "1 event read without a field: correlation is not a number; first: event 1 ('refused')")


def test_a_collective_s_args_read_field_by_field_keep_what_it_is(tmp_path):
    comm = op("record_param_comms", 5, 10, **{"Collective name": "allreduce", "Group size": 4,
                                              "Sequence number": "x"})
    trace = _read(tmp_path, [comm])
    (code,) = trace.host.comm[trace.host.name == trace.names.index("record_param_comms")]
    assert (trace.comms[code].kind, trace.comms[code].group_size) == ("allreduce", 4)


def test_a_long_file_read_event_by_event_stops_at_its_deadline(tmp_path, monkeypatch):
    from phaseprof.plugin.reading import lenient

    calls = []

    def monotonic():  # the deadline passes once the first 65,536 events are read
        calls.append(1)
        return time.monotonic() + (1e6 if len(calls) > 1 else 0)

    monkeypatch.setattr(lenient, "time", types.SimpleNamespace(monotonic=monotonic))
    events = [{"ph": "i", "ts": 1}] * 65_536
    with pytest.raises(TraceError) as caught:
        _read(tmp_path, events)
    assert caught.value.reason == "took too long to read (see PHASEPROF_MAX_READ_SECONDS)"
    assert len(calls) == 2

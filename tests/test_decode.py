"""Decoding one file (`plugin/reading/decode.py`): the two halves of a split file merged into the
trace one process reads, and what a file says about itself, whichever half says it."""

from __future__ import annotations

import json

import pytest

from phaseprof.contract import CPUS_KEY
from phaseprof.plugin.reading import split
from phaseprof.plugin.reading.decode import TraceError, read_trace
from tests.test_reading import _rows
from tests.tracebuilder import collective, kernel, launch, memory, op, step


def _halves() -> list[dict]:
    """Events whose names, threads, shapes, collectives and memory devices differ between the
    first and the second half of the file, each half with a malformed event."""
    first = [
        step(1, 0, 10_000),
        op("aten::mm", 10, 5, **{"Input Dims": [[2, 3]]}),
        launch(20, 1),
        kernel("gemm", 30, 5, 1),
        memory(40, 8, 8),
        op("bad", 50, -1),
    ]
    first += [op(f"aten::first{i}", 100 + i, 1) for i in range(60)]
    second = [
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 7, "args": {"name": "the loader"}},
        op("aten::add", 5000, 5, tid=7, **{"Input Dims": [[4]]}),
        {**op("train.py(12): step", 5001, 2), "cat": "python_function"},
        *collective("allreduce", 5100, 2, 5200, 5, Collective_name="allreduce", Group_size=2),
        memory(5300, 16, 24, device_id=1),
        {**op("late", 5400, 5), "dur": -2},
        step(2, 6000, 100),
    ]
    second += [op(f"aten::second{i}", 6000 + i, 1) for i in range(60)]
    return first + second


def _write(path, events, trailer: dict) -> str:
    """The trace with ``trailer``'s keys after its events (so that only the split's second half
    holds them)."""
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, **trailer})
    path.write_text(text)
    return str(path)


TRAILER = {
    "distributedInfo": {"rank": 3, "world_size": 4},
    "deviceProperties": [{"name": "NVIDIA A100", "computeMajor": 8, "computeMinor": 0}],
    CPUS_KEY: {"count": 64, "usable": 12},
}


@pytest.fixture
def two_processes(monkeypatch):
    """Every file split in two; each split's parts (None: it gave up, read in one process)."""
    handed = []
    real = split.decode_in_two

    def spy(*args):
        handed.append(real(*args))
        return handed[-1]

    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(split, "fork_is_safe", lambda: True)
    monkeypatch.setattr(split, "decode_in_two", spy)
    return handed


def test_a_file_read_in_two_halves_is_the_file_read_whole(tmp_path, two_processes):
    path = _write(tmp_path / "t.json", _halves(), TRAILER)
    one = read_trace(path, parallel=False)
    two = read_trace(path)
    assert two_processes and None not in two_processes and len(two.host) == len(one.host)
    for columns in ("host", "device", "memory", "python"):
        assert sorted(_rows(one, columns)) == sorted(_rows(two, columns)), columns
    for trace in (one, two):
        assert {t.label for t in trace.threads} == {"thread 100", "the loader"}
        assert sorted(trace.shapes) == ["", "[[2, 3]]", "[[4]]"]
        assert sorted((c.kind, c.group_size) for c in trace.comms) == [("", -1), ("allreduce", 2)]
        assert trace.memory_devices == ["cuda:0", "cuda:1"]
        assert (trace.rank, trace.world_size, trace.cpus) == (3, 4, 12)
        assert (trace.gpu_names, trace.gpu_capabilities) == (["NVIDIA A100"], ["8.0"])
        assert [trace.names[n] for n in trace.python.name] == ["train.py(12): step"]
        assert "train.py(12): step" not in [trace.names[n] for n in trace.host.name]
        assert trace.skipped == 2
        assert (
            trace.first_problem
            == "2 events skipped: has a negative duration; first: event 5 ('X' 'bad')"
        )


def test_what_the_first_half_says_of_the_file_is_kept(tmp_path, two_processes):
    path = tmp_path / "t.json"
    head = {
        "distributedInfo": {"rank": 1, "world_size": 2},
        "deviceProperties": [{"name": "H100"}],
        CPUS_KEY: {"count": 8},
    }
    path.write_text(json.dumps({**head, "traceEvents": _halves()}))
    for trace in (read_trace(str(path), parallel=False), read_trace(str(path))):
        assert (trace.rank, trace.world_size, trace.gpu_names, trace.cpus) == (1, 2, ["H100"], 8)
    assert two_processes and None not in two_processes


def test_a_file_whose_halves_disagree_on_nothing_reads_in_one(tmp_path, two_processes):
    path = _write(
        tmp_path / "t.json", [step(1, 0, 100)] + [op(f"o{i}", i, 1) for i in range(80)], {}
    )
    trace = read_trace(path)
    assert two_processes and None not in two_processes
    assert len(trace.host) == 81 and len(trace.names) == 81
    assert trace.skipped == 0 and trace.first_problem == ""


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file"),
        (b" \n\t ", "empty file (only whitespace)"),
        (b"\n  7", "not JSON: a trace starts with '{' or '['"),
        (
            b'{"traceEvents": [',
            "not valid JSON (the file ends in the middle of the JSON (truncated?))",
        ),
        (b'{"traceEvents": [}', "not valid JSON (invalid character (byte 17))"),
        (b'{"schemaVersion": 1}', "a JSON object without a 'traceEvents' list"),
    ],
)
def test_a_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, content, reason):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as caught:
        read_trace(str(path))
    assert str(caught.value) == f"{path}: {reason}"


def test_a_file_nested_deeper_than_python_recurses_is_read_event_by_event_too(tmp_path):
    events = [
        step(1, 0, 1000),
        {**op("refused", 1, 1), "dur": "1"},
        op("deep", 5, 1, junk="DEEP"),
        op("b", 9, 1),
    ]
    text = json.dumps({"traceEvents": events}).replace('"DEEP"', "[" * 5000 + "]" * 5000)
    path = tmp_path / "t.json"
    path.write_text(text)
    trace = read_trace(str(path))
    assert [trace.names[n] for n in trace.host.name] == ["ProfilerStep#1", "deep", "b"]
    assert trace.first_problem == "1 event skipped: dur is not a number; first: event 1 ('refused')"


def test_text_cut_inside_a_utf16_pair_is_replaced_and_counted(tmp_path):
    path = tmp_path / "t.json"
    text = json.dumps({"traceEvents": [step(1, 0, 100), op("NAME", 1, 1)]})
    path.write_text(text.replace("NAME", "a\\ud800b\\ud83d\\ude00"))
    trace = read_trace(str(path))
    assert trace.names[trace.host.name[1]] == "a\ufffdb\U0001f600"
    assert trace.first_problem == (
        "1 event read without a field: text with unpaired UTF-16 surrogates "
        "(replaced by \ufffd); first: event -1"
    )

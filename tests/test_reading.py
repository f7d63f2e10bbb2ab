"""Reading traces: every real trace, legacy exports, discovery, bad input, the two-process decode."""

from __future__ import annotations

import gzip
import json
import os

import msgspec
import pytest

from phaseprof import analyze
from phaseprof.plugin.reading import split
from phaseprof.plugin.reading.decode import TraceError, read_trace
from phaseprof.plugin.reading.discovery import discover
from tests.logdir import write_trace
from tests.tracebuilder import memory, op, step


def test_every_trace_in_the_test_data_reads_and_has_steps(traces):
    report = analyze(str(traces.root))
    assert report["errors"] == []
    workers = {(r["run"], w["worker"]): w for r in report["runs"] for w in r["workers"]}
    files = {os.path.basename(f) for w in workers.values() for f in w["spans"]}
    assert files == {p.name for p in traces.all()}
    for (run, worker), w in workers.items():
        assert w["steps"], (run, worker)
        for row in w["steps"]:
            total = sum(p["host_ms"] for p in row["phases"].values())
            # host phase times add up to the step's wall time (within 0.1%)
            assert total == pytest.approx(row["wall_ms"], rel=1e-3, abs=0.002), (run, worker, row["step"])


def test_every_op_row_adds_up_self_within_total_host_and_gpu(traces):
    from phaseprof.plugin.analysis.span import analyze_trace

    for path in traces.all():
        ops = analyze_trace(read_trace(str(path))).ops
        assert len(ops.step), path.name
        assert (ops.self_us >= 0).all(), path.name
        assert (ops.self_us <= ops.total_us).all(), path.name
        assert (ops.self_gpu_us >= 0).all(), path.name
        assert (ops.self_gpu_us <= ops.gpu_us + 1e-6).all(), path.name


def test_2021_schema_run_gets_inferred_forward_and_backward_with_gpu_time(traces):
    report = analyze(str(traces.folder("gpu", "kineto_resnet50_num_workers_0")))
    worker = report["runs"][0]["workers"][0]
    assert len(worker["spans"]) == 2  # two spans of one worker
    assert [s["step"] for s in worker["steps"]] == [5, 6, 7, 8, 9, 10, 16, 17, 18, 19, 20, 21]
    for row in worker["steps"]:
        assert set(row["inferred_phases"]) == {"forward", "backward"}
        assert row["phases"]["forward"]["gpu_ms"] > 1
        assert row["phases"]["backward"]["gpu_ms"] > 1
        assert row["phases"]["data"]["host_ms"] > 1  # 2021's DataLoader annotation is read too


def test_legacy_exports_give_one_inferred_step_per_iteration_with_ops(traces):
    legacy = traces.files("cpu", "legacy")  # three iterations of the seed's loop, no ProfilerStep
    assert [p.name for p in legacy] == ["legacy_eventlist.json.gz", "legacy_kineto.json.gz", "legacy_pyexport.json.gz"]
    for path in legacy:
        assert [s["step"] for s in analyze(str(path))["runs"][0]["workers"][0]["steps"]] == [0, 1, 2]
        report = analyze(str(path), step=0)
        assert report["errors"] == []
        worker = report["runs"][0]["workers"][0]
        assert [s["step"] for s in worker["steps"]] == [0]
        assert worker["steps"][0]["inferred_step"]
        ops = worker["detail"]["ops"]
        assert sum(len(rows) for rows in ops.values()) > 10, path.name
        assert any(r["name"] == "aten::conv2d" for rows in ops.values() for r in rows)


def test_early_exit_leaves_an_empty_last_step_flagged_and_out_of_averages(traces):
    worker = analyze(str(traces.folder("cpu", "early_exit")))["runs"][0]["workers"][0]
    last = worker["steps"][-1]
    assert last["empty"] and last["step"] == 5
    summary = worker["summary"]
    assert summary["empty_steps"] == [5]
    walls = [s["wall_ms"] for s in worker["steps"] if not s["empty"]]
    assert summary["mean_wall_ms"] == pytest.approx(sum(walls) / len(walls), abs=0.002)


def test_discovery_finds_runs_workers_and_spans(tmp_path, traces):
    spans = traces.files("cpu", "repeat2")
    assert len(spans) == 2
    (tmp_path / "exp" / "a").mkdir(parents=True)
    for p in spans:
        (tmp_path / "exp" / "a" / p.name).write_bytes(p.read_bytes())
    top = traces.files("cpu", "dist")[0]
    (tmp_path / top.name).write_bytes(top.read_bytes())  # a trace directly in the logdir is run "."
    (tmp_path / "notes.json").write_text('{"lr": 0.1}')  # JSON that is no trace is ignored
    runs = {r.name: r for r in discover(str(tmp_path))}
    assert set(runs) == {".", "exp/a"}
    assert {w: [f.name for f in fs] for w, fs in runs["exp/a"].workers.items()} == {
        spans[0].name.split(".")[0]: [p.name for p in spans]
    }


def test_symlink_leading_outside_the_logdir_is_not_read(tmp_path, traces):
    logdir = tmp_path / "logdir"
    (logdir / "run").mkdir(parents=True)
    outside = traces.files("cpu", "base")[0]
    os.symlink(outside, logdir / "run" / "w.1.pt.trace.json.gz")
    os.symlink(outside.parent, logdir / "linked_run")
    assert discover(str(logdir)) == []


_GOOD = [step(1, 0, 100), op("aten::add", 10, 20)]

#: One kind of bad input each: (file name, bytes or the one bad event added to a good trace, reason).
BAD_INPUTS = {
    "truncated JSON": ("truncated.1.pt.trace.json", b'{"traceEvents": [{"ph": "X", "na', "not valid JSON"),
    "empty file": ("empty.1.pt.trace.json", b"", "empty file"),
    "not JSON": ("text.1.pt.trace.json", b"hello, this is not json", "not JSON"),
    "wrong top level (object)": ("toplevel.1.pt.trace.json", b'{"events": []}', "without a 'traceEvents' list"),
    "wrong top level (number)": ("number.1.pt.trace.json", b"42", "not JSON"),
    "corrupt gzip": ("corrupt.1.pt.trace.json.gz", b"\x1f\x8b\x08\x00garbage-not-deflate", "corrupt gzip"),
    "event missing ts": ("nots.1.pt.trace.json",
                         {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "dur": 5}, "has no 'ts'"),
    "event missing dur": ("nodur.1.pt.trace.json", {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                                    "ts": 5}, "has no 'dur'"),
    "negative duration": ("negative.1.pt.trace.json", op("aten::mm", 20, -5), "negative duration"),
    "unknown ph": ("unknownph.1.pt.trace.json", {"ph": "Q", "name": "x", "pid": 1, "tid": 1, "ts": 1},
                   "unknown phase type"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_line_naming_the_file_and_the_rest_is_reported(case, tmp_path):
    name, content, reason = BAD_INPUTS[case]
    write_trace(tmp_path / "good.1.pt.trace.json", _GOOD)
    if isinstance(content, bytes):
        (tmp_path / name).write_bytes(content)
        readable = {"good"}
    else:  # a readable file with one malformed event: reported, and the event skipped
        write_trace(tmp_path / name, _GOOD + [content])
        readable = {"good", name.split(".")[0]}
    report = analyze(str(tmp_path))
    (error,) = report["errors"]
    assert os.path.basename(error["path"]) == name
    assert reason in error["error"] and "\n" not in error["error"]
    assert {w["worker"] for r in report["runs"] for w in r["workers"]} == readable
    for r in report["runs"]:
        for w in r["workers"]:
            assert [s["step"] for s in w["steps"]] == [1]


def test_trace_error_survives_pickling_between_processes():
    import pickle

    e = pickle.loads(pickle.dumps(TraceError("a/b.json", "empty file")))
    assert (e.path, e.reason, str(e)) == ("a/b.json", "empty file", "a/b.json: empty file")


@pytest.mark.parametrize("gz", [False, True])
def test_two_process_decode_equals_one_process_decode(tmp_path, traces, monkeypatch, gz):
    src = traces.files("gpu", "hta_ns_resolution")[0]
    data = gzip.decompress(src.read_bytes())
    path = tmp_path / ("t.1.pt.trace.json" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    one = read_trace(str(path), parallel=False)
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(split, "fork_is_safe", lambda: True)  # other tests may have left threads
    calls = []
    monkeypatch.setattr(split, "decode_in_two", lambda *a: calls.append(1) or _real_in_two(*a))
    two = read_trace(str(path), parallel=True)
    assert calls and two.names  # the split ran
    for columns in ("host", "device", "memory"):
        # The same events (grouping by category may order them differently).
        assert sorted(_rows(one, columns)) == sorted(_rows(two, columns)), columns
    assert (one.rank, one.world_size, one.gpu_names) == (two.rank, two.world_size, two.gpu_names)


_real_in_two = split.decode_in_two


def _rows(trace, columns):
    """Events of one column group as tuples, with codes replaced by what they stand for."""
    group = getattr(trace, columns)
    decoded = []
    for field in group.__struct_fields__:
        values = getattr(group, field).tolist()
        if field == "name":
            values = [trace.names[v] for v in values]
        elif field == "shapes":
            values = [trace.shapes[v] for v in values]
        elif field == "thread":
            values = [(trace.threads[v].pid, trace.threads[v].tid) for v in values]
        elif field == "device" and columns == "memory":
            values = [trace.memory_devices[v] for v in values]
        elif getattr(group, field).dtype.kind == "f":
            values = [None if v != v else v for v in values]  # NaN ("not recorded") equals itself here
        decoded.append(values)
    return list(zip(*decoded))


def test_a_split_that_is_not_between_events_falls_back_to_one_process(tmp_path, monkeypatch):
    # An op name holding "},{" near the middle of the file: the split lands inside a string.
    names = [f"aten::op{i}" for i in range(2000)]
    names[1000] = "weird},{name" * 50
    events = [step(1, 0, 1e6)] + [op(n, 10 + i, 1) for i, n in enumerate(names)]
    path = write_trace(tmp_path / "t.1.pt.trace.json", events)
    monkeypatch.setattr(split, "PARALLEL_MIN_BYTES", 0)
    text = path.read_bytes()
    middle = len(text) // 2
    assert b"},{" in text[middle: middle + 5000] or b"}, {" in text[middle: middle + 5000]
    trace = read_trace(str(path))
    assert len(trace.host) == 2001
    assert sorted(trace.names) == sorted(set(names) | {"ProfilerStep#1"})


def test_memory_addresses_of_every_type_and_other_instants_beside_memory_events(tmp_path):
    # Addresses are integers in today's traces (one conversion for all); anything else is read
    # one by one: text as a number where it is one, the rest "not recorded" (-1).
    addresses = [4096, "0x1000", "12", None, 1 << 70, True, 2.0, 2.5, -7]
    args = memory(0, 8, 8)["args"]
    events = [step(1, 0, 1000)] + [{**memory(10 + i, 8, 8), "args": {**args, "Addr": a}}
                                    for i, a in enumerate(addresses)]
    plain = read_trace(str(write_trace(tmp_path / "a.json", events)))
    assert plain.memory.addr.tolist() == [4096, 4096, 12, -1, -1, -1, 2, -1, -7]
    ints = [e for e, a in zip(events[1:], addresses) if type(a) is int and a < 1 << 63]
    only_ints = read_trace(str(write_trace(tmp_path / "b.json", ints)))
    assert only_ints.memory.addr.tolist() == [4096, -7]
    # an instant of another name in the memory events' category is no memory event
    marker = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "mark", "pid": 1, "tid": 1,
              "ts": 11.5}
    mixed = read_trace(str(write_trace(tmp_path / "c.json", events[:3] + [marker] + events[3:])))
    assert mixed.memory.ts.tolist() == plain.memory.ts.tolist()
    assert mixed.skipped == plain.skipped == 0  # nor a malformed one


def test_bare_event_list_and_object_without_step_markers(tmp_path):
    events = [op("aten::mm", 10, 5), op("aten::add", 20, 5)]
    (tmp_path / "list.json").write_text(json.dumps(events))
    trace = read_trace(str(tmp_path / "list.json"))
    assert len(trace.host) == 2


class _Refused:
    """A typed decoder that refuses every file, so that it is read event by event."""

    def decode(self, data):
        raise msgspec.ValidationError("refused")


def test_the_typed_pass_reads_every_trace_exactly_as_the_event_by_event_pass(traces, monkeypatch):
    # The typed pass decodes only the fields of the phases the reader uses (`trace_fields.TypedEvent`);
    # the event-by-event pass decodes every event whole: both must give the same trace, bit for bit.
    from phaseprof.plugin.reading import decode

    encoder = msgspec.msgpack.Encoder(enc_hook=lambda a: (str(a.dtype), a.tobytes()))
    typed = {p: encoder.encode(read_trace(str(p), parallel=False)) for p in traces.all()}
    monkeypatch.setattr(decode, "OBJECT_DECODER", _Refused())
    monkeypatch.setattr(decode, "LIST_DECODER", _Refused())
    for path, expected in typed.items():
        assert encoder.encode(read_trace(str(path), parallel=False)) == expected, path.relative_to(traces.root)

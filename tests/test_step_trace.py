"""One step as a Chrome-trace document (`plugin/analysis/step_trace.py`, `/trace`) on hand-built
traces: every event the tab and Perfetto are given, with its phase or the time kept apart, the
launch arrows, the stream lanes and the phase lane."""

from __future__ import annotations

import msgspec

from phaseprof.plugin.analysis.step_trace import step_trace
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import AUTOGRAD, annotation, kernel, launch, op, step, thread_names

PHASES = ["data", "forward", "backward", "optimizer", "other"]


def trace_of(tmp_path, events: list[dict]):
    return read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", thread_names() + events)))


def events_of(doc) -> list[tuple]:
    """The events as (ph, name, pid, tid, ts, dur, cat, args[, id, bp]), as JSON reads them."""
    out = []
    for e in msgspec.json.decode(msgspec.json.encode(doc))["traceEvents"]:
        keys = ["ph", "name", "pid", "tid", "ts", "dur", "cat", "args", "id", "bp"]
        out.append(tuple(e.get(k) for k in keys[: 8 if "id" not in e else 10]))
    return out


def test_a_step_with_a_stack_an_evaluation_pass_and_work_on_two_streams(tmp_path):
    # forward: aten::mm (with shapes, under a Python frame) launching gemm; an evaluation pass
    # launching conv_k on stream 9; backward on the autograd thread launching a copy that runs
    # after the step's host window; step 2 after it
    trace = trace_of(
        tmp_path,
        [
            step(1, 0, 10_000),
            annotation("phaseprof::forward", 0, 2_000),
            op("train.py(12): forward", 50, 1_000, cat="python_function"),
            op("aten::mm", 100, 400, **{"Input Dims": [[2, 3], [3, 4]]}),
            launch(150, 1),
            kernel("gemm", 200, 300, 1),
            annotation("phaseprof::eval", 2_000, 3_000),
            op("aten::conv2d", 2_100, 1_000),
            launch(2_200, 2),
            kernel("conv_k", 2_300, 100, 2, stream=9),
            annotation("phaseprof::backward", 5_000, 5_000),
            op("aten::mm", 5_100, 200, tid=AUTOGRAD),
            launch(5_150, 3, tid=AUTOGRAD),
            kernel("Memcpy DtoH (Device -> Pageable)", 12_000, 50, 3),
            step(2, 10_000, 1_000),
            op("aten::add", 10_100, 10),
            launch(10_200, 4),
            kernel("add_k", 10_300, 5, 4),
        ],
    )
    doc = step_trace(trace, 1)
    frame = "train.py(12): forward"
    forward, backward, eval_ = {"phase": "forward"}, {"phase": "backward"}, {"apart": "eval"}
    assert events_of(doc) == [
        ("M", "thread_name", 100, 100, None, None, None, {"name": "thread 100 (python)"}),
        ("M", "thread_name", 100, 101, None, None, None, {"name": "thread 101 (pt_autograd_0)"}),
        ("X", "ProfilerStep#1", 100, 100, 0.0, 10_000.0, "user_annotation", forward),
        ("X", "phaseprof::forward", 100, 100, 0.0, 2_000.0, "user_annotation", forward),
        (
            "X",
            "aten::mm",
            100,
            100,
            100.0,
            400.0,
            "cpu_op",
            {"phase": "forward", "Input Dims": [[2, 3], [3, 4]], "stack": [frame], "frame": frame},
        ),
        (
            "X",
            "cudaLaunchKernel",
            100,
            100,
            150.0,
            1.0,
            "cuda_runtime",
            {"phase": "forward", "correlation": 1, "stack": [frame], "frame": frame},
        ),
        ("X", "phaseprof::eval", 100, 100, 2_000.0, 3_000.0, "user_annotation", eval_),
        ("X", "aten::conv2d", 100, 100, 2_100.0, 1_000.0, "cpu_op", eval_),
        (
            "X",
            "cudaLaunchKernel",
            100,
            100,
            2_200.0,
            1.0,
            "cuda_runtime",
            {"apart": "eval", "correlation": 2},
        ),
        ("X", "phaseprof::backward", 100, 100, 5_000.0, 5_000.0, "user_annotation", backward),
        ("X", "aten::mm", 100, 101, 5_100.0, 200.0, "cpu_op", backward),
        (
            "X",
            "cudaLaunchKernel",
            100,
            101,
            5_150.0,
            1.0,
            "cuda_runtime",
            {"phase": "backward", "correlation": 3},
        ),
        ("M", "process_name", 0, 0, None, None, None, {"name": "GPU 0"}),
        ("M", "process_sort_index", 0, 0, None, None, None, {"sort_index": 1_000_000}),
        ("M", "thread_name", 0, 7, None, None, None, {"name": "stream 7"}),
        ("M", "thread_name", 0, 9, None, None, None, {"name": "stream 9"}),
        (
            "X",
            "gemm",
            0,
            7,
            200.0,
            300.0,
            "kernel",
            {
                "phase": "forward",
                "correlation": 1,
                "device": 0,
                "stream": 7,
                "launched by": "aten::mm",
            },
        ),
        ("s", "launch", 100, 100, 150.0, None, "ac2g", None, 1, None),
        ("f", "launch", 0, 7, 200.0, None, "ac2g", None, 1, "e"),
        (
            "X",
            "conv_k",
            0,
            9,
            2_300.0,
            100.0,
            "kernel",
            {
                "apart": "eval",
                "correlation": 2,
                "device": 0,
                "stream": 9,
                "launched by": "aten::conv2d",
            },
        ),
        ("s", "launch", 100, 100, 2_200.0, None, "ac2g", None, 2, None),
        ("f", "launch", 0, 9, 2_300.0, None, "ac2g", None, 2, "e"),
        (
            "X",
            "Memcpy DtoH (Device -> Pageable)",
            0,
            7,
            12_000.0,
            50.0,
            "gpu_memcpy",
            {
                "phase": "backward",
                "correlation": 3,
                "device": 0,
                "stream": 7,
                "launched by": "aten::mm",
            },
        ),
        ("s", "launch", 100, 101, 5_150.0, None, "ac2g", None, 3, None),
        ("f", "launch", 0, 7, 12_000.0, None, "ac2g", None, 3, "e"),
        ("M", "thread_name", 100, 0, None, None, None, {"name": "Step phases"}),
        ("M", "thread_sort_index", 100, 0, None, None, None, {"sort_index": -1}),
        ("X", "forward", 100, 0, 0.0, 2_000.0, "phase", {"phase": "forward", "inferred": False}),
        (
            "X",
            "backward",
            100,
            0,
            5_000.0,
            5_000.0,
            "phase",
            {"phase": "backward", "inferred": False},
        ),
        ("X", "eval (outside the step)", 100, 0, 2_000.0, 3_000.0, "apart", {"apart": "eval"}),
    ]
    # correlations and flow ids are integers, as in the trace (1, never 1.0)
    text = msgspec.json.encode(doc).decode()
    assert '"correlation":1,' in text and '"id":3,' in text and '.0,"device"' not in text
    info = doc.otherData
    assert (info.step, info.start_us, info.end_us, info.phases) == (1, 0.0, 10_000.0, PHASES)
    assert (info.host_events, info.device_events) == (10, 3)
    assert step_trace(trace, 3) is None


def test_inferred_phases_a_pause_a_memset_and_a_phase_lane_beside_thread_zero(tmp_path):
    # unmarked steps (their phases inferred); thread 0 of the loop's process is taken, so the phase
    # lane is -1; a pause launching a memset; two steps numbered 2: the first is the one shown
    trace = trace_of(
        tmp_path,
        [
            step(1, 0, 1_000),
            op("aten::add", 100, 10),
            op("aten::mul", 300, 10, tid=0),
            annotation("phaseprof::paused", 500, 200),
            launch(600, 4),
            kernel("Memset (Device)", 650, 5, 4),
            step(2, 1_000, 1_000),
            op("aten::add", 1_100, 10),
            step(2, 2_000, 1_000),
            op("aten::sub", 2_100, 10),
        ],
    )
    other, paused = {"phase": "other"}, {"apart": "paused"}
    assert events_of(step_trace(trace, 1)) == [
        ("M", "thread_name", 100, 100, None, None, None, {"name": "thread 100 (python)"}),
        ("M", "thread_name", 100, 0, None, None, None, {"name": "thread 0"}),
        ("X", "ProfilerStep#1", 100, 100, 0.0, 1_000.0, "user_annotation", other),
        ("X", "aten::add", 100, 100, 100.0, 10.0, "cpu_op", {"phase": "forward"}),
        ("X", "phaseprof::paused", 100, 100, 500.0, 200.0, "user_annotation", paused),
        (
            "X",
            "cudaLaunchKernel",
            100,
            100,
            600.0,
            1.0,
            "cuda_runtime",
            {"apart": "paused", "correlation": 4},
        ),
        ("X", "aten::mul", 100, 0, 300.0, 10.0, "cpu_op", other),
        ("M", "process_name", 0, 0, None, None, None, {"name": "GPU 0"}),
        ("M", "process_sort_index", 0, 0, None, None, None, {"sort_index": 1_000_000}),
        ("M", "thread_name", 0, 7, None, None, None, {"name": "stream 7"}),
        (
            "X",
            "Memset (Device)",
            0,
            7,
            650.0,
            5.0,
            "gpu_memset",
            {
                "apart": "paused",
                "correlation": 4,
                "device": 0,
                "stream": 7,
                "launched by": "phaseprof::paused",
            },
        ),
        ("s", "launch", 100, 100, 600.0, None, "ac2g", None, 4, None),
        ("f", "launch", 0, 7, 650.0, None, "ac2g", None, 4, "e"),
        ("M", "thread_name", 100, -1, None, None, None, {"name": "Step phases"}),
        ("M", "thread_sort_index", 100, -1, None, None, None, {"sort_index": -1}),
        ("X", "other", 100, -1, 0.0, 100.0, "phase", {"phase": "other", "inferred": False}),
        ("X", "forward", 100, -1, 100.0, 10.0, "phase", {"phase": "forward", "inferred": True}),
        ("X", "other", 100, -1, 110.0, 390.0, "phase", {"phase": "other", "inferred": False}),
        ("X", "other", 100, -1, 700.0, 300.0, "phase", {"phase": "other", "inferred": False}),
        ("X", "paused (outside the step)", 100, -1, 500.0, 200.0, "apart", {"apart": "paused"}),
    ]
    doc = step_trace(trace, 2)
    assert [e[1] for e in events_of(doc) if e[0] == "X" and e[6] == "cpu_op"] == ["aten::add"]
    assert (doc.otherData.start_us, doc.otherData.end_us) == (1_000.0, 2_000.0)
    assert (doc.otherData.host_events, doc.otherData.device_events) == (2, 0)


def test_every_event_of_a_step_under_python_frames_carries_its_stack(tmp_path):
    # the loop's frame covers the whole step, a forward frame the op: two stacks, no event without
    trace = trace_of(
        tmp_path,
        [
            op("train.py(3): main", 0, 1_000, cat="python_function"),
            op("model.py(9): forward", 100, 200, cat="python_function"),
            step(1, 0, 1_000),
            op("aten::add", 150, 10),
        ],
    )
    stacks = {
        e[1]: e[7].get("stack")
        for e in events_of(step_trace(trace, 1))
        if e[0] == "X" and e[6] != "phase"
    }
    assert stacks == {
        "ProfilerStep#1": ["train.py(3): main"],
        "aten::add": ["model.py(9): forward", "train.py(3): main"],
    }

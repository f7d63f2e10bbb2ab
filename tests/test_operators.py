"""Every op of a worker over its steps (`plugin/analysis/operators.py`, the Operators table and
`/ops`) on hand-built loops whose figures are known: calls, self and total host and GPU time, per
step, shares, the steps and phases each op ran in, grouped by name or by input shapes."""

from __future__ import annotations

import pytest

from phaseprof.plugin.analysis.operators import run_ops
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests.logdir import write_trace
from tests.tracebuilder import Loop, op


def worker_of(folder, *loops: Loop) -> Worker:
    """One worker of one trace file per loop (its spans, in this order)."""
    for k, loop in enumerate(loops):
        write_trace(folder / f"w.{k + 1}.pt.trace.json", loop.events)
    (run,) = discover(str(folder))
    (files,) = run.workers.values()
    return Worker("w", [analyze_file(f) for f in sorted(files, key=lambda f: f.path)])


def gpu_loop(numbers=(7, 8, 9)) -> Loop:
    """Per step: forward (1 ms) launching `gemm` (100 µs) under aten::mm under aten::linear and
    `relu_k` (50 µs) under aten::relu; backward (2 ms) launching `gemm` (200 µs) under aten::mm, and
    in step 8 only an aten::relu of 50 µs. Each launch is a 5 µs cudaLaunchKernel."""
    loop = Loop()
    for n in numbers:
        loop.step(
            n,
            (
                "phaseprof::forward",
                1_000,
                [("gemm", 100), ("relu_k", 50)],
                [("aten::linear", 0, 400), ("aten::mm", 0, 300), ("aten::relu", 500, 100)],
            ),
            (
                "phaseprof::backward",
                2_000,
                [("gemm", 200)],
                [("aten::mm", 0, 600)] + ([("aten::relu", 900, 50)] if n == 8 else []),
            ),
        )
    return loop


def row(answer, name: str, shapes: str | None = None):
    (found,) = [r for r in answer.ops if (r.name, r.shapes) == (name, shapes)]
    return found


def test_every_op_of_the_steps_with_its_time_calls_and_shares(tmp_path):
    answer = run_ops(worker_of(tmp_path, gpu_loop()))
    # the run's name is the caller's to give
    assert (answer.run, answer.worker, answer.phase, answer.group) == ("", "w", None, "name")
    assert answer.steps == 3
    assert (answer.wall_ms, answer.gpu_ms, answer.left_out, answer.left_out_why) == (
        9.0,
        1.05,
        [],
        None,
    )
    # by self host time, most first
    assert [r.name for r in answer.ops] == [
        "aten::mm",
        "aten::relu",
        "aten::linear",
        "cudaLaunchKernel",
    ]
    mm = row(answer, "aten::mm")  # 295 + 595 µs a step, less its launches; 300 µs of gemm a step
    assert (mm.calls, mm.self_host_ms, mm.host_ms, mm.self_gpu_ms, mm.gpu_ms) == (
        6,
        2.67,
        2.7,
        0.9,
        0.9,
    )
    assert (mm.calls_per_step, mm.self_host_ms_per_step, mm.self_gpu_ms_per_step) == (
        2.0,
        0.89,
        0.3,
    )
    assert (mm.self_host_share, mm.self_gpu_share) == (0.2967, 0.8571)
    assert (mm.steps, mm.phases, mm.shapes) == ([7, 8, 9], ["backward", "forward"], None)
    relu = row(answer, "aten::relu")  # 4 calls in 3 steps; most of its time in the forward
    assert (relu.calls, relu.calls_per_step, relu.self_host_ms, relu.host_ms) == (
        4,
        1.333,
        0.335,
        0.35,
    )
    assert (relu.self_host_ms_per_step, relu.self_gpu_ms, relu.self_gpu_share) == (
        0.112,
        0.15,
        0.1429,
    )
    assert relu.phases == ["forward", "backward"]
    linear = row(answer, "aten::linear")  # its mm's time and GPU work are not its own
    assert (linear.self_host_ms, linear.host_ms, linear.self_gpu_ms, linear.gpu_ms) == (
        0.3,
        1.2,
        0.0,
        0.3,
    )
    assert (linear.self_host_share, linear.self_gpu_share, linear.phases) == (
        0.0333,
        0.0,
        ["forward"],
    )
    launch = row(answer, "cudaLaunchKernel")
    assert (launch.calls, launch.self_host_ms, launch.self_host_share) == (9, 0.045, 0.005)
    assert (launch.stack, launch.frame) == ([], None)


def test_one_phase_holds_only_its_ops_and_its_time(tmp_path):
    answer = run_ops(worker_of(tmp_path, gpu_loop()), phase="backward")
    assert (answer.phase, answer.steps, answer.wall_ms, answer.gpu_ms) == ("backward", 3, 6.0, 0.6)
    assert [r.name for r in answer.ops] == ["aten::mm", "aten::relu", "cudaLaunchKernel"]
    mm = row(answer, "aten::mm")
    assert (mm.calls, mm.self_host_ms, mm.self_gpu_ms, mm.self_host_share, mm.self_gpu_share) == (
        3,
        1.785,
        0.6,
        0.2975,
        1.0,
    )
    relu = row(answer, "aten::relu")  # step 8's only
    assert (relu.calls, relu.calls_per_step, relu.steps, relu.phases) == (
        1,
        0.333,
        [8],
        ["backward"],
    )
    assert relu.self_host_ms_per_step == 0.017


@pytest.mark.parametrize("phase", ["optimizer", "no such phase"])
def test_a_phase_no_step_has_is_empty(tmp_path, phase):
    answer = run_ops(worker_of(tmp_path, gpu_loop()), phase=phase)
    assert (answer.phase, answer.steps, answer.wall_ms, answer.gpu_ms, answer.ops) == (
        phase,
        3,
        0.0,
        0.0,
        [],
    )


def test_a_cpu_run_has_no_gpu_share(tmp_path):
    loop = Loop()
    for n in (1, 2):
        loop.step(n, ("phaseprof::forward", 1_000, [], [("aten::add", 10, 200)]))
    answer = run_ops(worker_of(tmp_path, loop))
    (add,) = answer.ops
    assert (add.name, add.calls, add.self_host_ms, add.self_host_share, add.self_gpu_share) == (
        "aten::add",
        2,
        0.4,
        0.2,
        None,
    )
    assert (answer.wall_ms, answer.gpu_ms) == (2.0, 0.0)


def test_ops_of_two_spans_are_one_row_each(tmp_path):
    # two trace files of one worker: steps 1, 2 and 5, 6; the same op names coded apart in each
    first, second = Loop(), Loop()
    for n in (1, 2):
        first.step(
            n, ("phaseprof::forward", 1_000, [], [("aten::add", 10, 100), ("aten::mul", 200, 300)])
        )
    for n in (5, 6):
        second.step(
            n, ("phaseprof::forward", 1_000, [], [("aten::mul", 10, 50), ("aten::add", 100, 400)])
        )
    answer = run_ops(worker_of(tmp_path, first, second))
    assert answer.steps == 4 and answer.wall_ms == 4.0
    assert [(r.name, r.calls, r.self_host_ms, r.steps) for r in answer.ops] == [
        ("aten::add", 4, 1.0, [1, 2, 5, 6]),
        ("aten::mul", 4, 0.7, [1, 2, 5, 6]),
    ]


def test_ops_grouped_by_input_shapes_are_one_row_per_shape(tmp_path):
    loop = Loop()
    for n in (1, 2):
        loop.step(n, ("phaseprof::forward", 1_000))
        start = loop.t - 1_000
        loop.events += [
            op("aten::mm", start + 10, 100, **{"Input Dims": [[2, 3], [3, 4]]}),
            op("aten::mm", start + 200, 300, **{"Input Dims": [[8, 8], [8, 8]]}),
            op("aten::add", start + 600, 50, **{"Input Dims": [[2, 3], [3, 4]]}),
        ]
    w = worker_of(tmp_path, loop)
    answer = run_ops(w, group="shapes")
    assert answer.group == "shapes"
    assert [(r.name, r.shapes, r.calls, r.self_host_ms) for r in answer.ops] == [
        ("aten::mm", "[[8, 8], [8, 8]]", 2, 0.6),
        ("aten::mm", "[[2, 3], [3, 4]]", 2, 0.2),
        ("aten::add", "[[2, 3], [3, 4]]", 2, 0.1),
    ]
    by_name = run_ops(w)
    assert [(r.name, r.shapes, r.calls, r.self_host_ms) for r in by_name.ops] == [
        ("aten::mm", None, 4, 0.8),
        ("aten::add", None, 2, 0.1),
    ]


@pytest.mark.parametrize("numbers", [(1, 2), (2**40, 2**40 + 1)])
def test_step_numbers_are_the_loops_own(tmp_path, numbers):
    loop = Loop()
    for n in numbers:
        loop.step(n, ("phaseprof::forward", 1_000, [], [("aten::add", 10, 200)]))
    assert run_ops(worker_of(tmp_path, loop)).ops[0].steps == list(numbers)


def test_an_ops_call_stack_is_its_path_of_most_host_time_over_all_spans(tmp_path):
    # aten::add under a.py's frame for 300 µs a step in the first trace file, under b.py's for
    # 100 µs in the second: a.py's path is the row's, whichever span comes last
    first, second = Loop(), Loop()
    for loop, frame, dur, numbers in (
        (first, "a.py(1): f", 300, (1, 2)),
        (second, "b.py(2): g", 100, (3, 4)),
    ):
        for n in numbers:
            loop.step(n, ("phaseprof::forward", 1_000, [], [("aten::add", 10, dur)]))
            start = loop.t - 1_000
            loop.events.append(op(frame, start + 5, dur + 10, cat="python_function"))
    (add,) = [r for r in run_ops(worker_of(tmp_path, first, second)).ops if r.name == "aten::add"]
    assert (add.stack, add.frame, add.calls) == (["a.py(1): f"], "a.py(1): f", 4)

"""Phase definitions on hand-built traces: each test sets up one situation the phase definitions name."""

from __future__ import annotations

import sys

import msgspec
import numpy as np
import pytest

from phaseprof.plugin.analysis.span import _all_busy_bands, _busy_bands, analyze_trace
from phaseprof.plugin.analysis.steps import gpu_time, step_detail, step_rows
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import AUTOGRAD, annotation, kernel, launch, memory, op, step, thread_names


def analyse(tmp_path, events, name="w.1.pt.trace.json"):
    return analyze_trace(read_trace(str(write_trace(tmp_path / name, thread_names() + events))))


def phase_ms(span, step_index: int, phase: str, gpu: bool = False) -> float:
    table = span.gpu_us if gpu else span.host_us
    return float(table[step_index, span.phases.index(phase)]) / 1000.0


def accumulating_step() -> list[dict]:
    """A step of two micro-batches (gradient accumulation) with no forward/backward ranges."""
    events = [step(1, 0, 10_000), annotation("Optimizer.zero_grad#SGD.zero_grad", 0, 100)]
    for start in (1_000, 5_000):
        events += [
            op("aten::linear", start, 1_000),
            op("aten::ones_like", start + 1_500, 50),
            op("autograd::engine::evaluate_function: AddmmBackward0", start + 1_600, 1_400),
        ]
    return [*events, annotation("Optimizer.step#SGD.step", 9_000, 800)]


#: Each situation the phase definitions name: its trace events, the clock, the phase times it must give
#: (ms, one {phase: ms} per step, by index), the phases of the first step that are inferred (None: not
#: checked) and what else must hold of it. One test walks them all, so a situation is its data alone.
SITUATIONS = [
    # Lightning wraps optimizer.step(closure); the closure runs training_step and backward inside it:
    # the optimizer is optimizer_step minus the closure's training_step and backward.
    pytest.param([
        step(1, 0, 10_000),
        annotation("[pl][profile][_TrainingEpochLoop].train_dataloader_next", 100, 900),
        annotation("[pl][profile][LightningModule]Model.optimizer_step", 1_000, 8_000),
        annotation("[pl][profile][Strategy]SingleDeviceStrategy.training_step", 1_500, 3_000),
        annotation("[pl][profile][Strategy]SingleDeviceStrategy.backward", 5_000, 3_000),
        op("aten::mm", 1_600, 500),
    ], "host", [{"data": 0.9, "forward": 3.0, "backward": 3.0, "optimizer": 2.0,
                 "other": 10.0 - 0.9 - 3.0 - 3.0 - 2.0}], set(), None,
        id="innermost_range_wins_lightning_optimizer_step_containing_the_closure"),
    pytest.param([
        step(3, 0, 1_000),
        annotation("phaseprof::forward", 0, 600),
        annotation("phaseprof::loss", 400, 200),
        annotation("phaseprof::backward", 600, 400),
    ], "host", [{"forward": 0.4, "loss": 0.2, "backward": 0.4}], None, lambda span: span.phases[-1] == "loss",
        id="user_phase_inside_forward_takes_its_own_name"),
    # On CUDA builds autograd launches backward kernels from its own thread, outside any range of
    # the loop's thread; attribution follows the launch's correlation id to its host thread.
    pytest.param([
        step(1, 0, 10_000),
        annotation("## forward ##", 0, 4_000),
        launch(100, corr=1),
        kernel("fwd_gemm", 200, 1_000, corr=1),
        annotation("## backward ##", 4_000, 5_000),
        op("autograd::engine::evaluate_function: MmBackward0", 4_200, 3_000, tid=AUTOGRAD),
        launch(4_300, corr=2, tid=AUTOGRAD),
        kernel("bwd_gemm", 4_400, 2_500, corr=2),
    ], "gpu", [{"forward": 1.0, "backward": 2.5}], None, None,
        id="kernels_launched_from_the_autograd_thread_count_as_backward"),
    # The CPU runs ahead: the optimizer's kernel is launched at the end of step 1 and runs during
    # step 2. It belongs to step 1's optimizer, in full.
    pytest.param([
        step(1, 0, 1_000),
        annotation("Optimizer.step#SGD.step", 800, 150),
        launch(900, corr=7),
        kernel("multi_tensor_apply", 950, 3_000, corr=7),
        step(2, 1_000, 1_000),
        op("aten::add", 1_100, 100),
    ], "gpu", [{"optimizer": 3.0}], None,
        lambda span: phase_ms(span, 1, "optimizer", gpu=True) == 0 and span.gpu_us[1].sum() == 0,
        id="kernels_finishing_after_the_step_count_in_the_phase_that_launched_them"),
    # forward: from each micro-batch's first op up to its backward; backward: seed to last autograd op
    pytest.param(accumulating_step(), "host", [{"forward": 2 * 1.5, "backward": 2 * 1.5, "optimizer": 0.9}],
                 {"forward", "backward"}, None, id="gradient_accumulation_gives_several_inferred_segments_per_step"),
    # The loop's thread is blocked in loss.backward() while the engine's thread works; DDP's reducer
    # keeps that thread busy after the last autograd op.
    pytest.param([
        step(1, 0, 10_000),
        op("aten::linear", 100, 2_000),
        op("aten::ones_like", 2_200, 50),
        op("autograd::engine::evaluate_function: AddmmBackward0", 2_400, 3_000, tid=AUTOGRAD),
        op("torch.distributed.ddp.reducer::copy_bucket_to_grad", 5_500, 1_000, tid=AUTOGRAD),
        annotation("Optimizer.step#SGD.step", 6_600, 1_000),
    ], "host", [{"backward": (6_500 - 2_200) / 1000, "forward": (2_200 - 100) / 1000}], None, None,
        id="backward_on_cuda_ends_when_the_loop_thread_resumes_not_at_the_last_autograd_op"),
    # CPU build: the engine runs the backward ops on the loop's own thread, with gaps between them;
    # backward runs from the gradient seed to the last op's end.
    pytest.param([
        step(1, 0, 2_000),
        op("aten::linear", 100, 500),
        op("aten::ones_like", 700, 50),
        op("autograd::engine::evaluate_function: AddmmBackward0", 800, 200),
        op("autograd::engine::evaluate_function: TBackward0", 1_100, 200),  # 100 µs after the previous one
        op("aten::add_", 1_500, 100),  # the loop resumes
    ], "host", [{"backward": 0.6, "forward": 0.6}], None, None,
        id="a_cpu_backward_is_one_segment_across_the_engines_gaps"),
    # A data range that opened before the trace's first ProfilerStep (the window began during the
    # fetch) covers the start of that step: its part inside the step is data, not other.
    pytest.param([
        annotation("phaseprof::data", 0, 2_500),
        step(1, 1_000, 10_000),
        annotation("phaseprof::forward", 2_500, 4_000),
        step(2, 11_000, 5_000),
        annotation("phaseprof::data", 11_000, 1_000),
    ], "host", [{"data": 1.5, "forward": 4.0, "other": 4.5}, {"data": 1.0}], None, None,
        id="a_phase_range_begun_before_the_first_step_counts_in_it"),
    # an inference loop: no phase ranges, no gradient seed; all the step's top-level work is forward
    pytest.param([step(1, 0, 1000), op("aten::mm", 100, 300), op("aten::relu", 500, 100)],
                 "host", [{"forward": 0.5, "other": 0.5}], {"forward"}, None,
                 id="a_step_without_backward_is_forward_from_its_first_op"),
    pytest.param([
        step(1, 0, 20_000),
        annotation("phaseprof::forward", 0, 2_000),
        annotation("phaseprof::eval", 2_000, 3_000),
        annotation("phaseprof::backward", 5_000, 2_000),
        annotation("phaseprof::eval", 8_000, 2_000),
        annotation("phaseprof::optimizer", 10_000, 1_000),
    ], "host", [{"other": 10.0}], None,
        lambda span: span.steps[0].apart == {"eval": 5_000.0} and span.steps[0].wall == pytest.approx(15_000.0),
        id="two_evaluation_passes_in_one_step_are_both_kept_out_of_it"),
]


@pytest.mark.parametrize("events, clock, times, inferred, holds", SITUATIONS)
def test_each_situation_gives_its_phase_times(tmp_path, events, clock, times, inferred, holds):
    """Every phase time a situation names, to the microsecond: a phase's time is the whole definition."""
    span = analyse(tmp_path, events)
    got = [{phase: phase_ms(span, index, phase, gpu=clock == "gpu") for phase in step_times}
           for index, step_times in enumerate(times)]
    assert got == [pytest.approx(step_times) for step_times in times]
    if inferred is not None:
        assert span.steps[0].inferred == inferred
    if holds is not None:
        assert holds(span)


def test_self_time_subtracts_direct_children_only(tmp_path):
    # PyTorch's profiler recipe example: relu_ spends most of its time in its child threshold_.
    span = analyse(tmp_path, [
        step(1, 0, 1_000),
        annotation("phaseprof::forward", 0, 1_000),
        op("aten::relu_", 100, 400),
        op("aten::threshold_", 150, 300),
        op("aten::empty", 160, 10),
    ])
    detail = detail_of(span, 1)
    rows = {r["name"]: r for r in detail["ops"]["forward"]}
    assert rows["aten::relu_"]["self_host_ms"] == pytest.approx(0.1)
    assert rows["aten::relu_"]["host_ms"] == pytest.approx(0.4)
    assert rows["aten::threshold_"]["self_host_ms"] == pytest.approx(0.29)
    assert "phaseprof::forward" not in rows  # the phase range is the phase, not an op of it


def test_an_ops_gpu_time_holds_its_childrens_kernels_however_short(tmp_path):
    # aten::linear launches nothing itself: its ten aten::addmm each launch a kernel of under a µs
    events = [step(1, 0, 1_000), annotation("phaseprof::forward", 0, 1_000), op("aten::linear", 10, 500)]
    for k in range(10):
        events += [op("aten::addmm", 20 + 40 * k, 30), launch(25 + 40 * k, k + 1),
                   kernel("gemm_small", 100 + 10 * k, 0.9, k + 1)]
    rows = {r["name"]: r for r in detail_of(analyse(tmp_path, events), 1)["ops"]["forward"]}
    assert (rows["aten::addmm"]["self_gpu_ms"], rows["aten::addmm"]["gpu_ms"]) == (0.009, 0.009)
    assert (rows["aten::linear"]["self_gpu_ms"], rows["aten::linear"]["gpu_ms"]) == (0.0, 0.009)


def test_an_op_row_carries_the_call_stack_of_most_of_its_time(tmp_path):
    # with_stack=True: Python frames around the ops; aten::mm is called from two lines, aten::add from none
    span = analyse(tmp_path, [
        step(1, 0, 1_000),
        annotation("phaseprof::forward", 0, 1_000),
        op("train.py(12): forward", 50, 500, cat="python_function"),
        op("torch/nn/modules/linear.py(125): forward", 60, 300, cat="python_function"),
        op("aten::mm", 100, 200),
        op("train.py(14): forward", 600, 300, cat="python_function"),
        op("aten::mm", 650, 100),
        op("aten::add", 950, 20),
    ])
    rows = {r["name"]: r for r in detail_of(span, 1)["ops"]["forward"]}
    assert rows["aten::mm"]["calls"] == 2 and rows["aten::mm"]["host_ms"] == pytest.approx(0.3)
    assert rows["aten::mm"]["stack"] == ["torch/nn/modules/linear.py(125): forward", "train.py(12): forward"]
    assert rows["aten::mm"]["frame"] == "train.py(12): forward"  # the user's line, not torch's
    assert "stack" not in rows["aten::add"] and "frame" not in rows["aten::add"]


def test_memory_peak_and_net_delta_per_phase(tmp_path):
    span = analyse(tmp_path, [
        step(1, 0, 1_000),
        annotation("phaseprof::forward", 0, 500),
        memory(100, 4096, 4096),
        memory(200, 8192, 12288),
        annotation("phaseprof::backward", 500, 500),
        memory(600, -8192, 4096),
    ])
    detail = detail_of(span, 1)
    assert detail["memory"]["forward"]["cuda:0"] == {"peak_bytes": 12288, "delta_bytes": 12288}
    assert detail["memory"]["backward"]["cuda:0"] == {"peak_bytes": 4096, "delta_bytes": -8192}


def test_a_phase_that_freed_all_it_allocated_peaks_at_zero_bytes(tmp_path):
    span = analyse(tmp_path, [
        step(1, 0, 1_000),
        annotation("phaseprof::forward", 0, 500),
        memory(100, -4096, 0),  # allocated before the step, all freed here: 0 bytes left
        annotation("phaseprof::backward", 500, 500),
    ])
    detail = detail_of(span, 1)
    assert detail["memory"]["forward"]["cuda:0"] == {"peak_bytes": 0, "delta_bytes": -4096}
    assert "cuda:0" not in detail["memory"]["backward"]  # no memory event: nothing to show


def test_the_step_detail_lists_the_ops_asked_for_with_their_input_shapes(tmp_path):
    span = analyse(tmp_path, [
        step(1, 0, 1_000),
        annotation("phaseprof::forward", 0, 1_000),
        op("aten::mm", 100, 400, **{"Input Dims": [[2, 3], [3, 4]]}),
        op("aten::relu", 600, 100),
    ])
    w = Worker("w", [span])
    every = step_detail(w, w.row_of(1), "run").ops["forward"]
    assert [(r.name, r.shapes) for r in every] == [("aten::mm", "[[2, 3], [3, 4]]"), ("aten::relu", None)]
    assert [r.name for r in step_detail(w, w.row_of(1), "run", op_limit=1).ops["forward"]] == ["aten::mm"]


def test_a_step_lists_its_phases_ops_when_another_span_has_phases_it_has_not(tmp_path):
    # two user phases in the first span, only the second in the other: the worker names both
    first = analyse(tmp_path, [step(1, 0, 1_000), annotation("phaseprof::loss", 0, 400), op("aten::sum", 10, 100),
                               annotation("phaseprof::metrics", 500, 400), op("aten::mean", 510, 100)],
                    "w.1.pt.trace.json")
    second = analyse(tmp_path, [step(2, 0, 1_000), annotation("phaseprof::metrics", 500, 400),
                                op("aten::mean", 510, 100)], "w.2.pt.trace.json")
    w = Worker("w", [first, second])
    assert w.phases.index("loss") < w.phases.index("metrics")
    detail = step_detail(w, w.row_of(2), "run")
    assert detail.ops["loss"] == [] and [r.name for r in detail.ops["metrics"]] == ["aten::mean"]


def test_the_gpu_time_of_several_steps_is_their_mean_per_step(tmp_path):
    span = analyse(tmp_path, [
        step(1, 1_500, 1_000),
        annotation("phaseprof::forward", 1_500, 1_000),
        launch(1_510, corr=1), kernel("k", 1_520, 100, corr=1),
        launch(1_600, corr=2), kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1_700, 100, corr=2, stream=9),
        step(2, 2_500, 1_000),
        annotation("phaseprof::forward", 2_500, 1_000),
        launch(2_510, corr=3), kernel("k", 3_300, 300, corr=3),  # runs 100 µs past the step's host window
    ])
    w = Worker("w", [span])
    rows = step_rows(w)
    assert [(r.start_ms, r.span) for r in rows] == [(1.5, "w.1.pt.trace.json"), (2.5, "w.1.pt.trace.json")]
    assert not rows[0].phases["forward"].inferred  # marked by its range
    both = gpu_time(w, np.array([w.row_of(1), w.row_of(2)]))
    assert (both.kernel_ms, both.busy_ms, both.compute_ms) == (0.25, 0.25, 0.2)
    assert (both.comm_ms, both.exposed_comm_ms, both.overlap) == (0.05, 0.05, 0.0)
    assert both.past_host_ms == 0.05
    assert both.streams == {"GPU 0 stream 7": 0.2, "GPU 0 stream 9": 0.05}


def test_gpu_idle_and_verdict_per_phase(tmp_path):
    span = analyse(tmp_path, [
        step(1, 0, 2_000),
        annotation("phaseprof::forward", 0, 1_000),
        launch(10, corr=1),
        kernel("k", 20, 100, corr=1),  # GPU busy 10% of forward
        annotation("phaseprof::backward", 1_000, 1_000),
        launch(1_010, corr=2),
        kernel("k", 1_000, 1_000, corr=2),  # busy all of backward
    ])
    detail = detail_of(span, 1)
    assert detail["phases"]["forward"]["gpu_idle_ms"] == pytest.approx(0.9)
    assert detail["phases"]["forward"]["verdict"] == "cpu-bound"
    assert detail["phases"]["backward"]["gpu_idle_ms"] == pytest.approx(0.0)
    assert detail["phases"]["backward"]["verdict"] == "gpu-bound"


def test_a_phase_whose_gpu_only_communicates_or_copies_is_never_gpu_bound(tmp_path):
    # backward: an all-reduce fills its host window; optimizer: a copy fills its; neither computes
    span = analyse(tmp_path, [
        step(1, 0, 3_000),
        annotation("phaseprof::backward", 0, 1_000),
        launch(10, corr=1),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 0, 1_000, corr=1, stream=9),
        annotation("phaseprof::optimizer", 1_000, 1_000),
        launch(1_010, corr=2),
        kernel("Memcpy DtoH (Device -> Pageable)", 1_000, 1_000, corr=2),
        annotation("phaseprof::forward", 2_000, 1_000),
        launch(2_010, corr=3),
        kernel("volta_sgemm_128x64_nn", 2_000, 1_000, corr=3),
    ])
    detail = detail_of(span, 1)
    for phase in ("backward", "optimizer"):
        assert detail["phases"][phase]["gpu_idle_ms"] == pytest.approx(0.0)  # the GPU was busy
        assert detail["phases"][phase]["verdict"] == "balanced", phase
    assert detail["phases"]["forward"]["verdict"] == "gpu-bound"


@pytest.mark.parametrize("host_us, idle_us, compute_idle_us, has_gpu, expected", [
    (1_000.0, 500.0, 500.0, True, "cpu-bound"),  # the GPU idles half the phase: the bound itself
    (1_000.0, 499.0, 499.0, True, "balanced"),
    (1_000.0, 101.0, 101.0, True, "balanced"),
    (1_000.0, 100.0, 100.0, True, "gpu-bound"),  # idle a tenth of it: the bound itself
    (1_000.0, 0.0, 0.0, True, "gpu-bound"),
    (1_000.0, 0.0, 101.0, True, "balanced"),  # busy all along, but copying or communicating a part
    (1_000.0, 0.0, 1_000.0, True, "balanced"),  # busy all along, never computing: never gpu-bound
    (1_000.0, 500.0, 1_000.0, True, "cpu-bound"),
    (1_000.0, 500.0, 500.0, False, None),  # no GPU: no verdict
    (0.0, 0.0, 0.0, True, None),  # a phase without host time
    (1_000.0, float("nan"), float("nan"), True, None),  # idle unknown
])
def test_the_verdict_bounds_belong_to_the_verdict_they_name(host_us, idle_us, compute_idle_us, has_gpu,
                                                            expected):
    from phaseprof.plugin.analysis.steps import verdict

    assert verdict(host_us, idle_us, compute_idle_us, has_gpu) == expected


def test_a_trace_without_step_markers_is_one_step(tmp_path):
    span = analyse(tmp_path, [op("aten::mm", 10, 100), op("aten::add", 200, 50)])
    assert [s.number for s in span.steps] == [0]
    assert span.host_us[0].sum() == pytest.approx(240)


def test_swimlanes_show_the_loop_thread_other_threads_and_gpu_streams(tmp_path):
    span = analyse(tmp_path, [
        step(1, 0, 10_000),
        annotation("## backward ##", 4_000, 5_000),
        op("autograd::engine::evaluate_function: MmBackward0", 4_200, 3_000, tid=AUTOGRAD),
        launch(4_300, corr=2, tid=AUTOGRAD),
        kernel("bwd_gemm", 4_400, 2_500, corr=2),
    ])
    lanes = detail_of(span, 1)["lanes"]
    assert lanes["labels"] == ["thread 100 (python)", "thread 101 (pt_autograd_0)", "GPU 0 stream 7"]
    assert [0, 4.0, 9.0, "backward"] in lanes["bands"]
    assert [1, 4.2, 7.2, "backward"] in lanes["bands"]
    assert [2, 4.4, 6.9, "backward"] in lanes["bands"]


def test_each_gpu_stream_is_a_lane_of_its_own_with_its_own_work(tmp_path):
    # two GPUs in one trace, two streams each, one stream number on both: four lanes, by (GPU, stream)
    work = [(1, 7, 4_000), (0, 20, 2_000), (1, 3, 3_000), (0, 7, 1_000)]  # (GPU, stream, start µs)
    events = [step(1, 0, 10_000), annotation("phaseprof::forward", 0, 9_000)]
    for k, (device, stream, ts) in enumerate(work):
        work_item = kernel(f"k{k}", ts, 100 * (k + 1), corr=k + 1, stream=stream)
        work_item["pid"] = work_item["args"]["device"] = device
        events += [launch(10 + k, corr=k + 1), work_item]
    detail = detail_of(analyse(tmp_path, events), 1)
    lanes = detail["lanes"]
    order = ["GPU 0 stream 7", "GPU 0 stream 20", "GPU 1 stream 3", "GPU 1 stream 7"]
    assert lanes["labels"][1:] == order  # after the loop's thread
    for k, (device, stream, ts) in enumerate(work):
        lane = lanes["labels"].index(f"GPU {device} stream {stream}")
        assert [b[1:3] for b in lanes["bands"] if b[0] == lane] == [[ts / 1000, (ts + 100 * (k + 1)) / 1000]]
    assert detail["gpu_time"]["streams"] == {f"GPU {d} stream {s}": pytest.approx(0.1 * (k + 1))
                                             for k, (d, s, _) in enumerate(work)}


def test_a_streams_lane_draws_its_busy_intervals_not_its_first_to_last_kernel(tmp_path):
    # One phase launches 100 kernels of 50 µs on one stream, 15 µs apart, then one more 0.5 µs after
    # the last, in a 10 ms step: busy 5.05 ms of the 6.5 ms from the first kernel to the last.
    events = [step(1, 0, 10_000), annotation("phaseprof::forward", 0, 9_000)]
    starts = [100 + 65 * k for k in range(100)] + [100 + 65 * 99 + 50.5]
    for k, ts in enumerate(starts):
        events += [launch(10 + 0.05 * k, corr=k + 1, dur=0.01), kernel(f"k{k}", ts, 50, corr=k + 1)]
    lanes = detail_of(analyse(tmp_path, events), 1)["lanes"]
    stream = lanes["labels"].index("GPU 0 stream 7")
    bands = [b[1:3] for b in lanes["bands"] if b[0] == stream]
    # Every gap one could see (15 µs: 1.5 px on a 1000 px chart) stays a gap; the 0.5 µs one may close.
    assert len(bands) in (100, 101)
    assert bands[0] == [0.1, 0.15]
    assert sum(b - a for a, b in bands) == pytest.approx(5.05, rel=0.01)


#: An epoch-based microsecond timestamp (~1.7e15), as real traces write them: float64 steps by 0.25 µs there.
EPOCH_US = 1712195495536782.25


def forward_step_at_epoch(tmp_path, ops: list[tuple[str, float, float]]):
    """The span of one 1 ms step, all forward, starting at `EPOCH_US`, holding ``ops`` (name, start as
    an offset from the step's, duration in µs): where float rounding of timestamps bites."""
    events = [step(1, EPOCH_US, 1000), annotation("phaseprof::forward", EPOCH_US, 1000)]
    return analyse(tmp_path, events + [op(name, EPOCH_US + offset, dur) for name, offset, dur in ops])


def test_events_shorter_than_float_resolution_do_not_nest(tmp_path):
    # A 0.04 µs op's end rounds to its start. Such ops are siblings, not parents of the next ones.
    span = forward_step_at_epoch(tmp_path, [("aten::add", 1, 10),
                                            *[("aten::result_type", 20 + 0.25 * k, 0.04) for k in range(8)]])
    (row,) = [k for k, name in enumerate(span.ops.name) if span.names[name] == "aten::result_type"]
    assert span.ops.calls[row] == 8
    assert span.ops.self_us[row] == pytest.approx(8 * 0.04)  # none is another's parent
    assert (span.ops.self_us >= 0).all()


def test_ops_of_one_start_nest_longest_first_whatever_their_order_in_the_file(tmp_path):
    # µs-resolution traces give a parent and its first child one start; the file may list the child
    # first. Only the ops that share a start are ordered by duration (`nesting._thread_time_order`).
    span = forward_step_at_epoch(tmp_path, [("aten::t", 5, 1), ("aten::add", 9, 1), ("aten::linear", 5, 3),
                                            ("aten::mul", 9, 2), ("aten::relu", 20, 1)])
    self_us = {span.names[span.ops.name[k]]: float(span.ops.self_us[k]) for k in range(len(span.ops.name))}
    assert self_us == pytest.approx({"aten::linear": 2, "aten::t": 1, "aten::mul": 1, "aten::add": 1,
                                     "aten::relu": 1})


def test_the_thread_time_order_is_the_three_key_lexsort():
    from types import SimpleNamespace

    from phaseprof.plugin.analysis.nesting import _thread_time_order

    rng = np.random.default_rng(0)
    for _ in range(500):  # many equal starts and durations, sorted and not
        n = int(rng.integers(0, 40))
        ts = rng.integers(0, n // 3 + 1, n).astype(np.float64)
        ts = np.sort(ts) if rng.random() < 0.5 else ts
        dur = rng.integers(0, 4, n).astype(np.float64)
        thread = rng.integers(0, 3, n).astype(np.int32)
        order = _thread_time_order(SimpleNamespace(ts=ts, dur=dur, thread=thread))
        assert np.array_equal(order, np.lexsort((-dur, ts, thread)))


def test_a_runtime_call_far_slower_than_its_names_median_waited_for_the_excess(tmp_path):
    # launches of 10, 10, 12 and 300 µs (median 11: the mean of the two middle ones), memcpys of 5, 7
    # and 400 µs (median 7): the 300 µs launch waited 289 µs, the 400 µs copy 393; the rest none
    events = [step(1, 0, 10_000), annotation("phaseprof::forward", 0, 5_000),
              annotation("phaseprof::backward", 5_000, 5_000)]
    for k, (ts, dur) in enumerate([(100, 10), (200, 10), (5_100, 12), (300, 300)]):
        events += [launch(ts, corr=k, dur=dur), kernel("k", ts + 700, 1, corr=k)]
    for k, (ts, dur) in enumerate([(5_300, 5), (1_000, 7), (5_500, 400)], start=10):
        events += [launch(ts, corr=k, dur=dur, name="cudaMemcpyAsync"),
                   kernel("Memcpy HtoD (Pinned -> Device)", ts + 1_000, 1, corr=k)]
    span = analyse(tmp_path, events)
    waited = {p: float(span.wait_us[0, span.phases.index(p)]) for p in ("forward", "backward")}
    assert waited == pytest.approx({"forward": 300 - 11, "backward": 400 - 7})


def test_the_medians_by_name_are_numpys_medians():
    from phaseprof.plugin.analysis.span import _medians_by

    rng = np.random.default_rng(1)
    for _ in range(300):  # odd and even counts, equal values, name codes past a 16-bit sort's range
        n = int(rng.integers(1, 40))
        key = rng.integers(0, 6, n).astype(np.int32) * (1 if rng.random() < 0.7 else 20_000)
        value = np.round(rng.random(n) * 100, int(rng.integers(0, 3)))
        codes, inverse = np.unique(key, return_inverse=True)
        medians = np.array([np.median(value[inverse == k]) for k in range(len(codes))])[inverse]
        assert _medians_by(key, value).tobytes() == medians.tobytes()


def test_op_times_come_from_written_durations_so_self_never_exceeds_total(tmp_path):
    # ``end - ts`` of a 0.004 µs op is 0, and two children each rounded to the ns can add up to a hair
    # more than their parent.
    span = forward_step_at_epoch(tmp_path, [*[("aten::result_type", 2 + k, 0.004) for k in range(5)],
                                            ("aten::linear", 100, 3.001), ("aten::t", 100, 1.5007),
                                            ("aten::addmm", 101.5, 1.5007)])
    t = span.ops
    rows = {span.names[t.name[k]]: k for k in range(len(t.step))}
    assert t.total_us[rows["aten::result_type"]] == pytest.approx(5 * 0.004)
    assert t.total_us[rows["aten::linear"]] == pytest.approx(3.001)
    assert (t.self_us <= t.total_us).all()
    assert (t.self_us >= 0).all()


def detail_of(span, number):
    """Step ``number`` of a one-span worker in full, as its JSON answer reads."""
    w = Worker("w", [span])
    return msgspec.json.decode(msgspec.json.encode(step_detail(w, w.row_of(number), "run")))


def test_step_zeros_marker_is_no_op_of_its_step(tmp_path):
    span = analyse(tmp_path, [step(0, 0, 1_000), annotation("phaseprof::forward", 0, 1_000), op("aten::mm", 100, 400)])
    w = Worker("w", [span])
    detail = step_detail(w, w.row_of(0), "run")
    assert {r.name for ops in detail.ops.values() for r in ops} == {"aten::mm"}


def test_a_trace_without_host_events_has_no_steps(tmp_path):
    span = analyse(tmp_path, [])
    assert span.steps == [] and span.host_us.size == 0


def test_the_step_trace_labels_host_events_of_an_evaluation_pass_apart_from_the_step(tmp_path):
    from phaseprof.plugin.analysis.step_trace import step_trace

    events = [step(1, 0, 10_000), annotation("phaseprof::forward", 0, 2_000), op("aten::mm", 100, 400),
              annotation("phaseprof::eval", 2_000, 5_000), op("aten::conv2d", 2_100, 1_000),
              annotation("phaseprof::backward", 7_000, 3_000)]
    trace = read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", thread_names() + events)))
    args = {e.name: e.args for e in step_trace(trace, 1).traceEvents if e.ph == "X" and e.cat == "cpu_op"}
    assert args == {"aten::mm": {"phase": "forward"}, "aten::conv2d": {"apart": "eval"}}


def test_a_trace_without_marks_is_the_loop_of_its_busiest_thread_nested_time_counted_once(tmp_path):
    # the loop's thread: 1.5 ms of top-level work, against 1 ms on the other (holding 0.8 ms nested)
    span = analyse(tmp_path, [op("aten::linear", 0, 1_000), op("aten::mm", 100, 800),
                              op("aten::conv2d", 0, 1_500, tid=AUTOGRAD)])
    assert detail_of(span, 0)["lanes"]["labels"][0] == "thread 101 (pt_autograd_0)"
    assert phase_ms(span, 0, "forward") == pytest.approx(1.5)


def _bands_lane_by_lane(step, lane, start, end, phase, pixel):
    """The bands as first cut: `_busy_bands` called on each lane of each step in turn."""
    new = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (lane[1:] != lane[:-1])])
    return np.concatenate([a + _busy_bands(start[a:b], end[a:b], phase[a:b], pixel[step[a]])
                           for a, b in zip(new.tolist(), [*new[1:].tolist(), len(step)])])


@pytest.mark.parametrize("seed", range(40))
def test_the_bands_of_all_lanes_at_once_are_those_cut_lane_by_lane(seed):
    # overlapping, touching and nested intervals, a few phases, gaps either side of a pixel, whole
    # lanes of short gaps (where the busy-time slack decides) and lanes of one interval
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    step = np.sort(rng.integers(0, 1 + n // 20, n))
    lane = rng.integers(0, 3, n)
    start = rng.integers(0, 200, n).astype(np.float64) * rng.choice([1.0, 0.5])
    end = start + rng.integers(0, 30, n) * rng.choice([1.0, 0.1, 5.0], n)
    phase = rng.integers(0, int(rng.integers(1, 4)), n)
    order = np.lexsort((start, lane, step))
    step, lane, start, end, phase = step[order], lane[order], start[order], end[order], phase[order]
    pixel = rng.choice([0.0, 0.5, 3.0, 40.0], step.max() + 1)
    expected = _bands_lane_by_lane(step, lane, start, end, phase, pixel)
    assert np.array_equal(_all_busy_bands(step, lane, start, end, phase, pixel), expected)


def test_the_lanes_of_many_steps_are_cut_in_whole_array_steps(tmp_path):
    # no gap short enough to join: no lane is judged on its own (once, a few numpy calls per lane)
    events = []
    for s in range(300):
        t = s * 1_000.0
        events += [step(s, t, 900), annotation("## forward ##", t + 100, 300),
                   op("aten::mm", t + 120, 200), annotation("## backward ##", t + 500, 300)]
    calls = 0

    def tally(frame, event, arg):
        nonlocal calls
        calls += event == "call" and frame.f_code is _busy_bands.__code__

    sys.setprofile(tally)
    try:
        span = analyse(tmp_path, events)
    finally:
        sys.setprofile(None)
    assert len(span.steps) == 300 and calls == 0

"""Findings a performance engineer would sign: on the real traces, the top finding reasoned out from
first principles; per finding kind, a hand-built loop that has exactly that problem; on every trace,
the headline phase is the costliest in the measure it states."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.cli.report import report
from phaseprof.contract import CPUS_KEY
from phaseprof.plugin.analysis.ranks import ranks
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests import test_gpu_measures
from tests.logdir import write_trace
from tests.tracebuilder import AUTOGRAD, Loop, op, step

DATA_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def summary_of(path):
    r = report(str(path))
    assert r.errors == [], r.errors
    (run,) = r.runs
    (worker,) = run.workers
    return worker.summary


def loop_summary(tmp_path, loop: Loop):
    return summary_of(write_trace(tmp_path / "w.1.pt.trace.json", loop.events))


def kinds(summary) -> list[str]:
    return [f.kind for f in summary.findings]


def finding(summary, kind: str):
    found = [f for f in summary.findings if f.kind == kind]
    assert found, (kind, kinds(summary))
    return found[0]


# --- the real traces ----------------------------------------------------------------------------------


def test_resnet50_with_num_workers_0_is_held_up_by_data_loading(traces):
    # ResNet-50 on a V100 with the DataLoader in the loop's own process: each ~164 ms step spends
    # ~57 ms preparing the batch on the host while the GPU (busy ~100 ms of the step) idles. The
    # host is the bottleneck, and the largest piece of host time is data: move it to workers.
    s = summary_of(traces.folder("gpu", "kineto_resnet50_num_workers_0"))
    first = s.findings[0]
    assert s.measure == "host" and first.evidence.measure == "host"
    assert (first.kind, first.phase, s.dominant_phase) == ("data-loader", "data", "data")
    assert first.evidence.loader == "single-process"
    assert "num_workers" in first.text and "the most host time" in first.text
    assert first.saving_ms == pytest.approx(s.mean["data"].host_ms)
    # two thirds of it is the dataset's own Python (decoding, transforms), recorded by no op
    assert 30 < first.evidence.untraced_ms < 45 and "the dataset's Python" in first.text
    # the optimizer's per-parameter kernels are named too, with the fix
    opt = finding(s, "optimizer")
    assert opt.evidence.launches > 600 and "foreach" in opt.text
    # no launch-overhead advice for data loading, no GPU-side advice for a host-bound step
    assert not any(f.kind in ("launch-bound", "gpu-bound") for f in s.findings)


def test_hta_v100_run_is_gpu_bound_in_backward_on_fp32_convolutions(traces):
    # DDP ResNet on a V100: the GPU is busy ~97% of every step; the host runs ahead and waits in a
    # full launch queue. What each phase adds is its GPU work, backward's the most (~63 ms of ~95 ms),
    # mostly fp32 cuDNN/GEMM kernels: mixed precision in fp16 (a V100 has no bf16 / TF32).
    s = summary_of(traces.folder("gpu", "hta_ns_resolution"))
    first = s.findings[0]
    assert s.measure == "gpu"
    assert (first.kind, first.phase) == ("gpu-bound", "backward")
    assert "float16" in first.text and "bfloat16" not in first.text and "GPU-bound" in first.text
    assert first.evidence.fp32_matrix_share > 0.5
    # the slowest step is within noise (0.15 ms over the median); steps 101 and 102 are fast outliers
    assert s.slowest.noise == "within-noise" and s.slowest.phase is None
    assert sorted(s.outliers) == [101, 102]
    fast = finding(s, "fast-steps")
    assert fast.evidence.steps == [101, 102]
    assert "slow-step" not in kinds(s)


def test_two_rank_sampled_run_has_no_straggler(traces):
    # Two steps per rank, the ranks' steps 0.7% apart: nothing to single out.
    files = traces.files("gpu", "hta_sampled_2rank")
    workers = [Worker(f.name, [analyze_file(tf)]) for f, tf in zip(files, _trace_files(files))]
    answer = ranks("r", workers)
    assert answer.straggler is None
    assert "too few steps" in answer.note
    for s in (summary_of(f) for f in files):
        assert "too-few-steps" in kinds(s) and s.slowest.noise == "too-few-steps"


def _trace_files(paths):
    found = {}
    for run in discover(str(paths[0].parent)):
        for files in run.workers.values():
            for f in files:
                found[f.path] = f
    return [found[str(p)] for p in paths]


@pytest.fixture(scope="module")
def data_workers(traces) -> list:
    """(folder, worker) of every run under tests/data: each folder reported once for the module's
    tests, which only read the reports (a report of them all is seconds of work)."""
    found = []
    for folder in sorted({p.parent for p in traces.all()}):
        r = report(str(folder))
        assert r.errors == [], (folder, r.errors)
        found += [(folder, w) for run in r.runs for w in run.workers]
    return found


def test_first_finding_is_the_costliest_phase_in_the_measure_it_states(data_workers):
    checked = 0
    for folder, w in data_workers:
        s = w.summary
        first = s.findings[0]
        assert first.phase is not None, (folder, w.worker, first)
        column = {"host": "host_ms", "gpu": "gpu_compute_ms"}[first.evidence.measure]
        rows = [row for row in w.steps if not row.empty]
        mean = {p: float(np.mean([getattr(row.phases[p], column) for row in rows])) for p in s.phases}
        assert first.phase == max(mean, key=mean.get), (folder, w.worker, mean, first.text)
        assert first.evidence.cost_ms == pytest.approx(mean[first.phase], abs=0.002)
        assert s.dominant_phase == first.phase
        # worded with the measure it used, and never "the most" next to a larger phase
        assert f"costs the most {'GPU compute' if column == 'gpu_compute_ms' else 'host'} time" in first.text
        for f in s.findings[1:]:
            assert "costs the most" not in f.text
        checked += 1
    assert checked >= 10


def test_findings_come_largest_saving_first_and_never_save_more_than_their_phase_costs(
        data_workers):
    checked = 0
    for folder, w in data_workers:
        s = w.summary
        savings = [f.saving_ms for f in s.findings if f.saving_ms is not None]
        assert savings == sorted(savings, reverse=True), folder
        notes = [f for f in s.findings if f.saving_ms is None]
        assert s.findings[len(savings):] == notes  # notes last
        for f in s.findings:
            if f.kind == "exposed-communication":  # communication is no phase's cost: it saves at most itself
                assert f.saving_ms is None or f.saving_ms <= f.evidence.exposed_ms + 0.002, (folder, f)
            elif f.saving_ms is not None and f.phase is not None:
                assert f.saving_ms <= s.costs[f.phase] + 0.002, (folder, f)
                checked += 1
    assert checked >= 20  # the claim held of many findings, not of none


def test_phases_that_cost_nothing_get_no_finding(data_workers):
    checked = 0
    for folder, w in data_workers:
        s = w.summary
        for f in s.findings:
            if f.phase is not None:
                assert s.costs[f.phase] > 0, (folder, f)
                checked += 1
    assert checked >= 20  # findings that name a phase were there to check


# --- one hand-built loop per finding kind -------------------------------------------------------------


def conv_kernels(n, us):
    return [("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int)", us)] * n


def test_data_loader_in_the_loop_process(tmp_path):
    loop = Loop()
    for n in range(5):
        loop.step(n, (DATA_NEXT, 30_000), ("phaseprof::forward", 10_000, conv_kernels(20, 300)),
                  ("phaseprof::backward", 10_000, conv_kernels(20, 400)), ("phaseprof::optimizer", 2_000))
    s = loop_summary(tmp_path, loop)
    first = s.findings[0]
    assert (first.kind, first.phase) == ("data-loader", "data")
    assert first.evidence.loader == "single-process" and "num_workers" in first.text
    assert first.saving_ms == pytest.approx(30.0, abs=0.01)


def test_pageable_host_to_device_copies_ask_for_pinned_memory(tmp_path):
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::data", 20_000, [("Memcpy HtoD (Pageable -> Device)", 3_000)]),
                  ("phaseprof::forward", 5_000, conv_kernels(10, 300)))
    first = loop_summary(tmp_path, loop).findings[0]
    assert first.kind == "data-loader" and "pin_memory=True" in first.text
    assert first.evidence.pageable_copy_ms == pytest.approx(3.0)


def test_optimizer_launching_a_kernel_per_parameter(tmp_path):
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 5_000, conv_kernels(10, 300)),
                  ("phaseprof::backward", 5_000, conv_kernels(10, 400)),
                  ("Optimizer.step#SGD.step", 20_000, [("void at::native::vectorized_elementwise_kernel<4>", 2)] * 400))
    s = loop_summary(tmp_path, loop)
    first = s.findings[0]
    assert (first.kind, first.phase) == ("optimizer", "optimizer")
    assert first.evidence.launches == 400 and "fused=True" in first.text


def test_launch_bound_forward(tmp_path):
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 30_000, [("void at::native::elementwise_kernel<128>", 5)] * 500),
                  ("phaseprof::backward", 5_000, conv_kernels(10, 400)))
    first = loop_summary(tmp_path, loop).findings[0]
    assert (first.kind, first.phase) == ("launch-bound", "forward")
    assert "CUDA graphs" in first.text and first.evidence.launches == 500


def test_gpu_bound_backward_on_fp32_convolutions(tmp_path):
    loop = Loop()
    for n in range(5):  # the loop reads the loss each step (a sync): the host waits for the GPU
        loop.step(n, ("phaseprof::forward", 2_000, [("volta_sgemm_128x64_nn", 3_000)] * 10),
                  ("phaseprof::backward", 3_000, conv_kernels(10, 5_000)), ("phaseprof::optimizer", "sync"))
    s = loop_summary(tmp_path, loop)
    first = s.findings[0]
    assert s.measure == "gpu"
    assert (first.kind, first.phase) == ("gpu-bound", "backward")
    assert first.saving_ms == pytest.approx(50.0, abs=0.01)
    assert "tensor cores" in first.text and "channels_last" in first.text
    assert finding(s, "gpu-bound").phase == "backward"
    assert [f.phase for f in s.findings if f.kind == "gpu-bound"] == ["backward", "forward"]


def test_host_time_names_the_ops_on_a_cpu_only_run(tmp_path):
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 30_000, [], [("aten::mkldnn_convolution", 100, 25_000)]),
                  ("phaseprof::backward", 10_000))
    s = loop_summary(tmp_path, loop)
    first = s.findings[0]
    assert (first.kind, first.phase, s.measure) == ("host-time", "forward", "host")
    assert "aten::mkldnn_convolution (25.00 ms)" in first.text
    assert "no-gpu" in kinds(s)


def test_sync_point_inside_forward_names_the_op(tmp_path):
    loop = Loop()
    item = [("aten::item", 100, 5_020), ("aten::_local_scalar_dense", 110, 5_000),
            ("cudaStreamSynchronize", 120, 4_980, "cuda_runtime")]
    for n in range(5):  # a 5 ms kernel, then .item() waits for it, then 10 ms of host work, GPU idle
        loop.step(n, ("phaseprof::forward", 15_100, [("volta_sgemm_128x64_nn", 5_000)], item),
                  ("phaseprof::backward", 5_000, conv_kernels(5, 200)))
    s = loop_summary(tmp_path, loop)
    sync = finding(s, "sync")
    assert sync.phase == "forward" and "aten::item" in sync.text and "cudaStreamSynchronize" in sync.text
    assert sync.saving_ms == pytest.approx(4.98, abs=0.01)


def test_allocator_churn_in_backward(tmp_path):
    loop = Loop()
    churn = [(name, 100 + 400 * k + (200 if name == "cudaFree" else 0), 190, "cuda_runtime")
             for k in range(20) for name in ("cudaMalloc", "cudaFree")]
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 10_000, conv_kernels(10, 300)),
                  ("phaseprof::backward", 10_000, conv_kernels(10, 400), churn))
    s = loop_summary(tmp_path, loop)
    alloc = finding(s, "allocator")
    assert alloc.phase == "backward" and alloc.evidence.alloc_calls == 40
    assert alloc.saving_ms == pytest.approx(40 * 0.19, abs=0.01)


def test_collectives_no_compute_overlaps(tmp_path):
    loop = Loop()
    reduce = [("void cudnn::detail::wgrad_engine<float>(int)", 4_000)] * 5 + [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 10_000, 8)]
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 2_000, conv_kernels(5, 2_000)),
                  ("phaseprof::backward", 3_000, reduce, [("nccl:all_reduce", 2_500, 100)]),
                  ("phaseprof::optimizer", "sync"))
    s = loop_summary(tmp_path, loop)
    comm = finding(s, "exposed-communication")
    assert comm.phase == "backward" and comm.evidence.exposed_ms == pytest.approx(10.0)
    assert comm.saving_ms == pytest.approx(10.0, abs=0.01) and "nccl:all_reduce" in comm.text
    assert comm.evidence.collective == "all-reduce" and "bucket_cap_mb" in comm.text


def _six_steps_the_fourth_slow(tmp_path):
    """Six steps whose forward grows by 50 µs a step, but step 3's, which is three times the others'."""
    loop = Loop()
    for n in range(6):
        forward = 30_000 if n == 3 else 10_000 + 50 * n
        loop.step(n, ("phaseprof::forward", forward, [], [("aten::mm", 10, forward - 20)]),
                  ("phaseprof::backward", 10_000))
    return loop_summary(tmp_path, loop)


def test_slow_step_beyond_noise_and_why(tmp_path):
    s = _six_steps_the_fourth_slow(tmp_path)
    slow = finding(s, "slow-step")
    assert slow.phase == "forward" and slow.evidence.step == 3 and "aten::mm" in slow.text
    assert s.slowest.noise == "beyond-noise" and s.outliers == [3]
    assert slow.saving_ms == pytest.approx((30_000 - 10_100) / 6 / 1000, abs=0.05)


def test_fast_step_beyond_noise_and_steps_within_noise(tmp_path):
    loop = Loop()
    for n in range(6):
        loop.step(n, ("phaseprof::forward", 2_000 if n == 0 else 10_000 + 100 * n), ("phaseprof::backward", 10_000))
    s = loop_summary(tmp_path, loop)
    assert finding(s, "fast-steps").evidence.steps == [0]
    assert finding(s, "fast-steps").text.startswith("step 0 took far less than the median step")
    assert s.outliers == [0] and s.slowest.noise == "within-noise" and "slow-step" not in kinds(s)


def test_fast_steps_name_the_fastest_with_its_wall_time(tmp_path):
    loop = Loop()
    fast = {2: 1_500, 5: 2_000}
    for n in range(8):
        loop.step(n, ("phaseprof::forward", fast.get(n, 10_000 + 100 * n)), ("phaseprof::backward", 10_000))
    s = loop_summary(tmp_path, loop)
    note = finding(s, "fast-steps")
    assert note.evidence.steps == [2, 5] and note.evidence.step == 2
    assert note.evidence.step_wall_ms == pytest.approx(11.5, abs=0.01)
    assert note.text.startswith("steps 2, 5 took far less than the median step")
    assert "step 2 11.50 ms" in note.text
    assert note.text == ("steps 2, 5 took far less than the median step 1 (20.10 ms; step 2 11.50 ms, 0.57x the "
                         "median), beyond the steps' noise of ±1.78 ms: work (or waiting) that landed in other steps, "
                         "or a warm-up the rules did not recognise; the means include them")
    assert (note.evidence.median_wall_ms, note.evidence.noise_ms) == (s.noise.median_ms, s.noise.band_ms)
    assert (note.evidence.median_wall_ms, note.evidence.noise_ms) == (20.1, 1.779)


def test_two_warmup_steps_are_named_with_the_longer_of_them(tmp_path):
    loop = Loop()
    setup = {0: 40_000, 1: 60_000}  # one-off setup calls in steps 0 and 1, the second the longer
    for n in range(8):
        ops = [("cudaStreamCreateWithFlags", 10.0, setup[n] - 100, "cuda_runtime")] if n in setup else []
        loop.step(n, ("phaseprof::forward", setup.get(n, 0) + 10_000 + 100 * n, [], ops),
                  ("phaseprof::backward", 5_000))
    s = loop_summary(tmp_path, loop)
    assert s.warmup_steps == [0, 1]
    note = finding(s, "warmup-steps")
    assert note.evidence.step == 1 and note.evidence.step_wall_ms == pytest.approx(75.1, abs=0.01)
    assert note.text.startswith("steps 0, 1 warmed up (step 1 took 75.10 ms, ")
    assert f"x the median step kept ({note.evidence.median_wall_ms:,.2f} ms)" in note.text


def test_too_few_steps_to_judge(tmp_path):
    loop = Loop()
    for n, forward in enumerate((10_000, 40_000)):
        loop.step(n, ("phaseprof::forward", forward), ("phaseprof::backward", 10_000))
    s = loop_summary(tmp_path, loop)
    assert "too-few-steps" in kinds(s) and s.slowest.noise == "too-few-steps" and s.outliers == []
    assert finding(s, "too-few-steps").text.startswith("2 profiled steps to judge: too few steps")
    one = Loop()
    one.step(0, ("phaseprof::forward", 10_000), ("phaseprof::backward", 10_000))
    note = finding(loop_summary(tmp_path / "one", one), "too-few-steps")
    assert note.text.startswith("1 profiled step to judge: too few steps") and note.evidence.steps == [0]


def test_notes_say_what_was_inferred(tmp_path):
    loop = Loop()
    for n in range(3):  # no ProfilerStep, no forward/backward ranges
        loop.step(n, (DATA_NEXT, 1_000), ("Optimizer.step#SGD.step", 1_000))
    events = [e for e in loop.events if not str(e.get("name", "")).startswith("ProfilerStep#")]
    s = summary_of(write_trace(tmp_path / "w.1.pt.trace.json", events))
    assert "inferred-steps" in kinds(s) and finding(s, "inferred-steps").evidence.steps == [0, 1, 2]
    assert all(f.saving_ms is None for f in s.findings if f.kind in ("inferred-steps", "no-gpu"))


def test_notes_on_empty_steps_inferred_phases_and_no_work(tmp_path):
    loop = Loop()
    for n in range(3):  # no forward/backward ranges: inferred from the ops
        loop.step(n, ("phaseprof::data", 1_000), ("phaseprof::optimizer", 1_000, [],
                                                  [("aten::ones_like", 100, 10)]))
    loop.step(3, ("phaseprof::data", 100), ("a range that marks no phase", 4_000, [], [
        ("aten::linear", 100, 2_000), ("aten::ones_like", 2_200, 50),
        ("autograd::engine::evaluate_function: AddmmBackward0", 2_300, 1_000)]))
    loop.events.append(step(4, loop.t, 1_000))  # the loop ended inside the profiled window
    s = loop_summary(tmp_path, loop)
    assert finding(s, "empty-step").evidence.step == 4
    assert finding(s, "empty-step").text == ("step 4 is empty (the loop ended inside the profiler's active window): "
                                             "left out of averages")
    assert finding(s, "inferred-phases").evidence.phases == ["backward", "forward"]
    assert finding(s, "inferred-phases").text == ("backward and forward inferred from the ops (the trace marks no such "
                                                  "ranges): add PhaseProfiler or record_function ranges for exact "
                                                  "boundaries")
    assert all(f.saving_ms is None for f in s.findings if f.kind in ("empty-step", "inferred-phases", "no-gpu"))
    only_empty = write_trace(tmp_path / "empty" / "w.1.pt.trace.json", [step(1, 0, 1_000), step(2, 1_000, 1_000)])
    s = summary_of(only_empty)
    assert kinds(s) == ["no-work"] and s.dominant_phase is None
    (note,) = s.findings
    assert note.text == "no profiled step holds any work" and note.evidence.steps == [1, 2]


@pytest.mark.parametrize("kind, said", [("eval", "evaluation passes 6.00 ms"),
                                        ("paused", "prof.paused() blocks 6.00 ms")])
def test_time_kept_out_of_one_step_is_noted_with_that_step(tmp_path, kind, said):
    loop = Loop()
    for n in range(6):
        kept_out = [(f"phaseprof::{kind}", 6_000)] if n == 2 else []
        loop.step(n, ("phaseprof::forward", 3_000), ("phaseprof::backward", 4_000), *kept_out)
    note = finding(loop_summary(tmp_path, loop), "kept-apart")
    assert note.text == (f"time kept out of the steps ran inside the profiled window (step 2): {said}; not counted "
                         "in any step's time, phases or findings")
    assert note.evidence.steps == [2] and note.saving_ms is None and note.phase is None
    assert (note.evidence.eval_ms, note.evidence.paused_ms) == ((6.0, None) if kind == "eval" else (None, 6.0))


def test_a_slow_steps_evidence_names_the_median_its_sentence_compares_against(tmp_path):
    # six steps: the two middle ones differ, and the median step is the lower one (a step of the run)
    s = _six_steps_the_fourth_slow(tmp_path)
    slow = finding(s, "slow-step")
    median = s.slowest.wall_ms - s.slowest.vs_median_ms
    assert s.slowest.median_step == s.noise.median_step == 2
    assert slow.evidence.median_wall_ms == pytest.approx(median) == s.median_wall_ms == s.noise.median_ms
    assert f"median step 2 ({median:.2f} ms" in slow.text
    assert slow.evidence.noise_ms == s.noise.band_ms == s.slowest.noise_ms


def _agree(where, s):
    """The outliers, the slowest step, the findings and the judgement of the steps say the same."""
    n = s.noise
    if n is None:
        assert not s.outliers and s.slowest is None, where
        return
    assert s.outliers == sorted(n.slow + n.fast), where
    assert s.median_wall_ms == n.median_ms, where
    if not n.judged:
        assert n.steps < n.min_steps and n.slow == n.fast == [] and n.band_ms is None, where
        assert s.slowest.noise == "too-few-steps" and "too-few-steps" in kinds(s), where
        assert not {"slow-step", "fast-steps"} & set(kinds(s)), where
        return
    assert n.steps >= n.min_steps == 5, where
    assert (s.slowest.noise == "beyond-noise") == (s.slowest.step in n.slow), where
    assert s.slowest.noise_ms == n.band_ms, where
    fast = [f for f in s.findings if f.kind == "fast-steps"]
    assert [f.evidence.steps for f in fast] == ([n.fast] if n.fast else []), where
    for f in s.findings:
        if f.kind in ("slow-step", "fast-steps"):
            assert f.evidence.median_wall_ms == n.median_ms and f.evidence.noise_ms == n.band_ms, where
        if f.kind == "slow-step":
            assert f.evidence.step in n.slow, where


def test_outliers_slowest_step_and_findings_read_one_judgement_of_the_steps(data_workers, tmp_path):
    for folder, w in data_workers:
        _agree((folder, w.worker), w.summary)
    for count in (2, 4, 5, 9):  # a slow and a fast step among ``count``
        loop = Loop()
        for n in range(count):
            forward = 40_000 if n == 1 else 2_000 if n == count - 1 else 10_000 + 30 * n
            loop.step(n, ("phaseprof::forward", forward, [], [("aten::mm", 10, forward - 20)]),
                      ("phaseprof::backward", 10_000))
        s = loop_summary(tmp_path / str(count), loop)
        _agree(count, s)
        assert (s.outliers == [1, count - 1]) == (count >= 5), (count, s.outliers)


PAGEABLE = "Memcpy HtoD (Pageable -> Device)"


def test_pageable_copies_name_the_phase_that_pays_and_ask_for_pinned_memory(tmp_path):
    # the batch is copied from pageable memory at the start of forward: the host waits 11.9 ms in
    # cudaMemcpyAsync per step while the copy is staged (the case of a real trace)
    loop = Loop()
    for n in range(5):
        loop.step(n, (DATA_NEXT, 20_000),
                  ("phaseprof::forward", 30_000, [(PAGEABLE, 11_000, 7, "cudaMemcpyAsync", 11_900)]
                   + conv_kernels(10, 300)),
                  ("phaseprof::backward", 10_000, conv_kernels(10, 400)))
    s = loop_summary(tmp_path, loop)
    copies = finding(s, "pageable-copies")
    assert copies.phase == "forward"
    assert copies.evidence.pageable_copy_ms == pytest.approx(11.0)
    assert copies.evidence.copy_host_ms == pytest.approx(11.9) and copies.saving_ms == pytest.approx(11.9)
    assert copies.evidence.ops == ["cudaMemcpyAsync"]
    assert "pin_memory=True" in copies.text and "non_blocking=True" in copies.text and "forward pays" in copies.text
    data = finding(s, "data-loader")  # the batch's copies count toward the data-loader finding too
    assert data.evidence.pageable_copy_ms == pytest.approx(11.0) and "pin_memory=True" in data.text


def test_only_the_batchs_pageable_copies_count_toward_the_data_loader_finding(tmp_path):
    # pageable copies in the optimizer (state moved to the GPU each step) are not the DataLoader's
    loop = Loop()
    for n in range(5):  # the optimizer also copies 2 ms from pinned memory
        loop.step(n, (DATA_NEXT, 30_000, [(PAGEABLE, 1_000, 7, "cudaMemcpyAsync", 1_100)]),
                  ("phaseprof::forward", 10_000, conv_kernels(10, 300)),
                  ("Optimizer.step#SGD.step", 12_000, [(PAGEABLE, 8_000, 7, "cudaMemcpyAsync", 8_000),
                                                       ("Memcpy HtoD (Pinned -> Device)", 2_000, 7, "cudaMemcpyAsync",
                                                        100)]))
    s = loop_summary(tmp_path, loop)
    data = finding(s, "data-loader")
    assert data.evidence.pageable_copy_ms == pytest.approx(1.0)
    copies = {f.phase: f for f in s.findings if f.kind == "pageable-copies"}
    assert copies["optimizer"].evidence.pageable_copy_ms == pytest.approx(8.0)
    assert copies["optimizer"].evidence.copy_host_ms == pytest.approx(8.1 * 8 / 10)  # the pageable share
    assert "tensor.pin_memory()" in copies["optimizer"].text and "DataLoader" not in copies["optimizer"].text


def _fp32_bound(tmp_path, name, **gpu):
    loop = Loop()
    for n in range(5):  # the loop reads the loss each step (a sync): the host waits for the GPU
        loop.step(n, ("phaseprof::forward", 2_000, [("volta_sgemm_128x64_nn", 3_000)] * 10),
                  ("phaseprof::backward", 3_000, conv_kernels(10, 5_000)), ("phaseprof::optimizer", "sync"))
    path = write_trace(tmp_path / name / "w.1.pt.trace.json", loop.events,
                       deviceProperties=[{"id": 0, "name": name, **gpu}])
    return summary_of(path).findings[0]


@pytest.mark.parametrize("name, gpu, says, never", [
    # by compute capability where the trace gives it: whatever the name
    ("NVIDIA GeForce GTX 1080 Ti", {"computeMajor": 6, "computeMinor": 1}, "has no tensor cores", "autocast"),
    ("Some Future GPU", {"computeMajor": 9, "computeMinor": 0}, "bfloat16", "float16,"),
    ("Some Turing GPU", {"computeMajor": 7, "computeMinor": 5}, "float16", "bfloat16"),
    # by name where it does not
    ("NVIDIA GeForce GTX 1660 SUPER", {}, "has no tensor cores", "autocast"),
    ("NVIDIA TITAN RTX", {}, "float16, and a GradScaler", "bfloat16"),
    ("Tesla P100-PCIE-16GB", {}, "has no tensor cores", "autocast"),
    ("NVIDIA A100-SXM4-80GB", {}, "bfloat16", "GradScaler"),
    ("Unknown Accelerator", {}, "float16 with a GradScaler on Volta and Turing", "has no tensor cores"),
])
def test_precision_advice_fits_the_gpus_tensor_cores(tmp_path, name, gpu, says, never):
    first = _fp32_bound(tmp_path, name, **gpu)
    assert first.kind == "gpu-bound" and first.phase == "backward"
    assert says in first.text and never not in first.text, first.text


@pytest.mark.parametrize("cpus, says", [
    (None, "the trace does not say how many"),
    ({"count": 64, "usable": 12}, "up to 11: the process may use 12 CPUs"),
    ({"count": 2}, "may use 2 CPUs: one worker at most"),
])
def test_data_loader_advice_is_sized_by_the_cpus_the_trace_records(tmp_path, cpus, says):
    loop = Loop()
    for n in range(5):
        loop.step(n, (DATA_NEXT, 30_000), ("phaseprof::forward", 10_000, conv_kernels(20, 300)))
    top = {} if cpus is None else {CPUS_KEY: cpus}
    s = summary_of(write_trace(tmp_path / "w.1.pt.trace.json", loop.events, **top))
    data = finding(s, "data-loader")
    assert says in data.text and "4-8" not in data.text
    assert data.evidence.cpus == (None if cpus is None else cpus.get("usable", cpus["count"]))


def test_host_time_with_no_recorded_event_is_named_untraced_not_blamed_on_the_op_beside_it(tmp_path):
    # each step ends with 85 ms in which the process recorded nothing but a 0.08 ms aten::zeros
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 20_000, [], [("aten::mm", 10, 19_900)]),
                  ("phaseprof::backward", 10_000, [], [("aten::mm", 10, 9_900)]))
        assert loop.events[-1]["name"] == f"ProfilerStep#{n}"
        loop.events[-1]["dur"] += 85_000
        loop.events.append(op("aten::zeros", loop.t + 40_000, 80))
        loop.t += 85_000
    s = loop_summary(tmp_path, loop)
    first = s.findings[0]
    assert (first.kind, first.phase) == ("host-time", "other")
    assert first.evidence.untraced_ms == pytest.approx(85.0 - 0.08)
    assert first.text.index("84.92 ms of it (100%) is untraced") < first.text.index("aten::zeros (0.08 ms)")
    assert "its ops with the most self time" not in first.text
    # phases whose time is in their ops say nothing of untraced time
    forward = next(f for f in s.findings if f.phase == "forward")
    assert "untraced" not in forward.text and forward.evidence.untraced_ms is None


def test_untraced_time_counts_what_other_threads_of_the_process_record(tmp_path):
    # on CUDA builds the loop's thread waits in backward, recording nothing, while autograd's thread works
    loop = Loop()
    for n in range(5):
        start = loop.t
        loop.step(n, ("phaseprof::forward", 10_000, [], [("aten::mm", 10, 9_900)]), ("phaseprof::backward", 20_000))
        loop.events.append(op("autograd::engine::evaluate_function: MmBackward0", start + 10_000, 19_000,
                              tid=AUTOGRAD))
    s = loop_summary(tmp_path, loop)
    backward = next(f for f in s.findings if f.phase == "backward")
    assert "untraced" not in backward.text and "evaluate_function" in backward.text


gpu_case = test_gpu_measures.gpu_case  # the fixture: every GPU trace of tests/data and the ones built there


def test_on_every_gpu_case_the_outliers_slowest_step_and_findings_agree(gpu_case):
    _, workers = gpu_case
    for w in workers:
        _agree(w.worker, w.summary)


@pytest.mark.parametrize("count", [4, 5])
def test_a_straggler_is_named_from_five_steps_per_rank_not_fewer(tmp_path, count):
    workers = []
    for rank in (0, 1):
        loop = Loop()
        for n in range(count):  # rank 1 computes twice as long
            loop.step(n, ("phaseprof::forward", 10_000 * (1 + rank) + 50 * n), ("phaseprof::backward", 5_000))
        write_trace(tmp_path / f"rank{rank}.1.pt.trace.json", loop.events,
                    distributedInfo={"rank": rank, "world_size": 2})
        (run,) = discover(str(tmp_path))
        (f,) = [f for f in run.workers[f"rank{rank}"]]
        workers.append(Worker(f.worker, [analyze_file(f)]))
    answer = ranks("r", workers)
    if count < 5:
        assert answer.straggler is None and "too few steps" in answer.note
    else:
        assert answer.straggler is not None and answer.straggler.rank == 1


def test_two_kernels_of_one_template_are_never_named_alike(tmp_path):
    # kernels of one template differ only in their arguments: named without them, both read
    # "at::native::elementwise_kernel" (and the list kept one); each is named apart, by its arguments
    a = "void at::native::elementwise_kernel<128, 2, at::native::AddFunctor<float>>(int, float*)"
    b = "void at::native::elementwise_kernel<128, 4, at::native::MulFunctor<float>>(int, float*)"
    c = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 2_000, [(c, 500)] * 4),
                  ("phaseprof::backward", 3_000, [(a, 3_000), (b, 2_000)] * 5),
                  ("phaseprof::optimizer", "sync"))
    s = loop_summary(tmp_path, loop)
    bound = finding(s, "gpu-bound")
    assert bound.phase == "backward"
    first, second = bound.evidence.kernels[:2]
    assert first.startswith("at::native::elementwise_kernel<128, 2, at::native::AddFunct")
    assert second.startswith("at::native::elementwise_kernel<128, 4, at::native::MulFunct")
    assert first in bound.text and second in bound.text
    for f in s.findings:
        named = f.evidence.kernels or []
        assert len(set(named)) == len(named), f.text

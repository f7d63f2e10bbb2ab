"""The wording of advice the findings carry, sentence by sentence: what a user reads for each kind
of collective, each number of CPUs, each GPU generation and each kernel name."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis.advice import (
    BF16,
    FP16,
    NONE,
    Context,
    _collective_kind,
    _communication,
    _communication_advice,
    _cost_sentence,
    _data,
    _gpu_bound,
    _host_bound,
    _optimizer,
    _parts,
    _short,
    _top_ops,
    _workers,
    tensor_cores,
)
from phaseprof.plugin.analysis.cost import GPU, Costs, Figures, phase_costs
from phaseprof.plugin.answers import Evidence


@pytest.mark.parametrize("cpus, says", [
    (None, "about the CPUs the process may use, less one for the loop; the trace does not say how many: "
           "PhaseProfiler records them"),
    (1, "the process may use 1 CPU: one worker at most, so cheaper per-sample work (decode or resize once, ahead of "
        "training) matters more than workers"),
    (2, "the process may use 2 CPUs: one worker at most, so cheaper per-sample work (decode or resize once, ahead of "
        "training) matters more than workers"),
    (3, "up to 2: the process may use 3 CPUs, one stays with the loop"),
])
def test_data_loader_workers_are_sized_by_the_cpus(cpus, says):
    assert _workers(cpus) == says


@pytest.mark.parametrize("kind, phase, says", [
    ("all-reduce", "backward", "DDP overlaps the gradient all-reduce with backward bucket by bucket: a smaller "
     "bucket_cap_mb starts it sooner, and under gradient accumulation no_sync() on all but the last micro-batch "
     "skips it"),
    ("all-reduce", "optimizer", "an all-reduce in optimizer has no backward to hide behind: all-reduce fewer, larger "
     "tensors (or less often, e.g. metrics every N steps), and look for a rank the others wait for"),
    ("all-to-all", "forward", "an all-to-all exchanges sharded embeddings: balance the embedding tables' sharding "
     "across ranks (the sharding planner's placement), keep lookups even per rank, and pipeline the exchange with "
     "the dense compute (e.g. TorchRec's TrainPipelineSparseDist)"),
    ("all-gather", "forward", "an all-gather of sharded parameters (FSDP/ZeRO): prefetch it (FSDP's forward_prefetch, "
     "backward_prefetch) or shard in larger units so it overlaps the previous layer's compute"),
    ("reduce-scatter", "backward", "a reduce-scatter of sharded parameters (FSDP/ZeRO): prefetch it (FSDP's "
     "forward_prefetch, backward_prefetch) or shard in larger units so it overlaps the previous layer's compute"),
    ("broadcast", "data", "a broadcast waits for every rank: find the rank the others wait for (the Ranks view), "
     "e.g. rank 0 logging, checkpointing or evaluating before it"),
    ("barrier", "other", "a barrier waits for every rank: find the rank the others wait for (the Ranks view), "
     "e.g. rank 0 logging, checkpointing or evaluating before it"),
    ("send-recv", "forward", "point-to-point transfers (pipeline stages): more micro-batches keep the stages "
     "computing while they run"),
    ("collective", "forward", "overlap it with compute, or look for a rank the others wait for (the Ranks view)"),
])
def test_exposed_communication_advice_fits_the_collective(kind, phase, says):
    assert _communication_advice(kind, phase) == says


@pytest.mark.parametrize("name, kind", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "all-reduce"),
    ("nccl:all_reduce", "all-reduce"),
    ("c10d::alltoall_base_", "all-to-all"),
    ("ncclDevKernel_AllGather_RING_LL", "all-gather"),
    ("nccl:reduce_scatter", "reduce-scatter"),
    ("c10d::broadcast_", "broadcast"),
    ("c10d::barrier", "barrier"),
    ("ncclDevKernel_SendRecv", "send-recv"),
    ("record_param_comms", None),
])
def test_a_collective_is_named_by_its_op_or_kernel(name, kind):
    assert _collective_kind(name) == kind


@pytest.mark.parametrize("name, capability, cores", [
    ("NVIDIA GeForce GTX 1080 Ti", "6.1", NONE),
    ("NVIDIA GeForce GTX 1660", "7.5", NONE),  # Turing without tensor cores: the name decides first
    ("Tesla P100-PCIE-16GB", "", NONE),
    ("Tesla V100-SXM2-16GB", "", FP16),
    ("NVIDIA TITAN RTX", "", FP16),
    ("Tesla T4", "", FP16),
    ("NVIDIA A100-SXM4-40GB", "", BF16),
    ("NVIDIA H100 80GB HBM3", "", BF16),
    ("NVIDIA GeForce RTX 4090", "", BF16),
    ("Some GPU", "6.0", NONE),
    ("Some GPU", "7.0", FP16),
    ("Some GPU", "8.6", BF16),
    ("Some GPU", "", None),
])
def test_tensor_cores_by_capability_else_by_name(name, capability, cores):
    assert tensor_cores(name, capability) == cores


def test_a_kernels_name_in_a_sentence_has_no_templates_or_parameters_and_a_width():
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
    assert _short(name) == "at::native::vectorized_elementwise_kernel"
    assert _short("volta_sgemm_128x64_nn") == "volta_sgemm_128x64_nn"
    assert _short("k" * 61) == "k" * 59 + "…"
    assert _short("k" * 60) == "k" * 60
    assert _short("<lambda>") == "<lambda>"  # nothing outside the brackets: the name as it is


@pytest.mark.parametrize("gpus, says", [
    ([], "90% of its GPU time is fp32 matrix kernels without tensor cores (volta_sgemm_128x64_nn): mixed precision "
         "(torch.autocast: bfloat16, or TF32, on Ampere and later GPUs; float16 with a GradScaler on Volta and "
         "Turing) runs them on tensor cores"),
    (["Tesla V100-SXM2-16GB"], "90% of its GPU time is fp32 matrix kernels without tensor cores "
     "(volta_sgemm_128x64_nn): mixed precision (torch.autocast with float16, and a GradScaler) runs them on tensor "
     "cores on this Tesla V100-SXM2-16GB"),
])
def test_fp32_matrix_kernels_ask_for_the_precision_the_gpu_runs_on_tensor_cores(gpus, says):
    # (calls, µs) per step: the elementwise kernel runs more often, the matrix product longer: ranked by time
    kernels = {("backward", "volta_sgemm_128x64_nn"): np.array([10.0, 900.0]),
               ("backward", "void at::native::vectorized_elementwise_kernel<4>(int)"): np.array([50.0, 100.0])}
    ctx = Context(ops={}, kernels=kernels, loader=None, gpu_names=gpus)
    evidence = Evidence()
    assert _gpu_bound(None, ctx, "backward", evidence) == ("gpu-bound", says)
    assert evidence.fp32_matrix_share == 0.9
    assert evidence.kernels == ["volta_sgemm_128x64_nn", "at::native::vectorized_elementwise_kernel"]


PHASES = ["data", "forward", "backward", "optimizer"]


def typical_step(cpu, gpu=(0, 0, 0, 0), launches=(0, 0, 0, 0), idle=(0, 0, 0, 0), comm=(0, 0, 0, 0),
                 exposed=(0, 0, 0, 0), has_gpu=True, queue=(0, 0, 0, 0)) -> Figures:
    """A typical step of four phases (µs); the figures the rules under test do not read are zeros."""
    zeros = np.zeros(4)
    cpu = np.array(cpu, dtype=float)
    return Figures(phases=PHASES, steps=[1, 2, 3], wall_us=float(cpu.sum()), host_us=cpu,
                   gpu_us=np.array(gpu, dtype=float), idle_us=np.array(idle, dtype=float), wait_us=zeros,
                   launches=np.array(launches, dtype=float), busy_us=zeros, compute_us=zeros,
                   comm_us=np.array(comm, dtype=float), exposed_comm_us=np.array(exposed, dtype=float),
                   step_idle_us=0.0, has_gpu=has_gpu, queue=np.array(queue, dtype=float))


SINGLE_PROCESS = ("the loop's own thread loads every batch (DataLoader num_workers=0): set num_workers (up to 3: the "
                  "process may use 4 CPUs, one stays with the loop) so batches are prepared in worker processes while "
                  "the step runs, with persistent_workers=True")


def test_untraced_data_loading_is_named_as_the_datasets_python_from_a_tenth_of_the_phase():
    f = typical_step(cpu=[10_000, 1000, 1000, 1000])
    ctx = Context(ops={}, kernels={}, loader="single-process", gpu_names=[], cpus=4, untraced_us={"data": 3000.0})
    evidence = Evidence()
    assert _data(f, ctx, evidence) == ("data-loader", SINGLE_PROCESS + "; 3.00 ms of it (30%) records no op: the "
                                       "dataset's Python (decoding, transforms), which worker processes run beside "
                                       "the step")
    assert (evidence.untraced_ms, evidence.loader, evidence.cpus) == (3.0, "single-process", 4)

    # under a tenth of the phase: not worth a sentence
    ctx.untraced_us = {"data": 999.0}
    evidence = Evidence()
    assert _data(f, ctx, evidence) == ("data-loader", SINGLE_PROCESS)
    assert evidence.untraced_ms is None


def test_pageable_batch_copies_in_data_and_forward_ask_for_pinned_memory():
    f = typical_step(cpu=[10_000, 1000, 1000, 1000])
    kernels = {("data", "Memcpy HtoD (Pageable -> Device)"): np.array([2.0, 700.0]),
               ("forward", "Memcpy HtoD (Pageable -> Device)"): np.array([1.0, 500.0]),
               ("forward", "Memcpy HtoD (Pinned -> Device)"): np.array([1.0, 900.0]),
               # a copy the optimizer makes is not the batch
               ("optimizer", "Memcpy HtoD (Pageable -> Device)"): np.array([1.0, 4000.0])}
    ctx = Context(ops={}, kernels=kernels, loader=None, gpu_names=[], cpus=None)
    evidence = Evidence()
    assert _data(f, ctx, evidence) == (
        "data-loader", "load batches in DataLoader worker processes (num_workers > 0: about the CPUs the process may "
        "use, less one for the loop; the trace does not say how many: PhaseProfiler records them) and prefetch them, "
        "so the loop does not prepare data itself; the batch's host-to-device copies come from pageable memory "
        "(1.20 ms per step): pin_memory=True on the DataLoader and .to(device, non_blocking=True) let them overlap")
    assert (evidence.pageable_copy_ms, evidence.loader, evidence.cpus) == (1.2, None, None)


def test_an_optimizer_launching_many_tiny_kernels_is_told_to_use_foreach():
    ops = {("optimizer", "aten::add_"): np.array([200.0, 600.0, 600.0, 0.0, 0.0])}
    ctx = Context(ops=ops, kernels={}, loader=None, gpu_names=[])
    evidence = Evidence()
    f = typical_step(cpu=[0, 0, 0, 2000], gpu=[0, 0, 0, 1990], launches=[0, 0, 0, 200])
    assert _optimizer(f, ctx, evidence) == (
        "optimizer", "it launches 200 kernels per step averaging 9.9 µs, one per parameter and operation: a foreach "
        "or fused optimizer (foreach=True, or fused=True where the optimizer offers it) updates all parameters in a "
        "few kernels")
    assert (evidence.launches, evidence.mean_kernel_us, evidence.op_calls) == (200.0, 9.95, 200.0)

    # kernels of 20 µs on average are not tiny: the optimizer's ops are named instead
    f = typical_step(cpu=[0, 0, 0, 2000], gpu=[0, 0, 0, 4000], launches=[0, 0, 0, 200])
    evidence = Evidence()
    assert _optimizer(f, ctx, evidence) == ("optimizer", "its ops with the most self time: aten::add_ (0.60 ms)")
    assert evidence.mean_kernel_us is None


def test_a_host_bound_phase_whose_gpu_idles_on_short_kernels_is_launch_bound():
    f = typical_step(cpu=[0, 1000, 0, 0], gpu=[0, 1234, 0, 0], launches=[0, 100, 0, 0],
                     idle=[0, 500, 0, 0], queue=[0, 0.5, 0, 0])
    evidence = Evidence()
    assert _host_bound(f, Context(ops={}, kernels={}, loader=None, gpu_names=[]), "forward", evidence) == (
        "launch-bound", "the GPU idles 50% of it while the host launches 100 kernels averaging "
        "12.3 µs, 0.5 waiting to start on average: launch-bound; CUDA graphs "
        "(torch.compile(mode='reduce-overhead')), torch.compile's fusion or a larger batch give "
        "the GPU more work per launch")
    assert (evidence.launches, evidence.mean_kernel_us, evidence.queue) == (100.0, 12.34, 0.5)


def test_short_kernels_behind_a_long_launch_queue_are_not_launch_bound():
    # the same phase, but 40 launched kernels wait to start on average: the GPU has work queued and
    # idles for another reason (a stream waiting on another), so faster launches would not help
    f = typical_step(cpu=[0, 1000, 0, 0], gpu=[0, 1234, 0, 0], launches=[0, 100, 0, 0],
                     idle=[0, 500, 0, 0], queue=[0, 40.0, 0, 0])
    evidence = Evidence()
    ctx = Context(ops={}, kernels={}, loader=None, gpu_names=[])
    kind, text = _host_bound(f, ctx, "forward", evidence)
    assert kind == "host-time" and "CUDA graphs" not in text and evidence.queue is None


def test_untraced_time_more_than_any_op_is_named_before_the_ops():
    ops = {("forward", "aten::mm"): np.array([1.0, 1000.0, 1000.0, 0.0, 0.0]),
           ("backward", "aten::mm"): np.array([1.0, 5000.0, 5000.0, 0.0, 0.0])}
    ctx = Context(ops=ops, kernels={}, loader=None, gpu_names=[], untraced_us={"forward": 3000.0})
    evidence = Evidence()
    assert _top_ops(typical_step(cpu=[0, 10_000, 0, 0]), ctx, "forward", evidence) == (
        "3.00 ms of it (30%) is untraced: the process recorded no op, runtime call or range then (Python or framework "
        "code between the recorded ops: a dataset's __getitem__, logging, file I/O; or events a sampled trace "
        "dropped); record_function ranges or torch.profiler's with_stack=True name it; the ops beside it with the "
        "most self time: aten::mm (1.00 ms)")
    assert evidence.untraced_ms == 3.0


def test_a_phase_waiting_on_the_gpu_names_each_sync_call_and_the_op_behind_it():
    f = typical_step(cpu=[1000, 8000, 1000, 0], idle=[0, 3000, 0, 0])
    rows = {("forward", "cudaStreamSynchronize"): np.array([2.0, 1500.0, 1500.0, 0.0, 0.0]),
            ("forward", "cudaMemcpyAsync"): np.array([1.0, 500.0, 500.0, 0.0, 0.0]),  # no sync
            ("forward", "cudaMemcpy"): np.array([1.0, 500.0, 500.0, 0.0, 0.0]),
            ("forward", "aten::item"): np.array([1.0, 10.0, 2010.0, 0.0, 0.0])}
    ctx = Context(ops=rows, kernels={}, loader=None, gpu_names=[])
    (sync,) = _parts(f, phase_costs(f), ctx, "forward")
    assert (sync.kind, sync.phase, sync.saving_us) == ("sync", "forward", 2000.0)
    assert sync.text == ("forward waits 2.00 ms per step for the GPU in cudaStreamSynchronize (2 per step), "
                         "cudaMemcpy (1 per step), from aten::item: each sync drains the GPU's queue and leaves it "
                         "idle while the host catches up; keep values on the GPU (no .item(), .cpu() or printing of "
                         "tensors inside the step)")
    assert sync.evidence.sync_calls == ["cudaStreamSynchronize x2", "cudaMemcpy x1"]
    assert (sync.evidence.ops, sync.evidence.wait_ms, sync.evidence.gpu_idle_ms) == (["aten::item"], 2.0, 3.0)


def test_exposed_communication_is_named_by_its_collective_ops_not_the_profilers_record_of_them():
    f = typical_step(cpu=[1000, 3000, 5000, 1000], comm=[0, 0, 4000, 0], exposed=[0, 0, 2000, 0])
    ops = {("backward", "record_param_comms"): np.array([1.0, 5.0, 5.0, 0.0, 4000.0]),  # the profiler's wrapper
           ("backward", "nccl:all_reduce"): np.array([1.0, 5.0, 5.0, 0.0, 3900.0]),
           ("backward", "aten::mm"): np.array([1.0, 5.0, 5.0, 0.0, 5000.0])}
    kernels = {("backward", "ncclKernel_AllReduce_RING_LL_Sum_float"): np.array([1.0, 4000.0])}
    ctx = Context(ops=ops, kernels=kernels, loader=None, gpu_names=[])
    found = _communication(f, phase_costs(f), ctx, "backward")
    assert (found.kind, found.phase, found.saving_us) == ("exposed-communication", "backward", None)
    assert found.text == (
        "2.00 ms per step of communication launched in backward (nccl:all_reduce) runs with no compute on any "
        "stream: 50% of its 4.00 ms is overlapped; the host's work (10.00 ms per step) binds the step, so hiding it "
        "pays once that is shorter; DDP overlaps the gradient all-reduce with backward bucket by bucket: a smaller "
        "bucket_cap_mb starts it sooner, and under gradient accumulation no_sync() on all but the last micro-batch "
        "skips it")
    assert (found.evidence.ops, found.evidence.collective, found.evidence.overlap) == (["nccl:all_reduce"],
                                                                                       "all-reduce", 0.5)


def test_the_cost_sentence_of_a_gpu_bound_step_says_why_the_gpu_measures_it_on_its_first_phase():
    f = typical_step(cpu=[1000, 3000, 5000, 1000], idle=[0, 0, 0, 0])
    c = Costs(measure=GPU, wall_us=10_000, total_us=8000, host_us=6000, gpu_busy_us=8000, compute_us=8000,
              cost_us={"data": 0.0, "forward": 2000.0, "backward": 6000.0, "optimizer": 0.0},
              order=["backward", "forward", "data", "optimizer"])
    assert _cost_sentence(f, c, "backward") == (
        "backward costs the most GPU compute time: 6.00 ms per step (75% of the step's 8.00 ms of GPU compute); the "
        "step is GPU-bound (the GPU computes 8.00 ms per step, the host's own work takes 6.00 ms), so the compute a "
        "phase launches is what it adds")
    assert _cost_sentence(f, c, "forward") == "forward costs 2.00 ms of GPU compute time per step (25% of the step's)"


def test_untraced_data_loading_is_not_blamed_on_worker_processes_or_a_phase_without_host_time():
    # workers load beside the step: the loop's untraced time is not the dataset's Python
    f = typical_step(cpu=[10_000, 1000, 1000, 1000])
    ctx = Context(ops={}, kernels={}, loader="worker processes", gpu_names=[], cpus=4, untraced_us={"data": 3000.0})
    evidence = Evidence()
    assert _data(f, ctx, evidence) == (
        "data-loader", "the loop waits for DataLoader workers: raise num_workers (up to 3: the process may use 4 CPUs, "
        "one stays with the loop) or prefetch_factor, or make the per-sample transforms cheaper")
    assert evidence.untraced_ms is None
    # no host time in data (its cost is GPU time): no share of it to name
    ctx = Context(ops={}, kernels={}, loader="single-process", gpu_names=[], cpus=4, untraced_us={})
    assert _data(typical_step(cpu=[0, 1000, 1000, 1000]), ctx, Evidence()) == ("data-loader", SINGLE_PROCESS)


def test_fp32_convolutions_are_also_told_of_channels_last():
    kernels = {("forward", "cudnn::detail::implicit_convolve_sgemm<float>(int)"): np.array([10.0, 900.0])}
    ctx = Context(ops={}, kernels=kernels, loader=None, gpu_names=["NVIDIA A100-SXM4-40GB"])
    assert _gpu_bound(None, ctx, "forward", Evidence()) == (
        "gpu-bound", "100% of its GPU time is fp32 matrix kernels without tensor cores "
        "(cudnn::detail::implicit_convolve_sgemm): mixed precision (torch.autocast with bfloat16) or TF32 "
        "(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32) runs them on tensor cores on "
        "this NVIDIA A100-SXM4-40GB; with convolutions, channels_last memory format helps too")


def test_a_host_bound_phase_whose_gpu_idles_little_is_not_launch_bound():
    f = typical_step(cpu=[0, 1000, 0, 0], gpu=[0, 1234, 0, 0], launches=[0, 100, 0, 0], idle=[0, 399, 0, 0])
    ops = {("forward", "aten::mm"): np.array([1.0, 700.0, 700.0, 0.0, 0.0])}
    evidence = Evidence()
    assert _host_bound(f, Context(ops=ops, kernels={}, loader=None, gpu_names=[]), "forward", evidence) == (
        "host-time", "its ops with the most self time: aten::mm (0.70 ms)")
    assert evidence.mean_kernel_us is None


def test_pageable_copies_outside_the_batchs_phases_ask_for_pinned_source_tensors():
    f = typical_step(cpu=[1000, 3000, 3000, 3000])
    kernels = {("optimizer", "Memcpy HtoD (Pageable -> Device)"): np.array([1.0, 800.0]),
               ("optimizer", "Memcpy HtoD (Pinned -> Device)"): np.array([1.0, 200.0])}
    ops = {("optimizer", "cudaMemcpyAsync"): np.array([2.0, 1000.0, 1000.0, 0.0, 0.0]),
           ("optimizer", "aten::copy_"): np.array([2.0, 50.0, 1050.0, 0.0, 0.0])}
    ctx = Context(ops=ops, kernels=kernels, loader=None, gpu_names=[])
    (copies,) = _parts(f, phase_costs(f), ctx, "optimizer")
    assert (copies.kind, copies.phase, copies.saving_us) == ("pageable-copies", "optimizer", 800.0)
    assert copies.text == (
        "optimizer pays 0.80 ms of host time per step copying to the GPU from pageable memory (0.80 ms of Memcpy HtoD "
        "(Pageable -> Device)): the host waits while each copy is staged and the copy overlaps nothing; keep the "
        "source tensors in pinned memory (tensor.pin_memory(), once) and copy with .to(device, non_blocking=True), or "
        "create them on the GPU let the copies run beside the step")
    assert (copies.evidence.pageable_copy_ms, copies.evidence.copy_host_ms, copies.evidence.ops) == (
        0.8, 0.8, ["cudaMemcpyAsync"])


def test_many_allocator_calls_in_a_phase_are_a_finding_of_their_own():
    f = typical_step(cpu=[1000, 3000, 3000, 3000])
    ops = {("forward", "cudaMalloc"): np.array([8.0, 300.0, 300.0, 0.0, 0.0]),
           ("forward", "cudaFree"): np.array([4.0, 200.0, 200.0, 0.0, 0.0])}
    (allocs,) = _parts(f, phase_costs(f), Context(ops=ops, kernels={}, loader=None, gpu_names=[]), "forward")
    assert (allocs.kind, allocs.phase, allocs.saving_us) == ("allocator", "forward", 500.0)
    assert allocs.text == (
        "forward calls cudaMalloc/cudaFree 12 times per step (0.50 ms): the caching allocator keeps returning and "
        "re-requesting memory; avoid torch.cuda.empty_cache() in the loop, keep tensor shapes steady, or set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert (allocs.evidence.alloc_calls, allocs.evidence.alloc_ms) == (12.0, 0.5)

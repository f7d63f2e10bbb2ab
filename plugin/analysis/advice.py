"""Advice that fits the cause: what a performance engineer would say about each costly phase, from the
evidence in the trace, with the time per step at stake.

Every phase that adds at least ``MIN_SHARE`` of the step gets one finding on its cost, in the measure
that binds the step (see `cost`), whose kind names the cause the evidence points to; its saving is
that cost (what the step would win were the cause removed). Findings about a part of a phase (a sync
point, allocator calls, collectives no compute overlaps) estimate their own saving, never more than
their phase costs. No finding for a phase that costs nothing, no advice without evidence.
The kinds, their evidence and their savings are listed in docs/findings.md.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from phaseprof.contract import DATA, FORWARD, OPTIMIZER

from ..answers import Evidence
from .blocking import Blocked, inputs_of
from .cost import GPU, HOST, Costs, Figures, saving_us
from .kernels import MATRIX_KERNEL, uses_tensor_cores
from .span import COLLECTIVE_KERNEL

#: A phase adding less than this share of the step gets no finding.
MIN_SHARE = 0.05
#: A part of a phase worth a finding: at least this share of the step at stake.
PART_SHARE = 0.02
#: Optimizer launching at least this many device events per step, averaging under TINY_KERNEL_US.
MANY_LAUNCHES = 100
TINY_KERNEL_US = 20.0
#: On the host, an optimizer running at least this many ops per step (nested ones counted), averaging
#: under TINY_KERNEL_US of host time each, runs a few per parameter.
MANY_OPS = 100
#: A host-bound phase whose GPU idles this share of it, launching kernels this short, is launch-bound.
LAUNCH_IDLE_SHARE = 0.4
SHORT_KERNEL_US = 50.0
#: ... and only while its launch queue is short: on average fewer than this many launched kernels
#: (all streams) wait to start. A longer queue means the GPU has work and idles for another reason.
SHORT_QUEUE = 4.0
#: A costly phase whose host is held this share of it by calls waiting for the device is
#: host-blocked.
BLOCKED_SHARE = 0.25
#: GPU-bound phases whose matrix kernels are fp32 without tensor cores at least this share of their
#: device time are worth mixed precision.
FP32_MATRIX_SHARE = 0.3
#: Untraced time this share of a phase, and more than any of its ops, is named before them.
UNTRACED_SHARE = 0.1
#: Allocator calls per step worth a look.
MANY_ALLOCS = 10

class Advice(msgspec.Struct):
    """One finding before it is worded into an answer: times in µs."""

    kind: str
    phase: str | None
    saving_us: float | None  # None: no saving the figures back (a finding listed with the notes)
    evidence: Evidence
    text: str


#: Per (phase, op name): calls, self host µs, host µs, self GPU µs, GPU µs per step.
OpMeans = dict[tuple[str, str], np.ndarray]
#: Per (phase, kernel name): calls and device µs per step.
KernelMeans = dict[tuple[str, str], np.ndarray]

_SYNC_CALL = re.compile(r"^(cuda|hip)((Stream|Device|Event)Synchronize|Memcpy(2D)?)$")
_SYNCING_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal",
                "aten::masked_select", "aten::unique", "aten::_unique2", "aten::allclose")
_ALLOC_CALL = re.compile(r"^(cuda|hip)(Malloc|Free)(Async)?$")
#: Host-to-device copies from pageable (not pinned) memory, and the runtime calls that make copies.
_PAGEABLE_HTOD = re.compile(r"HtoD.*Pageable", re.I)
_COPY_CALL = re.compile(r"^(cuda|hip)Memcpy(2D|3D)?(Async)?(WithStream)?$")
_MEMCPY = re.compile(r"^Memcpy")
#: Device work by name that is not compute: copies and sets (memory), collectives (communication).
_NOT_COMPUTE = re.compile(r"^(Memcpy|Memset)|nccl|rccl|gloo", re.I)
#: Phases on the batch's way to the GPU: pageable copies launched there are the DataLoader's batch.
BATCH_PHASES = (DATA, FORWARD)
_COLLECTIVE_OP = re.compile(r"^(nccl|gloo|mpi|ucc|c10d)(:|::)|^record_param_comms$")
_NORM_KERNEL = re.compile(r"bn_fw|bn_bw|batch_norm|layer_norm", re.I)
_ELEMENTWISE = re.compile(r"elementwise|reduce_kernel|vectorized|unrolled", re.I)
_FOREACH = re.compile(r"_foreach_|multi_tensor_apply|fused", re.I)
#: Tensor cores by compute capability (NVIDIA's table): none before 7.0 (Pascal and older), float16
#: only on 7.x (Volta, Turing), bfloat16, float16 and TF32 from 8.0 (Ampere). Turing's GeForce GTX 16
#: series (7.5) has none. Where the trace gives no capability, the GPU's name decides:
_NO_TENSOR_CORES = re.compile(r"\bGTX\b|\bP(100|40|6|4)\b|\b[KM]\d0\b|\bTitan Xp?\b|\bQuadro [PMK]\d|\bGT \d", re.I)
_FP16_TENSOR_CORES = re.compile(r"V100|\bTitan V\b|\bTITAN RTX\b|\bT4\b|Quadro RTX|\bRTX 20\d0|\bQuadro T\d|"
                                r"\bT(400|600|1000|1200)\b", re.I)
_BF16_TENSOR_CORES = re.compile(r"\b[ABHL]\d{1,3}[SXG]?\b|\bRTX [345]0\d0|\bRTX A\d|\bRTX \d000 Ada|"
                                r"\bG[HB]\d00\b|\bB\d00\b|Orin|Thor", re.I)
BF16, FP16, NONE = "bfloat16", "float16", "none"


class Context(msgspec.Struct):
    """What the rules read besides the figures: the ops and kernels of each phase, per step."""

    ops: OpMeans
    kernels: KernelMeans
    loader: str | None  # "single-process", "worker processes" or None (no DataLoader range)
    gpu_names: list[str]
    gpu_capabilities: list[str] = []  # "major.minor" per GPU name, "" where the trace gives none
    cpus: int | None = None  # CPUs the training process could use, where the trace records them
    untraced_us: dict[str, float] = {}  # per phase: host µs per step with no recorded event (`untraced`)
    blocking: list[Blocked] = []  # host calls that waited for the device, per step (`blocking`)


def advise(f: Figures, c: Costs, ctx: Context) -> list[Advice]:
    """The findings on the typical step ``f`` with costs ``c``, largest saving first."""
    out: list[Advice] = []
    for rank, phase in enumerate(c.order):
        cost = c.cost_us[phase]
        if cost <= 0 or (rank > 0 and c.share(phase) < MIN_SHARE):
            continue
        out.append(_phase_finding(f, c, ctx, phase))
    for phase in f.phases:
        out += _parts(f, c, ctx, phase)
    # Stable: on a tie a phase's own finding stays before its parts.
    out.sort(key=lambda a: -(a.saving_us or 0.0))
    return out


# --- one finding per costly phase ---------------------------------------------------------------------


def _phase_finding(f: Figures, c: Costs, ctx: Context, phase: str) -> Advice:
    j = f.phases.index(phase)
    cost = c.cost_us[phase]
    evidence = Evidence(measure=c.measure, cost_ms=_ms(cost), wall_ms=_ms(f.wall_us), host_ms=_ms(f.host_us[j]))
    if f.has_gpu:
        evidence.gpu_ms = _ms(f.gpu_us[j])
        evidence.gpu_idle_ms = _ms(f.idle_us[j])
        evidence.gpu_compute_ms = _ms(f.compute_us[j])
        if phase == c.order[0]:  # what the verdict rests on: the step's GPU time beside the host's
            evidence.gpu_busy_ms = _ms(c.gpu_busy_us)
            evidence.host_critical_ms = _ms(c.host_us)
    head = _cost_sentence(f, c, phase)
    blocked = _blocked(f, c, ctx, phase, evidence)
    if blocked is not None:
        kind, advice = blocked
    elif phase == DATA:
        kind, advice = _data(f, ctx, evidence)
    elif phase == OPTIMIZER:
        kind, advice = _optimizer(f, ctx, evidence)
    elif c.measure == GPU:
        kind, advice = _gpu_bound(f, ctx, phase, evidence)
    else:
        kind, advice = _host_bound(f, ctx, phase, evidence)
    return Advice(kind=kind, phase=phase, saving_us=cost, evidence=evidence, text=f"{head}; {advice}")


def _cost_sentence(f: Figures, c: Costs, phase: str) -> str:
    """What the phase costs, naming the measure (the first phase also why that measure)."""
    j = f.phases.index(phase)
    cost, wall, share = _ms(c.cost_us[phase]), _ms(f.wall_us), c.share(phase)
    first = phase == c.order[0]
    if c.measure == GPU:
        # shares of the step's GPU compute time; host and GPU figures are set side by side, never divided
        if not first:
            return f"{phase} costs {cost:.2f} ms of GPU compute time per step ({share:.0%} of the step's)"
        return (f"{phase} costs the most GPU compute time: {cost:.2f} ms per step ({share:.0%} of the step's "
                f"{_ms(c.total_us):.2f} ms of GPU compute); the step is GPU-bound (the GPU computes "
                f"{_ms(c.compute_us):.2f} ms per step, the host's own work takes {_ms(c.host_us):.2f} ms), so the "
                "compute a phase launches is what it adds")
    text = (f"{phase} costs the most host time: {cost:.2f} ms of the {wall:.2f} ms step ({share:.0%}), on the "
            "critical path" if first else f"{phase} costs {cost:.2f} ms of host time per step ({share:.0%})")
    if f.has_gpu and not np.isnan(f.idle_us[j]) and f.host_us[j] > 0:
        text += f"; the GPU idles {_ms(f.idle_us[j]):.2f} ms of it"
    return text


def _data(f: Figures, ctx: Context, evidence: Evidence) -> tuple[str, str]:
    pageable = sum(_kernel_us(ctx, p, _PAGEABLE_HTOD) for p in BATCH_PHASES)
    workers = _workers(ctx.cpus)
    advice = {
        "single-process": f"the loop's own thread loads every batch (DataLoader num_workers=0): set num_workers "
                          f"({workers}) so batches are prepared in worker processes while the step runs, with "
                          "persistent_workers=True",
        "worker processes": f"the loop waits for DataLoader workers: raise num_workers ({workers}) or "
                            "prefetch_factor, or make the per-sample transforms cheaper",
    }.get(ctx.loader or "", f"load batches in DataLoader worker processes (num_workers > 0: {workers}) and prefetch "
                             "them, so the loop does not prepare data itself")
    if ctx.loader:
        evidence.loader = ctx.loader
    evidence.cpus = ctx.cpus
    host, untraced = float(f.host_us[f.phases.index(DATA)]), ctx.untraced_us.get(DATA, 0.0)
    if ctx.loader != "worker processes" and host > 0 and untraced >= UNTRACED_SHARE * host:
        evidence.untraced_ms = _ms(untraced)
        advice += (f"; {_ms(untraced):.2f} ms of it ({untraced / host:.0%}) records no op: the dataset's Python "
                   "(decoding, transforms), which worker processes run beside the step")
    if pageable > 0:
        evidence.pageable_copy_ms = _ms(pageable)
        advice += (f"; the batch's host-to-device copies come from pageable memory ({_ms(pageable):.2f} ms per step): "
                   "pin_memory=True on the DataLoader and .to(device, non_blocking=True) let them overlap")
    return "data-loader", advice


def _workers(cpus: int | None) -> str:
    """How many DataLoader workers the machine has room for: one CPU stays with the loop."""
    if cpus is None:
        return ("about the CPUs the process may use, less one for the loop; the trace does not say how many: "
                "PhaseProfiler records them")
    if cpus <= 2:
        return (f"the process may use {cpus} CPU{'s' if cpus > 1 else ''}: one worker at most, so cheaper "
                "per-sample work (decode or resize once, ahead of training) matters more than workers")
    return f"up to {cpus - 1}: the process may use {cpus} CPUs, one stays with the loop"


def _optimizer(f: Figures, ctx: Context, evidence: Evidence) -> tuple[str, str]:
    j = f.phases.index(OPTIMIZER)
    launches = float(f.launches[j])
    gpu = float(f.gpu_us[j])
    fused = any(_FOREACH.search(name) for (p, name) in list(ctx.ops) + list(ctx.kernels) if p == OPTIMIZER)
    ops = sum(float(v[0]) for (p, _), v in ctx.ops.items() if p == OPTIMIZER)
    if f.has_gpu:
        evidence.launches = round(launches, 1)
    evidence.op_calls = round(ops, 1)
    if fused:
        evidence.foreach = True
        batched = "it already updates parameters in batches (foreach/fused kernels); "
        return "optimizer", batched + _top_ops(f, ctx, OPTIMIZER, evidence)
    if f.has_gpu and launches >= MANY_LAUNCHES and gpu / launches < TINY_KERNEL_US:
        evidence.mean_kernel_us = round(gpu / launches, 2)
        return "optimizer", (f"it launches {launches:.0f} kernels per step averaging {gpu / launches:.1f} µs, one per "
                             "parameter and operation: a foreach or fused optimizer (foreach=True, or fused=True "
                             "where the optimizer offers it) updates all parameters in a few kernels")
    if not f.has_gpu and ops >= MANY_OPS and f.host_us[j] / ops < TINY_KERNEL_US:
        evidence.mean_op_us = round(float(f.host_us[j]) / ops, 2)
        return "optimizer", (f"it runs {ops:.0f} ops per step averaging {f.host_us[j] / ops:.1f} µs, a few per "
                             "parameter: foreach=True updates all parameters in a few ops")
    return "optimizer", _top_ops(f, ctx, OPTIMIZER, evidence)


def _gpu_bound(f: Figures, ctx: Context, phase: str, evidence: Evidence) -> tuple[str, str]:
    # the phase's compute: never a collective or a copy (the cost of a GPU-bound phase is its
    # compute)
    kernels = sorted(((name, v) for (p, name), v in ctx.kernels.items()
                      if p == phase and is_compute(name)), key=lambda kv: -kv[1][1])
    total = sum(float(v[1]) for _, v in kernels) or 1.0
    matrix = [(n, v) for n, v in kernels if MATRIX_KERNEL.search(n) and not _NORM_KERNEL.search(n)]
    fp32 = [(n, v) for n, v in matrix if not uses_tensor_cores(n)]
    fp32_us = sum(float(v[1]) for _, v in fp32)
    elementwise_us = sum(float(v[1]) for n, v in kernels if _ELEMENTWISE.search(n))
    evidence.kernels = _shorts([n for n, _ in kernels[:3]])
    evidence.fp32_matrix_share = round(fp32_us / total, 4)
    top = ", ".join(evidence.kernels)
    if fp32_us / total >= FP32_MATRIX_SHARE:
        names = ", ".join(_shorts([n for n, _ in fp32[:2]]))
        head = f"{fp32_us / total:.0%} of its GPU time is fp32 matrix kernels without tensor cores ({names})"
        cores = tensor_cores(ctx.gpu_names[0], (ctx.gpu_capabilities or [""])[0]) if ctx.gpu_names else None
        gpu = f"this {ctx.gpu_names[0]}" if ctx.gpu_names else "this GPU"
        if cores == NONE:
            return "gpu-bound", (f"{head}; {gpu} has no tensor cores, so lower precision would not move them onto "
                                 "any: fewer or smaller matrix products are what shorten them")
        precision = {
            FP16: "mixed precision (torch.autocast with float16, and a GradScaler)",
            BF16: "mixed precision (torch.autocast with bfloat16) or TF32 (torch.backends.cuda.matmul.allow_tf32 "
                  "and torch.backends.cudnn.allow_tf32)",
        }.get(cores, "mixed precision (torch.autocast: bfloat16, or TF32, on Ampere and later GPUs; float16 with a "
                     "GradScaler on Volta and Turing)")
        convs = any(re.search(r"conv|dgrad|wgrad|winograd|cudnn", n, re.I) for n, _ in fp32)
        return "gpu-bound", (
            f"{head}: {precision} runs them on tensor cores{' on ' + gpu if ctx.gpu_names else ''}"
            + ("; with convolutions, channels_last memory format helps too" if convs else ""))
    if elementwise_us / total >= FP32_MATRIX_SHARE:
        return "gpu-bound", (f"{elementwise_us / total:.0%} of its GPU time is elementwise kernels "
                             f"({top}): torch.compile fuses them into fewer passes over memory")
    return "gpu-bound", f"its GPU time goes to {top}"


def is_compute(kernel: str) -> bool:
    """Whether device work of this name is compute: no copy or set, no collective's kernel."""
    return not _NOT_COMPUTE.search(kernel)


def tensor_cores(name: str, capability: str) -> str | None:
    """The precisions a GPU's tensor cores run: `BF16` (bfloat16, float16, TF32), `FP16` (float16
    only), `NONE`, or None when neither its compute capability nor its name tells."""
    if _NO_TENSOR_CORES.search(name):
        return NONE
    if capability:
        major = int(capability.split(".")[0])
        return NONE if major < 7 else FP16 if major == 7 else BF16
    if _FP16_TENSOR_CORES.search(name):
        return FP16
    if _BF16_TENSOR_CORES.search(name):
        return BF16
    return None


def _host_bound(f: Figures, ctx: Context, phase: str, evidence: Evidence) -> tuple[str, str]:
    j = f.phases.index(phase)
    launches, gpu, cpu = float(f.launches[j]), float(f.gpu_us[j]), float(f.host_us[j])
    idle = float(f.idle_us[j]) if f.has_gpu else np.nan
    queue = float(f.queue[j]) if len(f.queue) else 0.0
    if f.has_gpu and cpu > 0 and launches > 0 and idle / cpu >= LAUNCH_IDLE_SHARE \
            and gpu / launches < SHORT_KERNEL_US and queue < SHORT_QUEUE:
        evidence.launches = round(launches, 1)
        evidence.mean_kernel_us = round(gpu / launches, 2)
        evidence.queue = round(queue, 2)
        return "launch-bound", (
            f"the GPU idles {idle / cpu:.0%} of it while the host launches {launches:.0f} kernels "
            f"averaging {gpu / launches:.1f} µs, {queue:.1f} waiting to start on average: "
            "launch-bound; CUDA graphs (torch.compile(mode='reduce-overhead')), torch.compile's "
            "fusion or a larger batch give the GPU more work per launch")
    return "host-time", _top_ops(f, ctx, phase, evidence)


def _blocked(f: Figures, c: Costs, ctx: Context, phase: str,
             evidence: Evidence) -> tuple[str, str] | None:
    """A phase costing host time whose host is held, for at least ``BLOCKED_SHARE`` of it, by calls
    waiting for the device (`blocking`): the host waits, so launching faster would win nothing back.
    Names the call holding it longest, the op and line that made it and the queue it waited behind.
    """
    j = f.phases.index(phase)
    host = float(f.host_us[j])
    calls = [b for b in ctx.blocking if b.phase == phase]
    blocked = sum(b.blocked_us for b in calls)
    if c.measure != HOST or phase == DATA or not f.has_gpu or host <= 0 \
            or blocked < BLOCKED_SHARE * host:
        return None
    top = calls[0]
    maker = top.op or top.call
    inputs = inputs_of(top.shapes) if top.op else ""
    shapes = f" (input {inputs})" if inputs else ""
    what = f"{top.call}, a {top.copy} copy," if top.copy else top.call
    evidence.blocked_ms = _ms(blocked)
    evidence.blocked_max_ms = _ms(top.longest_us)
    evidence.wait_ms = _ms(top.blocked_us)
    evidence.inputs = inputs or None
    evidence.sync_calls = [f"{b.call} x{b.calls:g}" for b in calls[:3]]
    evidence.ops = list(dict.fromkeys(b.op or b.call for b in calls))[:3]
    evidence.copy = top.copy
    evidence.queued = top.queued
    evidence.queue_stream = top.queue_stream
    evidence.frame = top.frame
    evidence.host_critical_ms = _ms(c.host_us)
    queue = (f"; the longest waits behind {top.queued} launched kernels not yet started"
             + (f" (most on {top.queue_stream})" if top.queue_stream else "")) if top.queued else ""
    text = (f"the host is blocked {_ms(blocked):.2f} ms per step of it waiting for the GPU: "
            f"{maker}{shapes}" + (f" at {top.frame}" if top.frame else "")
            + f" holds it in {what} {_ms(top.blocked_us):.2f} ms per step (up to "
            f"{_ms(top.longest_us):.2f} ms){queue}; without such waits the host's work is "
            f"{_ms(c.host_us):.2f} ms per step, so the GPU is not starved and launching faster "
            "would win nothing back: ")
    if top.copy and re.search(r"DtoH|DeviceToHost", top.copy, re.I):
        text += ("copy into pinned memory with .to('cpu', non_blocking=True) and read the values "
                 "only after an event later in the step, or keep them on the GPU")
    elif top.copy:
        text += ("keep the host tensors in pinned memory (tensor.pin_memory(), once) and copy with "
                 ".to(device, non_blocking=True), or create them on the GPU")
    else:
        text += ("drop the synchronization (no .item(), .cpu(), .tolist() or printing of GPU "
                 "tensors inside the step), or move it to where the GPU has nothing queued")
    return "host-blocked", text


def _top_ops(f: Figures, ctx: Context, phase: str, evidence: Evidence) -> str:
    """The phase's ops with the most self time; first its untraced time (`untraced`) where that is
    more than any op's and at least ``UNTRACED_SHARE`` of the phase: it is nobody's."""
    ops = sorted(((name, v) for (p, name), v in ctx.ops.items() if p == phase), key=lambda kv: -kv[1][1])[:3]
    host = float(f.host_us[f.phases.index(phase)])
    untraced = ctx.untraced_us.get(phase, 0.0)
    text = ""
    if host > 0 and untraced >= UNTRACED_SHARE * host and untraced > max((float(v[1]) for _, v in ops), default=0.0):
        evidence.untraced_ms = _ms(untraced)
        text = (f"{_ms(untraced):.2f} ms of it ({untraced / host:.0%}) is untraced: the process recorded no op, "
                "runtime call or range then (Python or framework code between the recorded ops: a dataset's "
                "__getitem__, logging, file I/O; or events a sampled trace dropped); record_function ranges or "
                "torch.profiler's with_stack=True name it")
        if ops:
            text += "; the ops beside it with the most self time: "
    elif ops:
        text = "its ops with the most self time: "
    if not ops:
        return text or "the trace records no ops in it"
    return text + ", ".join(f"{name} ({_ms(v[1]):.2f} ms)" for name, v in ops)


# --- findings on part of a phase ----------------------------------------------------------------------


def _parts(f: Figures, c: Costs, ctx: Context, phase: str) -> list[Advice]:
    j = f.phases.index(phase)
    cost = c.cost_us[phase]
    out = []
    rows = {name: v for (p, name), v in ctx.ops.items() if p == phase}
    sync = {name: v for name, v in rows.items() if _SYNC_CALL.match(name)}
    sync_us = sum(float(v[2]) for v in sync.values())
    idle = float(f.idle_us[j]) if f.has_gpu else 0.0
    saving = min(sync_us, idle, cost)
    if f.has_gpu and saving >= PART_SHARE * f.wall_us:
        callers = [name for name in _SYNCING_OPS if name in rows][:2]
        listed = [f"{name} x{v[0]:g}" for name, v in sync.items()]
        calls = ", ".join(f"{name} ({v[0]:g} per step)" for name, v in sync.items())
        out.append(Advice(
            kind="sync", phase=phase, saving_us=saving,
            evidence=Evidence(sync_calls=listed, ops=callers or None, wait_ms=_ms(sync_us), gpu_idle_ms=_ms(idle)),
            text=f"{phase} waits {_ms(sync_us):.2f} ms per step for the GPU in {calls}"
                 + (f", from {' and '.join(callers)}" if callers else "")
                 + ": each sync drains the GPU's queue and leaves it idle while the host catches up; keep values "
                   "on the GPU (no .item(), .cpu() or printing of tensors inside the step)"))
    allocs = {name: v for name, v in rows.items() if _ALLOC_CALL.match(name)}
    alloc_calls = sum(float(v[0]) for v in allocs.values())
    alloc_us = sum(float(v[2]) for v in allocs.values())
    saving = min(alloc_us, cost)
    if alloc_calls >= MANY_ALLOCS and saving >= PART_SHARE * f.wall_us:
        out.append(Advice(
            kind="allocator", phase=phase, saving_us=saving,
            evidence=Evidence(alloc_calls=round(alloc_calls, 1), alloc_ms=_ms(alloc_us)),
            text=f"{phase} calls cudaMalloc/cudaFree {alloc_calls:.0f} times per step ({_ms(alloc_us):.2f} ms): the "
                 "caching allocator keeps returning and re-requesting memory; avoid torch.cuda.empty_cache() in the "
                 "loop, keep tensor shapes steady, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    out += _pageable(f, c, ctx, phase, rows)
    comm = _communication(f, c, ctx, phase)
    if comm is not None:
        out.append(comm)
    return out


#: Collective kinds by the op (``nccl:all_reduce``, ``c10d::allreduce_``, ...) or kernel
#: (``ncclKernel_AllReduce_RING_LL_Sum_float``, ...) names, first match wins.
_COLLECTIVE_KINDS = (
    ("all-to-all", re.compile(r"all_?to_?all|alltoall", re.I)),
    ("all-reduce", re.compile(r"all_?reduce", re.I)),
    ("all-gather", re.compile(r"all_?gather", re.I)),
    ("reduce-scatter", re.compile(r"reduce_?scatter", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
    ("send-recv", re.compile(r"send|recv", re.I)),
)


def _collective_kind(name: str) -> str | None:
    return next((kind for kind, pattern in _COLLECTIVE_KINDS if pattern.search(name)), None)


def _communication(f: Figures, c: Costs, ctx: Context, phase: str) -> Advice | None:
    """Communication launched in ``phase`` that no compute on any stream overlaps: its own finding,
    with advice for the kind of collective that takes most of the phase's communication (the host's
    collective ops name it best: NCCL runs an all-to-all as ``SendRecv`` kernels)."""
    j = f.phases.index(phase)
    exposed, comm = float(f.exposed_comm_us[j]), float(f.comm_us[j])
    if not f.has_gpu or exposed <= 0 or exposed < PART_SHARE * c.total_us:
        return None
    saving = min(saving_us(c, gpu_us=exposed), exposed)
    # While the host's work binds the step, hiding the communication shortens it only once the host's
    # work does: the finding stays, without a saving the figures could back.
    at_stake: float | None = saving if saving >= PART_SHARE * c.total_us else None
    ops = sorted(((n, v) for (p, n), v in ctx.ops.items() if p == phase and _COLLECTIVE_OP.match(n)
                  and n != "record_param_comms"), key=lambda kv: -kv[1][4])
    kernels = sorted(((n, v) for (p, n), v in ctx.kernels.items() if p == phase and COLLECTIVE_KERNEL.search(n)),
                     key=lambda kv: -kv[1][1])
    kind = next((k for k in (_collective_kind(n) for n, _ in ops + kernels) if k), "collective")
    overlap = 1.0 - exposed / comm if comm > 0 else 0.0
    names = [n for n, _ in ops[:2]] or _shorts([n for n, _ in kernels[:2]])
    evidence = Evidence(exposed_ms=_ms(exposed), comm_ms=_ms(comm), overlap=round(overlap, 4), collective=kind,
                        ops=names or None)
    head = (f"{_ms(exposed):.2f} ms per step of communication launched in {phase}"
            + (f" ({', '.join(names)})" if names else "")
            + f" runs with no compute on any stream: {overlap:.0%} of its {_ms(comm):.2f} ms is overlapped")
    if at_stake is None:
        head += (f"; the host's work ({_ms(c.host_us):.2f} ms per step) binds the step, so hiding it pays once "
                 "that is shorter")
    return Advice(kind="exposed-communication", phase=phase, saving_us=at_stake, evidence=evidence,
                  text=f"{head}; {_communication_advice(kind, phase)}")


def _communication_advice(kind: str, phase: str) -> str:
    if kind == "all-reduce" and phase == "backward":
        return ("DDP overlaps the gradient all-reduce with backward bucket by bucket: a smaller bucket_cap_mb starts "
                "it sooner, and under gradient accumulation no_sync() on all but the last micro-batch skips it")
    if kind == "all-reduce":
        return (f"an all-reduce in {phase} has no backward to hide behind: all-reduce fewer, larger tensors (or "
                "less often, e.g. metrics every N steps), and look for a rank the others wait for")
    if kind == "all-to-all":
        return ("an all-to-all exchanges sharded embeddings: balance the embedding tables' sharding across ranks "
                "(the sharding planner's placement), keep lookups even per rank, and pipeline the exchange with "
                "the dense compute (e.g. TorchRec's TrainPipelineSparseDist)")
    if kind in ("all-gather", "reduce-scatter"):
        return (f"{'an' if kind == 'all-gather' else 'a'} {kind} of sharded parameters (FSDP/ZeRO): prefetch it "
                "(FSDP's forward_prefetch, backward_prefetch) or shard in larger units so it overlaps the previous "
                "layer's compute")
    if kind in ("broadcast", "barrier"):
        return (f"a {kind} waits for every rank: find the rank the others wait for (the Ranks view), e.g. rank 0 "
                "logging, checkpointing or evaluating before it")
    if kind == "send-recv":
        return ("point-to-point transfers (pipeline stages): more micro-batches keep the stages computing while "
                "they run")
    return "overlap it with compute, or look for a rank the others wait for (the Ranks view)"


def _pageable(f: Figures, c: Costs, ctx: Context, phase: str, rows: dict[str, np.ndarray]) -> list[Advice]:
    """Host-to-device copies from pageable memory launched in ``phase``: the host waits in the call
    while the driver stages the bytes through a pinned buffer, and the copy overlaps nothing. What the
    phase pays is the host time of its copy calls, in the share of its copies' device time that is
    pageable (the copy calls launch the copies, and only them)."""
    pageable = _kernel_us(ctx, phase, _PAGEABLE_HTOD)
    if pageable <= 0:
        return []
    host = sum(float(v[2]) for name, v in rows.items() if _COPY_CALL.match(name))
    paid = host * min(1.0, pageable / max(_kernel_us(ctx, phase, _MEMCPY), pageable))
    saving = min(saving_us(c, host_us=paid), c.cost_us[phase])
    if saving < PART_SHARE * f.wall_us:
        return []
    fix = ("pin_memory=True on the DataLoader and .to(device, non_blocking=True)" if phase in BATCH_PHASES else
           "keep the source tensors in pinned memory (tensor.pin_memory(), once) and copy with "
           ".to(device, non_blocking=True), or create them on the GPU")
    return [Advice(
        kind="pageable-copies", phase=phase, saving_us=saving,
        evidence=Evidence(pageable_copy_ms=_ms(pageable), copy_host_ms=_ms(paid),
                          ops=[n for n in rows if _COPY_CALL.match(n)][:2] or None),
        text=f"{phase} pays {_ms(paid):.2f} ms of host time per step copying to the GPU from pageable memory "
             f"({_ms(pageable):.2f} ms of Memcpy HtoD (Pageable -> Device)): the host waits while each copy is "
             f"staged and the copy overlaps nothing; {fix} let the copies run beside the step")]


def _kernel_us(ctx: Context, phase: str, pattern: re.Pattern) -> float:
    return sum(float(v[1]) for (p, name), v in ctx.kernels.items() if p == phase and pattern.search(name))


def _short(name: str, width: int = 60) -> str:
    """A kernel's name without its template arguments and parameters, for a sentence."""
    short = _templated(name, None)
    depth, out = 0, []
    for ch in short:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    short = "".join(out) or name
    return _cut(short, width)


def _templated(name: str, width: int | None = 60) -> str:
    """A kernel's name with its template arguments, without its parameters, for a sentence."""
    short = re.sub(r"^void ", "", re.sub(r"\(.*$", "", name)) or name
    return short if width is None else _cut(short, width)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _shorts(names: list[str]) -> list[str]:
    """Distinct kernels' names for a sentence, each in the shortest form no other of them reads as:
    without template arguments (`_short`), with them (`_templated`), or whole (two kernels of one
    template differ only in their arguments)."""
    out: dict[str, str] = {}
    for form in (_short, _templated):
        # a form is taken only where no other name's label (taken, or in this form) reads the same
        labels = [out.get(n) or form(n) for n in names]
        for n, label in zip(names, labels):
            if n not in out and labels.count(label) == 1:
                out[n] = label
    return [out.get(n, n) for n in names]


def _ms(us: float) -> float:
    return round(float(us) / 1000.0, 3)


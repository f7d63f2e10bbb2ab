"""What the analysis of one trace file (a span) keeps: per-step, per-phase figures as arrays.

This is what TensorBoard holds in memory instead of the events: a few arrays per span, sized by
steps × phases and by distinct ops, not by events. It pickles cheaply between processes.
"""

from __future__ import annotations

import msgspec
import numpy as np

from .partition import Step
from .stacks import CallPaths


def step_rows(column: np.ndarray, step: int) -> slice:
    """The rows of step ``step`` in a table sorted by its ``column`` of step indices. The step is
    given in the column's own type: a Python int beside an int32 column makes numpy copy the whole
    column to int64 first, a cost per call that a loop over the steps turns quadratic (the array's
    own method: a binary search, O(log n), whatever the column's length)."""
    at = column.dtype.type(step)
    return slice(int(column.searchsorted(at, "left")), int(column.searchsorted(at, "right")))


class OpTable(msgspec.Struct):
    """Ops aggregated per (step, phase, name, input shapes), in step then phase order.

    Host operators, annotations that are not phase ranges, and runtime calls; CPU times in µs.
    ``self_gpu_us`` is the device time of the kernels, copies and sets the op launched itself (through
    its runtime calls), ``gpu_us`` adds what its child ops launched.
    """

    step: np.ndarray  # int32 index into SpanAnalysis.steps
    phase: np.ndarray  # int32 code into SpanAnalysis.phases
    name: np.ndarray  # int32 into SpanAnalysis.names
    shapes: np.ndarray  # int32 into SpanAnalysis.shapes
    calls: np.ndarray  # int64
    self_us: np.ndarray
    total_us: np.ndarray
    self_gpu_us: np.ndarray
    gpu_us: np.ndarray
    #: the call path (into ``SpanAnalysis.call_paths``) of most of the row's host time, -1 where the
    #: trace holds no stacks; and that host time
    stack: np.ndarray  # int32
    stack_us: np.ndarray

    def rows(self, step: int) -> slice:
        """The rows of one step."""
        return step_rows(self.step, step)


class Lanes(msgspec.Struct):
    """A swimlane picture per step: host threads with phase bands, GPU streams by launching phase."""

    labels: list[str]  # lane names; lane 0 is the loop's thread
    step: np.ndarray  # int32
    lane: np.ndarray  # int32
    start: np.ndarray  # µs
    end: np.ndarray
    phase: np.ndarray  # int32

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class KernelTable(msgspec.Struct):
    """Device work (kernels, copies, sets) grouped per (step, phase that launched it, name, launching
    op, kind), in step order; only work whose launch lies in a step (what ``SpanAnalysis.gpu_us``
    counts). What the kernel tables and advice about the GPU side (which kernels, in what precision,
    how short) rest on. The launching op is the op that made the runtime call (the call itself when no
    op encloses it)."""

    step: np.ndarray  # int32 index into SpanAnalysis.steps
    phase: np.ndarray  # int32 code into SpanAnalysis.phases
    name: np.ndarray  # int32 into SpanAnalysis.names
    op: np.ndarray  # int32 into SpanAnalysis.names
    kind: np.ndarray  # int8: reading.events.KERNEL, MEMCPY or MEMSET
    calls: np.ndarray  # int64
    us: np.ndarray  # device time
    max_us: np.ndarray  # the longest one
    # Duration-weighted sums of the launch figures, over the calls that recorded each (kernels): the
    # mean is ``blocks_per_sm_us / blocks_per_sm_weight_us``.
    blocks_per_sm_us: np.ndarray
    blocks_per_sm_weight_us: np.ndarray
    occupancy_us: np.ndarray  # of "est. achieved occupancy %"
    occupancy_weight_us: np.ndarray
    # The launch of the longest call (-1: not recorded); grid and block `reading.events.pack_dims`.
    grid: np.ndarray  # int64
    block: np.ndarray  # int64
    registers: np.ndarray  # int64 per thread
    shared_memory: np.ndarray  # int64 bytes per block

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class ModuleTable(msgspec.Struct):
    """Per (step, module): its calls' figures (µs); per (step, module, op, forward or backward): its ops.
    ``paths[m]`` names module m, ``parent[m]`` its enclosing module (-1: top level). From
    phaseprof's ranges the name is the module's path; from the trace's module records it is the
    record's own name, the path being the parent's path and it joined by a dot
    (`modules.module_paths`): whole paths of records nested n deep take n² names."""

    source: str  # `modules.FROM_RANGES`, `modules.FROM_RECORDS`, or "" (none recorded)
    paths: list[str]
    parent: np.ndarray  # int32
    step: np.ndarray  # int32 index into SpanAnalysis.steps
    module: np.ndarray  # int32 into paths
    calls: np.ndarray  # int64
    forward_us: np.ndarray
    forward_self_us: np.ndarray
    forward_gpu_us: np.ndarray
    backward_us: np.ndarray
    backward_gpu_us: np.ndarray
    op_step: np.ndarray  # int32
    op_module: np.ndarray  # int32
    op_name: np.ndarray  # int32 into SpanAnalysis.names
    op_backward: np.ndarray  # bool
    op_calls: np.ndarray  # int64
    op_us: np.ndarray  # host time, children ops included
    op_gpu_us: np.ndarray  # device time launched by it and its children


def no_modules() -> ModuleTable:
    i32, f = np.zeros(0, np.int32), np.zeros(0)
    return ModuleTable(source="", paths=[], parent=i32, step=i32, module=i32, calls=np.zeros(0, np.int64),
                       forward_us=f, forward_self_us=f, forward_gpu_us=f, backward_us=f, backward_gpu_us=f,
                       op_step=i32, op_module=i32, op_name=i32, op_backward=np.zeros(0, bool),
                       op_calls=np.zeros(0, np.int64), op_us=f, op_gpu_us=f)


class MemoryCurve(msgspec.Struct):
    """Allocated (and reserved) bytes over each step, per memory device, in (step, device, time)
    order. Long curves keep, per time bucket, the points holding its lowest and highest value, so
    the peak survives exactly."""

    step: np.ndarray  # int32 index into SpanAnalysis.steps
    device: np.ndarray  # int32 into SpanAnalysis.memory_devices
    ts: np.ndarray  # µs, trace clock
    allocated: np.ndarray  # int64 bytes after the event
    reserved: np.ndarray  # int64 bytes, -1 where the trace does not record it

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class CollectiveTable(msgspec.Struct):
    """Each collective of a span's steps, one row per call, in (step, host start) order: a
    ``record_param_comms`` op (the range PyTorch wraps every c10d collective in), or a collective kernel
    launched outside one. Its device work is what was launched under it (`collectives.collective_table`)."""

    kinds: list[str]  # what ``kind`` codes: all_reduce, all_gather, …, as `collectives.kind_of` names them
    groups: list[str]  # what ``group`` codes: the process group's name or id ("" unknown)
    step: np.ndarray  # int32 index into SpanAnalysis.steps
    phase: np.ndarray  # int32 code into SpanAnalysis.phases: the phase at its host start
    kind: np.ndarray  # int32 into kinds
    group: np.ndarray  # int32 into groups
    group_size: np.ndarray  # int64 ranks in the group (-1 unknown)
    seq: np.ndarray  # int64 the trace's sequence number in its group ("Seq"; -1 not recorded)
    order: np.ndarray  # int64 its place among the step's collectives of its group (0, 1, …)
    nbytes: np.ndarray  # int64 message size: nccl-tests' size (`collectives.message_bytes`); -1 unknown
    host_ts: np.ndarray  # µs its host range starts
    host_us: np.ndarray  # its host range's duration
    device_start: np.ndarray  # µs its first device work starts (NaN: none)
    device_end: np.ndarray  # µs its last device work ends (NaN: none)
    kernel_us: np.ndarray  # device time of its work, summed over streams

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class BlockingTable(msgspec.Struct):
    """Each host call of a span's steps that waited for the device, one row a call, in (step, start)
    order (`blocking`): a synchronize, or a copy to the host or through pageable memory that held
    it."""

    step: np.ndarray  # int32 index into SpanAnalysis.steps
    phase: np.ndarray  # int32 code into SpanAnalysis.phases: the phase at its start
    call: np.ndarray  # int32 into SpanAnalysis.names: the runtime call
    copy: np.ndarray  # int32 into SpanAnalysis.names: the copy it waited for (-1: a synchronize)
    op: np.ndarray  # int32 into SpanAnalysis.names: the op that made it (-1: the call is no op's)
    shapes: np.ndarray  # int32 into SpanAnalysis.shapes: that op's input shapes
    stack: np.ndarray  # int32 into SpanAnalysis.call_paths: its call path (-1: not recorded)
    ts: np.ndarray  # µs its host call starts
    blocked_us: np.ndarray  # its host time: how long it held the host
    queued: np.ndarray  # int64 device work launched and not yet started when it began, all streams
    queue_stream: np.ndarray  # int32 into LaunchQueues.streams: the stream holding most of it

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class PathTable(msgspec.Struct):
    """The critical path of each of a span's steps (`critical_path`), one row a stretch, in (step,
    time) order; consecutive stretches alike merged."""

    streams: list[str]  # what ``lane`` codes: "GPU d stream s"
    step: np.ndarray  # int32 index into SpanAnalysis.steps
    start: np.ndarray  # µs from the step's start
    end: np.ndarray
    lane: np.ndarray  # int32 into ``streams``; -1: the host
    kind: np.ndarray  # int8 into `critical_path.KINDS`
    #: int32 into SpanAnalysis.names: the op, runtime call or device work; < 0: a gap
    #: (`critical_path.GAP_NAMES`), or -1 for host time in no op (named by its phase)
    name: np.ndarray
    phase: np.ndarray  # int32 into SpanAnalysis.phases (-1: none)
    blocked: np.ndarray  # bool: inside the host window of a call the path waits in

    @classmethod
    def empty(cls, streams: list[str]) -> PathTable:
        i = np.zeros(0, np.int32)
        return cls(streams=streams, step=i, start=np.zeros(0), end=np.zeros(0), lane=i,
                   kind=np.zeros(0, np.int8), name=i, phase=i, blocked=np.zeros(0, bool))

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class LaunchQueues(msgspec.Struct):
    """The launch queues of a span's steps (`blocking`): per step and stream, the device work
    launched and not yet started, its time-weighted mean and its maximum over the step's host
    window; the launch delay (runtime call to device start) of the work the step launched, median
    and 90th percentile (µs, NaN where it launched none there); per step and phase, the queue of all
    streams summed over the phase's host time (queue-µs: divided by that time, its mean)."""

    streams: list[str]  # "GPU d stream s"
    mean: np.ndarray  # (steps, streams)
    max: np.ndarray  # (steps, streams) int64
    delay_p50_us: np.ndarray  # (steps, streams)
    delay_p90_us: np.ndarray  # (steps, streams)
    phase_queued_us: np.ndarray  # (steps, phases)


class MemoryOpTable(msgspec.Struct):
    """Memory per (step, device, op name), in that order (`memory_ops`): events, bytes allocated and
    freed and the peak delta, self (events in the op itself) and total (with the ops it called)."""

    step: np.ndarray  # int32 index into SpanAnalysis.steps
    device: np.ndarray  # int32 into SpanAnalysis.memory_devices
    name: np.ndarray  # int32 into SpanAnalysis.names; -1: events outside every op
    events: np.ndarray  # int64 its own events
    allocated_self: np.ndarray  # int64 bytes
    freed_self: np.ndarray
    peak_self: np.ndarray
    allocated_total: np.ndarray
    freed_total: np.ndarray
    peak_total: np.ndarray

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class MemoryEventTable(msgspec.Struct):
    """The memory events of each step, per (step, device) in time order, at most
    `memory_ops.MAX_EVENTS` per step and device (the largest; ``left_out`` counts the rest)."""

    step: np.ndarray  # int32 index into SpanAnalysis.steps
    device: np.ndarray  # int32 into SpanAnalysis.memory_devices
    ts: np.ndarray  # µs, trace clock
    nbytes: np.ndarray  # int64: + allocated, - freed
    addr: np.ndarray  # int64 the block's address (-1: not recorded)
    op: np.ndarray  # int32 into SpanAnalysis.names: the innermost op holding it (-1: none)
    allocated: np.ndarray  # int64 bytes allocated after it
    left_out: np.ndarray  # (steps, devices) int64 events not kept
    peak_op: np.ndarray  # (steps, devices) int32 the op at the step's peak (-1: no op; -2: no event)

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class Apart(msgspec.Struct):
    """Time kept out of the steps (evaluation passes, ``prof.paused()`` blocks) within the step
    windows, as host intervals in time order; ``kind`` indexes `phaseprof.contract.OUT_OF_STEP`."""

    step: np.ndarray  # int32 index into SpanAnalysis.steps: the step whose window holds it
    kind: np.ndarray  # int32
    start: np.ndarray  # µs, trace clock
    end: np.ndarray

    def rows(self, step: int) -> slice:
        return step_rows(self.step, step)


class GpuMeasures(msgspec.Struct):
    """The GPU measures of a span's steps (µs): of the device work launched in each step, each
    instant of the GPU's time owned by one step (`span.owned_pieces`: the earliest step whose work
    has not all ended then), so the steps' windows never overlap and their figures add up to the
    trace's.

    Device work is of three kinds, as Holistic Trace Analysis types kernels: *communication*
    (collectives, and work launched under ``record_param_comms``), else *memory* (copies and sets),
    else *compute* (kernels that are neither). Per (step, phase) tables share each instant of the
    step's GPU busy time equally among the phases whose work runs in it, so each adds up over the
    phases to the step's figure exactly: ``busy`` (any work), ``compute`` (instants where compute
    runs, shared among the phases whose compute runs), ``comm``, ``memory`` (likewise), ``exposed``
    (communication with no compute on any stream) and ``memory_exposed`` (copies and sets with
    neither compute nor communication running). Busy is compute plus exposed communication plus
    exposed memory; the GPU window less busy is idle. Kernel time (device-event time summed over
    streams) is `SpanAnalysis.gpu_us`."""

    busy_us: np.ndarray  # (steps, phases)
    compute_us: np.ndarray  # (steps, phases)
    comm_us: np.ndarray  # (steps, phases)
    exposed_us: np.ndarray  # (steps, phases)
    window_us: np.ndarray  # (steps,) first to last device activity of the step's work; 0 without any
    past_host_us: np.ndarray  # (steps,) how long that work runs on after the step's host window ends
    streams: list[str]  # "GPU d stream s", for every stream with work in some step
    stream_busy_us: np.ndarray  # (steps, streams) GPU busy per stream
    memory_us: np.ndarray  # (steps, phases)
    memory_exposed_us: np.ndarray  # (steps, phases)
    memory_kinds: list[str]  # names of the copies and sets: "Memcpy DtoH (Device -> Pageable)", …
    memory_kind_us: np.ndarray  # (steps, memory kinds) device time summed over streams
    window_start_us: np.ndarray  # (steps,) where the GPU window opens (trace clock; NaN: no work)
    #: (steps, streams, 3) idle µs per stream: host wait, kernel wait, other (`idle.idle_split`)
    idle_split_us: np.ndarray


class SpanAnalysis(msgspec.Struct):
    """The analysis of one trace file."""

    file: str  # file name (relative to its run)
    worker: str
    steps: list[Step]
    phases: list[str]
    names: list[str]
    shapes: list[str]
    host_us: np.ndarray  # (steps, phases) host time per phase; rows add up to the step's wall time (`Step.wall`)
    gpu_us: np.ndarray  # (steps, phases) device time of work launched in the phase
    gpu_idle_us: np.ndarray  # (steps, phases) time in the phase's host windows with no device work
    #: (steps, phases) time in the phase's host windows with no compute kernel running (copies,
    #: sets and collectives do not count): what a phase's "gpu-bound" verdict rests on
    compute_idle_us: np.ndarray
    launches: np.ndarray  # (steps, phases) device events launched
    #: (steps, phases) host time spent waiting for the GPU: synchronizing calls (stream, device and
    #: event synchronize, blocking copies, cudaMalloc/cudaFree) and runtime calls stalled far beyond
    #: their usual time (a full launch queue); at most the phase's host time
    wait_us: np.ndarray
    #: GPU busy, compute, communication and exposed communication per step and phase, GPU window
    gpu: GpuMeasures
    #: (steps, phases) host time in which no thread of the loop's process recorded an event (`untraced`)
    untraced_us: np.ndarray
    step_gpu_us: np.ndarray  # (steps,) kernel time: device time of the step's work summed over streams
    step_gpu_idle_us: np.ndarray  # (steps,)
    memory_devices: list[str]
    memory_peak: np.ndarray  # (steps, phases, devices) peak allocated bytes, -1 where no event
    memory_delta: np.ndarray  # (steps, phases, devices) net allocated bytes
    ops: OpTable
    call_paths: CallPaths  # Python call stacks of the ops (``with_stack=True``; empty without)
    modules: ModuleTable  # per nn.Module, where recorded (`modules`)
    kernels: KernelTable
    collectives: CollectiveTable
    blocking: BlockingTable  # host calls that waited for the device
    queues: LaunchQueues  # launch queues and delays per stream
    critical_path: PathTable  # each step's critical path
    memory_curve: MemoryCurve
    memory_ops: MemoryOpTable
    memory_events: MemoryEventTable
    lanes: Lanes
    #: Time in the step windows kept out of the steps; its host µs per step and kind are `Step.apart`.
    apart: Apart
    #: (steps, kinds of OUT_OF_STEP) device time of the work launched in the time kept out of each step
    apart_gpu_us: np.ndarray
    has_gpu: bool
    #: (steps,) the trace's last step, when the trace's end cut it (`cut`)
    cut: np.ndarray
    rank: int | None = None
    world_size: int | None = None
    gpu_names: list[str] = msgspec.field(default_factory=list)  # of the GPUs with activity in the trace
    gpu_capabilities: list[str] = msgspec.field(default_factory=list)  # theirs: "major.minor", "" unknown
    cpus: int | None = None  # CPUs the training process could use, where the trace records them
    #: per memory device: its allocated bytes count memory allocated before the trace's first memory
    #: event (false: they start from zero there; see `memory.has_baseline`)
    memory_baseline: list[bool] = msgspec.field(default_factory=list)
    #: Malformed events skipped while reading: how many, and one line on how many, why, which first.
    skipped_events: int = 0
    first_problem: str = ""

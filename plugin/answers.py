"""What the analysis answers: every JSON answer of the CLI, `analyze()` and the HTTP routes, typed.

This module is the one definition of those answers. The analysis builds these Structs, the routes
and ``phaseprof report --json`` encode them, the terminal renders them, and the tab's TypeScript
types are generated from them (``python -m phaseprof.plugin.typescript``). Times are milliseconds
rounded to the microsecond; memory is bytes. Phases are named keys, canonical ones first (see
`phaseprof.contract.PHASE_REGISTRY`), then the user's own (``compile``: torch.compile's compile time
inside a step). Time the training hook keeps out of the steps — evaluation passes (``eval``) and
``prof.paused()`` blocks (``paused``) — is in no phase and no step's time: a step carries it apart.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

Verdict = Literal["cpu-bound", "balanced", "gpu-bound"]
#: Where a step (or rank) stands against the others: beyond their noise band, within it, or too few
#: steps to tell (see `phaseprof.plugin.analysis.noise`).
NoiseVerdict = Literal["beyond-noise", "within-noise", "too-few-steps"]
#: What phases are ranked by: host time on the critical path, or (GPU-bound steps) GPU time.
Measure = Literal["host", "gpu"]
SpanState = Literal["pending", "loading", "ready", "error"]
WorkerState = Literal["loading", "ready"]


class Answer(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every answer. Answers declared ``omit_defaults`` leave a field whose default is
    ``None`` out of the JSON while it has nothing to say (e.g. a summary without any step holding
    work); those fields are optional in the generated TypeScript. Decoding an answer (the examples
    of http_api.md, in a test) refuses fields it does not define.

    ``to_dict()``: the answer as plain data, as its JSON has it; ``to_pandas()``: its table (the
    list field named by ``table``: one row per item, nested answers as dicts) as a pandas
    DataFrame, for answers that have one (pandas is not a dependency: install it to use this)."""

    #: The field holding the answer's table, for `to_pandas` (None: the answer is not a table).
    table: ClassVar[str | None] = None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    def to_pandas(self):
        if self.table is None:
            raise TypeError(f"{type(self).__name__} is not a table: use to_dict()")
        import pandas as pd  # an optional dependency, for notebooks

        return pd.DataFrame(msgspec.to_builtins(getattr(self, self.table)))


# --- errors and loading ---------------------------------------------------------------------------


class FileError(Answer):
    """A file (or path) that could not be read or analysed, and why, in one line."""

    path: str
    error: str


class SpanInfo(Answer):
    """One trace file of a worker and where its loading stands; ``gpu``: whether it holds device
    activity (null until loaded)."""

    file: str
    size: int
    state: SpanState
    steps: int | None
    error: str | None
    gpu: bool | None


class WorkerInfo(Answer):
    """A worker (a rank) of a run: ``ready`` once all its spans are ready or failed."""

    worker: str
    rank: int | None
    state: WorkerState
    spans: list[SpanInfo]


class RunInfo(Answer):
    """A run under the logdir; one with only per-step scalars has no workers."""

    run: str
    has_scalars: bool
    workers: list[WorkerInfo]


class Loading(Answer):
    """How far the background loading of trace files has come."""

    files: int
    done: int
    bytes: int
    bytes_done: int


class PhaseStyle(Answer):
    """A canonical phase (or a framework's, ``lightning``, ``transformers``) as every view shows it:
    its name and colour, in display order."""

    name: str
    colour: str


class RunsAnswer(Answer):
    """``GET /runs``: what is under the logdir, loading progress, unreadable files, and how to draw
    phases (canonical ones in order with their colours, then the frameworks' phases, which runs hold
    only where a framework callback ran; a user's phase takes a colour from
    ``user_phase_colours`` by a hash of its name). ``logdir_error``: why the logdir itself cannot be
    listed (a store's client not installed, credentials the store refuses, no such bucket), one line
    naming it; null when it was listed."""

    table = "runs"

    runs: list[RunInfo]
    loading: Loading
    errors: list[FileError]
    phases: list[PhaseStyle]
    user_phase_colours: list[str]
    logdir_error: str | None = None


# --- steps ----------------------------------------------------------------------------------------


class LaunchQueue(Answer):
    """A stream's launch queue in a step (or the mean over steps): ``mean`` / ``max``, the device
    work launched on it (its runtime call started) and not yet started, time-weighted mean and
    maximum over the step's host window; ``delay_p50_ms`` / ``delay_p90_ms``, the launch delay
    (runtime call's start to the device work's start) of the work the step launched there, median
    and 90th percentile (null where it launched none there). A long queue is a GPU with work
    waiting; a short one while the GPU idles, a host that does not launch fast enough."""

    mean: float
    max: int
    delay_p50_ms: float | None
    delay_p90_ms: float | None


class BlockingCall(Answer):
    """A host call of a step that waited for the device: a synchronize, or a copy to the host (or
    through pageable memory) that held the host until it was done. ``copy``: the device copy (null:
    a synchronize); ``op``: the op that made it (``aten::to``, ``aten::item``; null: no op),
    ``inputs`` its input shapes, ``frame`` the user's code that called it (with_stack); ``start_ms``
    from the step's start; ``blocked_ms`` its host time; ``queued``: device work launched and not
    yet started when it began (all streams), most of it on ``queue_stream``."""

    phase: str
    call: str
    copy: str | None
    op: str | None
    inputs: str | None
    frame: str | None
    start_ms: float
    blocked_ms: float
    queued: int
    queue_stream: str | None


class IdleSplit(Answer):
    """A stream's idle time in a step (the step's GPU window on that stream less its busy time), split
    by what the stream waited for, as Holistic Trace Analysis splits it: ``host_wait_ms``, no work
    queued on the stream (the host had not launched the next one); ``kernel_wait_ms``, work queued but
    not started, across a gap under ``KERNEL_WAIT_US`` (the short gaps between queued kernels);
    ``other_ms``, the rest (work queued behind another stream's, an event or a longer stall)."""

    host_wait_ms: float
    kernel_wait_ms: float
    other_ms: float


class GpuTime(Answer):
    """A step's GPU measures (or their means over steps), each named for what it counts, of the
    device work (kernels, copies, sets) *launched* in the step, wherever on the GPU's clock it ran,
    with one owner per GPU instant: an instant belongs to the earliest step whose work has not all
    ended then (the next step's work that runs before is counted there), so steps' windows never
    overlap and the steps' figures add up to the trace's.

    ``busy_ms``: GPU busy, the union of the step's instants over all streams (one instant, once);
    ``kernel_ms``: kernel time by launch, device-event time summed over streams;
    ``window_ms``: the GPU window, first to last device activity of the step (at least ``busy_ms``);
    ``compute_ms`` / ``comm_ms``: busy time of compute (kernels that are neither communication nor
    memory; up to phaseprof 0.1.0 copies and sets counted as compute too) / of communication
    (collective kernels: NCCL, RCCL, gloo, and work launched under ``record_param_comms``);
    ``exposed_comm_ms``: communication time with no compute running on any stream;
    ``overlap``: the share of communication time compute overlapped (null without communication);
    ``past_host_ms``: how long the work runs on after the step's host window ends (the host ran
    ahead; 0 when it does not); ``streams``: GPU busy per stream (``GPU 0 stream 7``)."""

    busy_ms: float
    kernel_ms: float
    window_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    overlap: float | None
    past_host_ms: float
    streams: dict[str, float]
    #: per stream: its launch queue and launch delay (`LaunchQueue`; over several steps, the means
    #: of the steps' figures and the largest maximum)
    queues: dict[str, LaunchQueue]
    #: busy time of copies and sets (memcpy, memset: not compute), and its part with neither compute
    #: nor communication running; busy = compute + exposed communication + exposed memory
    memory_ms: float
    exposed_memory_ms: float
    idle_ms: float  # the GPU window less busy: the fourth measure (compute, communication, memory)
    memory_kinds: dict[str, float]  # device time per kind of copy or set, by its name, most first
    #: per stream (keys as ``queues``): its idle time in the step split by what it waited for
    #: (`IdleSplit`; over several steps, the means of the steps' figures)
    idle_split: dict[str, IdleSplit]


# PhaseTimes and StepRow are left out of the garbage collector's count (``gc=False``): one per phase
# of every step (50,000 steps: 400,000 of them) made it run over and over, half the steps' cost;
# they hold no cycle.
class PhaseTimes(Answer, gc=False):
    """One phase of one step. ``gpu_ms``: kernel time of the work launched in the phase (device-event
    time summed over streams); ``gpu_idle_ms``: the phase's host time with no device activity (null
    without GPU). ``gpu_busy_ms``, ``gpu_compute_ms``, ``comm_ms``, ``exposed_comm_ms``: the phase's
    part of the step's figures of the same names (`GpuTime`): an instant when the work of several
    phases runs is shared equally among them, so each adds up over the phases to the step's exactly."""

    host_ms: float
    gpu_ms: float
    gpu_idle_ms: float | None
    launches: int
    verdict: Verdict | None
    inferred: bool
    gpu_busy_ms: float
    gpu_compute_ms: float
    comm_ms: float
    exposed_comm_ms: float


class StepRow(Answer, gc=False):
    """One step: wall time and every phase of its worker; host phase times add up to ``wall_ms``.
    ``empty``: a step holding no work (a loop that ended inside the active window).

    ``eval_ms`` / ``paused_ms``: host time of evaluation passes / ``prof.paused()`` blocks inside the
    step's window (``ProfilerStep#N``), kept out of ``wall_ms`` and of every phase, as the scalars
    keep them out of ``phaseprof/step_ms`` (an evaluation pass is ``phaseprof/eval_ms``);
    ``eval_gpu_ms`` / ``paused_gpu_ms``: device time of the work launched in them.

    ``gpu_ms``: kernel time of the step's work (summed over streams); ``gpu_time``: the step's GPU
    measures (null for a trace without device activity)."""

    step: int
    span: str
    start_ms: float
    wall_ms: float
    eval_ms: float
    eval_gpu_ms: float
    paused_ms: float
    paused_gpu_ms: float
    gpu_ms: float
    gpu_idle_ms: float | None
    inferred: bool
    inferred_phases: list[str]
    #: The step's window was inferred from the loop's repeated marks (the trace marks no steps).
    inferred_step: bool
    empty: bool
    phases: dict[str, PhaseTimes]
    gpu_time: GpuTime | None


class OpTimes(Answer):
    """An op's calls and times, aggregated by name and input shapes: what a step's op row and a
    run's share. ``self_*``: without its children (host) or of the work it launched itself (GPU)."""

    name: str
    shapes: str | None
    calls: int
    self_host_ms: float
    host_ms: float
    self_gpu_ms: float
    gpu_ms: float


class OpRow(OpTimes, omit_defaults=True):
    """An op of one step and phase, aggregated by name and input shapes. ``self_*``: without its
    children (host) or of the work it launched itself (GPU)."""

    #: with ``with_stack=True``: the call stack of most of its host time, innermost frame first, and its
    #: innermost frame in the user's code (`analysis.stacks.is_user_frame`); left out without stacks
    stack: list[str] = msgspec.field(default_factory=list)
    frame: str | None = None


class MeanOp(Answer):
    """An op of a phase, mean per step over a worker's non-empty steps."""

    name: str
    calls: float
    self_host_ms: float
    host_ms: float
    self_gpu_ms: float
    gpu_ms: float


class MemoryFigures(Answer):
    """Allocated bytes in a phase on one device: the peak seen (null if none) and the net change."""

    peak_bytes: int | None
    delta_bytes: int


#: ``[lane, start_ms, end_ms, phase]``, times relative to the step's start.
Band = tuple[int, float, float, str]
#: ``[start_ms, end_ms, kind]``: time in a step's window kept out of the step, relative to the step's
#: start; ``kind`` is ``eval`` (an evaluation pass) or ``paused`` (``prof.paused()``).
ApartBand = tuple[float, float, str]


class Lanes(Answer):
    """A step's swimlanes: lane 0 is the loop's thread, then other threads, then GPU streams."""

    labels: list[str]
    bands: list[Band]


class PathShare(Answer):
    """One thing on a critical path: its time on the path (per step, or the mean per step in a
    summary) and its ``share`` of the path's length. ``kind``: ``op`` (host time of an op, by name),
    ``kernel`` (compute on the GPU), ``copy`` (a memcpy/memset), ``collective`` (communication
    kernels), ``sync`` (a host call waiting for the device), ``launch`` (the runtime call that
    launched work the path goes on to), ``idle`` (host time in no op, or a wait on nothing traced),
    ``phase`` (host time of a phase in no op)."""

    name: str
    kind: str
    ms: float
    share: float


class PathSegment(Answer):
    """A stretch of a step's critical path: ``start_ms`` / ``end_ms`` from the step's start, the
    ``lane`` it runs on (``host``, or a GPU stream labelled as in `GpuTime.streams`), its ``kind``
    (as `PathShare`'s) and ``name``; consecutive stretches of one lane and name are merged."""

    start_ms: float
    end_ms: float
    lane: str
    kind: str
    name: str


class CriticalPath(Answer):
    """The longest chain of dependent work through a step (docs/architecture.md): host ops in order on
    the loop's thread, launches (runtime call to its device work), device work in order on each
    stream, waits (device work's end to the end of the host call waiting for it). ``length_ms``: its
    length, the step's wall time (the path runs from the step's start to its end). ``bound``: what
    fills it most (``host``: host work; ``host-blocked``: the host waiting for the device, a sync on
    the path; ``gpu``: kernels; ``launch``: launches of short kernels the GPU waited for;
    ``communication``: collectives; ``data``: the data phase). ``phases``: ms of the path in each
    phase; ``items``: what is on it, most time first (at most 20); ``segments``: the path in time
    order (empty in a summary, where every figure is a mean per step over the steps kept)."""

    length_ms: float
    bound: str
    phases: dict[str, float]
    items: list[PathShare]
    segments: list[PathSegment]


class StepDetail(StepRow):
    """``GET /step``: one step in full: its row, the ops and memory of each phase, its swimlanes, and
    where in its window time was kept out of it (``apart``: the lanes leave those stretches empty;
    their ops are in no phase)."""

    run: str
    worker: str
    ops: dict[str, list[OpRow]]
    memory: dict[str, dict[str, MemoryFigures]]
    lanes: Lanes
    gpu_names: list[str]
    apart: list[ApartBand]
    blocking: list[BlockingCall]  # the step's host calls that waited for the device, in time order
    critical_path: CriticalPath | None  # the step's critical path (null without device activity)


# --- comparisons ----------------------------------------------------------------------------------


class Times(Answer):
    """Host and device time of a phase."""

    host_ms: float
    gpu_ms: float


class CompareSide(Answer):
    """One side of a comparison: the mean of its (non-empty) steps."""

    label: str
    steps: list[int]
    wall_ms: float
    phases: dict[str, Times]


class Delta(Answer):
    """Side B minus side A."""

    wall_ms: float
    phases: dict[str, Times]


class ChangedOp(Answer):
    """A (phase, op name) on both sides of a comparison, per step; deltas are B - A."""

    phase: str
    name: str
    a_calls: float
    b_calls: float
    a_self_host_ms: float
    b_self_host_ms: float
    delta_self_host_ms: float
    a_host_ms: float
    b_host_ms: float
    delta_host_ms: float
    a_self_gpu_ms: float
    b_self_gpu_ms: float
    delta_self_gpu_ms: float
    a_gpu_ms: float
    b_gpu_ms: float
    delta_gpu_ms: float


class CompareAnswer(Answer):
    """``GET /compare``: two sides, the per-phase deltas, the ops whose self time changed most."""

    table = "ops"

    a: CompareSide
    b: CompareSide
    delta: Delta
    ops: list[ChangedOp]
    phases: list[str]


# --- a worker's summary ---------------------------------------------------------------------------


class PhaseMean(Answer):
    """A phase's mean per step; ``share``: its host time's share of the mean step's wall time (host
    time); ``gpu_share``: its GPU busy time's share of the mean step's GPU busy time (null without
    GPU). Each adds up to 1 over the phases. The GPU figures are those of `PhaseTimes`."""

    host_ms: float
    gpu_ms: float
    gpu_idle_ms: float | None
    share: float
    gpu_busy_ms: float
    gpu_compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    gpu_share: float | None


class Slowest(Answer, omit_defaults=True):
    """The slowest step; ``noise``: whether it is slower than the other steps' noise band
    (``noise_ms`` either side of the median step) explains; only then, what grew against the median."""

    step: int
    wall_ms: float
    noise: NoiseVerdict
    noise_ms: float | None = None
    median_step: int | None = None
    vs_median_ms: float | None = None
    phase: str | None = None
    phase_delta_ms: float | None = None
    ops: list[ChangedOp] | None = None


class StepNoise(Answer):
    """How the steps a summary stands for are judged against each other: the one definition of an
    outlier that the summary, the slowest step, the findings, the terminal and the tab all use.
    ``median_step``: the median step (the lower middle one for an even count) and ``median_ms`` its
    wall time; ``band_ms``: how far from it a step must lie to be beyond noise; ``slow`` / ``fast``:
    the steps beyond it. ``judged`` is false with too few steps to tell (then no step is an outlier)."""

    judged: bool
    steps: int  # steps judged
    min_steps: int  # the fewest steps judged
    median_step: int
    median_ms: float
    band_ms: float | None  # None when not judged
    slow: list[int]
    fast: list[int]


class Evidence(Answer, omit_defaults=True):
    """The figures a finding rests on: only those it uses are present (docs/findings.md says which).
    Times are per step, means over the worker's non-empty steps unless ``step`` names one."""

    measure: Measure | None = None  # what the phase's cost is measured in
    cost_ms: float | None = None  # the phase's cost in ``measure``
    wall_ms: float | None = None  # the mean step
    host_ms: float | None = None  # the phase's host time
    gpu_ms: float | None = None  # device time of the work the phase launched
    gpu_idle_ms: float | None = None  # the phase's host time with the GPU idle
    loader: str | None = None  # how the DataLoader loads: "single-process" or "worker processes"
    pageable_copy_ms: float | None = None  # host-to-device copies from pageable memory
    launches: float | None = None  # device events launched
    mean_kernel_us: float | None = None  # their mean device time
    op_calls: float | None = None  # ops run, nested ones counted
    mean_op_us: float | None = None  # their mean host time
    foreach: bool | None = None  # foreach or fused kernels already there
    kernels: list[str] | None = None  # the kernels with the most device time, most first
    fp32_matrix_share: float | None = None  # fp32 GEMM/convolution kernels without tensor cores
    ops: list[str] | None = None  # the ops behind the finding, most important first
    sync_calls: list[str] | None = None  # synchronizing runtime calls, with their count per step
    wait_ms: float | None = None  # host time waiting in them
    alloc_calls: float | None = None  # cudaMalloc/cudaFree calls
    alloc_ms: float | None = None  # their host time
    exposed_ms: float | None = None  # communication time with no compute on any stream
    comm_ms: float | None = None  # communication (collectives') GPU busy time
    overlap: float | None = None  # share of communication time overlapped by compute
    collective: str | None = None  # the kind of collective most exposed: all-reduce, all-to-all, ...
    gpu_busy_ms: float | None = None  # GPU busy time of the mean step (first finding)
    gpu_compute_ms: float | None = None  # the phase's part of the GPU compute time (what it costs when GPU-bound)
    host_critical_ms: float | None = None  # the mean step's host time less its waiting for the GPU (first finding)
    past_host_ms: float | None = None  # how long the GPU work runs on after the host window
    copy_host_ms: float | None = None  # host time in the runtime calls that made pageable copies
    untraced_ms: float | None = None  # host time in the phase with no recorded event
    cpus: int | None = None  # CPUs the training process could use, as the trace records them
    setup_ms: float | None = None  # host time in one-off setup calls (stream/event/handle creation, …)
    step: int | None = None
    step_wall_ms: float | None = None
    median_wall_ms: float | None = None
    noise_ms: float | None = None  # half-width of the steps' noise band
    phase_delta_ms: float | None = None  # how much the phase grew against the median step
    steps: list[int] | None = None
    phases: list[str] | None = None
    eval_ms: float | None = None  # evaluation passes inside the steps' windows, in all
    paused_ms: float | None = None  # prof.paused() blocks inside the steps' windows, in all
    blocked_ms: float | None = None  # host time per step in calls waiting for the device
    blocked_max_ms: float | None = None  # the longest such call of the kind named
    copy: str | None = None  # the device copy the call named waited for (None: a synchronize)
    inputs: str | None = None  # the input shapes of the op that made it
    queued: int | None = None  # launched kernels not yet started when the longest such call began
    queue_stream: str | None = None  # the stream holding most of them
    frame: str | None = None  # the user's code that made that call (with_stack)
    queue: float | None = None  # launched kernels waiting to start, mean over the phase
    #: the time the finding's what-if bound takes off its chain (`Finding.what_if_ms`), per step
    removed_ms: float | None = None


class Finding(Answer, omit_defaults=True):
    """A conclusion drawn from the figures, and the figures it rests on (docs/findings.md lists them).

    ``kind``: what it is about (a short slug); ``phase``: the phase concerned, if one; ``saving_ms``:
    the estimated time per step it could save, where it can be put in one figure; ``share``: that
    time as a share of the mean step; ``evidence``: the figures and op names behind it; ``text``: the
    sentence. Findings come sorted by ``saving_ms``, largest first, notes without a saving last.
    """

    kind: str
    phase: str | None
    saving_ms: float | None
    share: float | None
    evidence: Evidence
    text: str
    #: with what the finding names gone, the step would still take at least this (ms, mean per step):
    #: the critical path's length with that work's time on it set to 0; ``saving_ms`` never exceeds
    #: the mean step less it (null: nothing on the path to remove, or no critical path)
    what_if_ms: float | None = None


class Summary(Answer, omit_defaults=True):
    """A worker's profiled steps in a few numbers, over its non-empty steps; the figures after
    ``findings`` are absent when no step holds work. ``measure``: what the phases are ranked by,
    ``costs``: each phase's cost per step in it (ms); ``dominant_phase``: the first finding's phase.
    ``outliers``: steps beyond the noise band, slow or fast. ``cost_total_ms``: the total the
    costs are shares of, in ``measure`` (the mean step's wall time, or its GPU compute time);
    ``gpu_time``: the mean step's GPU measures (null without GPU).

    ``compiling_steps``: steps in which torch.compile compiled (a ``compile`` phase), left out of the
    means, costs, the slowest step, outliers, top ops and findings, as the training side's summary
    leaves them out (kept when every step compiled). ``eval_ms`` / ``paused_ms``: evaluation passes /
    ``prof.paused()`` blocks inside the profiled steps' windows, in all, kept out of every step.
    ``warmup_steps``: steps whose time went to one-off setup (docs/findings.md), left out as the
    compiling steps are; the tab leaves them out of the chart's scale too. ``noise``: how the steps
    are judged against each other, and the outliers (``outliers`` lists them both ways).
    ``cut_steps``: a trace's last step that the trace's end cut (device work trailing its last host
    event to the trace's end), left out as the warm-up steps are."""

    steps: int
    empty_steps: list[int]
    gpu: bool
    phases: list[str]
    findings: list[Finding]
    mean_wall_ms: float | None = None
    median_wall_ms: float | None = None
    mean: dict[str, PhaseMean] | None = None
    dominant_phase: str | None = None
    measure: Measure | None = None
    costs: dict[str, float] | None = None
    cost_total_ms: float | None = None
    slowest: Slowest | None = None
    outliers: list[int] | None = None
    top_ops: list[MeanOp] | None = None
    inferred_phases: list[str] | None = None
    gpu_time: GpuTime | None = None
    compiling_steps: list[int] | None = None
    warmup_steps: list[int] | None = None
    noise: StepNoise | None = None
    cut_steps: list[int] | None = None
    eval_ms: float | None = None
    paused_ms: float | None = None
    #: the mean step's critical path over the steps kept (each figure a mean per step, no segments)
    critical_path: CriticalPath | None = None


class StepsAnswer(Answer):
    """``GET /steps``: every step of one worker, and its summary."""

    table = "steps"

    run: str
    worker: str
    workers: list[str]
    phases: list[str]
    gpu: bool
    steps: list[StepRow]
    summary: Summary


# --- the whole run, from the every-step scalars ----------------------------------------------------


class PhaseSpread(Answer):
    """One phase's (or the step's) time per step over every timed step of the run."""

    phase: str  # a phase, or "step"
    clock: Literal["host", "gpu"]
    steps: int  # steps with a value
    mean_ms: float
    median_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    total_s: float


class SlowStep(Answer):
    """One of the slowest steps of the run: its host time per phase, and the phase furthest above
    its own median."""

    step: int
    wall_ms: float
    phases: dict[str, float]
    phase: str
    phase_over_median_ms: float


class ApartTime(Answer):
    """Time the run spent outside every step's time: evaluation passes (``phaseprof/eval_ms``), the
    profiler's own (``phaseprof/profiler_ms``) or the training hook's own (``phaseprof/hook_ms``,
    in the steps' windows but in no phase). ``steps``: the steps that had some (for evaluation,
    the passes); ``median_ms`` over those; ``max_step``: where the most was (an evaluation pass is
    written at the step it precedes); ``share``: of the run's wall time (steps, evaluation and
    profiler together)."""

    total_ms: float
    steps: int
    median_ms: float
    max_ms: float
    max_step: int
    share: float


class WholeRun(Answer):
    """Every steady step of one writer of scalars: the run, or one of its ranks. ``steps``,
    ``phases`` and ``slowest`` leave out the first step and the steps that compiled, as the summary
    printed on close does (`phaseprof.steady`); ``left_out`` says which, in words (empty: none);
    ``first_step`` and ``last_step`` are the run's. Evaluation and the profiler's time count in full."""

    rank: int | None
    steps: int
    first_step: int
    last_step: int
    phases: list[PhaseSpread]
    slowest: list[SlowStep]
    profiler: ApartTime | None
    eval: ApartTime | None
    left_out: list[str] = msgspec.field(default_factory=list)
    hook: ApartTime | None = None


# --- ranks and the timeline -----------------------------------------------------------------------


class RankRow(Answer):
    """A worker's mean step, in the measure of its `RanksAnswer` (``measure``). Host: ``step_ms`` is
    the wall time, ``comm_ms`` the host time in collectives, ``compute_ms`` the step less them, and
    ``phase_compute_ms`` each phase's host time less its collectives. GPU: ``step_ms`` is GPU busy,
    ``comm_ms`` communication time, ``compute_ms`` GPU compute time and ``phase_compute_ms`` each
    phase's part of it (`GpuTime`). ``exposed_comm_ms``: communication no compute overlapped (GPU; 0
    in host measure). ``wall_ms`` is always the host wall time. Never negative."""

    worker: str
    rank: int | None
    steps: int
    wall_ms: float
    step_ms: float
    phases: dict[str, Times]
    compute_ms: float
    phase_compute_ms: dict[str, float]
    comm_ms: float
    exposed_comm_ms: float


class Straggler(Answer):
    """The rank whose compute (its steps less collectives) is beyond the other ranks' noise band
    (``noise_ms`` above their median); ``waited_for`` when the others also spend that much longer in
    collectives. ``phase``: where its compute is longest against the median of the other ranks."""

    worker: str
    rank: int | None
    wall_ms: float
    behind_median_ms: float
    comm_ms: float
    median_comm_ms: float
    waited_for: bool
    reason: str
    phase: str
    phase_behind_ms: float
    noise_ms: float


class RanksAnswer(Answer):
    """``GET /ranks``: each worker of a run side by side, and the straggler: null with fewer than two
    ranks, too few steps in a rank, or ranks even within noise; ``note`` says which.
    ``measure``: ``gpu`` when every rank has device activity (every figure then GPU time), else
    ``host``. ``world_size``: as the traces record it (``distributedInfo``); ``missing_ranks``: ranks
    of that world with no trace here. ``not_ranks``: workers left out of the comparison as other files
    of a worker already listed (the same recorded rank, or the same steps at the same instants: one
    run exported several ways). ``whole_run``: every timed step of each rank that wrote per-step
    scalars."""

    table = "ranks"

    run: str
    phases: list[str]
    ranks: list[RankRow]
    straggler: Straggler | None
    note: str
    measure: Measure
    world_size: int | None
    missing_ranks: list[int]
    not_ranks: list[str]
    whole_run: list[WholeRun] = msgspec.field(default_factory=list)


#: A value per step, aligned with `TimelineAnswer.steps`; null where a step has none.
Series = list[float | None]


class TimelineAnswer(Answer):
    """``GET /timeline``: every step's phase times from the per-step scalars, and the profiled
    windows as ``[first, last]`` step pairs. ``eval``: host time of the evaluation passes run before
    each step (``phaseprof/eval_ms``); ``profiler``: the profiler's own time after each step
    (``phaseprof/profiler_ms``): both outside every step's time, never part of ``wall`` or a phase.
    ``hook``: the training hook's own time in each step (``phaseprof/hook_ms``), in no phase and not
    in ``wall`` either; null for runs written before it was measured."""

    run: str
    phases: list[str]
    steps: list[int]
    cpu: dict[str, Series]
    gpu: dict[str, Series]
    wall: Series
    wall_gpu: Series
    eval: Series
    profiler: Series
    profiled: list[tuple[int, int]]
    downsampled: bool
    hook: Series | None = None


# --- where in the code: modules ----------------------------------------------------------------------


class ModuleOp(Answer):
    """An op of a module: a forward op no other op of the module encloses, or (``backward``) a gradient
    function of one of its forward ops; host time with its children ops, GPU time it launched."""

    name: str
    backward: bool
    calls: int
    host_ms: float
    gpu_ms: float


class ModuleRow(Answer):
    """One ``nn.Module`` (by path, e.g. ``Net.encoder.layers.3``) over the chosen steps: its calls'
    forward time (host: the calls' wall time; GPU: device time of the work launched inside them),
    backward time (its gradient functions', found through the autograd link), both with its children's
    (``forward_self_ms``: without); its ops, most time first."""

    path: str
    parent: str | None  # the module around its first call; None at top level
    depth: int
    calls: int
    forward_ms: float
    forward_self_ms: float
    forward_gpu_ms: float
    backward_ms: float
    backward_gpu_ms: float
    forward_ms_per_step: float
    backward_ms_per_step: float
    ops: list[ModuleOp]


class ModulesAnswer(Answer):
    """Modules over one step or every profiled step (``/modules``), most forward plus backward host time
    first. ``source``: where the module calls came from (phaseprof's ranges with
    ``PhaseProfiler(modules=True)``, or torch's ``with_modules`` records), "" when none was recorded."""

    table = "modules"

    run: str
    worker: str
    step: int | None  # None: every profiled step
    steps: int
    source: str
    forward_phase_ms: float  # the steps' forward phase host time, what the top-level modules' forward is part of
    has_gpu: bool
    modules: list[ModuleRow]
    #: over every profiled step: the steps left out as the summary leaves them out (warm-up and
    #: compiling steps, `Summary.warmup_steps`, `compiling_steps`), and why, in one sentence
    left_out: list[int]
    left_out_why: str | None


# --- the report (CLI and `analyze()`) -------------------------------------------------------------


class WorkerReport(Answer, omit_defaults=True):
    """A worker in the report: its steps and summary; ``detail`` when one step was asked for."""

    worker: str
    rank: int | None
    world_size: int | None
    gpu: bool
    gpu_names: list[str]
    spans: list[str]
    steps: list[StepRow]
    summary: Summary
    detail: StepDetail | None = None
    kernels: KernelsAnswer | None = None  # with ``--kernels``: over the step asked for, or every step
    modules: ModulesAnswer | None = None  # with ``--modules``: over the step asked for, or every step


class RunReport(Answer, omit_defaults=True):
    run: str
    workers: list[WorkerReport]
    whole_run: list[WholeRun]  # from the run's scalars; one entry per rank that wrote them
    # with ``--collectives``: ``/collectives``' answer over the run's ranks, the step asked for or every step
    collectives: CollectivesAnswer | None = None


class Report(Answer):
    """``phaseprof report --json`` and `phaseprof.analyze`: runs, workers, steps, summaries, errors."""

    runs: list[RunReport]
    errors: list[FileError]


# --- the regression gate (``phaseprof compare``) ---------------------------------------------------


class Change(Answer):
    """One figure (a phase's time per step, or the step's) on both sides: medians per step, the
    change and its confidence interval; ``slower``/``faster``: by more than the threshold, with
    confidence. Where the base is 0, ``change`` is null and the interval is of the delta as a share
    of the base step. ``high`` is infinite (null in JSON, beside a ``low``) where some draws of the
    base are 0: the change has no upper bound. ``comparable`` is false for a figure only one side
    recorded (a phase the other never ran, GPU time on one side only): its missing side reads 0 ms,
    and it has no change, no interval, and is never slower or faster."""

    phase: str
    clock: Literal["host", "gpu"]
    base_ms: float
    new_ms: float
    delta_ms: float
    change: float | None
    low: float | None
    high: float | None
    base_steps: int
    new_steps: int
    slower: bool
    faster: bool
    comparable: bool = True


class GateSide(Answer):
    """What one side of ``phaseprof compare`` was made of. ``steps`` are its steady steps: ``left_out``
    says which were not, in words (empty: none) — from the scalars the first step and the compiling
    ones (`phaseprof.steady`, prefixed with the run or rank when they differ between them), from the
    traces the compiling and warm-up steps."""

    path: str
    runs: list[str]
    workers: int
    steps: int
    has_scalars: bool
    has_traces: bool
    left_out: list[str] = msgspec.field(default_factory=list)


class GateReport(Answer):
    """``phaseprof compare --json``: exit status 1 when ``slower`` names any figure."""

    base: GateSide
    new: GateSide
    source: Literal["scalars", "traces"]
    threshold: float
    confidence: float
    min_share: float
    changes: list[Change]
    slower: list[str]
    ops: list[ChangedOp]
    errors: list[FileError]


# --- below the phase: a step's trace, kernels, every op of a run, memory over a step --------------


class TraceEvent(Answer, omit_defaults=True):
    """One Chrome-trace event: ``X`` complete (µs on the trace's clock), ``s`` / ``f`` the start and
    end of a flow (launch -> device work), ``M`` metadata (thread and process names)."""

    ph: str
    name: str
    pid: int | str
    tid: int | str
    ts: float | None = None
    dur: float | None = None
    cat: str | None = None
    id: int | None = None
    bp: str | None = None
    args: dict[str, Any] | None = None


class StepTraceInfo(Answer):
    """What a step trace holds: which step, its host window (µs), its phases, how many events."""

    step: int
    start_us: float
    end_us: float
    phases: list[str]
    host_events: int
    device_events: int


class StepTrace(Answer):
    """One step as a Chrome-trace JSON object (``/trace``), as chrome://tracing and Perfetto open it."""

    traceEvents: list[TraceEvent]  # noqa: N815 - the format's own field names
    otherData: StepTraceInfo  # noqa: N815
    displayTimeUnit: str = "ms"  # noqa: N815


class KernelRow(Answer):
    """One kernel (or copy, or set) name over the chosen steps and phase; times in µs."""

    name: str
    kind: Literal["kernel", "memcpy", "memset"]
    calls: int
    total_us: float
    mean_us: float
    max_us: float
    share: float  # of the GPU time of the chosen steps and phase
    op: str  # the op that launched most of its time
    phase: str  # the phase that launched most of its time
    ops: list[str]  # every launching op, most time first
    phases: list[str]  # every launching phase, most time first
    # The launch, where the trace records it (kernels; null for copies and sets, and older traces):
    blocks_per_sm: float | None  # "blocks per SM", mean weighted by each call's duration
    occupancy: float | None  # "est. achieved occupancy %", mean weighted by each call's duration
    grid: list[int] | None  # [x, y, z] of the longest call
    block: list[int] | None  # [x, y, z] threads per block, of the longest call
    registers: int | None  # per thread, of the longest call
    shared_memory: int | None  # bytes per block, of the longest call
    tensor_cores: bool | None  # whether it runs on tensor cores, from its name (`kernels.uses_tensor_cores`)


class KernelsAnswer(Answer):
    """Device work by name over one step or every profiled step (``/kernels``)."""

    table = "kernels"

    run: str
    worker: str
    step: int | None  # None: every profiled step
    phase: str | None  # None: every phase
    steps: int  # how many steps the figures cover
    gpu_us: float  # their kernel time (summed over streams; in the phase): what ``share`` divides
    kernels: list[KernelRow]
    #: over every profiled step: the steps left out as the summary leaves them out (warm-up and
    #: compiling steps, `Summary.warmup_steps`, `compiling_steps`), and why, in one sentence
    left_out: list[int]
    left_out_why: str | None


class RunOpRow(OpTimes, omit_defaults=True):
    """One op (or op and input shapes) summed over a worker's profiled steps; with
    ``group=shapes`` its ``shapes`` are the input shapes ("" where not recorded)."""

    calls_per_step: float  # means over the profiled steps, including those where it did not run
    self_host_ms_per_step: float
    self_gpu_ms_per_step: float
    self_host_share: float  # of the steps' host (wall) time
    self_gpu_share: float | None  # of the steps' GPU time; None without GPU activity
    steps: list[int]  # step numbers it ran in
    phases: list[str]  # phases it ran in, most self host time first
    stack: list[str] = msgspec.field(default_factory=list)  # as `OpRow.stack`
    frame: str | None = None


class OpsAnswer(Answer):
    """Every op of a worker over its profiled steps (``/ops``), most self host time first."""

    table = "ops"

    run: str
    worker: str
    phase: str | None  # None: every phase
    group: Literal["name", "shapes"]  # one row per op name, or per op name and input shapes
    steps: int  # profiled (non-empty) steps the figures cover
    wall_ms: float  # their host time, in the phase when one is chosen
    gpu_ms: float  # their GPU time, in the phase when one is chosen
    ops: list[RunOpRow]
    #: over every profiled step: the steps left out as the summary leaves them out (warm-up and
    #: compiling steps, `Summary.warmup_steps`, `compiling_steps`), and why, in one sentence
    left_out: list[int]
    left_out_why: str | None


class MemorySeries(Answer):
    """One memory device's curve over a step; times in ms from the step's start."""

    device: str
    t_ms: list[float]
    allocated: list[int]  # bytes after each point's event
    reserved: list[int] | None  # bytes the caching allocator held; None where the trace lacks it
    peak_bytes: int
    peak_ms: float
    #: the bytes count memory allocated before the trace's first memory event; false: they start at
    #: zero there (what was allocated before profiling began, e.g. the model's weights, is not in them)
    baseline: bool


class MemoryAnswer(Answer):
    """Memory over one step (``/memory``), with the loop thread's phases beneath; ``apart``: time in
    the step's window kept out of the step (its memory events are in no phase and not drawn)."""

    run: str
    worker: str
    step: int
    wall_ms: float
    recorded: bool  # the worker's traces hold memory events at all (``profile_memory=True``)
    devices: list[MemorySeries]
    bands: list[tuple[float, float, str]]  # (from ms, to ms, phase)
    apart: list[ApartBand]


# --- captures: traces of the next steps of a running job -------------------------------------------

#: Where a rank stands with a capture request: not answered yet, then `phaseprof.capture_channel`'s states.
RankCaptureState = Literal["waiting", "accepted", "tracing", "written", "refused"]
#: Where a request stands over its ranks: ``partial`` when some wrote their trace and some refused.
CaptureState = Literal["waiting", "tracing", "written", "refused", "partial"]


class RankCapture(Answer):
    """One rank's answer to a capture request."""

    rank: int
    state: RankCaptureState
    first: int | None  # the steps it traces (or traced), inclusive
    last: int | None
    files: list[str]  # its trace files, in the run directory
    reason: str | None  # why refused, or what shortened the trace


class SlowdownWhy(Answer):
    """Why the slowdown trigger asked: the last steps' host times against the steps before them."""

    rank: int
    steps: list[int]
    step_ms: list[float]
    median_ms: float
    band_ms: float  # the noise band around the median (`phaseprof.noise`)


class CaptureInfo(Answer):
    """A request for a trace of a run's next steps, and its ranks' answers."""

    id: str
    by: Literal["cli", "tab", "slowdown"]
    written: float  # seconds since the epoch
    first: int  # the steps asked, inclusive
    last: int
    ranks: list[int] | None  # None: every rank
    why: SlowdownWhy | None  # the slowdown's figures, for captures the run took by itself
    state: CaptureState
    answers: list[RankCapture]  # every rank asked, in rank order


class CaptureAnswer(Answer):
    """A run's captures (newest first), and whether a capture can be asked now (else why not)."""

    run: str
    can_ask: bool
    reason: str | None  # why not: the run ended, is not watched, another capture is running, read-only
    step: int | None  # the step the fastest running rank is at
    active: int | None  # the most steps one capture traces (the configured window)
    asked: str | None  # the id of the request this answer's POST wrote
    captures: list[CaptureInfo]



# --- collectives and the ranks' GPU time (``/collectives``) ----------------------------------------


class CollectiveRow(Answer):
    """One kind of collective, process group and message size of a worker over the chosen steps.

    A call's time (ms) is its device work's, first start to last end, where it launched any (``on_gpu``),
    else its host range: on the GPU it includes the time the kernel waited for the other ranks. ``bytes``
    is the message size as nccl-tests counts it (the larger of the input and output, from the
    ``record_param_comms`` element counts and type); ``algbw_gbps`` is bytes over time (GB/s, 1e9
    bytes), ``busbw_gbps`` that times nccl-tests' factor for the kind and group size (all_reduce
    2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send/recv 1); null
    where the size, the group size or the factor is unknown, or the time is 0."""

    worker: str
    rank: int | None
    kind: str
    group: str
    group_size: int | None
    bytes: int | None
    calls: int
    time_ms: float
    mean_ms: float
    max_ms: float
    kernel_ms: float  # device time of its work, summed over streams
    on_gpu: bool
    algbw_gbps: float | None
    busbw_gbps: float | None


class GpuBreakdown(Answer):
    """Where a rank's time went, ms. GPU measure: ``compute_ms`` and ``comm_ms`` are `GpuTime`'s
    compute and communication (each instant counted once), ``overlap_ms`` the communication that ran
    while compute ran (communication less its exposed part), ``memory_ms`` copies and sets running
    with neither (`GpuTime.exposed_memory_ms`: compute + comm - overlap + memory is GPU busy),
    ``other_ms`` host time with no device work running (GPU idle). Host measure (no GPU):
    communication is the host time in collective ops, compute the rest of the host time, overlap,
    memory and other 0."""

    compute_ms: float
    comm_ms: float
    overlap_ms: float
    other_ms: float
    memory_ms: float


class BreakdownStep(Answer):
    step: int
    total: GpuBreakdown
    phases: dict[str, GpuBreakdown]


class RankBreakdown(Answer):
    """One rank's breakdown per step and phase (``measure``: ``gpu`` when it ran on a GPU)."""

    worker: str
    rank: int | None
    measure: Measure
    steps: list[BreakdownStep]


class CollectiveWait(Answer):
    """One collective matched across ranks: the rank that arrived last (its work started last) is the
    one the others waited for. ``arrivals_ms``: per worker, how long after the first arrival it came."""

    step: int
    kind: str
    group: str
    position: int  # its sequence number in the group, or its place among the step's calls of the group
    last_worker: str
    last_rank: int | None
    spread_ms: float  # first to last arrival
    arrivals_ms: dict[str, float]


class WaitedFor(Answer):
    """How often a rank arrived last at a collective matched across ranks, and the others' waiting for
    it (the sum over those collectives of each other rank's arrival to its own)."""

    worker: str
    rank: int | None
    matched: int
    last: int
    caused_ms: float


class CollectivesAnswer(Answer):
    """``GET /collectives``: the collective table of a worker (or of every worker), each rank's time as
    compute / communication / overlap / other per step and phase, and, with several ranks' traces, the
    rank everyone waits for. ``matched_by`` says how collectives were matched across ranks: ``seq`` (the
    traces' sequence numbers in each process group), ``order`` (step number, process group, and place
    among that step's collectives of the group), or ``none`` (fewer than two ranks)."""

    table = "collectives"

    run: str
    step: int | None
    worker: str | None
    collectives: list[CollectiveRow]
    ranks: list[RankBreakdown]
    waited_for: list[WaitedFor]
    waits: list[CollectiveWait]  # the longest spreads first, at most 100
    matched_by: Literal["seq", "order", "none"]
    note: str



# --- memory events and memory by op (``/memory_events``) ------------------------------------------


class MemoryOpRow(Answer):
    """One op's memory over one step and device, bytes. ``*_self``: the events in the op itself;
    ``*_total``: with those of the ops it called. ``peak_*``: the highest its running sum of bytes
    reached over its events in time order (its largest call's), 0 where it only freed."""

    op: str  # "(no op)": events outside every op
    events: int
    allocated_self: int
    freed_self: int
    peak_self: int
    allocated_total: int
    freed_total: int
    peak_total: int


class MemoryEventRow(Answer):
    """One allocation (``bytes`` > 0) or free (< 0): ms from the step's start, the block's address
    (null: not recorded), the op that made it, and the bytes allocated after it."""

    t_ms: float
    bytes: int
    addr: int | None
    op: str
    allocated: int


class MemoryDevice(Answer):
    """One device's memory events and per-op table over one step; ``left_out``: events not listed
    (beyond the most kept, the smallest); ``peak_op``: the op at the step's peak."""

    device: str
    ops: list[MemoryOpRow]
    events: list[MemoryEventRow]
    left_out: int
    peak_bytes: int | None
    peak_ms: float | None
    peak_op: str | None


class MemoryEventsAnswer(Answer):
    """``GET /memory_events``: one step's allocation and free events and memory by op, per device.
    Without ``step`` (null), memory by op over every profiled step: ``steps`` kept, events and bytes
    summed over them, each peak the highest step's, no events listed; the steps left out as the
    summary leaves them out (warm-up, compiling and cut steps) in ``left_out``, and why."""

    run: str
    worker: str
    step: int | None
    devices: list[MemoryDevice]
    steps: int = 1
    left_out: list[int] = msgspec.field(default_factory=list)
    left_out_why: str | None = None

#: Every answer a client receives, for the generated TypeScript types and the schema checks.
ANSWERS = (RunsAnswer, StepsAnswer, StepDetail, TimelineAnswer, CompareAnswer, RanksAnswer, Report, GateReport,
           StepTrace, KernelsAnswer, OpsAnswer, MemoryAnswer, CaptureAnswer,
           CollectivesAnswer, MemoryEventsAnswer, ModulesAnswer)

"""The file contract between the training side and the TensorBoard side.

Both sides import this module and nothing else of each other: the files under the logdir are their
only link. It must stay free of torch (and of anything heavy) because TensorBoard imports it at start-up.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Phase(NamedTuple):
    """A canonical phase: its name, its colour in every view, and the range names that mark it.

    ``aliases`` are regular expressions a whole range name must match (besides the hook's own
    ``phaseprof::<name>``): conventions in the wild and torch's automatic annotations.
    """

    name: str
    colour: str
    aliases: tuple[str, ...] = ()


#: Prefix of Lightning's profiler actions (``[pl][profile]<action>``): an action's last part names it.
_PL = r"\[pl\]\[profile\](?:.*[.\]])?"

DATA, FORWARD, BACKWARD, OPTIMIZER, OTHER = "data", "forward", "backward", "optimizer", "other"

#: The canonical phases in step (and display) order, with their colours and range aliases: the one
#: list the analysis, the terminal and the tab (through ``/runs``) read. Adding a phase is one entry.
PHASE_REGISTRY = (
    Phase(DATA, "#26a69a", (
        r"(?i:##\s*(?:data|data_load)\s*##)", r"(?i:data)",
        _PL + r"train_dataloader_next", r"enumerate\(DataLoader\)#.*",
    )),
    Phase(FORWARD, "#42a5f5", (
        r"(?i:##\s*forward\s*##)", r"(?i:forward)",
        _PL + r"training_step", r"(?:DistributedDataParallel|FullyShardedDataParallel)\.forward",
    )),
    Phase(BACKWARD, "#ffa726", (
        r"(?i:##\s*backward\s*##)", r"(?i:backward)",
        _PL + r"backward",
    )),
    Phase(OPTIMIZER, "#66bb6a", (
        r"(?i:##\s*(?:optimizer|zero_grad)\s*##)", r"(?i:optimizer)",
        _PL + r"optimizer_(?:step|zero_grad)", r"Optimizer\.(?:step|zero_grad)#.*",
    )),
    Phase(OTHER, "#9e9e9e"),
)

#: Phases a framework callback names for the framework's own wrappers around the user's phases
#: (Lightning's ``manual_backward``, the HF Trainer's ``training_step``): named phases like a
#: user's, listed only where they ran, with colours of their own. Older runs read as before.
LIGHTNING, TRANSFORMERS = "lightning", "transformers"
FRAMEWORK_PHASES = (Phase(LIGHTNING, "#7e57c2"), Phase(TRANSFORMERS, "#e6c229"))

#: Colours of the user's own phases: each takes one by a hash of its name (FNV-1a), so a phase keeps
#: its colour whatever order phases appear in.
USER_PHASE_COLOURS = ("#ab47bc", "#ec407a", "#8d6e63", "#5c6bc0", "#d4e157", "#26c6da", "#ffca28", "#78909c")

#: Canonical phases, in step order. Every instant of a step belongs to exactly one phase.
PHASES = tuple(p.name for p in PHASE_REGISTRY)


def phase_colour(phase: str) -> str:
    """The colour of ``phase`` in every view: the registry's, else one picked by its name."""
    for p in PHASE_REGISTRY + FRAMEWORK_PHASES:
        if p.name == phase:
            return p.colour
    h = 2166136261  # FNV-1a over UTF-16 code units, as the tab computes it
    units = phase.encode("utf-16-le", "surrogatepass")  # code units as JavaScript sees them, lone surrogates too
    for k in range(0, len(units), 2):
        h = ((h ^ (units[k] | units[k + 1] << 8)) * 16777619) & 0xFFFFFFFF
    return USER_PHASE_COLOURS[h % len(USER_PHASE_COLOURS)]


#: Time the hook keeps out of every training step: evaluation passes between training steps, and
#: what the user wraps in ``with prof.paused():``. They carry ranges of these names in traces.
EVAL = "eval"
PAUSED = "paused"
OUT_OF_STEP = (EVAL, PAUSED)
#: The time ``torch.compile`` spent compiling, inside the step that triggered it.
COMPILE = "compile"

#: Top-level key of a trace (written by the hook through torch.profiler's ``add_metadata_json``) whose
#: value says how many CPUs the training process's machine has and may use:
#: ``{"count": os.cpu_count(), "usable": len(os.sched_getaffinity(0))}`` ("usable" where the OS says).
CPUS_KEY = "phaseprof_cpus"

#: Prefix of every `record_function` / NVTX range the training hook writes. A range named
#: ``RANGE_PREFIX + name`` marks phase ``name``: a canonical one or any name the user chose.
RANGE_PREFIX = "phaseprof::"


def range_name(phase: str) -> str:
    """The range name the hook writes for ``phase`` (e.g. ``phaseprof::forward``)."""
    return RANGE_PREFIX + phase


#: ``MODULE_RANGE_PREFIX + path`` marks one call of the module at ``path`` (``PhaseProfiler(modules=True)``):
#: the attached model's class name, then the module's qualified name in it (``Net.encoder.layers.3``).
#: Not under `RANGE_PREFIX`: a module is no phase.
MODULE_RANGE_PREFIX = "phaseprof.module::"


def module_range_name(path: str) -> str:
    return MODULE_RANGE_PREFIX + path


#: Scalar tags written every step under the run's event file. CPU figures are host-clock times; GPU
#: figures are CUDA-event times resolved a few steps later.
SCALAR_PREFIX = "phaseprof/"
STEP_TAG = SCALAR_PREFIX + "step_ms"
STEP_GPU_TAG = SCALAR_PREFIX + "step_gpu_ms"
#: Host time of the evaluation passes that ended in the step, each whole (a pass begun before the
#: previous ``prof.step()`` included): written at the step they precede; in no step's time.
EVAL_TAG = SCALAR_PREFIX + "eval_ms"
#: The profiler's own time at the end of a step: torch.profiler's step, and writing the trace at the
#: end of an active window. Not part of any step's time.
PROFILER_TAG = SCALAR_PREFIX + "profiler_ms"
#: The training hook's own time in a step (its bookkeeping, trace ranges and CUDA marks, the
#: handover at the step boundary): kept out of every phase and of ``step_ms``, written beside them.
HOOK_TAG = SCALAR_PREFIX + "hook_ms"
#: Tags under the prefix that are not a phase's.
NOT_PHASE_TAGS = (EVAL_TAG, PROFILER_TAG, HOOK_TAG)


def host_tag(phase: str) -> str:
    """Scalar tag of a phase's host time per step, e.g. ``phaseprof/forward_ms``."""
    return f"{SCALAR_PREFIX}{phase}_ms"


def gpu_tag(phase: str) -> str:
    """Scalar tag of a phase's device time per step, e.g. ``phaseprof/forward_gpu_ms``."""
    return f"{SCALAR_PREFIX}{phase}_gpu_ms"


_TAG_RE = re.compile(r"^phaseprof/(?P<phase>.+?)(?P<gpu>_gpu)?_ms$")


def parse_tag(tag: str) -> tuple[str, bool] | None:
    """``(phase, is_gpu)`` for a phaseprof scalar tag, ``("step", …)`` for the step total, else None
    (also for `NOT_PHASE_TAGS`)."""
    if tag in NOT_PHASE_TAGS:
        return None
    m = _TAG_RE.match(tag)
    if not m:
        return None
    return m.group("phase"), bool(m.group("gpu"))


def validate_phase_name(name: str) -> str:
    """``name`` if it can name a phase, else ValueError.

    A phase's scalar tags must read back as that phase: ``step`` is the step total's tag and a name
    ending in ``_gpu`` would read as the GPU time of another phase. ``eval``, ``paused``,
    ``profiler`` and ``hook`` name time outside the phases.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a phase name must be a non-empty string, not {name!r}")
    if name in OUT_OF_STEP or host_tag(name) in NOT_PHASE_TAGS:
        raise ValueError(f"{name!r} cannot name a phase: it names time kept outside the training steps")
    if name == "step" or parse_tag(host_tag(name)) != (name, False) or parse_tag(gpu_tag(name)) != (name, True):
        raise ValueError(f"{name!r} cannot name a phase: its scalar tags would read as another phase "
                         "('step' is the step total; names may not end in '_gpu')")
    return name


#: Trace files written by ``torch.profiler.tensorboard_trace_handler``: ``<worker>[.<time_ns>].pt.trace.json[.gz]``.
TRACE_FILE_RE = re.compile(r"^(?P<worker>.*?)(?:\.(?P<span>\d+))?\.pt\.trace\.json(?:\.gz)?$")


def trace_file_name(worker: str, time_ns: int, gzip: bool) -> str:
    """The name ``tensorboard_trace_handler`` gives a span's trace: ``<worker>.<time_ns>.pt.trace.json[.gz]``."""
    return f"{worker}.{time_ns}.pt.trace.json" + (".gz" if gzip else "")


#: Other JSON files that may hold a trace (``export_chrome_trace`` output, sampled traces): read when
#: their first bytes look like a Chrome trace.
JSON_FILE_RE = re.compile(r"^(?P<worker>.+?)\.json(?:\.gz)?$")

#: Event file of the per-step scalars (TensorBoard's own naming).
EVENT_FILE_MARKER = "tfevents"

#: Folder inside a run directory holding each trace's analysis (``<trace file name>.analysis``), written
#: beside the traces by the training side (at the source) or by the first reader; never a run itself.
ANALYSIS_DIR = ".phaseprof"

#: Folder inside a run directory of the capture channel (`phaseprof.capture_channel`): each running
#: rank's heartbeat, the requests for a trace of the next steps, and the ranks' answers.
CAPTURE_DIR = ANALYSIS_DIR + "/capture"

#: Under torch.distributed every rank writes its per-step scalars into a TensorBoard run of its own
#: inside the run directory, ``<run>/rank<N>/`` (TensorBoard overlays the ranks in each chart); a
#: process outside torch.distributed writes them into the run directory itself.
RANK_SCALARS_RE = re.compile(r"^rank(?P<rank>\d+)$")


def rank_scalars_dir(rank: int) -> str:
    """The folder, inside the run directory, of rank ``rank``'s scalars."""
    return f"rank{rank}"

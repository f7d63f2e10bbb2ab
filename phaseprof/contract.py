"""The file contract between the training side and the TensorBoard side.

Both sides import this module and nothing else of each other: the files under the logdir are their
only link. It must stay free of torch (and of anything heavy) because TensorBoard imports it at start-up.
"""

from __future__ import annotations

import re

#: Canonical phases, in step order. Every instant of a step belongs to exactly one phase.
DATA = "data"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
OTHER = "other"
PHASES = (DATA, FORWARD, BACKWARD, OPTIMIZER, OTHER)

#: Prefix of every `record_function` / NVTX range the training hook writes. A range named
#: ``RANGE_PREFIX + name`` marks phase ``name``: a canonical one or any name the user chose.
RANGE_PREFIX = "phaseprof::"


def range_name(phase: str) -> str:
    """The range name the hook writes for ``phase`` (e.g. ``phaseprof::forward``)."""
    return RANGE_PREFIX + phase


#: Scalar tags written every step under the run's event file. CPU figures are host-clock times; GPU
#: figures are CUDA-event times resolved a few steps later.
SCALAR_PREFIX = "phaseprof/"
STEP_TAG = SCALAR_PREFIX + "step_ms"
STEP_GPU_TAG = SCALAR_PREFIX + "step_gpu_ms"


def cpu_tag(phase: str) -> str:
    """Scalar tag of a phase's host time per step, e.g. ``phaseprof/forward_ms``."""
    return f"{SCALAR_PREFIX}{phase}_ms"


def gpu_tag(phase: str) -> str:
    """Scalar tag of a phase's device time per step, e.g. ``phaseprof/forward_gpu_ms``."""
    return f"{SCALAR_PREFIX}{phase}_gpu_ms"


_TAG_RE = re.compile(r"^phaseprof/(?P<phase>.+?)(?P<gpu>_gpu)?_ms$")


def parse_tag(tag: str) -> tuple[str, bool] | None:
    """``(phase, is_gpu)`` for a phaseprof scalar tag, ``("step", …)`` for the step total, else None."""
    m = _TAG_RE.match(tag)
    if not m:
        return None
    return m.group("phase"), bool(m.group("gpu"))


def validate_phase_name(name: str) -> str:
    """``name`` if it can name a phase, else ValueError.

    A phase's scalar tags must read back as that phase: ``step`` is the step total's tag and a name
    ending in ``_gpu`` would read as the GPU time of another phase.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a phase name must be a non-empty string, not {name!r}")
    if name == "step" or parse_tag(cpu_tag(name)) != (name, False) or parse_tag(gpu_tag(name)) != (name, True):
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

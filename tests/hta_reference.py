"""The GPU figures of a trace from its raw events, in plain Python, the way Holistic Trace Analysis
(HTA 0.5.0) computes them and the way phaseprof does, one choice at a time: the reasons
benchmarks/hta_agreement.py gives for each difference between the two, and what
tests/test_hta_agreement.py checks them with.

The three choices where the two differ:

- ``rounded``: HTA rounds each event of a trace with fractional µs to whole µs (start up, end down:
  ``round_down_time_stamps``), so every event loses up to 2 µs; phaseprof keeps the exact times.
- ``scope``: HTA keeps the device work launched by a host event that starts before the last
  ProfilerStep ends (``include_last_profiler_step=True``; all of it with at most one ProfilerStep);
  phaseprof the work launched inside its steps' host windows (``windows``).
- ``kinds``: HTA sorts device events by name alone (``^nccl.*Kernel`` communication, ``^Memcpy``,
  ``^Memset`` memory, the rest compute, CUDA's ``Stream Wait Event`` included); phaseprof counts
  kernels, copies and sets only, and communication is also any work launched under a collective op
  (``record_param_comms``), memory any copy or set that is no collective's.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import math
import re
from collections import defaultdict
from decimal import Decimal

#: HTA's kinds, by name (``hta.utils.utils``)
HTA_COMM = re.compile(r"^nccl.*Kernel")
HTA_MEMORY = re.compile(r"^Memcpy|^Memset|^dma")
HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
#: phaseprof's kinds (plugin/analysis/span.py)
COMM_KERNEL = re.compile(r"nccl|rccl|gloo", re.I)
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
COPY = ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset")
RUNTIME = ("cuda_runtime", "cuda_driver", "Runtime")
HOST_OPS = ("cpu_op", "user_annotation", "Operator")
FIGURES = ("busy", "compute", "comm", "memory")


def load(path) -> list[dict]:
    """The trace's complete events, ``ts`` and ``dur`` exact (Decimal µs)."""
    with gzip.open(path, "rt") as f:
        raw = json.load(f, parse_float=Decimal)
    listed = raw["traceEvents"] if isinstance(raw, dict) else raw
    events = [e for e in listed if e.get("ph") == "X" and "ts" in e]
    for e in events:
        e["ts"], e["dur"] = Decimal(e["ts"]), Decimal(e.get("dur", 0))
    return events


@functools.cache
def load_once(path) -> list[dict]:
    """`load`, once a session per trace: the tests' callers only read the events (`device_work`
    rounds copies), and parsing a large trace with exact decimals is seconds."""
    return load(path)


def _round(events: list[dict]) -> None:
    """HTA's rounding, when any start holds a fraction of a µs: start up, end down, on float64 µs
    as HTA holds them (0.25 µs coarse near the epoch: an end may round up a quarter first)."""
    if all(e["ts"] == e["ts"].to_integral_value() for e in events):
        return
    for e in events:
        end = float(e["ts"]) + float(e["dur"])
        e["ts"] = Decimal(math.ceil(float(e["ts"])))
        e["dur"] = Decimal(math.floor(end)) - e["ts"]


def union(intervals) -> list[tuple]:
    """The union of ``[a, b)`` intervals (floats or Decimals), as disjoint intervals in order."""
    out: list[list] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return float(sum((b - a for a, b in intervals), Decimal(0)))


def _common(a, b) -> float:
    """Length of the intersection of two merged, sorted interval lists."""
    total, j = Decimal(0), 0
    for x, y in a:
        while j < len(b) and b[j][1] <= x:
            j += 1
        k = j
        while k < len(b) and b[k][0] < y:
            total += max(Decimal(0), min(y, b[k][1]) - max(x, b[k][0]))
            k += 1
    return float(total)


def device_work(
    events: list[dict],
    *,
    rounded: bool,
    scope: str,
    kinds: str,
    windows: list[tuple[float, float]] = (),
) -> dict[str, list]:
    """The device work kept: per kind (``compute``, ``comm``, ``memory``, and HTA's ``other``: busy
    but of no kind), its (start, end, name, stream, launching call's start or None, category)
    intervals; ``windows``: phaseprof's step windows (host
    start and end, µs as the trace states them) for its scope."""
    events = [dict(e) for e in events]
    if rounded:
        _round(events)
    calls = {}
    for e in events:
        if (
            "correlation" in e.get("args", {})
            and e["args"].get("stream", -1) == -1
            and (kinds == "hta" or e.get("cat") in RUNTIME)
        ):
            calls[e["args"]["correlation"]] = e
    if kinds == "hta":  # events on a stream, CUDA's sync events on the GPU included
        device = [
            e
            for e in events
            if e.get("args", {}).get("stream", -1) != -1 and e.get("cat") in DEVICE + ("cuda_sync",)
        ]
    else:
        device = [e for e in events if e.get("cat") in DEVICE]
    if scope == "hta":
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        if len({e["name"] for e in steps}) > 1:
            last = max(e["ts"] + e["dur"] for e in steps)
            device = [
                d
                for d in device
                if (c := calls.get(d["args"].get("correlation"))) is not None and c["ts"] <= last
            ]
    else:
        bounds = sorted((Decimal(repr(a)), Decimal(repr(b))) for a, b in windows)
        starts = [a for a, _ in bounds]

        def inside(t: Decimal) -> bool:
            k = bisect.bisect_right(starts, t) - 1
            return k >= 0 and t < bounds[k][1]

        device = [
            d
            for d in device
            if (c := calls.get(d["args"].get("correlation"))) is not None
            and _fuzzy_inside(inside, c["ts"])
        ]
    under = _under_collective(events) if kinds == "phaseprof" else set()
    out: dict[str, list] = {"compute": [], "comm": [], "memory": [], "other": []}
    for d in device:
        name = d["name"]
        if kinds == "hta":
            kind = (
                "comm"
                if HTA_COMM.match(name)
                else "memory"
                if HTA_MEMORY.match(name)
                else "compute"
                if not HTA_NOT_COMPUTE.match(name)
                else "other"
            )
        else:
            corr = d["args"].get("correlation")
            kind = (
                "comm"
                if COMM_KERNEL.search(name) or corr in under
                else "memory"
                if d.get("cat") in COPY
                else "compute"
            )
        call = calls.get(d["args"].get("correlation"))
        out[kind].append(
            (
                d["ts"],
                d["ts"] + d["dur"],
                name,
                _stream(d),
                call["ts"] if call is not None else None,
                d.get("cat"),
            )
        )
    return out


def _fuzzy_inside(inside, t: Decimal) -> bool:
    """Whether a call's start lies in a window, the window's bounds having passed through a float64
    (0.25 µs coarse near the epoch): the call's start read the same way."""
    return inside(Decimal(repr(float(t))))


def _under_collective(events: list[dict]) -> set:
    """Correlations of the runtime calls made under a collective op of their thread."""
    ops = defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_OPS and (
            e["name"] == "record_param_comms"
            or re.match(r"^(nccl|gloo|mpi|ucc|c10d)(:|::)", e["name"])
        ):
            ops[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    found = set()
    for e in events:
        if (
            e.get("cat") in RUNTIME
            and "correlation" in e.get("args", {})
            and any(a <= e["ts"] <= b for a, b in ops.get((e["pid"], e["tid"]), ()))
        ):
            found.add(e["args"]["correlation"])
    return found


def figures(work: dict[str, list]) -> dict:
    """Busy, compute, communication, memory (µs, unions over all streams), HTA's idle share of the
    span from the first to the last device activity (%), the share of communication time compute
    overlaps (%, None without communication) and each kernel name's total (µs)."""
    merged = {k: union((a, b) for a, b, *_ in v) for k, v in work.items()}
    every = union((a, b) for v in work.values() for a, b, *_ in v)
    out = {k: _length(merged[k]) for k in ("compute", "comm", "memory")}
    out["busy"] = _length(every)
    out.pop("other", None)
    span = float(every[-1][1] - every[0][0]) if every else 0.0
    out["idle_pct"] = 100 * (span - out["busy"]) / span if span else None
    out["overlap_pct"] = (
        100 * _common(merged["compute"], merged["comm"]) / out["comm"] if out["comm"] else None
    )
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for v in work.values():
        for a, b, name, *_ in v:
            totals[name] += b - a
    out["kernels"] = {k: float(v) for k, v in totals.items()}
    return out


#: The runtime calls whose launches HTA's queue length counts (``get_runtime_launch_events_query``).
HTA_LAUNCH_CALLS = frozenset(
    (
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "runFunction - job_prep_and_submit_for_execution",
        "hipLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipMemcpyWithStream",
    )
)


def _stream(e: dict) -> str:
    """A device event's stream as phaseprof labels it."""
    args = e["args"]
    return f"GPU {args.get('device', e['pid'])} stream {args.get('stream', e['tid'])}"


#: Gaps between queued kernels under this are kernel wait (HTA's ``consecutive_kernel_delay``: 30,
#: in its frames' unit, µs).
KERNEL_WAIT_US = 30


def idle_split(
    work: dict[str, list], windows: list[tuple[float, float]] | None = None
) -> dict[str, dict[str, float]]:
    """Per stream, HTA's idle time breakdown (``get_idle_time_breakdown``, µs): each gap between
    consecutive device events on the stream is host wait when the later one's launching call
    started after the earlier one ended, else kernel wait when under `KERNEL_WAIT_US`, else other.
    HTA sums every gap of the trace; with ``windows`` (per step, its GPU window: start and end, µs
    as the trace states them) only the gaps inside one of them count, as phaseprof's split of each
    step's window does (the gaps between steps' windows are no step's)."""
    by_stream = defaultdict(list)
    for v in work.values():
        for a, b, _, stream, launch, cat in v:
            if cat != "cuda_sync":  # HTA splits the idle time between kernels, copies and sets
                by_stream[stream].append((a, b, launch))
    bounds = sorted((Decimal(repr(a)), Decimal(repr(b))) for a, b in windows or ())
    out: dict[str, dict[str, float]] = {}
    for stream, events in by_stream.items():
        events.sort(key=lambda x: x[0])
        split = dict.fromkeys(("host_wait", "kernel_wait", "other"), Decimal(0))
        reach = None
        for a, b, launch in events:
            if reach is not None and (
                windows is None
                or any(
                    x - Decimal("0.001") <= reach and a <= y + Decimal("0.001") for x, y in bounds
                )
            ):
                gap = a - reach
                kind = (
                    "host_wait"
                    if launch is not None and launch > reach
                    else "kernel_wait"
                    if gap < KERNEL_WAIT_US
                    else "other"
                )
                split[kind] += max(gap, Decimal(0)) if windows is not None else gap
            reach = b if windows is None or reach is None else max(reach, b)
        out[stream] = {k: float(v) for k, v in split.items()}
    return out


def launches_hta_leaves_out(events: list[dict]) -> dict[str, dict[str, int]]:
    """Per stream (``GPU d stream s``): how many kernels, copies and sets were launched by a runtime
    call HTA's queue length does not count (``cudaGraphLaunch``, ``cudaMemcpy``), by call name."""
    calls = {
        e["args"]["correlation"]: e["name"]
        for e in events
        if e.get("cat") in RUNTIME and "correlation" in e.get("args", {})
    }
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        name = calls.get(e.get("args", {}).get("correlation")) if e.get("cat") in DEVICE else None
        if name is not None and name not in HTA_LAUNCH_CALLS:
            args = e["args"]
            out[f"GPU {args.get('device', e['pid'])} stream {args.get('stream', e['tid'])}"][
                name
            ] += 1
    return out

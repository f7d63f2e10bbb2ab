"""Rank-vs-rank: each worker's mean step side by side, and the straggler.

In synchronous data-parallel training every rank waits for the slowest one at each collective, so
the ranks' steps take about as long, and the slow rank is the one the others wait for: it spends the
least time in collectives (``nccl:all_reduce``, ``gloo:all_reduce``, ``c10d::…``; their host time,
or the device time of their kernels on GPUs). Where the traces hold no collectives, the straggler is
the rank with the longest steps. Its phase to look at is the one where it works longest against the
median rank, collective time left out.
"""

from __future__ import annotations

import re

import numpy as np

from .compare import mean_step
from .model import SpanAnalysis
from .steps import StepRef, by_span, phase_names, step_refs

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)
_COLLECTIVE = re.compile(r"^(nccl|gloo|mpi|ucc|c10d)(:|::)|^record_param_comms$")
#: Collectives count as the sign of waiting once the ranks differ in them by this share of a step.
_WAIT_SHARE = 0.05


def rank_of(worker: str, spans: list[SpanAnalysis]) -> int | None:
    """The rank the trace records (distributedInfo), else one named in the worker name."""
    for s in spans:
        if s.rank is not None:
            return s.rank
    m = _RANK_IN_NAME.search(worker)
    return int(m.group(1)) if m else None


def rank_order(rank: int | None, worker: str) -> tuple:
    """Sort key of workers: by rank, workers without one last, then by name."""
    return (rank is None, rank if rank is not None else 0, worker)


def collective_ms(refs: list[StepRef], phases: list[str]) -> np.ndarray:
    """Per phase, the mean time per step spent in collectives: host self time of collective ops, or
    the device time of the kernels they launched, whichever is larger."""
    refs = [r for r in refs if not r.empty]
    host = np.zeros(len(phases))
    device = np.zeros(len(phases))
    for span, _, indices in by_span(refs):
        t = span.ops
        collective = np.array([bool(_COLLECTIVE.match(n)) for n in span.names] or [False])
        rows = np.isin(t.step, indices) & collective[t.name]
        to_phase = np.array([phases.index(p) for p in span.phases])[t.phase[rows]]
        np.add.at(host, to_phase, t.self_us[rows])
        np.add.at(device, to_phase, t.self_gpu_us[rows])
    return np.maximum(host, device) / max(len(refs), 1) / 1000.0


def ranks(workers: dict[str, list[SpanAnalysis]]) -> dict:
    """Per worker (rank) mean step and time in collectives; the straggler, why, and its phase."""
    all_spans = [s for spans in workers.values() for s in spans]
    phases = phase_names(all_spans)
    rows, comm = [], {}
    for worker, spans in workers.items():
        refs = step_refs(spans)
        side = mean_step(refs, phases)
        comm[worker] = collective_ms(refs, phases)
        rows.append({"worker": worker, "rank": rank_of(worker, spans), "steps": len(side["steps"]),
                     "wall_ms": side["wall_ms"], "comm_ms": round(float(comm[worker].sum()), 3),
                     "phases": side["phases"]})
    rows.sort(key=lambda r: rank_order(r["rank"], r["worker"]))
    out: dict = {"phases": phases, "ranks": rows, "straggler": None}
    timed = [r for r in rows if r["steps"]]
    if len(timed) >= 2:
        out["straggler"] = _straggler(timed, comm, phases)
    return out


def _straggler(rows: list[dict], comm: dict[str, np.ndarray], phases: list[str]) -> dict:
    median_wall = float(np.median([r["wall_ms"] for r in rows]))
    comms = [r["comm_ms"] for r in rows]
    median_comm = float(np.median(comms))
    waited = max(comms) - min(comms) > _WAIT_SHARE * median_wall
    slow = min(rows, key=lambda r: r["comm_ms"]) if waited else max(rows, key=lambda r: r["wall_ms"])
    # work per phase: host time less the time spent in collectives
    work = {r["worker"]: np.array([r["phases"][p]["cpu_ms"] for p in phases]) - comm[r["worker"]] for r in rows}
    others = np.median([work[r["worker"]] for r in rows if r is not slow], axis=0)
    gaps = work[slow["worker"]] - others
    j = int(np.argmax(gaps))
    name = f"rank {slow['rank']}" if slow["rank"] is not None else slow["worker"]
    if waited:
        reason = (f"the other ranks wait for {name} at collectives: it spends {slow['comm_ms']:.2f} ms per step in "
                  f"them, the median rank {median_comm:.2f} ms")
    else:
        reason = f"{name} has the longest steps: {slow['wall_ms']:.2f} ms, the median rank {median_wall:.2f} ms"
    return {
        "worker": slow["worker"],
        "rank": slow["rank"],
        "wall_ms": slow["wall_ms"],
        "behind_median_ms": round(slow["wall_ms"] - median_wall, 3),
        "comm_ms": slow["comm_ms"],
        "median_comm_ms": round(median_comm, 3),
        "waited_for": waited,
        "reason": reason,
        "phase": phases[j],
        "phase_behind_ms": round(float(gaps[j]), 3),
    }

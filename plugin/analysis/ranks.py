"""Rank-vs-rank: each worker's mean step side by side, and the straggler.

In data-parallel training every rank waits for the slowest at each collective, so the rank whose
steps take longest (and the phase where it loses the time) is where to look.
"""

from __future__ import annotations

import re

import numpy as np

from .compare import mean_step
from .model import SpanAnalysis
from .steps import phase_names, step_refs

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)


def rank_of(worker: str, spans: list[SpanAnalysis]) -> int | None:
    """The rank the trace records (distributedInfo), else one named in the worker name."""
    for s in spans:
        if s.rank is not None:
            return s.rank
    m = _RANK_IN_NAME.search(worker)
    return int(m.group(1)) if m else None


def ranks(workers: dict[str, list[SpanAnalysis]]) -> dict:
    """Per worker (rank) mean step; the straggler and the phase where it is furthest from the median."""
    all_spans = [s for spans in workers.values() for s in spans]
    phases = phase_names(all_spans)
    rows = []
    for worker, spans in workers.items():
        side = mean_step(step_refs(spans), phases)
        rows.append({"worker": worker, "rank": rank_of(worker, spans), "steps": len(side["steps"]),
                     "wall_ms": side["wall_ms"], "phases": side["phases"]})
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else 0, r["worker"]))
    out: dict = {"phases": phases, "ranks": rows, "straggler": None}
    timed = [r for r in rows if r["steps"]]
    if len(timed) >= 2:
        slow = max(timed, key=lambda r: r["wall_ms"])
        median_wall = float(np.median([r["wall_ms"] for r in timed]))
        gaps = {p: slow["phases"][p]["cpu_ms"] - float(np.median([r["phases"][p]["cpu_ms"] for r in timed]))
                for p in phases}
        phase = max(gaps, key=gaps.get)
        out["straggler"] = {
            "worker": slow["worker"],
            "rank": slow["rank"],
            "wall_ms": slow["wall_ms"],
            "behind_median_ms": round(slow["wall_ms"] - median_wall, 3),
            "phase": phase,
            "phase_behind_ms": round(gaps[phase], 3),
        }
    return out

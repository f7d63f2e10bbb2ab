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

from ..answers import RankRow, RanksAnswer, Straggler
from .compare import mean_side
from .worker import Worker, phase_names, rank_order

_COLLECTIVE = re.compile(r"^(nccl|gloo|mpi|ucc|c10d)(:|::)|^record_param_comms$")
#: Collectives count as the sign of waiting once the ranks differ in them by this share of a step.
_WAIT_SHARE = 0.05


def ranks(run: str, workers: list[Worker]) -> RanksAnswer:
    """Per worker (rank) mean step and time in collectives; the straggler, why, and its phase."""
    phases = phase_names([s for w in workers for s in w.spans])
    rows, comm = [], {}
    for w in workers:
        full = w.full()
        side = mean_side(w, full, phases)
        comm[w.name] = w.collective_us(full, phases, _COLLECTIVE.match) / 1000.0
        rows.append(RankRow(worker=w.name, rank=w.rank, steps=len(side.steps), wall_ms=side.wall_ms,
                            comm_ms=round(float(comm[w.name].sum()), 3), phases=side.phases))
    rows.sort(key=lambda r: rank_order(r.rank, r.worker))
    timed = [r for r in rows if r.steps]
    straggler = _straggler(timed, comm, phases) if len(timed) >= 2 else None
    return RanksAnswer(run=run, phases=phases, ranks=rows, straggler=straggler)


def _straggler(rows: list[RankRow], comm: dict[str, np.ndarray], phases: list[str]) -> Straggler:
    median_wall = float(np.median([r.wall_ms for r in rows]))
    comms = [r.comm_ms for r in rows]
    median_comm = float(np.median(comms))
    waited = max(comms) - min(comms) > _WAIT_SHARE * median_wall
    slow = min(rows, key=lambda r: r.comm_ms) if waited else max(rows, key=lambda r: r.wall_ms)
    # work per phase: host time less the time spent in collectives
    work = {r.worker: np.array([r.phases[p].cpu_ms for p in phases]) - comm[r.worker] for r in rows}
    others = np.median([work[r.worker] for r in rows if r is not slow], axis=0)
    gaps = work[slow.worker] - others
    j = int(np.argmax(gaps))
    name = f"rank {slow.rank}" if slow.rank is not None else slow.worker
    if waited:
        reason = (f"the other ranks wait for {name} at collectives: it spends {slow.comm_ms:.2f} ms per step in "
                  f"them, the median rank {median_comm:.2f} ms")
    else:
        reason = f"{name} has the longest steps: {slow.wall_ms:.2f} ms, the median rank {median_wall:.2f} ms"
    return Straggler(
        worker=slow.worker,
        rank=slow.rank,
        wall_ms=slow.wall_ms,
        behind_median_ms=round(slow.wall_ms - median_wall, 3),
        comm_ms=slow.comm_ms,
        median_comm_ms=round(median_comm, 3),
        waited_for=waited,
        reason=reason,
        phase=phases[j],
        phase_behind_ms=round(float(gaps[j]), 3),
    )

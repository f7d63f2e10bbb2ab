"""Rank-vs-rank: each worker's mean step side by side, and the straggler, only beyond noise.

In synchronous data-parallel training every rank waits for the slowest one at each collective, so
the ranks' steps take about as long and the time the others lose shows up in their collectives
(``nccl:all_reduce``, ``gloo:all_reduce``, ``c10d::…``; host time, or their kernels' device time on
GPUs). What tells ranks apart is their compute: each step less its collectives. The straggler is the
rank whose median compute per step lies beyond the noise band of the other ranks' steps (see
`noise`); it is ``waited_for`` when the others also spend that much longer in collectives. With
fewer than `noise.MIN_VALUES` steps in a rank there is nothing to judge, and the ranks within noise
are even: no straggler either way. Its phase to look at is the one whose compute (host time less
collectives, as the table shows) is longest against the median of the other ranks.
"""

from __future__ import annotations

import re

import numpy as np

from ..answers import RankRow, RanksAnswer, Straggler
from .compare import mean_side
from .noise import MIN_VALUES, noise
from .worker import Worker, ms, phase_names, rank_order

_COLLECTIVE = re.compile(r"^(nccl|gloo|mpi|ucc|c10d)(:|::)|^record_param_comms$")


class _Rank:
    """A rank's per-step figures (µs) as the rule reads them."""

    def __init__(self, w: Worker, phases: list[str]):
        self.full = w.full()
        self.comm = w.collective_us(self.full, phases, _COLLECTIVE.match)  # (steps, phases)
        self.compute = w.wall_us[self.full] - self.comm.sum(axis=1)  # per step
        cpu, _ = w.phase_means(self.full, phases)
        self.phase_compute = cpu - self.comm.mean(axis=0) if len(self.full) else np.zeros(len(phases))
        self.comm_per_step = self.comm.sum(axis=1)


def ranks(run: str, workers: list[Worker]) -> RanksAnswer:
    """Per worker (rank) mean step, time in collectives and compute; the straggler, why, and its phase."""
    phases = phase_names([s for w in workers for s in w.spans])
    rows, figures = [], {}
    for w in workers:
        r = figures[w.name] = _Rank(w, phases)
        side = mean_side(w, r.full, phases)
        n = max(len(r.full), 1)
        rows.append(RankRow(worker=w.name, rank=w.rank, steps=len(side.steps), wall_ms=side.wall_ms,
                            comm_ms=ms(r.comm_per_step.sum() / n), compute_ms=ms(r.compute.sum() / n),
                            phases=side.phases,
                            phase_compute_ms={p: ms(v) for p, v in zip(phases, r.phase_compute.tolist())}))
    rows.sort(key=lambda r: rank_order(r.rank, r.worker))
    straggler, note = _straggler([r for r in rows if r.steps], figures, phases)
    return RanksAnswer(run=run, phases=phases, ranks=rows, straggler=straggler, note=note)


def _name(row: RankRow) -> str:
    return f"rank {row.rank}" if row.rank is not None else row.worker


def _straggler(rows: list[RankRow], figures: dict[str, _Rank], phases: list[str]) -> tuple[Straggler | None, str]:
    if len(rows) < 2:
        return None, "one worker: no straggler to find" if rows else "no worker has steps: no straggler to find"
    fewest = min(rows, key=lambda r: r.steps)
    if fewest.steps < MIN_VALUES:
        return None, (f"too few steps to tell the ranks apart: {_name(fewest)} has {fewest.steps} "
                      f"(at least {MIN_VALUES} per rank are needed)")
    slow = max(rows, key=lambda r: float(np.median(figures[r.worker].compute)))
    others = [r for r in rows if r is not slow]
    band = noise(np.concatenate([figures[r.worker].compute for r in others]))
    compute = float(np.median(figures[slow.worker].compute))
    if not band.slow(compute):
        return None, (f"the ranks are even: every rank's compute per step (its step less collectives) lies within "
                      f"±{ms(band.band):.2f} ms of the others' median ({ms(band.median):.2f} ms)")
    comm_others = float(np.median(np.concatenate([figures[r.worker].comm_per_step for r in others])))
    comm_slow = float(np.median(figures[slow.worker].comm_per_step))
    waited = comm_others - comm_slow > band.band
    gaps = figures[slow.worker].phase_compute - np.median([figures[r.worker].phase_compute for r in others], axis=0)
    j = int(np.argmax(gaps))
    median_wall = float(np.median([r.wall_ms for r in rows]))
    reason = (f"{_name(slow)} computes {ms(compute):.2f} ms per step (its step less collectives), the other ranks "
              f"{ms(band.median):.2f} ms, beyond their noise of ±{ms(band.band):.2f} ms")
    if waited:
        reason += (f"; the other ranks wait for it at collectives: {ms(comm_others):.2f} ms per step in them, "
                   f"{_name(slow)} {ms(comm_slow):.2f} ms")
    straggler = Straggler(
        worker=slow.worker,
        rank=slow.rank,
        wall_ms=slow.wall_ms,
        behind_median_ms=round(slow.wall_ms - median_wall, 3),
        comm_ms=slow.comm_ms,
        median_comm_ms=ms(comm_others),
        waited_for=waited,
        reason=reason,
        phase=phases[j],
        phase_behind_ms=ms(gaps[j]),
        noise_ms=ms(band.band),
    )
    return straggler, f"{_name(slow)} is the straggler: {reason}"

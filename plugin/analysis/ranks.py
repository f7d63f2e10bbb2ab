"""Rank-vs-rank: each worker's mean step side by side, and the straggler, only beyond noise.

In synchronous data-parallel training every rank waits for the slowest one at each collective, so
the ranks' steps take about as long and the time the others lose shows up in their collectives.
What tells ranks apart is their compute. Every figure is in one measure (`RanksAnswer.measure`):

- ``gpu`` when every rank ran on a GPU: a step is its GPU busy time, communication the busy time of
  its collectives, compute the GPU compute time (the union of its compute work over all streams;
  `model.GpuMeasures`), each phase its part of that. No host figure enters.
- ``host`` otherwise: a step is its wall time, communication the host self time of its collective ops
  (``nccl:all_reduce``, ``gloo:all_reduce``, ``c10d::…``), compute the step less that; per phase, its
  host time less its collectives (never below 0).

The straggler is the rank whose median compute per step lies beyond the noise band of the other
ranks' steps (see `noise`); it is ``waited_for`` when the others also spend that much longer in
communication. With fewer than `noise.MIN_VALUES` steps in a rank there is nothing to judge, and the
ranks within noise are even: no straggler either way. Its phase to look at is the one whose compute
is longest against the median of the other ranks. Ranks judge over each worker's steady steps
(`Worker.steady`).

The traces say which rank of how many each is (``distributedInfo``): the answer names the ranks of
that world with no trace here, and leaves out workers that are other files of a worker already
listed (the same rank; or, where a worker has no rank, the same steps with the same times to the µs:
one run exported several ways), since they are not ranks.
"""

from __future__ import annotations

import numpy as np

from ..answers import RankRow, RanksAnswer, Straggler
from .compare import mean_side
from .cost import GPU, HOST, Measure
from .noise import MIN_VALUES, noise
from .span import COLLECTIVE_OP
from .worker import Worker, ms, phase_names, rank_order


class _Rank:
    """A rank's per-step figures (µs) in one measure, as the rule reads them."""

    def __init__(self, w: Worker, phases: list[str], measure: Measure):
        self.rows = rows = w.steady()
        cols = w.columns(phases)

        def table(t: np.ndarray) -> np.ndarray:  # (steps, phases), 0 for a phase the worker lacks
            if not len(phases):
                return np.zeros((len(rows), 0))
            return np.where(cols >= 0, t[rows][:, np.maximum(cols, 0)], 0.0)

        if measure == GPU:
            phase_compute, comm, exposed = table(w.gpu_compute_us), table(w.comm_us), table(w.exposed_comm_us)
            self.compute = phase_compute.sum(axis=1)
            # GPU busy: compute, exposed communication and memory
            self.step = table(w.gpu_busy_us).sum(axis=1)
            self.exposed = exposed.sum(axis=1)
        else:
            cpu = table(w.host_us)
            comm = np.minimum(w.collective_us(rows, phases, COLLECTIVE_OP.match), cpu)
            phase_compute = cpu - comm
            self.step = w.wall_us[rows]
            self.compute = np.maximum(self.step - comm.sum(axis=1), 0.0)
            self.exposed = np.zeros(len(rows))
        self.comm_per_step = comm.sum(axis=1)
        self.phase_compute = phase_compute.mean(axis=0) if len(rows) else np.zeros(len(phases))


def ranks(run: str, workers: list[Worker]) -> RanksAnswer:
    """Per worker (rank) mean step, time in communication and compute; the straggler, why, and its phase;
    the ranks missing from the world the traces record, and files of one worker that are not ranks."""
    workers = sorted(workers, key=lambda w: rank_order(w.rank, w.name))
    kept, not_ranks = _distinct(workers)
    phases = phase_names([s for w in kept for s in w.spans])
    measure: Measure = GPU if kept and all(w.has_gpu for w in kept) else HOST
    rows, figures = [], {}
    for w in kept:
        r = figures[w.name] = _Rank(w, phases, measure)
        side = mean_side(w, r.rows, phases)
        n = max(len(r.rows), 1)
        rows.append(RankRow(worker=w.name, rank=w.rank, steps=len(side.steps), wall_ms=side.wall_ms,
                            step_ms=ms(r.step.sum() / n), comm_ms=ms(r.comm_per_step.sum() / n),
                            compute_ms=ms(r.compute.sum() / n), exposed_comm_ms=ms(r.exposed.sum() / n),
                            phases=side.phases,
                            phase_compute_ms={p: ms(v) for p, v in zip(phases, r.phase_compute.tolist())}))
    world = next((w.world_size for w in kept if w.world_size), None)
    present = {w.rank for w in kept if w.rank is not None}
    missing = sorted(set(range(world)) - present) if world else []
    straggler, note = _straggler([r for r in rows if r.steps], figures, phases, measure)
    if missing:
        note = f"{_missing(missing, world)}; {note}"
    if not_ranks:
        note += (f"; {', '.join(not_ranks)}: other file{'s' if len(not_ranks) > 1 else ''} of a worker listed "
                 "(the same rank, or the same steps at the same times), not ranks")
    return RanksAnswer(run=run, phases=phases, ranks=rows, straggler=straggler, note=note, measure=measure,
                       world_size=world, missing_ranks=missing, not_ranks=not_ranks)


def _distinct(workers: list[Worker]) -> tuple[list[Worker], list[str]]:
    """The workers that are ranks, and the names of those that are other files of one of them."""
    kept: list[Worker] = []
    dropped: list[str] = []
    for w in workers:
        sign = _signature(w)
        if any(w.rank == k.rank if w.rank is not None and k.rank is not None else bool(sign) and sign == _signature(k)
               for k in kept):
            dropped.append(w.name)
        else:
            kept.append(w)
    return kept, dropped


def _signature(w: Worker) -> tuple:
    """A worker's steps as numbers and wall times to the µs: the same for two files of one recording."""
    return tuple(zip(w.numbers, np.round(w.wall_us).astype(np.int64).tolist()))


def _missing(missing: list[int], world: int) -> str:
    """"rank 1 of world size 2 has no trace here", ranges folded: "ranks 2-127 of …"."""
    spans, start = [], missing[0]
    for a, b in zip(missing, missing[1:] + [None]):
        if b != a + 1:
            spans.append(str(start) if start == a else f"{start}-{a}")
            start = b
    label = "rank" if len(missing) == 1 else "ranks"
    verb = "has" if len(missing) == 1 else "have"
    return (f"{label} {', '.join(spans)} of world size {world} {verb} no trace here: the comparison is of the "
            "ranks present")


def _name(row: RankRow) -> str:
    return f"rank {row.rank}" if row.rank is not None else row.worker


def _straggler(rows: list[RankRow], figures: dict[str, _Rank], phases: list[str],
               measure: Measure) -> tuple[Straggler | None, str]:
    if len(rows) < 2:
        return None, "one worker: no straggler to find" if rows else "no worker has steps: no straggler to find"
    fewest = min(rows, key=lambda r: r.steps)
    if fewest.steps < MIN_VALUES:
        return None, (f"too few steps to tell the ranks apart: {_name(fewest)} has {fewest.steps} "
                      f"(at least {MIN_VALUES} per rank are needed)")
    what = "GPU compute time" if measure == GPU else "its step less collectives"
    slow = max(rows, key=lambda r: float(np.median(figures[r.worker].compute)))
    others = [r for r in rows if r is not slow]
    band = noise(np.concatenate([figures[r.worker].compute for r in others]))
    compute = float(np.median(figures[slow.worker].compute))
    if not band.slow(compute):
        return None, (f"the ranks are even: every rank's compute per step ({what}) lies within "
                      f"±{ms(band.band):.2f} ms of the others' median ({ms(band.median):.2f} ms)")
    comm_others = float(np.median(np.concatenate([figures[r.worker].comm_per_step for r in others])))
    comm_slow = float(np.median(figures[slow.worker].comm_per_step))
    waited = comm_others - comm_slow > band.band
    gaps = figures[slow.worker].phase_compute - np.median([figures[r.worker].phase_compute for r in others], axis=0)
    j = int(np.argmax(gaps))
    median_step = float(np.median([r.step_ms for r in rows]))
    reason = (f"{_name(slow)} computes {ms(compute):.2f} ms per step ({what}), the other ranks "
              f"{ms(band.median):.2f} ms, beyond their noise of ±{ms(band.band):.2f} ms")
    if waited:
        reason += (f"; the other ranks wait for it at collectives: {ms(comm_others):.2f} ms per step in them, "
                   f"{_name(slow)} {ms(comm_slow):.2f} ms")
    straggler = Straggler(
        worker=slow.worker,
        rank=slow.rank,
        wall_ms=slow.step_ms,
        behind_median_ms=round(slow.step_ms - median_step, 3),
        comm_ms=slow.comm_ms,
        median_comm_ms=ms(comm_others),
        waited_for=waited,
        reason=reason,
        phase=phases[j],
        phase_behind_ms=ms(gaps[j]),
        noise_ms=ms(band.band),
    )
    return straggler, f"{_name(slow)} is the straggler: {reason}"

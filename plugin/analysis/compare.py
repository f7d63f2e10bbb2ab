"""Compare two sets of steps: one step with another, one run or worker with another.

Each side is summarised as its mean step (empty steps left out), then per-phase deltas (B - A) and
the ops whose time per step changed most. Ops are ranked by their *self* time, so that a change is
pinned on the op that made it rather than repeated on every op around it.
"""

from __future__ import annotations

import numpy as np

from ..answers import ChangedOp, CompareAnswer, CompareSide, Delta, Times
from .worker import OP_COLUMNS, Worker, ms

#: How many changed ops a comparison lists.
TOP_OPS = 15


def mean_side(w: Worker, rows: np.ndarray, phases: list[str], label: str = "") -> CompareSide:
    """Mean wall, host and GPU time per phase over the non-empty steps among ``rows``."""
    rows = rows[~w.empty[rows]]
    cpu, gpu = w.phase_means(rows, phases)
    return CompareSide(
        label=label,
        steps=[w.numbers[k] for k in rows.tolist()],
        wall_ms=ms(sum(w.wall_us[rows].tolist()) / max(len(rows), 1)),
        phases={p: Times(host_ms=ms(cpu[j]), gpu_ms=ms(gpu[j])) for j, p in enumerate(phases)},
    )


def compare(a: tuple[Worker, np.ndarray], b: tuple[Worker, np.ndarray], phases: list[str],
            labels: tuple[str, str] = ("", ""), top: int = TOP_OPS, op: str | None = None,
            by: str = "both") -> CompareAnswer:
    """Side A and side B (a worker and some of its step rows each), per-phase deltas and the
    ``top`` ops that changed most (B - A; ``by``: see `changed_ops`), then the rows of op ``op`` (by
    name) where they are not among them."""
    side_a, side_b = mean_side(*a, phases, labels[0]), mean_side(*b, phases, labels[1])
    delta = Delta(
        wall_ms=round(side_b.wall_ms - side_a.wall_ms, 3),
        phases={
            p: Times(host_ms=round(side_b.phases[p].host_ms - side_a.phases[p].host_ms, 3),
                     gpu_ms=round(side_b.phases[p].gpu_ms - side_a.phases[p].gpu_ms, 3))
            for p in phases
        },
    )
    changed = changed_ops(_op_means(*a), _op_means(*b), by)
    ops = changed[:top] + [r for r in changed[top:] if r.name == op]
    return CompareAnswer(a=side_a, b=side_b, delta=delta, ops=ops, phases=phases)


def _op_means(w: Worker, rows: np.ndarray) -> dict:
    return w.op_means(rows[~w.empty[rows]])


def changed_ops(ops_a: dict, ops_b: dict, by: str = "both") -> list[ChangedOp]:
    """Op rows with both sides and deltas, the biggest change in self time first: host and GPU
    together (``both``), or GPU time alone (``gpu``: what a GPU-bound comparison is about; an op
    whose launches only took longer on the host does not crowd out the kernels that changed)."""
    zero = np.zeros(len(OP_COLUMNS))
    rows = []
    for key in ops_a.keys() | ops_b.keys():
        (ca, sa, ta, sga, ga), (cb, sb, tb, sgb, gb) = ops_a.get(key, zero).tolist(), ops_b.get(key, zero).tolist()
        rows.append(ChangedOp(
            phase=key[0], name=key[1], a_calls=round(ca, 2), b_calls=round(cb, 2),
            a_self_host_ms=ms(sa), b_self_host_ms=ms(sb), delta_self_host_ms=ms(sb - sa),
            a_host_ms=ms(ta), b_host_ms=ms(tb), delta_host_ms=ms(tb - ta),
            a_self_gpu_ms=ms(sga), b_self_gpu_ms=ms(sgb), delta_self_gpu_ms=ms(sgb - sga),
            a_gpu_ms=ms(ga), b_gpu_ms=ms(gb), delta_gpu_ms=ms(gb - ga),
        ))
    if by == "gpu":
        rows.sort(key=lambda r: (-abs(r.delta_self_gpu_ms), -abs(r.delta_gpu_ms), r.phase, r.name))
    else:
        rows.sort(key=lambda r: (-(abs(r.delta_self_host_ms) + abs(r.delta_self_gpu_ms)), r.phase, r.name))
    return rows


def median_row(w: Worker, rows: np.ndarray) -> int | None:
    """The row among ``rows`` whose step's wall time is the median (the lower one for an even count)."""
    rows = rows[~w.empty[rows]]
    if not len(rows):
        return None
    ordered = rows[np.argsort(w.wall_us[rows], kind="stable")]
    return int(ordered[(len(ordered) - 1) // 2])


def grew_most(delta: Delta) -> tuple[str, float]:
    """The phase whose host time grew most, and by how much (ms)."""
    name = max(delta.phases, key=lambda p: delta.phases[p].host_ms)
    return name, float(np.round(delta.phases[name].host_ms, 3))

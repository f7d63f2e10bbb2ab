"""Which timed steps a run's per-step figures describe: its steady steps. Both sides apply this one
rule — the summary printed on close (training side) and the whole-run figures of ``phaseprof report``
and TensorBoard (from the scalars) — so that they agree.

Left out: the run's first step (first-call set-up: lazy initialisation, allocator warm-up) and every
step that ran a ``torch.compile`` compilation (a ``compile`` phase), unless no other step is left.
Torch-free, like `phaseprof.contract`.
"""

from __future__ import annotations

import numpy as np


def steady_steps(numbers: np.ndarray, compile_ms: np.ndarray | None) -> tuple[np.ndarray, list[str]]:
    """A mask of the steady steps among ``numbers`` (the steps' numbers), given each step's compile
    time (None: nothing compiled), and what was left out, in words (empty when nothing was)."""
    numbers = np.asarray(numbers)
    if not len(numbers):
        return np.zeros(0, bool), []
    first = numbers == numbers.min()
    compiled = (np.nan_to_num(np.asarray(compile_ms, dtype=np.float64)) > 0 if compile_ms is not None
                else np.zeros(len(numbers), bool))
    kept = ~(first | compiled)
    if not kept.any():
        return np.ones(len(numbers), bool), []
    left_out = [f"step {int(numbers[first][0])} (first)"]
    if compiled[~first].any():
        left_out.append(f"{int(compiled[~first].sum())} compiling step(s)")
    return kept, left_out

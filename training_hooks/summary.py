"""The table printed when a PhaseProfiler closes: per phase, the mean, median and p95 of its host
time per step and its share of the step (plus the GPU mean where CUDA events ran), then what was
written and the command that opens it in TensorBoard."""

from __future__ import annotations

import shlex

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprof.contract import PHASES

from .recorder import PhaseStats

#: TensorBoard keeps this many samples per scalar tag unless told otherwise.
TENSORBOARD_SAMPLES = 1000


def tensorboard_command(logdir: str, steps: int) -> str:
    command = f"tensorboard --logdir {shlex.quote(logdir)}"
    if steps > TENSORBOARD_SAMPLES:
        command += " --samples_per_plugin scalars=0"  # every step, not a sample of 1,000
    return command


def print_summary(console: Console, stats: PhaseStats, *, run: str, logdir: str, traces: list[str],
                  faults: list[str]) -> None:
    console.print(f"[bold]phaseprof[/] run [bold]{escape(run)}[/]: {stats.steps} step(s) timed, "
                  f"{len(traces)} trace file(s) written")
    if stats.steps:
        console.print(_table(stats))
    for line in faults:
        console.print(f"[red]not done: {escape(line)}[/]")
    # soft_wrap: the command stays on one line, to be copied as it is
    console.print(f"Next: [bold]{escape(tensorboard_command(logdir, stats.steps))}[/]  (tab Step Phases)",
                  soft_wrap=True)


def _table(stats: PhaseStats) -> Table:
    phases = [p for p in PHASES if p in stats.cpu] + [p for p in stats.cpu if p not in PHASES]
    cpu = {p: np.frombuffer(stats.cpu[p]) for p in phases}
    step = np.sum(list(cpu.values()), axis=0)
    gpu = {p: np.frombuffer(column) for p, column in stats.gpu.items()}
    table = Table(show_edge=False, pad_edge=False, header_style="bold",
                  caption="host ms per step" + ("; GPU: CUDA-event ms per step" if gpu else ""))
    for name in ("phase", "mean ms", "median ms", "p95 ms", "share"):
        table.add_column(name, justify="left" if name == "phase" else "right")
    if gpu:
        table.add_column("GPU mean ms", justify="right")
    mean_step = float(step.mean())
    for name, values in [*cpu.items(), ("step", step)]:
        row = [escape(name), f"{values.mean():,.2f}", f"{np.median(values):,.2f}", f"{np.percentile(values, 95):,.2f}",
               f"{values.mean() / mean_step:.0%}" if mean_step else "-"]
        if gpu:
            column = sum(gpu.values()) if name == "step" else gpu.get(name)
            row.append("-" if column is None else f"{column.mean():,.2f}")
        table.add_row(*row, style="bold" if name == "step" else None)
    return table

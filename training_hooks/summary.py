"""The table printed when a PhaseProfiler closes: per phase, the median, p95 and mean of its host
time per step and its share of the median step (plus the GPU median where CUDA events ran), then
the time kept outside the steps (evaluation, the profiler's own), what was written and the command
that opens it in TensorBoard.

Medians over the steady steps: step 0 (first-call set-up: lazy initialisation, allocator warm-up)
and steps that compiled (``torch.compile``) are left out of the table, and said to be, unless no
other step is left. Evaluation passes are never in a step.
"""

from __future__ import annotations

import shlex

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprof.contract import COMPILE, PHASES
from phaseprof.steady import steady_steps as steady

from .recorder import PhaseStats

#: TensorBoard keeps this many samples per scalar tag unless told otherwise.
TENSORBOARD_SAMPLES = 1000


def tensorboard_command(logdir: str, steps: int) -> str:
    command = f"tensorboard --logdir {shlex.quote(logdir)}"
    if steps > TENSORBOARD_SAMPLES:
        command += " --samples_per_plugin scalars=0"  # every step, not a sample of 1,000
    return command


def upload_command(staging: str, logdir: str) -> str:
    return f"phaseprof upload {shlex.quote(staging)} {shlex.quote(logdir)}"


def print_summary(console: Console, stats: PhaseStats, *, run: str, logdir: str, traces: list[str],
                  faults: list[str], staging: str | None = None) -> None:
    """``staging``: the folder that holds the run's files a store did not take (then the command
    that uploads them comes first: the store's URL does not hold them all)."""
    console.print(f"[bold]phaseprof[/] run [bold]{escape(run)}[/]: {stats.steps} step(s) timed, "
                  f"{len(traces)} trace file(s) written")
    if stats.steps:
        kept, left_out = steady_steps(stats)
        console.print(_table(stats, kept))
        if left_out:
            console.print(f"medians of {int(kept.sum())} step(s); left out: " + ", ".join(left_out))
    if stats.eval_ms:
        evals = np.frombuffer(stats.eval_ms)
        console.print(f"evaluation, outside the steps: {len(evals)} pass(es), {evals.sum():,.1f} ms in all, "
                      f"median {np.median(evals):,.1f} ms")
    if stats.after_last_ms:
        console.print(f"after the last step, in no step and no pass: {stats.after_last_ms:,.1f} ms")
    hook = np.frombuffer(stats.hook_ms)
    if hook.size and hook.sum() > 0:
        console.print(f"phaseprof's hooks, outside the phases: median "
                      f"{np.median(hook) * 1e3:,.1f} µs a step, {hook.sum():,.1f} ms in all")
    profiler = np.frombuffer(stats.profiler_ms)
    if profiler.size and profiler.sum() > 0:
        worst = int(np.argmax(profiler))
        console.print(f"the profiler's own time, outside the steps: {profiler.sum():,.1f} ms in all, at most "
                      f"{profiler[worst]:,.1f} ms (after step {stats.numbers[worst]})")
    for line in faults:
        console.print(f"[red]not done: {escape(line)}[/]")
    # soft_wrap: each command stays on one line, to be copied as it is
    if staging is not None:
        console.print(f"[red]The run is staged in {escape(staging)}, not in {escape(logdir)}.[/] "
                      f"Upload it with: [bold]{escape(upload_command(staging, logdir))}[/]",
                      soft_wrap=True)
        console.print(f"Next: [bold]{escape(tensorboard_command(staging, stats.steps))}[/]  "
                      "(tab Step Phases; or the store's URL once uploaded)", soft_wrap=True)
        return
    console.print(f"Next: [bold]{escape(tensorboard_command(logdir, stats.steps))}[/]  (tab Step Phases)",
                  soft_wrap=True)


def steady_steps(stats: PhaseStats) -> tuple[np.ndarray, list[str]]:
    """Which rows of ``stats`` the summary keeps (a bool mask), and what it left out, in words
    (`phaseprof.steady`: the rule the whole-run figures of the report follow too)."""
    compile_ms = np.frombuffer(stats.cpu[COMPILE]) if COMPILE in stats.cpu else None
    return steady(np.frombuffer(stats.numbers, dtype=np.int64), compile_ms)


def _table(stats: PhaseStats, kept: np.ndarray) -> Table:
    phases = [p for p in PHASES if p in stats.cpu] + [p for p in stats.cpu if p not in PHASES]
    cpu = {p: np.frombuffer(stats.cpu[p])[kept] for p in phases}
    step = np.sum(list(cpu.values()), axis=0)
    gpu = {p: np.frombuffer(column)[kept[len(kept) - len(column):]] for p, column in stats.gpu.items()}
    caption = "host ms per step"
    if gpu:
        caption += "; GPU: CUDA-event ms per step"
    table = Table(show_edge=False, pad_edge=False, header_style="bold", caption=caption)
    for name in ("phase", "median ms", "p95 ms", "mean ms", "share"):
        table.add_column(name, justify="left" if name == "phase" else "right")
    if gpu:
        table.add_column("GPU median ms", justify="right")
    median_step = float(np.median(step))
    for name, values in [*cpu.items(), ("step", step)]:
        median = float(np.median(values))
        row = [escape(name), f"{median:,.2f}", f"{np.percentile(values, 95):,.2f}", f"{values.mean():,.2f}",
               f"{median / median_step:.0%}" if median_step else "-"]
        if gpu:
            column = sum(gpu.values()) if name == "step" else gpu.get(name)
            row.append("-" if column is None or not len(column) else f"{np.median(column):,.2f}")
        table.add_row(*row, style="bold" if name == "step" else None)
    return table

"""The table printed when a PhaseProfiler closes (`training_hooks/summary.py`), from step figures
built by hand: what the user reads, line by line."""

from __future__ import annotations

from array import array

import numpy as np
from rich.console import Console

from phaseprof.training_hooks.recorder import PhaseStats
from phaseprof.training_hooks.summary import print_summary, steady_steps


def stats_of(
    cpu: dict[str, list[float]], numbers: list[int] | None = None, gpu=None, **columns
) -> PhaseStats:
    """PhaseStats as the recorder fills them: a column per phase (ms per step), the steps' numbers
    (0, 1, ... by default), GPU columns (aligned with the last steps) and the other per-step
    columns."""
    stats = PhaseStats()
    stats.steps = len(next(iter(cpu.values())))
    stats.numbers = array("q", numbers if numbers is not None else range(stats.steps))
    stats.cpu = {p: array("d", v) for p, v in cpu.items()}
    stats.gpu = {p: array("d", v) for p, v in (gpu or {}).items()}
    for name in ("profiler_ms", "hook_ms", "eval_ms"):
        setattr(
            stats,
            name,
            array("d", columns.pop(name, [0.0] * (stats.steps if name != "eval_ms" else 0))),
        )
    stats.after_last_ms = columns.pop("after_last_ms", 0.0)
    assert not columns
    return stats


def printed(stats: PhaseStats, width: int = 200, **kwargs) -> list[str]:
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    options = {"run": "train", "logdir": "logs", "traces": ["a.json"], "faults": [], **kwargs}
    print_summary(console, stats, **options)
    return [line.strip() for line in console.export_text().splitlines()]


def cells(lines: list[str], first: str) -> list[str]:
    """The cells of the table's row whose first cell is ``first``."""
    (row,) = [line.split() for line in lines if line.split()[:1] == [first]]
    return [c for c in row if c not in "│┃"]


def test_the_table_holds_each_phase_s_median_p95_mean_and_share_over_the_steady_steps():
    # step 0 is left out (first-call set-up): its 1,000 ms are in no figure
    data = [1000.0, 1.0, 2.0, 3.0, 4.0, 10.0]
    forward = [1000.0, 6.0, 6.0, 6.0, 6.0, 6.0]
    lines = printed(
        stats_of({"forward": forward, "data": data, "loss": [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]})
    )
    assert lines[0] == "phaseprof run train: 6 step(s) timed, 1 trace file(s) written"
    header = next(line.split() for line in lines if "phase" in line.split())
    assert [c for c in header if c not in "│┃"] == [
        "phase",
        "median",
        "ms",
        "p95",
        "ms",
        "mean",
        "ms",
        "share",
    ]
    kept = np.array(data[1:])
    # phases in the registry's order (data before forward), the user's own after them
    assert [
        line.split()[0] for line in lines if line.split()[:1] in (["data"], ["forward"], ["loss"])
    ] == ["data", "forward", "loss"]
    p95 = np.percentile(kept, 95)
    step = kept + 6 + 1
    assert cells(lines, "data") == [
        "data",
        "3.00",
        f"{p95:,.2f}",
        f"{kept.mean():,.2f}",
        f"{3 / np.median(step):.0%}",
    ]
    assert cells(lines, "forward") == ["forward", "6.00", "6.00", "6.00", f"{6 / 10:.0%}"]
    assert cells(lines, "step") == [
        "step",
        "10.00",
        f"{np.percentile(step, 95):,.2f}",
        f"{step.mean():,.2f}",
        "100%",
    ]
    assert "host ms per step" in lines and "GPU" not in "".join(lines)
    assert "medians of 5 step(s); left out: step 0 (first)" in lines
    assert lines[-1] == "Next: tensorboard --logdir logs  (tab Step Phases)"


def test_gpu_medians_are_of_the_steps_they_were_measured_in():
    # CUDA events from step 2 on: the GPU columns hold the last three steps
    stats = stats_of(
        {"forward": [9.0, 5.0, 5.0, 5.0, 5.0], "backward": [9.0, 8.0, 8.0, 8.0, 8.0]},
        gpu={"forward": [1.0, 3.0, 5.0], "loss": [0.5, 0.5, 0.5]},
    )
    lines = printed(stats)
    assert "host ms per step; GPU: CUDA-event ms per step" in lines
    assert cells(lines, "forward")[-1] == "3.00"
    assert cells(lines, "backward")[-1] == "-"  # no GPU figure for it
    assert cells(lines, "step")[-1] == "3.50"  # per step, the sum of the phases' GPU times


def test_one_step_is_kept_when_it_is_the_only_one_and_a_step_of_no_time_has_no_share():
    lines = printed(stats_of({"forward": [0.0]}, numbers=[3]))
    assert cells(lines, "forward") == ["forward", "0.00", "0.00", "0.00", "-"]
    assert not any(line.startswith("medians of") for line in lines)


def test_compiling_steps_are_left_out_and_said_to_be():
    stats = stats_of({"forward": [50.0, 40.0, 2.0, 2.0], "compile": [30.0, 35.0, 0.0, 0.0]})
    kept, left_out = steady_steps(stats)
    assert kept.tolist() == [False, False, True, True]
    assert left_out == ["step 0 (first)", "1 compiling step(s)"]
    assert "medians of 2 step(s); left out: step 0 (first), 1 compiling step(s)" in printed(stats)
    assert steady_steps(stats_of({"forward": [1.0, 2.0]}, numbers=[7, 8]))[1] == ["step 7 (first)"]


def test_time_outside_the_steps_faults_and_a_staged_run():
    stats = stats_of(
        {"forward": [1.0, 1.0, 1.0]},
        numbers=[4, 5, 6],
        eval_ms=[100.0, 300.0, 1200.5],
        after_last_ms=12.25,
        hook_ms=[0.002, 0.004, 0.003],
        profiler_ms=[0.0, 250.0, 40.0],
    )
    lines = printed(
        stats,
        faults=["could not write traces: OSError: disk full [x] (2 times)"],
        staging="/tmp/stage dir",
        logdir="s3://b/logs",
    )
    text = "\n".join(lines)
    assert "evaluation, outside the steps: 3 pass(es), 1,600.5 ms in all, median 300.0 ms" in lines
    assert "after the last step, in no step and no pass: 12.2 ms" in lines
    assert "phaseprof's hooks, outside the phases: median 3.0 µs a step, 0.0 ms in all" in lines
    assert (
        "the profiler's own time, outside the steps: 290.0 ms in all, at most 250.0 ms "
        "(after step 5)"
        in lines
    )
    assert "not done: could not write traces: OSError: disk full [x] (2 times)" in lines
    assert (
        "The run is staged in /tmp/stage dir, not in s3://b/logs. Upload it with: "
        "phaseprof upload '/tmp/stage dir' s3://b/logs"
    ) in lines
    assert lines[-1] == (
        "Next: tensorboard --logdir '/tmp/stage dir'  (tab Step Phases; or the store's URL "
        "once uploaded)"
    )
    assert "Next: tensorboard --logdir s3://b/logs" not in text


def test_no_step_timed_prints_no_table_and_a_long_run_asks_for_every_step():
    stats = stats_of({"forward": [1.0]})
    stats.steps = 0
    lines = printed(stats, traces=[])
    assert lines == [
        "phaseprof run train: 0 step(s) timed, 0 trace file(s) written",
        "Next: tensorboard --logdir logs  (tab Step Phases)",
    ]
    many = stats_of({"forward": [1.0] * 1001})
    assert (
        printed(many)[-1]
        == "Next: tensorboard --logdir logs --samples_per_plugin scalars=0  (tab Step Phases)"
    )
    thousand = stats_of({"forward": [1.0] * 1000})
    assert printed(thousand)[-1] == "Next: tensorboard --logdir logs  (tab Step Phases)"
    quiet = printed(stats_of({"forward": [1.0, 1.0]}, hook_ms=[0.0, 0.0], profiler_ms=[0.0, 0.0]))
    assert not any(
        line.startswith(("phaseprof's hooks", "the profiler's own", "evaluation", "after the last"))
        for line in quiet
    )


def test_the_table_as_printed_names_left_and_figures_right():
    stats = stats_of(
        {"forward": [9.0, 5.0, 5.0, 5.0, 5.0], "backward": [9.0, 8.0, 8.0, 8.0, 8.0]},
        gpu={"forward": [1.0, 3.0, 5.0]},
    )
    console = Console(record=True, width=100, color_system=None, force_terminal=False)
    print_summary(console, stats, run="r", logdir="l", traces=[], faults=[])
    assert [line.rstrip() for line in console.export_text().splitlines()][1:6] == [
        "phase    ┃ median ms ┃ p95 ms ┃ mean ms ┃ share ┃ GPU median ms",
        "━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━",
        "forward  │      5.00 │   5.00 │    5.00 │   38% │          3.00",
        "backward │      8.00 │   8.00 │    8.00 │   62% │             -",
        "step     │     13.00 │  13.00 │   13.00 │  100% │          3.00",
    ]


def test_the_header_and_the_step_row_are_bold():
    console = Console(record=True, width=100, color_system="standard", force_terminal=True)
    print_summary(
        console, stats_of({"forward": [9.0, 5.0]}), run="r", logdir="l", traces=[], faults=[]
    )
    bold = "\x1b[1m{}\x1b[0m".format
    lines = console.export_text(styles=True).splitlines()
    assert all(bold(name) in lines[1] for name in ("median ms", "p95 ms", "mean ms", "share"))
    assert lines[3] == "forward │      5.00 │   5.00 │    5.00 │  100%"  # no style
    assert lines[4].startswith(bold("step   ")) and bold("     5.00") in lines[4]


def test_each_command_stays_on_one_line_to_be_copied_whatever_the_terminal_s_width():
    logdir, staging = "s3://a-bucket-of-long-name/" + "deep/" * 8 + "run", "/tmp/" + "staging/" * 8
    lines = printed(stats_of({"forward": [1.0, 1.0]}), logdir=logdir, width=60)
    assert f"Next: tensorboard --logdir {logdir}  (tab Step Phases)" in lines
    lines = printed(stats_of({"forward": [1.0, 1.0]}), logdir=logdir, staging=staging, width=60)
    assert any(
        line.endswith(f"Upload it with: phaseprof upload {staging} {logdir}") for line in lines
    )
    assert (
        f"Next: tensorboard --logdir {staging}  (tab Step Phases; or the store's URL once uploaded)"
        in lines
    )

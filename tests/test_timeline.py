"""The timeline answer from per-step scalars known by construction: the phases in their order, each
tag's values aligned on every step any tag has (none where a tag has no value), the time kept apart
beside them, and the profiled windows. tests/test_plugin.py serves it from TensorBoard's scalars."""

from __future__ import annotations

from phaseprof.plugin.analysis.timeline import timeline, windows
from phaseprof.plugin.answers import TimelineAnswer


def test_the_profiled_windows_are_runs_of_consecutive_steps():
    assert windows([8, 1, 3, 2, 7, 5, 3]) == [(1, 3), (5, 5), (7, 8)]
    assert windows([4]) == [(4, 4)] and windows([]) == []


SERIES = {
    "loss": [(5, 1.0)],  # not a phaseprof scalar: no step of its own, and the tags after it read
    "phaseprof/zeta_gpu_ms": [(1, 7.0)],  # a phase of the user's with GPU time only
    "phaseprof/forward_ms": [(0, 1.23456), (2, 2.5), (2, 2.0)],  # the last value of a step counts
    "phaseprof/alpha_ms": [(0, 0.0)],
    "phaseprof/forward_gpu_ms": [(1, 3.0)],
    "phaseprof/data_ms": [(0, 0.5)],
    "phaseprof/step_ms": [(0, 10.0), (1, 11.0)],
    "phaseprof/step_gpu_ms": [(1, 9.0)],
    "phaseprof/eval_ms": [(3, 100.0)],
    "phaseprof/profiler_ms": [(2, 4.0)],
    "phaseprof/hook_ms": [(0, 0.1)],
    "phaseprof/paused": [(6, 1.0)],
}


def test_every_tag_is_aligned_on_the_steps_any_phase_or_time_apart_has():
    answer = timeline("r", SERIES, profiled=[3, 0, 1], kept_all=True)
    assert answer == TimelineAnswer(
        run="r",
        phases=["data", "forward", "alpha", "zeta"],  # the canonical ones in their order, then the user's
        steps=[0, 1, 2, 3],
        cpu={"data": [0.5, None, None, None], "forward": [1.235, None, 2.0, None],
             "alpha": [0.0, None, None, None]},
        gpu={"forward": [None, 3.0, None, None], "zeta": [None, 7.0, None, None]},
        wall=[10.0, 11.0, None, None],
        wall_gpu=[None, 9.0, None, None],
        eval=[None, None, None, 100.0],
        profiler=[None, None, 4.0, None],
        profiled=[(0, 1), (3, 3)],
        downsampled=False,
        hook=[0.1, None, None, None],
    )


def test_a_run_written_before_the_hooks_time_was_measured_has_no_hook_series():
    series = {k: v for k, v in SERIES.items() if k != "phaseprof/hook_ms"}
    answer = timeline("r", series, profiled=[], kept_all=False)
    assert answer.hook is None and answer.downsampled and answer.profiled == []
    assert answer.eval == [None, None, None, 100.0] and answer.wall == [10.0, 11.0, None, None]
    # only the step total: no phase, every step still there
    answer = timeline("r", {"phaseprof/step_ms": [(4, 1.0)]}, profiled=[4], kept_all=True)
    assert (answer.phases, answer.steps, answer.wall, answer.cpu) == ([], [4], [1.0], {})
    assert (answer.eval, answer.profiler, answer.wall_gpu) == ([None], [None], [None])
    # no step total: the wall column is empty, each step still there
    answer = timeline("r", {"phaseprof/forward_ms": [(0, 1.0), (1, 2.0)]}, profiled=[], kept_all=True)
    assert (answer.wall, answer.cpu) == ([None, None], {"forward": [1.0, 2.0]})

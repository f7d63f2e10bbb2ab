"""A worker's summary of a built loop whose every figure is known: the means and shares per phase
(an empty last step left out), the slowest step and what grew in it, the outliers and the top ops of
the costliest phase."""

from __future__ import annotations

import pytest

from phaseprof.plugin.analysis.worker_summary import summarize
from tests.logdir import write_trace
from tests.test_cut_step import _worker
from tests.tracebuilder import Loop, step


def _loop(path):
    """Six 3 ms steps, step 4 of 6 ms (its backward's aten::mm_backward 3 ms longer), then an empty
    step: forward 1 ms (aten::mm 0.3 ms, aten::relu 0.1 ms, two 200 µs kernels), backward 2 ms
    (aten::mm_backward 1.5 ms holding aten::zeros 0.05 ms, one 400 µs kernel)."""
    loop = Loop()
    for n in range(6):
        extra = 3_000 if n == 4 else 0
        loop.step(n, ("phaseprof::forward", 1_000, [("gemm", 200)] * 2,
                      [("aten::mm", 10, 300), ("aten::relu", 400, 100)]),
                  ("phaseprof::backward", 2_000 + extra, [("gemm_bw", 400)],
                   [("aten::mm_backward", 10, 1_500 + extra), ("aten::zeros", 1_400, 50)]))
    loop.events.append(step(6, loop.t, 100))  # the loop ended inside the profiler's window
    return write_trace(path, loop.events)


@pytest.fixture
def summary(tmp_path):
    # made for each test: mutmut runs a mutant against the tests that called its function, and a
    # fixture of wider scope calls it in the first test only
    return summarize(_worker(_loop(tmp_path / "w.1.pt.trace.json")))


def test_the_means_and_shares_per_phase_leave_the_empty_step_out(summary):
    s = summary
    assert (s.steps, s.empty_steps, s.gpu, s.phases) == (7, [6], True, ["forward", "backward", "other"])
    assert (s.mean_wall_ms, s.median_wall_ms) == (3.5, 3.0)  # (5 x 3 + 6) / 6
    assert (s.eval_ms, s.paused_ms, s.compiling_steps, s.warmup_steps, s.cut_steps) == (None,) * 5
    f, b = s.mean["forward"], s.mean["backward"]
    # host time, GPU time of the work each launched, the GPU idle in it, shares of the step and of
    # the GPU's busy time
    assert (f.host_ms, f.gpu_ms, f.gpu_idle_ms, f.share, f.gpu_busy_ms, f.gpu_compute_ms) == \
        (1.0, 0.4, 0.6, 0.2857, 0.4, 0.4)
    assert (b.host_ms, b.gpu_ms, b.gpu_idle_ms, b.share, b.gpu_busy_ms, b.gpu_compute_ms) == \
        (2.5, 0.4, 2.1, 0.7143, 0.4, 0.4)
    assert (f.gpu_share, b.gpu_share, f.comm_ms, b.exposed_comm_ms) == (0.5, 0.5, 0.0, 0.0)
    assert s.measure == "host" and s.costs == {"forward": 1.0, "backward": 2.5, "other": 0.0} and s.cost_total_ms == 3.5
    assert s.gpu_time is not None and s.critical_path.length_ms == 3.5


def test_the_slowest_step_names_what_grew_against_the_median_step(summary):
    s = summary
    assert s.outliers == [4] and s.noise.slow == [4] and s.noise.fast == []
    assert (s.noise.judged, s.noise.steps, s.noise.median_step, s.noise.median_ms, s.noise.band_ms) == \
        (True, 6, 2, 3.0, 0.15)
    w = s.slowest
    assert (w.step, w.wall_ms, w.noise, w.noise_ms) == (4, 6.0, "beyond-noise", 0.15)
    assert (w.median_step, w.vs_median_ms, w.phase, w.phase_delta_ms) == (2, 3.0, "backward", 3.0)
    assert [(o.name, o.delta_self_host_ms) for o in w.ops] == [("aten::mm_backward", 3.0)]


def test_the_top_ops_are_the_costliest_phases_by_self_time(summary):
    assert summary.dominant_phase == "backward"
    assert [(o.name, o.calls, o.self_host_ms, o.host_ms) for o in summary.top_ops] == [
        ("aten::mm_backward", 1.0, 1.95, 2.0), ("aten::zeros", 1.0, 0.05, 0.05),
        ("cudaLaunchKernel", 1.0, 0.005, 0.005)]


def test_a_warm_up_step_is_left_out_and_named_and_no_step_is_called_cut(tmp_path):
    # a first step five times the others (the trace's first: warm-up); the GPU busy 0.5 µs a step,
    # all of it in forward
    loop = Loop()
    for n in range(6):
        loop.step(n, ("phaseprof::forward", 5_000 if n == 0 else 1_000, [("gemm", 0.5)]))
    s = summarize(_worker(write_trace(tmp_path / "w.1.pt.trace.json", loop.events)))
    assert (s.warmup_steps, s.cut_steps, s.compiling_steps) == ([0], None, None)
    assert s.mean_wall_ms == 1.0 and s.mean["forward"].gpu_share == 1.0

"""What an event's name means: the phase a range marks, a step's number, a training loop's marks,
autograd's ops, time kept out of the steps. Pure functions of a name: no trace needed."""

from __future__ import annotations

from phaseprof.plugin.analysis.names import (
    LOOP_DATA,
    LOOP_STEP,
    LOOP_ZERO_GRAD,
    is_autograd,
    loop_marker,
    out_of_step,
    range_phase,
    step_number,
)


def test_the_hook_s_ranges_name_their_phase_and_out_of_step_ranges_mark_none():
    assert range_phase("phaseprof::forward") == "forward"
    assert range_phase("phaseprof::my loss") == "my loss"  # any name the user chose
    assert range_phase("phaseprof::") is None  # a prefix alone names nothing
    assert range_phase("phaseprof::eval") is None and range_phase("phaseprof::paused") is None
    assert out_of_step("phaseprof::eval") == "eval" and out_of_step("phaseprof::paused") == "paused"
    assert out_of_step("phaseprof::forward") is None and out_of_step("eval") is None


def test_aliases_of_each_phase_mark_it_and_other_names_mark_none():
    assert range_phase("## forward ##") == "forward"
    assert range_phase("Backward") == "backward"
    assert range_phase("[pl][profile]run_training_batch.optimizer_step") == "optimizer"
    assert range_phase("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") == "data"
    assert range_phase("aten::mm") is None
    assert range_phase("forward pass") is None  # an alias must match the whole name


def test_a_step_s_number_is_read_from_profiler_step_ranges_only():
    assert step_number("ProfilerStep#0") == 0
    assert step_number("ProfilerStep#42") == 42
    assert step_number("ProfilerStep#") is None
    assert step_number("ProfilerStep#1234567890123456789") is None  # past 63 bits: no step marker
    assert step_number("aten::mm") is None


def test_each_once_per_iteration_mark_of_a_loop_is_told_apart():
    assert loop_marker("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") == LOOP_DATA
    assert loop_marker("Optimizer.zero_grad#SGD.zero_grad") == LOOP_ZERO_GRAD
    assert loop_marker("Optimizer.step#Adam.step") == LOOP_STEP
    assert loop_marker("aten::add_") is None
    assert loop_marker("ProfilerStep#3") is None


def test_autograd_s_ops_are_backward_work_and_others_are_not():
    assert is_autograd("autograd::engine::evaluate_function: AddmmBackward0") is True
    assert is_autograd("torch::autograd::AccumulateGrad") is True
    assert is_autograd("MmBackward") is True  # a 2021 trace's node
    assert is_autograd("aten::mm") is False
    assert is_autograd("aten::ones_like") is False

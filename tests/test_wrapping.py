"""How the hooks and the framework callbacks put a method in a phase (`integrations/wrapping.py`):
the call runs inside the phase and returns what it returns, only the instance asked for is timed,
and undoing a patch gives the object back as it was, unless something wrapped it again since."""

from __future__ import annotations

import pytest

from phaseprof.training_hooks.integrations.wrapping import in_phase, patch


class Tracker:
    """The tracker's `begin`/`end` as the wrapper uses them: records what was open during each call;
    ``opens`` False: the phase was open already (begin returns False and end must do nothing)."""

    def __init__(self, opens: bool = True) -> None:
        self.opens = opens
        self.open: list[str] = []
        self.calls: list[tuple] = []

    def begin(self, phase: str) -> bool:
        self.calls.append(("begin", phase))
        if self.opens:
            self.open.append(phase)
        return self.opens

    def end(self, phase: str, opened: bool) -> None:
        self.calls.append(("end", phase, opened))
        if opened:
            assert self.open.pop() == phase


def test_a_wrapped_call_runs_inside_its_phase_and_returns_its_result():
    tracker = Tracker()
    inside = []

    def step(a, b=0, *, c=0):
        """Adds."""
        inside.append(list(tracker.open))
        return a + b + c

    wrapped = in_phase(tracker, "optimizer", step)
    assert wrapped(1, 2, c=3) == 6
    assert inside == [["optimizer"]] and tracker.open == []
    assert tracker.calls == [("begin", "optimizer"), ("end", "optimizer", True)]
    # it looks like the method it wraps
    assert wrapped.__name__ == "step" and wrapped.__doc__ == "Adds." and wrapped.__wrapped__ is step


def test_the_phase_closes_when_the_call_raises_and_the_error_passes_through():
    tracker = Tracker()

    def fails():
        raise KeyError("the loop's own error")

    with pytest.raises(KeyError, match="the loop's own error"):
        in_phase(tracker, "backward", fails)()
    assert tracker.open == [] and tracker.calls[-1] == ("end", "backward", True)


def test_a_phase_already_open_is_not_closed_by_the_wrapper():
    tracker = Tracker(opens=False)
    assert in_phase(tracker, "forward", lambda: "done")() == "done"
    assert tracker.calls == [("begin", "forward"), ("end", "forward", False)]


def test_with_only_just_the_calls_of_that_instance_are_in_the_phase():
    class Model:
        def zero_grad(self, set_to_none=True):
            return (self, set_to_none)

    ours, other = Model(), Model()
    tracker = Tracker()
    wrapped = in_phase(tracker, "optimizer", Model.zero_grad, only=ours)
    assert wrapped(other, set_to_none=False) == (other, False)
    assert tracker.calls == [("end", "optimizer", False)]  # no phase opened for another instance
    assert wrapped(ours) == (ours, True)
    assert tracker.calls[1:] == [("begin", "optimizer"), ("end", "optimizer", True)]


def test_undoing_a_patch_of_an_instance_gives_back_what_its_class_has():
    class Optimizer:
        def step(self):
            return "class"

    opt = Optimizer()
    undo = patch(opt, "step", lambda: "ours")
    assert opt.step() == "ours"
    undo()
    assert opt.step() == "class" and "step" not in vars(opt)
    undo()  # twice: nothing to undo
    assert opt.step() == "class" and "step" not in vars(opt)


def test_undoing_a_patch_gives_back_the_objects_own_method():
    class Trainer:
        def evaluate(self):
            return "class"

    trainer = Trainer()
    trainer.evaluate = lambda: "the user's own"
    undo = patch(trainer, "evaluate", lambda: "ours")
    assert trainer.evaluate() == "ours"
    undo()
    assert trainer.evaluate() == "the user's own"


def test_undoing_a_patch_of_a_class_gives_back_its_own_method_and_leaves_a_base_alone():
    class Base:
        def zero_grad(self):
            return "base"

    class Model(Base):
        def forward(self):
            return "own"

    original = Model.forward
    undo_own = patch(Model, "forward", lambda self: "ours")
    undo_inherited = patch(Model, "zero_grad", lambda self: "ours")
    assert Model().forward() == "ours" and Model().zero_grad() == "ours"
    undo_own()
    undo_inherited()
    assert vars(Model)["forward"] is original and "zero_grad" not in vars(Model)
    assert Model().zero_grad() == "base" and Base().zero_grad() == "base"


def test_a_method_wrapped_again_on_top_of_ours_is_left_in_place():
    class Trainer:
        pass

    trainer = Trainer()
    trainer.training_step = lambda: "the user's"
    undo = patch(trainer, "training_step", lambda: "ours")
    trainer.training_step = lambda: "another tool's, calling ours"
    undo()
    assert trainer.training_step() == "another tool's, calling ours"

"""The hooks on their own, on tiny models: which calls open which phase in the tracker's step log,
when a step ends, evaluation passes, closures, GradScaler, torch.compile's callbacks, and what
``remove`` puts back. No profiler, no files: each test runs in milliseconds."""

from __future__ import annotations

import copy
import pickle
import threading
import types

import pytest
import torch

from phaseprof.contract import BACKWARD, COMPILE, EVAL, FORWARD, OPTIMIZER, OTHER
from phaseprof.training_hooks.hooks import Attachment, Detached
from phaseprof.training_hooks.tracker import HOOK, PhaseTracker
from tests.test_tracker import Faults, Ranges

ORIGINAL_BACKWARD = torch.autograd.backward


class Loop:
    """A tracker on this thread, an attachment, and the steps its optimizers end."""

    def __init__(self, models=(), optimizers=(), watch_eval=True, **kwargs) -> None:
        self.tracker = PhaseTracker(threading.get_ident(), Ranges(), Faults())
        self.tracker.start_step(0, False, None)
        self.ends = 0
        self.attachment = Attachment(models, optimizers, self.tracker, watch_eval=watch_eval,
                                     on_optimizer_step=self.end_step, **kwargs)

    def end_step(self) -> None:
        self.ends += 1

    def phases(self) -> list[str]:
        """The phases of the step so far, in order, runs of one phase joined (a phase opened
        inside itself never shows, so a run of one name is one phase), the hook's own time left
        out (`tests.test_tracker` checks where it lies)."""
        log = self.tracker.cut(2**62)
        self.tracker.start_step(2**62, False, None)
        out = []
        for phase in log[1::2]:
            if phase != HOOK and (not out or out[-1] != phase):
                out.append(phase)
        return out


@pytest.fixture
def loop(request):
    made = []

    def make(*args, **kwargs) -> Loop:
        made.append(Loop(*args, **kwargs))
        return made[-1]

    yield make
    for lp in reversed(made):  # the last attached first, as a user would detach them
        lp.attachment.remove()
    assert torch.autograd.backward is ORIGINAL_BACKWARD


def linear(n: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(n, n)


def test_forward_backward_and_optimizer_open_their_phases_and_the_step_ends_after_step(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    assert lp.ends == 0
    optimizer.step()
    assert lp.ends == 1
    assert lp.phases() == [OTHER, OPTIMIZER, OTHER, FORWARD, OTHER, BACKWARD, OTHER, OPTIMIZER, OTHER]


def test_a_forward_inside_forward_adds_nothing(loop):
    inner = linear()
    outer = torch.nn.Sequential(inner, torch.nn.ReLU())
    lp = loop([outer, inner])
    outer(torch.randn(2, 4))
    assert lp.tracker.stack == []
    assert lp.phases() == [OTHER, FORWARD, OTHER]
    lp.tracker.open(FORWARD)
    outer(torch.randn(2, 4))
    assert lp.tracker.stack == [FORWARD]  # the user's forward phase stays open: not closed by the hook


def test_the_forward_phase_closes_when_the_model_raises(loop):
    class Failing(torch.nn.Module):
        def forward(self, x):
            raise ValueError("bad batch")

    lp = loop([Failing()])
    with pytest.raises(ValueError):
        lp.attachment.models[0](torch.randn(1))
    assert lp.tracker.stack == []


def test_also_modules_time_their_own_forward_but_are_not_the_models(loop):
    model, helper = linear(), linear()
    lp = loop([model], also=(helper, model))
    assert lp.attachment.models == (model,)
    helper(torch.randn(2, 4))
    assert lp.phases() == [OTHER, FORWARD, OTHER]
    assert len(model._forward_pre_hooks) == 1  # hooked once though named twice


def test_in_a_training_loop_an_eval_forward_is_an_evaluation_pass_until_training_work(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    assert lp.attachment.training_mode()
    model.eval()
    assert not lp.attachment.training_mode()
    model(torch.randn(2, 4))
    assert lp.tracker.apart
    model.train()
    with torch.no_grad():
        assert not lp.attachment.training_mode()
        model(torch.randn(2, 4))  # still evaluating
    assert lp.tracker.apart
    model(torch.randn(2, 4))  # a training forward ends the pass
    assert not lp.tracker.apart
    assert lp.phases() == [EVAL, OTHER, FORWARD, OTHER]


@pytest.mark.parametrize("work", ["backward", "zero_grad", "step"])
def test_training_work_ends_an_evaluation_pass(loop, work):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    loss = model(torch.randn(2, 4)).sum()
    model.eval()
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert lp.tracker.apart
    {"backward": loss.backward, "zero_grad": optimizer.zero_grad, "step": optimizer.step}[work]()
    assert not lp.tracker.apart
    phase = BACKWARD if work == "backward" else OPTIMIZER
    assert lp.phases()[-4:] == [EVAL, OTHER, phase, OTHER]


def test_without_an_optimizer_evaluation_is_told_apart_once_a_backward_ran(loop):
    model = linear()
    lp = loop([model], watch_eval=False)
    with torch.no_grad():
        model(torch.randn(2, 4))  # not known to be training yet: a forward
    assert lp.phases() == [OTHER, FORWARD, OTHER]
    model(torch.randn(2, 4)).sum().backward()
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert lp.tracker.apart
    assert lp.phases() == [OTHER, FORWARD, OTHER, BACKWARD, OTHER, EVAL]


def test_a_backward_inside_backward_or_off_the_loop_thread_adds_nothing(loop):
    model = linear()
    lp = loop([model], watch_eval=False)
    lp.tracker.begin(BACKWARD)
    model(torch.randn(2, 4)).sum().backward()
    assert lp.tracker.stack == [BACKWARD]
    assert not lp.attachment._watch_eval  # that backward did not open the phase: nothing learnt from it
    lp.tracker.end(BACKWARD, True)
    loss = model(torch.randn(2, 4)).sum()
    thread = threading.Thread(target=loss.backward)
    thread.start()
    thread.join(timeout=60)
    assert model.weight.grad is not None
    assert lp.phases() == [OTHER, BACKWARD, FORWARD, BACKWARD, OTHER, FORWARD, OTHER]


def test_two_optimizers_end_the_step_once_both_stepped_in_either_order(loop):
    a, b = linear(), linear()
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    lp = loop([a, b], [opt_a, opt_b])
    opt_a.step()
    opt_a.step()
    assert lp.ends == 0
    opt_b.step()
    assert lp.ends == 1
    opt_b.step()
    assert lp.ends == 1
    opt_a.step()
    assert lp.ends == 2


def test_the_same_optimizer_attached_twice_is_one_optimizer(loop):
    """``attach(model, [opt, opt])``: each ``step()`` ends one step and is timed once (wrapped twice,
    each call ended two steps)."""
    model = linear()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [opt, opt])
    opt.step()
    assert lp.ends == 1
    opt.step()
    assert lp.ends == 2
    lp.attachment.remove()
    assert "step" not in vars(opt)  # the one wrapper removed puts the optimizer's own method back


def test_optimizers_that_do_not_end_steps_and_steps_off_the_loop_thread(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer], optimizers_end_steps=False)
    optimizer.step()
    assert lp.ends == 0 and lp.phases() == [OTHER, OPTIMIZER, OTHER]
    other = torch.optim.SGD(linear().parameters(), lr=0.1)
    lp2 = loop([], [other])
    thread = threading.Thread(target=other.step)
    thread.start()
    thread.join(timeout=60)
    assert lp2.ends == 0
    other.step()
    assert lp2.ends == 1


def test_an_accelerate_step_while_gradients_accumulate_ends_no_step(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.gradient_state = types.SimpleNamespace(sync_gradients=False)
    lp = loop([model], [optimizer])
    optimizer.step()
    assert lp.ends == 0
    optimizer.gradient_state.sync_gradients = True
    optimizer.step()
    assert lp.ends == 1


@pytest.mark.parametrize("form", ["positional", "keyword"])
def test_a_closure_runs_outside_the_optimizer_phase_however_often_it_is_called(loop, form):
    model = linear()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    lp = loop([model], [optimizer])
    x = torch.randn(2, 4)
    calls = []

    def closure():
        calls.append(list(lp.tracker.stack))
        optimizer.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        return loss

    result = optimizer.step(closure) if form == "positional" else optimizer.step(closure=closure)
    assert isinstance(result, torch.Tensor)
    assert len(calls) >= 2 and all(stack == [] for stack in calls)  # as outside the step: other
    phases = lp.phases()
    assert phases[:2] == [OTHER, OPTIMIZER] and phases[-2:] == [OPTIMIZER, OTHER]
    # each call: the optimizer pauses, zero_grad (the optimizer's), forward, backward, then resumes
    assert phases[2:7] == [OTHER, OPTIMIZER, OTHER, FORWARD, OTHER]
    assert phases.count(FORWARD) == phases.count(BACKWARD) == len(calls)
    assert lp.ends == 1


def test_a_step_given_something_else_than_a_closure_passes_it_on(loop):
    class Step(torch.optim.SGD):
        def step(self, closure=None, scale=1.0):
            self.got = (closure, scale)

    model = linear()
    optimizer = Step(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    optimizer.step(None, scale=2.0)
    assert optimizer.got == (None, 2.0)
    optimizer.step(scale=3.0)
    assert optimizer.got == (None, 3.0)
    assert lp.phases() == [OTHER, OPTIMIZER, OTHER, OPTIMIZER, OTHER] and lp.ends == 2


def test_a_grad_scaler_step_and_update_are_the_optimizers_and_the_update_ends_the_step(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    scaler = torch.amp.GradScaler("cpu")
    for skip in (False, True):
        scaler.scale(model(torch.randn(2, 4)).sum()).backward()
        if skip:
            model.weight.grad[0, 0] = float("inf")
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        assert lp.ends == int(skip)  # not inside step(): at the update
        scaler.update()
        assert lp.ends == 1 + int(skip)
        assert lp.phases() == [OTHER, FORWARD, OTHER, BACKWARD, OTHER, OPTIMIZER, OTHER, OPTIMIZER, OTHER,
                               OPTIMIZER, OTHER]


def test_a_grad_scaler_on_an_optimizer_not_attached_is_not_timed(loop):
    attached_model, other_model = linear(), linear()
    attached = torch.optim.SGD(attached_model.parameters(), lr=0.1)
    other = torch.optim.SGD(other_model.parameters(), lr=0.1)
    lp = loop([], [attached])
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(other_model(torch.randn(2, 4)).sum()).backward()
    scaler.unscale_(other)
    scaler.step(other)
    scaler.update()
    assert lp.ends == 0 and lp.phases() == [OTHER, BACKWARD, OTHER]
    assert other_model.weight.grad is not None


def test_a_grad_scaler_subclass_defined_after_attach_is_timed_at_its_first_step(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    updates = []

    class Scaler(torch.amp.GradScaler):
        def update(self, new_scale=None):
            updates.append(list(lp.tracker.stack))
            super().update(new_scale)

    own_update = vars(Scaler)["update"]
    scaler = Scaler("cpu")
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert updates == [[OPTIMIZER]] and lp.ends == 1  # the override's update is timed, its base's inside it
    assert lp.phases()[-2:] == [OPTIMIZER, OTHER]
    assert vars(Scaler)["update"] is not own_update
    lp.attachment.remove()
    assert vars(Scaler)["update"] is own_update


def test_remove_puts_back_what_attach_replaced(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler_methods = {k: vars(torch.amp.GradScaler)[k] for k in ("unscale_", "step", "update")}
    getstate = vars(torch.nn.Linear).get("__getstate__")
    lp = loop([model], [optimizer])
    assert torch.autograd.backward is not ORIGINAL_BACKWARD
    assert "step" in vars(optimizer) and "zero_grad" in vars(optimizer)
    assert {k: vars(torch.amp.GradScaler)[k] for k in scaler_methods} != scaler_methods
    lp.attachment.remove()
    assert torch.autograd.backward is ORIGINAL_BACKWARD
    assert "step" not in vars(optimizer) and "zero_grad" not in vars(optimizer)
    assert {k: vars(torch.amp.GradScaler)[k] for k in scaler_methods} == scaler_methods
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert vars(torch.nn.Linear).get("__getstate__") is getstate
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    assert lp.phases() == [OTHER] and lp.ends == 0


def test_a_method_set_on_the_instance_is_wrapped_and_put_back(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    plain = optimizer.step

    def step(*args, **kwargs):  # what an LR scheduler sets on the instance
        calls.append(args)
        return plain(*args, **kwargs)

    optimizer.step = step
    lp = loop([model], [optimizer])
    optimizer.step()
    assert calls == [()] and lp.ends == 1
    assert lp.phases() == [OTHER, OPTIMIZER, OTHER]
    lp.attachment.remove()
    assert optimizer.step is step


def test_a_wrapper_set_on_top_of_ours_stays_and_ours_passes_through(loop):
    model = linear()
    lp = loop([model])
    ours = torch.autograd.backward

    def theirs(*args, **kwargs):
        return ours(*args, **kwargs)

    torch.autograd.backward = theirs
    try:
        lp.attachment.remove()
        assert torch.autograd.backward is theirs
    finally:
        torch.autograd.backward = ORIGINAL_BACKWARD


def test_a_second_attachment_of_the_same_class_keeps_the_pickling_wrapper_until_the_last_is_removed(loop):
    a, b = linear(), linear()
    first, second = loop([a]), loop([b])
    wrapped = vars(torch.nn.Linear)["__getstate__"]
    second.attachment.remove()
    assert vars(torch.nn.Linear)["__getstate__"] is wrapped
    first.attachment.remove()
    assert "__getstate__" not in vars(torch.nn.Linear)


def users_hook(module, args, output):
    return None


def test_an_attached_model_pickles_and_copies_without_our_hooks_and_keeps_its_own(loop):
    model = linear()
    own = model.register_forward_hook(users_hook)
    loop([model])
    assert len(model._forward_hooks) == 2
    twin = copy.deepcopy(model)
    assert list(twin._forward_hooks) == [own.id] and not twin._forward_pre_hooks
    assert not twin._forward_hooks_always_called
    loaded = pickle.loads(pickle.dumps(model))
    assert list(loaded._forward_hooks) == [own.id]
    assert len(model._forward_hooks) == 2  # the attached model keeps ours


def test_a_hook_copied_by_someone_elses_pickling_comes_back_as_a_no_op(loop):
    lp = loop([linear()])
    assert copy.deepcopy(lp.attachment) is lp.attachment
    detached = pickle.loads(pickle.dumps(lp.attachment))
    assert isinstance(detached, Detached)
    assert detached._forward_pre(None, ()) is None and detached._forward_post(None, (), None) is None


def test_each_compilation_is_a_compile_phase_and_reset_callbacks_are_registered_again(loop):
    from torch._dynamo.callback import callback_handler

    lp = loop([linear()])
    starts, ends = callback_handler.start_callbacks, callback_handler.end_callbacks
    assert len(starts) >= 1 and len(ends) >= 1
    ours_start, ours_end = starts[-1], ends[-1]
    ours_start()
    ours_start()  # nested: adds nothing
    ours_end()
    assert lp.tracker.stack == [COMPILE]
    ours_end()
    ours_end()  # nothing open: nothing happens
    assert lp.phases() == [OTHER, COMPILE, OTHER]
    starts.remove(ours_start)
    ends.remove(ours_end)
    lp.attachment.watch_compiles()
    assert starts[-1] is ours_start and ends[-1] is ours_end
    lp.attachment.watch_compiles()
    assert starts.count(ours_start) == 1
    lp.attachment.remove()
    assert ours_start not in starts and ours_end not in ends


class Recording(torch.optim.SGD):
    """An optimizer whose ``step`` takes more than a closure and records what it was given."""

    def step(self, closure=None, *rest, scale=1.0):
        self.got = (rest, scale)
        return closure("a", key="b") if callable(closure) else None


def test_a_closure_gets_its_arguments_and_the_steps_other_arguments_pass_on(loop):
    model = linear()
    optimizer = Recording(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])

    def closure(*args, **kwargs):
        assert lp.tracker.stack == []  # as outside the step: other
        return args, kwargs

    assert optimizer.step(closure, 5, 6, scale=2.0) == (("a",), {"key": "b"})
    assert optimizer.got == ((5, 6), 2.0)
    assert lp.tracker.stack == []  # nothing left open by the closure
    assert optimizer.step(closure=closure) == (("a",), {"key": "b"})
    assert lp.tracker.stack == [] and lp.ends == 2


def test_a_closure_of_a_step_inside_the_users_optimizer_phase_stays_in_it(loop):
    model = linear()
    optimizer = Recording(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    seen = []
    lp.tracker.open(OPTIMIZER)
    optimizer.step(lambda *a, **k: seen.append(list(lp.tracker.stack)))
    assert seen == [[OPTIMIZER]]
    lp.tracker.close(OPTIMIZER)


def test_wrapped_functions_keep_their_names_and_signatures(loop):
    import inspect

    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {name: inspect.signature(getattr(optimizer, name)) for name in ("step", "zero_grad")}
    backward = inspect.signature(torch.autograd.backward)
    scaler = {name: inspect.signature(getattr(torch.amp.GradScaler, name)) for name in ("unscale_", "step", "update")}
    getstate = inspect.signature(torch.nn.Linear.__getstate__)
    loop([model], [optimizer])
    for name, signature in before.items():
        assert getattr(optimizer, name).__name__ == name and inspect.signature(getattr(optimizer, name)) == signature
    assert torch.autograd.backward.__name__ == "backward" and inspect.signature(torch.autograd.backward) == backward
    for name, signature in scaler.items():
        assert inspect.signature(getattr(torch.amp.GradScaler, name)) == signature
    assert inspect.signature(torch.nn.Linear.__getstate__) == getstate


def test_a_method_set_on_the_instance_gets_every_argument(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    plain = optimizer.step

    def step(*args, **kwargs):
        calls.append((len(args), sorted(kwargs)))
        return plain(*args, **kwargs)

    optimizer.step = step
    loop([model], [optimizer])
    x = torch.randn(2, 4)

    def closure():
        loss = model(x).sum()
        loss.backward()
        return loss

    assert isinstance(optimizer.step(closure), torch.Tensor)
    assert isinstance(optimizer.step(closure=closure), torch.Tensor)
    assert calls == [(1, []), (0, ["closure"])]


def test_our_forward_pre_hook_runs_before_the_models_own(loop):
    model = linear()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(list(lp.tracker.stack)))
    lp = loop([model])
    model(torch.randn(2, 4))
    assert seen == [[FORWARD]]


def test_zero_grad_and_backward_get_their_keyword_arguments(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop([model], [optimizer])
    model(torch.randn(2, 4)).sum().backward(inputs=[model.bias])
    assert model.weight.grad is None and model.bias.grad is not None
    optimizer.zero_grad(set_to_none=False)
    assert torch.equal(model.bias.grad, torch.zeros(4))


def test_a_grad_scaler_called_with_keywords_and_step_arguments(loop):
    model, other_model = linear(), linear()
    optimizer = Recording(model.parameters(), lr=0.1)
    other = Recording(other_model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.randn(2, 4)).sum() + other_model(torch.randn(2, 4)).sum()).backward()
    lp.phases()
    scaler.unscale_(optimizer=optimizer)
    scaler.step(optimizer=optimizer, scale=3.0)
    assert optimizer.got == ((), 3.0)
    scaler.unscale_(optimizer=other)  # not attached: passes through, untimed
    scaler.step(other, scale=4.0)
    assert other.got == ((), 4.0)
    assert lp.phases() == [OTHER, OPTIMIZER, OTHER, OPTIMIZER, OTHER]  # unscale_, then step
    scaler.update(2.0**10)
    assert lp.ends == 1 and scaler.get_scale() == 2.0**10
    scaler.update(new_scale=2.0**9)  # no step since: not timed, ends nothing
    assert lp.ends == 1 and scaler.get_scale() == 2.0**9
    assert lp.phases() == [OTHER, OPTIMIZER, OTHER]  # the first update only


def test_a_plain_optimizer_step_after_scaler_steps_ends_its_step(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])

    class Override(torch.amp.GradScaler):  # a step() calling its base's: both timed, one inside the other
        def step(self, optimizer, *args, **kwargs):
            return super().step(optimizer, *args, **kwargs)

    for scaler in (torch.amp.GradScaler("cpu"), Override("cpu")):
        scaler.scale(model(torch.randn(2, 4)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        ends = lp.ends
        optimizer.step()  # e.g. an epoch without the scaler
        assert lp.ends == ends + 1


def test_one_scaler_over_two_optimizers_ends_the_step_at_the_update_after_both(loop):
    a, b = linear(), linear()
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    lp = loop([a, b], [opt_a, opt_b])
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(a(torch.randn(2, 4)).sum() + b(torch.randn(2, 4)).sum()).backward()
    scaler.step(opt_a)
    scaler.update(scaler.get_scale())  # between the two: not yet the step's end
    assert lp.ends == 0
    scaler.step(opt_b)
    scaler.update()
    assert lp.ends == 1


def test_an_update_override_calling_its_bases_ends_the_step_when_the_override_returns(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lp = loop([model], [optimizer])
    ends_inside = []

    class Scaler(torch.amp.GradScaler):
        def update(self, new_scale=None):
            super().update(new_scale)
            ends_inside.append(lp.ends)

    scaler = Scaler("cpu")
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert ends_inside == [0] and lp.ends == 1


def test_grad_scaler_classes_are_wrapped_once_and_only_grad_scalers(loop):
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Early(torch.amp.GradScaler):  # defined before attach: wrapped at attach, as its siblings
        def update(self, new_scale=None):
            return super().update(new_scale)

    class Sibling(torch.amp.GradScaler):
        def update(self, new_scale=None):
            return super().update(new_scale)

    early, sibling = vars(Early)["update"], vars(Sibling)["update"]
    lp = loop([model], [optimizer])
    assert vars(Early)["update"] is not early and vars(Sibling)["update"] is not sibling
    wrapped = {name: vars(torch.amp.GradScaler)[name] for name in ("unscale_", "step", "update")}
    seen = []

    class Mixin:
        def describe(self):
            return "scaler"

    class Base(torch.amp.GradScaler):  # defined after attach: wrapped at its first step
        def update(self, new_scale=None):
            seen.append(list(lp.tracker.stack))
            return super().update(new_scale)

    class Scaler(Mixin, Base):
        pass

    for scaler in (torch.amp.GradScaler("cpu"), Scaler("cpu"), Scaler("cpu")):
        scaler.scale(model(torch.randn(2, 4)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    assert {name: vars(torch.amp.GradScaler)[name] for name in wrapped} == wrapped
    assert seen == [[OPTIMIZER], [OPTIMIZER]] and lp.ends == 3


def test_without_dynamos_callbacks_watching_compiles_does_nothing(loop, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch._dynamo.callback", None)  # as where Dynamo is unavailable
    lp = loop([linear()])
    assert lp.attachment.watch_compiles() is None


class OwnState(torch.nn.Linear):
    """A module class with a ``__getstate__`` of its own."""

    def __getstate__(self):
        state = super().__getstate__()
        state["note"] = "own"
        return state


def test_a_module_classs_own_getstate_is_used_while_attached_and_put_back(loop):
    torch.manual_seed(0)
    model = OwnState(4, 4)
    own = vars(OwnState)["__getstate__"]
    lp = loop([model])
    assert vars(OwnState)["__getstate__"] is not own
    assert pickle.loads(pickle.dumps(model)).note == "own"
    lp.attachment.remove()
    assert vars(OwnState)["__getstate__"] is own
    from phaseprof.training_hooks.hooks import _Pickling

    assert id(model) not in _Pickling.hooks  # nothing of the module is kept once detached


def test_a_module_not_attached_pickles_with_its_hooks_while_one_of_its_class_is(loop):
    attached, plain = linear(), linear()
    plain.register_forward_hook(users_hook)
    loop([attached])
    copied = pickle.loads(pickle.dumps(plain))
    assert len(copied._forward_hooks) == 1

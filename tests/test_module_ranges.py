"""The ranges `PhaseProfiler(modules=True)` puts around module calls
(`training_hooks/module_ranges.py`), as torch.profiler records them: one per call, named by the
module's path, each inside its parent's; none while the profiler does not record, on another
thread or under torch.compile; a failure reported once and the loop going on."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from phaseprof.training_hooks import module_ranges
from phaseprof.training_hooks.faults import Faults
from phaseprof.training_hooks.module_ranges import ModuleRanges

PREFIX = "phaseprof.module::"


class Net(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 1)
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.enc(x)
        if self.fail:
            raise ValueError("the forward failed")
        return self.head(y)


def ranges(run) -> list[tuple[str, float, float]]:
    """The module ranges recorded while ``run()`` ran: (path, start, end), by start."""
    with profile(activities=[ProfilerActivity.CPU]) as p:
        run()
    found = [
        (e.name[len(PREFIX) :], e.time_range.start, e.time_range.end)
        for e in p.profiler.function_events
        if e.name.startswith(PREFIX)
    ]
    return sorted(found, key=lambda r: (r[1], -r[2]))


def paths(found) -> list[str]:
    return [name for name, _, _ in found]


def x() -> torch.Tensor:
    return torch.ones(2, 4)


def test_each_module_call_gets_a_range_named_by_its_path_inside_its_parents():
    model = Net()
    hooks = ModuleRanges([model], lambda: True, Faults("run"))
    found = ranges(lambda: model(x()))
    assert paths(found) == ["Net", "Net.enc", "Net.enc.0", "Net.enc.1", "Net.head"]
    at = {name: (start, end) for name, start, end in found}
    for child, parent in [
        ("Net.enc", "Net"),
        ("Net.enc.0", "Net.enc"),
        ("Net.enc.1", "Net.enc"),
        ("Net.head", "Net"),
    ]:
        assert at[parent][0] <= at[child][0] <= at[child][1] <= at[parent][1], (child, parent)
    assert at["Net.enc.0"][1] <= at["Net.enc.1"][0]
    hooks.remove()
    assert ranges(lambda: model(x())) == []  # removed: no range, no hook left


def test_two_models_of_one_class_are_told_apart_and_one_model_attached_twice_once():
    first, second = Net(), Net()
    ModuleRanges([first, first, second], lambda: True, Faults("run"))
    assert paths(ranges(lambda: (first(x()), second(x())))) == [
        "Net",
        "Net.enc",
        "Net.enc.0",
        "Net.enc.1",
        "Net.head",
        "Net_1",
        "Net_1.enc",
        "Net_1.enc.0",
        "Net_1.enc.1",
        "Net_1.head",
    ]


def test_no_ranges_while_the_profiler_does_not_record():
    model, recording = Net(), [False]
    ModuleRanges([model], lambda: recording[0], Faults("run"))
    assert ranges(lambda: model(x())) == []
    recording[0] = True
    assert paths(ranges(lambda: model(x())))[0] == "Net"


def test_no_ranges_from_another_thread(monkeypatch):
    # torch.profiler does not show a range opened on a thread it was not started on: the ranges
    # opened are counted where they are opened
    model, opened = Net(), []
    ModuleRanges([model], lambda: True, Faults("run"))
    enter = module_ranges._enter
    monkeypatch.setattr(module_ranges, "_enter", lambda name: opened.append(name) or enter(name))
    thread = threading.Thread(target=model, args=(x(),))
    thread.start()
    thread.join()
    assert opened == []
    model(x())
    assert opened == [PREFIX + p for p in ("Net", "Net.enc", "Net.enc.0", "Net.enc.1", "Net.head")]


def test_a_modules_range_lies_inside_a_range_its_earlier_hooks_open():
    # as the forward phase's hooks, registered before the module ranges': its range opens first
    # and closes last, so each module's range lies inside it
    model = Net()
    phase = []
    model.register_forward_pre_hook(lambda m, a: phase.append(module_ranges._enter("phase")))
    model.register_forward_hook(lambda m, a, o: module_ranges._exit(phase.pop()))
    ModuleRanges([model], lambda: True, Faults("run"))
    with profile(activities=[ProfilerActivity.CPU]) as p:
        model(x())
    at = {
        e.name: (e.time_range.start, e.time_range.end)
        for e in p.profiler.function_events
        if e.name in ("phase", PREFIX + "Net")
    }
    assert at["phase"][0] <= at[PREFIX + "Net"][0] <= at[PREFIX + "Net"][1] <= at["phase"][1]


def test_no_ranges_under_torch_compile(monkeypatch):
    model = Net()
    ModuleRanges([model], lambda: True, Faults("run"))
    monkeypatch.setattr(module_ranges, "_compiling", lambda: True)
    assert ranges(lambda: model(x())) == []


def test_a_forward_that_raises_leaves_no_range_open():
    model = Net(fail=True)
    hooks = ModuleRanges([model], lambda: True, Faults("run"))

    def run() -> None:
        with pytest.raises(ValueError, match="the forward failed"):
            model(x())
        model.fail = False
        model(x())

    found = ranges(run)
    # the failed call's ranges closed (by the hooks run on the exception), then the next call's
    assert paths(found) == [
        "Net",
        "Net.enc",
        "Net.enc.0",
        "Net.enc.1",
        "Net",
        "Net.enc",
        "Net.enc.0",
        "Net.enc.1",
        "Net.head",
    ]
    assert found[0][2] <= found[4][1]
    hooks.remove()


class Stop(nn.Module):
    """Removes the ranges from inside the forward, as closing the profiler in a forward does."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: ModuleRanges | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hooks.remove()
        return x


def test_ranges_left_open_are_closed_innermost_first_on_removal():
    model = Net()
    model.enc.append(Stop())
    model.enc[2].hooks = hooks = ModuleRanges([model], lambda: True, Faults("run"))
    found = ranges(lambda: model(x()))
    # the ranges open when the hooks went (Net, its enc, the Stop module) were closed, each inside
    # its parent; nothing opened after
    assert paths(found) == ["Net", "Net.enc", "Net.enc.0", "Net.enc.1", "Net.enc.2"]
    at = {name: (start, end) for name, start, end in found}
    assert at["Net"][0] <= at["Net.enc"][0] <= at["Net.enc.2"][0]
    assert at["Net.enc.2"][1] <= at["Net.enc"][1] <= at["Net"][1]
    assert hooks._open == [] and ranges(lambda: model(x())) == []


def test_a_failing_range_is_reported_once_and_the_ranges_stop(monkeypatch):
    model, faults = Net(), Faults("run")
    ModuleRanges([model], lambda: True, faults)
    calls = []

    def broken(name):
        calls.append(name)
        raise RuntimeError("record_function is broken")

    monkeypatch.setattr(module_ranges, "_enter", broken)
    with pytest.warns(RuntimeWarning, match="module ranges failed and were stopped"):
        out = model(x())
    assert out.shape == (2, 1)  # the forward went on
    model(x())
    assert calls == [PREFIX + "Net"]  # stopped after the first failure
    assert faults.lines == [
        "module ranges failed and were stopped (modules=True): RuntimeError: "
        "record_function is broken"
    ]
    monkeypatch.undo()
    assert ranges(lambda: model(x())) == []  # stopped for good


def test_a_range_failing_to_close_is_reported(monkeypatch):
    model, faults = Net(), Faults("run")
    ModuleRanges([model], lambda: True, faults)

    def broken(span):
        raise RuntimeError("cannot close")

    monkeypatch.setattr(module_ranges, "_exit", broken)
    with pytest.warns(RuntimeWarning, match="module ranges failed"):
        assert model(x()).shape == (2, 1)
    assert faults.lines == [
        "module ranges failed and were stopped (modules=True): RuntimeError: cannot close"
    ]

"""The phase ranges (`training_hooks/ranges.py`) as the tools see them: record_function ranges in a
real torch.profiler trace, NVTX pushes and pops as Nsight Systems would (a stand-in for
``torch.cuda.nvtx``, since this build has none)."""

from __future__ import annotations

import torch

from phaseprof.training_hooks import ranges
from phaseprof.training_hooks.ranges import Ranges


class Nvtx:
    """Records NVTX pushes and pops in order (``+name`` / ``-``)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def range_push(self, name: str) -> None:
        self.calls.append("+" + name)

    def range_pop(self) -> None:
        self.calls.append("-")


def _ranges_in(prof: torch.profiler.profile) -> list[tuple[str, int, int]]:
    """The phaseprof ranges of a profile: (name, start, end), by start."""
    found = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.name.startswith("phaseprof::")]
    return sorted(found, key=lambda r: r[1])


def test_recorded_phases_are_ranges_in_the_trace_nested_as_pushed():
    marks = Ranges()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        marks.push("forward", record=True)
        marks.push("loss", record=True)
        torch.ones(4).sum()
        marks.pop()  # loss: the last pushed
        torch.ones(4).sum()
        marks.pop()
    (outer, start, end), (inner, istart, iend) = _ranges_in(prof)
    assert (outer, inner) == ("phaseprof::forward", "phaseprof::loss")
    assert start <= istart and iend < end  # loss closed first, inside forward
    assert marks._open == []


def test_a_phase_not_recorded_leaves_no_range_and_pop_all_closes_every_one():
    marks = Ranges()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        marks.push("data", record=False)
        marks.push("forward", record=True)
        marks.push("backward", record=True)
        marks.pop_all()
    assert [name for name, _, _ in _ranges_in(prof)] == ["phaseprof::forward", "phaseprof::backward"]
    assert marks._open == []
    marks.pop_all()  # nothing open: nothing to do


def test_nvtx_is_left_out_where_torch_has_none(monkeypatch):
    class NoNvtx(Nvtx):  # a CPU build's: every call raises
        def range_push(self, name: str) -> None:
            super().range_push(name)
            raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")

    nvtx = NoNvtx()
    monkeypatch.setattr(torch.cuda, "nvtx", nvtx)
    marks = Ranges()
    assert marks.nvtx is False
    marks.push("forward", record=False)  # probed once, never called again
    marks.pop()
    assert nvtx.calls == ["+phaseprof"]


def test_nvtx_ranges_are_pushed_and_popped_whether_recorded_or_not(monkeypatch):
    nvtx = Nvtx()
    monkeypatch.setattr(torch.cuda, "nvtx", nvtx)
    assert ranges._nvtx_works() is True
    assert nvtx.calls == ["+phaseprof", "-"]  # the probe closes what it opens
    nvtx.calls.clear()
    marks = Ranges()
    assert marks.nvtx is True
    nvtx.calls.clear()
    marks.push("data", record=False)
    marks.push("forward", record=True)
    marks.pop()
    assert len(marks._open) == 1  # checked before pop_all, which loops until nothing is open
    marks.pop_all()
    assert nvtx.calls == ["+phaseprof::data", "+phaseprof::forward", "-", "-"]

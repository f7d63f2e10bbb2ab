"""What event names mean: which ranges mark a phase or a step, which ops belong to autograd.

Phase ranges: phaseprof's own (``phaseprof::<phase>``), then the aliases of each canonical phase in
`phaseprof.contract.PHASE_REGISTRY` (``## forward ##``, Lightning's ``[pl][profile]…`` actions,
plain ``Forward``/``Backward``, torch's automatic annotations). The hook's ``phaseprof::eval`` and
``phaseprof::paused`` ranges mark no phase: they mark time kept out of the steps. Everything here is
a pure function of a name.
"""

from __future__ import annotations

import re

from phaseprof.contract import OUT_OF_STEP, PHASE_REGISTRY, RANGE_PREFIX, range_name

#: (phase, one pattern of all its aliases) in registry order; the aliases live in the contract.
_ALIASES = tuple((p.name, re.compile("|".join(f"(?:{a})" for a in p.aliases))) for p in PHASE_REGISTRY if p.aliases)
#: Step numbers are ASCII digits that fit 63 bits (a longer "number" is not a step marker).
_STEP = re.compile(r"^ProfilerStep#([0-9]{1,18})$")
_AUTOGRAD = re.compile(
    r"^(autograd::engine::evaluate_function: .*"  # today's traces
    r"|torch::autograd::AccumulateGrad"
    r"|(\w+::)*\w+Backward\d*)$"  # 2021 traces name the backward nodes themselves
)
#: The gradient seed `loss.backward()` creates on the calling thread just before the engine starts.
GRAD_SEED = "aten::ones_like"

#: Marks torch writes once per iteration of a training loop, even with no ``ProfilerStep#N``
#: (``torch.autograd.profiler.profile()`` around the loop): what inferred steps are cut from.
LOOP_DATA = "data"
LOOP_ZERO_GRAD = "zero_grad"
LOOP_STEP = "step"
LOOP_SEED = "seed"  # the gradient seed of ``loss.backward()``, found from the ops, not by name alone
_LOOP_MARKERS = (
    (re.compile(r"^enumerate\(DataLoader\)#"), LOOP_DATA),
    (re.compile(r"^Optimizer\.zero_grad#"), LOOP_ZERO_GRAD),
    (re.compile(r"^Optimizer\.step#"), LOOP_STEP),
)


#: The hook's ranges around time kept out of the steps, by name: the kind of time each marks.
_OUT_OF_STEP = {range_name(kind): kind for kind in OUT_OF_STEP}


def out_of_step(name: str) -> str | None:
    """The kind of out-of-step time (``eval``, ``paused``) a range of this name marks, or None."""
    return _OUT_OF_STEP.get(name)


def range_phase(name: str) -> str | None:
    """The phase a range of this name marks, or None (also for out-of-step ranges)."""
    if name in _OUT_OF_STEP:
        return None
    if name.startswith(RANGE_PREFIX):
        return name[len(RANGE_PREFIX) :] or None
    for phase, pattern in _ALIASES:
        if pattern.fullmatch(name):
            return phase
    return None


def step_number(name: str) -> int | None:
    """N for a ``ProfilerStep#N`` range, else None."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def loop_marker(name: str) -> str | None:
    """Which once-per-iteration mark of a training loop a range of this name is, or None."""
    for pattern, kind in _LOOP_MARKERS:
        if pattern.match(name):
            return kind
    return None


def is_autograd(name: str) -> bool:
    """Whether an op of this name is run by the autograd engine (i.e. is backward work)."""
    return bool(_AUTOGRAD.match(name))

"""What event names mean: which ranges mark a phase or a step, which ops belong to autograd.

Sources of phase ranges, most specific first: phaseprof's own ranges; conventions in
the wild (``## forward ##``, Lightning's ``[pl][profile]…`` actions, plain ``Forward``/``Backward``);
torch's automatic annotations. Everything here is a pure function of a name.
"""

from __future__ import annotations

import re

from phaseprof.contract import BACKWARD, DATA, FORWARD, OPTIMIZER, RANGE_PREFIX

_HASH_RANGES = re.compile(r"^##\s*(forward|backward|optimizer|zero_grad|data_load|data)\s*##$", re.I)
_HASH_PHASE = {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, "zero_grad": OPTIMIZER,
               "data_load": DATA, "data": DATA}
_LIGHTNING = re.compile(r"^\[pl\]\[profile\](?P<action>.*)$")
_LIGHTNING_ACTIONS = (
    (re.compile(r"(^|[.\]])training_step$"), FORWARD),
    (re.compile(r"(^|[.\]])backward$"), BACKWARD),
    (re.compile(r"(^|[.\]])optimizer_(step|zero_grad)$"), OPTIMIZER),
    (re.compile(r"(^|[.\]])train_dataloader_next$"), DATA),
)
_PLAIN = {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, "data": DATA}
_TORCH_AUTOMATIC = (
    (re.compile(r"^Optimizer\.(step|zero_grad)#"), OPTIMIZER),
    (re.compile(r"^enumerate\(DataLoader\)#"), DATA),
    (re.compile(r"^(DistributedDataParallel|FullyShardedDataParallel)\.forward$"), FORWARD),
)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_AUTOGRAD = re.compile(
    r"^(autograd::engine::evaluate_function: .*"  # today's traces
    r"|torch::autograd::AccumulateGrad"
    r"|(\w+::)*\w+Backward\d*)$"  # 2021 traces name the backward nodes themselves
)
#: The gradient seed `loss.backward()` creates on the calling thread just before the engine starts.
GRAD_SEED = "aten::ones_like"


def range_phase(name: str) -> str | None:
    """The phase a range of this name marks, or None."""
    if name.startswith(RANGE_PREFIX):
        return name[len(RANGE_PREFIX) :] or None
    m = _HASH_RANGES.match(name)
    if m:
        return _HASH_PHASE[m.group(1).lower()]
    m = _LIGHTNING.match(name)
    if m:
        action = m.group("action")
        for pattern, phase in _LIGHTNING_ACTIONS:
            if pattern.search(action):
                return phase
        return None
    phase = _PLAIN.get(name.lower())
    if phase:
        return phase
    for pattern, phase in _TORCH_AUTOMATIC:
        if pattern.match(name):
            return phase
    return None


def step_number(name: str) -> int | None:
    """N for a ``ProfilerStep#N`` range, else None."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def is_autograd(name: str) -> bool:
    """Whether an op of this name is run by the autograd engine (i.e. is backward work)."""
    return bool(_AUTOGRAD.match(name))

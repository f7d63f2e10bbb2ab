"""Where an attached model and optimizer mark their phases: hooks and wrapped methods, installed
on `Attachment` and undone on `remove`.

* forward: a forward pre-hook (run before the model's other hooks) and an always-called forward hook
  (run after them) on the attached model. A call made while forward is open (the model calling
  itself, or a ``prof.phase("forward")`` around the call) adds nothing. Hooks rather than a wrapped
  ``forward``: ``nn.DataParallel`` copies a module's instance attributes into its replicas, so a
  wrapped ``forward`` would run every replica on the original's parameters; hooks are copied too,
  but only the loop's thread counts them.
* backward: ``torch.autograd.backward``, wrapped while attached. ``Tensor.backward`` calls it by
  attribute lookup, so ``loss.backward()`` (and ``scaler.scale(loss).backward()``, Accelerate's or
  Lightning's backward) runs inside a backward range on the loop's thread, from the gradient seed
  to the return of the autograd engine: the window the trace analysis reads as backward. Module
  backward hooks could not mark it: they run on autograd's threads and see neither the start (the
  loss's own gradient) nor the end. Only calls from the loop's thread count, and none made while
  backward is open (re-entrant calls). ``torch.autograd.grad`` is left alone.
* optimizer: the optimizer's ``step`` and ``zero_grad``, wrapped on the instance (as bound methods,
  so LR schedulers that re-wrap ``optimizer.step`` keep working).
  The step ends right after ``optimizer.step()`` returns. The optimizer's step post-hooks would be
  too early: they run inside torch's own ``Optimizer.step#<Cls>.step`` range, and ending
  ``ProfilerStep#N`` there leaves that range straddling two steps in the trace.

A wrapper replaced on top of ours by someone else stays in place on `remove`; ours then passes every
call straight through.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from phaseprof.contract import BACKWARD, FORWARD, OPTIMIZER

#: ``begin(phase) -> opened``: open a phase unless it is already open or the call is not the loop's;
#: ``end(phase, opened)`` closes what ``begin`` opened. Neither raises.
Begin = Callable[[str], bool]
End = Callable[[str, bool], None]


class Attachment:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, begin: Begin, end: End,
                 on_optimizer_step: Callable[[], None]) -> None:
        self._begin = begin
        self._end = end
        self._forward_opened: list[bool] = []  # per nested forward call: whether it opened the phase
        self._undo: list[Callable[[], None]] = [
            model.register_forward_pre_hook(self._forward_pre, prepend=True).remove,
            model.register_forward_hook(self._forward_post, always_call=True).remove,
        ]
        self._patch(torch.autograd, "backward", self._timed(torch.autograd.backward, BACKWARD))
        if optimizer is not None:
            self._patch_method(optimizer, "zero_grad", OPTIMIZER)
            self._patch_method(optimizer, "step", OPTIMIZER, then=on_optimizer_step)

    def __deepcopy__(self, memo: dict) -> Attachment:
        return self  # a copy of the model (an EMA copy, say) shares its hooks' attachment

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        self._forward_opened.append(self._begin(FORWARD))

    def _forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._forward_opened:  # empty if a hook that runs before ours failed, so ours never ran
            self._end(FORWARD, self._forward_opened.pop())

    def _timed(self, function: Callable, phase: str, then: Callable[[], None] | None = None) -> Callable:
        begin, end = self._begin, self._end

        def timed(*args: Any, **kwargs: Any) -> Any:
            opened = begin(phase)
            try:
                result = function(*args, **kwargs)
            finally:
                end(phase, opened)
            if then is not None:
                then()
            return result

        return functools.update_wrapper(timed, function)

    def _patch_method(self, owner: object, name: str, phase: str, then: Callable[[], None] | None = None) -> None:
        """Replace ``owner.<name>`` by a timed bound method; one call deep when it is a plain method."""
        method = getattr(owner, name)
        if getattr(method, "__self__", None) is owner:
            function = method.__func__
        else:  # a function set on the instance, e.g. an LR scheduler's wrapper of optimizer.step

            def function(_owner: object, *args: Any, **kwargs: Any) -> Any:
                return method(*args, **kwargs)

            functools.update_wrapper(function, method)
        self._patch(owner, name, types.MethodType(self._timed(function, phase, then), owner))

    def _patch(self, owner: object, name: str, replacement: Any) -> None:
        own = vars(owner)
        had_own, previous = name in own, own.get(name)
        setattr(owner, name, replacement)

        def undo() -> None:
            if vars(owner).get(name) is not replacement:
                return  # wrapped again on top of ours: leave it, ours passes through
            if had_own:
                setattr(owner, name, previous)
            else:
                delattr(owner, name)

        self._undo.append(undo)

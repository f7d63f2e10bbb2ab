"""``PhaseProfiler(modules=True)``: a range around each call of each module of the attached models,
named by its path (``phaseprof.module::Net.encoder.layers.3``, `phaseprof.contract.module_range_name`),
from which the TensorBoard side builds its module view.

torch.profiler's own module records (``with_modules=True``) name modules by class and count
(``Linear_3``) and need Python stack tracing; these ranges cost two hook calls and one range per
module call, and only while the profiler records (a flag read otherwise). The range is torch's
``_RecordFunctionFast`` (written as a ``cpu_op`` event), a fifth of ``record_function``'s cost under
the profiler (whose operator calls the profiler records too); `benchmarks/module_ranges.py`. Under
``torch.compile`` the hooks return at once (``is_compiling``: no graph break, no range). The path is
the attached model's class name, then the module's qualified name in it.

Per-module hooks rather than the global ones (``register_module_forward_pre_hook``): global hooks
run before a module's own, so the attached model's range would open before its forward phase range
and close before it ends — ranges that overlap without nesting, which no trace reader can place.
Here the pre-hook runs after the forward phase's (prepended) pre-hook and the post-hook is prepended,
so each module's range lies inside the phase. Backward needs no hook: the TensorBoard side finds each
gradient function's module through the autograd link the trace keeps.

A failing hook never reaches the loop: it is reported once (`Faults`) and the ranges stop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.autograd.profiler import record_function

from phaseprof.contract import module_range_name

from .faults import Faults

_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_Range = getattr(torch._C._profiler, "_RecordFunctionFast", None) or record_function


def _enter(name: str) -> Any:
    span = _Range(name)
    span.__enter__()
    return span


def _exit(span: Any) -> None:
    span.__exit__(None, None, None)


class ModuleRanges:
    """Ranges around the calls of every module of ``models`` on the loop's thread, while
    ``recording()`` says the profiler records."""

    def __init__(self, models: Iterable[nn.Module], recording: Callable[[], bool], faults: Faults) -> None:
        self._recording = recording
        self._faults = faults
        self._thread = threading.get_ident()
        self._open: list[tuple[nn.Module, Any]] = []  # (module, its range), innermost last
        self._failed = False
        self._handles: list[Any] = []
        roots: dict[str, int] = {}
        for model in dict.fromkeys(models):
            root = type(model).__name__
            roots[root] = roots.get(root, -1) + 1
            root = root if not roots[root] else f"{root}_{roots[root]}"  # two attached models of one class
            for qualified, module in model.named_modules():
                name = module_range_name(f"{root}.{qualified}" if qualified else root)
                self._handles += [module.register_forward_pre_hook(self._pre(name)),
                                  module.register_forward_hook(self._post, prepend=True, always_call=True)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._open:  # a forward left by an exception: close its ranges, innermost first
            self._close(self._open.pop()[1])

    def _pre(self, name: str) -> Callable[[nn.Module, Any], None]:
        def pre(module: nn.Module, args: Any) -> None:
            if _compiling() or self._failed or not self._recording() or threading.get_ident() != self._thread:
                return
            try:
                self._open.append((module, _enter(name)))
            except Exception as e:  # noqa: BLE001 - the loop goes on without module ranges
                self._fail(e)
        return pre

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not _compiling() and self._open and self._open[-1][0] is module:
            self._close(self._open.pop()[1])

    def _close(self, span: Any) -> None:
        try:
            _exit(span)
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._faults.report("module ranges failed and were stopped (modules=True)", error)

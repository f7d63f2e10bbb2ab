"""Where the attached models and optimizers mark their phases: hooks and wrapped methods, installed
on `Attachment` and undone on `remove`.

* forward: a forward pre-hook (run before the model's other hooks) and an always-called forward hook
  (run after them) on each attached model (a GAN attaches its generator and its discriminator). A
  call made while forward is open (the model calling itself, one attached model calling another, or
  a ``prof.phase("forward")`` around the call) adds nothing. Hooks rather than a wrapped ``forward``:
  ``nn.DataParallel`` copies a module's instance attributes into its replicas, so a wrapped
  ``forward`` would run every replica on the original's parameters; hooks are copied too, but only
  the loop's thread counts them.
* backward: ``torch.autograd.backward``, wrapped while attached. ``Tensor.backward`` calls it by
  attribute lookup, so ``loss.backward()`` (and ``scaler.scale(loss).backward()``, Accelerate's or
  Lightning's backward) runs inside a backward range on the loop's thread, from the gradient seed
  to the return of the autograd engine: the window the trace analysis reads as backward. Module
  backward hooks could not mark it: they run on autograd's threads and see neither the start (the
  loss's own gradient) nor the end. Only calls from the loop's thread count, and none made while
  backward is open (re-entrant calls). ``torch.autograd.grad`` is left alone.
* optimizer: each attached optimizer's ``step`` and ``zero_grad``, wrapped on the instance (as bound
  methods, so LR schedulers that re-wrap ``optimizer.step`` keep working).
  The step ends right after an ``optimizer.step()`` returns once every attached optimizer has
  stepped since the step began: with one optimizer, at each of its steps; in a GAN loop (the
  discriminator's update, then the generator's), after the last update of the iteration, whatever
  their order; with an optimizer stepped every k-th iteration (a WGAN's generator), after it.
  A closure passed to ``step``, positionally or by keyword (LBFGS, which may call it several times;
  Lightning's training_step and backward), runs outside the optimizer phase: its forward, backward
  and ``zero_grad`` are theirs, the rest of it the phase around the step (``other`` if none). The
  optimizer's step post-hooks would be too early: they run inside torch's own
  ``Optimizer.step#<Cls>.step`` range, and ending ``ProfilerStep#N`` there leaves that range
  straddling two steps in the trace. Accelerate's ``AcceleratedOptimizer.step`` does nothing
  while gradients accumulate (``accelerator.accumulate``): such a call ends no step.
* GradScaler (``torch.amp.GradScaler`` and its subclasses, patched on the class while attached):
  ``unscale_``, ``step`` and ``update`` of the attached optimizer are the optimizer phase, and the
  step ends when ``scaler.update()`` returns, not inside ``scaler.step()``: the update is the step's,
  and a step the scaler skips for inf/NaN gradients (it never calls ``optimizer.step()``) is still a
  step of its own.

* evaluation: in a training loop (an optimizer attached, or, without one, once a backward has run
  on the loop's thread: a loop that runs backward is training), a forward run with grad disabled or
  the model in eval mode is an evaluation pass: from there until the next training work (a forward in
  training mode with grad enabled, a backward, the optimizer's ``zero_grad`` or ``step``, a fetch
  through ``prof.data`` in training mode) the time is kept out of the steps (`tracker.enter_eval`).
* compile: ``torch.compile``'s compilations, reported by Dynamo's compile callbacks, are a
  ``compile`` phase inside the step that triggered them (innermost wins: not forward). The forward
  hooks are excluded from Dynamo's tracing (``torch.compiler.disable``), so a model attached and
  then compiled still runs them around its compiled code, and tracing adds no graph break for them.

A model pickled while attached (``torch.save``, ``pickle``, ``copy.deepcopy``) pickles as it would
detached: its class's ``__getstate__`` is wrapped while attached to leave our hooks out of an attached
instance's state (`_Pickling`), so the checkpoint names nothing of phaseprof's and loads with
``torch.load(weights_only=True)`` where phaseprof is not installed. The optimizer's wrapped methods are
left out of its pickled state by ``Optimizer.__getstate__``.

A wrapper replaced on top of ours by someone else stays in place on `remove`; ours then passes every
call straight through.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from phaseprof.contract import BACKWARD, COMPILE, FORWARD, OPTIMIZER

from .integrations.wrapping import patch
from .tracker import PhaseTracker

_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
_GradScaler = getattr(torch.amp, "GradScaler", None) or torch.cuda.amp.GradScaler  # torch < 2.3: CUDA's only
_disable = getattr(torch.compiler, "disable", lambda f: f)  # torch < 2.1 has no torch.compiler


class Attachment:
    """The hooks of the attached models and optimizers. ``also``: more modules whose forward is the
    forward phase when called on their own (a framework's module calling its submodules);
    ``watch_eval``: tell evaluation passes
    apart from the start (a training loop; without it they are told apart once a backward runs);
    ``on_optimizer_step`` ends a step once every optimizer has stepped since the last (or a
    GradScaler's ``update()`` after that), unless ``optimizers_end_steps`` is False."""

    def __init__(self, models: Iterable[nn.Module], optimizers: Iterable[torch.optim.Optimizer],
                 tracker: PhaseTracker, *, watch_eval: bool, on_optimizer_step: Callable[[], None],
                 optimizers_end_steps: bool = True, also: tuple[nn.Module, ...] = ()) -> None:
        self.models = tuple(models)
        self._tracker = tracker
        self._thread = tracker.thread
        self._watch_eval = watch_eval
        self._forward_opened: list[bool] = []  # per nested forward call: whether it opened the phase
        self._undo: list[Callable[[], None]] = []
        for module in dict.fromkeys((*self.models, *also)):  # each once, in order
            pre = module.register_forward_pre_hook(self._forward_pre, prepend=True)
            post = module.register_forward_hook(self._forward_post, always_call=True)
            self._undo += [pre.remove, post.remove, _Pickling.leave_out(module, (pre.id, post.id))]
        self._patch(torch.autograd, "backward", self._timed(torch.autograd.backward, BACKWARD))
        self._optimizers = tuple(dict.fromkeys(optimizers))  # one given twice is one optimizer
        self._optimizer_ids = {id(o) for o in self._optimizers}
        self._stepped: set[int] = set()  # the optimizers stepped since the step began
        self._on_optimizer_step = on_optimizer_step if optimizers_end_steps else None
        self._in_scaler_step = 0  # scaler.step(optimizer) calls running (the optimizer's step is inside)
        self._in_scaler_update = 0
        self._step_pending = False  # the scaler stepped the last optimizer: its update() ends the step
        for optimizer in self._optimizers:
            self._patch_method(optimizer, "zero_grad", self._timed)
            self._patch_method(optimizer, "step", lambda f, o=optimizer: self._timed_step(f, o))
        if self._optimizers:
            self._scaler_classes: set[type] = set()
            classes = [_GradScaler]
            while classes:  # torch's GradScaler and the subclasses defined so far (the rest at their first step)
                cls = classes.pop()
                self._watch_scaler_class(cls)
                classes += cls.__subclasses__()
        self._watch_compiles()

    def __deepcopy__(self, memo: dict) -> Attachment:
        return self  # never copied: reached only through a hook left in a copy by someone else's pickling

    def __reduce__(self) -> tuple:
        return Detached, ()  # likewise: such a hook unpickles as a no-op

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def training_mode(self) -> bool:
        """Whether the attached models would run a training forward now."""
        return _grad_enabled() and any(m.training for m in self.models)

    # -- the optimizers -----------------------------------------------------------------------------

    def _timed_step(self, function: Callable, optimizer: torch.optim.Optimizer) -> Callable:
        """``optimizer.step`` in the optimizer phase, a closure it is given outside it."""
        tracker = self._tracker
        begin, end, stepped = tracker.begin, tracker.end, self._optimizer_stepped

        def step(owner: object, *args: Any, **kwargs: Any) -> Any:
            if tracker.apart:
                tracker.leave_eval()
            opened = begin(OPTIMIZER)
            try:
                if opened and (args or kwargs):
                    args, kwargs = _closure_apart(tracker, args, kwargs)
                result = function(owner, *args, **kwargs)
            finally:
                end(OPTIMIZER, opened)
            stepped(optimizer)
            return result

        return functools.update_wrapper(step, function)

    def _optimizer_stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """After an attached optimizer's ``step()`` on the loop's thread: the step ends if every
        optimizer has now stepped, unless the call was a no-op of Accelerate's while gradients
        accumulate, or a GradScaler's step runs it (the scaler counts it, its update ends the step)."""
        if self._in_scaler_step or _get_ident() != self._thread:
            return
        if getattr(getattr(optimizer, "gradient_state", None), "sync_gradients", True) is False:
            return
        if self._all_stepped(optimizer) and self._on_optimizer_step is not None:
            self._on_optimizer_step()

    def _all_stepped(self, optimizer: object) -> bool:
        """Count ``optimizer``'s step; True (and start counting again) once every optimizer stepped."""
        if len(self._optimizer_ids) == 1:  # every step of the only one
            return True
        stepped = self._stepped
        stepped.add(id(optimizer))
        if len(stepped) < len(self._optimizer_ids):
            return False
        stepped.clear()
        return True

    def _is_attached(self, optimizer: object) -> bool:
        return id(optimizer) in self._optimizer_ids

    # -- GradScaler -------------------------------------------------------------------------------

    def _watch_scaler_class(self, cls: type) -> None:
        """Time ``unscale_``, ``step`` and ``update`` of the attached optimizers where ``cls`` and its
        bases up to torch's GradScaler define them (a subclass's overrides, e.g. FSDP's
        ShardedGradScaler ``update``)."""
        for klass in cls.__mro__:
            if klass in self._scaler_classes or not issubclass(klass, _GradScaler):
                continue
            self._scaler_classes.add(klass)
            own = vars(klass)
            if "unscale_" in own:
                self._patch(klass, "unscale_", self._scaler_call(own["unscale_"], self._scaler_unscaled))
            if "step" in own:
                self._patch(klass, "step", self._scaler_call(own["step"], self._scaler_stepped))
            if "update" in own:
                self._patch(klass, "update", self._scaler_call(own["update"], self._scaler_updated))

    def _scaler_call(self, function: Callable, around: Callable) -> Callable:
        def call(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            return around(function, scaler, args, kwargs)

        return functools.update_wrapper(call, function)

    def _scaler_unscaled(self, function: Callable, scaler: Any, args: tuple, kwargs: dict) -> Any:
        if not self._is_attached(args[0] if args else kwargs.get("optimizer")):
            return function(scaler, *args, **kwargs)
        return self._as_optimizer(function, scaler, args, kwargs)

    def _as_optimizer(self, function: Callable, scaler: Any, args: tuple, kwargs: dict) -> Any:
        """A scaler's call timed as the optimizer phase (it unscales, steps or updates for it)."""
        opened = self._tracker.begin(OPTIMIZER)
        try:
            return function(scaler, *args, **kwargs)
        finally:
            self._tracker.end(OPTIMIZER, opened)

    def _scaler_stepped(self, function: Callable, scaler: Any, args: tuple, kwargs: dict) -> Any:
        tracker = self._tracker
        optimizer = args[0] if args else kwargs.get("optimizer")
        if not self._is_attached(optimizer) or _get_ident() != self._thread:
            return function(scaler, *args, **kwargs)
        if type(scaler) not in self._scaler_classes:
            self._watch_scaler_class(type(scaler))
        if tracker.apart:
            tracker.leave_eval()
        self._in_scaler_step += 1
        try:
            result = self._as_optimizer(function, scaler, args, kwargs)
        finally:
            self._in_scaler_step -= 1
        if self._all_stepped(optimizer):  # stepped or skipped for inf/NaN gradients: counted either way
            self._step_pending = True
        return result

    def _scaler_updated(self, function: Callable, scaler: Any, args: tuple, kwargs: dict) -> Any:
        if not self._step_pending or _get_ident() != self._thread:
            return function(scaler, *args, **kwargs)
        self._in_scaler_update += 1
        try:
            result = self._as_optimizer(function, scaler, args, kwargs)
        finally:
            self._in_scaler_update -= 1
        if not self._in_scaler_update:  # the outermost update (an override calling its base's)
            self._step_pending = False
            if self._on_optimizer_step is not None:
                self._on_optimizer_step()
        return result

    # -- forward and backward ---------------------------------------------------------------------

    @_disable
    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        tracker = self._tracker
        if self._watch_eval:
            if not (module.training and _grad_enabled()):
                tracker.enter_eval(since_work=True)
                self._forward_opened.append(False)
                return
            if tracker.apart:
                tracker.leave_eval()
        self._forward_opened.append(tracker.begin(FORWARD))

    @_disable
    def _forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._forward_opened:  # empty if a hook that runs before ours failed, so ours never ran
            self._tracker.end(FORWARD, self._forward_opened.pop())

    def _timed(self, function: Callable, phase: str = OPTIMIZER) -> Callable:
        """``function`` in ``phase``: the optimizer's (``zero_grad``) or the backward
        (``torch.autograd.backward``), whose first call on the loop's thread shows the loop trains,
        so evaluation passes are told apart from then on."""
        tracker = self._tracker
        begin, end = tracker.begin, tracker.end
        trains = phase == BACKWARD

        def timed(*args: Any, **kwargs: Any) -> Any:
            if tracker.apart:
                tracker.leave_eval()
            opened = begin(phase)
            if opened and trains:
                self._watch_eval = True
            try:
                return function(*args, **kwargs)
            finally:
                end(phase, opened)

        return functools.update_wrapper(timed, function)

    # -- patching ---------------------------------------------------------------------------------

    def _patch_method(self, owner: object, name: str, timed: Callable[[Callable], Callable]) -> None:
        """Replace ``owner.<name>`` by ``timed(function)`` bound to it, ``function`` taking the owner
        first; one call deep when it is a plain method."""
        method = getattr(owner, name)
        if getattr(method, "__self__", None) is owner:
            function = method.__func__
        else:  # a function set on the instance, e.g. an LR scheduler's wrapper of optimizer.step

            def function(_owner: object, *args: Any, **kwargs: Any) -> Any:
                return method(*args, **kwargs)

            functools.update_wrapper(function, method)
        self._patch(owner, name, types.MethodType(timed(function), owner))

    def _patch(self, owner: object, name: str, replacement: Any) -> None:
        self._undo.append(patch(owner, name, replacement))

    def _watch_compiles(self) -> None:
        """A ``compile`` phase around each torch.compile compilation (Dynamo's callbacks; absent
        before torch 2.4, then compile time stays in the phase that triggered it)."""
        try:
            from torch._dynamo.callback import callback_handler
        except Exception:  # noqa: BLE001 - an old torch, or Dynamo unavailable on this platform
            self.watch_compiles = lambda: None
            return
        tracker = self._tracker
        opened: list[bool] = []

        def start(*args: Any) -> None:
            opened.append(tracker.begin(COMPILE))

        def end(*args: Any) -> None:
            if opened:
                tracker.end(COMPILE, opened.pop())

        def watch() -> None:
            """(Re)register: ``torch._dynamo.reset()`` clears every callback."""
            if start not in callback_handler.start_callbacks:
                callback_handler.register_start_callback(start)
                callback_handler.register_end_callback(end)

        def unwatch() -> None:
            for callbacks, callback in ((callback_handler.start_callbacks, start),
                                        (callback_handler.end_callbacks, end)):
                if callback in callbacks:
                    callbacks.remove(callback)

        watch()
        self.watch_compiles = watch
        self._undo.append(unwatch)


def _closure_apart(tracker: PhaseTracker, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of ``optimizer.step(...)`` with the closure (the first positional argument, or
    ``closure=``) charged as it would be outside the step, however often it is called: what it does
    (a forward, a backward, Lightning's training_step and ``zero_grad``) keeps its own phase, the
    rest is the phase around the step (``other`` where none is open; ``lightning`` for the work
    Lightning wraps around a manual optimizer's closure) — only the update is the optimizer's."""
    closure = kwargs["closure"] if "closure" in kwargs else args[0] if args else None
    if not callable(closure):
        return args, kwargs

    def run_closure(*a: Any, **kw: Any) -> Any:
        tracker.end(OPTIMIZER, True)  # the step's own phase pauses while the closure runs...
        try:
            return closure(*a, **kw)
        finally:
            tracker.begin(OPTIMIZER)  # ...and resumes for the update

    if "closure" in kwargs:
        return args, {**kwargs, "closure": run_closure}
    return (run_closure, *args[1:]), kwargs


class _Pickling:
    """Attached modules pickle as they would detached. ``pickle``, ``torch.save`` and
    ``copy.deepcopy`` take a module's state from its class's ``__getstate__``; while a module is
    attached, its class's is wrapped to leave our hooks (and their flags) out of that module's state.
    Wrapped on the class, not the instance: an instance attribute would be pickled itself."""

    hooks: dict[int, frozenset[int]] = {}  # id of an attached module -> the ids of our hook handles
    classes: dict[type, list] = {}  # class -> [attached modules of it, our wrapper, its own previous or None]
    DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called", "_forward_hooks_with_kwargs",
             "_forward_pre_hooks_with_kwargs")

    @classmethod
    def leave_out(cls, module: nn.Module, hook_ids: tuple[int, ...]) -> Callable[[], None]:
        """Leave ``hook_ids`` out of ``module``'s pickled state until the returned undo is called."""
        key, klass = id(module), type(module)
        cls.hooks[key] = frozenset(hook_ids)
        entry = cls.classes.get(klass)
        if entry is None:
            own = vars(klass).get("__getstate__")
            wrapper = _state_without_hooks(klass.__getstate__)
            klass.__getstate__ = wrapper
            entry = cls.classes[klass] = [0, wrapper, own]
        entry[0] += 1

        def undo() -> None:
            cls.hooks.pop(key, None)
            entry[0] -= 1
            if entry[0] == 0:
                del cls.classes[klass]
                if vars(klass).get("__getstate__") is entry[1]:
                    if entry[2] is not None:
                        klass.__getstate__ = entry[2]
                    else:
                        delattr(klass, "__getstate__")

        return undo


def _state_without_hooks(getstate: Callable) -> Callable:
    def __getstate__(self: nn.Module) -> Any:
        state = getstate(self)
        ours = _Pickling.hooks.get(id(self))
        if ours is None or not isinstance(state, dict):
            return state
        state = dict(state)
        for name in _Pickling.DICTS:
            hooks = state.get(name)
            if hooks and not ours.isdisjoint(hooks):
                state[name] = type(hooks)((k, v) for k, v in hooks.items() if k not in ours)
        return state

    return functools.update_wrapper(__getstate__, getstate)


class Detached:
    """What an `Attachment` unpickles as: hooks that do nothing."""

    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        return None

    def _forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        return None

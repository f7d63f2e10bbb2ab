"""`PhaseProfilerCallback` for Lightning (``lightning.pytorch`` and ``pytorch_lightning``)::

    from phaseprof.lightning import PhaseProfilerCallback
    trainer = L.Trainer(callbacks=[PhaseProfilerCallback(logdir="./profile", wait=1, warmup=1, active=10)])

Where the phases come from, on the PhaseProfiler attached at ``on_train_start`` (after the sanity
check, which is left out):

* forward: the LightningModule's forward, and the forward of each of its direct submodules that
  holds parameters, when ``training_step`` calls it on its own (``self.model(x)``); the outermost
  call counts. The rest of ``training_step`` (metrics, logging, the loss) is ``other``.
* backward: ``loss.backward()`` as in plain loops (Lightning's backward calls it).
* optimizer: the optimizer's own update and ``zero_grad``. Lightning runs ``training_step``,
  ``zero_grad`` and backward inside the closure it passes to ``optimizer.step``; PhaseProfiler
  charges such a closure as if it ran outside the step (`hooks`), so its hooks and the rest of
  ``training_step`` are ``other``, not optimizer. Each ``step`` ends a training step, so with
  ``accumulate_grad_batches`` one step holds all its micro-batches. With several optimizers
  (manual optimization: a GAN's discriminator and generator) each one's ``zero_grad`` and ``step``
  (through the wrappers ``self.optimizers()`` returns, which Lightning makes from the optimizers as
  they are once attached) is the optimizer phase, and a step ends at each
  ``on_train_batch_end`` instead: one step per batch.
* lightning: in manual optimization, Lightning's own wrappers around the work they run:
  ``manual_backward`` (its strategy and precision plugin around ``loss.backward()``) and the
  ``step`` of the optimizers ``self.optimizers()`` returns (``LightningOptimizer``, the strategy's
  ``optimizer_step``). The backward and the update inside them keep their phases; the rest of the
  wrappers' time is the framework's, named so, not ``other``.
* data: Lightning's batch fetch (its ``train_dataloader_next`` action) and the host→device copy
  (``batch_to_device``), together.
* validation (``on_validation_start`` to ``on_validation_end``) is an evaluation pass: out of the
  steps, written as ``phaseprof/eval_ms``.

Under a distributed strategy every rank profiles its own process, as a plain loop's ranks do; with
no ``run`` given, all ranks take rank 0's generated name (each process created its callback at its
own time), so they write one run.

The data actions are read by wrapping the ``start``/``stop`` of the Trainer's own profiler object
(``trainer.profiler``, a no-op unless you chose one), which Lightning calls around each of them;
your profiler still gets every call.
"""

from __future__ import annotations

import importlib
from typing import Any

from phaseprof.contract import DATA, LIGHTNING

from ..profiler import PhaseProfiler
from .wrapping import in_phase, patch

__all__ = ["LIGHTNING", "PhaseProfilerCallback"]


def _callback_bases() -> tuple[type, ...]:
    """Lightning's Callback class of each namespace installed: the callback is an instance of both,
    so either Trainer takes it."""
    bases = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
    if not bases:
        raise ImportError("phaseprof.lightning needs Lightning: pip install 'phaseprof[lightning]'")
    return tuple(bases)


_DATA_ACTIONS = ("train_dataloader_next", "batch_to_device", "on_before_batch_transfer", "transfer_batch_to_device",
                 "on_after_batch_transfer")


def action_phase(action: str) -> str | None:
    """The phase a Lightning profiler action marks while training, if any: the batch fetch and its
    copy to the device are data."""
    return DATA if action.rpartition(".")[2] in _DATA_ACTIONS else None


class PhaseProfilerCallback(*_callback_bases()):
    """Profiles a Lightning Trainer's training steps: PhaseProfiler's arguments (``logdir``,
    ``run``, ``wait``, ``warmup``, ``active``, ``repeat``, and the options of `PhaseProfiler`).
    The profiler is ``callback.profiler``; it closes when training ends."""

    def __init__(self, logdir: str = "./profile", run: str | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int = 10, repeat: int = 1, **options: Any) -> None:
        self.profiler = PhaseProfiler(logdir, run, wait=wait, warmup=warmup, active=active, repeat=repeat, **options)
        self._run_given = run is not None
        self._steps_by_batch = False
        self._undo: list = []

    # -- training ---------------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        prof = self.profiler
        if prof._attachment is not None or prof._state == "closed":
            return
        if not self._run_given:  # each process named its run when it was created: rank 0's wins
            prof._name_run(trainer.strategy.broadcast(prof.run))
        optimizers = list(trainer.optimizers)
        also = tuple(child for child in pl_module.children() if next(child.parameters(), None) is not None)
        self._steps_by_batch = len(optimizers) != 1
        prof._attach(pl_module, optimizers, also=also, watch_eval=True, optimizers_end_steps=not self._steps_by_batch)
        self._wrap_actions(trainer.profiler)
        if not pl_module.automatic_optimization:
            self._wrap_framework(pl_module, trainer.strategy._lightning_optimizers)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._steps_by_batch and self._running():
            self.profiler._end_step()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._running():
            self.profiler._phases.enter_eval(since_work=False)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._running():
            self.profiler._phases.leave_eval()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close()

    # -- internals --------------------------------------------------------------------------------

    def _running(self) -> bool:
        return self.profiler._state == "running"

    def _close(self) -> None:
        while self._undo:
            self._undo.pop()()
        self.profiler.close()

    def _wrap_framework(self, pl_module: Any, optimizers: list) -> None:
        """Lightning's ``manual_backward`` (on the module's class, so that pickling the module
        meets none of ours; only this module's calls are timed) and each ``LightningOptimizer``'s
        ``step`` in the lightning phase."""
        tracker = self.profiler._phases
        cls = type(pl_module)
        self._undo.append(patch(cls, "manual_backward",
                                in_phase(tracker, LIGHTNING, cls.manual_backward, only=pl_module)))
        for optimizer in optimizers:
            wrapped = in_phase(tracker, LIGHTNING, optimizer.step)
            self._undo.append(patch(optimizer, "step", wrapped))

    def _wrap_actions(self, profiler: Any) -> None:
        """Phases from the actions Lightning announces to ``trainer.profiler``."""
        tracker = self.profiler._phases
        start, stop = profiler.start, profiler.stop
        phases: dict[str, str | None] = {}
        opened: dict[str, list[bool]] = {}

        def timed_start(action_name: str) -> None:
            start(action_name)
            phase = phases.get(action_name, "?")
            if phase == "?":
                phase = phases[action_name] = action_phase(action_name)
            if phase is not None:
                opened.setdefault(action_name, []).append(tracker.begin(phase))

        def timed_stop(action_name: str) -> None:
            phase = phases.get(action_name)
            if phase is not None and opened.get(action_name):
                tracker.end(phase, opened[action_name].pop())
            stop(action_name)

        profiler.start, profiler.stop = timed_start, timed_stop

        def undo() -> None:
            for name, ours in (("start", timed_start), ("stop", timed_stop)):
                if vars(profiler).get(name) is ours:
                    delattr(profiler, name)

        self._undo.append(undo)

"""`PhaseProfilerCallback` for the Hugging Face ``transformers`` Trainer::

    from phaseprof.transformers import PhaseProfilerCallback
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[PhaseProfilerCallback(logdir="./profile", wait=1, warmup=1, active=10)])

At ``on_train_begin`` it attaches a PhaseProfiler to the Trainer's model and optimizer (Accelerate's
``AcceleratedOptimizer``, which wraps yours, attaches like a plain one):

* forward: the model's forward, called by ``compute_loss``; the loss the model computes is inside it.
* backward: ``loss.backward()``, which Accelerate's ``backward`` calls.
* optimizer: the optimizer's ``step`` (each one ends a training step, so with
  ``gradient_accumulation_steps`` a step holds all its micro-batches) and ``zero_grad``, and the
  Trainer's ``model.zero_grad()`` (what a plain loop's ``optimizer.zero_grad()`` does). The
  ``AcceleratedOptimizer``'s ``step`` is the optimizer's as a whole: it is the call the Trainer
  makes, its own code a few checks around your optimizer's update (with ``fp16``, the GradScaler's
  ``step`` and ``update``, the optimizer phase in a plain loop too).
* transformers: the Trainer's own wrappers around your phases, named for the framework: its
  ``training_step`` (``model.train()``, moving the inputs, ``compute_loss`` beyond the model's
  forward, the loss's scaling for accumulation, Accelerate's ``backward`` around
  ``loss.backward()``) and the gradient norm and clipping before the optimizer's step
  (``_clip_grad_norm``, ``_get_grad_norm``). The forward and backward inside keep their phases. A
  ``training_step``, ``compute_loss`` or ``compute_loss_func`` of your own is called in its place
  and counts there too.
* other: the LR scheduler's step, callbacks, logging, and the Trainer's loop.
* data: the training DataLoader's fetch of each batch (its iterator's creation included); the
  Trainer fetches all micro-batches of an optimizer step before the first forward. Accelerate's copy
  of the batch to the device is ``other``. It is timed by wrapping the DataLoader's iterator (torch's
  ``DataLoader._get_iterator`` and ``_next_data``); where a DataLoader has neither, the fetch is ``other``.
* evaluation (``evaluate()`` during training, ``eval_strategy``): the Trainer's ``evaluate()``
  call, whole, is one pass kept out of the steps and written as ``phaseprof/eval_ms``. (Where the
  Trainer is not found, its forwards under ``torch.no_grad()`` in eval mode begin the pass, as
  `PhaseProfiler`'s evaluation passes do, and ``on_evaluate`` ends it.)

Under ``torchrun`` every rank profiles its own process, as a plain loop's ranks do; with no ``run``
given, all ranks take rank 0's generated name, so they write one run.

The profiler is ``callback.profiler``; it closes at ``on_train_end``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch.distributed as dist
from torch import nn
from transformers import Trainer, TrainerCallback

from phaseprof.contract import DATA, OPTIMIZER, TRANSFORMERS

from ..profiler import PhaseProfiler
from .wrapping import in_phase, patch

#: The Trainer's methods whose own time is the framework's (`TRANSFORMERS`).
TRAINER_WRAPPERS = ("training_step", "_clip_grad_norm", "_get_grad_norm")


class PhaseProfilerCallback(TrainerCallback):
    """Profiles a ``transformers.Trainer``'s training steps: PhaseProfiler's arguments (``logdir``,
    ``run``, ``wait``, ``warmup``, ``active``, ``repeat``, and the options of `PhaseProfiler`)."""

    def __init__(self, logdir: str = "./profile", run: str | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int = 10, repeat: int = 1, **options: Any) -> None:
        self.profiler = PhaseProfiler(logdir, run, wait=wait, warmup=warmup, active=active, repeat=repeat, **options)
        self._run_given = run is not None
        self._undo: list = []
        self._evaluate_wrapped = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        prof = self.profiler
        if prof._attachment is not None or prof._state == "closed" or model is None:
            return
        if not self._run_given and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            names = [prof.run]  # each process named its run when it was created: rank 0's wins
            dist.broadcast_object_list(names, src=0)
            prof._name_run(names[0])
        prof._attach(model, optimizer, watch_eval=True)
        loader = getattr(train_dataloader, "base_dataloader", train_dataloader)  # Accelerate wraps it
        if loader is not None:
            self._time_fetches(loader)
        self._wrap_trainer(*self._calling_trainer())

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler._state == "running" and not self._evaluate_wrapped:
            self.profiler._phases.leave_eval()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        while self._undo:
            self._undo.pop()()
        self._evaluate_wrapped = False
        self.profiler.close()

    def _calling_trainer(self) -> tuple[Any, Any]:
        """The Trainer whose ``on_train_begin`` this is, and the model its loop trains (the one it
        calls ``zero_grad`` on, wrapped for DDP where it is), from the caller's frames: callbacks
        are not handed the Trainer. ``(None, None)`` where none is found."""
        frame = sys._getframe(1)
        while frame is not None:
            found = frame.f_locals.get("self")
            handler = getattr(found, "callback_handler", None)
            if isinstance(found, Trainer) and self in getattr(handler, "callbacks", ()):
                model = frame.f_locals.get("model")
                return found, model if isinstance(model, nn.Module) else found.model_wrapped
            frame = frame.f_back
        return None, None

    def _wrap_trainer(self, trainer: Any, model: Any) -> None:
        """The Trainer's wrappers (`TRAINER_WRAPPERS`, on the instance) in the transformers phase,
        its ``evaluate()`` an evaluation pass;
        the loop's ``model.zero_grad()`` (on the model's class, so that pickling the model meets
        none of ours; only this model's calls) in the optimizer phase."""
        if trainer is None:
            return
        tracker = self.profiler._phases
        for name in TRAINER_WRAPPERS:
            method = getattr(trainer, name, None)
            if callable(method):
                self._undo.append(patch(trainer, name, in_phase(tracker, TRANSFORMERS, method)))
        evaluate = trainer.evaluate

        def evaluating(*args: Any, **kwargs: Any) -> Any:
            tracker.enter_eval(since_work=False)
            try:
                return evaluate(*args, **kwargs)
            finally:
                tracker.leave_eval()

        functools.update_wrapper(evaluating, evaluate)
        self._undo.append(patch(trainer, "evaluate", evaluating))
        self._evaluate_wrapped = True
        if isinstance(model, nn.Module):
            cls = type(model)
            zero_grad = in_phase(tracker, OPTIMIZER, cls.zero_grad, only=model)
            self._undo.append(patch(cls, "zero_grad", zero_grad))

    def _time_fetches(self, loader: Any) -> None:
        """The data phase around the DataLoader's iterator creation and each fetch."""
        make_iterator = getattr(loader, "_get_iterator", None)
        if make_iterator is None or "_get_iterator" in vars(loader):
            return
        tracker = self.profiler._phases
        attachment = self.profiler._attachment

        def fetching(function: Any) -> Any:
            def fetch(*args: Any, **kwargs: Any) -> Any:
                if tracker.apart and attachment.training_mode():
                    tracker.leave_eval()
                opened = tracker.begin(DATA)
                try:
                    return function(*args, **kwargs)
                finally:
                    tracker.end(DATA, opened)

            return fetch

        @fetching
        def get_iterator() -> Any:
            iterator = make_iterator()
            if callable(getattr(iterator, "_next_data", None)):
                iterator._next_data = fetching(iterator._next_data)
            return iterator

        loader._get_iterator = get_iterator

        def undo() -> None:
            if vars(loader).get("_get_iterator") is get_iterator:
                del loader._get_iterator

        self._undo.append(undo)

"""`PhaseProfilerCallback` for the Hugging Face ``transformers`` Trainer::

    from phaseprof.transformers import PhaseProfilerCallback
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[PhaseProfilerCallback(logdir="./profile", wait=1, warmup=1, active=10)])

At ``on_train_begin`` it attaches a PhaseProfiler to the Trainer's model and optimizer (Accelerate's
``AcceleratedOptimizer``, which wraps yours, attaches like a plain one):

* forward: the model's forward, called by ``compute_loss``; the loss the model computes is inside it.
* backward: ``loss.backward()``, which Accelerate's ``backward`` calls.
* optimizer: the optimizer's ``step`` (each one ends a training step, so with
  ``gradient_accumulation_steps`` a step holds all its micro-batches) and ``zero_grad``. The
  Trainer's ``model.zero_grad()``, gradient clipping and the LR scheduler's step are ``other``.
* data: the training DataLoader's fetch of each batch (its iterator's creation included); the
  Trainer fetches all micro-batches of an optimizer step before the first forward. Accelerate's copy
  of the batch to the device is ``other``. It is timed by wrapping the DataLoader's iterator (torch's
  ``DataLoader._get_iterator`` and ``_next_data``); where a DataLoader has neither, the fetch is ``other``.
* evaluation (``evaluate()`` during training, ``eval_strategy``): its forwards run under
  ``torch.no_grad()`` with the model in eval mode, so the pass is kept out of the steps from its
  first batch (`PhaseProfiler`'s evaluation passes) to ``on_evaluate``, and written as
  ``phaseprof/eval_ms``.

Under ``torchrun`` every rank profiles its own process, as a plain loop's ranks do; with no ``run``
given, all ranks take rank 0's generated name, so they write one run.

The profiler is ``callback.profiler``; it closes at ``on_train_end``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback

from phaseprof.contract import DATA

from ..profiler import PhaseProfiler


class PhaseProfilerCallback(TrainerCallback):
    """Profiles a ``transformers.Trainer``'s training steps: PhaseProfiler's arguments (``logdir``,
    ``run``, ``wait``, ``warmup``, ``active``, ``repeat``, and the options of `PhaseProfiler`)."""

    def __init__(self, logdir: str = "./profile", run: str | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int = 10, repeat: int = 1, **options: Any) -> None:
        self.profiler = PhaseProfiler(logdir, run, wait=wait, warmup=warmup, active=active, repeat=repeat, **options)
        self._run_given = run is not None
        self._undo: list = []

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

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler._state == "running":
            self.profiler._phases.leave_eval()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        while self._undo:
            self._undo.pop()()
        self.profiler.close()

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

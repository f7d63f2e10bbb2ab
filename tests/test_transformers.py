"""The Hugging Face callback on a real ``transformers.Trainer`` (a tiny GPT-2 built from its config,
random tokens, CPU): every step's forward, backward, optimizer, data and transformers (the Trainer's
own wrappers) against independent ``perf_counter`` timers just inside phaseprof's hooks on the
model and its wrappers of ``torch.autograd.backward``, the optimizer, the DataLoader's fetches and
the Trainer's methods (`tests.timing`), and the evaluation passes against timers around
``evaluate()``; gradient accumulation and an evaluation every few steps, in full and in bf16
mixed precision."""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest
import torch
import transformers  # the test extra installs it

from phaseprof.contract import (
    BACKWARD,
    DATA,
    EVAL_TAG,
    FORWARD,
    HOOK_TAG,
    OPTIMIZER,
    OTHER,
    STEP_TAG,
    TRANSFORMERS,
    host_tag,
)
from phaseprof.training_hooks.integrations.transformers import TRAINER_WRAPPERS
from tests.timing import Span, Timers, assert_two_ranks, busy, scalars, time_forward, time_optimizer, traced_steps


class OptimizerClock(transformers.TrainerCallback):
    """Times the Trainer's optimizer (Accelerate's ``AcceleratedOptimizer``) and its loop's
    ``model.zero_grad()`` from just inside the wrappers phaseprof puts on them: listed before
    phaseprof's callback, it wraps them first (the model's class was wrapped before training; its
    calls are timed from here on: the Trainer's first ``zero_grad`` precedes phaseprof's)."""

    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        self.zero_grad_timed = False

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        time_optimizer(optimizer, self.timers, OPTIMIZER)
        self.zero_grad_timed = True


def time_zero_grad(monkeypatch, model, clock: OptimizerClock, timers: Timers) -> None:
    """Time ``model.zero_grad()`` on its class, where phaseprof wraps it."""
    zero_grad = type(model).zero_grad

    def timed(self, *args, **kwargs):
        if self is not model or not clock.zero_grad_timed:
            return zero_grad(self, *args, **kwargs)
        return timers.timed(OPTIMIZER, zero_grad, self, *args, **kwargs)

    monkeypatch.setattr(type(model), "zero_grad", timed)


def time_trainer(trainer, timers: Timers) -> None:
    """Time the Trainer's wrappers from just inside phaseprof's (set on the instance before it)."""
    for name in TRAINER_WRAPPERS:
        method = getattr(trainer, name)
        setattr(trainer, name, functools.partial(timers.timed, TRANSFORMERS, method))


class Collator:
    """Builds a batch from sample indices, with 2 ms of tokenising."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens
        self.training = True

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        busy(0.002)
        ids = self.tokens[indices]
        return {"input_ids": ids, "labels": ids.clone()}


def time_fetches(monkeypatch, timers: Timers, collator: Collator) -> None:
    """Times the training DataLoader's iterator creation and each fetch from just inside the
    wrappers phaseprof puts on them (torch's ``_get_iterator`` and ``_next_data``)."""
    iterator_class = torch.utils.data.dataloader._SingleProcessDataLoaderIter
    for owner, name in ((torch.utils.data.DataLoader, "_get_iterator"), (iterator_class, "_next_data")):
        function = getattr(owner, name)

        def timed(self, function=function):
            if not collator.training:
                return function(self)
            return timers.timed(DATA, function, self)

        monkeypatch.setattr(owner, name, timed)


def train(tmp_path, monkeypatch, timers: Timers, samples: int = 64, **args) -> dict:
    """Train the tiny GPT-2 with the callback, watching phaseprof's clock; its scalars."""
    from phaseprof.transformers import PhaseProfilerCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    time_forward(model, timers, FORWARD)
    tokens = torch.randint(0, 512, (samples, 32), generator=torch.Generator().manual_seed(0))
    collator = Collator(tokens)
    time_fetches(monkeypatch, timers, collator)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
        save_strategy="no", report_to=[], logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True, remove_unused_columns=False, **args)
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run="hf", wait=1, warmup=1, active=3)
    clock = OptimizerClock(timers)
    time_zero_grad(monkeypatch, model, clock, timers)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=list(range(samples)),
                                   eval_dataset=list(range(16)), data_collator=collator,
                                   callbacks=[clock, callback])
    time_trainer(trainer, timers)
    evaluate = trainer.evaluate

    def timed_evaluate(*a, **kw):
        collator.training = False
        try:
            return timers.timed("eval", evaluate, *a, **kw)
        finally:
            collator.training = True

    trainer.evaluate = timed_evaluate
    with timers.watching(), timers.timing_backward():
        trainer.train()
    return scalars(tmp_path / "hf")


def references(timers: Timers, steps: list[int], micro_batches: int) -> dict[str, list[list[Span]]]:
    """Each step's timings of forward, backward, optimizer and data. Data: Accelerate's loader
    fetches one batch ahead, so a step's micro-batches need the next one too, and the first step's
    creates the iterator and fetches the first one as well. A step's optimizer is the
    ``model.zero_grad()`` that ended the step before (not the first's) and its update."""
    fetches = timers.spans(DATA)
    data = [fetches[:micro_batches + 2]] + [fetches[n * micro_batches + 2:(n + 1) * micro_batches + 2]
                                            for n in range(1, len(steps))]
    assert sum(map(len, data)) == len(fetches)
    calls = timers.spans(OPTIMIZER)  # update, zero_grad, update, ...; a last zero_grad at the end
    assert len(calls) == 2 * len(steps)
    optimizer = [calls[:1]] + [calls[2 * n - 1:2 * n + 1] for n in range(1, len(steps))]
    return {FORWARD: timers.per_step(FORWARD, micro_batches),
            BACKWARD: timers.per_step(BACKWARD, micro_batches), OPTIMIZER: optimizer, DATA: data}


def trainer_own(timers: Timers, steps: list[int],
                micro_batches: int) -> list[tuple[float, list[Span]]]:
    """Each step's Trainer wrappers (``training_step`` per micro-batch, then the gradient's norm and
    clipping) less the forward, backward and data inside them: ms, and the timings it came from.
    The transformers phase is that, less the hook's own time at the inner phases' marks."""
    wrappers = timers.per_step(TRANSFORMERS, micro_batches + 2)
    assert len(wrappers) == len(steps)
    out = []
    for spans in wrappers:
        inner = [s for s in timers.log if s.what in (FORWARD, BACKWARD, DATA)
                 and any(w.t0 <= s.t0 and s.t1 <= w.t1 for w in spans)]
        out.append((sum(w.ms for w in spans) - sum(s.ms for s in inner), spans + inner))
    return out


def agree_every_phase(timers: Timers, values: dict, steps: list[int], micro_batches: int) -> None:
    """Forward, backward, optimizer, data (`references`) and transformers (`trainer_own`) of every
    step against the timers."""
    for phase, reference in references(timers, steps, micro_batches).items():
        timers.agree(phase, [values[host_tag(phase)][step] for step in steps], reference)
    # The transformers phase holds the Trainer's own time, but for the hook's at the marks of the
    # inner phases (phaseprof/hook_ms holds it), on every step.
    for step, (own, spans) in zip(steps, trainer_own(timers, steps, micro_batches)):
        gap = own - values[host_tag(TRANSFORMERS)][step]
        slack = 0.5 + sum(map(timers.interrupted_ms, spans))
        hook = values[HOOK_TAG][step]
        assert -slack <= gap <= hook + slack, (step, gap, hook, slack)


def agree_evaluation(timers: Timers, values: dict, at: list[int], capsys) -> None:
    """The passes written at steps ``at``: each the Trainer's ``evaluate()`` within 0.5 ms of the
    timer around it, and the summary's count and total equal to the timers'."""
    evals = timers.spans("eval")
    assert sorted(values[EVAL_TAG]) == at
    for step, span in zip(at, evals):
        slack = 0.5 + timers.interrupted_ms(span)
        measured = values[EVAL_TAG][step]
        assert abs(measured - span.ms) <= slack, (step, measured, span.ms)
    out = capsys.readouterr().out
    said = r"evaluation, outside the steps: (\d+) pass\(es\), ([\d,.]+) ms in all"
    count, total = next(m.groups() for m in map(re.compile(said).match, out.splitlines()) if m)
    assert int(count) == len(evals) == len(at)
    reference = sum(span.ms for span in evals)
    slack = 0.5 + sum(map(timers.interrupted_ms, evals))
    assert abs(float(total.replace(",", "")) - reference) <= slack, (count, total, reference)


@pytest.mark.slow
def test_transformers_steps_match_independent_timers(tmp_path, monkeypatch, capsys):
    timers = Timers()
    values = train(tmp_path, monkeypatch, timers, max_steps=8, gradient_accumulation_steps=2, eval_strategy="steps",
                   eval_steps=4)

    steps = sorted(values[STEP_TAG])
    assert steps == list(range(8))  # one step per optimizer step, 2 micro-batches each; evaluation adds none
    agree_every_phase(timers, values, steps, micro_batches=2)
    # Evaluation after steps 3 and 7 (eval_steps=4), kept out of the steps.
    agree_evaluation(timers, values, [4, 8], capsys)


@pytest.mark.slow
def test_transformers_bf16_mixed_precision(tmp_path, monkeypatch):
    """``bf16=True`` on CPU: Accelerate runs the model's forward under autocast; the phases are the same."""
    timers = Timers()
    values = train(tmp_path, monkeypatch, timers, max_steps=5, bf16=True)
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(5))
    agree_every_phase(timers, values, steps, micro_batches=1)


DDP_SCRIPT = """
import os, sys
import torch, transformers
from phaseprof.transformers import PhaseProfilerCallback

torch.manual_seed(0)
torch.set_num_threads(1)
config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)
tokens = torch.randint(0, 512, (64, 32), generator=torch.Generator().manual_seed(0))

def collate(indices):
    ids = tokens[indices]
    return {"input_ids": ids, "labels": ids.clone()}

args = transformers.TrainingArguments(
    output_dir=sys.argv[2], max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
    save_strategy="no", report_to=[], logging_strategy="no", use_cpu=True, ddp_backend="gloo",
    dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False)
callback = PhaseProfilerCallback(logdir=sys.argv[1], wait=0, warmup=1, active=2)  # no run: a generated name
trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=list(range(64)),
                               data_collator=collate, callbacks=[callback])
trainer.train()
# The callback closed its profiler when training ended. Leave without the interpreter's finalization:
# there torch's gloo process group sometimes aborts ("terminate called without an active exception"),
# with the callback or without it.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_transformers_under_torchrun_two_ranks(tmp_path):
    """The Trainer under ``torchrun --nproc_per_node 2`` (gloo, CPU): each rank writes its trace and
    its scalars into one run, one step per optimizer step."""
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    logdir = tmp_path / "profile"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
               str(logdir), str(tmp_path / "out")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_two_ranks(logdir, steps=4)


def test_an_accelerate_loop_attaches_like_a_plain_one(tmp_path):
    """A loop of Accelerate's own, as its docs write it (prepare, ``accumulate``, its backward):
    PhaseProfiler attaches to the prepared model and the ``AcceleratedOptimizer``; with gradient
    accumulation a step is an optimizer step, though ``optimizer.step()`` is called on every
    micro-batch (Accelerate makes it a no-op until the gradients are synced)."""
    from accelerate import Accelerator

    from phaseprof import PhaseProfiler

    torch.manual_seed(0)
    timers = Timers()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randint(0, 10, (64,)))
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01),
                                                   torch.utils.data.DataLoader(data, batch_size=8))
    time_forward(model, timers, FORWARD)
    time_optimizer(optimizer, timers, OPTIMIZER)
    with timers.watching(), timers.timing_backward(), \
            PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=2) as prof:
        prof.attach(model, optimizer)
        for x, y in prof.data(loader):
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

    values = scalars(tmp_path / "r")
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(4))  # 8 micro-batches, 2 per optimizer step
    # A step's optimizer calls: the previous step's zero_grad, then step and zero_grad (no-ops) and
    # the step that syncs; the last zero_grad opens a step with no training work, dropped at close.
    calls = timers.spans(OPTIMIZER)
    optimizer_calls = [calls[:3]] + [calls[4 * n - 1:4 * n + 3] for n in range(1, 4)]
    for phase, reference in ((FORWARD, timers.per_step(FORWARD, 2)), (BACKWARD, timers.per_step(BACKWARD, 2)),
                             (OPTIMIZER, optimizer_calls)):
        timers.agree(phase, [values[host_tag(phase)][step] for step in steps], reference)


# -- fast: a tiny model, a few steps, what the callback writes (tests/mutation.py runs these) -----


class TinyModel(torch.nn.Module):
    """A model as the Trainer calls it: keyword inputs, a dict with the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
        self.evaluated = 0  # samples seen in eval mode

    def forward(self, x, labels=None):
        self.evaluated += 0 if self.training else len(x)
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def tiny_train(tmp_path, samples: int, run: str | None = "hf", callback_args: dict | None = None,
               callbacks: tuple = (), **args):
    """``TinyModel`` trained one epoch of ``samples`` samples, 2 a batch, with the callback; the
    trainer."""
    from phaseprof.transformers import PhaseProfilerCallback

    torch.manual_seed(0)
    data = [{"x": torch.randn(8), "labels": i % 2} for i in range(samples)]
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run=run, analyze_traces=False,
                                     **(callback_args or dict(wait=0, warmup=1, active=1)))
    trainer = transformers.Trainer(
        model=TinyModel(), train_dataset=data, eval_dataset=data[:2],
        callbacks=[*callbacks, callback],
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), num_train_epochs=1, per_device_train_batch_size=2,
            per_device_eval_batch_size=2, save_strategy="no", report_to=[], logging_strategy="no",
            use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False,
            **args))
    for other in trainer.callback_handler.callbacks:
        other.trainer = trainer  # a callback of the test's own that needs it
    trainer.train()
    return trainer


def test_a_trainer_is_timed_step_by_step_with_its_evaluations_kept_out(tmp_path, capsys):
    """2 micro-batches a step: each step's forward, backward, optimizer, data and the Trainer's own
    wrappers; each evaluation outside the steps; everything undone when training ends."""
    trainer = tiny_train(tmp_path, 8, gradient_accumulation_steps=2, eval_strategy="steps",
                         eval_steps=1)
    values = scalars(tmp_path / "hf")
    steps = sorted(values[STEP_TAG])
    assert steps == [0, 1]
    for phase in (FORWARD, BACKWARD, OPTIMIZER, DATA, TRANSFORMERS, OTHER):  # each phase ends
        assert all(values[host_tag(phase)][step] > 0 for step in steps), phase
    assert len(values[EVAL_TAG]) == 2
    out = capsys.readouterr().out
    assert "phaseprof run hf: 2 step(s) timed" in out
    assert "evaluation, outside the steps: 2 pass(es)" in out
    assert not set(vars(trainer)) & {*TRAINER_WRAPPERS, "evaluate"}
    assert "zero_grad" not in vars(TinyModel)
    assert "_get_iterator" not in vars(trainer.get_train_dataloader().base_dataloader)


def test_the_callbacks_schedule_is_phaseprofilers(tmp_path):
    """By default steps 2 to 11 are traced (wait 1, warm-up 1, active 10), as with PhaseProfiler."""
    tiny_train(tmp_path, 26, run="default", callback_args=dict(gzip=False))
    assert traced_steps(tmp_path / "default") == list(range(2, 12))
    tiny_train(tmp_path, 10, run="warm", callback_args=dict(gzip=False, wait=0, warmup=3, active=1))
    assert traced_steps(tmp_path / "warm") == [3]


def test_an_evaluation_a_users_callback_calls_is_kept_out_of_the_step(tmp_path):
    """``trainer.evaluate(data)`` from the user's callback, after step 1: an evaluation pass, the
    method still the Trainer's to look at."""

    class EvaluateOnce(transformers.TrainerCallback):
        trainer: transformers.Trainer
        seen: tuple = ()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                evaluate = self.trainer.evaluate
                self.seen = (evaluate.__name__,
                             evaluate.__doc__ == transformers.Trainer.evaluate.__doc__)
                evaluate([{"x": torch.randn(8), "labels": 1}] * 6)  # not the Trainer's 2

    user = EvaluateOnce()
    trainer = tiny_train(tmp_path, 6, callbacks=(user,))
    values = scalars(tmp_path / "hf")
    assert sorted(values[STEP_TAG]) == [0, 1, 2] and len(values[EVAL_TAG]) == 1
    assert user.seen == ("evaluate", True)
    assert trainer.model.evaluated == 6  # the data it was given


def test_a_run_not_named_is_named_for_its_start(tmp_path):
    tiny_train(tmp_path, 2, run=None)
    (run,) = [p.name for p in tmp_path.iterdir() if p.name != "out"]
    assert re.fullmatch(r"\d{8}-\d{6}", run), run

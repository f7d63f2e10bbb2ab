"""The Hugging Face callback on a real ``transformers.Trainer`` (a tiny GPT-2 built from its config,
random tokens, CPU): every step's forward, backward, optimizer and data against independent
``perf_counter`` timers inside the model, around Accelerate's backward, between the Trainer's own
``on_pre_optimizer_step`` and ``on_optimizer_step`` events and in the data collator; gradient
accumulation and an evaluation every few steps."""

from __future__ import annotations

import time

import pytest
import torch

from phaseprof.contract import BACKWARD, DATA, EVAL_TAG, FORWARD, OPTIMIZER, PROFILER_TAG, STEP_TAG, cpu_tag
from tests.timing import Timers, agree, scalars

transformers = pytest.importorskip("transformers")  # an extra of the package; the test extra installs it


class TimedGPT2(transformers.GPT2LMHeadModel):
    timers: Timers

    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(*args, **kwargs)
        return self.timers.timed(FORWARD, super().forward, *args, **kwargs)


class OptimizerClock(transformers.TrainerCallback):
    """The Trainer's events right before and after ``optimizer.step()``."""

    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        self.t0 = 0.0

    def on_pre_optimizer_step(self, *args, **kwargs) -> None:
        self.t0 = time.perf_counter()

    def on_optimizer_step(self, *args, **kwargs) -> None:
        self.timers.log.append((OPTIMIZER, (time.perf_counter() - self.t0) * 1e3))


class Collator:
    """Builds a batch from sample indices; 2 ms of tokenising per batch, timed while training."""

    def __init__(self, tokens: torch.Tensor, timers: Timers) -> None:
        self.tokens = tokens
        self.timers = timers
        self.training = True

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        time.sleep(0.002)
        ids = self.tokens[indices]
        batch = {"input_ids": ids, "labels": ids.clone()}
        if self.training:
            self.timers.log.append((DATA, (time.perf_counter() - t0) * 1e3))
        return batch


@pytest.mark.slow
def test_transformers_steps_match_independent_timers(tmp_path, capsys):
    from phaseprof.transformers import PhaseProfilerCallback

    torch.manual_seed(0)
    timers = Timers()
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)
    model = TimedGPT2(config)
    model.timers = timers
    tokens = torch.randint(0, 512, (64, 32), generator=torch.Generator().manual_seed(0))
    collator = Collator(tokens, timers)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=8, per_device_train_batch_size=4, per_device_eval_batch_size=8,
        gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=4, save_strategy="no", report_to=[],
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False)
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run="hf", wait=1, warmup=1, active=3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=list(range(64)),
                                   eval_dataset=list(range(16)), data_collator=collator,
                                   callbacks=[OptimizerClock(timers), callback])
    backward = trainer.accelerator.backward
    trainer.accelerator.backward = lambda loss, **kw: timers.timed(BACKWARD, backward, loss, **kw)
    evaluate = trainer.evaluate

    def timed_evaluate(*a, **kw):
        collator.training = False
        try:
            return timers.timed("eval", evaluate, *a, **kw)
        finally:
            collator.training = True

    trainer.evaluate = timed_evaluate
    trainer.train()

    values = scalars(tmp_path / "hf")
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(8))  # one step per optimizer step, 2 micro-batches each; evaluation adds none
    # Accelerate's loader fetches one batch ahead: a step's two batches need the next one too, the
    # first step's also the first; the last step fetches none (the epoch has ended).
    fetches = [ms for name, ms in timers.log if name == DATA]
    assert len(fetches) == 16
    data = [sum(fetches[:3])] + [fetches[2 * n + 1] + fetches[2 * n + 2] for n in range(1, 7)] + [0.0]
    # The Trainer's events around optimizer.step() also hold the profiler's own time after the step.
    optimizer = [ms - values[PROFILER_TAG][step] for step, ms in zip(steps, timers.per_step(OPTIMIZER, 1))]
    for phase, reference in ((FORWARD, timers.per_step(FORWARD, 2)), (BACKWARD, timers.per_step(BACKWARD, 2)),
                             (OPTIMIZER, optimizer), (DATA, data)):
        agree(phase, [values[cpu_tag(phase)][step] for step in steps], reference)
    # Evaluation after steps 3 and 7 (eval_steps=4), kept out of the steps.
    evals = [ms for name, ms in timers.log if name == "eval"]
    assert sorted(values[EVAL_TAG]) == [4, 8]
    for measured, reference in zip((values[EVAL_TAG][4], values[EVAL_TAG][8]), evals):
        assert 0.8 * reference <= measured <= 1.2 * reference + 5, (measured, reference)
    assert "evaluation, outside the steps: 2 pass(es)" in capsys.readouterr().out

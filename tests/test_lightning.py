"""The Lightning callback on a real Lightning Trainer (tiny model, random data, CPU): every step's
forward, backward, optimizer and data against independent ``perf_counter`` timers inside the model,
the module's backward, the optimizer and the data loader's collate; extra work in training_step,
gradient accumulation and a validation loop every few steps."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from phaseprof.contract import BACKWARD, DATA, EVAL_TAG, FORWARD, OPTIMIZER, OTHER, STEP_TAG, cpu_tag
from tests.timing import Timers, agree, scalars

L = pytest.importorskip("lightning.pytorch")  # an extra of the package; the test extra installs it


class TimedSGD(torch.optim.SGD):
    """SGD whose update and zero_grad time themselves (the closure Lightning passes runs untimed)."""

    timers: Timers

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.timers.timed(OPTIMIZER, super().step)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.timers.timed(OPTIMIZER, super().zero_grad, set_to_none)


class Net(torch.nn.Module):
    """A small MLP with its own forward timer."""

    def __init__(self, timers: Timers) -> None:
        super().__init__()
        self.timers = timers
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                          torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def forward(self, x):
        if not (self.training and torch.is_grad_enabled()):
            return self.layers(x)
        return self.timers.timed(FORWARD, self.layers, x)


class Module(L.LightningModule):
    """training_step calls its submodule (self.net), then does 3 ms of extra work (metrics)."""

    def __init__(self, timers: Timers) -> None:
        super().__init__()
        self.timers = timers
        self.net = Net(timers)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        time.sleep(0.003)  # metric work: other, never forward or optimizer
        return loss

    def backward(self, loss, *args, **kwargs):
        self.timers.timed(BACKWARD, loss.backward)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if not self.trainer.training:
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        return self.timers.timed("h2d", super().transfer_batch_to_device, batch, device, dataloader_idx)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(0.01)
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        optimizer = TimedSGD(self.parameters(), lr=0.01)
        optimizer.timers = self.timers
        return optimizer


class Batches(torch.utils.data.Dataset):
    """Random batches; fetching one (indexing a whole batch) takes 10 ms of decoding."""

    def __init__(self, batches: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(batches * 16, 64, generator=g)
        self.y = torch.randint(0, 10, (batches * 16,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices: list[int]):
        time.sleep(0.01)
        return self.x[indices], self.y[indices]


class TimedLoader(DataLoader):
    """A DataLoader whose iterator times each batch it yields (sampler, dataset, collate)."""

    timers: Timers | None = None

    def __iter__(self):
        batches = None
        while True:
            t0 = time.perf_counter()
            try:
                if batches is None:  # the first fetch creates the iterator
                    batches = super().__iter__()
                batch = next(batches)
            except StopIteration:
                return
            if self.timers is not None:
                self.timers.log.append((DATA, (time.perf_counter() - t0) * 1e3))
            yield batch


def loader(timers: Timers | None, batches: int, seed: int) -> DataLoader:
    dataset = Batches(batches, seed)
    sampler = BatchSampler(SequentialSampler(dataset), batch_size=16, drop_last=False)
    timed = TimedLoader(dataset, batch_size=None, sampler=sampler)
    timed.timers = timers
    return timed


@pytest.mark.slow
def test_lightning_steps_match_independent_timers(tmp_path, capsys):
    from phaseprof.lightning import PhaseProfilerCallback

    torch.manual_seed(0)
    timers = Timers()
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run="lightning", wait=1, warmup=1, active=3)
    trainer = L.Trainer(max_epochs=1, accumulate_grad_batches=2, val_check_interval=8, callbacks=[callback],
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1)
    trainer.fit(Module(timers), loader(timers, 24, seed=0), loader(None, 3, seed=1))

    values = scalars(tmp_path / "lightning")
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(12))  # 24 batches, 2 per optimizer step; validation adds none
    # Data: the fetch of both micro-batches, and their copy to the device (transfer_batch_to_device).
    data = [fetch + copy for fetch, copy in zip(timers.per_step(DATA, 2), timers.per_step("h2d", 2))]
    for phase, reference in ((FORWARD, timers.per_step(FORWARD, 2)), (BACKWARD, timers.per_step(BACKWARD, 2)),
                             (OPTIMIZER, timers.per_step(OPTIMIZER, 2)),  # zero_grad in the closure, the update
                             (DATA, data)):
        agree(phase, [values[cpu_tag(phase)][step] for step in steps], reference)
    # The 3 ms of extra work per micro-batch in training_step is other, not optimizer.
    assert all(values[cpu_tag(OTHER)][step] >= 6 for step in steps)
    # Validation every 8 batches (after steps 3 and 7) and at the end of the epoch, never in a step.
    assert len(values[EVAL_TAG]) == 3 and all(ms >= 30 for ms in values[EVAL_TAG].values())
    assert "evaluation, outside the steps: 3 pass(es)" in capsys.readouterr().out


@pytest.mark.slow
def test_traces_of_lightnings_own_pytorch_profiler_read_with_the_optimizer_phase(tmp_path):
    """Lightning's PyTorchProfiler ends its ProfilerSteps inside the optimizer's step: the
    optimizer's update still reads as optimizer, never as other."""
    from lightning.pytorch.profilers import PyTorchProfiler

    from phaseprof import analyze

    class AdamModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), foreach=False)

    torch.manual_seed(0)
    profiler = PyTorchProfiler(dirpath=str(tmp_path), filename="pl",
                               schedule=torch.profiler.schedule(wait=1, warmup=1, active=4),
                               on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path / "traces")))
    trainer = L.Trainer(max_steps=8, profiler=profiler, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(AdamModule(), loader(None, 8, seed=0))
    rows = analyze(str(tmp_path / "traces"))["runs"][0]["workers"][0]["steps"]
    assert len(rows) >= 3
    for row in rows[1:]:  # the first step holds no update: its optimizer step began before the window
        detail = analyze(str(tmp_path / "traces"), step=row["step"])["runs"][0]["workers"][0]["detail"]
        optimizer_ops = {op["name"] for op in detail["ops"].get(OPTIMIZER, [])}
        other_ops = {op["name"] for op in detail["ops"].get(OTHER, [])}
        assert "aten::addcdiv_" in optimizer_ops and "aten::addcdiv_" not in other_ops, (row["step"], other_ops)
        assert row["phases"][OPTIMIZER]["cpu_ms"] > 0

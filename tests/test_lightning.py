"""The Lightning callback on a real Lightning Trainer (tiny model, random data, CPU): every step's
forward, backward, optimizer and data against independent ``perf_counter`` timers just inside
phaseprof's hooks on the model and wrappers of ``torch.autograd.backward`` and the optimizer, in
the data loader and the copy to the device (`tests.timing`);
extra work in training_step, gradient accumulation and a validation loop every few steps, in full
and in bf16 mixed precision, and with fp16's GradScaler."""

from __future__ import annotations

import subprocess
import sys

import lightning.pytorch as L  # the test extra installs it
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.profilers import PassThroughProfiler
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from phaseprof.contract import (
    BACKWARD,
    DATA,
    EVAL_TAG,
    FORWARD,
    HOOK_TAG,
    OPTIMIZER,
    OTHER,
    STEP_TAG,
    host_tag,
)
from phaseprof.training_hooks.integrations.lightning import LIGHTNING
from tests.timing import (
    TimedGradScaler,
    Timers,
    assert_two_ranks,
    busy,
    scalars,
    time_forward,
    time_optimizer,
    traced_steps,
)


class Module(L.LightningModule):
    """training_step calls its submodule (self.net), then does 3 ms of extra work (metrics)."""

    def __init__(self, timers: Timers) -> None:
        super().__init__()
        self.timers = timers
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                       torch.nn.ReLU(), torch.nn.Linear(256, 10))
        time_forward(self.net, timers, FORWARD)

    inf_at: int | None = None  # the batch whose gradients get an inf

    def training_step(self, batch, batch_idx):
        self.batch_idx = batch_idx
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        busy(0.003)  # metric work: other, never forward or optimizer
        return loss

    def on_before_batch_transfer(self, batch, dataloader_idx):
        if self.trainer.training:  # Lightning calls it on its own, before the strategy's batch_to_device
            self.timers.stop("h2d", self.timers.start())
        return batch

    def on_after_backward(self):
        if self.batch_idx == self.inf_at:
            self.net[0].weight.grad[0, 0] = float("inf")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        busy(0.01)
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        time_optimizer(optimizer, self.timers, OPTIMIZER)
        return optimizer


class Batches(torch.utils.data.Dataset):
    """Random batches; fetching one (indexing a whole batch) takes 5 ms of decoding."""

    def __init__(self, batches: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(batches * 16, 64, generator=g)
        self.y = torch.randint(0, 10, (batches * 16,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices: list[int]):
        busy(0.005)
        return self.x[indices], self.y[indices]


class TimedLoader(DataLoader):
    """A DataLoader whose iterator times each batch it yields (sampler, dataset, collate)."""

    timers: Timers | None = None

    def __iter__(self):
        batches = None
        while True:
            started = self.timers.start() if self.timers is not None else None
            try:
                if batches is None:  # the first fetch creates the iterator
                    batches = super().__iter__()
                batch = next(batches)
            except StopIteration:
                return
            if started is not None:
                self.timers.stop(DATA, started)
            yield batch


def loader(timers: Timers | None, batches: int, seed: int) -> DataLoader:
    dataset = Batches(batches, seed)
    sampler = BatchSampler(SequentialSampler(dataset), batch_size=16, drop_last=False)
    timed = TimedLoader(dataset, batch_size=None, sampler=sampler)
    timed.timers = timers
    return timed


def fit(tmp_path, timers: Timers, batches: int, val_batches: int = 0, inf_at: int | None = None,
        **trainer_args) -> dict:
    """Train one epoch of ``Module`` with the callback, watching phaseprof's clock; its scalars."""
    from phaseprof.lightning import PhaseProfilerCallback

    torch.manual_seed(0)
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run="lightning", wait=1, warmup=1, active=3)
    trainer = L.Trainer(max_epochs=1, callbacks=[callback], accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=val_batches, num_sanity_val_steps=min(1, val_batches), **trainer_args)
    batch_to_device = trainer.strategy.batch_to_device  # the copy to the device, with the module's hooks

    def timed_batch_to_device(*args, **kwargs):
        if not trainer.training:
            return batch_to_device(*args, **kwargs)
        return timers.timed("h2d", batch_to_device, *args, **kwargs)

    trainer.strategy.batch_to_device = timed_batch_to_device
    with timers.watching(), timers.timing_backward():
        module = Module(timers)
        module.inf_at = inf_at
        trainer.fit(module, loader(timers, batches, seed=0),
                    loader(None, val_batches, seed=1) if val_batches else None)
    return scalars(tmp_path / "lightning")


def agree_every_phase(timers: Timers, values: dict, steps: list[int], micro_batches: int,
                      optimizer_calls: int = 3) -> None:
    """Forward, backward, optimizer (zero_grad in the closure, the step around the closure; or the
    scaler's calls) and data (the fetch of each micro-batch, the module's on_before_batch_transfer
    and the strategy's copy to the device) of every step against the timers."""
    data = [fetch + copy for fetch, copy in zip(timers.per_step(DATA, micro_batches),
                                                timers.per_step("h2d", 2 * micro_batches))]
    for phase, reference in ((FORWARD, timers.per_step(FORWARD, micro_batches)),
                             (BACKWARD, timers.per_step(BACKWARD, micro_batches)),
                             (OPTIMIZER, timers.per_step(OPTIMIZER, optimizer_calls)), (DATA, data)):
        timers.agree(phase, [values[host_tag(phase)][step] for step in steps], reference)


@pytest.mark.slow
def test_lightning_steps_match_independent_timers(tmp_path, capsys):
    timers = Timers()
    values = fit(tmp_path, timers, 24, val_batches=3, accumulate_grad_batches=2, val_check_interval=8)

    steps = sorted(values[STEP_TAG])
    assert steps == list(range(12))  # 24 batches, 2 per optimizer step; validation adds none
    agree_every_phase(timers, values, steps, micro_batches=2)
    # The 3 ms of extra work per micro-batch in training_step is other, not optimizer.
    assert all(values[host_tag(OTHER)][step] >= 6 for step in steps)
    # Validation every 8 batches (after steps 3 and 7) and at the end of the epoch, never in a step.
    assert len(values[EVAL_TAG]) == 3 and all(ms >= 30 for ms in values[EVAL_TAG].values())
    assert "evaluation, outside the steps: 3 pass(es)" in capsys.readouterr().out


@pytest.mark.slow
def test_lightning_bf16_mixed_precision(tmp_path):
    """``precision="bf16-mixed"``: the forward runs under autocast, the phases are the same."""
    timers = Timers()
    values = fit(tmp_path, timers, 6, precision="bf16-mixed")
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(6))
    agree_every_phase(timers, values, steps, micro_batches=1)


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
        assert row["phases"][OPTIMIZER]["host_ms"] > 0


@pytest.mark.slow
def test_lightning_fp16_with_its_grad_scaler(tmp_path):
    """Lightning's fp16 AMP path with its GradScaler (on CPU through an explicit plugin): the
    scaler's unscale_, step and update are the optimizer phase, and the step the scaler skips for an
    inf gradient is a step of its own."""
    from lightning.pytorch.plugins import MixedPrecision

    timers = Timers()
    scaler = TimedGradScaler(timers, OPTIMIZER, "cpu")
    values = fit(tmp_path, timers, 6, inf_at=2, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert scaler.get_scale() == 2.0**15  # halved once: batch 2's step was skipped
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(6))
    agree_every_phase(timers, values, steps, micro_batches=1, optimizer_calls=4)  # zero_grad, unscale_, step, update


class Gan(L.LightningModule):
    """Lightning's GAN example, manual optimization: per batch the discriminator's update, then the
    generator's, each through ``self.optimizers()``, ``manual_backward`` and ``step``."""

    def __init__(self, timers: Timers) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.timers = timers
        self.generator = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LeakyReLU(0.2),
                                                 torch.nn.Linear(128, 1))
        time_forward(self.generator, timers, FORWARD)
        time_forward(self.discriminator, timers, FORWARD)

    def training_step(self, batch, batch_idx):
        real = batch[0]
        opt_g, opt_d = self.optimizers()
        fake = self.generator(torch.randn(len(real), 16))
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        loss_d = (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), zeros))
        opt_d.zero_grad()
        self.timers.timed(LIGHTNING, self.manual_backward, loss_d, inside=False)
        self.timers.timed(LIGHTNING, opt_d.step, inside=False)
        loss_g = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        opt_g.zero_grad()
        self.timers.timed(LIGHTNING, self.manual_backward, loss_g, inside=False)
        self.timers.timed(LIGHTNING, opt_g.step, inside=False)
        busy(0.003)  # logging: other
        self.log_dict({"d": loss_d, "g": loss_g})

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-4)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=2e-4)
        for optimizer in (opt_g, opt_d):
            time_optimizer(optimizer, self.timers, OPTIMIZER)
        return opt_g, opt_d


def fit_gan(tmp_path, timers: Timers, batches: int) -> dict:
    """One epoch of `Gan` with the callback, watching phaseprof's clock; its scalars."""
    from phaseprof.lightning import PhaseProfilerCallback

    torch.manual_seed(0)
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run="gan", wait=1, warmup=1, active=3)
    trainer = L.Trainer(max_epochs=1, callbacks=[callback], accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    data = DataLoader(torch.utils.data.TensorDataset(torch.randn(batches * 16, 64)), batch_size=16)
    with timers.watching(), timers.timing_backward():
        trainer.fit(Gan(timers), data)
    return scalars(tmp_path / "gan")


def lightning_own(timers: Timers, steps: list[int]) -> list[tuple[float, list]]:
    """Each step's Lightning wrappers (two ``manual_backward``, two ``step``) less the backward and
    update inside them: ms, and the timings it came from. The lightning phase is that, less the
    hook's own time at the inner phases' marks."""
    wrappers = timers.per_step(LIGHTNING, 4)
    assert len(wrappers) == len(steps)
    out = []
    for spans in wrappers:
        inner = [s for s in timers.log if s.what in (BACKWARD, OPTIMIZER)
                 and any(w.t0 <= s.t0 and s.t1 <= w.t1 for w in spans)]
        out.append((sum(w.ms for w in spans) - sum(s.ms for s in inner), spans + inner))
    return out


@pytest.mark.slow
def test_lightning_manual_optimization_with_two_optimizers(tmp_path):
    """Both optimizers' zero_grad and step are the optimizer phase, both models' forwards the
    forward phase, each batch one step."""
    timers = Timers()
    values = fit_gan(tmp_path, timers, 6)
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(6))
    for phase, calls in ((FORWARD, 4), (BACKWARD, 2), (OPTIMIZER, 4)):
        timers.agree(phase, [values[host_tag(phase)][step] for step in steps], timers.per_step(phase, calls))
    assert all(values[host_tag(OTHER)][step] >= 3 for step in steps)
    # Lightning's wrappers (manual_backward, its optimizers' step) are the framework's phase: the
    # timers around those calls hold it, the backward and the update inside, and some of the hook's
    # own time (phaseprof/hook_ms, its ranges in traced steps), no more, on every step.
    for step, (own, spans) in zip(steps, lightning_own(timers, steps)):
        gap = own - values[host_tag(LIGHTNING)][step]
        slack = 0.5 + sum(map(timers.interrupted_ms, spans))
        hook = values[HOOK_TAG][step]
        assert -slack <= gap <= hook + slack, (step, gap, hook, slack)


DDP_SCRIPT = """
import sys
import torch, torch.nn.functional as F
import lightning.pytorch as L
from phaseprof.lightning import PhaseProfilerCallback

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
    callback = PhaseProfilerCallback(logdir=sys.argv[1], wait=0, warmup=1, active=3)  # no run: a generated name
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=2,
                        callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
"""


@pytest.mark.slow
def test_lightning_ddp_two_ranks(tmp_path):
    """``strategy="ddp"`` with 2 CPU processes that Lightning launches itself (gloo): each rank writes
    its trace and its scalars into one run, one step per optimizer step."""
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    logdir = tmp_path / "profile"
    run = subprocess.run([sys.executable, str(script), str(logdir)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_two_ranks(logdir, steps=8)  # 256 samples, 128 a rank, 16 batches of 8, 2 per optimizer step


# -- fast: a tiny module, a few steps, what the callback writes (tests/mutation.py runs these) -----


class Tiny(L.LightningModule):
    """training_step calls its submodule with parameters (``net``) on its own, and one without."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
        self.act = torch.nn.Identity()  # no parameters: no forward of its own

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.act(self.net(x)), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TinyGan(L.LightningModule):
    """Manual optimization, two optimizers through ``self.optimizers()`` and ``manual_backward``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g = torch.nn.Linear(4, 8)
        self.d = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        fake = self.g(torch.randn(len(batch[0]), 4))
        opt_d.zero_grad()
        self.manual_backward(self.d(batch[0]).mean() - self.d(fake.detach()).mean())
        opt_d.step()
        opt_g.zero_grad()
        self.manual_backward(self.d(fake).mean())
        opt_g.step()

    def configure_optimizers(self):
        return (torch.optim.SGD(self.g.parameters(), lr=0.1),
                torch.optim.SGD(self.d.parameters(), lr=0.1))


class Actions(PassThroughProfiler):
    """The user's own Trainer profiler: the actions it is told of, in order; ``slow``: seconds of
    work at the start of an action."""

    def __init__(self, slow: dict[str, float] | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.slow = slow or {}

    def start(self, action_name: str) -> None:
        self.calls.append(("start", action_name))
        busy(self.slow.get(action_name, 0.0))

    def stop(self, action_name: str) -> None:
        self.calls.append(("stop", action_name))


def tiny_fit(tmp_path, module, batches: int, broadcast: str | None = None, run: str | None = "tiny",
             **trainer_args):
    """``module`` fitted one epoch of ``batches`` batches of 4 with the callback; the callback and
    the trainer. ``broadcast``: the run name rank 0 sends (what a distributed strategy gives)."""
    from phaseprof.lightning import PhaseProfilerCallback

    torch.manual_seed(0)
    callback = PhaseProfilerCallback(logdir=str(tmp_path), run=run, wait=0, warmup=1, active=1,
                                     analyze_traces=False)
    trainer = L.Trainer(max_epochs=1, callbacks=[callback], accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_args)
    if broadcast is not None:
        trainer.strategy.broadcast = lambda obj, src=0: broadcast
    data = torch.utils.data.TensorDataset(torch.randn(batches * 4, 8),
                                          torch.randint(0, 2, (batches * 4,)))
    trainer.fit(module, DataLoader(data, batch_size=4),
                DataLoader(data, batch_size=4) if trainer_args.get("limit_val_batches") else None)
    return callback, trainer


def test_a_lightning_fit_is_timed_step_by_step_with_validation_kept_out(tmp_path, capsys):
    """Automatic optimization, 2 batches a step: each step's forward (the submodule called on its
    own), backward, optimizer and data (the fetch and the copy to the device); each validation pass
    outside the steps, the sanity check left out; the user's profiler still told of everything."""
    profiler = Actions()
    callback, trainer = tiny_fit(tmp_path, Tiny(), 8, accumulate_grad_batches=2,
                                 val_check_interval=4, limit_val_batches=1, num_sanity_val_steps=1,
                                 profiler=profiler)
    values = scalars(tmp_path / "tiny")
    steps = sorted(values[STEP_TAG])
    assert steps == [0, 1, 2, 3]  # 8 batches, 2 a step
    for phase in (FORWARD, BACKWARD, OPTIMIZER, DATA, OTHER):  # the data phase ends with its action
        assert all(values[host_tag(phase)][step] > 0 for step in steps), phase
    assert len(values[EVAL_TAG]) == 2  # after batches 4 and 8; not the sanity check
    assert "phaseprof run tiny: 4 step(s) timed" in capsys.readouterr().out
    # the user's profiler got every start and stop; ours are gone from it
    fetches = [call for call in profiler.calls if call[1].endswith("train_dataloader_next")]
    assert fetches[:4] == [("start", fetches[0][1]), ("stop", fetches[0][1])] * 2
    assert len(fetches) == 16  # 8 batches
    assert "start" not in vars(profiler) and "stop" not in vars(profiler)
    # training ended: a later start does nothing
    callback.on_train_start(trainer, trainer.lightning_module)
    assert "start" not in vars(profiler)


def test_lightning_manual_optimization_is_a_step_per_batch_with_its_wrappers_timed(tmp_path):
    """The optimizers' ``step`` through ``self.optimizers()`` is Lightning's: the user's profiler,
    told of each ``optimizer_step`` inside it, takes 20 ms there, twice a step."""
    module = TinyGan()
    callback, trainer = tiny_fit(tmp_path, module, 3,
                                 profiler=Actions(slow={"optimizer_step": 0.02}))
    values = scalars(tmp_path / "tiny")
    steps = sorted(values[STEP_TAG])
    assert steps == [0, 1, 2]
    for phase in (FORWARD, BACKWARD, OPTIMIZER, LIGHTNING):
        assert all(values[host_tag(phase)][step] > 0 for step in steps), phase
    assert all(values[host_tag(LIGHTNING)][step] >= 40 for step in steps)
    # undone when training ends: the module's class and the optimizers as they were
    assert "manual_backward" not in vars(TinyGan)
    assert all("step" not in vars(opt) for opt in trainer.strategy._lightning_optimizers)


def test_every_rank_of_a_lightning_run_takes_rank_0s_name_unless_one_is_given(tmp_path):
    tiny_fit(tmp_path / "generated", Tiny(), 1, broadcast="rank0-name", run=None)
    assert [p.name for p in (tmp_path / "generated").iterdir()] == ["rank0-name"]
    tiny_fit(tmp_path / "given", Tiny(), 1, broadcast="rank0-name", run="mine")
    assert [p.name for p in (tmp_path / "given").iterdir()] == ["mine"]


def test_an_error_in_training_step_passes_through_and_the_run_is_written(tmp_path, capsys):
    class Failing(Tiny):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise KeyError("the user's error")
            return super().training_step(batch, batch_idx)

    with pytest.raises(KeyError, match="the user's error"):
        tiny_fit(tmp_path, Failing(), 4)
    assert "phaseprof run tiny: 2 step(s) timed" in capsys.readouterr().out
    assert sorted(scalars(tmp_path / "tiny")[STEP_TAG]) == [0, 1]


def test_the_batch_fetch_and_its_copy_to_the_device_are_lightnings_data_actions():
    from phaseprof.training_hooks.integrations.lightning import action_phase

    for action in ("[_TrainingEpochLoop].train_dataloader_next",
                   "[Strategy]SingleDeviceStrategy.batch_to_device",
                   "[LightningModule]Tiny.on_before_batch_transfer",
                   "[LightningModule]Tiny.transfer_batch_to_device",
                   "[Callback]my.pkg.Hooks.on_after_batch_transfer"):
        assert action_phase(action) == DATA, action
    for action in ("run_training_batch", "[LightningModule]Tiny.optimizer_step",
                   "train_dataloader_next_x", "[Callback]my.pkg.Hooks.on_train_batch_end"):
        assert action_phase(action) is None, action


def test_the_callbacks_schedule_is_phaseprofilers(tmp_path):
    """By default steps 2 to 11 are traced (wait 1, warm-up 1, active 10), as with PhaseProfiler."""
    from phaseprof.lightning import PhaseProfilerCallback

    for name, batches, schedule, traced in (("default", 13, {}, list(range(2, 12))),
                                             ("warm", 5, dict(wait=0, warmup=3, active=1), [3])):
        callback = PhaseProfilerCallback(logdir=str(tmp_path), run=name, gzip=False,
                                         analyze_traces=False, **schedule)
        trainer = L.Trainer(max_epochs=1, callbacks=[callback], accelerator="cpu", devices=1,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        data = torch.utils.data.TensorDataset(torch.randn(batches, 8),
                                              torch.randint(0, 2, (batches,)))
        trainer.fit(Tiny(), DataLoader(data, batch_size=1))
        assert traced_steps(tmp_path / name) == traced, name


def test_the_callback_is_a_callback_of_both_lightning_namespaces(monkeypatch):
    """Either Trainer (``lightning.pytorch``, ``pytorch_lightning``) takes it; without Lightning,
    one line says what to install."""
    import pytorch_lightning

    from phaseprof.lightning import PhaseProfilerCallback
    from phaseprof.training_hooks.integrations import lightning

    assert lightning._callback_bases() == (L.Callback, pytorch_lightning.Callback)
    assert isinstance(PhaseProfilerCallback(analyze_traces=False), pytorch_lightning.Callback)

    def no_lightning(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(lightning.importlib, "import_module", no_lightning)
    with pytest.raises(ImportError) as raised:
        lightning._callback_bases()
    assert str(raised.value) == ("phaseprof.lightning needs Lightning: "
                                 "pip install 'phaseprof[lightning]'")

"""PhaseProfiler in the loops people really run: evaluation passes between training steps, paused
blocks, LBFGS closures, a GAN's two models and optimizers, a loop without an optimizer, checkpoints
saved while attached, the loader's own attributes, torch.compile, AMP with a GradScaler, safe run
names, and what a run that is terminated or killed keeps. Timings are checked on every
step against independent ``perf_counter`` timers next to phaseprof's hooks (`tests.timing`)."""

from __future__ import annotations

import copy
import io
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import (
    BACKWARD,
    COMPILE,
    EVAL_TAG,
    FORWARD,
    OPTIMIZER,
    OTHER,
    PROFILER_TAG,
    STEP_TAG,
    TRACE_FILE_RE,
    host_tag,
)
from phaseprof.training_hooks.models import MnistNet
from tests.timing import (
    TimedGradScaler,
    Timers,
    busy,
    by_calls,
    scalars,
    time_forward,
    timed,
    train_step,
)

ROOT = Path(__file__).resolve().parent.parent


class TimedNet(torch.nn.Module):
    """PyTorch's MNIST example CNN with its own timer around the forward (ms per call, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MnistNet()
        self.calls: list[tuple[bool, float]] = []  # (training, ms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.net(x)
        self.calls.append((self.training and torch.is_grad_enabled(), (time.perf_counter() - t0) * 1e3))
        return out


def mnist_data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))


# -- PyTorch's mnist example loop, with its test() pass ------------------------------------------


def test_the_mnist_example_loop_keeps_its_test_pass_out_of_the_training_steps(tmp_path, capsys):
    """The loop of PyTorch's mnist example: train() per epoch, then test() (model.eval(),
    torch.no_grad()); its log lines read ``len(train_loader.dataset)`` through ``prof.data``."""
    torch.manual_seed(0)
    timers = Timers()
    model = TimedNet()
    time_forward(model, timers, FORWARD)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    train_loader = DataLoader(mnist_data(16 * 6), batch_size=16)
    test_loader = DataLoader(mnist_data(100, seed=1), batch_size=50)
    prof = PhaseProfiler(logdir=str(tmp_path), run="mnist", wait=1, warmup=1, active=3)
    prof.attach(model, optimizer)
    train_loader = prof.data(train_loader)
    test_ms = []

    def train(epoch: int) -> None:
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % 3 == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]")

    def test() -> None:
        t0 = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad():
            for data, target in test_loader:
                correct += model(data).argmax(dim=1).eq(target).sum().item()
        print(f"Test set: Accuracy: {correct}/{len(test_loader.dataset)}")
        test_ms.append((time.perf_counter() - t0) * 1e3)

    with timers.watching():
        for epoch in (1, 2):
            train(epoch)
            test()
        prof.close()

    out = capsys.readouterr().out
    assert "/96]" in out  # len(train_loader.dataset) read through prof.data
    values = scalars(tmp_path / "mnist")
    assert sorted(values[STEP_TAG]) == list(range(12))  # one step per optimizer step; no eval-only step
    assert len(timers.spans(FORWARD)) == 12
    timers.agree(FORWARD, [values[host_tag(FORWARD)][step] for step in range(12)], timers.per_step(FORWARD, 1))
    # The test pass after epoch 1 is kept before step 6, the one after epoch 2 at close (step 12).
    assert sorted(values[EVAL_TAG]) == [6, 12]
    eval_forward = [ms for training, ms in model.calls if not training]  # two batches per test pass
    for i, (step, reference) in enumerate(zip((6, 12), test_ms)):
        eval_ms = values[EVAL_TAG][step]
        assert sum(eval_forward[2 * i:2 * i + 2]) <= eval_ms <= reference * 1.05 + 5, (step, eval_ms, reference)
    # The step after the first test pass did not absorb it: in its other time the pass's forwards alone
    # would be more than all of it, however slowly the machine ran them.
    assert values[host_tag(OTHER)][6] < sum(eval_forward[0:2]), (values[host_tag(OTHER)], eval_forward)
    assert "evaluation, outside the steps: 2 pass(es)" in out


def test_a_trailing_zero_grad_makes_no_step_and_paused_work_is_in_no_step(tmp_path):
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = mnist_data(8)[:]
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=2) as prof:
        prof.attach(model, optimizer)
        for _ in range(4):
            train_step(model, optimizer, data, target)
            with prof.paused():
                time.sleep(0.5)  # a checkpoint, say
                model(data)  # a forward in there is not the step's either
                with prof.phase("mine"):  # nor a phase of one's own
                    pass
        optimizer.zero_grad()  # after the last step: no spurious step
    values = scalars(tmp_path / "r")
    assert sorted(values[STEP_TAG]) == [0, 1, 2, 3]
    # the sleep is in none: in a step's other time it alone would be 500 ms, however slowly the machine ran
    assert all(ms < 500 for ms in values[host_tag(OTHER)].values()), values[host_tag(OTHER)]
    assert host_tag("mine") not in values and EVAL_TAG not in values


def test_the_profilers_own_time_is_written_and_summarised(tmp_path, capsys):
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = mnist_data(8)[:]
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=1, warmup=1, active=2, record_shapes=True) as prof:
        prof.attach(model, optimizer)
        for _ in range(6):
            train_step(model, optimizer, data, target)
    own = scalars(tmp_path / "r")[PROFILER_TAG]
    assert sorted(own) == list(range(6))
    assert max(own, key=own.get) == 3  # the step that ends the active window writes the trace
    assert "the profiler's own time, outside the steps" in capsys.readouterr().out


@pytest.mark.parametrize("form", ["positional", "keyword"])
def test_an_lbfgs_closure_keeps_its_own_phases_however_it_is_passed(tmp_path, form):
    """PyTorch's time_sequence_prediction example: ``optimizer.step(closure)`` with LBFGS, which runs
    the closure several times a step. The closure's zero_grad, forward and backward keep their
    phases; its own work (the loss, ``.item()``, a print: 3 ms here) is other, never optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3, history_size=3)
    timers = timed([model], [optimizer])
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    closure_calls = []

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        busy(0.003)  # the example's loss.item() and print
        closure_calls.append(1)
        return loss

    steps = 4
    with timers.watching(), timers.timing_backward(), \
            PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=2) as prof:
        prof.attach(model, optimizer)
        calls = []
        for _ in range(steps):
            before = len(closure_calls)
            if form == "positional":
                optimizer.step(closure)
            else:
                optimizer.step(closure=closure)
            calls.append(len(closure_calls) - before)
    assert max(calls) > 1  # LBFGS ran the closure several times in a step
    values = scalars(tmp_path / "r")
    assert sorted(values[STEP_TAG]) == list(range(steps))
    for phase, reference in ((FORWARD, by_calls(timers.spans(FORWARD), calls)),
                             (BACKWARD, by_calls(timers.spans(BACKWARD), calls)),
                             # per closure call its zero_grad; per step the update around them
                             (OPTIMIZER, by_calls(timers.spans(OPTIMIZER),
                                                  [2 * n + 1 for n in calls]))):
        timers.agree(phase, [values[host_tag(phase)][step] for step in range(steps)], reference)
    for step, n in enumerate(calls):  # the closures' own 3 ms each are other
        assert values[host_tag(OTHER)][step] >= 3 * n, (step, n, values[host_tag(OTHER)][step])


# -- several models and optimizers: a GAN ---------------------------------------------------------


def test_a_gan_loop_with_two_models_and_two_optimizers(tmp_path):
    """PyTorch's DCGAN example: per iteration the discriminator's update (on real and generated
    images), then the generator's. Both models' forwards are forward, both optimizers' zero_grad
    and step are optimizer, and the iteration is one step, ended by the last of its optimizer steps;
    the traced steps show the same phases."""
    torch.manual_seed(0)
    G = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.Tanh())
    D = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LeakyReLU(0.2), torch.nn.Linear(128, 1))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4)
    timers = timed([G, D], [opt_d, opt_g])
    real = torch.randn(32, 64)
    steps = 6
    with timers.watching(), timers.timing_backward(), \
            PhaseProfiler(logdir=str(tmp_path), run="gan", wait=1, warmup=1, active=3) as prof:
        prof.attach([G, D], [opt_d, opt_g])
        for _ in range(steps):
            D.zero_grad()  # the example zeroes the module's grads: other
            ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
            loss_real = F.binary_cross_entropy_with_logits(D(real), ones)
            loss_real.backward()
            fake = G(torch.randn(32, 16))
            loss_fake = F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
            loss_fake.backward()
            opt_d.step()
            G.zero_grad()
            loss_g = F.binary_cross_entropy_with_logits(D(fake), ones)
            loss_g.backward()
            opt_g.step()
            busy(0.002)  # the example's print of the losses: other
    values = scalars(tmp_path / "gan")
    assert sorted(values[STEP_TAG]) == list(range(steps))
    for phase, calls in ((FORWARD, 4), (BACKWARD, 3), (OPTIMIZER, 2)):
        timers.agree(phase, [values[host_tag(phase)][step] for step in range(steps)], timers.per_step(phase, calls))
    # The print after an iteration's last optimizer step comes before the next step's work: it is the
    # next step's other (step 0 has no iteration before it).
    assert all(values[host_tag(OTHER)][step] >= 2 for step in range(1, steps)), values[host_tag(OTHER)]
    # The traced steps: the same phases, each step with both updates in its optimizer phase.
    rows = analyze(str(tmp_path))["runs"][0]["workers"][0]["steps"]
    assert [row["step"] for row in rows] == [2, 3, 4]
    for row in rows:
        assert all(row["phases"][phase]["host_ms"] > 0 and not row["phases"][phase]["inferred"]
                   for phase in (FORWARD, BACKWARD, OPTIMIZER))
        detail = analyze(str(tmp_path), step=row["step"])["runs"][0]["workers"][0]["detail"]
        updates = [op["calls"] for op in detail["ops"].get(OPTIMIZER, []) if op["name"] == "aten::addcdiv_"]
        assert updates == [len(list(G.parameters())) + len(list(D.parameters()))], detail["ops"].get(OPTIMIZER)


# -- no torch.optim optimizer: PyTorch's word_language_model --------------------------------------


def test_a_manual_sgd_loop_keeps_its_validation_out_of_the_steps(tmp_path, capsys):
    """PyTorch's word_language_model default: no optimizer (the parameters updated by hand),
    ``prof.step()`` per batch, an evaluation pass (``model.eval()``, ``torch.no_grad()``) after each
    epoch. Training is recognised from its backward: the evaluation passes stay out of the steps,
    and the last one is no step of its own."""
    torch.manual_seed(0)
    timers = Timers()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    time_forward(model, timers, FORWARD)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    batches, epochs = 4, 2
    with timers.watching(), timers.timing_backward(), \
            PhaseProfiler(logdir=str(tmp_path), run="lm", wait=1, warmup=1, active=2) as prof:
        prof.attach(model)
        for _ in range(epochs):
            model.train()
            for _ in range(batches):
                model.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-0.1)
                prof.step()
            model.eval()
            with torch.no_grad():
                for _ in range(3):
                    model(x)
                    busy(0.01)
    values = scalars(tmp_path / "lm")
    steps = list(range(batches * epochs))
    assert sorted(values[STEP_TAG]) == steps  # no step for the last evaluation pass
    for phase in (FORWARD, BACKWARD):
        timers.agree(phase, [values[host_tag(phase)][step] for step in steps], timers.per_step(phase, 1))
    # The passes: before step 4 and at close; each holds its 30 ms of work.
    assert sorted(values[EVAL_TAG]) == [4, 8] and all(ms >= 30 for ms in values[EVAL_TAG].values())
    assert f"{len(steps)} step(s) timed" in capsys.readouterr().out


def test_only_the_loop_thread_ends_an_evaluation_pass(tmp_path):
    """A forward in training mode on another thread (a DataParallel replica, a prefetching thread)
    while the loop evaluates leaves the evaluation pass open: it is the loop's."""
    import threading

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=1) as prof:
        prof.attach(model, optimizer)
        for step in range(2):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            if step == 0:
                with torch.no_grad():
                    model(x)  # evaluation starts
                other = threading.Thread(target=model, args=(x,))  # grad on, training mode: on its thread
                other.start()
                other.join()
                busy(0.2)  # still evaluating
    values = scalars(tmp_path / "r")
    assert values[EVAL_TAG][1] >= 200, values  # all 200 ms of CPU work are the pass's, not step 1's


# -- checkpoints ----------------------------------------------------------------------------------

# -- mixed precision ------------------------------------------------------------------------------


def test_a_grad_scaler_loop_has_its_scaler_in_the_optimizer_phase_and_a_skipped_step_is_a_step(tmp_path):
    """AMP with ``torch.amp.GradScaler("cpu")``: the scaler's ``step`` and ``update`` are the
    optimizer phase of the step they end; the step whose gradients hold an inf, which the scaler
    skips (the optimizer's ``step`` is never called), is a step of its own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timers = timed([model], [optimizer])
    scaler = TimedGradScaler(timers, OPTIMIZER, "cpu")
    with timers.watching(), timers.timing_backward(), \
            PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=4) as prof:
        prof.attach(model, optimizer)
        for step in range(6):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
            scaler.scale(loss).backward()
            if step == 2:
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
    assert scaler.get_scale() == 2.0**15  # halved once: step 2 was skipped

    values = scalars(tmp_path / "r")
    steps = sorted(values[STEP_TAG])
    assert steps == list(range(6))
    for phase, reference in ((FORWARD, timers.per_step(FORWARD, 1)), (BACKWARD, timers.per_step(BACKWARD, 1)),
                             (OPTIMIZER, timers.per_step(OPTIMIZER, 3))):
        timers.agree(phase, [values[host_tag(phase)][step] for step in steps], reference)
    # In the trace too: the inf check and the unscaling (step) and the new scale (update) are the
    # optimizer's, in the step they end.
    for step in (2, 3):
        detail = analyze(str(tmp_path), step=step)["runs"][0]["workers"][0]["detail"]
        ops = {op["name"] for op in detail["ops"].get(OPTIMIZER, [])}
        assert {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"} <= ops, ops


# -- pickling and the loader ----------------------------------------------------------------------


def test_model_and_optimizer_pickle_while_attached(tmp_path):
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    data, target = mnist_data(8)[:]
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=2) as prof:
        prof.attach(model, optimizer)
        for _ in range(3):
            train_step(model, optimizer, data, target)
            scheduler.step()
            buffer = io.BytesIO()
            torch.save(model, buffer)  # what word_language_model does at the end of an epoch
            saved = {"optimizer": optimizer, "scheduler": scheduler, "state": model.state_dict(),
                     "optimizer_state": optimizer.state_dict()}
            for pickled in (pickle.dumps(model), pickle.dumps(saved), buffer.getvalue()):
                assert b"training_hooks.hooks" not in pickled and b"getattr" not in pickled
            twin = copy.deepcopy(model)
            assert not twin._forward_pre_hooks and not twin._forward_hooks  # a copy is a plain model
        loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    model.eval(), loaded.eval(), twin.eval()
    assert torch.equal(loaded(data), model(data)) and torch.equal(twin(data), model(data))
    assert prof.step_num == 3
    assert sorted(scalars(tmp_path / "r")[host_tag(FORWARD)]) == [0, 1, 2]


LOAD_WITHOUT_PHASEPROF = textwrap.dedent("""
    import importlib.abc, sys, zipfile
    class NoPhaseprof(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "phaseprof" or name.startswith("phaseprof."):
                raise ImportError(f"{name} is not installed here")
    sys.meta_path.insert(0, NoPhaseprof())
    sys.path.insert(0, sys.argv[1])
    import torch
    from tests.checkpoint_model import Net
    try:
        import phaseprof
    except ImportError:
        pass
    else:
        raise SystemExit("phaseprof imported")
    classes = [Net, torch.nn.Sequential, torch.nn.Linear, torch.nn.ReLU]
    with torch.serialization.safe_globals(classes):
        attached, detached = (torch.load(path, weights_only=True) for path in sys.argv[2:4])
    for model in (attached, detached):
        for module in model.modules():
            assert not (module._forward_pre_hooks or module._forward_hooks or module._forward_hooks_always_called
                        or module._backward_hooks), module
    assert attached.state_dict().keys() == detached.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(attached.state_dict().values(), detached.state_dict().values()))
    assert not [name for name in sys.modules if name.startswith("phaseprof")]
    print("loaded", flush=True)
""")


def test_a_model_saved_while_attached_loads_weights_only_where_phaseprof_is_not_installed(tmp_path):
    """``torch.save(model)`` while attached writes what the same model writes detached: it loads
    with ``torch.load(..., weights_only=True)`` and the model's classes as safe globals, in a
    process that cannot import phaseprof, with no hook left on it."""
    from tests.checkpoint_model import Net

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=1) as prof:
        prof.attach(model, optimizer)
        for _ in range(2):
            train_step(model, optimizer, x, y, F.cross_entropy)
        torch.save(model, tmp_path / "attached.pt")
    torch.save(model, tmp_path / "detached.pt")
    with zipfile.ZipFile(tmp_path / "attached.pt") as a, zipfile.ZipFile(tmp_path / "detached.pt") as d:
        assert a.read("attached/data.pkl") == d.read("detached/data.pkl")  # the same pickle, byte for byte
    out = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_PHASEPROF, str(ROOT), str(tmp_path / "attached.pt"),
                          str(tmp_path / "detached.pt")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "loaded\n", out.stderr


def test_the_timed_loader_behaves_like_the_loader(tmp_path):
    dataset = mnist_data(40)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    with PhaseProfiler(logdir=str(tmp_path), run="r") as prof:
        timed = prof.data(loader)
        assert timed.dataset is dataset and timed.batch_size == 4 and len(timed) == len(loader) == 5
        timed.sampler.set_epoch(3)
        assert sampler.epoch == 3
        assert sum(len(x) for x, _ in timed) == 20
        with pytest.raises(AttributeError, match="no_such_thing"):
            timed.no_such_thing  # noqa: B018


# -- run names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("run", ["../x", "a/../../x", "..", "/tmp/abs", "", "a/..\\..\\x"])
def test_a_run_name_that_leaves_the_logdir_is_refused_at_construction(tmp_path, run):
    with pytest.raises(ValueError, match="run"):
        PhaseProfiler(logdir=str(tmp_path / "profile"), run=run)
    assert not (tmp_path / "profile").exists()


def test_a_nested_run_name_stays_inside_the_logdir(tmp_path):
    with PhaseProfiler(logdir=str(tmp_path), run="ablation/lr0.1", wait=0, warmup=1, active=1) as prof:
        prof.step()
    assert [p.name for p in (tmp_path / "ablation" / "lr0.1").iterdir() if "tfevents" in p.name]


# -- terminated and killed runs -------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import signal, sys, time
    import torch, torch.nn.functional as F
    from phaseprof import PhaseProfiler
    from phaseprof.training_hooks.models import MnistNet

    mode = sys.argv[2]
    if mode == "user-handler":
        def handler(signum, frame):
            print("user handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    prof = PhaseProfiler(logdir=sys.argv[1], run="r", wait=0, warmup=1, active=10**6).attach(model, optimizer)
    for step in range(10**6):
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()
        if step == 30:
            print("ready", flush=True)
            if mode == "stuck":
                time.sleep(600)  # e.g. a hung collective: the loop hands nothing over
""")


def start_child(tmp_path: Path, mode: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), mode], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = child.stdout.readline()
    assert line == "ready\n", child.stderr.read() if child.poll() is not None else line
    return child


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "user-handler"])
def test_sigterm_writes_the_active_window_then_the_process_ends_as_it_would_have(tmp_path, mode):
    child = start_child(tmp_path, mode)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=300)
    if mode == "default":
        assert child.returncode == -signal.SIGTERM, err
    else:
        assert child.returncode == 3 and "user handler ran" in out, err
    assert "Traceback" not in err
    (trace,) = [p.name for p in (tmp_path / "r").iterdir() if TRACE_FILE_RE.match(p.name)]
    report = analyze(str(tmp_path))
    assert report["errors"] == []
    steps = report["runs"][0]["workers"][0]["steps"]
    assert len(steps) >= 30 and steps[0]["phases"][FORWARD]["host_ms"] > 0
    assert len(scalars(tmp_path / "r")[STEP_TAG]) >= 31


@pytest.mark.slow
def test_a_killed_run_keeps_the_scalars_of_all_but_its_last_seconds(tmp_path):
    child = start_child(tmp_path, "stuck")
    # the loop is stuck in a step: the recorder writes what it holds after FLUSH_S all the same
    deadline = time.monotonic() + 300
    while STEP_TAG not in (written := scalars(tmp_path / "r")) or len(written[STEP_TAG]) < 31:
        assert time.monotonic() < deadline and child.poll() is None, "the scalars of a stuck run were never written"
        time.sleep(0.2)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=300)
    assert sorted(scalars(tmp_path / "r")[STEP_TAG])[:31] == list(range(31))


# -- torch.compile --------------------------------------------------------------------------------


def graph_breaks(model: torch.nn.Module, x: torch.Tensor) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(torch.compile(model, backend="aot_eager"))(x).graph_break_count


@pytest.mark.slow
@pytest.mark.parametrize("order", ["attach then compile", "compile then attach"])
def test_torch_compile_before_or_after_attach(tmp_path, order):
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = mnist_data(16)[:]
    breaks_without = graph_breaks(model, data)
    torch._dynamo.reset()
    prof = PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=2)
    timers = Timers()
    if order == "attach then compile":
        time_forward(model, timers, FORWARD)
        prof.attach(model, optimizer)
        compiled = torch.compile(model, backend="aot_eager")
    else:
        compiled = torch.compile(model, backend="aot_eager")
        time_forward(compiled, timers, FORWARD)
        prof.attach(compiled, optimizer)
    with timers.watching():
        for _ in range(6):
            optimizer.zero_grad()
            out = timers.timed("call", compiled, data, inside=False)  # compiling included
            F.nll_loss(out, target).backward()
            optimizer.step()
    if order == "attach then compile":
        assert graph_breaks(model, data) == breaks_without  # the hooks add no graph break
    prof.close()
    torch._dynamo.reset()
    values = scalars(tmp_path / "r")
    first_ms = timers.spans("call")[0].ms
    assert values[host_tag(COMPILE)][0] > 0.5 * first_ms  # compiling is step 0's, not its forward's
    assert values[host_tag(FORWARD)][0] < 0.5 * first_ms
    assert all(values[host_tag(COMPILE)][step] == 0 for step in range(1, 6))
    timers.agree(FORWARD, [values[host_tag(FORWARD)][step] for step in range(1, 6)], timers.per_step(FORWARD, 1)[1:])
    rows = analyze(str(tmp_path))["runs"][0]["workers"][0]["steps"]
    assert all(row["phases"][FORWARD]["host_ms"] > 0 and not row["phases"][FORWARD]["inferred"] for row in rows)


# -- evaluation passes, wherever the loop runs them ----------------------------------------------


@pytest.mark.parametrize("where", ["before_step", "after_step", "at_end", "none"])
def test_evaluation_passes_are_counted_and_timed_as_the_loops_timers_see_them(tmp_path, capsys,
                                                                               where):
    """A hand-written update loop ending each step with ``prof.step()``, evaluating every 4th step
    before it, after it, once after the last step, or never; then (but at the end) 20 ms of work
    before close: a save, no evaluation. Each pass is one pass (never a pass and the tail after
    ``prof.step()``), and the passes' number and total are the timers' around the evaluations."""
    torch.manual_seed(0)
    timers = Timers()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64))
    time_forward(model, timers, FORWARD)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    steps = 8

    def evaluate() -> None:
        started = timers.start()
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                model(x)
                busy(0.005)  # the metrics
        model.train()
        timers.stop("evaluation", started, inside=False)

    with timers.watching(), timers.timing_backward(), \
            PhaseProfiler(logdir=str(tmp_path), run="r", wait=1, warmup=1, active=2) as prof:
        prof.attach(model)
        for step in range(steps):
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.01)
            if where == "before_step" and step % 4 == 3:
                evaluate()
            prof.step()
            if where == "after_step" and step % 4 == 3 and step < steps - 1:
                evaluate()
        if where == "at_end":
            evaluate()
        else:
            busy(0.02)
    values = scalars(tmp_path / "r")
    assert sorted(values[STEP_TAG]) == list(range(steps))
    for phase in (FORWARD, BACKWARD):
        measured = [values[host_tag(phase)][step] for step in range(steps)]
        timers.agree(phase, measured, timers.per_step(phase, 1))
    passes = values.get(EVAL_TAG, {})
    spans = timers.spans("evaluation")
    expected = {"before_step": 2, "after_step": 1, "at_end": 1, "none": 0}[where]
    assert len(passes) == len(spans) == expected, passes
    out = capsys.readouterr().out
    if spans:
        timers.agree("evaluation", [sum(passes.values())], [spans], rel=0)
        assert f"evaluation, outside the steps: {len(spans)} pass(es)" in out, out
    else:
        assert "evaluation, outside the steps" not in out, out
    # The save after the last step is in no step and no pass: where a pass was open at the last step
    # boundary, the summary says it was after the last step (its 20 ms of CPU at least).
    after = re.search(r"after the last step, in no step and no pass: ([\d,.]+) ms", out)
    assert (after is not None) == (where == "before_step"), out
    assert after is None or float(after[1].replace(",", "")) >= 20, out

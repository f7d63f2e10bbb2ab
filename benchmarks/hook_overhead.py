"""What PhaseProfiler costs a training loop on CPU, measured A/B in one process, variants interleaved.

    python benchmarks/hook_overhead.py [--rounds 11] [--load N] [--no-callbacks]

``--load N`` runs N processes that burn CPU beside the measurement (a busy shared machine: on 2
cores, 2 hogs leave the loop half a core); the machine's load average at start and end is printed.

Each round runs every variant in short blocks, the variants alternating block by block in rotating
order; a variant's figure in a round is the median of its kept steps over its blocks. A comparison
is the median over rounds of the ratio (or difference) of two variants' figures in the same round,
so slow drifts of a shared machine cancel out, with a 95% bootstrap interval of that median (the
rounds resampled) and the range over rounds. Step times are the CPU time of the loop's thread (see
`Loop`).

Three settings, each against its reference: timing only (after the profiling window, when
torch.profiler is stopped) and the ``wait`` phase (timing plus torch.profiler's own step) against a
bare loop, target <= 1% of the step; the active window against raw ``torch.profiler`` with the same
schedule and settings, target <= 2% (the step that exports the trace is left out of both).

1. The hook's cost per step, in µs, on a step that does next to nothing (a 1x1 Linear) but passes
   every hook — data, zero_grad, forward, backward, optimizer step — and on an empty step
   (``prof.step()`` alone). The own cost target is <= 15 µs (the 95% interval's upper end <= 20 µs,
   on a quiet machine). Plus the CPU time per step of the recorder thread, which builds and writes
   the scalars in the background (from /proc).
2. The MNIST CNN (`MnistNet`, batch 64, Adadelta, one torch thread), A/B directly. Its steps vary by
   several percent from one run to the next on a shared machine (the range shows it), more than
   the 1% to resolve; the cost per step does not depend on what the step computes, so (1) divided
   by the MNIST CNN's median step bounds the overhead more tightly.
3. The framework callbacks (``phaseprof.lightning``, ``phaseprof.transformers``; needs the
   ``lightning`` / ``transformers`` extras): a Trainer of each whose step does next to nothing, with
   and without the callback (timing only, after the window), rounds alternating which runs first;
   the difference is the callback's cost per step, over the MNIST CNN's step as in (1).
4. The capture watcher (``phaseprof capture``, the tab's button, ``capture_on_slowdown``) with nothing
   requested: the step through every hook of (1), timing only, with the watcher thread running
   against the same profiler without it (``--capture`` runs this part alone); plus the watcher
   thread's own CPU per second (a heartbeat written and the capture folder listed every 0.5 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from phaseprof import PhaseProfiler
from phaseprof.capture_channel import BEAT_S
from phaseprof.training_hooks.models import MnistNet, mnist_loader

#: A variant: runs ``steps`` steps of a `Loop` with its logs under a directory, returns each step's time.
Variant = Callable[["Loop", int, str], list[int]]


class Loop:
    """One model, optimizer and batch on ``device``, stepped again and again; each step's time in ns.

    On CPU that is the CPU time of the loop's thread (``time.thread_time_ns``): with one torch thread
    it is the step's whole work, and other processes on a shared machine do not blur it. On CUDA it
    is the host's wall time (the loop never waits for the GPU, so the host may run ahead).
    """

    def __init__(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], lr: float,
                 device: str) -> None:
        self.model = model.to(device)
        self.optimizer = torch.optim.Adadelta(self.model.parameters(), lr=lr)
        self.batch = tuple(t.to(device) for t in batch)
        self.clock = time.perf_counter_ns if device == "cuda" else time.thread_time_ns

    def run(self, steps: int, batches: Callable[[Iterable], Iterable] = iter,
            after_step: Callable[[], None] | None = None) -> list[int]:
        model, optimizer, clock = self.model, self.optimizer, self.clock
        times = []
        start = clock()
        for data, target in batches([self.batch] * steps):
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()
            if after_step is not None:
                after_step()
            now = clock()
            times.append(now - start)
            start = now
        return times


def bare(loop: Loop, steps: int, logdir: str) -> list[int]:
    return loop.run(steps)


def raw_profiler(wait: int, warmup: int, active: int) -> Variant:
    def run(loop: Loop, steps: int, logdir: str) -> list[int]:
        schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
        prof = torch.profiler.profile(schedule=schedule, on_trace_ready=torch.profiler.tensorboard_trace_handler(
            logdir, use_gzip=True))
        prof.start()
        times = loop.run(steps, after_step=prof.step)
        prof.stop()
        return times

    return run


def phaseprof(wait: int, warmup: int, active: int, recorder_cpu: list[float] | None = None) -> Variant:
    """PhaseProfiler attached to the loop; ``recorder_cpu`` collects its recorder thread's CPU s per step."""

    def run(loop: Loop, steps: int, logdir: str) -> list[int]:
        prof = PhaseProfiler(logdir=logdir, run="phaseprof", wait=wait, warmup=warmup, active=active)
        prof.attach(loop.model, loop.optimizer)
        times = loop.run(steps, batches=prof.data)
        if recorder_cpu is not None:
            recorder_cpu.append(_thread_cpu_s("phaseprof-recorder") / steps)
        with contextlib.redirect_stdout(io.StringIO()):
            prof.close()
        return times

    return run


def _thread_cpu_s(name: str) -> float:
    """CPU seconds used so far by this process's thread called ``name`` (Linux /proc)."""
    (thread,) = [t for t in threading.enumerate() if t.name == name]
    with open(f"/proc/self/task/{thread.native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interleaved(loop: Loop, variants: dict[str, Variant], steps: int, keep: slice, rounds: int,
                blocks: int = 1) -> dict[str, list[float]]:
    """Each variant's median kept step time (ns) in each round, over ``blocks`` runs of ``steps``
    steps each: the variants alternate block by block (their order rotating), so that what the
    machine does meanwhile falls on all of them alike."""
    names = list(variants)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        kept: dict[str, list[int]] = {name: [] for name in names}
        for b in range(blocks):
            turn = r * blocks + b
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                with tempfile.TemporaryDirectory() as logdir:
                    kept[name] += variants[name](loop, steps, logdir)[keep]
        for name in names:
            medians[name].append(statistics.median(kept[name]))
    return medians


def bootstrap_interval(values: list[float], level: float = 0.95, resamples: int = 10_000
                       ) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of ``values`` (seeded: a rerun on the same
    figures prints the same interval)."""
    draw = random.Random(0).choices
    medians = sorted(statistics.median(draw(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]


def _spread(values: list[float], fmt: str) -> str:
    """The median, its 95% bootstrap interval, and the range over rounds."""
    low, high = bootstrap_interval(values)
    return (f"{statistics.median(values):{fmt}} [{low:{fmt}}, {high:{fmt}}] "
            f"(range {min(values):{fmt}} to {max(values):{fmt}})")


def seed_cnn(rounds: int, device: str = "cpu") -> tuple[list[str], float]:
    """The table, and the bare loop's median step in µs."""
    loop = Loop(MnistNet(), next(iter(mnist_loader(1, batch_size=64))), lr=1.0, device=device)
    warm, timed, window = 3, 20, 10
    runs = interleaved(loop, {
        "bare": bare,
        "timing only (after the window)": phaseprof(wait=0, warmup=1, active=1),
        "wait phase": phaseprof(wait=10**6, warmup=1, active=1),
    }, steps=warm + timed, keep=slice(warm, None), rounds=rounds)
    runs |= interleaved(loop, {
        "raw torch.profiler, active": raw_profiler(wait=0, warmup=warm, active=window),
        "active window": phaseprof(wait=0, warmup=warm, active=window),
    }, steps=warm + window, keep=slice(warm, warm + window - 1), rounds=rounds)  # the last one exports
    rows = [f"| MNIST CNN, {device}, batch 64 | median step | vs | ratio [95% interval] (range) "
            "| target |",
            "|---|---:|---|---:|---:|"]
    for name, ref, target in [("timing only (after the window)", "bare", 1.01), ("wait phase", "bare", 1.01),
                              ("active window", "raw torch.profiler, active", 1.02)]:
        ratios = [a / b for a, b in zip(runs[name], runs[ref])]
        rows.append(f"| {name} | {statistics.median(runs[name]) / 1e6:.2f} ms | {ref} "
                    f"({statistics.median(runs[ref]) / 1e6:.2f} ms) | {_spread(ratios, '.4f')} | <= {target:.2f} |")
    return rows, statistics.median(runs["bare"]) / 1e3


def hook_cost(rounds: int, seed_step_us: float, device: str = "cpu") -> list[str]:
    loop = Loop(torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.LogSoftmax(dim=1)),
                (torch.ones(1, 1), torch.zeros(1, dtype=torch.long)), lr=0.0, device=device)
    steps, warm, window, blocks = 1100, 100, 200, 6
    recorder_cpu: list[float] = []
    runs = interleaved(loop, {
        "bare": bare,
        "timing only (after the window)": phaseprof(wait=0, warmup=1, active=1, recorder_cpu=recorder_cpu),
        "raw torch.profiler, wait": raw_profiler(wait=10**6, warmup=1, active=1),
        "wait phase": phaseprof(wait=10**6, warmup=1, active=1),
    }, steps=steps, keep=slice(warm, None), rounds=rounds, blocks=blocks)
    runs |= interleaved(loop, {
        "raw torch.profiler, active": raw_profiler(wait=0, warmup=warm, active=window),
        "active window": phaseprof(wait=0, warmup=warm, active=window),
    }, steps=warm + window, keep=slice(warm, warm + window - 1), rounds=rounds)
    runs |= step_only(rounds, steps * blocks, keep=slice(warm, None))
    rows = [f"| {device} | reference step | cost per step [95% interval] (range) | target | "
            "share of the MNIST CNN's "
            f"step ({seed_step_us / 1e3:.1f} ms) | target |", "|---|---:|---:|---:|---:|---:|"]
    for label, name, ref, target_us, target_share in [
            ("empty step (`prof.step()` alone) vs an empty loop", "prof.step() alone", "empty loop",
             15, None),
            ("every hook, timing only (after the window) vs bare", "timing only (after the window)",
             "bare", 15, 0.01),
            ("every hook, wait phase vs raw torch.profiler, wait", "wait phase",
             "raw torch.profiler, wait", 15, None),
            ("every hook, wait phase vs bare", "wait phase", "bare", None, 0.01),
            ("every hook, active window vs raw torch.profiler, active", "active window",
             "raw torch.profiler, active", None, 0.02)]:
        cost = [(a - b) / 1e3 for a, b in zip(runs[name], runs[ref])]
        share = statistics.median(cost) / seed_step_us
        rows.append(f"| {label} | {statistics.median(runs[ref]) / 1e3:.1f} µs | {_spread(cost, '.1f')} µs | "
                    + (f"<= {target_us} µs" if target_us else "") + f" | {share:.3%} | "
                    + (f"<= {target_share:.0%}" if target_share else "") + " |")
    rows.append(f"| recorder thread (background): CPU per step | | {statistics.median(recorder_cpu) * 1e6:.1f} µs | | "
                f"{statistics.median(recorder_cpu) * 1e6 / seed_step_us:.3%} | |")
    return rows


def step_only(rounds: int, steps: int, keep: slice) -> dict[str, list[float]]:
    """Per round, the median time of an iteration that does nothing but ``prof.step()``, and of one
    that does nothing at all."""
    clock = time.thread_time_ns
    runs: dict[str, list[float]] = {"empty loop": [], "prof.step() alone": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as logdir:
            prof = PhaseProfiler(logdir=logdir, run="empty", wait=0, warmup=1, active=1)
            for _ in range(3):
                prof.step()  # through the window
            for name, step in (("empty loop", lambda: None), ("prof.step() alone", prof.step)):
                times = []
                start = clock()
                for _ in range(steps):
                    step()
                    now = clock()
                    times.append(now - start)
                    start = now
                runs[name].append(statistics.median(times[keep]))
            with contextlib.redirect_stdout(io.StringIO()):
                prof.close()
    return runs


def capture_cost(rounds: int, seed_step_us: float | None) -> list[str]:
    """The capture watcher with nothing requested, A/B against the same profiler without it."""
    from phaseprof.training_hooks import profiler as profiler_module

    loop = Loop(torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.LogSoftmax(dim=1)),
                (torch.ones(1, 1), torch.zeros(1, dtype=torch.long)), lr=0.0, device="cpu")
    timed = phaseprof(wait=0, warmup=1, active=1)

    def not_watching(loop: Loop, steps: int, logdir: str) -> list[int]:
        real = profiler_module.CaptureWatcher
        profiler_module.CaptureWatcher = lambda *args, **kwargs: None  # as before the capture channel
        try:
            return timed(loop, steps, logdir)
        finally:
            profiler_module.CaptureWatcher = real

    steps, warm = 3000, 100
    runs = interleaved(loop, {"watching, nothing requested": timed, "no watcher": not_watching},
                       steps=steps, keep=slice(warm, None), rounds=rounds)
    cost = [(a - b) / 1e3 for a, b in zip(runs["watching, nothing requested"], runs["no watcher"])]
    share = f"{statistics.median(cost) / seed_step_us:.3%}" if seed_step_us else ""
    return ["| capture watcher, cpu | step without it | cost per step [95% interval] (range) | "
            "share of the MNIST CNN's step | watcher thread CPU |", "|---|---:|---:|---:|---:|",
            f"| every hook, timing only, nothing requested vs no watcher | "
            f"{statistics.median(runs['no watcher']) / 1e3:.1f} µs | {_spread(cost, '.2f')} µs | {share} | "
            f"{_tick_us():.0f} µs per look, every {BEAT_S} s |"]


def _tick_us(looks: int = 200) -> float:
    """CPU time of one look of the watcher thread (heartbeat, folder listed, nothing new), median."""
    with tempfile.TemporaryDirectory() as logdir:
        prof = PhaseProfiler(logdir=logdir, run="ticks", wait=0, warmup=1, active=1)
        prof.step()
        times = []
        for _ in range(looks):
            start = time.thread_time_ns()
            prof._capture.tick()
            times.append(time.thread_time_ns() - start)
        with contextlib.redirect_stdout(io.StringIO()):
            prof.close()
    return statistics.median(times) / 1e3


# -- the framework callbacks ------------------------------------------------------------------------


class _StepClock:
    """CPU time of the loop's thread from one step's end to the next (ns), the warm-up steps dropped."""

    def __init__(self, keep_from: int) -> None:
        self.keep_from = keep_from
        self.times: list[int] = []
        self._last: int | None = None

    def tick(self) -> None:
        now = time.thread_time_ns()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now

    def median(self) -> float:
        return statistics.median(self.times[self.keep_from:])


def _lightning_run(with_callback: bool, steps: int, keep_from: int, logdir: str) -> float:
    import lightning.pytorch as L

    from phaseprof.lightning import PhaseProfilerCallback

    clock = _StepClock(keep_from)

    class Tick(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            clock.tick()

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    callbacks = [Tick()]
    if with_callback:
        callbacks.append(PhaseProfilerCallback(logdir=logdir, run="lightning", wait=0, warmup=1, active=1))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(steps, 1)), batch_size=1)
    trainer = L.Trainer(max_steps=steps, callbacks=callbacks, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.fit(Tiny(), data)
    return clock.median()


def _transformers_run(with_callback: bool, steps: int, keep_from: int, logdir: str) -> float:
    import transformers

    from phaseprof.transformers import PhaseProfilerCallback

    clock = _StepClock(keep_from)

    class Tick(transformers.TrainerCallback):
        def on_step_end(self, *args, **kwargs) -> None:
            clock.tick()

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def forward(self, x):
            return {"loss": self.layer(x).sum()}

    callbacks = [Tick()]
    if with_callback:
        callbacks.append(PhaseProfilerCallback(logdir=logdir, run="transformers", wait=0, warmup=1, active=1))
    args = transformers.TrainingArguments(output_dir=os.path.join(logdir, "out"), max_steps=steps,
                                          per_device_train_batch_size=1, learning_rate=0.0, save_strategy="no",
                                          logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=[{"x": torch.ones(1)}] * steps,
                                   callbacks=callbacks)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train()
    return clock.median()


def callback_cost(rounds: int, seed_step_us: float) -> list[str]:
    """Each framework's step with and without the callback (timing only, after the window), on a
    step that does next to nothing, so that the difference is the callback's cost."""
    rows = [f"| callback, cpu | framework's own step | cost per step [95% interval] (range) | "
            "share of the MNIST CNN's "
            f"step ({seed_step_us / 1e3:.1f} ms) | target |", "|---|---:|---:|---:|---:|"]
    for name, run, steps in (("Lightning", _lightning_run, 400), ("transformers", _transformers_run, 300)):
        bare, costs = [], []
        for r in range(rounds):
            pair = {}
            for with_callback in ((False, True) if r % 2 == 0 else (True, False)):
                with tempfile.TemporaryDirectory() as logdir:
                    pair[with_callback] = run(with_callback, steps, 50, logdir)
            bare.append(pair[False])
            costs.append((pair[True] - pair[False]) / 1e3)
        share = statistics.median(costs) / seed_step_us
        rows.append(f"| {name} `PhaseProfilerCallback` vs none | {statistics.median(bare) / 1e3:.1f} µs | "
                    f"{_spread(costs, '.1f')} µs | {share:.3%} | <= 1% |")
    return rows


def _burn() -> None:
    while True:
        pass


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` processes burning CPU for the duration (a shared machine under load)."""
    hogs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(n)]
    for hog in hogs:
        hog.start()
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--load", type=int, default=0, help="CPU-burning processes beside the measurement")
    parser.add_argument("--no-callbacks", action="store_true", help="skip the Lightning and transformers callbacks")
    parser.add_argument("--capture", action="store_true", help="only the capture watcher's cost (part 4)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"python benchmarks/hook_overhead.py --rounds {args.rounds} --load {args.load}   (torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start)\n")
    with cpu_hogs(args.load):
        if args.capture:
            print("\n".join(capture_cost(args.rounds, None)))
            return 0
        seed_rows, seed_step_us = seed_cnn(args.rounds)
        print("\n".join(capture_cost(args.rounds, seed_step_us)) + "\n")
        print("\n".join(hook_cost(args.rounds, seed_step_us)) + "\n")
        print("\n".join(seed_rows) + "\n")
        if not args.no_callbacks:
            print("\n".join(callback_cost(args.rounds, seed_step_us)))
    print(f"\n(load average {os.getloadavg()[0]:.2f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

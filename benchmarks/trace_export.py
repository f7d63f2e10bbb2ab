"""How long writing a trace blocks training: PhaseProfiler's export against torch's own, same window.

    python benchmarks/trace_export.py [--rounds 5] [--active 10] [--before TREE] [--only phaseprof]

At the end of the active window torch.profiler exports the trace inside ``prof.step()``: the loop
waits for it. Each measurement trains the MNIST CNN (`MnistNet`, batch 64, Adadelta, one torch
thread, with ``record_shapes`` and ``profile_memory``: a trace of a few MB) through one window
``schedule(wait=1, warmup=1, active=N)`` in a fresh process, and times the step boundary that
writes the trace:

* torch's ``tensorboard_trace_handler(use_gzip=True)``: exports, then gzips (level 9) in the loop;
* the same with ``use_gzip=False``: the export of the uncompressed bytes alone;
* PhaseProfiler (gzip on, the default): its ``phaseprof/profiler_ms`` of that step (torch.profiler's
  step with the export, and whatever PhaseProfiler does there);
* PhaseProfiler's capture of a window of the same size (``phaseprof capture``'s request, written
  into the run's channel once the schedule is over): ``phaseprof/profiler_ms`` of the step boundary
  that ends the capture; it should block the loop no longer than the scheduled window's;
* with ``--before TREE``, the same PhaseProfiler run from another checkout (a directory holding a
  ``phaseprof`` package with its ``plugin`` and ``training_hooks`` inside, put first on PYTHONPATH):
  before and after a change, measured in the same rounds.

Each round runs every variant once, in rotating order, so that a shared machine's load changes
touch them alike; the table gives the median over rounds and the range.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

import msgspec
import torch
import torch.nn.functional as F

from phaseprof import PhaseProfiler
from phaseprof.capture_channel import BY_CLI, Request, channel_folder, request_name, write_atomic
from phaseprof.training_hooks.models import MnistNet

WAIT, WARMUP = 1, 1


def _loop(active: int):
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    batch = (torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,)))

    def step() -> None:
        optimizer.zero_grad()
        F.nll_loss(model(batch[0]), batch[1]).backward()
        optimizer.step()

    return model, optimizer, step


def torch_handler(logdir: str, active: int, use_gzip: bool) -> float:
    """ms of the ``prof.step()`` that exports the window's trace."""
    _, _, step = _loop(active)
    prof = torch.profiler.profile(schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=active, repeat=1),
                                  on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir, use_gzip=use_gzip),
                                  record_shapes=True, profile_memory=True)
    prof.start()
    blocked = []
    for _ in range(WAIT + WARMUP + active):
        step()
        t0 = time.perf_counter()
        prof.step()
        blocked.append(time.perf_counter() - t0)
    prof.stop()
    return blocked[-1] * 1e3


def _past_the_window(logdir: str, active: int):
    """(a PhaseProfiler past its scheduled window of ``active`` steps, the loop's step)."""
    model, optimizer, step = _loop(active)
    prof = PhaseProfiler(logdir=logdir, run="r", wait=WAIT, warmup=WARMUP, active=active, repeat=1,
                         record_shapes=True, profile_memory=True, analyze_traces=False)
    prof.attach(model, optimizer)
    for _ in range(WAIT + WARMUP + active + 1):
        step()
    return prof, step


def phaseprof_export(logdir: str, active: int) -> float:
    """PhaseProfiler's own time after the step that ends the window (ms)."""
    prof, _ = _past_the_window(logdir, active)
    with contextlib.redirect_stdout(io.StringIO()):
        prof.close()
    stats = prof._recorder.stats
    return max(stats.profiler_ms)


def phaseprof_capture(logdir: str, active: int) -> float:
    """PhaseProfiler's own time after the step that ends a capture of ``active`` steps (ms), asked
    once the scheduled window is over."""
    prof, step = _past_the_window(logdir, active)
    request = Request(id=secrets.token_hex(8), written=time.time(), by=BY_CLI, steps=active,
                      start=prof.step_num + 2)
    with channel_folder(prof.run_dir) as folder:
        write_atomic(folder, request_name(request.id), msgspec.json.encode(request))
    prof._capture.tick()
    (plan,) = [p for p in prof._capture._plans if p.request.id == request.id]
    while prof.step_num <= plan.end:
        step()
    with contextlib.redirect_stdout(io.StringIO()):
        prof.close()
    assert plan.files, plan.reason
    stats = prof._recorder.stats
    return stats.profiler_ms[list(stats.numbers).index(plan.end - 1)]


def measure(variant: str, active: int) -> float:
    with tempfile.TemporaryDirectory() as logdir:
        if variant == "phaseprof":
            return phaseprof_export(logdir, active)
        if variant == "phaseprof-capture":
            return phaseprof_capture(logdir, active)
        ms = torch_handler(logdir, active, use_gzip=variant == "torch-gzip")
        if variant == "torch-plain":
            sizes = [os.path.getsize(p) for p in glob.glob(os.path.join(logdir, "*.json"))]
            print(f"size {max(sizes)}")
        return ms


def run_variant(variant: str, active: int, tree: str | None) -> tuple[float, int]:
    """(blocking ms, trace bytes or 0), measured in a fresh process (``tree``: first on its path)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", variant, "--active", str(active)],
                         capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), check=True).stdout
    size = next((int(line.split()[1]) for line in out.splitlines() if line.startswith("size ")), 0)
    return float(out.splitlines()[-1]), size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--active", type=int, default=10)
    parser.add_argument("--before", metavar="TREE", help="also PhaseProfiler from this tree, in the same rounds")
    parser.add_argument("--only", choices=("phaseprof",),
                        help="PhaseProfiler's variants alone (no torch handler)")
    parser.add_argument("--one", help=argparse.SUPPRESS,
                        choices=("torch-gzip", "torch-plain", "phaseprof", "phaseprof-capture"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:
        print(f"{measure(args.one, args.active):.3f}")
        return 0
    variants = {
        "torch tensorboard_trace_handler(use_gzip=True)": ("torch-gzip", None),
        "torch tensorboard_trace_handler(use_gzip=False)": ("torch-plain", None),
        "PhaseProfiler (gzip), this checkout": ("phaseprof", None),
        "PhaseProfiler capture (gzip), this checkout": ("phaseprof-capture", None),
    }
    if args.before:
        variants["PhaseProfiler (gzip), --before checkout"] = ("phaseprof", os.path.abspath(args.before))
        before = ("phaseprof-capture", os.path.abspath(args.before))
        variants["PhaseProfiler capture (gzip), --before checkout"] = before
    names = [name for name, (variant, _) in variants.items()
             if args.only is None or variant.startswith(args.only)]
    blocked: dict[str, list[float]] = {name: [] for name in names}
    size = 0
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ms, bytes_ = run_variant(*variants[name][:1], args.active, variants[name][1])
            blocked[name].append(ms)
            size = max(size, bytes_)
        load.append(os.getloadavg()[0])
    print(f"python benchmarks/trace_export.py --rounds {args.rounds} --active {args.active}"
          + (f" --before {args.before}" if args.before else "")
          + (f" --only {args.only}" if args.only else "")
          + f"   (torch {torch.__version__}, {os.cpu_count()} CPUs, load average {min(load):.1f}–{max(load):.1f}; "
          + (f"uncompressed trace {size / 1e6:.1f} MB" if size
             else "trace size: from the torch-plain variant")
          + ")\n")
    print("| export of the active window's trace | blocks the loop, median ms [range over rounds] |\n|---|---:|")
    for name in names:
        values = blocked[name]
        print(f"| {name} | {statistics.median(values):,.0f} [{min(values):,.0f}, {max(values):,.0f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``PhaseProfiler(modules=True)`` costs a training step, on CPU, variants interleaved in one process.

    python benchmarks/module_ranges.py [--rounds 7] [--blocks 24]

A model of ``--blocks`` blocks (Linear, LayerNorm, GELU: four modules each, ~100 module calls per
forward), batch 32, one torch thread, SGD. Each round runs every variant once, in rotating order;
a figure is the median over rounds of the difference of two variants' median steps in the same
round, so slow drifts of a shared machine cancel out (the range over rounds shows the noise). Step
times are the CPU time of the loop's thread.

* recording: steps inside the profiler's active window (the trace's export, at the window's end, is
  left out), ``modules=True`` against ``modules=False``; and ``with_stack=True`` (torch's own module
  records, with every Python frame) against the same reference, for scale.
* not recording: steps in the schedule's ``wait`` phase, where the hooks only read a flag.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time

import torch
from torch import nn

from phaseprof import PhaseProfiler


def model(blocks: int) -> nn.Module:
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()) for _ in range(blocks)))


def run(blocks: int, *, recording: bool, **options) -> tuple[list[float], int]:
    """Per-step thread CPU time (ms) of the steps measured, and the module calls per step."""
    torch.manual_seed(0)
    net = model(blocks)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    schedule = dict(wait=0, warmup=1, active=24) if recording else dict(wait=30, warmup=1, active=1)
    measured = range(3, 23) if recording else range(5, 25)
    times = []
    with (tempfile.TemporaryDirectory() as logdir, contextlib.redirect_stdout(io.StringIO()),
          PhaseProfiler(logdir=logdir, run="bench", gzip=False, analyze_traces=False, **schedule, **options) as prof):
        prof.attach(net, optimizer)
        for i in range(max(measured) + 1):
            t = time.thread_time_ns()
            net(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if i in measured:
                times.append((time.thread_time_ns() - t) / 1e6)
    return times, sum(1 for _ in net.modules())


VARIANTS = {
    "recording": dict(recording=True),
    "recording, modules=True": dict(recording=True, modules=True),
    "recording, with_stack=True": dict(recording=True, with_stack=True),
    "not recording": dict(recording=False),
    "not recording, modules=True": dict(recording=False, modules=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = list(VARIANTS)
    medians: dict[str, list[float]] = {n: [] for n in names}
    calls = 0
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times, calls = run(args.blocks, **VARIANTS[name])
            medians[name].append(statistics.median(times))
    print(f"{args.blocks} blocks, {calls} module calls per forward, {args.rounds} rounds; "
          "thread CPU ms per step (median over rounds of each round's median step)")
    print("| variant | ms per step | range |")
    print("| --- | ---: | ---: |")
    for name in names:
        m = medians[name]
        print(f"| {name} | {statistics.median(m):.3f} | {min(m):.3f}–{max(m):.3f} |")
    print()
    print("| cost | ms per step | µs per module call | range over rounds, ms |")
    print("| --- | ---: | ---: | ---: |")
    for variant, reference in (("recording, modules=True", "recording"), ("recording, with_stack=True", "recording"),
                               ("not recording, modules=True", "not recording")):
        diffs = [a - b for a, b in zip(medians[variant], medians[reference])]
        d = statistics.median(diffs)
        print(f"| {variant} − {reference} | {d:.3f} | {1000 * d / calls:.1f} | {min(diffs):.3f}–{max(diffs):.3f} |")


if __name__ == "__main__":
    main()

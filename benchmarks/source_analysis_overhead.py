"""Does analysing traces at the source slow the training loop? A/B, interleaved, in one process.

    python benchmarks/source_analysis_overhead.py [--rounds 7]

PhaseProfiler (``analyze_traces=True``, the default) starts a background process after each trace it
writes; that process reads and analyses the trace at idle priority while training goes on. Each
round trains the MNIST CNN (`MnistNet`, batch 64, Adadelta, one torch thread) twice, once with and
once without the analysis, in alternating order, with ``schedule(wait=1, warmup=1, active=10)``;
after the window's trace is written it times the next ``--after`` steps by wall clock — the steps
that run while the analysis does. A comparison is the median over rounds of the ratio of the two
variants' median step. Also reported: the loop's wall time from the end of the window's last step
to the start of the next step (where the process is started), and the analysis's own CPU time.
Target: no difference beyond the machine's noise (the range over rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from phaseprof import PhaseProfiler
from phaseprof.training_hooks.models import MnistNet

WAIT, WARMUP, ACTIVE = 1, 1, 10


def train(logdir: str, analyze: bool, after: int) -> tuple[float, float, float]:
    """(median ms of the ``after`` steps following the trace, ms of the step boundary that wrote
    the trace, CPU seconds the background analysis used)."""
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    batch = (torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,)))
    window = WAIT + WARMUP + ACTIVE
    prof = PhaseProfiler(logdir=logdir, run="r", wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1,
                         analyze_traces=analyze)
    prof.attach(model, optimizer)
    ends = []
    analyses = []
    for i in range(window + after):
        optimizer.zero_grad()
        F.nll_loss(model(batch[0]), batch[1]).backward()
        optimizer.step()  # the step boundary: the trace is written at the window's last one
        ends.append(time.perf_counter())
        if analyze and i == window - 1:
            analyses = list(prof._traces.background._running)  # started just now
    with contextlib.redirect_stdout(io.StringIO()):  # the summary it prints
        prof.close()
    cpu = 0.0
    for p in analyses:  # nothing else waits for them: their CPU time comes with their exit status
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        cpu += usage.ru_utime + usage.ru_stime
    steps = [(b - a) * 1000 for a, b in zip(ends[window:], ends[window + 1:])]
    boundary = (ends[window] - ends[window - 1]) * 1000
    return statistics.median(steps), boundary, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--after", type=int, default=60, help="steps timed after the trace (default 60)")
    args = parser.parse_args()
    os.environ.pop("PHASEPROF_CACHE", None)
    torch.set_num_threads(1)
    ratios, on_steps, off_steps, on_bounds, off_bounds, cpus = [], [], [], [], [], []
    for r in range(args.rounds):
        results = {}
        for analyze in ((True, False) if r % 2 else (False, True)):
            with tempfile.TemporaryDirectory() as logdir:
                results[analyze] = train(logdir, analyze, args.after)
        (on, on_b, cpu), (off, off_b, _) = results[True], results[False]
        ratios.append(on / off)
        on_steps.append(on)
        off_steps.append(off)
        on_bounds.append(on_b)
        off_bounds.append(off_b)
        cpus.append(cpu)
    print(f"{os.cpu_count()} CPUs; MnistNet batch 64, one torch thread; {args.rounds} rounds, "
          f"{args.after} steps after the trace")
    print(f"median step while the analysis runs: {statistics.median(on_steps):.2f} ms with, "
          f"{statistics.median(off_steps):.2f} ms without; ratio {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}–{max(ratios):.3f})")
    print(f"the step boundary that writes the trace: {statistics.median(on_bounds):.1f} ms with, "
          f"{statistics.median(off_bounds):.1f} ms without")
    print(f"the background analysis's own CPU time: {statistics.median(cpus):.2f} s per trace")


if __name__ == "__main__":
    sys.exit(main())

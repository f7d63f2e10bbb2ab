"""PhaseProfiler on a CUDA device: the overhead figures of hook_overhead.py on the GPU, the CUDA-event
phase times against the trace's attribution of the same steps, and proof that no step synchronizes.

    python benchmarks/gpu_check.py [--rounds 5]

1. Overhead: the hook's cost per step and the MNIST CNN (batch 64) A/B, on ``cuda``, as in hook_overhead.py.
2. GPU time per phase, two ways, for each profiled step: the CUDA events of the always-on timing
   (``phaseprof/<phase>_gpu_ms``: stream time between phase boundaries, idle gaps included) and the
   trace analysis (``phaseprof.analyze``: the GPU busy time and the kernel time, summed over streams, of
   the work each phase launched).
3. Synchronization: 50 steps outside the profiling window under ``torch.cuda.set_sync_debug_mode("warn")``,
   with ``torch.cuda.synchronize`` and ``Event.synchronize`` counted; the bare loop is the reference
   (the loop itself never reads a value back). Expected: no more than the bare loop, i.e. 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import warnings
from unittest import mock

import torch
from tensorboard.backend.event_processing import event_accumulator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hook_overhead import Loop, hook_cost, seed_cnn  # noqa: E402

from phaseprof import PhaseProfiler, analyze  # noqa: E402
from phaseprof.contract import PHASES, gpu_tag  # noqa: E402
from phaseprof.training_hooks.models import MnistNet, mnist_loader  # noqa: E402


def seed_cnn_loop() -> Loop:
    return Loop(MnistNet(), next(iter(mnist_loader(1, batch_size=64))), lr=1.0, device="cuda")


def event_vs_trace() -> list[str]:
    loop = seed_cnn_loop()
    with tempfile.TemporaryDirectory() as logdir:
        prof = PhaseProfiler(logdir=logdir, run="gpu", wait=1, warmup=1, active=10)
        prof.attach(loop.model, loop.optimizer)
        loop.run(20, batches=prof.data)
        with contextlib.redirect_stdout(io.StringIO()):
            prof.close()
        acc = event_accumulator.EventAccumulator(os.path.join(logdir, "gpu"),
                                                 size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        events = {p: {e.step: e.value for e in acc.Scalars(gpu_tag(p))} for p in PHASES
                  if gpu_tag(p) in acc.Tags()["scalars"]}
        (run,) = analyze(logdir)["runs"]
    rows = ["| step | " + " | ".join(f"{p}: events / GPU busy / kernel ms" for p in events) + " |",
            "|---:|" + "---:|" * len(events)]
    for step in run["workers"][0]["steps"]:
        cells = [f"{events[p].get(step['step'], float('nan')):.2f} / {step['phases'][p]['gpu_busy_ms']:.2f}"
                 f" / {step['phases'][p]['gpu_ms']:.2f}" for p in events]
        rows.append(f"| {step['step']} | " + " | ".join(cells) + " |")
    return rows


def synchronizations() -> list[str]:
    loop = seed_cnn_loop()
    rows = ["| 50 steps, outside the window | synchronizing calls (sync debug mode) | torch.cuda.synchronize() | "
            "Event.synchronize() |", "|---|---:|---:|---:|"]
    for name in ("bare loop", "PhaseProfiler"):
        with tempfile.TemporaryDirectory() as logdir:
            prof = PhaseProfiler(logdir=logdir, run="sync", wait=10**6) if name == "PhaseProfiler" else None
            batches = prof.attach(loop.model, loop.optimizer).data if prof is not None else iter
            loop.run(5, batches=batches)  # warm up, the CUDA timer's events included
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught, \
                    mock.patch.object(torch.cuda, "synchronize", wraps=torch.cuda.synchronize) as device_sync, \
                    mock.patch.object(torch.cuda.Event, "synchronize", autospec=True,
                                      side_effect=torch.cuda.Event.synchronize) as event_sync:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                loop.run(50, batches=batches)
                torch.cuda.set_sync_debug_mode("default")
            if prof is not None:
                with contextlib.redirect_stdout(io.StringIO()):
                    prof.close()
        flagged = sum("synchroniz" in str(w.message).lower() for w in caught)
        rows.append(f"| {name} | {flagged} | {device_sync.call_count} | {event_sync.call_count} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check.py needs a CUDA device", file=sys.stderr)
        return 2
    print(f"python benchmarks/gpu_check.py --rounds {args.rounds}   (torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()})\n")
    seed_rows, seed_step_us = seed_cnn(args.rounds, device="cuda")
    print("\n".join(hook_cost(args.rounds, seed_step_us, device="cuda")) + "\n")
    print("\n".join(seed_rows) + "\n")
    print("\n".join(event_vs_trace()) + "\n")
    print("\n".join(synchronizations()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

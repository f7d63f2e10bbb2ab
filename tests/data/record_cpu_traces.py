"""Record the CPU traces under tests/data/cpu/ with torch's own profiler: ``python tests/data/record_cpu_traces.py``.

Every scenario trains PyTorch's MNIST example CNN (``phaseprof.training_hooks.models``) on random
MNIST-shaped data, batch 64, Adadelta, one intra-op thread, under ``torch.profiler.profile`` with
``schedule(wait=1, warmup=1, active=N)``, ``tensorboard_trace_handler``, ``record_shapes`` and
``profile_memory`` — the loop a PyTorch user writes, not phaseprof's hook — so the tests read
traces exactly as torch writes them. Each step is: ``optimizer.zero_grad()``, the next batch,
``record_function("Forward")`` around model and loss, ``record_function("Backward")`` around
``loss.backward()``, ``optimizer.step()``, ``prof.step()``.

Name scenarios to record only those (``python tests/data/record_cpu_traces.py base legacy``); each
one's folder is emptied of traces first. Traces are written uncompressed under a relative path
(the path is stored in the trace as ``traceName``) and then gzipped without a timestamp. Durations
differ from one recording to the next; the structure each test relies on (steps, ranges, threads,
file names) does not. Needs torch (2.13.0 recorded the committed files) and a C++ compiler for
``compile``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

from phaseprof.training_hooks.models import MnistNet, mnist_loader

HERE = Path(__file__).resolve().parent


def train(prof, steps: int, annotate: bool = True, accumulate: int = 1, compiled: bool = False,
          num_workers: int = 0) -> None:
    """``steps`` optimizer steps of the MNIST CNN, ``accumulate`` batches each, ``prof.step()`` after each."""
    torch.manual_seed(0)
    model = MnistNet()
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    batches = iter(mnist_loader(steps * accumulate, batch_size=64, num_workers=num_workers))
    label = record_function if annotate else (lambda name: contextlib.nullcontext())
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(accumulate):
            data, target = next(batches)
            with label("Forward"):
                loss = F.nll_loss(forward(data), target)
            with label("Backward"):
                loss.backward()
        optimizer.step()
        if prof is not None:
            prof.step()


def profiled(folder: str, active: int, repeat: int = 0, wait: int = 1, warmup: int = 1, **options):
    """torch.profiler as the user's loop holds it: the schedule, the TensorBoard handler, shapes and memory."""
    return profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=wait, warmup=warmup, active=active,
                                                                         repeat=repeat),
                   on_trace_ready=tensorboard_trace_handler(folder, worker_name=WORKER),
                   **({"record_shapes": True, "profile_memory": True} | options))


#: One worker name for every scenario (torch's default is ``<host>_<pid>``, which changes each time).
WORKER = "mnist"


def base(folder: str) -> None:
    """Steps 2..11 profiled, Forward/Backward ranges."""
    with profiled(folder, active=10) as prof:
        train(prof, 12)


def noannot(folder: str) -> None:
    """No Forward/Backward ranges: the analysis must infer them. Steps 2..6."""
    with profiled(folder, active=5) as prof:
        train(prof, 7, annotate=False)


def accum(folder: str) -> None:
    """Gradient accumulation: two forward/backward pairs (two batches) per optimizer step. Steps 2..4."""
    with profiled(folder, active=3) as prof:
        train(prof, 5, accumulate=2)


def repeat2(folder: str) -> None:
    """``schedule(active=3, repeat=2)``: two span files, steps 2..4 and 7..9."""
    with profiled(folder, active=3, repeat=2) as prof:
        train(prof, 10)


def workers2(folder: str) -> None:
    """A DataLoader with two worker processes (``_MultiProcessingDataLoaderIter``). Steps 2..4."""
    with profiled(folder, active=3) as prof:
        train(prof, 5, num_workers=2)


def compiled(folder: str) -> None:
    """``torch.compile`` model (compiled in the unprofiled steps). Steps 2..4."""
    with profiled(folder, active=3) as prof:
        train(prof, 5, compiled=True)


def early_exit(folder: str) -> None:
    """The loop ends inside the active window: steps 2..4, and an empty ProfilerStep#5."""
    with profiled(folder, active=10) as prof:
        train(prof, 5)


def dist_(folder: str) -> None:
    """A one-process gloo group (the trace carries ``distributedInfo``): a matmul and an all_reduce per step."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        x = torch.randn(64, 64)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                     on_trace_ready=tensorboard_trace_handler(folder, worker_name=WORKER)) as prof:
            for _ in range(3):
                dist.all_reduce(x @ x)
                prof.step()
    finally:
        dist.destroy_process_group()


def legacy(folder: str) -> None:
    """``torch.autograd.profiler.profile`` over three steps (no ProfilerStep), exported three ways:
    Kineto's ``export_chrome_trace``, the python export, and the bare event list of ``EventList``."""
    with torch.autograd.profiler.profile(use_kineto=True, record_shapes=True, profile_memory=True) as prof:
        train(None, 3)
    prof.export_chrome_trace(f"{folder}/legacy_kineto.json")
    prof.export_chrome_trace(f"{folder}/legacy_pyexport.json", use_python_export=True)
    prof.function_events.export_chrome_trace(f"{folder}/legacy_eventlist.json")


SCENARIOS = {"base": base, "noannot": noannot, "accum": accum, "repeat2": repeat2, "workers2": workers2,
             "compile": compiled, "early_exit": early_exit, "dist": dist_, "legacy": legacy}


def gzip_traces(folder: Path) -> None:
    """Gzip each JSON file in place, with no timestamp or name in the header (same bytes for the same trace)."""
    for path in sorted(folder.glob("*.json")):
        with path.open("rb") as src, open(f"{path}.gz", "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
            shutil.copyfileobj(src, out)
        path.unlink()


def record(name: str) -> None:
    """Record one scenario into ``cpu/<name>/`` (relative to this folder), replacing its traces."""
    torch.set_num_threads(1)
    os.chdir(HERE)  # relative output paths: the path stored in each trace names no machine
    folder = Path("cpu") / name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json*"):
        old.unlink()
    SCENARIOS[name](str(folder))
    gzip_traces(folder)
    files = sorted(folder.glob("*.json.gz"))
    print(f"{folder}: " + ", ".join(f"{p.name} ({p.stat().st_size // 1024} KB)" for p in files), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"{', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--in-this-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    if args.in_this_process:
        for name in names:
            record(name)
        return
    # One fresh process per scenario: a process group or a compiled model leaves threads and state
    # behind that would show up in the next scenario's trace.
    for name in names:
        subprocess.run([sys.executable, __file__, "--in-this-process", name], check=True)


if __name__ == "__main__":
    main()

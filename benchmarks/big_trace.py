"""Make (once) the large real trace the speed benchmarks read: >= 150 MB of Kineto JSON.

PyTorch's MNIST example CNN on CPU, batch 64, ``record_shapes`` and ``profile_memory`` on, with
Forward/Backward ranges, profiled for a fixed number of active steps: the same events every time
(timings differ, so the byte size varies by a few hundred bytes). Cached under benchmarks/.cache/.

    python benchmarks/big_trace.py          # prints the paths of the plain and gzipped trace
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")
ACTIVE_STEPS = 330  # ~159 MB: 4.9 MB per 10 steps, measured
MIN_BYTES = 150 * 10**6


def make() -> tuple[str, str]:
    """Paths of the plain and gzipped big trace, generating them if missing."""
    plain = os.path.join(CACHE, "big", f"mnist.{ACTIVE_STEPS}.pt.trace.json")
    packed = os.path.join(CACHE, "big_gz", f"mnist.{ACTIVE_STEPS}.pt.trace.json.gz")
    if not os.path.exists(plain):
        _profile(plain)
    if os.path.getsize(plain) < MIN_BYTES:
        raise SystemExit(f"{plain} is only {os.path.getsize(plain) / 1e6:.0f} MB; raise ACTIVE_STEPS")
    if not os.path.exists(packed):
        os.makedirs(os.path.dirname(packed), exist_ok=True)
        with open(plain, "rb") as src, gzip.open(packed + ".part", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(packed + ".part", packed)
    return plain, packed


def _profile(path: str) -> None:
    import tempfile

    import torch
    import torch.nn.functional as F
    from torch.profiler import profile, record_function, schedule, tensorboard_trace_handler

    from phaseprof.training_hooks.models import MnistNet, mnist_loader

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    out = tempfile.mkdtemp(dir=CACHE if os.path.isdir(CACHE) else None)
    with profile(schedule=schedule(wait=1, warmup=1, active=ACTIVE_STEPS), record_shapes=True, profile_memory=True,
                 on_trace_ready=tensorboard_trace_handler(out, worker_name="mnist")) as prof:
        for data, target in mnist_loader(ACTIVE_STEPS + 2):
            optimizer.zero_grad()
            with record_function("Forward"):
                loss = F.nll_loss(model(data), target)
            with record_function("Backward"):
                loss.backward()
            optimizer.step()
            prof.step()
    (written,) = os.listdir(out)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.replace(os.path.join(out, written), path)
    os.rmdir(out)


if __name__ == "__main__":
    os.makedirs(CACHE, exist_ok=True)
    for p in make():
        print(p, f"{os.path.getsize(p) / 1e6:.1f} MB", file=sys.stdout)

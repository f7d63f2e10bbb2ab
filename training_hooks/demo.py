"""`phaseprof demo`: two profiled runs to open in TensorBoard, on synthetic data (nothing to download).

1. ``train_mnist_cnn``: PyTorch's MNIST example CNN trained with Adadelta (lr 1.0) and StepLR (gamma 0.7,
   stepped per epoch of 10 batches), profiled with ``wait=1, warmup=1, active=10``, shapes and memory.
2. ``infer_small_cnn``: forward-only steps of a small CNN under ``torch.inference_mode()``, ended
   by ``prof.step()``, with a phase of its own (``postprocess``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .models import MnistNet, SmallCnn, image_loader, mnist_loader
from .profiler import PhaseProfiler

BATCHES_PER_EPOCH = 10
INFERENCE_STEPS = 12


def run_demo(logdir: str = "./profile", steps: int = 30, device: str | None = None) -> int:
    """Write both runs under ``logdir``; returns the process exit status."""
    if steps < 1:
        raise SystemExit(f"phaseprof demo: --steps must be at least 1, got {steps}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("phaseprof demo: --device cuda, but torch sees no CUDA device")
    torch.manual_seed(0)
    train(logdir, steps, torch.device(device))
    infer(logdir, INFERENCE_STEPS, torch.device(device))
    return 0


def train(logdir: str, steps: int, device: torch.device) -> None:
    model = MnistNet().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    loader = mnist_loader(BATCHES_PER_EPOCH, batch_size=64)
    model.train()
    with PhaseProfiler(logdir, "train_mnist_cnn", wait=1, warmup=1, active=10, record_shapes=True,
                       profile_memory=True) as prof:
        prof.attach(model, optimizer)
        done = 0
        while done < steps:
            for data, target in prof.data(loader):
                data, target = data.to(device), target.to(device)
                optimizer.zero_grad()
                loss = F.nll_loss(model(data), target)
                loss.backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break
            scheduler.step()


def infer(logdir: str, steps: int, device: torch.device) -> None:
    model = SmallCnn().to(device).eval()
    with PhaseProfiler(logdir, "infer_small_cnn", wait=1, warmup=1, active=10, record_shapes=True) as prof:
        prof.attach(model)
        with torch.inference_mode():
            for images, _ in prof.data(image_loader(steps)):
                logits = model(images.to(device))
                with prof.phase("postprocess"):
                    logits.softmax(dim=1).topk(3, dim=1)
                prof.step()

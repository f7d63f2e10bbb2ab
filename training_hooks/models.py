"""The demo's models, on synthetic data: what `phaseprof demo` and the benchmarks run.

The MNIST CNN is the one from PyTorch's MNIST example (conv 1->32->64, dropout, fc 9216->128->10);
data are random tensors shaped like MNIST, so nothing is downloaded.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class MnistNet(nn.Module):
    """PyTorch's MNIST example network."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class SmallCnn(nn.Module):
    """A small image classifier for the inference part of the demo (forward-only steps)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def mnist_loader(batches: int, batch_size: int = 64, seed: int = 0, **loader_kwargs) -> DataLoader:
    """Random MNIST-shaped images and labels, ``batches`` batches of ``batch_size``."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batches * batch_size, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (batches * batch_size,), generator=g)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, **loader_kwargs)


def image_loader(batches: int, batch_size: int = 32, size: int = 64, seed: int = 0) -> DataLoader:
    """Random RGB images for the inference run."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batches * batch_size, 3, size, size, generator=g)
    labels = torch.zeros(batches * batch_size, dtype=torch.long)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size)

"""The demo's models and data (`training_hooks/models.py`): the networks the README and the
benchmarks name, and synthetic data that is the same for the same seed."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from phaseprof.training_hooks.models import MnistNet, SmallCnn, image_loader, mnist_loader


def _layers(model: nn.Module) -> list[str]:
    return [repr(m) for m in model.modules() if not list(m.children())]


def test_mnist_net_is_pytorchs_mnist_example():
    """Conv 1->32->64 (3x3, stride 1), dropout 0.25 and 0.5, fc 9216->128->10: 1,199,882 weights."""
    model = MnistNet()
    assert _layers(model) == [
        "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))",
        "Conv2d(32, 64, kernel_size=(3, 3), stride=(1, 1))",
        "Dropout(p=0.25, inplace=False)",
        "Dropout(p=0.5, inplace=False)",
        "Linear(in_features=9216, out_features=128, bias=True)",
        "Linear(in_features=128, out_features=10, bias=True)",
    ]
    assert sum(p.numel() for p in model.parameters()) == 1_199_882


def test_mnist_net_gives_log_probabilities_of_ten_classes():
    """... along the classes, named: no deprecation warning for a dimension left implicit."""
    torch.manual_seed(0)
    model = MnistNet().eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, 10)
    assert torch.allclose(out.exp().sum(dim=1), torch.ones(3), atol=1e-5)
    assert (out < 0).all()


def test_mnist_net_forward_is_the_examples_layer_by_layer():
    """The forward pass, layer by layer as in PyTorch's example (dropout off in eval mode)."""
    torch.manual_seed(1)
    model = MnistNet().eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        h = torch.relu(model.conv2(torch.relu(model.conv1(x))))
        h = torch.flatten(torch.nn.functional.max_pool2d(h, 2), 1)
        expected = torch.log_softmax(model.fc2(torch.relu(model.fc1(h))), dim=1)
        assert torch.allclose(model(x), expected, atol=1e-6)


def test_mnist_net_drops_out_while_training():
    torch.manual_seed(2)
    model = MnistNet().train()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert not torch.allclose(model(x), model.eval()(x))


def test_small_cnn_classifies_rgb_images_into_its_classes():
    torch.manual_seed(0)
    model = SmallCnn()
    assert _layers(model) == [
        "Conv2d(3, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))", "ReLU()",
        "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)",
        "Conv2d(16, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))", "ReLU()",
        "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)",
        "Conv2d(32, 64, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))", "ReLU()",
        "AdaptiveAvgPool2d(output_size=1)",
        "Linear(in_features=64, out_features=10, bias=True)",
    ]
    with torch.no_grad():
        assert SmallCnn()(torch.randn(2, 3, 64, 64)).shape == (2, 10)
        assert SmallCnn(classes=4)(torch.randn(1, 3, 32, 32)).shape == (1, 4)


def test_small_cnn_forward_is_its_features_then_its_head():
    torch.manual_seed(3)
    model = SmallCnn().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model.head(torch.flatten(model.features(x), 1))
        assert torch.equal(model(x), expected)


def test_mnist_loader_gives_its_batches_of_mnist_shaped_images_and_labels():
    batches = list(mnist_loader(3, batch_size=5))
    assert len(batches) == 3
    for images, labels in batches:
        assert images.shape == (5, 1, 28, 28) and images.dtype == torch.float32
        assert labels.shape == (5,) and labels.dtype == torch.int64
    (images, labels), = mnist_loader(1)  # 64 a batch unless told
    assert images.shape == (64, 1, 28, 28) and labels.shape == (64,)
    # the ten digits, each a label, random normal images
    assert set(labels.tolist()) == set(range(10))
    assert abs(images.mean().item()) < 0.05 and abs(images.std().item() - 1) < 0.05


def test_mnist_loader_is_the_same_for_a_seed_and_passes_the_loaders_options():
    def data(loader):
        return [(x.clone(), y.clone()) for x, y in loader]

    same = data(mnist_loader(2, batch_size=4))
    for (x, y), (x0, y0) in zip(same, data(mnist_loader(2, batch_size=4, seed=0))):
        assert torch.equal(x, x0) and torch.equal(y, y0)
    assert not torch.equal(data(mnist_loader(2, batch_size=4, seed=1))[0][0], same[0][0])
    # a loader option reaches the DataLoader
    assert list(mnist_loader(2, batch_size=3, collate_fn=len)) == [3, 3]


def test_image_loader_gives_rgb_images_of_its_size_labelled_zero():
    batches = list(image_loader(2, batch_size=3, size=8))
    assert len(batches) == 2
    for images, labels in batches:
        assert images.shape == (3, 3, 8, 8)
        assert labels.tolist() == [0, 0, 0] and labels.dtype == torch.int64
    (images, _), = image_loader(1)  # 32 images of 64x64 unless told
    assert images.shape == (32, 3, 64, 64)
    assert abs(images.mean().item()) < 0.05 and abs(images.std().item() - 1) < 0.05
    first = next(iter(image_loader(1, batch_size=2, size=4)))[0]
    assert torch.equal(first, next(iter(image_loader(1, batch_size=2, size=4, seed=0)))[0])
    assert not torch.equal(first, next(iter(image_loader(1, batch_size=2, size=4, seed=1)))[0])

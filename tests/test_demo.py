"""The README's first commands, as a user runs them: `phaseprof demo`, then `phaseprof report ./profile`;
and the demo in-process, short: what it trains and writes."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from phaseprof import analyze
from phaseprof.training_hooks import demo
from phaseprof.training_hooks.models import MnistNet, SmallCnn
from phaseprof.training_hooks.profiler import PhaseProfiler

PHASEPROF = os.path.join(os.path.dirname(sys.executable), "phaseprof")  # the installed console script


@pytest.mark.slow
def test_demo_then_report(tmp_path):
    demo = subprocess.run([PHASEPROF, "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, demo.stderr
    assert "Next: tensorboard --logdir ./profile" in demo.stdout

    report = subprocess.run([PHASEPROF, "report", "./profile", "--json"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    runs = {r["run"]: r for r in json.loads(report.stdout)["runs"]}
    assert set(runs) == {"train_mnist_cnn", "infer_small_cnn"}
    (train,) = runs["train_mnist_cnn"]["workers"]
    assert [s["step"] for s in train["steps"]] == list(range(2, 12))
    assert all(s["phases"]["backward"]["host_ms"] > 0 and not s["inferred"] for s in train["steps"])
    (infer,) = runs["infer_small_cnn"]["workers"]
    # inference has no backward: a phase with no time in the run is not listed
    assert all(s["phases"]["postprocess"]["host_ms"] > 0 and "backward" not in s["phases"] for s in infer["steps"])


# -- the demo in-process, short (tests/mutation.py runs these) ------------------------------------

TRAIN_STEPS = 13  # one more than the profiled window ends at (steps 2 to 11): the window's end shows


class _Watched(PhaseProfiler):
    """The demo's profiler, keeping what the demo attached and counting the batches it drew (a
    loop that would not end fails at the first batch too many)."""

    seen: dict = {}

    def attach(self, model, optimizer=None):
        self.seen[self.run] = dict(model=model, optimizer=optimizer, training=model.training,
                                   weights={k: v.clone() for k, v in model.state_dict().items()},
                                   batches=0)
        return super().attach(model, optimizer)

    def data(self, loader):
        seen = self.seen[self.run]
        limit = TRAIN_STEPS if self.run == "train_mnist_cnn" else demo.INFERENCE_STEPS
        for batch in super().data(loader):
            seen["batches"] += 1
            assert seen["batches"] <= limit, f"{self.run}: more batches than steps"
            yield batch


def _trace_events(run_dir: Path) -> list[dict]:
    (trace,) = run_dir.glob("*.pt.trace.json.gz")
    with gzip.open(trace) as f:
        return json.load(f)["traceEvents"]


def test_a_short_demo_writes_both_runs_as_its_docstring_says(tmp_path, monkeypatch):
    """``phaseprof demo --steps 13`` in this process, on the CPU (one test: mutmut times a test's
    call, not a shared fixture's setup). Training: the MNIST net, Adadelta at lr 1.0, times 0.7
    after each epoch of 10 batches, from seed 0's weights, profiled from step 2 to 11 with shapes
    and memory; inference: the small CNN in eval mode, 12 steps, a postprocess phase."""
    monkeypatch.setattr(demo, "PhaseProfiler", _Watched)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _Watched.seen.clear()
    assert demo.run_demo(str(tmp_path), steps=TRAIN_STEPS) == 0

    runs = {r["run"]: r for r in analyze(str(tmp_path))["runs"]}
    assert set(runs) == {"train_mnist_cnn", "infer_small_cnn"}
    (train,) = runs["train_mnist_cnn"]["workers"]
    assert [s["step"] for s in train["steps"]] == list(range(2, 12))
    assert all(s["phases"]["backward"]["host_ms"] > 0 and not s["inferred"] for s in train["steps"])
    (infer,) = runs["infer_small_cnn"]["workers"]
    assert [s["step"] for s in infer["steps"]] == list(range(2, 12))
    assert all(s["phases"]["postprocess"]["host_ms"] > 0 and "backward" not in s["phases"]
               for s in infer["steps"])

    # the traces: shapes in both, memory in the training run's only
    train_events = _trace_events(tmp_path / "train_mnist_cnn")
    infer_events = _trace_events(tmp_path / "infer_small_cnn")
    assert any(e.get("name") == "[memory]" for e in train_events)
    assert not any(e.get("name") == "[memory]" for e in infer_events)
    assert any("Input Dims" in e.get("args", {}) for e in train_events)
    # postprocess: the top classes of the softmax over the classes, 32 images a batch
    assert any(e.get("name") == "aten::topk" and e["args"]["Input Dims"][0] == [32, 10]
               for e in infer_events)
    assert any(e.get("name") == "aten::softmax" and e["args"]["Input Dims"][0] == [32, 10]
               for e in infer_events)

    seen = _Watched.seen["train_mnist_cnn"]
    assert isinstance(seen["model"], MnistNet) and seen["training"]
    assert seen["batches"] == TRAIN_STEPS
    assert isinstance(seen["optimizer"], torch.optim.Adadelta)
    assert seen["optimizer"].param_groups[0]["initial_lr"] == 1.0
    assert seen["optimizer"].param_groups[0]["lr"] == pytest.approx(1.0 * 0.7 ** 2)  # two epochs begun
    assert next(seen["model"].parameters()).device == torch.device("cpu")
    torch.manual_seed(0)
    first = MnistNet().state_dict()
    assert all(torch.equal(first[k], v) for k, v in seen["weights"].items())

    seen = _Watched.seen["infer_small_cnn"]
    assert isinstance(seen["model"], SmallCnn) and not seen["training"]
    assert seen["optimizer"] is None and seen["batches"] == demo.INFERENCE_STEPS


def test_the_demo_refuses_no_steps_and_a_cuda_device_torch_cannot_see(monkeypatch, tmp_path):
    with pytest.raises(SystemExit, match=r"^phaseprof demo: --steps must be at least 1, got 0$"):
        demo.run_demo(str(tmp_path), steps=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^phaseprof demo: --device cuda, but torch sees no CUDA device$"):
        demo.run_demo(str(tmp_path), steps=1, device="cuda")
    assert not any(tmp_path.iterdir())


def test_the_demo_puts_its_models_and_batches_on_the_device_it_is_given(tmp_path, monkeypatch):
    """``meta``: a device other than the CPU on any machine (shapes only, nothing computed)."""
    monkeypatch.setattr(demo, "PhaseProfiler", _Watched)
    _Watched.seen.clear()
    demo.train(str(tmp_path), 2, torch.device("meta"))
    demo.infer(str(tmp_path), 2, torch.device("meta"))
    for run in ("train_mnist_cnn", "infer_small_cnn"):
        seen = _Watched.seen[run]
        assert next(seen["model"].parameters()).device.type == "meta" and seen["batches"] == 2


def test_the_demo_runs_on_the_gpu_when_torch_sees_one(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "train", lambda *args: calls.append(("train", *args)))
    monkeypatch.setattr(demo, "infer", lambda *args: calls.append(("infer", *args)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert demo.run_demo(str(tmp_path), steps=5) == 0
    assert calls == [("train", str(tmp_path), 5, torch.device("cuda")),
                     ("infer", str(tmp_path), 12, torch.device("cuda"))]
    calls.clear()
    assert demo.run_demo(str(tmp_path), steps=1, device="cpu") == 0
    assert [call[-1] for call in calls] == [torch.device("cpu")] * 2

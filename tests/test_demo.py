"""The README's first commands, as a user runs them: `phaseprof demo`, then `phaseprof report ./profile`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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

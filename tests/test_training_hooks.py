"""PhaseProfiler on real torch runs: what lands under the logdir, what the analysis reads back, and
how faults and misuse behave."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensorboard.backend.event_processing import event_accumulator

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import BACKWARD, DATA, FORWARD, OPTIMIZER, OTHER, STEP_TAG, TRACE_FILE_RE, host_tag, parse_tag
from phaseprof.training_hooks.models import MnistNet, SmallCnn, image_loader, mnist_loader
from phaseprof.training_hooks.profiler import PhaseError

TRAINING_PHASES = (DATA, FORWARD, BACKWARD, OPTIMIZER)


def readme_loop(prof: PhaseProfiler, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader) -> None:
    """The loop of the README's snippet."""
    for data, target in prof.data(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()


def run_readme_snippet(logdir: Path, steps: int, **options) -> PhaseProfiler:
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    loader = mnist_loader(batches=steps, batch_size=8)
    prof = PhaseProfiler(logdir=str(logdir), run="baseline", **options)
    prof.attach(model, optimizer)
    readme_loop(prof, model, optimizer, loader)
    prof.close()
    return prof


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every phaseprof scalar of a run, read back by TensorBoard's own reader."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if parse_tag(tag)}


def worker_rows(logdir: Path, run: str) -> list[dict]:
    report = analyze(str(logdir))
    assert report["errors"] == []
    (entry,) = [r for r in report["runs"] if r["run"] == run]
    (worker,) = entry["workers"]
    return worker["steps"]


def caught_phaseprof_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("phaseprof")]


def test_readme_snippet_writes_traces_phases_and_scalars_for_every_step(tmp_path, capsys):
    run_readme_snippet(tmp_path / "profile", steps=20, wait=1, warmup=1, active=10, repeat=1)
    run_dir = tmp_path / "profile" / "baseline"

    traces = [p.name for p in run_dir.iterdir() if TRACE_FILE_RE.match(p.name)]
    assert len(traces) == 1 and traces[0].endswith(".pt.trace.json.gz")
    assert TRACE_FILE_RE.match(traces[0])["worker"] == f"{socket.gethostname()}_{os.getpid()}"
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith((".part", ".tmp"))]

    rows = worker_rows(tmp_path / "profile", "baseline")
    assert [r["step"] for r in rows] == list(range(2, 12))  # wait=1, warmup=1, active=10
    for row in rows:
        assert not row["empty"] and not row["inferred"], row
        for phase in TRAINING_PHASES:
            assert row["phases"][phase]["host_ms"] > 0, (row["step"], phase)
            assert not row["phases"][phase]["inferred"], (row["step"], phase)

    scalars = read_scalars(run_dir)
    for phase in (*TRAINING_PHASES, OTHER):
        assert [step for step, _ in scalars[host_tag(phase)]] == list(range(20))
    assert [step for step, _ in scalars[STEP_TAG]] == list(range(20))
    for i, (_, total) in enumerate(scalars[STEP_TAG]):
        parts = sum(scalars[host_tag(p)][i][1] for p in (*TRAINING_PHASES, OTHER))
        assert parts == pytest.approx(total, rel=1e-4)

    out = capsys.readouterr().out
    assert "20 step(s) timed" in out and "backward" in out
    assert f"tensorboard --logdir {tmp_path / 'profile'}" in out


def test_inference_steps_with_a_phase_of_ones_own(tmp_path):
    model = SmallCnn().eval()
    with PhaseProfiler(logdir=str(tmp_path), run="infer", wait=0, warmup=1, active=4) as prof:
        prof.attach(model)
        with torch.inference_mode():
            for images, _ in prof.data(image_loader(6, batch_size=4, size=32)):
                logits = model(images)
                with prof.phase("postprocess"):
                    logits.softmax(dim=1).topk(3, dim=1)
                prof.step()

    rows = worker_rows(tmp_path, "infer")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert row["phases"]["postprocess"]["host_ms"] > 0
        assert row["phases"][FORWARD]["host_ms"] > 0 and not row["phases"][FORWARD]["inferred"]
        assert BACKWARD not in row["phases"]  # a phase with no time in the run is not listed
    scalars = read_scalars(tmp_path / "infer")
    assert [step for step, _ in scalars[host_tag("postprocess")]] == list(range(6))
    assert host_tag(BACKWARD) not in scalars


def test_a_cpu_run_never_synchronizes_cuda(tmp_path, monkeypatch):
    def synchronize(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize() called during a CPU run")

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    run_readme_snippet(tmp_path, steps=4, wait=0, warmup=1, active=2)
    assert len(read_scalars(tmp_path / "baseline")[STEP_TAG]) == 4


def test_close_restores_model_optimizer_and_autograd(tmp_path):
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    backward = torch.autograd.backward
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. StepLR's "optimizer.step() has been overridden"
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # wraps optimizer.step
        scheduler_step = optimizer.step
        prof = PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=1).attach(model, optimizer)
        assert torch.autograd.backward is not backward
        readme_loop(prof, model, optimizer, mnist_loader(batches=2, batch_size=4))
        scheduler.step()
        prof.close()
    assert optimizer.param_groups[0]["lr"] == 0.5
    assert torch.autograd.backward is backward
    assert optimizer.step is scheduler_step and "zero_grad" not in vars(optimizer)
    assert {"forward", "zero_grad"}.isdisjoint(vars(model))


def test_a_scheduler_created_after_attach_keeps_working(tmp_path):
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=1) as prof:
            prof.attach(model, optimizer)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            readme_loop(prof, model, optimizer, mnist_loader(batches=3, batch_size=4))
            scheduler.step()
        assert prof.step_num == 3
        optimizer.step()  # still the scheduler's wrapper, which now calls the optimizer's own step
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_an_exception_in_the_loop_passes_through_and_timing_goes_on(tmp_path):
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=3) as prof:
        prof.attach(model, optimizer)
        for i, (data, target) in enumerate(prof.data(mnist_loader(batches=5, batch_size=4))):
            optimizer.zero_grad()
            try:
                with prof.phase("loss"):
                    loss = F.nll_loss(model(data if i != 2 else data[:, :, :5]), target)
            except RuntimeError as e:
                assert "shape" in str(e) or "size" in str(e)  # the model's own error, untouched
                continue
            loss.backward()
            optimizer.step()
    steps = [step for step, _ in read_scalars(tmp_path / "r")[STEP_TAG]]
    assert steps == [0, 1, 2, 3]  # the failed iteration's time belongs to step 2


@pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")
def test_worker_name_carries_the_rank_under_torch_distributed(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        run_readme_snippet(tmp_path / "profile", steps=3, wait=0, warmup=1, active=1)
    finally:
        dist.destroy_process_group()
    (trace,) = [p.name for p in (tmp_path / "profile" / "baseline").iterdir() if TRACE_FILE_RE.match(p.name)]
    assert TRACE_FILE_RE.match(trace)["worker"] == f"rank0.{socket.gethostname()}_{os.getpid()}"


# -- faults ----------------------------------------------------------------------------------------


def test_an_unwritable_logdir_warns_once_and_training_completes(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = run_readme_snippet(tmp_path / "file" / "profile", steps=6, wait=0, warmup=1, active=2)
    (warning,) = caught_phaseprof_warnings(caught)
    assert str(tmp_path / "file" / "profile" / "baseline") in warning and "Training goes on" in warning
    assert prof.step_num == 6
    out = capsys.readouterr().out
    assert "6 step(s) timed, 0 trace file(s) written" in out and "optimizer" in out
    assert "not done: could not write trace" in out


DISK_FULL = textwrap.dedent("""
    import json, resource, signal, sys, warnings
    import torch, torch.nn.functional as F
    from phaseprof import PhaseProfiler
    from phaseprof.training_hooks.models import MnistNet, mnist_loader

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PhaseProfiler(logdir=sys.argv[1], run="full", wait=0, warmup=1, active=3, gzip=False,
                           record_shapes=True) as prof:
            prof.attach(model, optimizer)
            for data, target in prof.data(mnist_loader(batches=8, batch_size=4)):
                optimizer.zero_grad()
                F.nll_loss(model(data), target).backward()
                optimizer.step()
    print(json.dumps([str(w.message) for w in caught if str(w.message).startswith("phaseprof")]))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="simulates a full disk with RLIMIT_FSIZE")
def test_a_full_disk_loses_the_trace_with_one_warning_and_keeps_the_timings(tmp_path):
    done = subprocess.run([sys.executable, "-c", DISK_FULL, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (warning,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert "could not write trace" in warning
    run_dir = tmp_path / "full"
    assert [p.name for p in run_dir.iterdir() if not p.name.startswith(("events.out.tfevents.", ".phaseprof"))] == []
    assert [step for step, _ in read_scalars(run_dir)[STEP_TAG]] == list(range(8))


# -- misuse ----------------------------------------------------------------------------------------


@pytest.fixture
def prof(tmp_path):
    profiler = PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=1)
    yield profiler
    profiler.close()


def test_attaching_twice_is_an_error(prof):
    model = MnistNet()
    prof.attach(model)
    with pytest.raises(RuntimeError, match="already attached"):
        prof.attach(model)


def test_attaching_something_else_than_a_module_is_an_error(prof):
    with pytest.raises(TypeError, match="torch.nn.Module"):
        prof.attach(lambda x: x)


def test_stepping_after_close_is_an_error(prof):
    prof.step()
    prof.close()
    with pytest.raises(RuntimeError, match="closed"):
        prof.step()
    with pytest.raises(RuntimeError, match="closed"):
        prof.data([1, 2])


def test_stepping_by_hand_with_an_attached_optimizer_is_an_error(prof):
    model = MnistNet()
    prof.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="already ends each step"):
        prof.step()


def test_a_phase_nested_in_itself_is_an_error(prof):
    with prof.phase("loss"), pytest.raises(PhaseError, match="nested in itself"), prof.phase("loss"):
        pass


def test_phases_closed_out_of_order_are_an_error(prof):
    outer, inner = prof.phase("outer"), prof.phase("inner")
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(PhaseError, match="'inner' is still open inside it"):
        outer.__exit__(None, None, None)


@pytest.mark.parametrize("name", ["step", "x_gpu", ""])
def test_a_phase_name_that_would_read_as_another_is_an_error(prof, name):
    with pytest.raises(ValueError, match="phase"):
        prof.phase(name)


def test_two_profilers_at_once_is_an_error(prof, tmp_path):
    prof.step()
    with pytest.raises(RuntimeError, match="still running"):
        PhaseProfiler(logdir=str(tmp_path), run="other").step()


def test_every_trace_records_the_cpus_the_process_may_use(tmp_path):
    # the data-loader advice is sized by them; a schedule that repeats writes one trace per cycle
    import gzip

    from phaseprof.contract import CPUS_KEY
    from phaseprof.plugin.reading.discovery import discover
    from phaseprof.plugin.spans import analyze_file

    run_readme_snippet(tmp_path / "profile", steps=12, wait=1, warmup=1, active=2, repeat=2)
    run_dir = tmp_path / "profile" / "baseline"
    traces = sorted(p for p in run_dir.iterdir() if TRACE_FILE_RE.match(p.name))
    assert len(traces) == 2
    usable = len(os.sched_getaffinity(0))
    for path in traces:
        recorded = json.loads(gzip.decompress(path.read_bytes()))[CPUS_KEY]
        assert recorded == {"count": os.cpu_count(), "usable": usable}
    (run,) = discover(str(run_dir))
    assert [analyze_file(f).cpus for files in run.workers.values() for f in files] == [usable, usable]


def test_the_scalars_records_carry_tensorboards_checksums():
    """The recorder frames its event records itself (with a C CRC-32C): byte for byte what
    TensorBoard's own record writer writes."""
    import io
    import random

    from tensorboard.summary.writer.record_writer import RecordWriter

    from phaseprof.training_hooks.recorder import frame

    rng = random.Random(0)
    records = [bytes(rng.randrange(256) for _ in range(n)) for n in (0, 1, 7, 150, 4096)]
    theirs = io.BytesIO()
    for data in records:
        RecordWriter(theirs).write(data)
    assert b"".join(frame(data) for data in records) == theirs.getvalue()

"""`PhaseProfiler` (`training_hooks/profiler.py`) on a tiny model in this process: plain JSON traces
and no background analysis, so that a test is a few steps of two Linear layers. What is checked is
what the user gets: the steps' scalars, the trace's steps, the summary, the errors at the call.
tests/test_training_hooks.py runs the README's loop on a real model with the defaults."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from phaseprof import PhaseProfiler
from phaseprof.capture_channel import read_channel
from phaseprof.contract import CPUS_KEY, TRACE_FILE_RE, rank_scalars_dir
from phaseprof.training_hooks import module_ranges
from phaseprof.training_hooks import profiler as profiler_module
from phaseprof.training_hooks.capture import Slowdown
from phaseprof.training_hooks.profiler import PhaseError, check_run_name

OPTIONS = dict(gzip=False, analyze_traces=False)


def tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class Batches:
    """A loader: ``steps`` batches, with attributes of its own."""

    batch_size = 3

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return iter([(torch.ones(3, 4) * i, torch.zeros(3, 2)) for i in range(self.steps)])


def train(prof: PhaseProfiler, steps: int) -> None:
    model, optimizer = tiny()
    prof.attach(model, optimizer)
    for x, y in prof.data(Batches(steps)):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def scalars(run_dir: Path) -> dict[int, dict[str, float]]:
    """Step -> tag -> value, from the run's event file(s)."""
    out: dict[int, dict[str, float]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            for value in event.summary.value:
                out.setdefault(event.step, {})[value.tag] = value.simple_value
    return out


def traces(run_dir: Path) -> list[list[int]]:
    """The steps of each trace of the run, by name."""
    out = []
    for path in sorted(p for p in run_dir.iterdir() if TRACE_FILE_RE.match(p.name)):
        events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
        out.append(sorted(int(e["name"].split("#")[1]) for e in events
                          if e.get("name", "").startswith("ProfilerStep#")))
    return out


def test_a_loop_s_steps_are_timed_and_its_window_traced(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    prof = PhaseProfiler(logdir=str(tmp_path), run="r", wait=1, warmup=1, active=2, **OPTIONS)
    train(prof, 6)
    assert signal.getsignal(signal.SIGTERM) != before  # closes the run on SIGTERM while it runs
    prof.close()
    assert signal.getsignal(signal.SIGTERM) == before
    assert prof.step_num == 6
    steps = scalars(tmp_path / "r")
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]
    for step in range(6):
        assert {"phaseprof/data_ms", "phaseprof/forward_ms", "phaseprof/backward_ms", "phaseprof/optimizer_ms",
                "phaseprof/step_ms"} <= set(steps[step])
    assert traces(tmp_path / "r") == [[2, 3]]
    (trace,) = [p for p in (tmp_path / "r").iterdir() if TRACE_FILE_RE.match(p.name)]
    usable = len(os.sched_getaffinity(0))
    assert json.loads(trace.read_text(encoding="utf-8"))[CPUS_KEY] == {"count": os.cpu_count(), "usable": usable}
    out = capsys.readouterr().out
    assert "run r: 6 step(s) timed, 1 trace file(s) written" in out
    prof.close()  # twice: nothing more
    assert capsys.readouterr().out == ""


def test_a_schedule_that_repeats_writes_a_trace_per_cycle_and_stops_after_the_last(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=1, active=1, repeat=2, **OPTIONS) as prof:
            train(prof, 7)
    assert traces(tmp_path / "r") == [[1], [3]]
    assert [str(w.message) for w in caught if "phaseprof" in str(w.message)] == []  # stopped cleanly
    with PhaseProfiler(logdir=str(tmp_path), run="forever", wait=1, warmup=0, active=1, repeat=0, **OPTIONS) as prof:
        train(prof, 5)
    assert traces(tmp_path / "forever") == [[1], [3], [5]]  # and the step open at close, recording


def test_steps_ended_by_hand_and_a_phase_of_ones_own(tmp_path):
    model, _ = tiny()
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=0, active=2, **OPTIONS) as prof:
        prof.attach(model)
        for x, _ in prof.data(Batches(3)):
            with torch.no_grad():
                out = model(x)
            with prof.phase("post"):
                out.softmax(dim=1)
            prof.step()
    steps = scalars(tmp_path / "r")
    assert sorted(steps) == [0, 1, 2] and all(steps[s]["phaseprof/post_ms"] > 0 for s in steps)
    assert traces(tmp_path / "r") == [[0, 1]]


def test_an_error_inside_a_phase_passes_through_and_closes_the_phase(tmp_path):
    with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=0, active=1, **OPTIONS) as prof:
        with pytest.raises(KeyError, match="the user's"), prof.phase("loss"):
            raise KeyError("the user's")
        with prof.phase("loss"):  # closed by the error: opens again
            pass
        prof.step()
    assert "phaseprof/loss_ms" in scalars(tmp_path / "r")[0]


def test_the_data_loader_keeps_its_length_and_attributes(tmp_path):
    with PhaseProfiler(logdir=str(tmp_path), run="r", **OPTIONS) as prof:
        loader = Batches(2)
        timed = prof.data(loader)
        assert len(timed) == 2 and timed.batch_size == 3 and timed.steps == 2
        assert repr(timed) == f"prof.data({loader!r})"
        assert [float(x[0, 0]) for x, _ in timed] == [0.0, 1.0]
        assert [float(x[0, 0]) for x, _ in timed] == [0.0, 1.0]  # each iteration fetches afresh


def test_attach_takes_modules_and_optimizers_one_or_several(tmp_path):
    (a, opt_a), (b, opt_b) = tiny(), tiny()
    with PhaseProfiler(logdir=str(tmp_path), run="r", **OPTIONS) as prof:
        prof.attach([a, b], [opt_a, opt_b])
        with pytest.raises(RuntimeError) as raised:
            prof.attach(a)
        assert str(raised.value) == "this PhaseProfiler is already attached; attach it once, before the loop"
    for wrong, message in [(lambda x: x, "attach() needs a torch.nn.Module or a list of them, got function"),
                           ([a, 3], "attach() needs a torch.nn.Module or a list of them, got int"),
                           ([], "attach() needs a torch.nn.Module")]:
        with PhaseProfiler(logdir=str(tmp_path), run="s", **OPTIONS) as prof, pytest.raises(TypeError) as raised:
            prof.attach(wrong)
        assert str(raised.value) == message
    with PhaseProfiler(logdir=str(tmp_path), run="t", **OPTIONS) as prof, pytest.raises(TypeError) as raised:
        prof.attach(a, [opt_a, "sgd"])
    assert str(raised.value) == "attach() needs a torch.optim.Optimizer or a list of them, got str"


def test_a_schedule_that_makes_no_sense_is_refused_at_once(tmp_path):
    for wrong in [dict(active=0), dict(wait=-1), dict(warmup=-1), dict(repeat=-1)]:
        with pytest.raises(ValueError, match="the schedule needs wait, warmup, repeat >= 0 and active >= 1"):
            PhaseProfiler(logdir=str(tmp_path), **wrong)
    PhaseProfiler(logdir=str(tmp_path), wait=0, warmup=0, repeat=0, active=1)  # the least there is


def test_run_names_stay_inside_the_logdir(tmp_path):
    assert check_run_name("ablation/lr0.1") == "ablation/lr0.1"
    prof = PhaseProfiler(logdir=str(tmp_path), run="ablation/lr0.1")
    assert prof.run_dir == os.path.join(str(tmp_path), "ablation/lr0.1")
    for outside in ["", "  ", "/abs", "\\abs", "a/\0", "a/../b", ".."]:
        with pytest.raises(ValueError, match="not a run name|outside the logdir"):
            check_run_name(outside)
    with pytest.raises(ValueError, match=r"run='a/\.\./b' would write outside the logdir"):
        check_run_name("a/../b")
    with pytest.raises(TypeError, match="run must be a string, not int"):
        check_run_name(5)


def test_the_default_run_name_is_the_start_time(tmp_path):
    before = time.strftime("%Y%m%d-%H%M%S")
    prof = PhaseProfiler(logdir=str(tmp_path))
    assert before <= prof.run <= time.strftime("%Y%m%d-%H%M%S") and len(prof.run) == 15


def test_misuse_raises_at_the_call(tmp_path):
    prof = PhaseProfiler(logdir=str(tmp_path), run="r", **OPTIONS)
    prof.close()  # never started: nothing to write
    assert not (tmp_path / "r").exists()
    with pytest.raises(RuntimeError, match=r"PhaseProfiler\(run='r'\) is closed; create a new one"):
        prof.step()
    with pytest.raises(RuntimeError, match=r"data\(\) after close\(\)"):
        prof.data([])
    prof = PhaseProfiler(logdir=str(tmp_path), run="s", **OPTIONS)
    try:
        prof.step()
        with pytest.raises(RuntimeError, match=r"PhaseProfiler\(run='s'\) is still running in this process"):
            PhaseProfiler(logdir=str(tmp_path), run="t").step()
        failed = []

        def step() -> None:
            try:
                prof.step()
            except RuntimeError as e:
                failed.append(str(e))

        thread = threading.Thread(target=step)
        thread.start()
        thread.join()
        assert failed == ["step() must be called on the thread that runs the loop (the one that started the "
                          "profiler)"]
        model, optimizer = tiny()
        prof.attach(model, optimizer)
        with pytest.raises(RuntimeError, match="already ends each step"):
            prof.step()
        with pytest.raises(PhaseError, match="nested in itself"), prof.phase("x"), prof.phase("x"):
            pass
        phase = prof.phase("y")
        phase.__enter__()
    finally:
        prof.close()
    with pytest.raises(RuntimeError, match=r"leaving phase\('y'\) after close\(\)"):
        phase.__exit__(None, None, None)


def test_a_profiler_that_cannot_start_leaves_the_steps_timed(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=0, active=1, **OPTIONS) as prof:
            train(prof, 2)
    (warning,) = [str(w.message) for w in caught if "phaseprof" in str(w.message)]
    assert warning.startswith(f"phaseprof ({tmp_path / 'r'}): torch.profiler failed to start; steps are timed "
                              "without traces: RuntimeError: no profiler here")
    assert sorted(scalars(tmp_path / "r")) == [0, 1]
    out = capsys.readouterr().out
    assert "2 step(s) timed, 0 trace file(s) written" in out and "torch.profiler failed to start" in out


def test_a_run_on_the_cpu_never_makes_a_cuda_timer(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(profiler_module, "CudaPhaseTimer", lambda: made.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # CUDA up, but not available
    with PhaseProfiler(logdir=str(tmp_path), run="r", **OPTIONS) as prof:
        train(prof, 2)
    assert made == []


def test_an_evaluation_pass_is_kept_apart_even_before_the_first_backward(tmp_path):
    model, optimizer = tiny()
    with PhaseProfiler(logdir=str(tmp_path), run="r", **OPTIONS) as prof:
        prof.attach(model, optimizer)
        for i, (x, y) in enumerate(prof.data(Batches(3))):
            if i in (0, 1):  # a validation pass: before any backward, then between steps
                model.eval()
                with torch.no_grad():
                    model(x)
                model.train()
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    steps = scalars(tmp_path / "r")
    assert "phaseprof/eval_ms" in steps[0] and "phaseprof/eval_ms" in steps[1]
    assert "phaseprof/eval_ms" not in steps[2]


def test_the_run_is_watched_for_capture_requests_and_slowdowns_as_asked(tmp_path):
    for asked, rule in [(False, None), (True, Slowdown()), (Slowdown(last=3), Slowdown(last=3))]:
        with PhaseProfiler(logdir=str(tmp_path), run="r", capture_on_slowdown=asked, **OPTIONS) as prof:
            prof.step()
            assert read_channel(str(tmp_path / "r")).beats[0].rank == 0  # its heartbeat, from the start
            assert prof._capture.slowdown == rule


def test_a_profiler_that_fails_to_stop_is_reported(tmp_path, monkeypatch, capsys):
    def stop(self):
        raise RuntimeError("kineto is gone")

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=0, active=1, repeat=0, **OPTIONS) as prof:
            train(prof, 2)
            monkeypatch.setattr(torch.profiler.profile, "stop", stop)
    assert "torch.profiler failed to stop: RuntimeError: kineto is gone" in capsys.readouterr().out


def test_module_ranges_that_fail_are_reported_and_training_goes_on(tmp_path, monkeypatch):
    def enter(name):
        raise RuntimeError("no range")

    monkeypatch.setattr(module_ranges, "_enter", enter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PhaseProfiler(logdir=str(tmp_path), run="r", wait=0, warmup=0, active=2, modules=True,
                           **OPTIONS) as prof:
            train(prof, 3)
    (warning,) = [str(w.message) for w in caught if "phaseprof" in str(w.message)]
    assert "module ranges failed and were stopped (modules=True): RuntimeError: no range" in warning
    assert sorted(scalars(tmp_path / "r")) == [0, 1, 2]


def test_each_rank_of_several_writes_its_scalars_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    with warnings.catch_warnings(record=True):  # (torch.profiler asks the real process group: no trace)
        warnings.simplefilter("always")
        with PhaseProfiler(logdir=str(tmp_path), run="r", **OPTIONS) as prof:
            train(prof, 2)
    assert sorted(scalars(tmp_path / "r" / rank_scalars_dir(1))) == [0, 1]
    (events,) = (tmp_path / "r" / rank_scalars_dir(1)).glob("events.out.tfevents.*")
    assert f".rank1.{socket.gethostname()}_{os.getpid()}." in events.name
    assert read_channel(str(tmp_path / "r")).beats[1].world_size == 2


class GpuTimer:
    """`CudaPhaseTimer` as it behaves on a GPU: each step's GPU times known one step later, every
    pending step resolved at close."""

    made = 0

    def __init__(self) -> None:
        GpuTimer.made += 1
        self.pending: list = []

    def mark(self, phase: str | None) -> None:
        pass

    def end_step(self, record) -> list:
        record.gpu_ms = {"forward": 1.0}
        self.pending.append(record)
        done, self.pending = self.pending[:-1], self.pending[-1:]
        return done

    def finish(self) -> list:
        done, self.pending = self.pending, []
        return done


def test_a_gpu_run_keeps_one_timer_whose_steps_all_reach_the_scalars(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # the model is on a GPU
    monkeypatch.setattr(profiler_module, "CudaPhaseTimer", GpuTimer)
    GpuTimer.made = 0
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with PhaseProfiler(logdir=str(tmp_path), run="r", activities=cpu, **OPTIONS) as prof:
        train(prof, 4)
    steps = {s: tags for s, tags in scalars(tmp_path / "r").items() if "phaseprof/step_ms" in tags}
    assert sorted(steps) == [0, 1, 2, 3] and all(steps[s]["phaseprof/forward_gpu_ms"] == 1.0 for s in steps)
    assert GpuTimer.made == 1

"""The whole run in `phaseprof report`: every timed step, read from the run's event files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import EVAL_TAG, PROFILER_TAG, SCALAR_PREFIX, STEP_TAG, host_tag, parse_tag
from phaseprof.plugin.reading.scalars import read_scalars


def report(*args):
    return subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"})


def tensorboard_scalars(run_dir) -> dict[str, dict[int, float]]:
    """Every phaseprof scalar of a run as TensorBoard's own reader reads it: tag -> {step: value}."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]
            if tag.startswith(SCALAR_PREFIX)}


def write_events(run_dir, rows: list[tuple[int, dict[str, float]]]) -> None:
    writer = EventFileWriter(str(run_dir))
    for step, values in rows:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v)
                                             for t, v in values.items()])
        writer.add_event(event_pb2.Event(step=step, wall_time=time.time(), summary=summary))
    writer.close()


def test_whole_run_figures_equal_those_of_the_event_files(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in range(60)]
    prof = PhaseProfiler(logdir=str(tmp_path), run="train", wait=1, warmup=1, active=3)
    prof.attach(model, optimizer)
    for i, (x, y) in enumerate(prof.data(batches)):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if i == 37:
            time.sleep(3.0)  # one slow step, in "other": slower than a busy machine makes any other
        loss.backward()
        optimizer.step()
    prof.close()

    out = report(tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    (run,) = json.loads(out.stdout)["runs"]
    (whole,) = run["whole_run"]
    expected = tensorboard_scalars(tmp_path / "train")
    assert sorted(expected[STEP_TAG]) == list(range(60))
    assert (whole["first_step"], whole["last_step"]) == (0, 59)
    steps = list(range(1, 60))  # as the summary on close: the first step left out
    assert whole["steps"] == len(steps) and whole["left_out"] == ["step 0 (first)"]
    spreads = {(p["phase"], p["clock"]): p for p in whole["phases"]}
    phase_tags = {t: parse_tag(t) for t in expected if t != STEP_TAG and parse_tag(t)}  # not eval or profiler
    assert {k for k in spreads if k[1] == "host"} == {("step", "host")} | {
        (parsed[0], "host") for parsed in phase_tags.values() if not parsed[1]}
    for tag, values in expected.items():
        parsed = parse_tag(tag)
        if parsed is None:  # the profiler's own time, evaluation: not a phase
            continue
        key = ("step", "host") if tag == STEP_TAG else (parsed[0], "gpu" if parsed[1] else "host")
        v = np.array([values.get(s, 0.0) for s in steps])
        median, p90, p99 = np.percentile(v, [50, 90, 99])
        got = spreads[key]
        assert got["steps"] == len(v)
        for field, want in (("median_ms", median), ("p90_ms", p90), ("p99_ms", p99), ("max_ms", v.max()),
                            ("mean_ms", v.mean()), ("total_s", v.sum() / 1000)):
            assert got[field] == pytest.approx(want, abs=1e-4), (key, field)
    slowest = whole["slowest"][0]
    assert slowest["step"] == max(steps, key=lambda s: expected[STEP_TAG][s]) == 37
    assert slowest["wall_ms"] == pytest.approx(expected[STEP_TAG][37], abs=1e-4) and slowest["wall_ms"] >= 3000
    assert slowest["phase"] == "other" and slowest["phase_over_median_ms"] >= 2900
    assert [s["wall_ms"] for s in whole["slowest"]] == sorted((s["wall_ms"] for s in whole["slowest"]), reverse=True)

    text = report(tmp_path).stdout
    assert "run train · whole run: steps 0–59; figures over 59 steady step(s), left out: step 0 (first)" in text
    assert "slowest steps: 37 (" in text


def test_profiler_and_evaluation_time_and_phases_that_start_later(tmp_path):
    rows = []
    for s in range(10):
        values = {STEP_TAG: 10.0 + s, host_tag("forward"): 4.0, PROFILER_TAG: 0.0}
        if s >= 5:
            values[host_tag("loss")] = 1.0  # a phase of the user's, first run at step 5
        if s == 6:
            values[PROFILER_TAG] = 300.0  # the trace was written after step 6
        if s in (4, 8):
            values[EVAL_TAG] = 100.0 * s  # an evaluation pass before steps 4 and 8
        rows.append((s, values))
    rows.append((10, {EVAL_TAG: 50.0}))  # and one after the last step, written at close
    write_events(tmp_path / "r", rows)
    (whole,) = analyze(str(tmp_path))["runs"][0]["whole_run"]
    spreads = {p["phase"]: p for p in whole["phases"]}
    assert "profiler" not in spreads and "eval" not in spreads
    assert whole["steps"] == 9 and whole["left_out"] == ["step 0 (first)"]  # a pass at close adds no step
    assert spreads["step"]["max_ms"] == 19.0  # the passes are in no step
    # a phase first run at step 5 took 0 ms before
    assert spreads["loss"]["steps"] == 9 and spreads["loss"]["mean_ms"] == pytest.approx(5 / 9, abs=1e-4)
    run_ms = sum(10.0 + s for s in range(10)) + 300 + 1250
    assert whole["profiler"] == {"total_ms": 300.0, "steps": 1, "median_ms": 300.0, "max_ms": 300.0, "max_step": 6,
                                 "share": round(300 / run_ms, 5)}
    assert whole["eval"] == {"total_ms": 1250.0, "steps": 3, "median_ms": 400.0, "max_ms": 800.0, "max_step": 8,
                             "share": round(1250 / run_ms, 5)}
    out = report(tmp_path)
    assert out.returncode == 0  # a run with scalars and no trace is a readable run
    assert "profiler's own time: 300.00 ms in all" in out.stdout
    assert "evaluation, outside the steps: 3 pass(es), 1,250.00 ms in all" in out.stdout
    assert "median 400.00 ms" in out.stdout


def test_scalar_reader_stops_at_a_record_cut_short_and_later_files_win(tmp_path):
    write_events(tmp_path, [(s, {STEP_TAG: 1.0}) for s in range(5)])
    time.sleep(1.1)  # event files are named by the second they were opened in: the resumed one sorts last
    write_events(tmp_path, [(s, {STEP_TAG: 2.0}) for s in range(3, 8)])  # resumed at step 3
    first, second = sorted(p for p in tmp_path.iterdir() if "tfevents" in p.name)
    data = second.read_bytes()
    second.write_bytes(data[:-10])  # the last record is still being written
    s = read_scalars(str(tmp_path))
    assert s.steps.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert s.values[STEP_TAG].tolist() == [1, 1, 1, 2, 2, 2, 2]
    assert s.files == [str(first), str(second)]


@pytest.mark.slow
def test_whole_run_figures_equal_the_close_summarys_on_a_compiled_run(tmp_path, capsys):
    """With ``torch.compile``, the steps that compiled take seconds: the report's whole-run figures
    leave them (and the first step) out, as the summary printed on close does, and say so."""
    from phaseprof.training_hooks.summary import steady_steps

    torch.manual_seed(0)
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="aot_eager")
    prof = PhaseProfiler(logdir=str(tmp_path), run="compiled", wait=1, warmup=1, active=2)
    prof.attach(compiled, optimizer)
    for _ in range(12):
        optimizer.zero_grad()
        F.cross_entropy(compiled(torch.randn(16, 32)), torch.randint(0, 4, (16,))).backward()
        optimizer.step()
    prof.close()
    torch._dynamo.reset()
    summary = capsys.readouterr().out
    stats = prof._recorder.stats
    kept, left_out = steady_steps(stats)
    assert "compile" in stats.cpu and left_out[0] == "step 0 (first)"
    assert f"medians of {int(kept.sum())} step(s); left out: {', '.join(left_out)}" in summary

    (whole,) = analyze(str(tmp_path))["runs"][0]["whole_run"]
    assert whole["steps"] == int(kept.sum()) and whole["left_out"] == left_out
    spreads = {p["phase"]: p for p in whole["phases"] if p["clock"] == "host"}
    columns = {phase: np.frombuffer(column)[kept] for phase, column in stats.cpu.items()}
    columns["step"] = np.sum(list(columns.values()), axis=0)
    assert set(spreads) == set(columns)
    for phase, values in columns.items():  # the scalars hold float32: equal to 1e-4 ms or 1e-6 of the value
        for field, want in (("median_ms", np.median(values)), ("mean_ms", values.mean()), ("max_ms", values.max())):
            assert spreads[phase][field] == pytest.approx(want, rel=1e-6, abs=1e-4), (phase, field)
    text = report(tmp_path).stdout
    assert f"figures over {int(kept.sum())} steady step(s), left out: {', '.join(left_out)}" in text

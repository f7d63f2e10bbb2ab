"""Time the training hook keeps out of the steps — evaluation passes (``phaseprof::eval``) and
``prof.paused()`` blocks (``phaseprof::paused``) — stays out on the TensorBoard side too: in no
step's time, phase, op, kernel or memory table, summary or finding, and carried apart per step; the
timeline carries the evaluation and profiler scalars apart from the phases. torch.compile's compile
time stays in its step as the ``compile`` phase, and summaries leave compiling steps out."""

from __future__ import annotations

import json
import time

import pytest
import torch

from phaseprof import PhaseProfiler, analyze
from phaseprof.contract import EVAL_TAG, HOOK_TAG, PROFILER_TAG, STEP_TAG
from phaseprof.training_hooks.models import MnistNet
from tests.logdir import evaluation_run, hook_ms, settled, write_trace
from tests.test_plugin import BASE, make_app
from tests.timing import scalars, train_step, within
from tests.tracebuilder import annotation, op, step, thread_names

PHASES = ("data", "forward", "backward", "optimizer", "other")


def get(client, url):
    response = client.get(url)
    assert response.status_code == 200, (url, response.get_data(as_text=True))
    return json.loads(response.get_data())


# -- a hand-built run: an evaluation pass and a paused block, each launching device work ----------


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    root = tmp_path_factory.mktemp("logdir")
    evaluation_run(root / "eval")
    for f in root.rglob("*"):
        settled(f)
    return root


def worker(report: dict) -> dict:
    (run,) = report["runs"]
    (w,) = run["workers"]
    return w


def test_time_kept_out_of_a_step_is_in_none_of_its_figures_and_carried_apart(evaluation):
    rows = {r["step"]: r for r in worker(analyze(str(evaluation)))["steps"]}
    assert sorted(rows) == [1, 2, 3, 4, 5]
    for number, row in rows.items():
        # every step holds 10 ms of training: its window less the pass or the paused block
        assert row["wall_ms"] == pytest.approx(10.0), number
        assert sum(p["host_ms"] for p in row["phases"].values()) == pytest.approx(row["wall_ms"])
        assert row["phases"]["forward"]["gpu_ms"] == pytest.approx(1.0)  # not the pass's 5 ms kernel
        assert row["gpu_ms"] == pytest.approx(3.0)
    two, three = rows[2], rows[3]
    # the pass, and the 0.5 ms of other before it (its loader's first batch) as the hook counts it
    assert (two["eval_ms"], two["eval_gpu_ms"], two["paused_ms"]) == pytest.approx((14.5, 5.0, 0.0))
    assert two["phases"]["data"]["host_ms"] == pytest.approx(0.5)
    assert two["phases"]["forward"]["host_ms"] == pytest.approx(3.0)  # the forward range inside the pass is not
    assert two["phases"]["other"]["host_ms"] == pytest.approx(0.5)
    assert (three["paused_ms"], three["paused_gpu_ms"], three["eval_ms"]) == pytest.approx((10.0, 1.0, 0.0))
    assert all(rows[n]["eval_ms"] == rows[n]["paused_ms"] == 0 for n in (1, 4, 5))


def test_summary_slowest_step_and_findings_leave_the_time_kept_apart_out(evaluation):
    summary = worker(analyze(str(evaluation)))["summary"]
    assert summary["mean_wall_ms"] == pytest.approx(10.0) and summary["median_wall_ms"] == pytest.approx(10.0)
    assert summary["mean"]["forward"]["host_ms"] == pytest.approx(3.0)
    assert summary["mean"]["forward"]["share"] == pytest.approx(0.3)
    assert summary["slowest"]["noise"] == "within-noise"  # step 2's 24.5 ms window is not a 24.5 ms step
    assert summary["outliers"] == []
    assert (summary["eval_ms"], summary["paused_ms"]) == pytest.approx((14.5, 10.0))
    notes = {f["kind"]: f for f in summary["findings"]}
    assert "fast-steps" not in notes and "slow-step" not in notes
    apart = notes["kept-apart"]
    assert apart["evidence"] == {"steps": [2, 3], "eval_ms": 14.5, "paused_ms": 10.0}
    assert "evaluation passes 14.50 ms and prof.paused() blocks 10.00 ms" in apart["text"]
    assert all(f["phase"] not in ("eval", "paused") for f in summary["findings"])
    assert summary["phases"] == list(PHASES)  # no "eval" or "paused" phase


def test_the_step_detail_ops_kernels_memory_and_trace_of_a_step_holding_a_pass(evaluation):
    plugin, client = make_app(evaluation)
    assert plugin._store.wait(300)
    detail = get(client, f"{BASE}/step?run=eval&step=2")
    assert detail["apart"] == [[0.5, 15.0, "eval"]]  # after the data fetch, to the training forward
    names = {o["name"] for ops in detail["ops"].values() for o in ops}
    assert "aten::conv2d" not in names and "aten::stack" not in names  # the pass's ops are in no phase
    assert {b[3] for b in detail["lanes"]["bands"]} <= set(PHASES)
    assert not any(b[1] < 15.0 and b[2] > 0.5 for b in detail["lanes"]["bands"])  # the lanes leave it empty
    assert detail["memory"]["forward"] == {}  # its allocation is in no phase
    kernels = get(client, f"{BASE}/kernels?run=eval&step=2")
    assert {k["name"] for k in kernels["kernels"]} == {"forward_gemm", "backward_gemm"}
    assert kernels["gpu_us"] == pytest.approx(detail["gpu_ms"] * 1000)
    every = get(client, f"{BASE}/kernels?run=eval")
    assert "eval_conv" not in {k["name"] for k in every["kernels"]}
    assert "checkpoint_copy" not in {k["name"] for k in every["kernels"]}
    ops = get(client, f"{BASE}/ops?run=eval")
    assert {"aten::conv2d", "aten::save", "aten::stack"}.isdisjoint(o["name"] for o in ops["ops"])
    assert ops["wall_ms"] == pytest.approx(50.0)
    memory = get(client, f"{BASE}/memory?run=eval&step=2")
    assert memory["apart"] == [[0.5, 15.0, "eval"]] and memory["wall_ms"] == pytest.approx(10.0)
    assert all(d["peak_bytes"] == 0 or not d["t_ms"] for d in memory["devices"])

    trace = get(client, f"{BASE}/trace?run=eval&step=2")["traceEvents"]
    lane = [e for e in trace if e.get("cat") in ("phase", "apart")]
    assert [e["name"] for e in lane if e["cat"] == "apart"] == ["eval (outside the step)"]
    conv = next(e for e in trace if e["name"] == "aten::conv2d")
    assert conv["args"] == {"apart": "eval"}
    eval_kernel = next(e for e in trace if e["name"] == "eval_conv")
    assert eval_kernel["args"]["apart"] == "eval" and "phase" not in eval_kernel["args"]
    assert sum(e["dur"] for e in lane if e["cat"] == "phase") == pytest.approx(10_000)
    paused = get(client, f"{BASE}/step?run=eval&step=3")
    assert paused["apart"] == [[9.0, 19.0, "paused"]]
    assert paused["paused_ms"] == pytest.approx(10.0)


def test_the_timeline_carries_evaluation_and_the_profilers_own_time_apart(evaluation):
    plugin, client = make_app(evaluation)
    assert plugin._store.wait(300)
    body = get(client, f"{BASE}/timeline?run=eval")
    assert body["steps"] == list(range(10))
    assert body["eval"] == [None, None, 14.5, None, None, None, None, 15.0, None, None]
    assert body["profiler"] == [30.0 if s == 5 else 0.05 for s in range(10)]
    assert body["hook"] == [pytest.approx(hook_ms(s)) for s in range(10)]
    assert body["wall"][2] == 10.0  # the pass is not in the step
    assert "eval" not in body["phases"] and "profiler" not in body["phases"]
    assert body["profiled"] == [[1, 5]]


def test_the_terminal_report_shows_the_time_kept_apart(evaluation, capsys):
    from rich.console import Console

    from phaseprof.cli.report import report
    from phaseprof.cli.terminal import render

    render(report(str(evaluation)), Console(width=200, force_terminal=False))
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "wall ms" in line)
    assert [c.strip() for c in header.split("┃")[-2:]] == ["eval ms", "paused ms"]  # after the step's own columns
    row = [cell.strip() for cell in next(line for line in out.splitlines() if line.split()[:1] == ["2"]).split("│")]
    assert row[1] == "10.00" and row[-2:] == ["14.5/5.0", ""]  # the step's own 10 ms; its pass (host/GPU) apart
    assert "evaluation, outside the steps: 2 pass(es), 29.50 ms in all" in out
    assert "profiler's own time: 30.45 ms in all" in out
    # the hook's own time, and what it is
    assert ("phaseprof's hooks, outside the phases: 2.63 ms in all" in out
            and "in no phase and not in the steps' time" in " ".join(out.split()))


# -- a real loop: PyTorch's MNIST CNN with an evaluation pass and a paused block in its window -----


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """Eight training steps of the MNIST CNN (batches of 8), profiled from step 1 to 6; after step 2 an
    evaluation pass (model.eval(), torch.no_grad(), six batches of 64), after step 4 a paused block (a
    60 ms sleep and a forward). Returns the logdir, the pass's ms by a timer, and each iteration's
    ms off the CPU."""
    logdir = tmp_path_factory.mktemp("real")
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    data, target = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
    test_data = torch.randn(64, 1, 28, 28, generator=g)
    eval_ms = []
    clocks = []  # (wall ns, the thread's CPU ns) as each iteration starts, and after the last
    asleep_ns = 0
    with PhaseProfiler(logdir=str(logdir), run="r", wait=0, warmup=1, active=6) as prof:
        prof.attach(model, optimizer)
        for i in range(8):
            clocks.append((time.perf_counter_ns(), time.thread_time_ns()))
            train_step(model, optimizer, data, target)
            if i == 2:
                t0 = time.perf_counter()
                model.eval()
                with torch.no_grad():
                    for _ in range(6):
                        model(test_data).argmax(dim=1)
                model.train()
                eval_ms.append((time.perf_counter() - t0) * 1e3)
            if i == 4:
                with prof.paused():
                    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                    time.sleep(0.06)
                    asleep_ns = (time.perf_counter_ns() - t0) - (time.thread_time_ns() - c0)
                    model(data)
        clocks.append((time.perf_counter_ns(), time.thread_time_ns()))
    for f in logdir.rglob("*"):
        settled(f)
    # each iteration's time off the CPU (preempted, or waiting for torch's intra-op threads), its sleep aside
    off_cpu_ms = [((w1 - w0) - (c1 - c0) - (asleep_ns if i == 4 else 0)) / 1e6
                  for i, ((w0, c0), (w1, c1)) in enumerate(zip(clocks, clocks[1:]))]
    return logdir, eval_ms[0], off_cpu_ms


def test_a_real_loops_traced_steps_equal_their_scalars_with_the_pass_apart(real_run):
    logdir, eval_reference, off_cpu_ms = real_run
    values = scalars(logdir / "r")
    w = worker(analyze(str(logdir), step=3))
    (row,) = w["steps"]
    assert row["step"] == 3
    # the step equals its scalar, which leaves the pass out; counted in, it would be off by all of it
    assert row["eval_ms"] > 0.5 * row["wall_ms"]
    assert abs(row["wall_ms"] - values[STEP_TAG][3]) < 0.25 * row["eval_ms"], (row, values[STEP_TAG][3])
    # the pass ran in iteration 2: preempted there between two clocks, one figure stretches past the other
    interrupted = sum(off_cpu_ms[2:4])
    assert within(row["eval_ms"], values[EVAL_TAG][3]) or abs(row["eval_ms"] - values[EVAL_TAG][3]) <= interrupted, (
        row["eval_ms"], values[EVAL_TAG][3], interrupted)
    assert row["eval_ms"] <= eval_reference * 1.05 + 1 + interrupted
    # its ops are not the step's: the step ran one forward (two convolutions), the pass six
    detail = w["detail"]
    assert sum(o["calls"] for ops in detail["ops"].values() for o in ops if o["name"] == "aten::conv2d") == 2
    assert detail["apart"][0][2] == "eval" and detail["apart"][0][1] - detail["apart"][0][0] == pytest.approx(
        row["eval_ms"], abs=0.01)

    rows = {r["step"]: r for r in worker(analyze(str(logdir)))["steps"]}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for n in sorted(rows):  # every traced step equals its scalar: within 5% or 0.5 ms, or beyond that by no
        # more than the profiler's own time at its two ends (between the scalars' clock and torch.profiler's marks)
        # and the time the thread was off the CPU in iterations n - 1 to n + 1, around the step: preempted
        # between phaseprof's clock and a mark of the trace, it stretches one past the other. The
        # trace's step holds the hook's own time too (its ranges), which the scalars keep apart.
        step = values[STEP_TAG][n] + values[HOOK_TAG].get(n, 0.0)
        gap = rows[n]["wall_ms"] - step
        ends = values[PROFILER_TAG].get(n - 1, 0.0) + values[PROFILER_TAG][n]
        interrupted = sum(off_cpu_ms[n - 1:n + 2])
        assert within(rows[n]["wall_ms"], step) or (
            -interrupted <= gap <= ends + 0.5 + interrupted), (
            n, gap, ends, interrupted, rows[n], values)
    assert rows[5]["paused_ms"] >= 60 and rows[5]["eval_ms"] == 0
    assert all(rows[n]["eval_ms"] == 0 for n in rows if n != 3)
    summary = worker(analyze(str(logdir)))["summary"]
    assert summary["eval_ms"] == pytest.approx(row["eval_ms"], abs=0.01)
    assert summary["slowest"]["wall_ms"] < row["eval_ms"]


def test_a_real_loops_timeline_carries_its_pass_and_the_profilers_time(real_run):
    logdir = real_run[0]
    values = scalars(logdir / "r")
    plugin, client = make_app(logdir)
    assert plugin._store.wait(300)
    body = get(client, f"{BASE}/timeline?run=r")
    assert body["steps"] == list(range(8))
    assert [s for s, v in zip(body["steps"], body["eval"]) if v is not None] == [3]
    assert body["eval"][3] == pytest.approx(values[EVAL_TAG][3], abs=0.001)
    assert body["profiler"] == [pytest.approx(values[PROFILER_TAG][s], abs=0.001) for s in range(8)]
    assert max(range(8), key=lambda s: body["profiler"][s]) == 6  # the step that wrote the trace


# -- torch.compile's compile time: a phase of its step, and its steps out of the summary ----------


def compile_trace(path, compiling: tuple[int, ...]) -> None:
    events = thread_names()
    for number in range(1, 7):
        t = number * 100_000
        compile_us = 60_000 if number in compiling else 0
        events += [step(number, t, 10_000 + compile_us), annotation("phaseprof::forward", t, 3_000 + compile_us),
                   op("aten::addmm", t + 100, 2_000)]
        if compile_us:
            events.append(annotation("phaseprof::compile", t + 500, compile_us))
        events += [annotation("phaseprof::backward", t + 3_000 + compile_us, 4_000),
                   annotation("phaseprof::optimizer", t + 7_000 + compile_us, 2_000)]
    write_trace(path, events)


def test_compile_time_is_a_compile_phase_and_compiling_steps_are_left_out_of_the_summary(tmp_path):
    compile_trace(tmp_path / "r" / "w.1.pt.trace.json", compiling=(1, 2))
    w = worker(analyze(str(tmp_path)))
    rows = {r["step"]: r for r in w["steps"]}
    assert rows[1]["phases"]["compile"]["host_ms"] == pytest.approx(60.0)
    assert rows[1]["phases"]["forward"]["host_ms"] == pytest.approx(3.0)  # innermost: compile, not forward
    assert rows[1]["wall_ms"] == pytest.approx(70.0)  # compile time stays in its step
    summary = w["summary"]
    assert summary["phases"] == [*PHASES[1:], "compile"]
    assert summary["compiling_steps"] == [1, 2]
    assert summary["mean_wall_ms"] == pytest.approx(10.0)  # steps 3..6
    assert summary["slowest"]["step"] not in (1, 2)
    assert summary["mean"]["compile"]["host_ms"] == 0
    note = next(f for f in summary["findings"] if f["kind"] == "compiling-steps")
    assert note["evidence"] == {"steps": [1, 2], "phases": ["compile"]}
    assert "steps 1, 2 compiled (torch.compile: 120.00 ms in the compile phase): left out of the means" in note["text"]


def test_when_every_step_compiled_none_is_left_out(tmp_path):
    compile_trace(tmp_path / "r" / "w.1.pt.trace.json", compiling=(1, 2, 3, 4, 5, 6))
    summary = worker(analyze(str(tmp_path)))["summary"]
    assert "compiling_steps" not in summary
    assert summary["mean_wall_ms"] == pytest.approx(70.0)
    assert "compiling-steps" not in {f["kind"] for f in summary["findings"]}

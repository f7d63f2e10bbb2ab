"""Where in the code: the module view (`/modules`, `phaseprof report --modules`) and the ops' call
stacks, on CPU runs recorded here with a known model: three blocks, the middle one made slower by a
sleep in its forward."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from rich.console import Console
from torch import nn

from phaseprof import PhaseProfiler, cli
from phaseprof.cli.report import analyze, report
from phaseprof.cli.terminal import render
from phaseprof.plugin.analysis import stacks
from phaseprof.training_hooks import module_ranges

SLEEP_S = 0.25  # far beyond the noise of a loaded machine (a backward op alone has taken 0.2 s)
STEPS = 5  # 1 warm-up + 3 active + 1 after


class Block(nn.Module):
    def __init__(self, slow: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # BLOCK_FORWARD
        if self.slow:
            time.sleep(SLEEP_S)
        return torch.relu(self.lin(x))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(slow=True), Block()])
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


#: torch names a frame by its function's first line
BLOCK_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if "# BLOCK_FORWARD" in line)


def _train(logdir: Path, **options) -> None:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with PhaseProfiler(logdir=str(logdir), run="mlp", wait=0, warmup=1, active=3, gzip=False, analyze_traces=False,
                       **options) as prof:
        prof.attach(model, optimizer)
        for _ in range(STEPS):
            x = torch.randn(16, 32)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def _worker(logdir: Path, step: int | None = None) -> dict:
    r = analyze(str(logdir), step=step, modules=True)
    assert not r["errors"], r["errors"]
    (worker,) = r["runs"][0]["workers"]
    return worker


@pytest.fixture(scope="module")
def ranges_run(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("modules")
    _train(logdir, modules=True)
    return logdir


@pytest.fixture(scope="module")
def stack_run(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("stacks")
    _train(logdir, with_stack=True)
    return logdir


def test_the_slow_block_comes_first_and_top_level_forward_adds_to_the_forward_phase(ranges_run):
    m = _worker(ranges_run)["modules"]
    assert m["source"] == "phaseprof ranges" and m["steps"] == 3
    rows = {r["path"]: r for r in m["modules"]}
    assert set(rows) == {"MLP", "MLP.head", *(f"MLP.blocks.{i}{s}" for i in range(3) for s in ("", ".lin"))}
    # the ModuleList is never called (no row): its blocks' parent is the model, where they are called from
    assert rows["MLP.blocks.1"]["parent"] == "MLP" and rows["MLP.blocks.1.lin"]["parent"] == "MLP.blocks.1"
    assert rows["MLP.blocks.1"]["depth"] == 1 and rows["MLP.blocks.1.lin"]["depth"] == 2
    children = [r["path"] for r in m["modules"] if r["parent"] == "MLP"]
    assert children[0] == "MLP.blocks.1", children
    assert rows["MLP.blocks.1"]["forward_ms"] >= 3 * SLEEP_S * 1000
    top = [r for r in m["modules"] if r["parent"] is None]
    assert [r["path"] for r in top] == ["MLP"]
    forward = sum(r["forward_ms"] for r in top)
    assert forward == pytest.approx(m["forward_phase_ms"], rel=0.01)
    assert rows["MLP"]["calls"] == 3 and rows["MLP.blocks.1.lin"]["calls"] == 3
    # a module's time holds its children's; its own leaves them out
    children = sum(rows[f"MLP.blocks.{i}"]["forward_ms"] for i in range(3)) + rows["MLP.head"]["forward_ms"]
    assert children <= rows["MLP"]["forward_ms"]
    # (within the trace's clock: each of the four children's ends is cut to the parent's, ±1 µs each)
    assert rows["MLP"]["forward_self_ms"] == pytest.approx(rows["MLP"]["forward_ms"] - children, abs=0.005)


def test_backward_reaches_each_module_through_the_autograd_link(ranges_run):
    rows = {r["path"]: r for r in _worker(ranges_run)["modules"]["modules"]}
    for i in range(3):
        lin = rows[f"MLP.blocks.{i}.lin"]
        backward_ops = {o["name"] for o in lin["ops"] if o["backward"]}
        assert "autograd::engine::evaluate_function: AddmmBackward0" in backward_ops
        assert lin["backward_ms"] > 0
        assert rows[f"MLP.blocks.{i}"]["backward_ms"] >= lin["backward_ms"]  # the block's holds its linear's
        assert {o["name"] for o in lin["ops"] if not o["backward"]} == {"aten::linear"}
    assert "autograd::engine::evaluate_function: ReluBackward0" in {
        o["name"] for o in rows["MLP.blocks.0"]["ops"] if o["backward"]}
    # the model's backward is its modules' and its own ops': at most the backward phase
    w = _worker(ranges_run)
    backward_phase = sum(s["phases"]["backward"]["host_ms"] for s in w["steps"] if s["phases"].get("backward"))
    assert 0 < rows["MLP"]["backward_ms"] <= backward_phase


def test_module_ranges_are_no_ops_and_no_phases(ranges_run):
    w = _worker(ranges_run, step=2)
    names = {o["name"] for ops in w["detail"]["ops"].values() for o in ops}
    assert "aten::linear" in names and not any(n.startswith("phaseprof.module::") for n in names)
    assert set(w["detail"]["phases"]) <= {"data", "forward", "backward", "optimizer", "other"}
    one = w["modules"]
    assert one["step"] == 2 and one["steps"] == 1
    assert {r["path"]: r for r in one["modules"]}["MLP"]["calls"] == 1


def test_torchs_module_records_give_the_view_without_modules_true(stack_run):
    m = _worker(stack_run)["modules"]
    assert m["source"] == "trace module records"
    rows = {r["path"]: r for r in m["modules"]}
    assert "MLP_0.Block_1" in rows and "MLP_0.Block_1.Linear_1" in rows, sorted(rows)
    assert [r["path"] for r in m["modules"] if r["depth"] == 1][0] == "MLP_0.Block_1"
    top = [r for r in m["modules"] if r["parent"] is None]
    assert [r["path"] for r in top] == ["MLP_0"]
    assert top[0]["forward_ms"] == pytest.approx(m["forward_phase_ms"], rel=0.01)
    assert rows["MLP_0.Block_1.Linear_1"]["backward_ms"] > 0


def test_ops_carry_their_call_stack_and_user_frame(stack_run):
    w = _worker(stack_run, step=2)
    ops = {o["name"]: o for o in w["detail"]["ops"]["forward"]}
    relu = ops["aten::relu"]
    assert relu["frame"].endswith(f"test_modules.py({BLOCK_LINE}): forward"), relu["frame"]
    assert relu["stack"][0].startswith("<built-in method relu")  # innermost first
    assert any(f.startswith("nn.Module: Block_") for f in relu["stack"])
    # the run's op table (`/ops`) too
    from phaseprof.plugin.analysis.operators import run_ops
    from phaseprof.plugin.analysis.worker import Worker
    from phaseprof.plugin.reading.discovery import discover
    from phaseprof.plugin.spans import analyze_file

    (run,) = discover(str(stack_run))
    spans = [analyze_file(f) for files in run.workers.values() for f in files]
    by_name = {o.name: o for o in run_ops(Worker("w", spans)).ops}
    assert by_name["aten::relu"].frame == relu["frame"] and by_name["aten::relu"].stack
    assert by_name["aten::addmm"].frame.endswith(f"test_modules.py({BLOCK_LINE}): forward")


def test_user_frames_skip_torch_the_standard_library_and_builtins():
    assert not stacks.is_user_frame("torch/nn/modules/module.py(1782): _call_impl")
    assert not stacks.is_user_frame("<built-in method relu of type object at 0x7f>")
    assert not stacks.is_user_frame("nn.Module: Linear_0")
    assert not stacks.is_user_frame("typing.py(2268): cast")
    assert not stacks.is_user_frame("/usr/lib/python3.11/site-packages/x/y.py(1): f")
    assert stacks.is_user_frame("train.py(12): <module>")
    assert stacks.is_user_frame("models/resnet.py(80): forward")
    assert stacks.user_frame(["<built-in function linear>", "torch/nn/functional.py(3): f", "net.py(9): forward",
                              "train.py(3): main"]) == "net.py(9): forward"


def test_the_loop_runs_on_when_module_ranges_fail(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("record_function is broken")

    monkeypatch.setattr(module_ranges, "_enter", broken)
    with pytest.warns(RuntimeWarning, match="module ranges failed"):
        _train(tmp_path, modules=True)
    w = _worker(tmp_path)
    assert len(w["steps"]) == 3 and w["modules"]["modules"] == []


def test_report_modules_in_the_terminal_and_as_json(ranges_run, capsys):
    assert cli.main(["report", str(ranges_run), "--modules", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"][0]["workers"][0]["modules"]["modules"][0]["path"] == "MLP"
    r = report(str(ranges_run), modules=True)
    console = Console(file=io.StringIO(), width=160, color_system=None)
    render(r, console)
    text = console.file.getvalue()
    assert "MLP.blocks.1" in text and "backward" in text.lower()
    assert text.index("MLP.blocks.1") < text.index("MLP.blocks.0")
    msgspec.json.encode(r)


def test_the_step_trace_carries_each_events_stack(stack_run, ranges_run):
    from phaseprof.plugin.analysis.step_trace import step_trace
    from phaseprof.plugin.reading.decode import read_trace

    (with_stack,) = (stack_run / "mlp").glob("*.pt.trace.json")
    events = step_trace(read_trace(str(with_stack)), 2).traceEvents
    relu = [e for e in events if e.name == "aten::relu"]
    assert len(relu) == 3
    assert all(e.args["frame"].endswith(f"test_modules.py({BLOCK_LINE}): forward") for e in relu)
    assert all(e.args["stack"][0].startswith("<built-in method relu") for e in relu)
    (without,) = (ranges_run / "mlp").glob("*.pt.trace.json")
    assert not any(e.args and "stack" in e.args for e in step_trace(read_trace(str(without)), 2).traceEvents)


def test_gpu_time_of_a_modules_forward_and_backward_is_the_work_each_launched(tmp_path):
    """A built GPU trace: two modules in a model, each launching one kernel in forward; their gradient
    functions run on autograd's own thread and launch one kernel each, linked to the forward ops by
    their sequence numbers only."""
    from tests.logdir import write_trace
    from tests.tracebuilder import AUTOGRAD, annotation, kernel, launch, op, step, thread_names

    events = thread_names() + [
        step(1, 0, 2000), annotation("phaseprof::forward", 50, 900),
        op("phaseprof.module::Net", 100, 800), op("phaseprof.module::Net.a", 150, 250),
        op("phaseprof.module::Net.b", 450, 400),
        op("aten::mm", 160, 100, **{"Sequence number": 1}), launch(170, corr=1), kernel("k_a", 300, 50, corr=1),
        op("aten::mm", 460, 100, **{"Sequence number": 2}), launch(470, corr=2), kernel("k_b", 500, 80, corr=2),
        annotation("phaseprof::backward", 1000, 600),
        op("autograd::engine::evaluate_function: MmBackward0", 1100, 100, tid=AUTOGRAD, **{"Sequence number": 2}),
        launch(1110, corr=3, tid=AUTOGRAD), kernel("k_b_grad", 1150, 30, corr=3),
        op("autograd::engine::evaluate_function: MmBackward0", 1250, 120, tid=AUTOGRAD, **{"Sequence number": 1}),
        launch(1260, corr=4, tid=AUTOGRAD), kernel("k_a_grad", 1300, 40, corr=4),
    ]
    write_trace(tmp_path / "w.1.pt.trace.json", events)
    m = _worker(tmp_path)["modules"]
    assert m["has_gpu"] and m["source"] == "phaseprof ranges"
    rows = {r["path"]: r for r in m["modules"]}
    expected = {  # forward ms, forward GPU ms, backward ms, backward GPU ms
        "Net": (0.8, 0.13, 0.22, 0.07), "Net.a": (0.25, 0.05, 0.12, 0.04), "Net.b": (0.4, 0.08, 0.1, 0.03)}
    for path, (fwd, fwd_gpu, bwd, bwd_gpu) in expected.items():
        r = rows[path]
        assert (r["forward_ms"], r["forward_gpu_ms"], r["backward_ms"], r["backward_gpu_ms"]) == pytest.approx(
            (fwd, fwd_gpu, bwd, bwd_gpu), abs=1e-6), path
    assert rows["Net.b"]["parent"] == "Net" and rows["Net"]["forward_self_ms"] == pytest.approx(0.15)
    assert {(o["name"], o["backward"], o["gpu_ms"]) for o in rows["Net.a"]["ops"]} == {
        ("aten::mm", False, 0.05), ("autograd::engine::evaluate_function: MmBackward0", True, 0.04)}


# The module view on hand-built traces (no training loop): figures known to the microsecond.

RANGE = "phaseprof.module::"


def _linked(s: int) -> list[dict]:
    """Step ``s`` (2 ms): a forward (1 ms) where Net [10, 610) calls enc [20, 320) (aten::linear
    around aten::addmm, launching a 100 µs gemm; aten::relu) and head [400, 500) (aten::linear); a
    backward on the autograd thread whose gradient functions carry their forward ops' sequence
    numbers (AddmmBackward0 of enc's linear launching a 200 µs kernel; one of no forward op)."""
    from tests.tracebuilder import AUTOGRAD, annotation, kernel, launch, op, step

    t, c = (s - 1) * 2_000.0, 10 * s
    evaluate = "autograd::engine::evaluate_function: "

    def seq(k: int) -> dict:
        return {"Sequence number": k}

    return [step(s, t, 2_000), annotation("phaseprof::forward", t, 1_000),
            op(RANGE + "Net", t + 10, 600), op(RANGE + "Net.enc", t + 20, 300),
            op("aten::linear", t + 30, 200, **seq(c)), op("aten::addmm", t + 40, 160),
            launch(t + 50, c + 1), kernel("gemm", t + 60, 100, c + 1),
            op("aten::relu", t + 240, 60, **seq(c + 1)),
            op(RANGE + "Net.head", t + 400, 100), op("aten::linear", t + 410, 80, **seq(c + 2)),
            annotation("phaseprof::backward", t + 1_000, 1_000),
            op(evaluate + "AddmmBackward0", t + 1_100, 300, tid=AUTOGRAD, **seq(c)),
            launch(t + 1_150, c + 2, tid=AUTOGRAD), kernel("gemm_bwd", t + 1_200, 200, c + 2),
            op(evaluate + "ReluBackward0", t + 1_500, 50, tid=AUTOGRAD, **seq(c + 1)),
            op(evaluate + "AddmmBackward0", t + 1_600, 70, tid=AUTOGRAD, **seq(c + 2)),
            op(evaluate + "TBackward0", t + 1_700, 20, tid=AUTOGRAD, **seq(999))]


def _built_worker(folder: Path, *traces: list[dict]):
    from tests.test_operators import worker_of
    from tests.tracebuilder import Loop

    loops = []
    for events in traces:
        loops.append(Loop())
        loops[-1].events += events
    return worker_of(folder, *loops)


def _rows(answer) -> dict[str, tuple]:
    return {r.path: (r.parent, r.depth, r.calls, r.forward_ms, r.forward_self_ms,
                     r.forward_gpu_ms, r.backward_ms, r.backward_gpu_ms, r.forward_ms_per_step,
                     r.backward_ms_per_step)
            for r in answer.modules}


def _ops(answer, path: str) -> list[tuple]:
    (row,) = [r for r in answer.modules if r.path == path]
    return [(o.name, o.backward, o.calls, o.host_ms, o.gpu_ms) for o in row.ops]


def test_a_built_trace_s_modules_forward_backward_and_ops(tmp_path):
    from phaseprof.plugin.analysis.modules import modules_answer

    w = _built_worker(tmp_path, [e for s in (1, 2, 3) for e in _linked(s)])
    answer = modules_answer("r", w, w.full().tolist(), None)
    assert (answer.run, answer.worker, answer.step, answer.steps, answer.source) == (
        "r", "w", None, 3, "phaseprof ranges")
    assert (answer.forward_phase_ms, answer.has_gpu) == (3.0, True)
    assert (answer.left_out, answer.left_out_why) == ([], None)
    # Net: 600 µs a call, 200 of its own; its backward is its children's (enc 300 + 50, head 70)
    assert [r.path for r in answer.modules] == ["Net", "Net.enc", "Net.head"]
    assert _rows(answer) == {
        "Net": (None, 0, 3, 1.8, 0.6, 0.3, 1.26, 0.6, 0.6, 0.42),
        "Net.enc": ("Net", 1, 3, 0.9, 0.9, 0.3, 1.05, 0.6, 0.3, 0.35),
        "Net.head": ("Net", 1, 3, 0.3, 0.3, 0.0, 0.21, 0.0, 0.1, 0.07)}
    # the innermost module's ops, most time first; aten::addmm is its linear's; no gradient function
    # of an unknown sequence number
    evaluate = "autograd::engine::evaluate_function: "
    assert _ops(answer, "Net.enc") == [(evaluate + "AddmmBackward0", True, 3, 0.9, 0.6),
                                       ("aten::linear", False, 3, 0.6, 0.3),
                                       ("aten::relu", False, 3, 0.18, 0.0),
                                       (evaluate + "ReluBackward0", True, 3, 0.15, 0.0)]
    assert _ops(answer, "Net.head") == [("aten::linear", False, 3, 0.24, 0.0),
                                        (evaluate + "AddmmBackward0", True, 3, 0.21, 0.0)]
    assert _ops(answer, "Net") == []
    one = modules_answer("r", w, [w.row_of(2)], 2)
    assert (one.step, one.steps) == (2, 1)
    assert _rows(one)["Net.enc"] == ("Net", 1, 1, 0.3, 0.3, 0.1, 0.35, 0.2, 0.3, 0.35)


def test_a_built_trace_s_modules_over_two_spans_are_summed_by_path(tmp_path):
    from phaseprof.plugin.analysis.modules import modules_answer

    # steps 4 and 5 in a second trace file of the worker: one row per path over both spans
    second = [e for s in (4, 5) for e in _linked(s)]
    w = _built_worker(tmp_path, [e for s in (1, 2) for e in _linked(s)], second)
    answer = modules_answer("r", w, w.full().tolist(), None)
    assert answer.steps == 4 and answer.forward_phase_ms == 4.0
    assert _rows(answer)["Net.enc"] == ("Net", 1, 4, 1.2, 1.2, 0.4, 1.4, 0.8, 0.3, 0.35)
    assert _ops(answer, "Net.head")[0] == ("aten::linear", False, 4, 0.32, 0.0)


def test_a_built_trace_s_module_records_make_paths_of_their_chain(tmp_path):
    from phaseprof.plugin.analysis.modules import modules_answer
    from tests.tracebuilder import annotation, op, step

    # torch's records: Net_0 calls Linear_0 twice then Seq_0, which calls its own Linear_0
    events = []
    for s in (1, 2):
        t = (s - 1) * 1_000.0
        events += [step(s, t, 1_000), annotation("phaseprof::forward", t, 1_000),
                   op("nn.Module: Net_0", t + 10, 800, cat="python_function"),
                   op("nn.Module: Linear_0", t + 20, 100, cat="python_function"),
                   op("aten::linear", t + 30, 50),
                   op("nn.Module: Linear_0", t + 200, 100, cat="python_function"),
                   op("nn.Module: Seq_0", t + 400, 300, cat="python_function"),
                   op("nn.Module: Linear_0", t + 410, 200, cat="python_function"),
                   op("aten::mm", t + 420, 120)]
    w = _built_worker(tmp_path, events)
    answer = modules_answer("r", w, w.full().tolist(), None)
    assert answer.source == "trace module records" and answer.has_gpu is False
    assert _rows(answer) == {
        "Net_0": (None, 0, 2, 1.6, 0.6, 0.0, 0.0, 0.0, 0.8, 0.0),
        "Net_0.Seq_0": ("Net_0", 1, 2, 0.6, 0.2, 0.0, 0.0, 0.0, 0.3, 0.0),
        "Net_0.Linear_0": ("Net_0", 1, 4, 0.4, 0.4, 0.0, 0.0, 0.0, 0.2, 0.0),
        "Net_0.Seq_0.Linear_0": ("Net_0.Seq_0", 2, 2, 0.4, 0.4, 0.0, 0.0, 0.0, 0.2, 0.0)}
    assert _ops(answer, "Net_0.Seq_0.Linear_0") == [("aten::mm", False, 2, 0.24, 0.0)]
    assert _ops(answer, "Net_0.Linear_0") == [("aten::linear", False, 2, 0.1, 0.0)]


def test_a_path_deeper_than_the_longest_shown_keeps_its_first_and_last_records():
    from phaseprof.plugin.analysis import modules
    from phaseprof.plugin.analysis.model import no_modules

    depth = modules._LONGEST + 8
    labels = [f"M_{k}" for k in range(depth)]
    table = no_modules()
    table.source, table.paths = modules.FROM_RECORDS, labels
    table.parent = np.arange(-1, depth - 1, dtype=np.int32)
    paths = modules.module_paths(table)
    assert paths[modules._LONGEST - 1] == ".".join(labels[: modules._LONGEST])
    longest = modules._LONGEST
    assert paths[longest] == (".".join(labels[:8]) + f".…{longest + 1 - 16} more…."
                              + ".".join(labels[longest - 7: longest + 1]))
    assert paths[-1] == ".".join(labels[:8]) + f".…{depth - 16} more…." + ".".join(labels[-8:])
    # a parent that does not come before its child (a forged table) makes a root
    table.parent = np.array([-1, 5, 0], dtype=np.int32)
    table.paths = ["A_0", "B_0", "C_0"]
    assert modules.module_paths(table) == ["A_0", "B_0", "A_0.C_0"]
    table.source = modules.FROM_RANGES
    assert modules.module_paths(table) == ["A_0", "B_0", "C_0"]


def test_module_depths_count_listed_parents_and_stop_in_a_loop():
    from phaseprof.plugin.analysis.modules import _depths

    acc = {"a.b.c": {"parent": "a.b"}, "a.b": {"parent": "a"}, "a": {"parent": None},
           "x.y": {"parent": "x"},  # x not listed: y is at the top
           "p": {"parent": "q"}, "q": {"parent": "p"}}  # parents merged from two spans, in a loop
    assert _depths(acc) == {"a.b.c": 2, "a.b": 1, "a": 0, "x.y": 0, "p": 256, "q": 256}


def test_a_built_trace_of_module_records_and_no_host_event_has_no_modules(tmp_path):
    from phaseprof.plugin.analysis.span import analyze_trace
    from phaseprof.plugin.reading.decode import read_trace
    from tests.logdir import write_trace
    from tests.tracebuilder import op

    events = [op("nn.Module: Net_0", 10, 500, cat="python_function"),
              op("nn.Module: Linear_0", 20, 100, cat="python_function")]
    span = analyze_trace(read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", events))))
    assert span.steps == [] and len(span.modules.step) == 0 and len(span.modules.op_name) == 0


def test_a_built_trace_s_module_holds_the_gpu_work_launched_directly_in_its_call(tmp_path):
    from phaseprof.plugin.analysis.modules import modules_answer
    from tests.tracebuilder import annotation, kernel, launch, op, step

    # Net launches a 70 µs kernel itself, then calls Net.head, which launches a 30 µs one
    events = [step(1, 0, 1_000), annotation("phaseprof::forward", 0, 1_000),
              op(RANGE + "Net", 10, 500), op("aten::add", 20, 40), launch(30, 1),
              kernel("add_k", 40, 70, 1),
              op(RANGE + "Net.head", 200, 100), op("aten::mm", 210, 50), launch(220, 2),
              kernel("mm_k", 230, 30, 2)]
    w = _built_worker(tmp_path, events)
    answer = modules_answer("r", w, w.full().tolist(), None)
    figures = {r.path: (r.forward_ms, r.forward_self_ms, r.forward_gpu_ms) for r in answer.modules}
    assert figures == {"Net": (0.5, 0.4, 0.1), "Net.head": (0.1, 0.1, 0.03)}
    assert _ops(answer, "Net") == [("aten::add", False, 1, 0.04, 0.07)]


def test_a_cut_trace_built_from_a_recording_leaves_its_cut_step_out_of_the_modules(traces,
                                                                                   tmp_path):
    from phaseprof.plugin.analysis.modules import modules_answer
    from tests import test_cut_step

    w = test_cut_step._worker(test_cut_step._cut(traces, tmp_path))
    answer = modules_answer("r", w, w.full().tolist(), None)
    assert (answer.steps, answer.left_out) == (5, [21])
    assert answer.left_out_why == ("step 21 cut by the trace's end: left out, as the summary's "
                                   "means and findings leave them out")
    one = modules_answer("r", w, [w.row_of(21)], 21)  # asked for by number, it is shown
    assert (one.steps, one.left_out, one.left_out_why) == (1, [], None)

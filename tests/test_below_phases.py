"""The routes below the phase — a step's trace, kernels, every op of a run, the memory curve — on real
traces, checked against the figures the step detail already reports and against the files themselves."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import settled
from tests.test_plugin import BASE, make_app

#: run name -> fixture folder: the V100 run, the two-rank A100 job, the 2021 ResNet-50 run (2021
#: schema, two spans), CPU runs (with memory events; two spans; an empty last step).
RUNS = {
    "v100": "gpu/hta_ns_resolution",
    "ranks": "gpu/hta_sampled_2rank",
    "resnet2021": "gpu/kineto_resnet50_num_workers_0",
    "cpu": "cpu/base",
    "cpu_repeat": "cpu/repeat2",
    "cpu_early_exit": "cpu/early_exit",
}
GPU_RUNS = ("v100", "ranks", "resnet2021")
#: Chrome-trace event phases the document may use.
CHROME_PHASES = {"X", "M", "s", "f"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, traces):
    root = tmp_path_factory.mktemp("logdir")
    for run, folder in RUNS.items():
        (root / run).mkdir()
        for f in traces.files(*folder.split("/")):
            shutil.copy(f, root / run / f.name)
    for f in root.rglob("*"):
        settled(f)
    plugin, client = make_app(root)
    assert plugin._store.wait(180)
    yield plugin, client, root
    plugin._store.close()


def get(client, route: str, **params):
    r = client.get(f"{BASE}/{route}", query_string=params)
    assert r.status_code == 200, r.data
    return json.loads(r.data)


def steps_of(client, run: str, worker: str | None = None) -> list[dict]:
    params = {"run": run} | ({"worker": worker} if worker else {})
    return [s for s in get(client, "steps", **params)["steps"] if not s["empty"]]


def workers_of(client, run: str) -> list[str]:
    return get(client, "steps", run=run)["workers"]


@pytest.mark.parametrize("run", RUNS)
def test_trace_slice_holds_exactly_the_steps_window_and_is_a_chrome_trace(served, run):
    _, client, root = served
    worker = workers_of(client, run)[0]
    step = steps_of(client, run, worker)[-1]
    detail = get(client, "step", run=run, worker=worker, step=step["step"])
    doc = get(client, "trace", run=run, worker=worker, step=step["step"])

    events = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms" and isinstance(events, list)
    assert {e["ph"] for e in events} <= CHROME_PHASES
    for e in events:
        assert isinstance(e["name"], str) and "pid" in e and "tid" in e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    info = doc["otherData"]
    start, end = info["start_us"], info["end_us"]
    assert info["step"] == step["step"]
    assert end - start == pytest.approx(step["wall_ms"] * 1000, abs=1.0)

    host = [e for e in events if e["ph"] == "X" and e["cat"] in ("cpu_op", "user_annotation", "cuda_runtime")]
    device = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    phases = sorted((e for e in events if e["ph"] == "X" and e["cat"] == "phase"), key=lambda e: e["ts"])

    # Host events: exactly those of the file that start inside the window.
    trace = read_trace(str(root / run / detail["span"]))
    in_window = (trace.host.ts >= start) & (trace.host.ts < end)
    assert len(host) == int(in_window.sum()) == info["host_events"]
    assert all(start <= e["ts"] < end for e in host)
    assert sorted(e["name"] for e in host) == sorted(trace.names[k] for k in trace.host.name[in_window])
    assert any(e["name"] == f"ProfilerStep#{step['step']}" for e in host)

    # Device events: the work launched in the step, as many and as long as the step reports.
    launches = sum(p["launches"] for p in detail["phases"].values())
    assert len(device) == launches == info["device_events"]
    assert sum(e["dur"] for e in device) / 1000 == pytest.approx(detail["gpu_ms"], abs=0.002)
    for name, p in detail["phases"].items():
        launched = sum(e["dur"] for e in device if e["args"]["phase"] == name)
        assert launched / 1000 == pytest.approx(p["gpu_ms"], abs=0.002)
    if run in GPU_RUNS:
        assert device and all("launched by" in e["args"] for e in device)
        # every kernel has a launch arrow from a runtime call inside the window
        starts = {e["id"]: e for e in events if e["ph"] == "s"}
        ends = [e for e in events if e["ph"] == "f"]
        assert len(ends) == len(device) == len(starts)
        assert all(start <= starts[e["id"]]["ts"] < end and e["bp"] == "e" for e in ends)

    # Phase ranges tile the window, and add up to the step's host time per phase.
    assert phases[0]["ts"] == pytest.approx(start) and phases[-1]["ts"] + phases[-1]["dur"] == pytest.approx(end)
    for a, b in zip(phases, phases[1:]):
        assert a["ts"] + a["dur"] == pytest.approx(b["ts"])
    for name, p in detail["phases"].items():
        assert sum(e["dur"] for e in phases if e["name"] == name) / 1000 == pytest.approx(p["host_ms"], abs=0.002)

    # Every lane is named, as chrome://tracing and Perfetto show it.
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"} <= named


@pytest.mark.parametrize("run", GPU_RUNS)
def test_kernel_totals_equal_the_steps_gpu_time_per_phase(served, run):
    _, client, _ = served
    for worker in workers_of(client, run):
        steps = steps_of(client, run, worker)
        step = steps[len(steps) // 2]
        whole = get(client, "kernels", run=run, worker=worker, step=step["step"])
        assert whole["kernels"], "a GPU step launches kernels"
        assert sum(k["total_us"] for k in whole["kernels"]) / 1000 == pytest.approx(step["gpu_ms"], abs=0.002)
        for name, p in step["phases"].items():
            part = get(client, "kernels", run=run, worker=worker, step=step["step"], phase=name)
            assert sum(k["total_us"] for k in part["kernels"]) / 1000 == pytest.approx(p["gpu_ms"], abs=0.002)
            assert sum(k["calls"] for k in part["kernels"]) == p["launches"]
            assert all(k["phase"] == name for k in part["kernels"])
        k = whole["kernels"][0]
        assert k["total_us"] == max(x["total_us"] for x in whole["kernels"])
        assert k["mean_us"] == pytest.approx(k["total_us"] / k["calls"], abs=0.001) and k["max_us"] <= k["total_us"]
        assert k["op"] in k["ops"] and k["op"] != "(unknown)"
        assert sum(x["share"] for x in whole["kernels"]) == pytest.approx(1.0, abs=0.01)
        # the same names as the step's trace shows on its streams
        doc = get(client, "trace", run=run, worker=worker, step=step["step"])
        shown = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy",
                                                                                          "gpu_memset")}
        assert shown == {x["name"] for x in whole["kernels"]}
        # over the whole run: every profiled step's GPU time
        run_wide = get(client, "kernels", run=run, worker=worker)
        assert run_wide["steps"] == len(steps)
        assert run_wide["gpu_us"] / 1000 == pytest.approx(sum(s["gpu_ms"] for s in steps), abs=0.001 * len(steps))


def test_kernels_of_a_cpu_run_are_none(served):
    _, client, _ = served
    answer = get(client, "kernels", run="cpu")
    assert answer["kernels"] == [] and answer["gpu_us"] == 0


@pytest.mark.parametrize("run", ["v100", "resnet2021", "cpu", "cpu_repeat", "cpu_early_exit"])
def test_ops_totals_equal_the_sum_over_steps(served, run):
    _, client, _ = served
    steps = steps_of(client, run)
    details = [get(client, "step", run=run, step=s["step"]) for s in steps]
    by_name = get(client, "ops", run=run)
    assert by_name["steps"] == len(steps)
    rows = [(phase, o) for d in details for phase, ops in d["ops"].items() for o in ops]
    tolerance = 0.0006 * (len(rows) + len(by_name["ops"]))  # each figure is rounded to the µs
    for field in ("self_host_ms", "host_ms", "self_gpu_ms", "gpu_ms"):
        assert sum(o[field] for o in by_name["ops"]) == pytest.approx(sum(o[field] for _, o in rows), abs=tolerance)
    assert sum(o["calls"] for o in by_name["ops"]) == sum(o["calls"] for _, o in rows)
    assert len({o["name"] for o in by_name["ops"]}) == len(by_name["ops"]) == len({o["name"] for _, o in rows})

    # each op: its steps are the steps whose detail lists it; means are per profiled step
    top = by_name["ops"][0]
    assert top["self_host_ms"] == max(o["self_host_ms"] for o in by_name["ops"])  # key_averages' order
    ran = [d["step"] for d in details if any(o["name"] == top["name"] for ops in d["ops"].values() for o in ops)]
    assert top["steps"] == ran
    assert top["self_host_ms_per_step"] == pytest.approx(top["self_host_ms"] / len(steps), abs=0.001)
    assert top["self_host_share"] == pytest.approx(top["self_host_ms"] / sum(s["wall_ms"] for s in steps), abs=1e-4)

    # grouped by input shapes: more (or as many) rows, the same totals
    by_shapes = get(client, "ops", run=run, group="shapes")
    assert len(by_shapes["ops"]) >= len(by_name["ops"])
    assert sum(o["calls"] for o in by_shapes["ops"]) == sum(o["calls"] for o in by_name["ops"])
    if run.startswith("cpu"):  # recorded with record_shapes=True
        assert any(o["shapes"] for o in by_shapes["ops"]) and len(by_shapes["ops"]) > len(by_name["ops"])

    # one phase: that phase's rows of every step
    phase = max(steps[0]["phases"], key=lambda p: steps[0]["phases"][p]["host_ms"])
    one = get(client, "ops", run=run, phase=phase)
    assert sum(o["self_host_ms"] for o in one["ops"]) == pytest.approx(
        sum(o["self_host_ms"] for p, o in rows if p == phase), abs=tolerance)
    assert one["wall_ms"] == pytest.approx(sum(s["phases"][phase]["host_ms"] for s in steps), abs=0.001 * len(steps))
    assert all(o["phases"] == [phase] for o in one["ops"])


@pytest.mark.parametrize("run", ["cpu", "cpu_repeat", "resnet2021"])
def test_memory_curve_peak_equals_the_per_phase_peak(served, run):
    _, client, _ = served
    for step in steps_of(client, run):
        detail = get(client, "step", run=run, step=step["step"])
        curve = get(client, "memory", run=run, step=step["step"])
        assert curve["recorded"] and curve["devices"]
        for series in curve["devices"]:
            peaks = [m[series["device"]]["peak_bytes"] for m in detail["memory"].values()
                     if series["device"] in m and m[series["device"]]["peak_bytes"] is not None]
            assert series["peak_bytes"] == max(peaks) == max(series["allocated"])
            t = series["t_ms"]
            assert t == sorted(t) and t[0] >= 0 and t[-1] <= step["wall_ms"]
            assert series["allocated"][t.index(series["peak_ms"])] == series["peak_bytes"]
            if series["reserved"] is not None:
                assert all(r >= 0 for r in series["reserved"])
        bands = curve["bands"]
        assert bands[0][0] == 0 and bands[-1][1] == pytest.approx(step["wall_ms"], abs=0.001)
        assert {b[2] for b in bands} <= set(detail["phases"])


def test_memory_of_a_trace_without_memory_events_says_so(served):
    _, client, _ = served
    steps = steps_of(client, "ranks")
    curve = get(client, "memory", run="ranks", step=steps[0]["step"])
    assert curve["recorded"] is False and curve["devices"] == []


def test_a_long_memory_curve_is_thinned_but_keeps_its_peak(traces):
    from phaseprof.plugin.analysis import memory

    trace = read_trace(str(traces.files("cpu", "base")[0]))
    allocated = memory.running_allocated(trace)
    from phaseprof.plugin.analysis.nesting import nest
    from phaseprof.plugin.analysis.partition import partition

    part = partition(trace, nest(trace.host))
    full = memory.memory_curve(trace, part, allocated)
    before, memory.MAX_POINTS = memory.MAX_POINTS, 40
    try:
        thin = memory.memory_curve(trace, part, allocated)
    finally:
        memory.MAX_POINTS = before
    for s in np.unique(full.step).tolist():
        for d in np.unique(full.device).tolist():
            a = (full.step == s) & (full.device == d)
            b = (thin.step == s) & (thin.device == d)
            if not a.any():
                continue
            assert b.sum() <= 42 < a.sum()
            assert thin.allocated[b].max() == full.allocated[a].max()
            assert thin.allocated[b].min() == full.allocated[a].min()
            assert thin.ts[b][0] == full.ts[a][0] and thin.ts[b][-1] == full.ts[a][-1]


@pytest.mark.parametrize("run", ["cpu", "resnet2021"])
def test_a_memory_curve_without_allocation_baseline_says_so(served, run):
    # The CPU's "Total Allocated" counts only what was allocated while profiling (its first total is
    # the first event's own bytes); the 2021 traces carry no total at all.
    _, client, _ = served
    for step in steps_of(client, run)[:2]:
        curve = get(client, "memory", run=run, step=step["step"])
        assert curve["devices"] and not any(series["baseline"] for series in curve["devices"])


def test_a_memory_curve_whose_first_total_holds_earlier_allocations_has_a_baseline(tmp_path):
    from phaseprof.plugin.analysis.memory import memory_series
    from phaseprof.plugin.analysis.span import analyze_trace
    from tests.logdir import write_trace
    from tests.tracebuilder import memory, op, step, thread_names

    gib, mib = 1 << 30, 1 << 20
    events = thread_names() + [step(1, 0, 1_000), op("aten::empty", 10, 20),
                               memory(12, mib, 2 * gib + mib), memory(500, -mib, 2 * gib),
                               memory(600, 4, 4, device_type=0, device_id=-1)]
    span = analyze_trace(read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", events))))
    series = {s.device: s for s in memory_series(span, 0)}
    assert series["cuda:0"].baseline and series["cuda:0"].peak_bytes == 2 * gib + mib
    assert not series["cpu"].baseline  # its first total is its own 4 bytes


@pytest.mark.parametrize("query, status", [
    ({"run": "v100"}, 400),  # no step
    ({"run": "v100", "step": "nope"}, 400),
    ({"run": "v100", "step": 1}, 404),
    ({"run": "nowhere", "step": 101}, 404),
])
def test_trace_and_memory_refuse_bad_arguments(served, query, status):
    _, client, _ = served
    for route in ("trace", "memory"):
        assert client.get(f"{BASE}/{route}", query_string=query).status_code == status


def test_ops_and_kernels_refuse_unknown_groups_and_phases(served):
    _, client, _ = served
    assert client.get(f"{BASE}/ops", query_string={"run": "cpu", "group": "shape"}).status_code == 400
    assert client.get(f"{BASE}/ops", query_string={"run": "cpu", "phase": "warmup"}).status_code == 404
    assert client.get(f"{BASE}/kernels", query_string={"run": "v100", "phase": "warmup"}).status_code == 404


def test_a_step_trace_is_cut_once_and_then_served_from_memory(served, monkeypatch):
    plugin, client, _ = served
    step = steps_of(client, "cpu")[0]["step"]
    first = client.get(f"{BASE}/trace", query_string={"run": "cpu", "step": step})
    assert first.status_code == 200
    cut = []  # every step the trace worker is asked to cut out of its file from now on
    pool = plugin._store._trace_pool
    monkeypatch.setattr(pool, "submit", lambda key, item, real=pool.submit: cut.append(key) or real(key, item))
    again = client.get(f"{BASE}/trace", query_string={"run": "cpu", "step": step})
    assert again.data == first.data and cut == []
    other = steps_of(client, "cpu")[1]["step"]  # a step not asked before is cut, once
    assert client.get(f"{BASE}/trace", query_string={"run": "cpu", "step": other}).status_code == 200
    assert [key[-1] for key in cut] == [other]


def test_the_step_traces_kept_stay_within_their_budget_newest_kept(served, monkeypatch):
    from phaseprof.plugin.serving import store as store_module
    from phaseprof.plugin.serving.store import TraceStore

    plugin, client, logdir = served
    run = plugin._store.run("cpu")
    (f,) = run.files
    steps = [s["step"] for s in steps_of(client, "cpu")][:5]
    sizes = {step: len(client.get(f"{BASE}/trace", query_string={"run": "cpu", "step": step}).data) for step in steps}
    budget = sizes[steps[-1]] + sizes[steps[-2]]  # room for the last two
    monkeypatch.setattr(store_module, "TRACE_CACHE_BYTES", budget)
    store = TraceStore(str(logdir))
    try:
        for step in steps:
            assert len(store.step_trace(f, step)) == sizes[step]
        assert [key[-1] for key in store._traces] == steps[-2:]  # the oldest dropped first
        assert store._trace_bytes == sum(len(b) for b in store._traces.values()) <= budget
    finally:
        store.close()

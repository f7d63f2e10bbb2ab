"""Memory events and memory by op (`/memory_events`): each op's bytes add up to the curve's step
figures, and the op at the peak equals one found here from the raw events, on a real GPU trace and on
a CPU run recorded here with ``profile_memory=True``."""

from __future__ import annotations

import gzip
import json
from bisect import bisect_right

import msgspec
import numpy as np
import pytest

from phaseprof.plugin.analysis.memory import memory_series
from phaseprof.plugin.analysis.memory_ops import NO_OP, memory_devices
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.answers import MemoryEventsAnswer
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import settled, write_trace
from tests.test_plugin import BASE, make_app
from tests.tracebuilder import memory, op

BIG = 1 << 22  # floats the recorded loop allocates in one op: 16 MiB


def _load(path):
    with (gzip.open(path) if str(path).endswith(".gz") else open(path, "rb")) as fh:
        events = json.load(fh)["traceEvents"]
    return events


def _raw_peak_ops(events: list[dict]) -> list[dict[str, tuple[int, str]]]:
    """Per ProfilerStep (in time order) and device: (highest allocated bytes, the innermost operator on
    the event's thread holding the first event at it), from the raw events: allocated is the trace's
    "Total Allocated", else the running sum of the bytes from the trace's first memory event."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#"))
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator")
           and not str(e.get("name")).startswith("ProfilerStep#")]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    running: dict[tuple, int] = {}
    out = [{} for _ in steps]
    for e in memory:
        a = e["args"]
        device = "cpu" if a.get("Device Type", 0) == 0 else f"cuda:{a['Device Id']}"
        running[device] = running.get(device, 0) + a["Bytes"]
        allocated = a.get("Total Allocated", running[device])
        k = bisect_right([s for s, _ in steps], e["ts"]) - 1
        if k < 0 or not e["ts"] < steps[k][1]:
            continue
        if device not in out[k] or out[k][device][0] < allocated:
            out[k][device] = (allocated, e)
    for peaks in out:
        for device, (allocated, e) in peaks.items():
            holding = [o for o in ops if str(o["tid"]) == str(e["tid"]) and str(o["pid"]) == str(e["pid"])
                       and o["ts"] <= e["ts"] <= o["ts"] + o["dur"]]
            peaks[device] = (allocated, max(holding, key=lambda o: (o["ts"], -o["dur"]))["name"] if holding else NO_OP)
    return out


def _check_adds_up(span) -> None:
    """Per step and device: the ops' self bytes make the step's net change; the peak is the curve's."""
    for i in range(len(span.steps)):
        curve = {s.device: s for s in memory_series(span, i)}
        for d in memory_devices(span, i):
            k = span.memory_devices.index(d.device)
            net = sum(r.allocated_self - r.freed_self for r in d.ops)
            assert net == int(span.memory_delta[i, :, k].sum()), (i, d.device)
            assert sum(r.events for r in d.ops) == len(d.events) + d.left_out
            assert sum(r.allocated_self for r in d.ops) == sum(e.bytes for e in d.events if e.bytes > 0)
            assert d.peak_bytes == int(span.memory_peak[i, :, k].max()) == curve[d.device].peak_bytes
            assert d.peak_ms == curve[d.device].peak_ms
            for r in d.ops:  # an op's total holds its self figures
                assert r.allocated_total >= r.allocated_self and r.freed_total >= r.freed_self
                assert r.peak_total >= 0 and r.peak_self <= r.allocated_self


@pytest.mark.parametrize("index", [0, 1])
def test_resnet_ops_add_up_to_the_curve_and_the_peak_op_is_the_raw_one(traces, index):
    path = traces.files("gpu", "kineto_resnet50_num_workers_0")[index]
    span = analyze_trace(read_trace(str(path)), "worker0")
    _check_adds_up(span)
    raw = _raw_peak_ops(_load(path))
    assert len(raw) == len(span.steps)
    for i, expected in enumerate(raw):
        got = {d.device: (d.peak_bytes, d.peak_op) for d in memory_devices(span, i)}
        assert got == expected, i
    assert {"cpu", "cuda:0"} <= set(span.memory_devices)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Four profiled steps of a small CPU loop profiled with profile_memory=True; each step makes a 16 MiB
    tensor in ``torch.ones`` that lives to the step's end."""
    import torch
    folder = tmp_path_factory.mktemp("memory")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    run = folder / "run"
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                schedule=schedule,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(run))) as prof:
        for _ in range(5):
            big = torch.ones(BIG)
            loss = model(x).sum() + big[0]
            loss.backward()
            opt.step()
            opt.zero_grad()
            del big
            prof.step()
    (path,) = run.glob("*.pt.trace.json")
    settled(path)
    return path


def test_recorded_cpu_run_adds_up_and_names_the_big_allocation(recorded):
    span = analyze_trace(read_trace(str(recorded)), "worker0")
    assert len(span.steps) >= 3
    _check_adds_up(span)
    raw = _raw_peak_ops(_load(recorded))
    for i in range(len(span.steps)):
        (cpu,) = memory_devices(span, i)
        assert {cpu.device: (cpu.peak_bytes, cpu.peak_op)} == raw[i]
        big = [e for e in cpu.events if e.bytes == 4 * BIG]
        assert len(big) == 1 and big[0].addr is not None and big[0].op == "aten::empty"
        frees = [e for e in cpu.events if e.bytes == -4 * BIG]
        assert [e.addr for e in frees] == [big[0].addr]  # freed at the address it was allocated at
        ones = {r.op: r for r in cpu.ops}["aten::ones"]
        assert ones.allocated_self == 0 and ones.allocated_total >= 4 * BIG and ones.peak_total >= 4 * BIG


def test_route_answers_strictly(recorded):
    plugin, client = make_app(recorded.parent.parent)
    try:
        assert plugin._store.wait(300)
        steps = json.loads(client.get(f"{BASE}/steps?run=run").get_data())["steps"]
        number = steps[1]["step"]
        response = client.get(f"{BASE}/memory_events?run=run&step={number}")
        assert response.status_code == 200, response.get_data(as_text=True)
        answer = msgspec.json.decode(response.get_data(), type=MemoryEventsAnswer, strict=True)
        assert answer.step == number and [d.device for d in answer.devices] == ["cpu"]
        assert np.isclose(sum(r.allocated_self - r.freed_self for r in answer.devices[0].ops),
                          sum(e.bytes for e in answer.devices[0].events))
        # without a step: memory by op over every profiled step
        response = client.get(f"{BASE}/memory_events?run=run")
        assert response.status_code == 200, response.get_data(as_text=True)
        whole = msgspec.json.decode(response.get_data(), type=MemoryEventsAnswer, strict=True)
        assert whole.step is None and whole.steps == len(steps) and whole.left_out == []
        assert [d.device for d in whole.devices] == ["cpu"] and whole.devices[0].events == []
        assert client.get(f"{BASE}/memory_events?run=run&step=999").status_code == 404
    finally:
        plugin._store.close()


def test_each_event_is_in_the_innermost_op_holding_it(tmp_path):
    """Built by hand: an allocation in a parent op after its child ended is the parent's; one in the
    step outside every op is "(no op)", not the step marker's; total counts what children did."""
    from tests.logdir import write_trace
    from tests.tracebuilder import memory, op, step, thread_names

    events = [*thread_names(), step(1, 0, 1_000), op("aten::parent", 100, 300), op("aten::child", 110, 50),
              memory(120, 4096, 4096), memory(200, 1024, 5120), memory(250, -4096, 1024), memory(600, -1024, 0)]
    span = analyze_trace(read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", events))), "w")
    (device,) = memory_devices(span, 0)
    assert [(e.op, e.bytes) for e in device.events] == [("aten::child", 4096), ("aten::parent", 1024),
                                                        ("aten::parent", -4096), (NO_OP, -1024)]
    rows = {r.op: r for r in device.ops}
    assert (rows["aten::parent"].allocated_self, rows["aten::parent"].freed_self) == (1024, 4096)
    assert (rows["aten::parent"].allocated_total, rows["aten::parent"].peak_total) == (5120, 5120)
    assert rows["aten::parent"].peak_self == 1024 and rows["aten::child"].peak_self == 4096
    assert (device.peak_bytes, device.peak_op, device.peak_ms) == (5120, "aten::parent", 0.2)


def test_memory_outside_every_op_is_no_ops_peak(tmp_path):
    # a trace without ProfilerStep (one step): aten::empty allocates 100 B, then 1,000,000 B are
    # allocated outside every op; aten::empty is the first event in nesting order (index 0), which
    # once took the loose megabyte into its own peak (1,000,100 B, above its own total)
    events = [op("aten::empty", 1_000, 10), memory(1_005, 100, 100),
              memory(2_000, 1_000_000, 1_000_100), op("aten::add", 3_000, 10)]
    span = analyze_trace(read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", events))), "w")
    t = span.memory_ops
    rows = {(span.names[k] if k >= 0 else NO_OP): r for r, k in enumerate(t.name.tolist())}
    empty, loose = rows["aten::empty"], rows[NO_OP]
    assert (t.allocated_self[empty], t.peak_self[empty], t.peak_total[empty]) == (100, 100, 100)
    assert (t.allocated_self[loose], t.peak_self[loose]) == (1_000_000, 1_000_000)
    assert t.peak_self[empty] <= t.peak_total[empty]

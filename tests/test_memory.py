"""The memory curve of a step (`plugin/analysis/memory.py`) on hand-built traces: the running
allocation of traces without a total, the baseline, thinning and the series a step shows."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis import memory
from phaseprof.plugin.analysis.nesting import nest
from phaseprof.plugin.analysis.partition import partition
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import MAIN, PID, op, step, thread_names

GPU, CPU = (1, 0), (0, -1)  # (Device Type, Device Id)


def mem(
    ts: float, nbytes: int, total: int | None = None, reserved: int | None = None, device=GPU
) -> dict:
    """A `[memory]` event; a total or reserved count left out as the 2021 traces leave it out."""
    args = {"Bytes": nbytes, "Device Type": device[0], "Device Id": device[1]}
    args |= {} if total is None else {"Total Allocated": total}
    args |= {} if reserved is None else {"Total Reserved": reserved}
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": PID,
        "tid": MAIN,
        "ts": ts,
        "args": args,
    }


def trace_of(tmp_path, events: list[dict]):
    return read_trace(str(write_trace(tmp_path / "w.1.pt.trace.json", thread_names() + events)))


def series_of(tmp_path, events: list[dict], i: int = 0) -> dict:
    span = analyze_trace(trace_of(tmp_path, events))
    return {s.device: s for s in memory.memory_series(span, i)}


def baselines(trace) -> dict[str, bool]:
    """Per memory device: whether its curve has a baseline."""
    return dict(
        zip(
            trace.memory_devices,
            memory.has_baseline(trace, memory.running_allocated(trace)),
            strict=True,
        )
    )


def test_a_trace_without_totals_counts_allocations_per_device_in_time_order(tmp_path):
    # listed out of time order, two devices interleaved: each device's sum runs on its own
    trace = trace_of(
        tmp_path,
        [
            mem(30, -50, device=GPU),
            mem(10, 100, device=GPU),
            mem(15, 7, device=CPU),
            mem(20, 300, device=GPU),
            mem(40, 5, device=CPU),
            mem(25, 1, device=CPU),
        ],
    )
    allocated = memory.running_allocated(trace)
    got = {
        (trace.memory_devices[d], float(t)): int(a)
        for d, t, a in zip(trace.memory.device, trace.memory.ts, allocated)
    }
    assert got == {
        ("cuda:0", 10): 100,
        ("cuda:0", 20): 400,
        ("cuda:0", 30): 350,
        ("cpu", 15): 7,
        ("cpu", 25): 8,
        ("cpu", 40): 13,
    }


def test_a_trace_with_totals_keeps_them(tmp_path):
    trace = trace_of(
        tmp_path, [mem(10, 100, 1_100), mem(20, -50, 1_050), mem(15, 8, 8, device=CPU)]
    )
    allocated = memory.running_allocated(trace)
    assert sorted(zip(trace.memory.ts.tolist(), allocated.tolist())) == [
        (10, 1_100),
        (15, 8),
        (20, 1_050),
    ]


def test_a_device_with_totals_keeps_them_beside_one_without(tmp_path):
    # the CPU records totals (the last one 0: all freed), the GPU does not (its sum runs from 0)
    trace = trace_of(
        tmp_path,
        [mem(10, 8, 16, device=CPU), mem(20, 100), mem(30, -16, 0, device=CPU), mem(40, -40)],
    )
    allocated = memory.running_allocated(trace)
    assert sorted(zip(trace.memory.ts.tolist(), allocated.tolist())) == [
        (10, 16),
        (20, 100),
        (30, 0),
        (40, 60),
    ]


@pytest.mark.parametrize(
    "first_total, baseline", [(1_000, False), (1_010, False), (1_011, True), (5_000, True)]
)
def test_a_baseline_is_memory_held_before_the_first_event_by_over_one_percent(
    tmp_path, first_total, baseline
):
    # the first event in time (listed second) decides: its total against its own 1,000 bytes
    trace = trace_of(
        tmp_path,
        [mem(20, 500, first_total + 500), mem(10, 1_000, first_total), mem(15, 4, 4, device=CPU)],
    )
    assert baselines(trace) == {"cuda:0": baseline, "cpu": False}


def test_a_free_first_counts_its_size_for_the_baseline(tmp_path):
    # a free of 1,000 bytes leaving 20 allocated: 1,020 were held before, over 1% of 1,000
    trace = trace_of(tmp_path, [mem(10, -1_000, 20)])
    assert baselines(trace) == {"cuda:0": True}


def test_a_trace_without_totals_has_no_baseline(tmp_path):
    trace = trace_of(tmp_path, [mem(10, 1_000), mem(20, 500)])
    assert baselines(trace) == {"cuda:0": False}


def test_a_step_shows_each_devices_curve_from_its_start_with_its_peak(tmp_path):
    mib = 1 << 20
    events = [
        step(1, 1_000, 1_000),
        op("aten::empty", 1_010, 20),
        step(2, 2_000, 1_000),
        mem(500, mib, 10 * mib, 12 * mib),  # before the first step: not in any
        mem(1_250, mib, 11 * mib, 12 * mib),
        mem(1_500, 4 * mib, 15 * mib, 16 * mib),
        mem(1_750, -2 * mib, 13 * mib, 16 * mib),
        mem(1_600, 64, 64, 0, device=CPU),
        mem(2_100, mib, 14 * mib, 16 * mib),
    ]
    one = series_of(tmp_path, events)
    gpu = one["cuda:0"]
    assert gpu.t_ms == [0.25, 0.5, 0.75]
    assert gpu.allocated == [11 * mib, 15 * mib, 13 * mib]
    assert gpu.reserved == [12 * mib, 16 * mib, 16 * mib]
    assert (gpu.peak_bytes, gpu.peak_ms, gpu.baseline) == (15 * mib, 0.5, True)
    cpu = one["cpu"]  # reserved recorded as zeros only: none shown
    assert (cpu.t_ms, cpu.allocated, cpu.reserved, cpu.peak_bytes, cpu.baseline) == (
        [0.6],
        [64],
        None,
        64,
        False,
    )
    two = series_of(tmp_path, events, 1)
    assert list(two) == ["cuda:0"]  # the CPU allocated nothing in step 2
    assert (two["cuda:0"].t_ms, two["cuda:0"].allocated, two["cuda:0"].peak_ms) == (
        [0.1],
        [14 * mib],
        0.1,
    )


def test_a_curve_without_reserved_bytes_shows_none_and_the_first_of_equal_peaks(tmp_path):
    events = [
        step(1, 0, 1_000),
        mem(100, 10, 10),
        mem(200, -5, 5),
        mem(300, 5, 10),
        mem(400.5, -10, 0),
    ]
    gpu = series_of(tmp_path, events)["cuda:0"]
    assert gpu.reserved is None and gpu.allocated == [10, 5, 10, 0]
    assert (gpu.peak_bytes, gpu.peak_ms, gpu.t_ms[-1]) == (10, 0.1, 0.4005)


def test_a_long_curve_keeps_each_buckets_lowest_and_highest_point(tmp_path, monkeypatch):
    # 40 points in one step, thinned to at most 8 (4 buckets of 10): a saw whose teeth are known
    values = [((k * 7) % 10) * 100 + k for k in range(40)]
    events = [step(1, 0, 1_000), step(2, 1_000, 1_000)]
    events += [mem(10 + 10 * k, 1, v) for k, v in enumerate(values)] + [mem(1_500, 1, 99)]
    trace = trace_of(tmp_path, events)
    part = partition(trace, nest(trace.host))
    monkeypatch.setattr(memory, "MAX_POINTS", 8)
    curve = memory.memory_curve(trace, part, memory.running_allocated(trace))
    kept = {int(t): int(a) for s, t, a in zip(curve.step, curve.ts, curve.allocated) if s == 0}
    want = {0, 39}  # the first and last point
    for b in range(4):
        bucket = list(range(10 * b, 10 * b + 10))
        want |= {min(bucket, key=values.__getitem__), max(bucket, key=values.__getitem__)}
    assert kept == {10 + 10 * k: values[k] for k in sorted(want)}
    assert (
        curve.step.tolist()[-1] == 1 and curve.allocated.tolist()[-1] == 99
    )  # the short step: whole
    assert curve.reserved.tolist() == [-1] * len(curve.step)
    assert curve.step.dtype == curve.device.dtype == np.int32


def test_a_curve_at_the_limit_is_kept_whole(tmp_path, monkeypatch):
    events = [step(1, 0, 1_000)] + [mem(10 + 10 * k, 1, (k * 37) % 11) for k in range(8)]
    trace = trace_of(tmp_path, events)
    part = partition(trace, nest(trace.host))
    monkeypatch.setattr(memory, "MAX_POINTS", 8)
    curve = memory.memory_curve(trace, part, memory.running_allocated(trace))
    assert curve.allocated.tolist() == [(k * 37) % 11 for k in range(8)]


def test_a_trace_without_memory_events_has_an_empty_curve(tmp_path):
    trace = trace_of(tmp_path, [step(1, 0, 1_000), op("aten::add", 10, 5)])
    part = partition(trace, nest(trace.host))
    curve = memory.memory_curve(trace, part, memory.running_allocated(trace))
    assert len(curve.step) == len(curve.ts) == 0
    assert memory.has_baseline(trace, memory.running_allocated(trace)) == []

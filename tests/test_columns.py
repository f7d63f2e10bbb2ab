"""Columns (`plugin/reading/columns.py`): what a file's events become, field by field, and what is
counted where a value cannot be held."""

from __future__ import annotations

import inspect
import re

import numpy as np

from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import collective, kernel, launch, memory, op, step


def _kernel(ts, corr, **launch_args):
    event = kernel("k", ts, 5, corr)
    event["args"].update(launch_args)
    return event


def test_a_kernel_s_launch_figures_are_read_and_impossible_ones_are_not_recorded(tmp_path):
    events = [
        step(1, 0, 1000),
        launch(10, 1),
        launch(20, 2),
        launch(30, 3),
        launch(40, 4),
        _kernel(
            100,
            1,
            **{
                "blocks per SM": 2.5,
                "est. achieved occupancy %": 50,
                "registers per thread": 32,
                "shared memory": 1024,
                "grid": [4, 2, 1],
                "block": [128, 1, 1],
            },
        ),
        # 0% with a whole block on every SM: Kineto could not compute it
        _kernel(200, 2, **{"blocks per SM": 1, "est. achieved occupancy %": 0}),
        _kernel(300, 3, **{"blocks per SM": 0.5, "est. achieved occupancy %": 0}),
        _kernel(
            400,
            4,
            **{
                "blocks per SM": 2e9,
                "est. achieved occupancy %": 101,
                "registers per thread": 70000,
                "grid": [1, 2],
            },
        ),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    d = trace.device
    assert d.blocks_per_sm.tolist()[:3] == [2.5, 1.0, 0.5] and np.isnan(d.blocks_per_sm[3])
    assert d.occupancy[0] == 50 and np.isnan(d.occupancy[1]) and d.occupancy[2] == 0
    assert np.isnan(d.occupancy[3])
    assert d.registers.tolist() == [32, -1, -1, -1] and d.shared_memory.tolist() == [
        1024,
        -1,
        -1,
        -1,
    ]
    assert d.grid[0] == (4 << 32) | (2 << 16) | 1 and d.grid.tolist()[1:] == [-1, -1, -1]
    assert d.block[0] == (128 << 32) | (1 << 16) | 1
    assert trace.skipped == 4
    assert trace.first_problem == (
        "4 events read without a field: blocks per SM is out of range (1), "
        "est. achieved occupancy % is "
        "out of range (1), registers per thread is out of range (1), grid is not [x, y, z] (1); "
        "first: event 8 ('X' 'k')"
    )


def test_correlation_0_links_a_launch_and_one_below_is_counted(tmp_path):
    events = [
        step(1, 0, 1000),
        launch(10, 0),
        kernel("k", 100, 5, 0),
        launch(20, 7),
        {**launch(30, 0), "args": {"correlation": -5}},
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    runtime = trace.host.kind == 2
    assert trace.host.corr[runtime].tolist() == [0, 7, -1] and trace.device.corr.tolist() == [0]
    assert (
        trace.first_problem
        == "1 event read without a field: correlation is out of range; first: event 4 "
        "('X' 'cudaLaunchKernel')"
    )


def test_a_kernel_s_shared_memory_past_a_tebibyte_is_not_recorded(tmp_path):
    events = [
        step(1, 0, 1000),
        launch(10, 1),
        _kernel(100, 1, **{"shared memory": 1 << 41}),
        launch(20, 2),
        _kernel(200, 2, **{"shared memory": 1 << 40}),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert trace.device.shared_memory.tolist() == [-1, 1 << 40]
    assert (
        trace.first_problem
        == "1 event read without a field: shared memory is out of range; first: event 2 "
        "('X' 'k')"
    )


def test_a_device_numbered_past_31_bits_is_device_0(tmp_path):
    events = [
        step(1, 0, 1000),
        launch(10, 1),
        {**kernel("k", 100, 5, 1), "pid": 1 << 31},
        launch(20, 2),
        {**kernel("k", 200, 5, 2), "pid": (1 << 31) - 1},
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert trace.device.device.tolist() == [0, (1 << 31) - 1]
    assert (
        trace.first_problem
        == "1 event read without a field: device id is out of range; first: event 2 "
        "('X' 'k')"
    )


def test_a_collective_s_group_is_its_name_else_its_id(tmp_path):
    events = [
        step(1, 0, 1000),
        *collective("allreduce", 10, 1, 100, 5, Process_Group_Name="dp", Process_Group_ID=3),
        *collective("allreduce", 200, 2, 300, 5, Process_Group_ID=3),
        *collective("allreduce", 400, 3, 500, 5, Process_Group_ID="4"),
        *collective("allreduce", 600, 4, 700, 5, Process_Group_ID=-2),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    comm_ops = trace.host.name == trace.names.index("record_param_comms")
    assert [trace.comms[c].group for c in trace.host.comm[comm_ops]] == ["dp", "3", "4", ""]


def test_threads_are_numbered_in_id_order_whatever_order_their_events_come_in(tmp_path):
    # a lane per thread on the swimlane, in this order (the step's range, first in the file, first)
    events = [
        step(1, 0, 1000),
        op("a", 10, 5, tid=300),
        op("b", 20, 5, tid=200),
        op("c", 30, 5, tid=300),
        {**op("d", 40, 5, tid=200), "pid": 99},
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert [(t.pid, t.tid) for t in trace.threads] == [
        (100, 100),
        (99, 200),
        (100, 200),
        (100, 300),
    ]
    assert [trace.threads[t].tid for t in trace.host.thread.tolist()] == [100, 300, 200, 300, 200]


def test_every_column_holds_the_type_the_event_model_declares(tmp_path):
    # the columns' types are what keeps a trace of 400k events near its raw numbers in memory
    events = [
        step(1, 0, 1000),
        op("a", 10, 5, tid=300),
        op("b", 20, 5, tid=200),
        launch(30, 1, tid=200),
        _kernel(100, 1, grid=[1, 1, 1]),
        memory(40, 8, 8),
        {**memory(50, 8, 16), "tid": 300},
        *collective("allreduce", 60, 2, 200, 5, Collective_name="allreduce"),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    declared = {"float64": np.float64, "int32": np.int32, "int64": np.int64, "int8": np.int8}
    for columns in (trace.host, trace.device, trace.memory):
        source = inspect.getsource(type(columns))
        for name in columns.__struct_fields__:
            kind = re.search(rf"^\s+{name}: np.ndarray\s+# (\w+)", source, re.M).group(1)
            assert getattr(columns, name).dtype == declared[kind], (type(columns).__name__, name)


def test_each_complete_event_without_usable_times_is_skipped_and_counted_by_reason(tmp_path):
    no_ts = op("a", 0, 5)
    del no_ts["ts"]
    no_dur = op("b", 10, 5)
    del no_dur["dur"]
    events = [
        step(1, 0, 1000),
        op("ok", 5, 1),
        no_ts,
        no_dur,
        op("c", 20, -5),
        op("d", 30, 1e18),
        op("e", 2e17, 5),
        op("f", 40, -1),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert [trace.names[n] for n in trace.host.name] == ["ProfilerStep#1", "ok"]
    assert trace.first_problem == (
        "6 events skipped: has no 'ts' (1), has no 'dur' (1), has a negative duration (2), "
        "has a 'ts' or "
        "'dur' out of range (2); first: event 2 ('X' 'a')"
    )


def test_a_memory_event_without_a_usable_time_or_size_is_skipped_and_counted(tmp_path):
    no_ts = memory(0, 8, 8)
    del no_ts["ts"]
    no_bytes = memory(10, 8, 8)
    del no_bytes["args"]["Bytes"]
    events = [
        step(1, 0, 1000),
        memory(5, 8, 8),
        no_ts,
        no_bytes,
        memory(20, 1 << 62, 8),
        memory(30, -16, 0),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert trace.memory.nbytes.tolist() == [8, -16]
    assert trace.first_problem == (
        "3 events skipped: [memory] event without a usable 'ts' or 'Bytes'; "
        "first: event 2 ('i' '[memory]')"
    )


def test_a_gpu_process_named_by_text_is_device_0_and_not_a_problem(tmp_path):
    events = [
        step(1, 0, 1000),
        launch(10, 1),
        {**kernel("k", 100, 5, 1), "pid": "3"},
        launch(20, 2),
        {**kernel("k", 200, 5, 2), "pid": "GPU 1"},
        launch(30, 3),
        kernel("k", 300, 5, 3),
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert trace.device.device.tolist() == [0, 0, 0]
    assert trace.skipped == 0 and trace.first_problem == ""


def test_a_memory_event_s_device_and_totals_not_given_or_past_range_are_not_recorded(tmp_path):
    no_id = memory(10, 8, 8)
    del no_id["args"]["Device Id"]
    events = [
        step(1, 0, 1000),
        no_id,
        {**memory(20, 8, 16, device_id=70000)},
        {**memory(30, 8, 1e19), "args": {**memory(30, 8, 1e19)["args"], "Total Reserved": 1e19}},
        {**memory(40, 8, 32), "args": {**memory(40, 8, 32)["args"], "Total Reserved": 64}},
    ]
    trace = read_trace(str(write_trace(tmp_path / "t.json", events)))
    assert [trace.memory_devices[d] for d in trace.memory.device] == [
        "cuda",
        "cuda",
        "cuda:0",
        "cuda:0",
    ]
    assert trace.memory.total.tolist() == [8, 16, -1, 32]
    assert trace.memory.reserved.tolist() == [-1, -1, -1, 64]
    assert (
        trace.first_problem
        == "1 event read without a field: Device Id is out of range; first: event 2 "
        "('i' '[memory]')"
    )

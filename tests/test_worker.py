"""One worker's steps from its spans (plugin/analysis/worker.py): step order across trace files,
phases aligned by name, the steps a summary stands for, and the per-step means every answer reads.
Hand-built loops, analysed in-process."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprof.plugin.analysis.span import COLLECTIVE_OP, analyze_trace
from phaseprof.plugin.analysis.worker import Worker, ms, phase_names, rank_of, rank_order
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import write_trace
from tests.tracebuilder import Loop, collective

DATA_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _span(path, loop, **top):
    return analyze_trace(read_trace(str(write_trace(path, loop.events, **top))))


@pytest.fixture(scope="module")
def two_files(tmp_path_factory):
    """One worker in two trace files, given later steps first: w.2 holds steps 3 (it compiled), 4
    and 5 (rank 1 of 2, kernels on streams 7 and 9, a copy, an all_reduce), w.1 steps 1 and 2 (a
    user phase ``loss`` holding a stream creation, a single-process DataLoader)."""
    folder = tmp_path_factory.mktemp("worker")
    b = Loop()
    b.step(
        1,
        ("phaseprof::data", 50.0, [], [(DATA_NEXT, 0.0, 40.0)]),
        ("phaseprof::forward", 100.0, [("k1", 30.0)], [("aten::mm", 0.0, 40.0)]),
        ("phaseprof::backward", 200.0, [("k2", 20.0)]),
    )
    b.step(
        2,
        ("phaseprof::data", 60.0),
        ("phaseprof::forward", 110.0, [("k1", 30.0)], [("aten::mm", 0.0, 40.0)]),
        ("phaseprof::loss", 70.0, [], [("cudaStreamCreateWithFlags", 10.0, 30.0, "cuda_runtime")]),
        ("phaseprof::backward", 210.0),
    )
    a = Loop()
    a.step(
        3,
        ("phaseprof::compile", 500.0),
        ("phaseprof::forward", 120.0, [("k1", 40.0, 7), ("k3", 10.0, 9)]),
    )
    a.step(
        4,
        (
            "phaseprof::forward",
            130.0,
            [("k1", 40.0, 7), ("Memcpy DtoH (Device -> Pageable)", 10.0, 9)],
            [("aten::mm", 0.0, 40.0)],
        ),
    )
    a.events += collective("all_reduce", a.t + 60.0, 1000, a.t + 70.0, 35.0)
    a.step(5, ("phaseprof::forward", 125.0, [("k1", 40.0, 7)]))
    later = _span(folder / "w.2.pt.trace.json", a, distributedInfo={"rank": 1, "world_size": 2})
    earlier = _span(folder / "w.1.pt.trace.json", b)
    return Worker("host_rank3", [later, earlier])


def test_steps_of_two_files_are_in_step_order_on_one_phase_list(two_files):
    w = two_files
    assert w.name == "host_rank3" and w.numbers == [1, 2, 3, 4, 5]
    # canonical phases with time first, then the user's in order of first appearance (w.2 first)
    assert w.phases == ["data", "forward", "backward", "compile", "loss"]
    assert w.wall_us.tolist() == [350.0, 450.0, 620.0, 130.0, 125.0]
    assert w.host_us.tolist() == [
        [50.0, 100.0, 200.0, 0.0, 0.0],
        [60.0, 110.0, 210.0, 0.0, 70.0],
        [0.0, 120.0, 0.0, 500.0, 0.0],
        [0.0, 130.0, 0.0, 0.0, 0.0],
        [0.0, 125.0, 0.0, 0.0, 0.0],
    ]
    assert w.gpu_us[:, 1].tolist() == [30.0, 30.0, 50.0, 50.0, 75.0] and w.gpu_us[0, 2] == 20.0
    assert w.launches[:, 1].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert w.kernel_us.tolist() == [50.0, 30.0, 50.0, 50.0, 75.0]
    assert w.row_of(4) == 3 and w.row_of(1) == 0 and w.row_of(9) is None
    assert w.columns(["loss", "forward", "optimizer"]).tolist() == [4, 1, -1]
    assert w.empty.tolist() == [False] * 5 and w.full().tolist() == [0, 1, 2, 3, 4]


def test_the_setup_calls_land_on_their_own_step_whichever_file_holds_it(two_files):
    assert two_files.setup_us.tolist() == [0.0, 30.0, 0.0, 0.0, 0.0]  # step 2, in the second file


def test_what_the_traces_record_about_the_worker(two_files):
    w = two_files
    assert (w.rank, w.world_size) == (1, 2)  # distributedInfo before the worker's name
    assert w.loader == "single-process"
    assert w.has_gpu and w.on_gpu.tolist() == [True] * 5
    assert w.gpu_names == [] and w.cpus is None


def test_the_steps_a_summary_stands_for_leave_the_compiling_one_out_and_say_so(two_files):
    w = two_files
    assert w.compiling.tolist() == [False, False, True, False, False]
    assert w.steady().tolist() == [0, 1, 3, 4]
    assert w.run_wide([0, 1, 2, 3, 4]) == (
        [0, 1, 3, 4],
        [3],
        "step 3 compiled: left out, as the summary's means and findings leave them out",
    )
    assert w.run_wide([0, 1]) == ([0, 1], [], None)


def test_per_stream_figures_of_one_step(two_files):
    w = two_files
    assert w.streams(2) == {"GPU 0 stream 7": 40.0, "GPU 0 stream 9": 10.0}
    assert w.streams(4) == {"GPU 0 stream 7": 40.0, "GPU 0 stream 20": 35.0}
    assert (
        w.memory_kinds(3) == {"Memcpy DtoH (Device -> Pageable)": 10.0} and w.memory_kinds(2) == {}
    )
    split = w.idle_split(0)  # step 1: stream 7 busy 50 µs of its 120 µs window
    assert list(split) == ["GPU 0 stream 7"] and split["GPU 0 stream 7"].sum() == 70.0
    assert w.idle_split(4) == {}


def test_rows_grouped_by_file_in_order_of_each_file_s_first_row(two_files):
    w = two_files
    groups = [(span.file, rows, indices) for span, rows, indices in w.by_span([4, 0, 1, 3])]
    assert groups == [("w.2.pt.trace.json", [4, 3], [2, 1]), ("w.1.pt.trace.json", [0, 1], [0, 1])]
    assert w.by_span([]) == []


def test_means_per_step_over_some_rows(two_files):
    w = two_files
    cpu, gpu = w.phase_means(np.array([0, 1]), ["forward", "loss", "optimizer"])
    assert cpu.tolist() == [105.0, 35.0, 0.0] and gpu.tolist() == [30.0, 0.0, 0.0]
    cpu, gpu = w.phase_means(np.array([], dtype=np.int64), [])
    assert cpu.shape == gpu.shape == (0,)
    ops = w.op_means(np.array([0, 1, 3]))  # aten::mm wraps a 5 µs launch of k1 (30, 30 and 40 µs)
    assert ops[("forward", "aten::mm")].tolist() == pytest.approx(
        [1.0, 35.0, 40.0, 100 / 3, 100 / 3]
    )
    assert ops[("forward", "cudaLaunchKernel")].tolist() == pytest.approx(
        [4 / 3, 20 / 3, 20 / 3, 0.0, 0.0]
    )
    assert ops[("loss", "cudaStreamCreateWithFlags")].tolist() == pytest.approx(
        [1 / 3, 10.0, 10.0, 0.0, 0.0]
    )
    kernels = w.kernel_means(np.array([0, 3]))
    assert kernels == {
        ("forward", "k1"): pytest.approx([1.0, 35.0]),
        ("backward", "k2"): pytest.approx([0.5, 10.0]),
        ("forward", "Memcpy DtoH (Device -> Pageable)"): pytest.approx([0.5, 5.0]),
    }


def test_collective_time_is_the_larger_of_its_host_and_device_time_per_step_and_phase(two_files):
    w = two_files
    # step 5's all_reduce: 20 µs on the host, 35 µs of kernel
    assert w.collective_us(np.array([4, 0]), ["forward", "data"], COLLECTIVE_OP.match).tolist() == [
        [35.0, 0.0],
        [0.0, 0.0],
    ]
    assert w.collective_us(np.array([4]), ["data"], COLLECTIVE_OP.match).tolist() == [[0.0]]


def test_a_span_listed_twice_is_one_span(two_files):
    span = two_files.spans[1]
    w = Worker("w", [span, span])
    assert w.numbers == [1, 1, 2, 2]
    assert [(rows, indices) for _, rows, indices in w.by_span(range(4))] == [
        ([0, 1, 2, 3], [0, 0, 1, 1])
    ]


def test_the_rank_the_name_gives_and_the_order_of_workers(two_files):
    earlier = two_files.spans[1]  # records no rank
    assert rank_of("host_rank3", [earlier]) == 3 and rank_of("node-Rank-12.pid", [earlier]) == 12
    assert rank_of("host", [earlier]) is None
    assert rank_of("host_rank3", [two_files.spans[0], earlier]) == 1
    names = [("b", None), ("z", 0), ("a", 1), ("a", None)]
    assert sorted(names, key=lambda nr: rank_order(nr[1], nr[0])) == [
        ("z", 0),
        ("a", 1),
        ("a", None),
        ("b", None),
    ]


def test_a_multiprocess_loader_and_untimed_phases(tmp_path):
    loop = Loop()
    loop.step(
        0,
        (
            "phaseprof::forward",
            100.0,
            [],
            [("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0.0, 10.0)],
        ),
    )
    span = _span(tmp_path / "w.pt.trace.json", loop)
    w = Worker("w", [span])
    assert w.loader == "worker processes" and w.rank is None and w.world_size is None
    assert not w.has_gpu and w.on_gpu.tolist() == [False]


def test_phases_without_time_in_any_step_are_left_out(two_files):
    # optimizer and other took no time; the user's loss phase follows the canonical ones
    assert phase_names([two_files.spans[1]]) == ["data", "forward", "backward", "loss"]
    assert phase_names(two_files.spans[::-1]) == ["data", "forward", "backward", "loss", "compile"]


def test_times_are_answered_in_ms_to_the_microsecond():
    assert ms(1234.5678) == 1.235 and ms(np.float32(500.0)) == 0.5 and ms(0) == 0.0
    assert type(ms(np.float64(2.0))) is float


def test_a_compiling_step_and_a_last_step_cut_by_the_trace_s_end_are_left_out_together(tmp_path):
    # step 0 compiles; step 6's kernel runs 595 µs past its host work, to the trace's end; every
    # step but the last sets 0.5 µs of memory on stream 9
    loop = Loop()
    work = [("k", 50.0), ("Memset (Device)", 0.5, 9)]
    loop.step(0, ("phaseprof::compile", 300.0), ("phaseprof::forward", 200.0, work))
    for n in range(1, 6):
        loop.step(n, ("phaseprof::forward", 200.0 + n, work))
    start = loop.t
    loop.step(6, ("phaseprof::forward", 200.0, [("k", 795.0)]))
    loop.events[-1]["dur"] = loop.gpu_free - start  # the step's window ends with its kernel
    gpu = {
        "id": 0,
        "name": "NVIDIA H100",
        "computeMajor": 9,
        "computeMinor": 0,
        "totalGlobalMem": 1,
        "numSms": 132,
    }
    w = Worker("w", [_span(tmp_path / "w.pt.trace.json", loop, deviceProperties=[gpu])])
    assert w.cut.tolist() == [False] * 6 + [True] and w.compiling.tolist() == [True] + [False] * 6
    assert w.steady().tolist() == [1, 2, 3, 4, 5]
    assert w.run_wide(list(range(7))) == (
        [1, 2, 3, 4, 5],
        [0, 6],
        (
            "step 0 compiled and step 6 cut by the trace's end: left out, as the summary's means "
            "and findings leave them out"
        ),
    )
    assert (w.gpu_names, w.gpu_capabilities) == (["NVIDIA H100"], ["9.0"])
    assert w.streams(1) == {"GPU 0 stream 7": 50.0, "GPU 0 stream 9": 0.5}
    assert w.memory_kinds(1) == {"Memset (Device)": 0.5} and w.memory_kinds(6) == {}
    assert w.phases[0] == "forward"
    cpu, gpu_us = w.phase_means(np.array([1, 2]), ["forward"])
    assert cpu.tolist() == [201.5] and gpu_us.tolist() == [50.5]


def test_a_last_step_that_compiled_and_was_cut_is_named_once_as_compiled(tmp_path):
    loop = Loop()
    for n in range(6):
        loop.step(n, ("phaseprof::forward", 200.0 + n, [("k", 50.0)]))
    start = loop.t
    loop.step(6, ("phaseprof::compile", 100.0), ("phaseprof::forward", 200.0, [("k", 795.0)]))
    loop.events[-1]["dur"] = loop.gpu_free - start
    w = Worker("w", [_span(tmp_path / "w.pt.trace.json", loop)])
    assert w.cut[6] and w.compiling[6]
    assert w.run_wide(list(range(7)))[1:] == (
        [6],
        "step 6 compiled: left out, as the summary's means and findings leave them out",
    )


def test_rows_of_two_files_taking_turns_keep_their_order_in_each(tmp_path):
    # file a holds the even steps, b the odd ones: every other row is a's (20 rows, past the size
    # where numpy's default sort stops keeping equal keys in order)
    spans = []
    for name, parity in (("a", 0), ("b", 1)):
        loop = Loop()
        for n in range(parity, 20, 2):
            loop.step(n, ("phaseprof::forward", 100.0 + n))
        spans.append(_span(tmp_path / f"w.{name}.pt.trace.json", loop))
    w = Worker("w", spans)
    assert w.numbers == list(range(20))
    groups = [(span.file, rows, indices) for span, rows, indices in w.by_span(range(20))]
    assert groups == [
        ("w.a.pt.trace.json", list(range(0, 20, 2)), list(range(10))),
        ("w.b.pt.trace.json", list(range(1, 20, 2)), list(range(10))),
    ]


def test_a_worker_without_trace_files_has_no_steps():
    w = Worker("w", [])
    assert w.numbers == [] and w.steady().tolist() == [] and w.run_wide([]) == ([], [], None)
    assert w.rank is None and w.loader is None and not w.has_gpu

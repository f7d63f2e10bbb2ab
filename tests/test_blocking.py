"""Host calls that wait for the device, and the launch queues: which calls block the host (and which
do not), the op and queue each names, the figures of a queue known by construction, and the verdict
they lead to: host-blocked, not launch-bound, on a real trace whose host waits behind a long
queue."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from phaseprof.cli.report import report
from phaseprof.plugin.analysis.blocking import inputs_of
from phaseprof.plugin.analysis.steps import step_detail
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.analysis.worker_summary import summarize
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests.conftest import DATA
from tests.logdir import write_trace
from tests.test_gpu_measures import gpu_report
from tests.tracebuilder import Loop, annotation, kernel, launch, op, step, thread_names

NCCL = DATA / "gpu" / "hta_nccl_16rank"


def _worker(folder) -> Worker:
    (run,) = discover(str(folder))
    ((name, files),) = run.workers.items()
    return Worker(name, [analyze_file(f) for f in files])


def _raw(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def test_a_host_blocked_behind_a_long_queue_is_named_not_called_launch_bound():
    # rank 0 of HTA's 16-rank job: each step's `other` phase holds an aten::to of an [88] tensor
    # whose
    # cudaMemcpyAsync (a Memcpy DtoH to pageable memory) waits ~145 ms behind the compute stream's
    # queue
    summary = summarize(_worker(NCCL))  # read with input shapes, as TensorBoard reads it
    first = summary.findings[0]
    assert (first.kind, first.phase) == ("host-blocked", "other"), first.text
    e = first.evidence
    assert (
        e.ops[0] == "aten::to"
        and e.inputs == "[88]"
        and e.copy == "Memcpy DtoH (Device -> Pageable)"
    )
    assert e.queue_stream == "GPU 0 stream 7"
    # every figure of the sentence is in its evidence
    for figure in (
        e.cost_ms,
        e.wall_ms,
        e.gpu_idle_ms,
        e.blocked_ms,
        e.wait_ms,
        e.blocked_max_ms,
        e.host_critical_ms,
    ):
        assert f"{figure:.2f} ms" in first.text, figure
    assert (
        f"behind {e.queued} launched kernels" in first.text
        and "aten::to (input [88])" in first.text
    )
    # no finding proposes CUDA graphs: the host waits, launching faster wins nothing back
    assert not any("CUDA graphs" in f.text for f in summary.findings)
    # the report reads no input shapes: the same finding, without them
    (w,) = report(str(NCCL)).runs[0].workers
    assert (
        w.summary.findings[0].evidence.blocked_max_ms == e.blocked_max_ms
        and "(input" not in w.summary.findings[0].text
    )

    # the figures against the raw events, in plain Python: each step's blocking copy call, how long
    # it held the host, and what was launched before it began and had not started (all streams)
    events = _raw(NCCL / "rank0.json.gz")
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")
    )
    launched = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    device = [
        (launched[e["args"]["correlation"]], e["ts"])
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        and e["args"].get("correlation") in launched
    ]
    calls = [e for e in events if e["name"] == "cudaMemcpyAsync" and e["dur"] > 100_000]
    assert len(calls) == len(steps) == 5
    assert all(a <= c["ts"] < b for c, (a, b) in zip(sorted(calls, key=lambda c: c["ts"]), steps))
    durations = [c["dur"] for c in calls]
    queued = [sum(1 for at, start in device if at < c["ts"] <= start) for c in calls]
    # the kind named (aten::to copying to the host) holds the long call of each step and a few
    # short ones
    assert sum(durations) / 5 / 1000 <= e.wait_ms <= e.blocked_ms <= e.cost_ms
    assert (
        e.blocked_max_ms
        == pytest.approx(max(durations) / 1000, abs=0.001)
        == pytest.approx(146.934)
    )
    assert e.queued == queued[durations.index(max(durations))]


def test_the_step_lists_every_call_that_waited_for_the_device():
    w = _worker(NCCL)
    detail = step_detail(w, w.row_of(551), "r")
    big = [b for b in detail.blocking if b.blocked_ms > 100]
    assert len(big) == 1
    (b,) = big
    assert (b.call, b.op, b.inputs, b.phase) == ("cudaMemcpyAsync", "aten::to", "[88]", "other")
    assert b.blocked_ms == 146.934 and b.queued > 800 and b.queue_stream == "GPU 0 stream 7"
    # the synchronizes of the step are listed too, each with its op
    syncs = [b for b in detail.blocking if b.call == "cudaStreamSynchronize"]
    assert syncs and all(b.copy is None and b.op for b in syncs)
    assert [b.start_ms for b in detail.blocking] == sorted(b.start_ms for b in detail.blocking)


def _item_loop(path, steps: int = 6):
    """Six 2 ms steps: forward launches 20 kernels of 50 µs, then reads the loss: aten::item ->
    aten::_local_scalar_dense -> a cudaMemcpyAsync D2H to pageable memory that returns when the
    copy is
    done, then cudaStreamSynchronize (1 ms in all, held behind the kernels); the optimizer copies a
    tensor to the GPU from pinned memory (the call returns at once: it blocks nothing)."""
    events, corr, t = thread_names(), 0, 1_000_000.0
    for n in range(steps):
        events += [
            step(n, t, 2_000),
            annotation("phaseprof::forward", t, 1_500),
            annotation("phaseprof::optimizer", t + 1_500, 500),
        ]
        for k in range(20):
            corr += 1
            events += [launch(t + 10 * k, corr), kernel("gemm", t + 20 + 50 * k, 50, corr)]
        corr += 1
        events += [
            op("aten::item", t + 300, 1_000),
            op("aten::_local_scalar_dense", t + 301, 998),
            launch(t + 302, corr, dur=800, name="cudaMemcpyAsync"),
            kernel("Memcpy DtoH (Device -> Pageable)", t + 1_100, 1, corr, stream=7),
            launch(t + 1_110, -1, dur=150, name="cudaStreamSynchronize"),
        ]
        corr += 1
        events += [
            op("aten::copy_", t + 1_600, 20),
            launch(t + 1_601, corr, dur=5, name="cudaMemcpyAsync"),
            kernel("Memcpy HtoD (Pinned -> Device)", t + 1_650, 30, corr, stream=7),
        ]
        t += 2_000
    for e in events:  # a synchronize has no correlation
        if e["name"] == "cudaStreamSynchronize":
            e["args"] = {}
    return write_trace(path, events)


def test_an_item_in_forward_blocks_the_host_and_is_named(tmp_path):
    _item_loop(tmp_path / "run" / "w.1.pt.trace.json")
    w = _worker(tmp_path / "run")
    detail = step_detail(w, 2, "run")
    assert [(b.call, b.op, b.phase, b.copy, b.blocked_ms) for b in detail.blocking] == [
        ("cudaMemcpyAsync", "aten::item", "forward", "Memcpy DtoH (Device -> Pageable)", 0.8),
        ("cudaStreamSynchronize", "aten::item", "forward", None, 0.15),
    ]
    # at the copy call (302 µs into the step), kernels 6..19 are launched (every 10 µs from 0) and
    # not yet started (kernel k starts at 20 + 50 k)
    assert (
        detail.blocking[0].queued
        == sum(1 for k in range(20) if 10 * k < 302 <= 20 + 50 * k)
        == 26 - 12
    )

    s = report(str(tmp_path / "run")).runs[0].workers[0].summary
    first = s.findings[0]
    assert (first.kind, first.phase) == ("host-blocked", "forward"), first.text
    assert first.evidence.ops == ["aten::item"] and first.evidence.blocked_ms == 0.95
    assert (
        "aten::item" in first.text and "drop" not in first.text
    )  # a copy to the host: pinned, non_blocking
    assert "non_blocking=True" in first.text and "CUDA graphs" not in first.text


def test_a_copy_that_returns_before_it_ends_blocks_nothing(tmp_path):
    events, t = thread_names(), 1_000.0
    events += [
        step(1, t, 1_000),
        annotation("phaseprof::forward", t, 1_000),
        # an async copy to pageable memory whose call returns before the copy ends
        launch(t + 10, 1, dur=5, name="cudaMemcpyAsync"),
        kernel("Memcpy DtoH (Device -> Pageable)", t + 100, 50, 1),
        # a pinned host-to-device copy through the synchronous call: not the host's to wait for
        launch(t + 200, 2, dur=40, name="cudaMemcpy"),
        kernel("Memcpy HtoD (Pinned -> Device)", t + 210, 20, 2),
        # a synchronous copy to the host does block, however short
        launch(t + 300, 3, dur=40, name="cudaMemcpy"),
        kernel("Memcpy DtoH (Device -> Pinned)", t + 310, 20, 3),
    ]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    w = _worker(tmp_path / "run")
    assert [(b.call, b.copy, b.op) for b in step_detail(w, 0, "run").blocking] == [
        ("cudaMemcpy", "Memcpy DtoH (Device -> Pinned)", None)
    ]


def test_launch_queue_and_delay_of_a_step_built_to_know_them(tmp_path):
    # one 1000 µs step; the host launches 4 kernels at 0, 10, 20, 30 µs, which start at 100, 200,
    # 300,
    # 400 µs: kernel k waits from 10 k to 100 (k + 1), 100 + 90 k µs; in all 940 queue-µs over the
    # 1000 µs step, a mean of 0.94; all 4 wait from 30 to 100 µs; delays 100, 190, 280, 370 µs
    events, t = thread_names(), 5_000.0
    events += [step(1, t, 1_000), annotation("phaseprof::forward", t, 1_000)]
    for k in range(4):
        events += [launch(t + 10 * k, k + 1), kernel("gemm", t + 100 * (k + 1), 90, k + 1)]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    (row,) = report(str(tmp_path / "run")).runs[0].workers[0].steps
    q = row.gpu_time.queues["GPU 0 stream 7"]
    assert (q.mean, q.max) == (0.94, 4)
    assert q.delay_p50_ms == 0.235 and q.delay_p90_ms == pytest.approx(
        0.343, abs=1e-6
    )  # numpy's linear rule


def test_every_gpu_trace_has_a_queue_per_stream_with_work(gpu_case_folder):
    r, _ = gpu_report(gpu_case_folder)  # the session's report of it
    for w in (w for run in r.runs for w in run.workers):
        for row in w.steps:
            g = row.gpu_time
            if g is None:
                continue
            for label in g.streams:
                assert label in g.queues or g.streams[label] == 0, (row.step, label)
            for q in g.queues.values():
                assert q.max >= q.mean >= 0
                assert q.delay_p50_ms is None or q.delay_p90_ms >= q.delay_p50_ms
        assert not any(
            re.search(r"launch-bound", f.text) and (f.evidence.queue or 0) >= 4
            for f in w.summary.findings
        )


@pytest.fixture(params=sorted(p.name for p in (DATA / "gpu").iterdir() if p.is_dir()))
def gpu_case_folder(request):
    return DATA / "gpu" / request.param


def test_a_stream_whose_work_has_no_known_launch_has_an_empty_queue(tmp_path):
    # a kernel with no runtime call correlated to it (a sampled or hand-edited trace): its stream has
    # no launch to count, and the analysis goes on (found by the fuzz test: an IndexError once)
    events = [*thread_names(), step(1, 1_000, 1_000), annotation("phaseprof::forward", 1_000, 1_000),
              launch(1_010, 1), kernel("gemm", 1_100, 50, 1, stream=7), kernel("orphan", 1_200, 50, 99, stream=9)]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    (row,) = report(str(tmp_path / "run")).runs[0].workers[0].steps
    assert row.gpu_time.queues["GPU 0 stream 7"].max == 1
    assert "GPU 0 stream 9" not in row.gpu_time.queues


@pytest.mark.parametrize("longer", ["w.1", "w.2"])
def test_the_blocking_calls_of_two_traces_add_up_per_step_and_keep_the_longest_calls_facts(tmp_path,
                                                                                           longer):
    # one worker, two traces of six steps each: in one, one step's copy call lasts 805 µs, not 800
    # (still ending before the synchronize after it); either trace may be read first
    for name in ("w.1", "w.2"):
        trace = json.loads(_item_loop(tmp_path / "a" / f"{name}.pt.trace.json").read_text())
        if name == longer:
            copies = [e for e in trace["traceEvents"]
                      if e.get("name") == "cudaMemcpyAsync" and e["dur"] == 800]
            copies[3]["dur"] = 805
        write_trace(tmp_path / "run" / f"{name}.pt.trace.json", trace["traceEvents"])
    w = _worker(tmp_path / "run")
    rows = np.arange(len(w.refs))
    assert len(rows) == 12
    copy, sync = w.blocking_means(rows)  # most blocked time first
    assert (copy.phase, copy.call, copy.copy, copy.op) == \
        ("forward", "cudaMemcpyAsync", "Memcpy DtoH (Device -> Pageable)", "aten::item")
    mean = pytest.approx((11 * 800 + 805) / 12)
    assert (copy.calls, copy.blocked_us, copy.longest_us) == (1.0, mean, 805.0)
    assert (sync.call, sync.copy, sync.op, sync.calls, sync.longest_us) == \
        ("cudaStreamSynchronize", None, "aten::item", 1.0, 150.0)
    assert sync.blocked_us == pytest.approx(150.0) and sync.queued == 0  # every kernel had started
    assert (copy.queued, copy.queue_stream, copy.shapes) == (14, "GPU 0 stream 7", "")
    # each trace's steps alone: its own copies only
    halves = {}
    for r in rows.tolist():
        halves.setdefault(id(w.refs[r].span), []).append(r)
    firsts = [w.blocking_means(np.array(h))[0] for h in halves.values()]
    alone = sorted((b.longest_us, b.blocked_us, b.calls) for b in firsts)
    assert alone == [(800.0, 800.0, 1.0), (805.0, pytest.approx((5 * 800 + 805) / 6), 1.0)]


def test_an_ops_inputs_are_its_tensor_shapes_and_anything_else_is_shown_as_recorded():
    assert inputs_of("[[88], [], []]") == "[88]"
    assert inputs_of('[[2, 3], [], [4], null, ""]') == "[2,3], [4]"
    assert inputs_of("[[]]") == ""
    for recorded in ("not json", '{"a": 1}', "5"):
        assert inputs_of(recorded) == recorded


def test_the_first_device_event_can_be_the_copy_a_call_waited_for(tmp_path):
    events, t = thread_names(), 1_000.0
    events += [step(1, t, 1_000), annotation("phaseprof::forward", t, 1_000),
               launch(t + 10, 1, dur=40, name="cudaMemcpy"),
               kernel("Memcpy DtoH (Device -> Pinned)", t + 20, 20, 1),
               launch(t + 100, 2), kernel("gemm", t + 110, 20, 2)]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    (b,) = step_detail(_worker(tmp_path / "run"), 0, "run").blocking
    assert (b.call, b.copy, b.blocked_ms) == ("cudaMemcpy", "Memcpy DtoH (Device -> Pinned)", 0.04)


def test_the_launch_queue_of_a_launch_bound_phase_is_weighed_by_its_host_time(tmp_path):
    # forward launches 500 kernels of 5 µs in 30 ms, each queued for the 5 µs of its launch call:
    # 2,500 queue-µs over 30,000 µs of host time, 0.08 kernels waiting on average
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 30_000, [("elementwise_kernel", 5)] * 500),
                  ("phaseprof::backward", 5_000, [("gemm", 400)] * 10))
    s = report(str(write_trace(tmp_path / "run" / "w.1.pt.trace.json", loop.events).parent))
    first = s.runs[0].workers[0].summary.findings[0]
    assert (first.kind, first.phase, first.evidence.queue) == ("launch-bound", "forward", 0.08)
    assert "0.1 waiting to start on average" in first.text


def test_a_queue_still_waiting_when_the_step_ends_counts_to_the_steps_end(tmp_path):
    # one 1,000 µs step launches a kernel at 200 µs that starts only at 2,000 (in the next step):
    # one kernel queued for the step's last 800 µs, a mean of 0.8
    events, t = thread_names(), 5_000.0
    events += [step(1, t, 1_000), annotation("phaseprof::forward", t, 1_000),
               launch(t + 200, 1), kernel("gemm", t + 2_000, 90, 1),
               step(2, t + 1_000, 1_500), annotation("phaseprof::forward", t + 1_000, 1_500)]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    first, second = report(str(tmp_path / "run")).runs[0].workers[0].steps
    q = first.gpu_time.queues["GPU 0 stream 7"]
    assert (q.mean, q.max) == (0.8, 1)

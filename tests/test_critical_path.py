"""The critical path of a step, its what-if bounds, and the idle split per stream.

Built steps whose path is known by construction (a data stall, a blocking copy, a GPU-bound step, an
exposed all-reduce), each checked for its path's length, phases, items and bound; a what-if bound on
a real trace against the raw events; and the idle split (host wait, kernel wait, other) against a
plain-Python computation of HTA's rules on every GPU trace under tests/data.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from phaseprof.cli.report import report
from phaseprof.plugin.analysis.steps import step_detail
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests import hta_reference
from tests.conftest import DATA
from tests.logdir import write_trace
from tests.tracebuilder import (
    AUTOGRAD,
    annotation,
    collective,
    kernel,
    launch,
    op,
    step,
    thread_names,
)

NCCL = DATA / "gpu" / "hta_nccl_16rank"
GPU_FOLDERS = sorted(p.name for p in (DATA / "gpu").iterdir() if p.is_dir())
T0 = 1_000_000.0
STEPS = 5


def _sync(ts: float, dur: float) -> dict:
    """A cudaStreamSynchronize (a synchronize has no correlation)."""
    e = launch(ts, -1, dur=dur, name="cudaStreamSynchronize")
    e["args"] = {}
    return e


def _worker(folder) -> Worker:
    (run,) = discover(str(folder))
    ((name, files),) = run.workers.items()
    return Worker(name, [analyze_file(f) for f in files])


def _built(tmp_path, one_step) -> tuple[Worker, object]:
    """``STEPS`` steps of ``one_step(events, t, corr) -> (corr, step µs)``, each one after the other:
    the worker, and its report's summary."""
    events, corr, t = thread_names(), 0, T0
    for n in range(STEPS):
        corr, dur = one_step(events, n, t, corr)
        t += dur
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    (w,) = report(str(tmp_path / "run")).runs[0].workers
    return _worker(tmp_path / "run"), w.summary


def _item(path, kind: str) -> float:
    return sum(i.ms for i in path.items if i.kind == kind)


def _saving_within_bound(summary) -> None:
    """No finding saves more than the mean step less its what-if bound (the bound's own measure:
    the GPU's busy time in a step measured by the GPU)."""
    step = summary.gpu_time.busy_ms if summary.measure == "gpu" else summary.mean_wall_ms
    bounded = [f for f in summary.findings if f.what_if_ms is not None]
    assert bounded
    for f in bounded:
        # the sentence says the bound, and what it takes off its chain (in the evidence)
        assert f"at least {f.what_if_ms:,.2f} ms (" in f.text
        assert f"less the {f.evidence.removed_ms:,.2f} ms" in f.text
        if f.saving_ms is not None:
            assert f.saving_ms <= round(step - f.what_if_ms, 3) + 0.001, (f.kind, f.text)


# --- a data stall ---------------------------------------------------------------------------------


def _data_stall(events, n, t, corr):
    """30 ms: the data phase takes 20 ms of host time (the DataLoader's Python, untraced), forward
    9 ms launches ten 300 µs kernels the GPU runs at once, then the loss is read (the GPU is done by
    then: the synchronize waits for nothing)."""
    events += [step(n, t, 30_000), annotation("phaseprof::data", t, 20_000),
               annotation("phaseprof::forward", t + 20_000, 9_000)]
    for k in range(10):
        corr += 1
        at = t + 20_000 + 800 * k
        events += [op("aten::mm", at, 700), launch(at + 10, corr, dur=5),
                   kernel("gemm", at + 30, 300, corr)]
    events += [op("aten::item", t + 29_000, 1_000), _sync(t + 29_010, 100)]
    return corr, 30_000


def test_a_data_stall_puts_the_data_phase_on_the_path(tmp_path):
    w, summary = _built(tmp_path, _data_stall)
    path = step_detail(w, 2, "run").critical_path
    # the host never waits for the GPU: the path is the loop's thread, end to end
    assert path.length_ms == 30.0 and path.bound == "data"
    assert path.phases == {"data": 20.0, "forward": 9.0, "other": 1.0}
    assert {s.lane for s in path.segments} == {"host"}
    assert path.segments[0].start_ms == 0.0 and path.segments[-1].end_ms == 30.0
    assert all(a.end_ms == b.start_ms for a, b in zip(path.segments, path.segments[1:]))
    top = path.items[0]
    assert (top.kind, top.name, top.ms, top.share) == ("phase", "data", 20.0, 0.6667)
    # aten::mm less the launches inside it, and aten::item (its synchronize waited for nothing)
    assert _item(path, "op") == pytest.approx(7.0 - 0.05 + 1.0)
    assert _item(path, "launch") == pytest.approx(0.05)  # ten 5 µs launches
    assert summary.critical_path.bound == "data" and summary.critical_path.segments == []
    data = next(f for f in summary.findings if f.phase == "data")
    # with the data phase gone, the path is 30 - 20 ms long
    assert data.what_if_ms == 10.0 and data.saving_ms == 20.0
    _saving_within_bound(summary)


# --- a blocking copy ------------------------------------------------------------------------------


def _blocking_copy(events, n, t, corr):
    """12 ms: forward (11 ms) launches ten 1 ms kernels within 200 µs, which run back to back from
    100 µs; at 305 µs aten::to copies a value to the host (cudaMemcpyAsync into pageable memory):
    the copy runs behind the kernels, 10.1-10.15 ms, and the call holds the host until 10.155 ms."""
    events += [step(n, t, 12_000), annotation("phaseprof::forward", t, 11_000)]
    for k in range(10):
        corr += 1
        events += [launch(t + 10 + 20 * k, corr, dur=5), kernel("gemm", t + 100 + 1_000 * k, 1_000, corr)]
    corr += 1
    events += [op("aten::to", t + 300, 9_900), op("aten::_to_copy", t + 301, 9_880),
               launch(t + 305, corr, dur=9_850, name="cudaMemcpyAsync"),
               kernel("Memcpy DtoH (Device -> Pageable)", t + 10_100, 50, corr),
               op("aten::add", t + 10_400, 500)]
    return corr, 12_000


def test_a_blocking_copy_holds_the_path_behind_the_queue(tmp_path):
    w, summary = _built(tmp_path, _blocking_copy)
    path = step_detail(w, 2, "run").critical_path
    assert path.length_ms == 12.0 and path.bound == "host-blocked"
    # back from the step's end: host to the call's end, the call's tail after its copy (the sync),
    # the copy, the ten kernels back to back, the first one's launch, the host before it
    assert [(s.lane, s.kind, s.name) for s in path.segments] == [
        ("host", "phase", "forward"),
        ("GPU 0 stream 7", "launch", "cudaLaunchKernel"),
        ("GPU 0 stream 7", "kernel", "gemm"),
        ("GPU 0 stream 7", "copy", "Memcpy DtoH (Device -> Pageable)"),
        ("host", "sync", "cudaMemcpyAsync"),
        ("host", "op", "aten::to"),
        ("host", "phase", "forward"),
        ("host", "op", "aten::add"),
        ("host", "phase", "forward"),
        ("host", "phase", "other"),
    ]
    gemm = path.segments[2]
    assert (gemm.start_ms, gemm.end_ms) == (0.1, 10.1)
    assert {(i.kind, i.name): i.ms for i in path.items}[("kernel", "gemm")] == 10.0
    assert path.phases == {"forward": 11.0, "other": 1.0}
    _saving_within_bound(summary)


# --- a GPU-bound step -----------------------------------------------------------------------------


def _gpu_bound(events, n, t, corr):
    """12 ms: forward (9 ms) runs 45 ops 200 µs apart, each launching a 250 µs kernel: the GPU falls
    behind (kernel k runs 25 + 250 k µs on), and the loss read at 9 ms waits until the last kernel
    ends at 11.275 ms."""
    events += [step(n, t, 12_000), annotation("phaseprof::forward", t, 9_000)]
    for k in range(45):
        corr += 1
        at = t + 200 * k
        events += [op("aten::mm", at, 190), launch(at + 5, corr, dur=5),
                   kernel("gemm", t + 25 + 250 * k, 250, corr)]
    events += [op("aten::item", t + 9_000, 2_290), _sync(t + 9_010, 2_270)]
    return corr, 12_000


def test_a_gpu_bound_step_has_kernels_fill_its_path(tmp_path):
    w, summary = _built(tmp_path, _gpu_bound)
    path = step_detail(w, 2, "run").critical_path
    assert path.length_ms == 12.0 and path.bound == "gpu"
    kernels = [s for s in path.segments if s.kind == "kernel"]
    assert len(kernels) == 1 and (kernels[0].start_ms, kernels[0].end_ms) == (0.025, 11.275)
    assert path.items[0].name == "gemm" and path.items[0].ms == 11.25
    # the host's own time on it: before the first launch (5 µs), and after the loss read's
    # synchronize (11.28-12 ms, in `other`, where the sync's 5 µs tail is too)
    assert _item(path, "sync") == pytest.approx(0.005)
    assert path.phases == {"forward": pytest.approx(0.005 + 0.02 + 11.25), "other": pytest.approx(0.725)}
    _saving_within_bound(summary)


# --- an exposed all-reduce ------------------------------------------------------------------------


def _all_reduce(events, n, t, corr):
    """20 ms: forward and backward 1 ms each; backward ends with an all-reduce whose NCCL kernel
    (stream 20) runs 2-18 ms; the optimizer (2-4 ms) launches ten 100 µs kernels that wait for it
    (they run 18-19 ms); the loss read at 16 ms waits until 19 ms."""
    events += [step(n, t, 20_000), annotation("phaseprof::forward", t, 1_000),
               annotation("phaseprof::backward", t + 1_000, 1_000),
               annotation("phaseprof::optimizer", t + 2_000, 2_000)]
    for k in range(4):
        corr += 1
        events += [op("aten::mm", t + 100 + 200 * k, 150), launch(t + 110 + 200 * k, corr),
                   kernel("gemm", t + 130 + 200 * k, 100, corr)]
    corr += 1
    events += collective("all_reduce", t + 1_900, corr, t + 2_000, 16_000, host_us=50,
                         Collective_name="allreduce", Group_size=2, Process_Group_Name="0")
    for k in range(10):
        corr += 1
        events += [op("aten::add_", t + 2_100 + 150 * k, 100), launch(t + 2_110 + 150 * k, corr),
                   kernel("adam", t + 18_000 + 100 * k, 100, corr)]
    events += [op("aten::item", t + 16_000, 3_100), _sync(t + 16_010, 3_000)]
    return corr, 20_000


def test_an_exposed_all_reduce_is_on_the_path(tmp_path):
    w, summary = _built(tmp_path, _all_reduce)
    path = step_detail(w, 2, "run").critical_path
    assert path.length_ms == 20.0 and path.bound == "communication"
    lanes = [(s.lane, s.kind) for s in path.segments]
    # the optimizer's kernels wait for the all-reduce on stream 20: the path goes there from them
    at = lanes.index(("GPU 0 stream 20", "collective"))
    assert lanes[at + 1] == ("GPU 0 stream 7", "kernel")
    nccl = path.segments[at]
    assert (nccl.start_ms, nccl.end_ms) == (2.0, 18.0)
    assert _item(path, "collective") == 16.0
    assert path.phases["backward"] == pytest.approx(16.0 + 0.9 + 0.1, abs=0.01)
    comm = next(f for f in summary.findings if f.kind == "exposed-communication")
    # with the all-reduce gone, the path is 20 - 16 ms long
    assert comm.what_if_ms == 4.0
    _saving_within_bound(summary)


# --- a what-if bound on a real trace --------------------------------------------------------------


def test_the_what_if_bound_of_a_real_host_blocked_step_holds_against_the_raw_events():
    # rank 0 of HTA's 16-rank job, steps 550..554 (all kept): ProfilerStep durations 209.748,
    # 216.483, 216.119, 215.467, 216.216 ms, a mean of 214.8066 ms. Its first finding is the host
    # blocked in `other`; with those waits gone the host's own chain (its work in program order) is
    # the step less them. The calls holding the host in `other`, on the loop's thread (tid 4515),
    # from each step's long aten::to copy on (the calls before it are in forward):
    #   step 550: cudaMemcpyAsync held to their copy's end (DtoH, or pageable) 138.788 + 0.252 +
    #             0.023 + 4.905 ms, cudaStreamSynchronize 0.392 ms: 144.360 ms
    #   step 551: 146.934 + 0.308 + 0.024 + 4.819, syncs 0.230: 152.315 ms
    #   step 552: 145.633 + 0.237 + 0.024 + 4.823, syncs 0.626: 151.343 ms
    #   step 553: 146.630 + 0.276 + 0.025 + 4.876, syncs 0.245: 152.052 ms
    #   step 554: 146.638 + 0.022 + 0.030 + 0.026 + 4.386, syncs 0.507: 151.609 ms
    # (the pageable host-to-device copies, 4-25 µs calls that return before their copy ends, held
    # nothing): a mean of 751.679 / 5 = 150.3358 ms. The bound: 214.8066 - 150.3358 = 64.4708 ms;
    # the saving, never more than the mean step less it, 150.336 ms (the phase's cost, 184.72 ms,
    # would be more: the host's work in `other` that is not waiting stays).
    summary = report(str(NCCL)).runs[0].workers[0].summary
    first = summary.findings[0]
    assert (first.kind, first.phase) == ("host-blocked", "other")
    with gzip.open(NCCL / "rank0.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    wall = sum(b - a for a, b in steps) / len(steps)
    copies = {e["args"]["correlation"]: e for e in events
              if e.get("cat") == "gpu_memcpy" and "correlation" in e.get("args", {})}
    held = 0.0
    for a, b in steps:
        calls = sorted((e for e in events if e["tid"] == 4515 and a <= e["ts"] < b
                        and e["name"] in ("cudaMemcpyAsync", "cudaStreamSynchronize")),
                       key=lambda e: e["ts"])
        big = next(k for k, e in enumerate(calls) if e["dur"] > 100_000)
        for e in calls[big:]:
            if e["name"] == "cudaStreamSynchronize":
                held += e["dur"]
                continue
            copy = copies.get(e["args"].get("correlation"))
            blocks = copy is not None and ("DtoH" in copy["name"] or "Pageable" in copy["name"])
            if blocks and e["ts"] + e["dur"] + 1 >= copy["ts"] + copy["dur"]:  # held to its end
                held += e["dur"]
    held /= len(steps)
    assert wall == pytest.approx(214_806.6) and held == pytest.approx(150_335.8)
    assert first.what_if_ms == round((wall - held) / 1000, 3) == 64.471
    assert first.saving_ms == round(summary.mean_wall_ms - first.what_if_ms, 3) == 150.336
    assert "at least 64.47 ms" in first.text
    _saving_within_bound(summary)


# --- the idle split per stream --------------------------------------------------------------------


def test_the_idle_split_of_a_step_built_to_know_it(tmp_path):
    # kernel 0 runs 100-200 µs; kernel 1 was launched at 50 (queued) and runs 210-260: a 10 µs kernel
    # wait; kernel 2 was launched at 300, after kernel 1 ended: 60 µs of host wait (260-320); kernel 3
    # was launched at 310, queued behind kernel 2 (320-370), and starts at 500: 130 µs of other
    events = [*thread_names(), step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000)]
    for k, (at, start, dur) in enumerate([(0, 100, 100), (50, 210, 50), (300, 320, 50), (310, 500, 100)]):
        events += [launch(T0 + at, k + 1), kernel("gemm", T0 + start, dur, k + 1)]
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", events)
    (row,) = report(str(tmp_path / "run")).runs[0].workers[0].steps
    split = row.gpu_time.idle_split["GPU 0 stream 7"]
    assert (split.host_wait_ms, split.kernel_wait_ms, split.other_ms) == (0.06, 0.01, 0.13)
    # they add up to the stream's window (100-600 µs) less its busy time (300 µs)
    assert split.host_wait_ms + split.kernel_wait_ms + split.other_ms == pytest.approx(0.5 - 0.3)


def _raw_device_work(path) -> tuple[float, list[tuple]]:
    """A base (µs) and, from it, (launch or None, start, end, stream) of each device event, from
    the raw JSON read exactly (a float64 µs near the epoch is 0.25 µs coarse: ns-resolution traces
    need the decimals)."""
    events = hta_reference.load_once(Path(path))  # the session's parse, its ts and dur decimals
    base = min(e["ts"] for e in events)
    launched = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None and e.get("cat", "").lower() in ("cuda_runtime", "runtime", "cuda_driver"):
            launched[corr] = float(e["ts"] - base)
    out = []
    for e in events:
        args = e.get("args") or {}
        if e.get("cat", "").lower() in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"):
            out.append((launched.get(args.get("correlation")), float(e["ts"] - base),
                        float(e["ts"] + e["dur"] - base),
                        f"GPU {args.get('device', 0)} stream {args.get('stream', e.get('tid'))}"))
    return float(base), out


@pytest.mark.parametrize("folder", GPU_FOLDERS)
def test_the_idle_split_follows_htas_rules_and_adds_up_to_each_streams_idle_time(folder):
    # In plain Python from the raw events: the work each step launched (runtime call inside its
    # window), cut to one owner per GPU instant (the earliest step whose work has not all ended);
    # per owner and stream the gaps between consecutive pieces, each host wait (launched after the
    # work before it ended), else kernel wait (under 30 µs), else other; they add up to the stream's
    # window there (first to last piece) less its busy time.
    (run,) = discover(str(DATA / "gpu" / folder))
    for worker, files in run.workers.items():
        w = Worker(worker, [analyze_file(f) for f in files])
        for span, path in zip(w.spans, (f.path for f in files)):
            base, raw = _raw_device_work(path)
            steps = [(s.start - base, s.end - base) for s in span.steps]
            work = defaultdict(list)
            for at, a, b, lane in raw:
                owner = next((k for k, (s, e) in enumerate(steps) if at is not None and s <= at < e), None)
                if owner is not None:
                    work[owner].append((at, a, b, lane))
            bound, last = [], float("-inf")
            for k in range(len(steps)):
                last = max([last] + [b for _, _, b, _ in work[k]])
                bound.append(last)
            pieces = defaultdict(list)  # (owner, stream) -> (launch, start, end)
            for k, items in work.items():
                for at, a, b, lane in items:
                    for o in range(k + 1):
                        lo = a if o == 0 else max(a, bound[o - 1])
                        hi = b if o == k else min(b, bound[o])
                        if hi > lo or (o == k and a == b and lo == a):
                            pieces[(o, lane)].append((at, lo, hi))
            expected = defaultdict(lambda: [0.0, 0.0, 0.0])
            # gaps whose category turns on less than the analysis's clock can tell (float64 µs near
            # the epoch: 0.25 µs): a launch within it of the work before it ending, or a gap within
            # it of 30 µs; ns-resolution traces have some
            unsure = defaultdict(float)
            idle = {}
            for (o, lane), items in pieces.items():
                items.sort(key=lambda x: x[1])
                reach, busy, first = items[0][2], 0.0, items[0][1]
                covered = items[0][1]
                for _, a, b in items:
                    busy += max(b - max(a, covered), 0.0)
                    covered = max(covered, b)
                for at, a, b in items[1:]:
                    gap = max(a - reach, 0.0)
                    kind = 0 if at is not None and at > reach else 1 if gap < 30 else 2
                    expected[(o, lane)][kind] += gap
                    if (at is not None and abs(at - reach) <= 0.5) or abs(gap - 30) <= 0.5:
                        unsure[(o, lane)] += gap
                    reach = max(reach, b)
                idle[(o, lane)] = (covered - first) - busy
                # and the analysis's clock, 0.25 µs coarse, at each end of each gap (ns traces)
                fine = any(a != int(a) or b != int(b) for _, a, b in items)
                unsure[(o, lane)] += 0.5 * len(items) if fine else 0.0
            for i, s in enumerate(span.steps):
                got = w.idle_split(w.refs.index(next(r for r in w.refs if r.span is span and r.index == i)))
                for (o, lane), split in expected.items():
                    if o != i:
                        continue
                    values = got.get(lane, [0.0, 0.0, 0.0])
                    slack = 0.01 + unsure[(o, lane)]
                    assert list(values) == pytest.approx(split, abs=slack), (folder, s.number, lane)
                    assert sum(values) == pytest.approx(idle[(o, lane)], abs=slack)


# --- what the walk reads off the host -------------------------------------------------------------


def _path(tmp_path, events, step_index: int = 0):
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", [*thread_names(), *events])
    return step_detail(_worker(tmp_path / "run"), step_index, "run").critical_path


def test_a_synchronize_read_a_little_before_its_kernel_ends_still_waited_for_it(tmp_path):
    # the kernel ends 0.5 µs after the synchronize waiting for it (the host's and the GPU's clocks
    # are read apart): the path still runs through the kernel
    events = [step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000),
              launch(T0 + 10, 1), kernel("gemm", T0 + 100, 200.5, 1), _sync(T0 + 50, 250)]
    path = _path(tmp_path, events)
    assert [(s.lane, s.kind, s.name) for s in path.segments] == [
        ("host", "phase", "forward"), ("GPU 0 stream 7", "launch", "cudaLaunchKernel"),
        ("GPU 0 stream 7", "kernel", "gemm"), ("host", "sync", "cudaStreamSynchronize"),
        ("host", "phase", "forward")]
    # a kernel ending 2 µs after it is not what it waited for: the host held it, not the GPU
    events[3] = kernel("gemm", T0 + 100, 202, 1)
    assert {s.lane for s in _path(tmp_path, events).segments} == {"host"}


@pytest.mark.parametrize("call", ["cudaLaunchKernel", "hipLaunchKernel", "cuLaunchKernel",
                                  "hipExtModuleLaunchKernel", "cudaGraphLaunch",
                                  "cudaLaunchKernelExC"])
def test_host_time_in_a_launch_call_on_the_path_is_launching(tmp_path, call):
    events = [step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000),
              launch(T0 + 10, 1, dur=5, name=call), kernel("gemm", T0 + 900, 10, 1)]
    path = _path(tmp_path, events)
    assert ("host", "launch", call) in [(s.lane, s.kind, s.name) for s in path.segments]
    assert _item(path, "launch") == 0.005


def _lanes(path) -> list[tuple]:
    return [(s.lane, s.kind, s.name) for s in path.segments]


def test_device_work_with_no_known_launch_goes_back_to_the_loops_thread(tmp_path):
    # a kernel with no runtime call correlated to it, first on the device, and a synchronize waiting
    # for it: nothing on the device bound its start, the path goes on on the host at its start (in
    # the synchronize, before it was held); a later kernel, launched at 550, is not on the path
    events = [step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000),
              kernel("orphan", T0 + 100, 200, 99), _sync(T0 + 50, 250),
              launch(T0 + 550, 1), kernel("later", T0 + 600, 100, 1)]
    assert _lanes(_path(tmp_path, events)) == [
        ("host", "phase", "forward"), ("host", "op", "cudaStreamSynchronize"),
        ("GPU 0 stream 7", "kernel", "orphan"), ("host", "sync", "cudaStreamSynchronize"),
        ("host", "phase", "forward"), ("host", "launch", "cudaLaunchKernel"),
        ("host", "phase", "forward")]


def test_a_chain_on_a_second_stream_names_each_gap_by_what_bound_it(tmp_path):
    # stream 7 runs a kernel at 3-8 µs (launched at 1); stream 9 runs k1 100-200 (launched at 10)
    # and k2 210-300 (launched at 20, queued: 10 µs of kernel wait); k3 on stream 7 (launched at
    # 30) waits for k2 through an event and starts at 305: 5 µs of other wait; the loss read waits
    # for k3 until 400
    events = [step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000),
              launch(T0 + 1, 1), kernel("early", T0 + 3, 5, 1),
              launch(T0 + 10, 2), kernel("k1", T0 + 100, 100, 2, stream=9),
              launch(T0 + 20, 3), kernel("k2", T0 + 210, 90, 3, stream=9),
              launch(T0 + 30, 4), kernel("k3", T0 + 305, 95, 4), _sync(T0 + 50, 350)]
    path = _path(tmp_path, events)
    assert _lanes(path) == [
        ("host", "phase", "forward"), ("host", "launch", "cudaLaunchKernel"),
        ("host", "phase", "forward"), ("GPU 0 stream 9", "launch", "cudaLaunchKernel"),
        ("GPU 0 stream 9", "kernel", "k1"), ("GPU 0 stream 9", "idle", "kernel wait"),
        ("GPU 0 stream 9", "kernel", "k2"), ("GPU 0 stream 7", "idle", "other wait"),
        ("GPU 0 stream 7", "kernel", "k3"), ("host", "sync", "cudaStreamSynchronize"),
        ("host", "phase", "forward")]
    gaps = [(s.start_ms, s.end_ms) for s in path.segments[5:8]]
    assert gaps == [(0.2, 0.21), (0.21, 0.3), (0.3, 0.305)]


def test_a_synchronize_before_any_device_work_ended_held_nothing(tmp_path):
    events = [step(1, T0, 1_000), annotation("phaseprof::forward", T0, 1_000), _sync(T0 + 1, 2),
              launch(T0 + 10, 1), kernel("gemm", T0 + 100, 200, 1), _sync(T0 + 50, 250)]
    # the first synchronize is the host's own time; the second waited for the kernel
    assert _lanes(_path(tmp_path, events)) == [
        ("host", "phase", "forward"), ("host", "op", "cudaStreamSynchronize"),
        ("host", "phase", "forward"), ("GPU 0 stream 7", "launch", "cudaLaunchKernel"),
        ("GPU 0 stream 7", "kernel", "gemm"), ("host", "sync", "cudaStreamSynchronize"),
        ("host", "phase", "forward")]


def test_a_step_waiting_for_work_launched_in_the_step_before_starts_its_path_there(tmp_path):
    # step 0 launches a kernel at 900 µs that runs 1,100-1,300, in step 1, whose synchronize waits
    # for it: step 1's path starts with the launch's wait, from the step's start
    events = [step(0, T0, 1_000), annotation("phaseprof::forward", T0, 1_000),
              launch(T0 + 900, 1), kernel("gemm", T0 + 1_100, 200, 1),
              step(1, T0 + 1_000, 1_000), annotation("phaseprof::forward", T0 + 1_000, 1_000),
              _sync(T0 + 1_050, 250)]
    path = _path(tmp_path, events, step_index=1)
    assert _lanes(path) == [
        ("GPU 0 stream 7", "launch", "cudaLaunchKernel"), ("GPU 0 stream 7", "kernel", "gemm"),
        ("host", "sync", "cudaStreamSynchronize"), ("host", "phase", "forward")]
    assert (path.segments[0].start_ms, path.segments[0].end_ms, path.length_ms) == (0.0, 0.1, 1.0)


@pytest.mark.parametrize("op_us", [300, 50])
def test_work_launched_from_autograds_thread_is_followed_through_its_op(tmp_path, op_us):
    # backward's loop thread waits in a synchronize (110-500 µs) for a kernel (200-500) that
    # autograd's thread launched at 150 inside an op begun at 100, or right after one (100-150):
    # the path runs back through that op, then on the loop's thread from its start
    events = [step(1, T0, 1_000), annotation("phaseprof::backward", T0, 1_000),
              op("autograd::engine::evaluate_function: MmBackward0", T0 + 100, op_us, tid=AUTOGRAD),
              launch(T0 + 150, 1, tid=AUTOGRAD), kernel("gemm", T0 + 200, 300, 1),
              _sync(T0 + 110, 390)]
    path = _path(tmp_path, events)
    assert [(s.lane, s.kind, s.name, s.start_ms, s.end_ms) for s in path.segments] == [
        ("host", "phase", "backward", 0.0, 0.1),
        ("host", "op", "autograd::engine::evaluate_function: MmBackward0", 0.1, 0.15),
        ("GPU 0 stream 7", "launch", "cudaLaunchKernel", 0.15, 0.2),
        ("GPU 0 stream 7", "kernel", "gemm", 0.2, 0.5),
        ("host", "sync", "cudaStreamSynchronize", 0.5, 0.5),
        ("host", "phase", "backward", 0.5, 1.0)]
    assert path.length_ms == 1.0

"""The GPU measures: GPU busy, kernel time, GPU window, compute and communication, each stated apart.

Invariants on every GPU trace under tests/data/gpu (whatever is added there later) and on GPU-shaped
traces built here; the exact figures of a hand-built step; communication and overlap against an
independent computation from the raw events; the ranks in one measure; and the terminal's labels.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import io
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from phaseprof.cli.report import report
from phaseprof.cli.terminal import render
from phaseprof.plugin.analysis.ranks import ranks
from phaseprof.plugin.analysis.worker import Worker
from phaseprof.plugin.reading.discovery import discover
from phaseprof.plugin.spans import analyze_file
from tests import hta_reference
from tests.conftest import DATA
from tests.logdir import write_trace
from tests.tracebuilder import Loop, annotation, kernel, launch, op, step, thread_names

GPU_FOLDERS = sorted(p.name for p in (DATA / "gpu").iterdir() if p.is_dir())
COMM = re.compile(r"nccl|rccl|gloo", re.I)
#: A sentence dividing a GPU figure by the host's step: "… GPU … (80% of the 78.83 ms step)", "GPU busy 36%".
GPU_OVER_HOST = (re.compile(r"GPU[^;\n]*?\(\d+% of the [\d,.]+ ms step\)"), re.compile(r"GPU busy \d+%"))


# --- GPU-shaped traces built here ------------------------------------------------------------------------


def overlap_step(events: list[dict], number: int, s: float, corr: int) -> int:
    """One 10 ms step at ``s`` (µs): forward 0-4 ms, backward 4-9 ms, other 9-10 ms. Forward launches
    K1 (stream 7, 0.1-3.1 ms), K2 (stream 8, 1-2 ms: two streams at once) and K4 (stream 8, 4.5-5.5 ms:
    beside backward's K3); backward launches K3 (stream 7, 5-9 ms), an NCCL all-reduce (stream 20,
    8-12 ms: past the host window) and, under record_param_comms, a copy (stream 21, 12-12.5 ms)."""
    work = [  # (phase start offset for the launch, kernel name, stream, start, end) in µs from s
        (100, "gemm_fwd", 7, 100, 3100), (200, "gemm_fwd2", 8, 1000, 2000), (300, "gemm_fwd3", 8, 4500, 5500),
        (4100, "gemm_bwd", 7, 5000, 9000),
        (4200, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 20, 8000, 12000),
    ]
    events += [step(number, s, 10_000), annotation("phaseprof::forward", s, 4_000),
               annotation("phaseprof::backward", s + 4_000, 5_000)]
    for at, name, stream, a, b in work:
        corr += 1
        events += [launch(s + at, corr), kernel(name, s + a, b - a, corr, stream=stream)]
    corr += 1
    events += [op("record_param_comms", s + 4300, 50), launch(s + 4310, corr, name="cudaMemcpyAsync")]
    copy = kernel("Memcpy DtoD (Device -> Device)", s + 12_000, 500, corr, stream=21)
    events.append({**copy, "cat": "gpu_memcpy"})
    return corr


def overlap_trace(path: Path, steps: int = 5) -> Path:
    events, corr = thread_names(), 0
    for n in range(steps):
        corr = overlap_step(events, n + 1, 1_000_000 + n * 10_000, corr)
    return write_trace(path, events)


def gpu_bound_trace(path: Path) -> Path:
    """A loop whose GPU work (two streams, and an all-reduce) takes far longer than its host work:
    the host runs ahead and each step's kernels run long after its host window."""
    loop = Loop()
    for n in range(6):
        loop.step(n, ("phaseprof::forward", 1_000, [("gemm_a", 3_000, 7), ("gemm_b", 2_000, 13)]),
                  ("phaseprof::backward", 1_500, [("gemm_c", 9_000, 7), ("ncclKernel_AllReduce_x", 3_000, 20)]),
                  ("phaseprof::optimizer", 500, [("adam_kernel", 500, 7)]))
    return write_trace(path, loop.events)


BUILT = {"overlap": overlap_trace, "gpu_bound": gpu_bound_trace}


def gpu_report(folder: Path):
    """(report, workers) of a folder of GPU traces; a recorded one's made once in the session (the
    tests only read it, and the ResNet-50 one alone is seconds of work)."""
    if folder.is_relative_to(DATA):
        return _recorded(folder)
    return _gpu_report(folder)


def _gpu_report(folder: Path):
    r = report(str(folder))
    assert r.errors == [], r.errors
    workers = [w for run in r.runs for w in run.workers]
    assert workers and all(w.gpu for w in workers), folder
    return r, workers


_recorded = functools.cache(_gpu_report)


@pytest.fixture(params=[f"data:{name}" for name in GPU_FOLDERS] + [f"built:{name}" for name in BUILT])
def gpu_case(request, tmp_path):
    kind, name = request.param.split(":")
    if kind == "data":
        return gpu_report(DATA / "gpu" / name)
    BUILT[name](tmp_path / "run" / "w.1.pt.trace.json")
    return gpu_report(tmp_path / "run")


def test_the_gpu_test_data_holds_the_multi_stream_traces():
    assert {"hta_nccl_16rank", "hta_alexnet_2stream", "hta_event_sync_3stream", "hta_sampled_2rank",
            "hta_ns_resolution", "kineto_resnet50_num_workers_0"} <= set(GPU_FOLDERS)
    for name in GPU_FOLDERS:
        assert list((DATA / "gpu" / name).glob("LICENSE*")), f"{name} has no licence file beside it"


def _adds_up(parts: list[float], total: float) -> None:
    """Phase parts add up to the total: 100% ± 0.5% (or within rounding to the µs)."""
    assert sum(parts) == pytest.approx(total, rel=0.005, abs=0.001 * (len(parts) + 1))


def test_gpu_invariants(gpu_case):
    r, workers = gpu_case
    for w in workers:
        for row in w.steps:
            g = row.gpu_time
            assert g is not None, (w.worker, row.step)
            phases = row.phases.values()
            for field, total in (("gpu_busy_ms", g.busy_ms), ("gpu_compute_ms", g.compute_ms),
                                 ("comm_ms", g.comm_ms), ("exposed_comm_ms", g.exposed_comm_ms)):
                _adds_up([getattr(p, field) for p in phases], total)
            # (kernel time is by launch; busy is the step's own instants, which may hold the next
            # step's work run before this step's work ended: busy is within the window, not within
            # kernel time)
            assert g.busy_ms <= g.window_ms + 0.002
            # four measures partition the GPU window: compute, communication no compute hides,
            # copies and sets neither hides, and idle
            parts = g.compute_ms + g.exposed_comm_ms + g.exposed_memory_ms
            assert g.busy_ms == pytest.approx(parts, abs=0.004)
            assert g.busy_ms + g.idle_ms == pytest.approx(g.window_ms, abs=0.002)
            assert 0 <= g.exposed_memory_ms <= g.memory_ms + 0.002
            assert g.memory_ms <= sum(g.memory_kinds.values()) + 0.002
            assert min(g.compute_ms, g.comm_ms, g.exposed_comm_ms, g.past_host_ms) >= 0
            assert g.exposed_comm_ms <= g.comm_ms + 0.002
            assert (g.overlap is None) == (g.comm_ms == 0) and (g.overlap is None or 0 <= g.overlap <= 1)
            assert all(v <= g.busy_ms + 0.002 for v in g.streams.values())
            assert sum(g.streams.values()) >= g.busy_ms - 0.002 * len(g.streams)
            assert g.kernel_ms == pytest.approx(row.gpu_ms, abs=0.002)
            for p in phases:
                assert min(p.gpu_busy_ms, p.gpu_compute_ms, p.comm_ms, p.exposed_comm_ms) >= 0
                assert p.gpu_busy_ms <= g.busy_ms + 0.002
                assert p.exposed_comm_ms <= p.comm_ms + 0.002
        s = w.summary
        if s.mean is None:
            continue
        _adds_up([m.share for m in s.mean.values()], 1.0)
        _adds_up([m.gpu_share for m in s.mean.values()], 1.0)
        _adds_up(list(s.costs.values()), s.cost_total_ms)
        if s.measure == "gpu":  # a GPU-bound step is measured by the GPU: its compute, not the host window
            assert s.cost_total_ms == pytest.approx(s.gpu_time.compute_ms, abs=0.002)
        for f in s.findings:
            if f.share is not None:
                assert 0 <= f.share <= 1.0, f
    _no_gpu_over_host(r)


def _no_gpu_over_host(r) -> None:
    """No sentence of the report, in its JSON or on the terminal, sets a GPU figure over the host's step."""
    console = Console(record=True, width=100_000, file=io.StringIO())  # a sentence a line
    render(r, console, evidence=True)
    texts = [console.export_text()] + [
        f.text for run in r.runs for w in run.workers for f in w.summary.findings]
    texts.append(msgspec.json.encode(r).decode())
    for text in texts:
        for pattern in GPU_OVER_HOST:
            assert not pattern.search(text), pattern.search(text).group(0)
    for run in r.runs:
        for w in run.workers:
            s = w.summary
            if s.mean_wall_ms is None:
                continue
            for f in s.findings:
                if f.evidence.measure == "gpu" or f.kind == "exposed-communication":
                    assert f"{s.mean_wall_ms:.2f} ms step" not in f.text, f.text


# --- one hand-built step, figure by figure -----------------------------------------------------------------


def test_the_measures_of_a_hand_built_step(tmp_path):
    r, (w,) = gpu_report(overlap_trace(tmp_path / "run" / "w.1.pt.trace.json").parent)
    row = w.steps[0]
    g = row.gpu_time
    # step 1's work ends at 12.5 ms (its copy): until then every GPU instant is step 1's, step 2's
    # work that runs from 10 ms included (K1' on stream 7 at [10.1, 12.5), K2' on stream 8 at [11,
    # 12)). compute: [0.1, 3.1), [4.5, 9) and [10.1, 12.5) ms; communication [8, 12.5); exposed [9,
    # 10.1)
    assert (g.compute_ms, g.comm_ms, g.exposed_comm_ms) == (9.9, 4.5, 1.1)
    assert (g.busy_ms, g.kernel_ms, g.window_ms, g.past_host_ms) == (11.0, 13.5, 12.4, 2.5)
    assert g.overlap == pytest.approx(1 - 1.1 / 4.5, abs=1e-4)
    assert g.streams == {"GPU 0 stream 7": 9.4, "GPU 0 stream 8": 3.0, "GPU 0 stream 20": 4.0,
                         "GPU 0 stream 21": 0.5}
    fwd, bwd = row.phases["forward"], row.phases["backward"]
    # forward's two streams at once count once; [5, 5.5) ms, where forward's K4 and backward's K3 both
    # run, is shared equally, and so is [10.1, 12.5), where forward's K1' runs beside backward's
    # all-reduce and copy (its compute alone is compute there); kernel time stays by launch
    assert (fwd.gpu_busy_ms, fwd.gpu_compute_ms, fwd.comm_ms, fwd.gpu_ms) == (4.95, 6.15, 0.0, 5.0)
    assert (bwd.gpu_busy_ms, bwd.gpu_compute_ms, bwd.comm_ms, bwd.exposed_comm_ms) == (
        6.05, 3.75, 4.5, 1.1)
    # steps 2-4 own [2.5, 12.5) ms of their own time: compute 0.6 + 4.5 + 2.4 ms, exposed 1.1 ms;
    # the last step has no next step to hide its all-reduce: compute 5.1 ms, exposed 3.5 ms
    assert [r.gpu_time.compute_ms for r in w.steps] == [9.9, 7.5, 7.5, 7.5, 5.1]
    assert [r.gpu_time.exposed_comm_ms for r in w.steps] == [1.1, 1.1, 1.1, 1.1, 3.5]
    # host-bound (10 ms of host work against 7.5 ms of GPU compute): exposed communication found all
    # the same, without a saving: the GPU's 9.08 ms (7.5 compute + 1.58 exposed) is under the host's
    # 10 ms
    s = w.summary
    assert s.measure == "host"
    comm = next(f for f in s.findings if f.kind == "exposed-communication")
    assert comm.phase == "backward" and comm.evidence.collective == "all-reduce"
    assert comm.evidence.exposed_ms == 1.58 and comm.evidence.comm_ms == 4.5
    assert comm.saving_ms is None and "binds the step" in comm.text and "bucket_cap_mb" in comm.text
    past = next(f for f in s.findings if f.kind == "gpu-past-host")
    assert past.evidence.steps == [1, 2, 3, 4, 5] and past.evidence.past_host_ms == 2.5


def test_a_gpu_bound_step_is_measured_by_the_gpu(tmp_path):
    r, (w,) = gpu_report(gpu_bound_trace(tmp_path / "run" / "w.1.pt.trace.json").parent)
    s = w.summary
    assert s.measure == "gpu" and s.dominant_phase == "backward"
    first = s.findings[0]
    # its share is of the step's GPU compute time: not of the 3 ms host window
    assert first.share == pytest.approx(s.costs["backward"] / s.gpu_time.compute_ms, abs=1e-3)
    assert f"of the step's {s.gpu_time.compute_ms:.2f} ms of GPU compute" in first.text
    assert s.gpu_time.past_host_ms > 0
    past = next(f for f in s.findings if f.kind == "gpu-past-host")
    assert past.text.endswith(f"; the step is GPU-bound, so it is measured by the GPU ({s.cost_total_ms:,.2f} ms "
                              "of GPU compute per step)")
    assert past.text == ("the GPU work of steps 0, 1, 2, 3, 4, 5 runs on after the step's host window ends (by "
                         "50.76 ms on average, at most 87.00 ms): the host runs ahead of the GPU, and a step's GPU "
                         "figures count the work it launched wherever it ran; the step is GPU-bound, so it is measured "
                         "by the GPU (14.50 ms of GPU compute per step)")
    assert past.evidence.steps == [0, 1, 2, 3, 4, 5] and past.evidence.past_host_ms == 50.755


# --- communication against an independent computation from the raw events --------------------------------


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union ``a`` less the union ``b`` (both merged and sorted)."""
    left = 0.0
    for x, y in a:
        cut = 0.0
        for u, v in b:
            if v <= x:
                continue
            if u >= y:
                break
            cut += min(y, v) - max(x, u)
        left += (y - x) - cut
    return left


def independent_comm(path: Path) -> dict[int, dict[str, float]]:
    """Per step number, from the raw events alone: compute, communication and exposed communication
    (µs) of the device work launched in the step, communication being NCCL kernels and work launched
    under a ``record_param_comms`` (or ``nccl:``) op of the launching thread, memory the other
    copies and sets, compute the other kernels; each instant in one step: the earliest whose work
    has not all ended then (so the next step's work running before that end is counted there)."""
    with gzip.open(path, "rt") as f:
        raw = json.load(f)
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), int(e["name"].split("#")[1]))
             for e in complete if e["name"].startswith("ProfilerStep#")]
    steps.sort()
    comm_ops = defaultdict(list)
    for e in complete:
        if e.get("cat") in ("cpu_op", "user_annotation", "Operator") and (
                e["name"] == "record_param_comms" or e["name"].startswith("nccl:")):
            comm_ops[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    for v in comm_ops.values():
        v.sort()
    launches = {}
    for e in complete:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and "correlation" in e.get("args", {}):
            t = float(e["ts"])
            ops = comm_ops.get((e["pid"], e["tid"]), [])
            k = bisect.bisect_right(ops, (t, float("inf")))
            under = any(a <= t <= b for a, b in ops[max(k - 8, 0):k])
            launches[e["args"]["correlation"]] = (t, under)
    per_step = defaultdict(lambda: {"compute": [], "comm": [], "memory": []})
    for e in complete:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"):
            continue
        found = launches.get(e.get("args", {}).get("correlation"))
        if found is None:
            continue
        t, under = found
        k = bisect.bisect_right(steps, (t, float("inf"), 0)) - 1
        if k < 0 or not steps[k][0] <= t < steps[k][1]:
            continue
        memory = e.get("cat") in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset")
        kind = "comm" if COMM.search(e["name"]) or under else "memory" if memory else "compute"
        per_step[steps[k][2]][kind].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    # one owner per GPU instant: the earliest step whose work has not all ended (steps in step
    # order)
    numbers = sorted(per_step)
    bound, reach = {}, float("-inf")
    for number in numbers:
        reach = max([reach] + [b for kind in per_step[number].values() for _, b in kind])
        bound[number] = reach
    owned = defaultdict(lambda: {"compute": [], "comm": [], "memory": []})
    for number in numbers:
        for kind, intervals in per_step[number].items():
            for a, b in intervals:
                for owner in numbers:  # cut the interval where each step's work has all ended
                    if a >= bound[owner] and owner != number:
                        continue
                    end = min(b, bound[owner])
                    if end > a or (a == b and owner == number):
                        owned[owner][kind].append((a, end))
                    a = max(a, end)
                    if a >= b:
                        break
    per_step = owned
    out = {}
    for number, work in per_step.items():
        compute, comm, memory = (hta_reference.union(work[k]) for k in ("compute", "comm", "memory"))
        out[number] = {"compute": _length(compute), "comm": _length(comm),
                       "exposed": _minus(comm, compute), "memory": _length(memory),
                       "exposed_memory": _minus(memory, hta_reference.union(work["compute"] + work["comm"]))}
    return out


@pytest.mark.parametrize("folder", ["hta_nccl_16rank", "hta_sampled_2rank", "hta_ns_resolution",
                                    "kineto_resnet50_num_workers_0"])
def test_communication_agrees_with_an_independent_computation(folder):
    # compute is kernels only: copies and sets are memory, collectives communication (HTA's kernel
    # types)
    _, workers = gpu_report(DATA / "gpu" / folder)
    checked = 0
    for w in workers:
        for span in w.spans:
            path = DATA / "gpu" / folder / span
            expected = independent_comm(path)
            rows = {r.step: r for r in w.steps if r.span == span}
            assert set(expected) == set(rows), path.name
            for number, want in expected.items():
                g = rows[number].gpu_time
                with_comm = folder in ("hta_nccl_16rank", "hta_sampled_2rank")
                assert want["comm"] > 0 or not with_comm, (path.name, number)
                for got, key in ((g.compute_ms, "compute"), (g.comm_ms, "comm"),
                                 (g.exposed_comm_ms, "exposed"), (g.memory_ms, "memory"),
                                 (g.exposed_memory_ms, "exposed_memory")):
                    assert got == pytest.approx(want[key] / 1000, rel=0.05, abs=0.05), (
                        path.name, number, key)
                if want["comm"]:
                    assert g.overlap == pytest.approx(1 - want["exposed"] / want["comm"], abs=0.05)
                checked += 1
    assert checked == sum(len(w.steps) for w in workers) >= 4


def _trace_own(path: Path, windows: list[tuple[float, float]]) -> dict[str, float]:
    """The trace's own GPU figures (µs), from its raw events, exact: the union over all streams of
    the device work launched inside the step ``windows`` (host start, end), of each kind and of all
    (busy), with phaseprof's kinds (tests/hta_reference.py, which the HTA agreement uses too)."""
    work = hta_reference.device_work(hta_reference.load_once(path), rounded=False, scope="steps",
                                     kinds="phaseprof", windows=windows)
    return {k: v for k, v in hta_reference.figures(work).items() if k in hta_reference.FIGURES}


@pytest.mark.parametrize("folder", GPU_FOLDERS)
def test_one_owner_per_gpu_instant(folder):
    # per-step busy, compute, communication and memory add up over the steps to the trace's own, and
    # the steps' GPU windows follow each other: work of a step running while the next step's runs is
    # counted once (on HTA's 16-rank trace the windows averaged 373 ms for a 215 ms step)
    for path in sorted((DATA / "gpu" / folder).glob("*.gz")):
        (run,) = discover(str(path.parent))
        (span,) = [analyze_file(f) for files in run.workers.values() for f in files
                   if f.path == str(path)]
        g = span.gpu
        own = _trace_own(path, [(s.start, s.end) for s in span.steps])
        for figure, table in (("busy", g.busy_us), ("compute", g.compute_us), ("comm", g.comm_us),
                              ("memory", g.memory_us)):
            assert table.sum() == pytest.approx(own.get(figure, 0.0), rel=0.001, abs=0.01), (
                path.name, figure)
        starts, widths = g.window_start_us.tolist(), g.window_us.tolist()
        opened = [(a, a + w) for a, w in zip(starts, widths) if a == a]  # NaN: a step without work
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(opened, opened[1:])), path.name
        assert (g.busy_us.sum(axis=1) <= g.window_us + 0.002).all()


#: Device work that is not compute, by name: collectives' kernels, copies and sets.
NOT_COMPUTE = re.compile(r"nccl|rccl|gloo|^Memcpy|^Memset", re.I)


def test_no_finding_names_communication_or_a_copy_as_compute(gpu_case):
    # a GPU-bound phase's cost is its compute, and the kernels it names are its compute kernels:
    # never an all-reduce (the built GPU-bound loop's backward runs 9 ms of gemm and 3 ms of NCCL
    # all-reduce)
    _, workers = gpu_case
    for w in workers:
        for f in w.summary.findings:
            named = f.evidence.kernels or []
            assert not [k for k in named if NOT_COMPUTE.search(k)], (w.worker, f.kind, named)
            if f.kind == "gpu-bound":
                assert not re.search(r"nccl|rccl|gloo|Memcpy|Memset", f.text, re.I), f.text


#: A clause of a finding naming device work that is not compute (a collective's kernel, a copy or
#: a set, as the trace names them) ...
NAMES_NOT_COMPUTE = re.compile(
    r"nccl\w*Kernel|rccl\w*Kernel|gloo\w*Kernel|\bMemcpy [DHP]|\bMemset \(", re.I)
#: ... never calls it compute ("no compute on any stream" says the opposite).
CALLS_IT_COMPUTE = re.compile(r"(?<!no )\bcompute\b|tensor cores|fp32|GPU-bound", re.I)


@pytest.mark.parametrize("case", [f"data:{name}" for name in GPU_FOLDERS]
                         + [f"built:{name}" for name in BUILT])
def test_no_list_or_sentence_names_communication_or_a_copy_as_compute(case, tmp_path):
    # every finding's text, clause by clause; the kernel table over every step: a collective's
    # kernel or a copy is never given a compute property (tensor cores: null, as for a copy)
    kind, name = case.split(":")
    folder = (DATA / "gpu" / name if kind == "data"
              else BUILT[name](tmp_path / "run" / "w.1.pt.trace.json").parent)
    r = report(str(folder), kernels=True)
    assert r.errors == [], r.errors
    workers = [w for run in r.runs for w in run.workers]
    assert workers
    named = 0
    for w in workers:
        for f in w.summary.findings:
            for clause in re.split(r"[;:]\s", f.text):
                if NAMES_NOT_COMPUTE.search(clause):
                    named += 1
                    assert not CALLS_IT_COMPUTE.search(clause), (f.kind, clause)
        rows = w.kernels.kernels
        assert rows, w.worker
        for row in rows:
            if NOT_COMPUTE.search(row.name):
                assert row.tensor_cores is None, row.name
                if re.match(r"Memcpy|Memset", row.name):
                    assert row.kind in ("memcpy", "memset"), row.name
    assert named or kind == "data", "the built loops' findings name their all-reduce"


def test_exposed_communication_gets_advice_for_its_collective():
    # TorchRec's sharded embeddings: an all-to-all in forward (run by NCCL as SendRecv kernels), an
    # all-gather in the optimizer; the host binds these steps, so no saving is claimed
    _, workers = gpu_report(DATA / "gpu" / "hta_sampled_2rank")
    for w in workers:
        found = {f.phase: f for f in w.summary.findings if f.kind == "exposed-communication"}
        forward, optimizer = found["forward"], found["optimizer"]
        assert forward.evidence.collective == "all-to-all" and "embedding" in forward.text
        assert "bucket_cap_mb" not in forward.text and "no_sync" not in forward.text
        assert optimizer.evidence.collective == "all-gather" and "FSDP" in optimizer.text
        assert forward.saving_ms is None and "binds the step" in forward.text


# --- GPU idle of a phase only some spans have (issue 18) ----------------------------------------------------


def test_a_phase_only_some_spans_have_gets_no_idle_time_there_not_nan(tmp_path):
    # a user-named phase ("augment") in the first span only: in the second span's steps it had no host
    # time, so no GPU idle time either (not NaN / null)
    first, second = Loop(), Loop()
    for n in range(3):
        first.step(n, ("phaseprof::augment", 500), ("phaseprof::forward", 2_000, [("gemm", 1_000)]))
    second.t = second.gpu_free = first.t + 1_000
    second.corr = first.corr
    for n in range(3, 6):
        second.step(n, ("phaseprof::forward", 2_000, [("gemm", 1_000)]))
    write_trace(tmp_path / "run" / "w.1.pt.trace.json", first.events)
    write_trace(tmp_path / "run" / "w.2.pt.trace.json", second.events)
    r = report(str(tmp_path / "run"))
    (w,) = r.runs[0].workers
    assert [row.step for row in w.steps] == [0, 1, 2, 3, 4, 5] and "augment" in w.summary.phases
    assert [row.phases["augment"].gpu_idle_ms for row in w.steps] == [0.5] * 3 + [0.0] * 3
    assert w.summary.mean["augment"].gpu_idle_ms == pytest.approx(0.25, abs=0.001)


# --- ranks -------------------------------------------------------------------------------------------------


def _workers(folder: Path) -> list[Worker]:
    (run,) = discover(str(folder))
    return [Worker(name, [analyze_file(f) for f in files]) for name, files in run.workers.items()]


def test_ranks_of_a_gpu_job_are_all_gpu_time_and_never_negative():
    answer = ranks("r", _workers(DATA / "gpu" / "hta_sampled_2rank"))
    assert answer.measure == "gpu" and [r.rank for r in answer.ranks] == [0, 1]
    assert answer.world_size == 128 and answer.missing_ranks == list(range(2, 128))
    assert "ranks 2-127 of world size 128 have no trace here" in answer.note
    for r in answer.ranks:
        assert min(r.compute_ms, r.comm_ms, r.exposed_comm_ms, r.step_ms, *r.phase_compute_ms.values()) >= 0
        # GPU time throughout: phases' compute adds up to the compute, the step is GPU busy
        assert sum(r.phase_compute_ms.values()) == pytest.approx(r.compute_ms, abs=0.01)
        # the step is GPU busy: compute, exposed communication and the copies and sets neither hides
        assert r.step_ms >= r.compute_ms + r.exposed_comm_ms - 0.003
        assert r.exposed_comm_ms <= r.comm_ms and r.step_ms < r.wall_ms


def test_a_gpu_straggler_is_found_in_gpu_time(tmp_path):
    # Two ranks, six steps: rank 1's forward kernels take 4 ms where rank 0's take 2 ms (± a little);
    # both meet at an all-reduce in backward, where rank 0 waits the 2 ms rank 1 is late.
    for rank in (0, 1):
        loop = Loop()
        for n in range(6):
            jitter = 20 * ((3 * n + rank) % 5)
            fwd = 2_000 + 2_000 * rank + jitter
            reduce = ("ncclKernel_AllReduce_x", 1_000 + 2_000 * (1 - rank))
            loop.step(n, ("phaseprof::forward", 500, [("gemm_fwd", fwd)]),
                      ("phaseprof::backward", 500, [("gemm_bwd", 3_000), reduce], [("nccl:all_reduce", 300, 50)]),
                      ("phaseprof::optimizer", "sync"))
        write_trace(tmp_path / "job" / f"rank{rank}.1.pt.trace.json", loop.events,
                    distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2})
    answer = ranks("job", _workers(tmp_path / "job"))
    assert answer.measure == "gpu" and answer.missing_ranks == [] and answer.not_ranks == []
    s = answer.straggler
    assert s is not None and s.rank == 1 and s.phase == "forward" and s.waited_for, answer.note
    assert "GPU compute time" in s.reason
    r0, r1 = answer.ranks
    assert r1.compute_ms - r0.compute_ms == pytest.approx(2.04, abs=0.1)
    assert r0.comm_ms - r1.comm_ms == pytest.approx(2.0, abs=0.01)


def test_one_rank_of_a_world_of_two_names_the_missing_rank(tmp_path):
    loop = Loop()
    for n in range(5):
        loop.step(n, ("phaseprof::forward", 2_000, [("gemm", 1_000)]), ("phaseprof::backward", 3_000))
    write_trace(tmp_path / "job" / "rank0.1.pt.trace.json", loop.events,
                distributedInfo={"backend": "nccl", "rank": 0, "world_size": 2})
    answer = ranks("job", _workers(tmp_path / "job"))
    assert answer.world_size == 2 and answer.missing_ranks == [1]
    assert answer.note.startswith("rank 1 of world size 2 has no trace here") and "even" not in answer.note


def test_files_of_one_worker_are_not_ranks(tmp_path):
    answer = ranks("legacy", _workers(DATA / "cpu" / "legacy"))  # one run exported three ways, no rank
    assert len(answer.ranks) == 1 and len(answer.not_ranks) == 2 and "not ranks" in answer.note
    # two files of one recorded rank
    for name in ("a", "b"):
        shutil.copy(DATA / "gpu" / "hta_sampled_2rank" / "sampled_rank-0.json.gz", tmp_path / f"{name}.json.gz")
    answer = ranks("copies", _workers(tmp_path))
    assert [r.worker for r in answer.ranks] == ["a"] and answer.not_ranks == ["b"]


def test_ranks_without_gpu_stay_in_host_time(traces):
    answer = ranks("legacy", _workers(DATA / "cpu" / "legacy"))
    assert answer.measure == "host" and answer.world_size is None and answer.missing_ranks == []
    (r,) = answer.ranks
    assert r.step_ms == r.wall_ms and r.compute_ms >= 0


# --- the terminal's labels -----------------------------------------------------------------------------------


def test_the_terminal_names_each_gpu_measure(tmp_path):
    r, _ = gpu_report(DATA / "gpu" / "hta_nccl_16rank")
    console = Console(record=True, width=200, file=io.StringIO())
    render(r, console)
    text = console.export_text()
    for label in ("kernel time (summed over streams)", "GPU busy", "GPU window", "exposed communication",
                  "overlapped by compute", "host share", "GPU share", "GPU busy per stream"):
        assert label in text, label

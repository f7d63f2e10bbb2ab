"""Collectives (`/collectives`): sizes and bandwidths against the raw `record_param_comms` args, each
rank's compute / communication / overlap / other against the GPU measures, and the rank everyone
waits for, on real GPU traces and on two ranks built here."""

from __future__ import annotations

import gzip
import json

import msgspec
import numpy as np
import pytest

from phaseprof import cli
from phaseprof.plugin.analysis.collectives import bus_factor, collectives_answer
from phaseprof.plugin.analysis.span import COLLECTIVE_OP, analyze_trace
from phaseprof.plugin.analysis.worker import Worker, ms
from phaseprof.plugin.answers import CollectivesAnswer
from phaseprof.plugin.reading.decode import read_trace
from tests.logdir import settled, write_trace
from tests.test_plugin import BASE, make_app
from tests.tracebuilder import annotation, collective, kernel, launch, op, step, thread_names

#: Element sizes, written out here for the types these traces use.
SIZES = {"Float": 4, "BFloat16": 2, "Half": 2, "Long": 8, "Int": 4, "Byte": 1}
#: nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md), written out here.
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0}
STEPS = 3
ALL_REDUCE_NELEMS = 1_000_000
GATHER_IN, GATHER_OUT = 250_000, 500_000


def _analyse(path, worker: str) -> Worker:
    return Worker(worker, [analyze_trace(read_trace(str(path)), worker)])


def _rank_events(rank: int, seq: bool = True, skip: tuple[int, int] | None = None) -> list[dict]:
    """Rank ``rank`` of a two-rank job: per step a forward range with a 100 µs gemm and a backward
    range with a 200 µs gemm, an all_reduce of floats (rank 1 starts its kernel 30 µs after rank 0)
    and an all_gather of bfloat16 (rank 0 starts 10 µs after rank 1); both end together on both
    ranks, as a collective does. ``skip``: (step, call) this rank leaves out."""
    events = thread_names()
    corr = 0
    number = 0
    for s in range(STEPS):
        t0 = s * 10_000.0
        events += [step(s + 1, t0, 9_000), annotation("## forward ##", t0, 2_000),
                   annotation("## backward ##", t0 + 2_000, 6_000)]
        corr += 1
        events += [launch(t0 + 10, corr), kernel("volta_sgemm_128x64_nn", t0 + 50, 100, corr)]
        corr += 1
        events += [launch(t0 + 2_010, corr), kernel("volta_sgemm_128x64_nt", t0 + 2_050, 200, corr)]
        calls = [("all_reduce", "allreduce", "Float", ALL_REDUCE_NELEMS, ALL_REDUCE_NELEMS, 30.0 * rank, 400.0),
                 ("all_gather", "_allgather_base", "BFloat16", GATHER_IN, GATHER_OUT, 10.0 * (1 - rank), 150.0)]
        for k, (kind, name, dtype, n_in, n_out, late, end) in enumerate(calls):
            number += 1
            if skip == (s + 1, k):
                continue
            corr += 1
            at = t0 + 2_100 + 1_000 * k
            seq_arg = {"Seq": number} if seq else {}
            events += collective(kind, at, corr, at + 100 + late, end - late, Collective_name=name, dtype=dtype,
                                 In_msg_nelems=n_in, Out_msg_nelems=n_out, Group_size=2, Process_Group_Name="0",
                                 **seq_arg)
    return events


def _two_ranks(tmp_path, **kw) -> list[Worker]:
    out = []
    for rank in (0, 1):
        path = write_trace(tmp_path / f"rank{rank}.1.pt.trace.json", _rank_events(rank, **kw),
                           distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl"})
        out.append(_analyse(path, f"rank{rank}"))
    return out


def _raw_calls(events: list[dict]) -> list[tuple[str, int, int, float]]:
    """(kind, bytes, group size, kernel µs) of each record_param_comms, from the raw events alone."""
    kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") == "kernel"}
    launches = [e for e in events if e.get("cat") == "cuda_runtime"]
    out = []
    for e in events:
        if e["name"] != "record_param_comms":
            continue
        a = e["args"]
        under = [k for k in launches if e["ts"] <= k["ts"] <= e["ts"] + e["dur"]]
        us = sum(kernels[k["args"]["correlation"]]["dur"] for k in under)
        kind = {"allreduce": "all_reduce", "_allgather_base": "all_gather"}[a["Collective name"]]
        size = max(a["In msg nelems"], a["Out msg nelems"]) * SIZES[a["dtype"]]
        out.append((kind, size, a["Group size"], us))
    return out


def test_sizes_and_bandwidths_equal_the_raw_args(tmp_path):
    workers = _two_ranks(tmp_path)
    answer = collectives_answer("job", workers, None, None)
    for rank, w in enumerate(workers):
        raw = _raw_calls(_rank_events(rank))
        rows = {r.kind: r for r in answer.collectives if r.worker == w.name}
        assert sorted(rows) == ["all_gather", "all_reduce"]
        for kind in rows:
            calls = [c for c in raw if c[0] == kind]
            size, n = calls[0][1], calls[0][2]
            total = sum(c[3] for c in calls)
            algbw = size * len(calls) / (total / 1e6) / 1e9
            row = rows[kind]
            assert (row.calls, row.bytes, row.group_size, row.on_gpu) == (STEPS, size, n, True)
            assert row.time_ms == pytest.approx(total / 1000, abs=1e-3)
            assert row.algbw_gbps == pytest.approx(algbw, rel=1e-3)
            assert row.busbw_gbps == pytest.approx(algbw * FACTORS[kind](n), rel=1e-3)
    # the sizes themselves: floats and bfloat16, all_gather sized by its output
    assert {r.kind: r.bytes for r in answer.collectives} == {"all_reduce": 4 * ALL_REDUCE_NELEMS,
                                                            "all_gather": 2 * GATHER_OUT}


@pytest.mark.parametrize("seq", [True, False])
def test_the_last_rank_to_arrive_is_the_one_waited_for(tmp_path, seq):
    workers = _two_ranks(tmp_path, seq=seq)
    answer = collectives_answer("job", workers, None, None)
    assert answer.matched_by == ("seq" if seq else "order")
    assert answer.note.startswith(f"{2 * STEPS} collectives matched across 2 ranks")
    waited = {w.worker: w for w in answer.waited_for}
    # rank 1 is 30 µs late at each all_reduce, rank 0 10 µs late at each all_gather
    assert (waited["rank1"].matched, waited["rank1"].last, waited["rank1"].caused_ms) == (2 * STEPS, STEPS,
                                                                                          ms(30.0 * STEPS))
    assert (waited["rank0"].last, waited["rank0"].caused_ms) == (STEPS, ms(10.0 * STEPS))
    assert len(answer.waits) == 2 * STEPS
    first = answer.waits[0]  # the longest spread first
    assert (first.kind, first.last_worker, first.last_rank, first.spread_ms) == ("all_reduce", "rank1", 1, 0.03)
    assert first.arrivals_ms == {"rank0": 0.0, "rank1": 0.03}
    one = collectives_answer("job", workers, "rank1", 2)
    assert {r.worker for r in one.collectives} == {"rank1"} and {w.step for w in one.waits} == {2}
    assert [r.steps[0].step for r in one.ranks] == [2, 2]


def test_a_collective_one_rank_lacks_is_not_matched(tmp_path):
    """Rank 1 leaves out step 2's all_reduce: by sequence number the rest still meet one to one."""
    workers = []
    for rank in (0, 1):
        path = write_trace(tmp_path / f"rank{rank}.1.pt.trace.json",
                           _rank_events(rank, skip=(2, 0) if rank == 1 else None))
        workers.append(_analyse(path, f"rank{rank}"))
    answer = collectives_answer("job", workers, None, None)
    waited = {w.worker: w for w in answer.waited_for}
    assert waited["rank0"].matched == waited["rank1"].matched == 2 * STEPS - 1
    assert waited["rank1"].last == STEPS - 1
    assert answer.note.startswith(f"{2 * STEPS - 1} collectives matched")


def test_one_rank_matches_nothing(tmp_path):
    (w,) = _two_ranks(tmp_path)[:1]
    answer = collectives_answer("job", [w], None, None)
    assert (answer.matched_by, answer.waits, answer.waited_for) == ("none", [], [])


def test_ns_resolution_sizes_equal_the_raw_args(traces):
    """A one-rank V100 job: 45 collectives whose sizes its record_param_comms args give; world size 1
    launches no NCCL kernel, so each is timed by its host range."""
    (path,) = traces.files("gpu", "hta_ns_resolution")
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name")).startswith("ProfilerStep#")]
    expected: dict[tuple[str, int], list[float]] = {}
    for e in events:
        if e.get("name") != "record_param_comms" or not any(a <= e["ts"] < b for a, b in windows):
            continue
        a = e["args"]
        kind = {"allreduce": "all_reduce", "broadcast": "broadcast", "wait": "wait"}[a["Collective name"]]
        size = max(a["In msg nelems"], a["Out msg nelems"]) * SIZES[a["dtype"]]
        expected.setdefault((kind, size), []).append(e["dur"])
    answer = collectives_answer("gpu", [_analyse(path, "rank0")], None, None)
    got = {(r.kind, r.bytes): r for r in answer.collectives}
    assert sorted(got) == sorted(expected)
    assert sum(len(v) for v in expected.values()) == 45
    for key, durations in expected.items():
        row = got[key]
        assert (row.calls, row.group_size, row.on_gpu) == (len(durations), 1, False)
        assert row.time_ms == pytest.approx(sum(durations) / 1000, abs=1e-3)
        if key[1] and row.kind in FACTORS:
            algbw = key[1] * len(durations) / (sum(durations) / 1e6) / 1e9
            assert row.algbw_gbps == pytest.approx(algbw, rel=1e-3)
            assert row.busbw_gbps == pytest.approx(algbw * FACTORS[row.kind](1), abs=1e-3)


@pytest.mark.parametrize("folder", ["hta_nccl_16rank", "hta_sampled_2rank"])
def test_breakdown_is_the_gpu_measures(traces, folder):
    """Per step: compute and communication are the GPU measures', overlap is communication less its
    exposed part, other the GPU idle; compute plus exposed communication is GPU busy; the phases add
    up to the step."""
    path = traces.files("gpu", folder)[0]
    w = _analyse(path, "rank0")
    answer = collectives_answer("run", [w], None, None)
    (rank,) = answer.ranks
    assert rank.measure == "gpu" and [s.step for s in rank.steps] == w.numbers
    comm_seen = 0.0
    for row, s in enumerate(rank.steps):
        t = s.total
        assert t.compute_ms == ms(w.gpu_compute_us[row].sum())
        assert t.comm_ms == ms(w.comm_us[row].sum())
        assert t.overlap_ms == ms(w.comm_us[row].sum() - w.exposed_comm_us[row].sum())
        assert t.other_ms == ms(w.gpu_idle_us[row].sum())
        assert t.memory_ms == ms(w.exposed_memory_us[row].sum())
        busy = t.compute_ms + t.comm_ms - t.overlap_ms + t.memory_ms
        assert busy == pytest.approx(ms(w.gpu_busy_us[row].sum()), abs=3e-3)
        for field in ("compute_ms", "comm_ms", "overlap_ms", "other_ms", "memory_ms"):
            parts = sum(getattr(p, field) for p in s.phases.values())
            assert parts == pytest.approx(getattr(t, field), abs=1e-3 * (len(s.phases) + 1))
        comm_seen += t.comm_ms
    assert comm_seen > 0  # these jobs communicate
    # every call's kernel time is in the collective table, and it is communication
    table_kernel = sum(r.kernel_ms for r in answer.collectives)
    assert table_kernel > 0


def _ddp_logdir(root) -> None:
    """The two ranks as run ``ddp`` of the logdir ``root``, settled."""
    for rank in (0, 1):
        settled(write_trace(root / "ddp" / f"rank{rank}.1.pt.trace.json", _rank_events(rank),
                            distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl"}))


def test_route_answers_strictly_and_refuses_what_is_not_there(tmp_path):
    _ddp_logdir(tmp_path)
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        response = client.get(f"{BASE}/collectives?run=ddp")
        assert response.status_code == 200, response.get_data(as_text=True)
        answer = msgspec.json.decode(response.get_data(), type=CollectivesAnswer, strict=True)
        assert len(answer.ranks) == 2 and answer.matched_by == "seq" and len(answer.collectives) == 4
        one = msgspec.json.decode(client.get(f"{BASE}/collectives?run=ddp&step=2").get_data(),
                                  type=CollectivesAnswer)
        assert one.step == 2 and all(r.calls == 1 for r in one.collectives)
        assert client.get(f"{BASE}/collectives?run=ddp&step=9").status_code == 404
        assert client.get(f"{BASE}/collectives?run=ddp&worker=nope").status_code == 404
        assert client.get(f"{BASE}/collectives?run=ddp&step=x").status_code == 400
        assert client.get(f"{BASE}/collectives").status_code == 400
    finally:
        plugin._store.close()


def test_the_report_gives_the_routes_answer_as_json_and_as_tables(tmp_path, capsys, monkeypatch):
    """``phaseprof report --collectives``: each run's ``/collectives`` answer, whole in ``--json``,
    and in the terminal the table, each rank's mean per step and the ranks waited for."""
    _ddp_logdir(tmp_path)
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        routes = {at: msgspec.json.decode(client.get(f"{BASE}/collectives?run=ddp{query}").get_data())
                  for at, query in ((None, ""), (2, "&step=2"))}
    finally:
        plugin._store.close()
    for at, route in routes.items():
        argv = ["report", str(tmp_path), "--collectives", "--json"] + ([] if at is None else ["--step", str(at)])
        capsys.readouterr()
        assert cli.main(argv) == 0
        (run,) = json.loads(capsys.readouterr().out)["runs"]
        assert run["collectives"] == route
    capsys.readouterr()
    assert cli.main(["report", str(tmp_path)]) == 0
    assert "collectives" not in capsys.readouterr().out  # only when asked

    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["report", str(tmp_path), "--collectives"]) == 0
    lines = capsys.readouterr().out.splitlines()
    route = routes[None]
    cells = [[c.strip() for c in line.split("│")] for line in lines if "│" in line]
    table = [c for c in cells if len(c) == 11]  # worker, kind, group, ranks, size, calls, total, mean, max, bus, on
    by_time = sorted(route["collectives"], key=lambda r: -r["time_ms"])
    assert [(c[0], c[1]) for c in table] == [(r["worker"], r["kind"]) for r in by_time]  # most time first
    for c, r in zip(table, by_time):
        assert c[4] == {"all_reduce": "3.8 MiB", "all_gather": "976.6 KiB"}[r["kind"]]
        assert c[2:4] + c[5:] == [r["group"], str(r["group_size"]), str(r["calls"]), f"{r['time_ms']:,.2f}",
                                  f"{r['mean_ms']:,.2f}", f"{r['max_ms']:,.2f}", f"{r['busbw_gbps']:,.2f}", "GPU"]
    # worker, rank, measure, steps, compute, communication, overlap, memory, other
    means = [c for c in cells if len(c) == 9 and c[2] in ("gpu", "host")]
    assert [c[0] for c in means] == [r["worker"] for r in route["ranks"]]
    for c, rank in zip(means, route["ranks"]):
        n = len(rank["steps"])
        assert c[1:4] == [str(rank["rank"]), "gpu", str(n)]
        assert c[4:] == [f"{sum(s['total'][f] for s in rank['steps']) / n:,.2f}"
                         for f in ("compute_ms", "comm_ms", "overlap_ms", "memory_ms", "other_ms")]
    waited = [line.strip() for line in lines if "arrived last" in line]
    assert waited == [f"• rank 1 arrived last at {STEPS} of {2 * STEPS} collectives matched across ranks; the others "
                      f"waited {0.03 * STEPS:,.2f} ms for it",
                      f"• rank 0 arrived last at {STEPS} of {2 * STEPS} collectives matched across ranks; the others "
                      f"waited {0.01 * STEPS:,.2f} ms for it"]


@pytest.mark.parametrize("folder", ["hta_nccl_16rank", "hta_sampled_2rank"])
def test_kinds_come_from_the_backend_ops_where_the_args_do_not_say(traces, folder):
    """These traces record no "Collective name": each call is named by the ``nccl:…`` op inside its
    record_param_comms (or by that op alone, where older PyTorch wrote none around it)."""
    path = traces.files("gpu", folder)[0]
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name")).startswith("ProfilerStep#")]
    spelled = {"all_to_all": "all_to_all", "_reduce_scatter_base": "reduce_scatter", "all_reduce": "all_reduce",
               "_all_gather_base": "all_gather"}
    expected: dict[str, int] = {}
    for e in events:
        if str(e.get("name")).startswith("nccl:") and any(a <= e["ts"] < b for a, b in windows):
            kind = spelled[e["name"].removeprefix("nccl:")]
            expected[kind] = expected.get(kind, 0) + 1
    answer = collectives_answer("run", [_analyse(path, "rank0")], None, None)
    got: dict[str, int] = {}
    for r in answer.collectives:
        got[r.kind] = got.get(r.kind, 0) + r.calls
    got.pop("collective", None)  # record_param_comms with no backend op inside: nothing names them
    assert got == expected
    # every NCCL kernel launched in a step is some call's work
    kernels = {e["args"]["correlation"]: e["dur"] for e in events if e.get("cat") == "kernel" and "nccl" in e["name"]}
    launched = [e for e in events if e.get("cat") == "cuda_runtime" and e["args"].get("correlation") in kernels
                and any(a <= e["ts"] < b for a, b in windows)]
    nccl_us = sum(kernels[e["args"]["correlation"]] for e in launched)
    assert sum(r.kernel_ms for r in answer.collectives) == pytest.approx(nccl_us / 1000, abs=0.01)


def test_a_childless_collective_is_charged_with_no_work_but_its_own(tmp_path):
    # a step launches a 5 ms gemm under aten::mm (no collective above it) and ends in a barrier that
    # launches nothing, the last event of the trace in nesting order: the barrier owns no device
    # work (an owner of -1 once read the last event's row, giving the barrier the gemm's time and
    # start)
    events = thread_names() + [
        step(1, 1_000, 10_000), annotation("phaseprof::forward", 1_000, 8_000),
        op("aten::mm", 1_100, 50),
        launch(1_110, 1), kernel("volta_sgemm_128x64_nn", 1_200, 5_000, 1),
        op("record_param_comms", 10_900, 50, **{"Collective name": "barrier", "Group size": 2}),
    ]
    path = write_trace(tmp_path / "w.1.pt.trace.json", events)
    span = analyze_trace(read_trace(str(path)), "w")
    t = span.collectives
    (row,) = range(len(t.step))
    assert t.kinds[t.kind[row]] == "barrier"
    assert t.kernel_us[row] == 0.0 and np.isnan(t.device_start[row]) and np.isnan(t.device_end[row])
    assert t.host_ts[row] == 10_900.0


@pytest.mark.parametrize("kind, ranks, factor", [
    ("all_reduce", 4, 1.5), ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875), ("all_to_all", 2, 0.5),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send_recv", 2, 1.0), ("send", 2, 1.0), ("recv", 2, 1.0),
    ("barrier", 8, None), ("all_reduce", 0, None),
])
def test_bus_factors_are_nccl_tests_for_each_kind(kind, ranks, factor):
    assert bus_factor(kind, ranks) == factor


def test_a_collective_kernel_launched_outside_any_call_is_a_call_of_its_own(tmp_path):
    # no record_param_comms and no backend op around it: the kernel's name says what it is; its rank
    # and time are the row's, and the call before it (a recorded all_gather) keeps its own row
    events = thread_names() + [
        step(1, 1_000, 10_000), annotation("phaseprof::backward", 1_000, 8_000),
        op("record_param_comms", 1_100, 50, **{"Collective name": "all_gather", "Group size": 2,
                                               "dtype": "Float", "In msg nelems": 10, "Out msg nelems": 20}),
        launch(1_110, 1), kernel("ncclDevKernel_AllGather_RING_LL", 1_200, 300, 1, stream=20),
        launch(2_000, 2), kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 2_100, 700, 2, stream=20),
    ]
    path = write_trace(tmp_path / "w.1.pt.trace.json", events, distributedInfo={"rank": 1, "world_size": 2})
    w = _analyse(path, "w")
    rows = {r.kind: r for r in collectives_answer("run", [w], None, None).collectives}
    assert sorted(rows) == ["all_gather", "all_reduce"]
    alone = rows["all_reduce"]
    assert (alone.calls, alone.time_ms, alone.kernel_ms, alone.on_gpu, alone.rank) == (1, 0.7, 0.7, True, 1)
    assert alone.bytes is None and alone.group_size is None  # no recorded arguments
    recorded = rows["all_gather"]
    assert (recorded.calls, recorded.kernel_ms, recorded.rank, recorded.group_size) == (1, 0.3, 1, 2)


def test_a_cpu_ranks_communication_is_its_collective_ops_time(traces):
    # gloo on the CPU: no device time, so a rank's communication is the time in its collective ops
    # (host self time, at most the phase's), compute the rest of the phase's host time
    path = traces.files("cpu", "dist")[0]
    w = _analyse(path, "rank0")
    answer = collectives_answer("run", [w], None, None)
    (rank,) = answer.ranks
    assert rank.measure == "host" and not w.has_gpu
    rows = np.array(w.full().tolist(), np.int64)
    expected = np.minimum(w.collective_us(rows, w.phases, COLLECTIVE_OP.match), w.host_us[rows])
    assert expected.sum() > 0  # the run communicates
    for k, s in enumerate(rank.steps):
        assert s.total.comm_ms == ms(expected[k].sum())
        assert s.total.compute_ms == ms(w.host_us[rows[k]].sum() - expected[k].sum())

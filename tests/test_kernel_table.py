"""The kernel table (`/kernels`, `phaseprof report --kernels`): each kernel's launch figures against a
computation written here from the raw events of real GPU traces (gzip + json, plain Python)."""

from __future__ import annotations

import gzip
import io
import json
from bisect import bisect_right

import msgspec
import numpy as np
import pytest
from rich.console import Console

from phaseprof import cli
from phaseprof.cli.report import analyze, report
from phaseprof.cli.terminal import KERNEL_ROWS, render
from phaseprof.plugin import cache
from phaseprof.plugin.analysis.kernels import SORT_KEYS, uses_tensor_cores
from phaseprof.plugin.analysis.span import analyze_trace
from phaseprof.plugin.reading.decode import read_trace
from tests.hostile import write
from tests.tracebuilder import kernel, launch, op, step

GPU_TRACES = [("hta_alexnet_2stream", 0), ("hta_event_sync_3stream", 0), ("hta_nccl_16rank", 0),
              ("hta_ns_resolution", 0), ("hta_sampled_2rank", 0), ("hta_sampled_2rank", 1),
              ("kineto_resnet50_num_workers_0", 0)]
OCCUPANCY = "est. achieved occupancy %"
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "Runtime"}
KERNEL_CATEGORIES = {"kernel", "Kernel"}


def _raw_kernels(path) -> dict[str, list[dict]]:
    """The kernel events of a trace whose launch (the runtime call of the same correlation) starts
    inside a ProfilerStep window (the whole trace when it has none), by name."""
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    starts = [a for a, _ in windows]
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in RUNTIME_CATEGORIES and "correlation" in e.get("args", {})}
    out: dict[str, list[dict]] = {}
    for e in events:
        if e.get("cat") not in KERNEL_CATEGORIES or e.get("ph") != "X":
            continue
        at = launched.get(e["args"].get("correlation"))
        if at is None:
            continue
        k = bisect_right(starts, at) - 1
        if windows and (k < 0 or not at < windows[k][1]):
            continue
        out.setdefault(e["name"], []).append(e)
    return out


def _weighted(calls: list[dict], arg: str) -> float | None:
    """The mean of ``arg`` over the calls that record it, each weighted by its duration (an occupancy
    of 0 with a block or more on every SM is one Kineto could not compute: not recorded)."""
    known = [(c["dur"], c["args"][arg]) for c in calls if arg in c["args"]
             and not (arg == OCCUPANCY and c["args"][arg] == 0 and c["args"].get("blocks per SM", 0) >= 1)]
    weight = sum(d for d, _ in known)
    return sum(d * v for d, v in known) / weight if weight > 0 else None


def _kernel_rows(path) -> list[dict]:
    (run,) = analyze(str(path), kernels=True)["runs"]
    (worker,) = run["workers"]
    return [r for r in worker["kernels"]["kernels"] if r["kind"] == "kernel"]


@pytest.mark.parametrize(("scenario", "index"), GPU_TRACES)
def test_launch_figures_equal_the_raw_events(traces, scenario, index):
    """Per kernel name: calls, blocks per SM and occupancy (duration-weighted means over the calls
    that record them) as computed here from the trace's JSON; grid, block, registers and shared
    memory those of one of its longest calls."""
    path = traces.files("gpu", scenario)[index]
    raw = _raw_kernels(path)
    rows = _kernel_rows(path)
    assert {r["name"] for r in rows} == set(raw)
    recorded = 0
    for r in rows:
        calls = raw[r["name"]]
        assert r["calls"] == len(calls), r["name"]
        for field, arg in (("blocks_per_sm", "blocks per SM"), ("occupancy", "est. achieved occupancy %")):
            expected = _weighted(calls, arg)
            if expected is None:
                assert r[field] is None, (r["name"], field)
            else:
                assert r[field] == pytest.approx(expected, rel=1e-6, abs=0.006), (r["name"], field)
                recorded += 1
        longest = max(c["dur"] for c in calls)
        launches = [(c["args"].get("grid"), c["args"].get("block"), c["args"].get("registers per thread"),
                     c["args"].get("shared memory")) for c in calls if c["dur"] == longest]
        assert (r["grid"], r["block"], r["registers"], r["shared_memory"]) in launches, r["name"]
        assert r["max_us"] == pytest.approx(longest, abs=1e-3)
    assert recorded  # the trace records launches: the figures above were compared, not skipped


def test_copies_and_sets_have_no_launch_figures(traces):
    (run,) = analyze(str(traces.files("gpu", "hta_alexnet_2stream")[0]), kernels=True)["runs"]
    others = [r for r in run["workers"][0]["kernels"]["kernels"] if r["kind"] != "kernel"]
    assert {r["kind"] for r in others} == {"memcpy", "memset"}
    for r in others:
        assert [r[k] for k in ("blocks_per_sm", "occupancy", "grid", "block", "registers", "shared_memory",
                               "tensor_cores")] == [None] * 7


@pytest.mark.parametrize(("name", "tensor_cores"), [
    ("volta_h884gemm_64x64_ldg8_nn", True),
    ("turing_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", True),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", True),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", True),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align1>(cutlass_80_tensorop_s1688gemm_"
     "64x64_16x6_tn_align1::Params)", True),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", True),
    ("void wgmma_kernel<128>()", True),
    ("ampere_sgemm_32x32_sliced1x4_tn", False),
    ("volta_sgemm_128x64_nn", False),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4", False),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(cutlass_80_simt_sgemm_128x128_8x4_nn_"
     "align1::Params)", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half> >", False),
    ("triton_per_fused_native_layer_norm_0", False),
])
def test_tensor_cores_are_read_from_the_kernel_name(name, tensor_cores):
    assert uses_tensor_cores(name) is tensor_cores


def test_the_table_marks_tensor_core_kernels_of_a_real_trace(traces):
    rows = {r["name"]: r for r in _kernel_rows(traces.files("gpu", "hta_alexnet_2stream")[0])}
    tf32 = [n for n in rows if n.startswith("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32")]
    assert tf32 and all(rows[n]["tensor_cores"] for n in tf32)
    assert rows["ampere_sgemm_32x32_sliced1x4_tn"]["tensor_cores"] is False


def test_sort_keys_of_the_command_are_those_of_the_analysis():
    assert tuple(SORT_KEYS) == cli.KERNEL_SORT_KEYS


def _run_cli(capsys, *argv) -> str:
    capsys.readouterr()
    assert cli.main(["report", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("by", ["occupancy", "blocks-per-sm", "calls", "name"])
def test_json_kernels_follow_the_sort(traces, capsys, by):
    """``report --kernels --json --sort``: each worker's kernels, ordered largest first (names in
    order), rows without the figure (copies, sets) last."""
    out = _run_cli(capsys, str(traces.files("gpu", "hta_alexnet_2stream")[0]), "--kernels", "--json", "--sort", by)
    (worker,) = msgspec.json.decode(out)["runs"][0]["workers"]
    rows = worker["kernels"]["kernels"]
    field = SORT_KEYS[by]
    values = [r[field] for r in rows]
    known = [v for v in values if v is not None]
    assert known == (sorted(known) if by == "name" else sorted(known, reverse=True))
    assert values[:len(known)] == known  # the rows without the figure come last
    assert len(set(known)) > 1


def test_json_without_kernels_leaves_them_out(traces, capsys):
    out = _run_cli(capsys, str(traces.files("gpu", "hta_alexnet_2stream")[0]), "--json")
    assert "kernels" not in msgspec.json.decode(out)["runs"][0]["workers"][0]


def test_the_terminal_table_shows_each_kernels_launch(traces):
    path = traces.files("gpu", "hta_alexnet_2stream")[0]
    r = report(str(path), kernels=True)
    text = _rendered(r)
    assert "blocks/SM" in text and "occup. %" in text
    (w,) = r.runs[0].workers
    top = w.kernels.kernels[1]  # the longest kernel, after the pageable copy
    assert top.name == "ampere_sgemm_32x32_sliced1x4_tn"
    line = next(line for line in text.splitlines() if line.startswith(top.name))
    for cell in (f"{top.blocks_per_sm:,.2f}", f"{top.occupancy:,.2f}", "128×4×1", "128×1×1", str(top.registers),
                 f"{top.shared_memory:,}", "aten::addmm", "forward"):
        assert cell in line, (cell, line)


def test_a_long_table_shows_its_first_rows_and_counts_the_rest(traces):
    r = report(str(traces.files("gpu", "hta_nccl_16rank")[0]), kernels=True)
    (w,) = r.runs[0].workers
    hidden = len(w.kernels.kernels) - KERNEL_ROWS
    assert hidden > 0
    lines = _rendered(r).splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("kernels ·"))
    more = lines.index(f"  … {hidden:,} more kernels (--json lists them all)")
    assert sum("│" in line for line in lines[title:more]) == KERNEL_ROWS


def test_the_terminal_escapes_kernel_names(tmp_path):
    """A kernel name holding an escape sequence is shown escaped, never sent to the terminal."""
    name = "evil\x1b[2J\x1b]0;owned\x07_kernel"
    events = [step(1, 0, 1000), op("aten::mm", 10, 100), launch(20, 5), kernel(name, 40, 50, 5)]
    path = write(tmp_path / "w.1.pt.trace.json", json.dumps({"traceEvents": events}).encode())
    text = _rendered(report(str(path), kernels=True))
    assert "\x1b" not in text and "\x07" not in text
    assert "evil\\x1b[2J\\x1b]0;owned\\x07_kernel" in text


def _rendered(r) -> str:
    out = io.StringIO()
    render(r, Console(file=out, width=400, color_system=None))
    return out.getvalue()


def test_a_cached_analysis_with_impossible_launch_figures_is_not_trusted(traces):
    """The cache's consistency check covers the launch columns: occupancy above 100%, a weight
    beyond the time it weighs, a negative launch."""
    a = analyze_trace(read_trace(str(traces.files("gpu", "hta_alexnet_2stream")[0])), worker="w")
    assert cache.consistent(a)
    k = a.kernels
    for column, forge in (("occupancy_us", lambda x, k: 101 * k.occupancy_weight_us + 1),
                          ("occupancy_weight_us", lambda x, k: k.us * 2 + 1),
                          ("blocks_per_sm_us", lambda x, k: x - 1e6),
                          ("grid", lambda x, k: np.full_like(x, -7)),
                          ("registers", lambda x, k: np.full_like(x, -2))):
        saved = getattr(k, column)
        setattr(k, column, forge(saved, k))
        assert not cache.consistent(a), column
        setattr(k, column, saved)
    assert cache.consistent(a)


def test_the_route_serves_the_same_table_as_the_report(tmp_path, traces):
    """``/kernels`` over one step and over every step: the launch figures of the report's table."""
    from tests.logdir import settled
    from tests.test_plugin import BASE, make_app

    run = tmp_path / "logdir" / "v100"
    run.mkdir(parents=True)
    (source,) = traces.files("gpu", "hta_ns_resolution")
    target = run / source.name
    target.write_bytes(source.read_bytes())
    settled(target)
    plugin, client = make_app(tmp_path / "logdir")
    try:
        assert plugin._store.wait(180)
        expected = analyze(str(target), kernels=True)["runs"][0]["workers"][0]
        step = expected["steps"][0]["step"]
        for params, want in (({"run": "v100"}, expected["kernels"]),
                             ({"run": "v100", "step": step},
                              analyze(str(target), step=step, kernels=True)["runs"][0]["workers"][0]["kernels"])):
            r = client.get(f"{BASE}/kernels", query_string=params)
            assert r.status_code == 200, r.data
            got = json.loads(r.data)
            assert got["kernels"] == want["kernels"] and got["steps"] == want["steps"]
            assert any(k["occupancy"] is not None and k["grid"] for k in got["kernels"])
    finally:
        plugin._store.close()


def test_a_kernel_whose_trace_gives_no_occupancy_shows_none_not_zero(traces):
    # Kineto writes 0% for the cutlass gemms of this A100 trace (2.4 to 57 blocks per SM, up to 144 KiB
    # of dynamic shared memory: its occupancy calculator gave up); a kernel of a single block on
    # 108 SMs (0.009 blocks per SM) may well be at 0%: that 0 is kept
    path = traces.files("gpu", "hta_sampled_2rank")[0]
    rows = {r["name"]: r for r in _kernel_rows(path)}
    unknown = [n for n, calls in _raw_kernels(path).items()
               if all(c["args"].get(OCCUPANCY) == 0 and c["args"]["blocks per SM"] >= 1 for c in calls)]
    assert len(unknown) >= 5 and all(n.startswith("void cutlass::Kernel<") for n in unknown)
    assert all(rows[n]["occupancy"] is None and rows[n]["blocks_per_sm"] >= 1 for n in unknown)
    assert any(r["occupancy"] == 0 and r["blocks_per_sm"] < 1 for r in rows.values())

"""The tab's pictures and figures on real GPU traces, checked against the traces themselves.

A logdir of its own (no demo runs): the V100 trace (``v100``), the two-rank A100 job (``ranks``),
one rank of a 16-rank NCCL job with kernels on five streams (``nccl``),
the two 2021 ResNet-50 traces of one model as two runs (``resnet_a``, ``resnet_b``: their memory
has no allocation baseline), a built run with one slow step among eight (``outlier``), one rank of
the two-rank job (``rank0``), the V100 trace under two names (``exports``: one worker, not two ranks)
a run whose first step compiled for 60 ms among 10 ms steps (``compiled``) and the first ResNet-50
trace with a step of one-off setup (4.8 s) put before its steps (``warmup``).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.logdir import settled, write_trace
from tests.test_kept_apart import compile_trace
from tests.test_warmup import _resnet_with_a_warmup_step
from tests.tracebuilder import annotation, kernel, launch, op, step, thread_names

from .tab import ms

pytestmark = pytest.mark.browser

#: Where the swimlane may join two busy intervals of a stream (plugin/analysis/span.py): the drawn
#: busy time stays within 1% of the trace's.
BUSY_SLACK = 0.01
#: Device events, by the category each trace schema gives them.
DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}


def _outlier_run(root: Path) -> None:
    """Eight steps of about 1 ms, the sixth 3.3 ms."""
    events = thread_names()
    for n, dur in enumerate((1_000, 1_100, 1_050, 1_020, 1_080, 3_300, 1_040, 1_060), start=1):
        t = n * 10_000
        events += [step(n, t, dur), annotation("phaseprof::forward", t + 50, dur - 100),
                   op("aten::mm", t + 60, dur - 200), launch(t + 70, corr=n),
                   kernel("volta_sgemm_128x64_nn", t + 100, dur / 2, corr=n)]
    write_trace(root / "outlier" / "w.1.pt.trace.json", events)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    folders = {"v100": ("gpu", "hta_ns_resolution"), "ranks": ("gpu", "hta_sampled_2rank"),
               "nccl": ("gpu", "hta_nccl_16rank")}
    for run, source in folders.items():
        (root / run).mkdir()
        for f in traces.files(*source):
            shutil.copy(f, root / run / f.name)
    for run, f in zip(("resnet_a", "resnet_b"), traces.files("gpu", "kineto_resnet50_num_workers_0")):
        (root / run).mkdir()
        shutil.copy(f, root / run / f.name)
    _outlier_run(root)
    compile_trace(root / "compiled" / "w.1.pt.trace.json", compiling=(1,))
    (root / "warmup").mkdir()
    _resnet_with_a_warmup_step(traces, root / "warmup")
    (root / "rank0").mkdir()  # one rank of the two-rank job
    shutil.copy(traces.files("gpu", "hta_sampled_2rank")[0], root / "rank0")
    (root / "exports").mkdir()  # one worker's trace under two names, as two exports of one run
    v100 = traces.files("gpu", "hta_ns_resolution")[0]
    shutil.copy(v100, root / "exports" / v100.name)
    shutil.copy(v100, root / "exports" / "copy.pt.trace.json.gz")
    for f in root.rglob("*"):
        settled(f)
    return root


def _trace_file(logdir: Path, run: str) -> Path:
    (found,) = sorted((logdir / run).glob("*.json*"))
    return found


# -- the swimlane draws busy intervals ---------------------------------------------------------------


def busy_intervals(path: Path, step_number: int) -> tuple[float, dict[str, list[tuple[float, float]]]]:
    """From the raw trace, apart from the analysis: step ``step_number``'s window (ProfilerStep#N),
    and per stream the union of the device events launched in it (by correlation to a runtime call
    inside the window), in ms from the step's start."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    (window,) = [e for e in events if e.get("ph") == "X" and e.get("name") == f"ProfilerStep#{step_number}"]
    t0, t1 = float(window["ts"]), float(window["ts"]) + float(window["dur"])
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") in RUNTIME_CATS and "correlation" in e.get("args", {}) and t0 <= e["ts"] < t1}
    per_stream: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") in DEVICE_CATS and e.get("ph") == "X" and e["args"].get("correlation") in launched:
            lane = f"GPU {e['args'].get('device', 0)} stream {e['args']['stream']}"
            per_stream.setdefault(lane, []).append(((e["ts"] - t0) / 1000, (e["ts"] + e["dur"] - t0) / 1000))
    union = {}
    for lane, spans in per_stream.items():
        merged: list[list[float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        union[lane] = [(a, b) for a, b in merged]
    return (t1 - t0) / 1000, union


def length(spans) -> float:
    return sum(b - a for a, b in spans)


@pytest.mark.parametrize("run", ["v100", "resnet_a", "nccl"])
def test_the_swimlanes_bands_are_each_streams_busy_intervals(tab, logdir, run):
    rows = tab.api("steps", run=run)["steps"]
    number = rows[len(rows) // 2]["step"]
    wall, truth = busy_intervals(_trace_file(logdir, run), number)
    detail = tab.api("step", run=run, step=number)  # the answer the swimlane draws
    assert detail["wall_ms"] == pytest.approx(wall, abs=0.002)
    labels = detail["lanes"]["labels"]
    assert set(truth) <= set(labels)
    for lane, spans in truth.items():
        k = labels.index(lane)
        bands = sorted((a, b) for lane_of, a, b, _ in detail["lanes"]["bands"] if lane_of == k)
        # every busy interval of the trace is drawn ...
        for a, b in spans:
            assert any(x <= a + 0.0002 and b - 0.0002 <= y for x, y in bands), (lane, a, b)
        # ... and the bands are busy no longer than the trace (bar gaps under a pixel, within 1%)
        busy = length(spans)
        assert busy - 0.001 * len(spans) <= length(bands) <= busy * (1 + BUSY_SLACK), (lane, length(bands), busy)
    # What the page drew: along each stream's lane, the painted pixels are those of its busy intervals.
    tab.open(view="step", run=run, step=number)
    drawn = swimlane_pixels(tab, len(labels))
    lane0 = drawn[0]
    x0, x1 = lane0[0], lane0[-1] + 1  # the loop's thread is busy over the whole step: 0 to wall ms
    px_per_ms = (x1 - x0) / detail["wall_ms"]
    for lane, spans in truth.items():
        painted = set(drawn[labels.index(lane)])
        expected = set()
        for a, b in spans:
            left = x0 + a * px_per_ms
            expected.update(range(int(left), max(int(np.ceil(x0 + b * px_per_ms)), int(left) + 1)))
        # a pixel either side: a column a sub-pixel gap crosses is painted pale, or not at all
        extra = [x for x in painted if not expected & {x - 1, x, x + 1}]
        missing = [x for x in expected if not painted & {x - 1, x, x + 1}]
        assert len(extra) + len(missing) <= 0.01 * len(expected) + 3, (lane, extra[:20], missing[:20])
    tab.screenshot(f"gpu-swimlane-{run}")


def swimlane_pixels(tab, lanes: int) -> list[list[int]]:
    """Per lane of the step's swimlane, the x (CSS px) of the columns painted along its middle. The
    lanes are found by their dividing lines (grey rows across the plot)."""
    frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
    tab.card("Timeline of the step").locator("canvas").first.wait_for()
    found = frame.evaluate(JS_SWIMLANE_PIXELS, lanes)
    assert len(found) == lanes, f"found {len(found)} lanes on the canvas, not {lanes}"
    return found


JS_SWIMLANE_PIXELS = """(lanes) => {
    const card = [...document.querySelectorAll('.card')]
        .find((c) => c.querySelector('h3')?.textContent === 'Timeline of the step');
    const canvas = card.querySelector('canvas');
    const ratio = canvas.width / canvas.clientWidth;
    const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    const at = (x, y) => data.slice(4 * (y * canvas.width + x), 4 * (y * canvas.width + x) + 4);
    const grey = ([r, g, b, a]) => a > 200 && Math.max(r, g, b) - Math.min(r, g, b) < 16 && r < 245;
    const colour = ([r, g, b, a]) => a > 200 && Math.max(r, g, b) - Math.min(r, g, b) >= 16;
    // a phase's band: a colour, or a grey darker than the axis (#bdbdbd) and grid lines (#eeeeee)
    // (a band a pixel wide at a fractional x is painted half-transparent over two columns)
    const band = ([r, g, b, a]) => a > 60 && (Math.max(r, g, b) - Math.min(r, g, b) >= 16 || r < 170);
    const axisGrey = ([r, g, b, a]) =>
        a > 200 && Math.max(Math.abs(r - 189), Math.abs(g - 189), Math.abs(b - 189)) < 10;
    // dividing lines: rows grey across most of the plot's right part (left of it: the lane names)
    const from = Math.floor(canvas.width * 0.2), to = Math.floor(canvas.width * 0.97);
    const lines = [];
    for (let y = 0; y < canvas.height; y += 1) {
        let n = 0;
        for (let x = from; x < to; x += 1) if (grey(at(x, y)) || colour(at(x, y))) n += 1;
        let g = 0;
        for (let x = from; x < to; x += 1) if (grey(at(x, y))) g += 1;
        if (g > 0.3 * (to - from) && n > 0.9 * (to - from)) {
            if (lines.length && y - lines[lines.length - 1][1] <= 1) lines[lines.length - 1][1] = y;
            else lines.push([y, y]);
        }
    }
    // lanes are evenly spaced above the axis (the last line); the top one may have no line above it
    if (lines.length < 2) return [];
    const mid = lines.map(([a, b]) => (a + b) / 2);
    const gaps = mid.slice(1).map((y, k) => y - mid[k]).sort((a, b) => a - b);
    const height = gaps[Math.floor(gaps.length / 2)];
    const centre = (k) => Math.round(mid[mid.length - 1] - (lanes - k - 0.5) * height);
    // the plot's left edge: the lanes' axis, a column of #bdbdbd down the plot
    let left = 0, most = 0;
    for (let x = 0; x < canvas.width / 2; x += 1) {
        let n = 0;
        for (let y = 0; y < canvas.height; y += 1) if (axisGrey(at(x, y))) n += 1;
        if (n > most) [left, most] = [x, n];
    }
    const out = [];
    for (let k = 0; k < lanes; k += 1) {
        const y = centre(k);
        const xs = new Set();
        for (let x = left + 1; x < canvas.width; x += 1) if (band(at(x, y))) xs.add(Math.floor(x / ratio));
        out.push([...xs].sort((a, b) => a - b));
    }
    return out;
}"""


# -- shares -------------------------------------------------------------------------------------------

PERCENT = re.compile(r"(?<![+\-−\w.])(\d+(?:\.\d+)?)%")


def shares_shown(text: str) -> list[float]:
    """Every unsigned percentage in ``text`` (a signed one is a change, not a share)."""
    return [float(m.group(1)) for m in PERCENT.finditer(text)]


def share_columns(tab) -> list[tuple[str, float]]:
    """Per table column headed "…share…": the sum of its cells, in %."""
    frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
    return frame.evaluate("""() => {
        const out = [];
        for (const table of document.querySelectorAll('.pane table')) {
            const heads = [...table.querySelectorAll('thead th')].map((th) => th.textContent.trim());
            heads.forEach((head, k) => {
                if (!/share/i.test(head)) return;
                let sum = 0;
                for (const tr of table.querySelectorAll('tbody tr')) {
                    const cell = tr.children[k];
                    const m = cell && cell.textContent.match(/^(\\d+(?:\\.\\d+)?)%$/);
                    if (m) sum += Number(m[1]);
                }
                out.push([head, sum]);
            });
        }
        return out;
    }""")


#: A finding's cost: "<phase> costs [the most] … GPU|host time … (N% …": the share of one total.
COST = re.compile(r"\bcosts\b.*?\b(GPU|host)\b.*?\((\d+(?:\.\d+)?)%")


def cost_shares(findings: list[str]) -> dict[str, float]:
    """The phases' shares the findings claim, added up per measure (GPU or host time)."""
    out: dict[str, float] = {}
    for text in findings:
        m = COST.search(text)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


@pytest.mark.parametrize("run", ["v100", "ranks", "resnet_a", "nccl"])
def test_no_share_above_100_percent_in_any_view(tab, run):
    steps = tab.api("steps", run=run)
    worker = steps["worker"]
    slowest = steps["summary"]["slowest"]["step"]
    views = [dict(view="overview"), dict(view="overview", device="gpu"), dict(view="step", step=slowest),
             dict(view="operators"), dict(view="operators", device="gpu"), dict(view="ranks"),
             dict(view="compare", device="gpu", a_run=run, a_worker=worker, b_run=run, b_worker=worker,
                  b_step=slowest)]
    for selection in views:
        tab.open(run=run, **selection)
        text = tab.text()
        too_much = [s for s in shares_shown(text) if s > 100.0]
        assert not too_much, (selection, too_much, [line for line in text.splitlines() if "%" in line][:12])
        for head, total in share_columns(tab):
            # a column of shares of one total (the tables show every row: none is cut here)
            assert total <= 100.5, (selection, head, total)
        if selection["view"] == "overview":
            findings = tab.card("Findings").locator(".finding-text").all_inner_texts()
            for measure, total in cost_shares(findings).items():
                assert total <= 100.5, (measure, total, findings)
    tab.screenshot(f"gpu-shares-{run}")


# -- memory without a baseline -------------------------------------------------------------------------


def test_the_memory_view_says_when_the_trace_has_no_allocation_baseline(tab):
    number = tab.api("steps", run="resnet_a")["steps"][0]["step"]
    memory = tab.api("memory", run="resnet_a", step=number)
    assert memory["devices"] and not any(d["baseline"] for d in memory["devices"])
    tab.open(view="step", run="resnet_a", step=number)
    card = tab.card("Memory over the step")
    card.locator(".chart").wait_for()
    note = " ".join(card.inner_text().split())
    assert "No allocation baseline for cpu, cuda:0:" in note
    assert "what was allocated before profiling began" in note and "not in this curve nor in its peak" in note
    assert tab.figure("Peak cuda:0 (since profiling began)")
    tab.screenshot("gpu-memory-no-baseline")


# -- kernels -----------------------------------------------------------------------------------------


def test_kernel_names_are_short_and_distinct_with_the_full_name_on_hover_and_in_the_csv(tab):
    number = tab.api("steps", run="v100")["steps"][0]["step"]
    kernels = tab.api("kernels", run="v100", step=number)["kernels"]
    tab.open(view="step", run="v100", step=number)
    card = tab.card(f"Kernels of step {number}")
    card.get_by_role("button", name=re.compile("Show all")).click()
    cells = card.locator("tbody tr td:first-child .op")
    shown = [" ".join(t.split()) for t in cells.all_inner_texts()]
    full = [cells.nth(k).get_attribute("title") for k in range(cells.count())]
    assert sorted(full) == sorted({k["name"] for k in kernels}) and len(full) == len(set(full))
    assert len(set(shown)) == len(shown)  # rows stay distinct
    long = [(s, f) for s, f in zip(shown, full) if len(f) > 120]
    assert long and all(len(s) < len(f) / 2 for s, f in long)  # templated names lose their plumbing
    with tab.page.expect_download() as download:
        card.get_by_role("button", name="CSV").click()
    csv = Path(download.value.path()).read_text()
    assert all(f in csv for f, _ in zip(full, range(5)) if "," not in f and '"' not in f)


# -- outliers: one definition, everywhere --------------------------------------------------------------


@pytest.mark.parametrize("run", ["outlier", "v100"])
def test_outlier_badges_the_slowest_step_card_and_the_findings_agree(tab, run):
    # outlier: one step three times the others; v100: two short first steps beside three even ones
    data = tab.api("steps", run=run)
    summary = data["summary"]
    outliers = summary["outliers"] or []
    if run == "outlier":
        assert outliers == [6]
    tab.open(view="overview", run=run)
    text = tab.text()
    flagged = tab.card("Every profiled step").locator("tbody tr.flagged td:first-child").all_inner_texts()
    assert sorted(int(s) for s in flagged) == sorted(outliers)  # the badges are the backend's outliers
    slowest = " ".join(tab.card("Slowest step").inner_text().split())
    if summary["slowest"]["step"] in outliers:
        assert f"Step {summary['slowest']['step']} took" in slowest and "beyond the steps' noise" in slowest
    else:
        assert "beyond the steps' noise" not in slowest
    if outliers:
        assert "no step stands out" not in text.lower()
    # findings about slow or fast steps name exactly the outliers
    named = set()
    for f in summary["findings"]:
        if re.fullmatch(r"(slow|fast)-steps?|outliers?", f["kind"]):
            named |= set(f["evidence"].get("steps") or [f["evidence"]["step"]])
    assert named == set(outliers), (named, outliers, [f["text"] for f in summary["findings"]])
    tab.screenshot(f"gpu-outliers-{run}")


# -- Compare never pairs runs of different models ---------------------------------------------------------


def test_compare_opened_from_operators_pairs_runs_of_the_same_model_only(tab):
    tab.open(view="compare", run="resnet_a")
    chosen = tab.selections()
    assert (chosen["a_run"], chosen["b_run"]) == ("resnet_a", "resnet_b")
    tab.open(view="compare", run="v100")  # exports holds the same trace
    assert (tab.selections()["a_run"], tab.selections()["b_run"]) == ("v100", "exports")
    tab.open(view="compare", run="outlier", op="aten::mm")  # no run of its model here: two of its own steps
    chosen = tab.selections()
    assert chosen["a_run"] == chosen["b_run"] == "outlier" and chosen["a_step"] != chosen["b_step"]


def test_compare_in_gpu_time_ranks_ops_by_their_gpu_change(tab):
    tab.open(view="compare", device="gpu", a_run="resnet_a", b_run="resnet_b")
    result = tab.api("compare", run_a="resnet_a", run_b="resnet_b", device="gpu")
    changes = [abs(o["delta_self_gpu_ms"]) for o in result["ops"]]
    assert changes == sorted(changes, reverse=True)
    first = tab.rows("Ops that changed most")[0]
    assert first[1] == result["ops"][0]["name"]


# -- ranks --------------------------------------------------------------------------------------------


def test_ranks_say_which_ranks_of_the_world_are_here_and_compare_in_one_measure(tab):
    data = tab.api("ranks", run="rank0")
    assert data["world_size"] == 128 and data["missing_ranks"] == list(range(1, 128))
    tab.open(view="ranks", run="rank0")
    text = " ".join(tab.text().split())
    assert "Rank 0 of world size 128. No trace of ranks 1–127: they are not in this run" in text

    tab.open(view="ranks", run="ranks")
    data = tab.api("ranks", run="ranks")
    assert data["measure"] == "gpu"
    text = " ".join(tab.text().split())
    assert "Ranks 0, 1 of world size 128. No trace of ranks 2–127" in text
    header = tab.card("Ranks (").locator("thead").inner_text().replace("\t", "\n").split("\n")
    header = [h.strip() for h in header if h.strip()]
    # GPU time only: no host step or host phase columns beside the GPU ones
    assert header[:7] == ["Rank", "Worker", "Steps", "GPU busy ms", "Communication ms", "Exposed comm ms",
                          "Compute ms"]
    assert header[7:] == [f"{p} compute" for p in data["phases"]]
    rows = tab.rows("Ranks (")
    assert [r[3] for r in rows] == [ms(r["step_ms"]) for r in data["ranks"]]
    assert not any(cell.startswith("-") for r in rows for cell in r[3:])  # compute is never negative
    tab.screenshot("gpu-ranks")

    tab.open(view="ranks", run="exports")
    data = tab.api("ranks", run="exports")
    assert len(data["ranks"]) == 1 and len(data["not_ranks"]) == 1
    assert "Left out as other files of a worker already listed" in tab.text()
    assert data["not_ranks"][0] in tab.text()


# -- the bar chart's scale ----------------------------------------------------------------------------

FORWARD_RGB = (66, 165, 245)  # forward's colour in the light theme (frontend/src/phase_colours.ts)


@pytest.mark.parametrize("run, step, why", [("compiled", 1, "compiled"), ("warmup", 4, "warm-up")])
def test_the_bar_charts_scale_leaves_compiling_and_warm_up_steps_out(tab, run, step, why):
    summary = tab.api("steps", run=run)["summary"]
    apart = sorted(set(summary.get("compiling_steps") or []) | set(summary.get("warmup_steps") or []))
    assert apart == [step]
    tab.open(view="overview", run=run)
    card = tab.card("Phases per step")
    note = " ".join(card.inner_text().split())
    assert "drawn but left out of the chart’s scale" in note and f"Step {step} ({why})" in note
    flagged = tab.card("Every profiled step").locator("tbody tr", has_text=why)
    assert flagged.count() == 1 and flagged.locator("td").first.inner_text() == str(step)
    # The 10 ms steps fill the chart (the 70 ms step is cut at the top), rather than a seventh of it.
    frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
    rows = frame.evaluate("""([r, g, b]) => {
        const canvas = document.querySelector('.view-overview .chart canvas');
        const ratio = canvas.width / canvas.clientWidth;
        const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        const rows = new Set();
        for (let i = 0; i < data.length; i += 4) {
            const near = Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 12;
            if (near && data[i + 3] > 200) rows.add(Math.floor(i / 4 / canvas.width / ratio));
        }
        return [rows.size, canvas.clientHeight];
    }""", list(FORWARD_RGB))
    forward_rows, height = rows
    # forward is a fifth to a third of the steps kept: it fills over a seventh of the plot when they
    # scale it, where a step 7 (compiled) or 28 (warm-up) times as long would leave it a few pixels
    assert forward_rows > 0.15 * height, rows
    tab.screenshot(f"gpu-chart-scale-{run}")


# -- a DDP step's phases show their communication --------------------------------------------------------


def _headers(tab, card_title: str) -> list[str]:
    return [h.strip() for h in tab.card(card_title).locator("table").first.locator("thead th").all_inner_texts()]


def test_a_ddp_steps_phase_table_has_communication_columns(tab):
    # hta_nccl_16rank is a rank of a 16-rank NCCL job (all-reduce, all-to-all, all-gather): per phase,
    # compute, communication and exposed communication, as the step's answer gives them
    number = tab.api("steps", run="nccl")["summary"]["slowest"]["step"]
    detail = tab.api("step", run="nccl", step=number)
    assert detail["gpu_time"]["comm_ms"] > 0
    tab.open(run="nccl", view="step", step=number)
    title = f"Phases of step {number}"
    heads = _headers(tab, title)
    assert {"Compute ms", "Comm ms", "Exposed comm ms"} <= set(heads), heads
    comm = heads.index("Comm ms")
    shown = {row[0].split("\n")[0]: row for row in tab.rows(title)}
    assert any(float(row[comm].replace(",", "")) > 0 for row in shown.values() if row[comm] not in ("", "—"))
    for phase, t in detail["phases"].items():
        row = next((r for name, r in shown.items() if name.lower().startswith(phase.lower())), None)
        if row is not None and t["comm_ms"]:
            assert float(row[comm].replace(",", "")) == pytest.approx(t["comm_ms"], abs=0.01), phase
    # a step without communication keeps the table as it was
    plain = tab.api("steps", run="resnet_a")["steps"][0]["step"]
    tab.open(run="resnet_a", view="step", step=plain)
    assert "Comm ms" not in _headers(tab, f"Phases of step {plain}")

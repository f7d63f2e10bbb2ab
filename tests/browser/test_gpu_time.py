"""The GPU measures in the tab: the four measures, each stream's queue and idle split, the host
calls that waited for the GPU and the critical path, in the Step view and for the mean step in the
Overview, each figure read off the page and checked against the answer the same server gives; the
Memory view over every profiled step, naming the steps it leaves out.

A logdir of its own: one rank of the 16-rank NCCL job (``nccl``: communication, copies of five
kinds, 21 blocking calls a step, a queue of hundreds of kernels), the three-stream event-sync trace
(``event_sync``: one cudaDeviceSynchronize made by no op), the V100 trace (``v100``: no blocking
call), the first ResNet-50 trace with a step of one-off setup put before its steps (``warmup``:
memory events) and a CPU-only run (``cpu``: none of the GPU cards).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.logdir import settled
from tests.test_warmup import _resnet_with_a_warmup_step

from .tab import fixed, ms, pct, size

pytestmark = pytest.mark.browser

MEASURES = ("compute", "communication", "memory", "idle")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    for run, source in {
        "nccl": ("gpu", "hta_nccl_16rank"),
        "event_sync": ("gpu", "hta_event_sync_3stream"),
        "v100": ("gpu", "hta_ns_resolution"),
        "cpu": ("cpu", "base"),
    }.items():
        (root / run).mkdir()
        for f in traces.files(*source):
            shutil.copy(f, root / run / f.name)
    (root / "warmup").mkdir()
    _resnet_with_a_warmup_step(traces, root / "warmup")
    for f in root.rglob("*"):
        settled(f)
    return root


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def check_measures(tab, card, g: dict) -> None:
    """The four measures' figures, the memory kinds on hover, and the bar's parts in proportion."""
    value = {
        m: card.locator(f".figure.measure[data-measure={m}] .figure-value").inner_text()
        for m in MEASURES
    }
    assert value == {
        "compute": f"{ms(g['compute_ms'])} ms",
        "communication": f"{ms(g['comm_ms'])} ms {ms(g['exposed_comm_ms'])} exposed",
        "memory": f"{ms(g['memory_ms'])} ms {ms(g['exposed_memory_ms'])} exposed",
        "idle": f"{ms(g['idle_ms'])} ms",
    }
    hover = (
        card.locator(".figure.measure[data-measure=memory]").get_attribute("title").splitlines()[1:]
    )
    assert hover == [f"{kind}: {ms(t)} ms" for kind, t in g["memory_kinds"].items()]
    assert f"The GPU window ({ms(g['window_ms'])} ms" in card.inner_text()
    # the bar splits the window: compute, exposed communication, exposed memory, idle
    parts = {
        "compute": g["compute_ms"],
        "communication": g["exposed_comm_ms"],
        "memory": g["exposed_memory_ms"],
        "idle": g["idle_ms"],
    }
    whole = sum(parts.values())
    bar = card.locator(".measure-bar").bounding_box()
    for m, t in parts.items():
        part = card.locator(f".measure-part[data-measure={m}]")
        if t <= 0:
            assert part.count() == 0
            continue
        width = part.bounding_box()["width"]
        assert abs(width - (bar["width"] - 2) * t / whole) <= 1.5, (
            m,
            width,
            bar["width"],
            t,
            whole,
        )


def check_streams(tab, title: str, g: dict) -> None:
    rows = tab.rows(title)
    split = g.get("idle_split") or {}
    assert [r[0] for r in rows] == list(g["streams"])
    for row in rows:
        q, idle = g["queues"][row[0]], split.get(row[0])
        assert row[1:6] == [
            ms(g["streams"][row[0]]),
            fixed(q["mean"], 2),
            str(q["max"]),
            ms(q["delay_p50_ms"]),
            ms(q["delay_p90_ms"]),
        ]
        if split:
            assert row[6:9] == [
                ms(idle["host_wait_ms"]),
                ms(idle["kernel_wait_ms"]),
                ms(idle["other_ms"]),
            ]
        else:
            assert len(row) == 6


def table_rows(card, k: int) -> list[list[str]]:
    rows = card.locator("table").nth(k).locator("tbody tr").all_inner_texts()
    return [[c.strip() for c in r.split("\t")] for r in rows]


def check_path(tab, title: str, path: dict) -> None:
    card = tab.card(title)
    assert card.locator(".path-bound").inner_text() == path["bound"]
    assert f"{ms(path['length_ms'])} ms" in card.locator(".figure").first.inner_text()
    phases = {squeeze(r[0]): r[1:] for r in table_rows(card, 0)}
    assert phases == {
        squeeze(p): [ms(t), pct(t / path["length_ms"])] for p, t in path["phases"].items()
    }
    rows = table_rows(card, 1)
    cells = card.locator("table").nth(1).locator("tbody tr")
    names = [
        cells.nth(k).locator(".op").get_attribute("title") for k in range(len(rows))
    ]  # in full
    assert [[name, *r[1:]] for name, r in zip(names, rows)] == [
        [i["name"], i["kind"], ms(i["ms"]), pct(i["share"])] for i in path["items"][:10]
    ]


@pytest.mark.parametrize("run", ["nccl", "event_sync", "v100"])
def test_the_step_view_shows_the_steps_gpu_measures_syncs_and_path(tab, run):
    steps = tab.api("steps", run=run)["steps"]
    number = steps[len(steps) // 2]["step"]
    d = tab.api("step", run=run, step=number)
    g = d["gpu_time"]
    tab.open(view="step", run=run, step=number)
    check_measures(tab, tab.card(f"GPU time of step {number}"), g)
    check_streams(tab, f"GPU streams in step {number}", g)
    # the host calls that waited for the GPU, longest first, ten until "Show all"
    title = f"Host calls waiting for the GPU in step {number}"
    calls = sorted(d["blocking"], key=lambda c: -c["blocked_ms"])
    if not calls:
        assert (
            tab.card(title)
            .inner_text()
            .endswith("None: no synchronize and no blocking copy to the host in this step.")
        )
    else:
        total = sum(c["blocked_ms"] for c in calls)
        assert (
            f"{len(calls)} call{'s' if len(calls) > 1 else ''}, "
            f"{ms(total)} ms of host time blocked." in tab.card(title).inner_text()
        )
        rows = tab.rows(title)
        assert len(rows) == min(10, len(calls))
        code = any(c["frame"] for c in calls)
        for row, c in zip(rows, calls):
            call, op, *rest = row
            assert squeeze(call) == squeeze(c["call"] + (c["copy"] or ""))
            assert squeeze(op) == (squeeze((c["op"] or "") + (c["inputs"] or "")) or "–")
            assert rest[(1 if code else 0) + 1 :] == [
                ms(c["start_ms"]),
                ms(c["blocked_ms"]),
                str(c["queued"]),
            ]
    # the critical path: its figures and tables, and drawn on the step's lanes stretch by stretch
    path = d["critical_path"]
    if path is not None:
        check_path(tab, f"Critical path of step {number}", path)
        lanes = d["lanes"]["labels"]
        on_lanes = [s for s in path["segments"] if s["lane"] == "host" or s["lane"] in lanes]
        assert on_lanes, "a step's critical path runs on its lanes"
        box = tab.frame.locator(
            ".card", has=tab.frame.locator("h3", has_text="Timeline of the step")
        ).locator(".chart")
        assert box.get_attribute("data-path-drawn") == str(len(on_lanes))
    else:
        assert tab.card(f"Critical path of step {number}").count() == 0
    tab.screenshot(f"gpu-time-step-{run}")


@pytest.mark.parametrize("run", ["nccl", "v100", "warmup"])
def test_the_overview_shows_the_mean_steps_gpu_measures_and_path(tab, run):
    s = tab.api("steps", run=run)["summary"]
    tab.open(view="overview", run=run, device="gpu")
    card = tab.card("GPU time of the mean step")
    check_measures(tab, card, s["gpu_time"])
    # the steps its means leave out, named (the warm-up run's setup step)
    apart = (
        [f"{n} (warm-up)" for n in s.get("warmup_steps") or []]
        + [f"{n} (compiled)" for n in s.get("compiling_steps") or []]
        + [f"{n} (cut by the trace’s end)" for n in s.get("cut_steps") or []]
    )
    assert bool(apart) == (run == "warmup")
    note = card.locator(".left-out")
    if apart:
        assert note.inner_text() == (
            f"Means over the steps kept: step{'s' if len(apart) > 1 else ''} "
            f"{', '.join(apart)} left out, as from every mean and finding."
        )
    else:
        assert note.count() == 0
    check_streams(tab, "GPU streams of the mean step", s["gpu_time"])
    if s.get("critical_path"):
        check_path(tab, "Critical path of the mean step", s["critical_path"])
    # each finding's what-if bound, where it has one
    shown = tab.frame.locator(".findings li")
    assert shown.count() == len(s["findings"])
    for k, f in enumerate(s["findings"]):
        what_if = shown.nth(k).locator(".what-if")
        if f.get("what_if_ms") is None:
            assert what_if.count() == 0
        else:
            assert what_if.inner_text() == f"step ≥ {ms(f['what_if_ms'])} ms without it"
    tab.screenshot(f"gpu-time-overview-{run}")


def test_a_cpu_only_run_shows_none_of_the_gpu_cards(tab):
    number = tab.api("steps", run="cpu")["steps"][0]["step"]
    for view in ({"view": "step", "step": number}, {"view": "overview"}):
        tab.open(run="cpu", **view)
        assert tab.frame.locator(".measure-bar, .path-bound").count() == 0
        titles = tab.frame.locator(".card h3").all_inner_texts()
        assert titles, "the view drew its cards"
        gpu = [
            t
            for t in titles
            if re.match(r"(GPU time|GPU streams|Host calls waiting|Critical path)", t)
        ]
        assert not gpu, f"{view['view']} of a CPU-only run shows {gpu}"


def test_the_memory_view_over_every_step_names_the_steps_it_leaves_out(tab):
    answer = tab.api("memory_events", run="warmup")
    assert answer["step"] is None and answer["left_out"], (
        "the warm-up step is left out of the whole run"
    )
    tab.open(view="memory", run="warmup")
    note = tab.frame.locator(".left-out").inner_text()
    n = answer["steps"]
    left = answer["left_out"]
    assert note == (
        f"Summed over {n} profiled step{'s' if n != 1 else ''}; each peak is the highest step's. "
        f"Left out: step{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} "
        f"({answer['left_out_why']})."
    )
    for device in answer["devices"]:
        title = f"Memory by op on {device['device']}, {n} profiled steps"
        assert (
            f"Peak {size(device['peak_bytes'])} (the highest step’s), in {device['peak_op']}."
            in tab.card(title).inner_text()
        )
        rows = tab.rows(title)
        by_peak = sorted(device["ops"], key=lambda r: -r["peak_total"])
        assert [r[7] for r in rows] == [size(o["peak_total"]) for o in by_peak[: len(rows)]]
    assert (
        tab.frame.locator("h3", has_text="Memory events on").count() == 0
    )  # no events over many steps
    # one step: its events again, nothing left out said
    number = tab.api("steps", run="warmup")["steps"][-1]["step"]
    tab.frame.get_by_label("Steps").select_option(str(number))
    tab.frame.locator("h3", has_text="Memory events on").first.wait_for()
    assert tab.selections()["step"] == str(number)
    assert tab.frame.locator(".left-out").count() == 0
    assert tab.frame.locator("h3", has_text="Memory events on").count() == len(answer["devices"])


def test_the_ops_and_kernels_over_every_step_name_the_steps_they_leave_out(tab):
    ops, kernels = tab.api("ops", run="warmup"), tab.api("kernels", run="warmup")
    assert ops["left_out"] and ops["left_out"] == kernels["left_out"], "the warm-up step is left out"

    def said(answer: dict) -> str:
        left = answer["left_out"]
        return (f"Left out: step{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} "
                f"({answer['left_out_why']}).")

    tab.open(view="operators", run="warmup")
    notes = tab.frame.locator(".left-out")
    notes.nth(1).wait_for()  # the kernels' card fills in after the ops'
    assert notes.all_inner_texts() == [said(ops), said(kernels)]


def _with(tab, route: str, change) -> None:
    """Serve ``route``'s real answer to the page with ``change(answer)`` applied."""

    def handle(r):
        response = r.fetch()
        answer = response.json()
        change(answer)
        r.fulfill(response=response, json=answer)

    tab.page.route(re.compile(rf"/data/plugin/phaseprof/{route}\?"), handle)


def _path_of(d: dict) -> dict:
    """A critical path through the step's own lanes: the loop's phases, then a stream's busy bands,
    one stretch on a lane the step does not have (the tab leaves it out)."""
    labels, bands = d["lanes"]["labels"], d["lanes"]["bands"]
    stream = next(k for k, label in enumerate(labels) if label.startswith("GPU"))
    segments = [
        {
            "start_ms": a,
            "end_ms": b,
            "lane": "host" if lane == 0 else labels[lane],
            "kind": "phase" if lane == 0 else "kernel",
            "name": phase,
        }
        for lane, a, b, phase in bands
        if lane in (0, stream)
    ][:40]
    segments.append(
        {"start_ms": 0.0, "end_ms": 0.001, "lane": "GPU 9 stream 9", "kind": "kernel", "name": "x"}
    )
    phases: dict[str, float] = {}
    for s in segments[:-1]:
        phases[s["name"]] = phases.get(s["name"], 0.0) + s["end_ms"] - s["start_ms"]
    length = sum(phases.values())
    items = [{"name": p, "kind": "phase", "ms": t, "share": t / length} for p, t in phases.items()]
    return {
        "length_ms": length,
        "bound": "host-blocked",
        "phases": phases,
        "items": items,
        "segments": segments,
    }


def test_the_critical_path_is_drawn_on_the_lanes_as_the_answer_gives_it(tab):
    """A path set here on a real step's answer, through its own lanes and one it lacks: each
    stretch on a lane the step has is drawn (the other left out), and hovering one names it."""
    number = tab.api("steps", run="nccl")["steps"][2]["step"]
    d = tab.api("step", run="nccl", step=number)
    path = _path_of(d)
    _with(tab, "step", lambda a: a.update(critical_path=path))
    tab.open(view="step", run="nccl", step=number)
    check_path(tab, f"Critical path of step {number}", path)
    box = tab.card("Timeline of the step").locator(".chart")
    assert box.get_attribute("data-path-drawn") == str(len(path["segments"]) - 1)
    assert "critical path" in tab.card("Timeline of the step").locator(".legend").inner_text()
    # hovering a stretch of the path on the loop's lane names it
    chart = ".card:has(h3:text('Timeline of the step')) .chart"
    height, lanes = tab.chart_box(chart)["height"], len(d["lanes"]["labels"])
    # the middle of the loop's lane: the grid's top (24 px), half a lane (the grid ends 40 px up)
    middle = (24 + (height - 64) / lanes / 2) / height
    tab.hover_until(chart, f"Critical path: {path['segments'][0]['name']}", y_fraction=middle)
    tab.screenshot("gpu-time-critical-path")


JS_INK_LEFT = """(canvas) => {
  // the leftmost painted pixel of the canvas's top rows, above the value axis's first label
  const ctx = canvas.getContext('2d');
  const rows = Math.round(18 * (canvas.height / canvas.clientHeight));
  const { data, width } = ctx.getImageData(0, 0, canvas.width, rows);
  let left = width;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) left = Math.min(left, ((i - 3) / 4) % width);
  return [left / (canvas.width / canvas.clientWidth), left < width];
}"""


def test_the_value_axis_name_above_the_bars_is_not_cut(tab):
    """The name above the Overview's value axis ("ms (GPU busy)") starts at the axis line: none of
    it is cut at the chart's left edge (centred on the axis, its first half was)."""
    tab.open(view="overview", run="nccl", device="gpu")
    canvas = tab.card("Phases per step").locator("canvas").first
    left, inked = canvas.evaluate(JS_INK_LEFT)
    assert inked, "the axis name is drawn"
    assert left >= 8, f"the axis name starts {left:.1f} px from the chart's left edge: cut"

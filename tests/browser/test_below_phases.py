"""Below the phase, in a real TensorBoard and a real browser: the step trace view, the memory curve, the
kernels and the Operators view on a GPU run and a CPU run, the views linked to each other and to the
browser's history, CSV downloads, and the layout at 1440 and 1024 px in light and dark."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

from tests.logdir import settled, write_scalars

from .tab import Tab, count, ms, pct, size

pytestmark = pytest.mark.browser

#: The trace view's geometry (frontend/src/charts/trace_view.ts): axis height, row height, lane gap.
AXIS, ROW, GAP = 22, 16, 6


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces):
    """A V100 run (no memory events), the two-rank job, and the example CNN's CPU run (memory events,
    input shapes) with per-step scalars around its profiled steps."""
    root = tmp_path_factory.mktemp("below")
    for run, folder in {"gpu": "gpu/hta_ns_resolution", "ranks": "gpu/hta_sampled_2rank", "cpu": "cpu/base"}.items():
        (root / run).mkdir()
        for f in traces.files(*folder.split("/")):
            shutil.copy(f, root / run / f.name)
    write_scalars(root / "cpu", range(0, 30))
    for f in root.rglob("*"):
        settled(f)
    return root  # the package's `tensorboard` serves this logdir


#: the tab's page: wide and tall enough for the step's views, downloads kept for the CSV checks
TAB_OPTIONS = {"viewport": {"width": 1440, "height": 1600}, "accept_downloads": True}


def frame_of(tab: Tab):
    return next(f for f in tab.page.frames if "plugin_entry.html" in f.url)


def hover_names(tab: Tab, y: float, columns: int = 60) -> dict[str, str]:
    """Move along the trace canvas at height ``y`` (px from its top); the tooltips seen, by event name."""
    canvas = tab.frame.locator(".trace-canvas")
    box = canvas.bounding_box()
    seen = {}
    for k in range(columns):
        x = box["x"] + 175 + (box["width"] - 180) * (k + 0.5) / columns
        tab.page.mouse.move(x, box["y"] + y)
        tip = tab.frame.locator(".trace-tip")
        if tip.is_visible():
            seen[tip.locator("strong").inner_text()] = tip.inner_text()
    return seen


def open_step(tab: Tab, run: str, **extra) -> tuple[dict, dict]:
    steps = tab.api("steps", run=run)
    number = [s for s in steps["steps"] if not s["empty"]][1]["step"]
    tab.open(view="step", run=run, step=number, **extra)
    canvas = tab.frame.locator(".trace-canvas")
    canvas.wait_for()
    canvas.scroll_into_view_if_needed()  # below the step's cards: the mouse reaches it only in view
    return steps, tab.api("trace", run=run, worker=steps["worker"], step=number)


@pytest.mark.parametrize("run", ["gpu", "cpu"])
def test_step_trace_view_draws_the_steps_events_and_names_them_on_hover(tab, run):
    steps, doc = open_step(tab, run)
    info = doc["otherData"]
    card = tab.card("Trace of the step")
    assert f"{info['host_events']:,} host events, {info['device_events']:,} on the GPU." in card.inner_text()
    names = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    # the loop's thread is the first lane after the phases; its second row holds the ops in the step
    ops = hover_names(tab, AXIS + ROW + GAP + ROW + ROW / 2)
    assert ops and set(ops) <= set(names)
    assert any(names[n]["cat"] in ("cpu_op", "user_annotation") for n in ops)
    name, tip = next((n, t) for n, t in ops.items() if names[n].get("args", {}).get("phase"))
    assert f"phase {names[name]['args']['phase']}" in tip and "duration" in tip
    if run == "cpu":  # recorded with shapes: the ops a level or two below show them
        deeper = {}
        for depth in (2, 3):
            deeper |= hover_names(tab, AXIS + ROW + GAP + depth * ROW + ROW / 2, columns=30)
        shaped = [t for n, t in deeper.items() if "Input Dims" in names[n].get("args", {})]
        assert any("shapes [[" in t for t in shaped)
    if run == "gpu":  # the last lane is a GPU stream: kernels with the op that launched them
        height = tab.frame.locator(".trace-canvas").bounding_box()["height"]
        kernels = hover_names(tab, height - GAP - ROW / 2)
        assert kernels and all(names[n]["cat"] in ("kernel", "gpu_memcpy", "gpu_memset") for n in kernels)
        assert all("launched by" in t for t in kernels.values())
    tab.screenshot(f"step-trace-{run}")


def test_the_trace_zooms_and_download_saves_the_same_chrome_trace(tab):
    steps, doc = open_step(tab, "gpu")
    canvas = tab.frame.locator(".trace-canvas")
    box = canvas.bounding_box()
    before = canvas.screenshot()
    tab.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 30)
    tab.page.mouse.wheel(0, -600)
    tab.page.wait_for_timeout(100)
    assert canvas.screenshot() != before, "the wheel zooms"
    with tab.page.expect_download() as download:
        tab.card("Trace of the step").get_by_role("button", name="Download").click()
    saved = json.loads(download.value.path().read_text(encoding="utf-8"))
    assert saved == doc
    assert download.value.suggested_filename.endswith(f".step{doc['otherData']['step']}.pt.trace.json")


def test_memory_curve_marks_the_peak_and_says_how_to_record_memory(tab):
    steps, _ = open_step(tab, "cpu")
    number = int(tab.selections()["step"])
    curve = tab.api("memory", run="cpu", worker=steps["worker"], step=number)
    assert curve["devices"]
    for series in curve["devices"]:
        assert tab.figure(f"Peak {series['device']}") == size(series["peak_bytes"])
    assert tab.card("Memory over the step").locator("canvas").count()
    tab.screenshot("step-memory-curve")

    open_step(tab, "gpu")  # the V100 trace was recorded without profile_memory
    text = tab.card("Memory over the step").inner_text()
    assert "No memory events in this trace" in text and "profile_memory=True" in text


def test_kernels_of_a_step_match_the_api(tab):
    steps, doc = open_step(tab, "gpu")
    number = doc["otherData"]["step"]
    kernels = tab.api("kernels", run="gpu", worker=steps["worker"], step=number)["kernels"]
    rows = tab.rows(f"Kernels of step {number}")
    assert len(rows) == min(15, len(kernels))
    # names show shortened (test_gpu_views.py checks how), whole on hover
    names = tab.card(f"Kernels of step {number}").locator("tbody tr td:first-child .op")
    for n, (row, k) in enumerate(zip(rows[:5], kernels)):
        assert names.nth(n).get_attribute("title") == k["name"]
        assert row[1:6] == [str(k["calls"]), f"{k['total_us']:.1f}", f"{k['mean_us']:.1f}", f"{k['max_us']:.1f}",
                            pct(k["share"])]
        assert row[6].startswith(k["op"]) and row[7] == k["phase"]
    assert tab.card("Trace of the step").count() and "Kernels of step" in tab.text()
    # the CPU run has no kernels card
    open_step(tab, "cpu")
    assert "Kernels of step" not in tab.text()


@pytest.mark.parametrize("run", ["gpu", "cpu"])
def test_operators_view_lists_every_op_sorted_by_self_cpu_and_searches(tab, run):
    tab.open(view="operators", run=run)
    answer = tab.api("ops", run=run)
    rows = tab.rows("Operators over")
    assert len(rows) == min(50, len(answer["ops"]))
    gpu = answer["gpu_ms"] > 0
    for row, o in zip(rows[:5], answer["ops"]):
        expected = [o["name"].replace(" ", ""), f"{o['calls']:,}", ms(o["self_host_ms"]), ms(o["host_ms"])]
        if gpu:
            expected += [ms(o["self_gpu_ms"]), ms(o["gpu_ms"])]
        expected += [count(o["calls_per_step"]), ms(o["self_host_ms_per_step"]), pct(o["self_host_share"])]
        assert [row[0].replace(" ", ""), *row[1:len(expected)]] == expected
    assert tab.figure("Steps") == str(answer["steps"])

    wanted = answer["ops"][3]["name"]
    tab.frame.get_by_label("Search ops").fill(wanted)
    names = [r[0].replace(" ", "") for r in tab.rows("Operators over")]
    wanted_text = wanted.replace(" ", "").lower()
    assert wanted.replace(" ", "") in names and all(wanted_text in n.lower() for n in names)
    assert tab.selections()["op"] == wanted

    if run == "cpu":  # by op and input shapes: the shapes column, more rows
        tab.frame.get_by_role("radio", name="By op and shapes").click()
        tab.settle()
        by_shapes = tab.api("ops", run=run, group="shapes")
        assert tab.selections()["group"] == "shapes"
        header = tab.card("Operators over").locator("thead").inner_text()
        assert "Input shapes" in header
        first = tab.rows("Operators over")[0]
        top = [o for o in by_shapes["ops"] if wanted.lower() in o["name"].lower()][0]
        assert [first[0].replace(" ", ""), first[1]] == [top["name"].replace(" ", ""), top["shapes"] or "–"]
    tab.screenshot(f"operators-{run}")


def test_an_op_opens_its_steps_and_back_returns(tab):
    tab.open(view="operators", run="cpu")
    op = tab.api("ops", run="cpu")["ops"][0]
    row = tab.card("Operators over").locator("tbody tr").first
    row.locator(".step-links button").first.click()
    tab.settle()
    assert tab.selections()["view"] == "step" and tab.selections()["step"] == str(op["steps"][0])
    tab.page.go_back()
    tab.settle()
    assert tab.selections()["view"] == "operators"
    # from a step's op table into Operators, then from Operators into Compare
    tab.page.go_forward()
    tab.settle()
    link = tab.card("Ops by phase").locator("tbody tr").first.locator("button.op")
    name = link.inner_text()
    link.click()
    tab.settle()
    assert tab.selections()["view"] == "operators" and tab.frame.get_by_label("Search ops").input_value() == name
    tab.card("Operators over").locator("tbody tr").first.get_by_role("button", name="Compare").click()
    tab.settle()
    assert tab.selections()["view"] == "compare"
    first = tab.card("Ops that changed most").locator("tbody tr").first
    assert "selected" in first.get_attribute("class") and name in first.inner_text()


def test_back_returns_from_step_to_overview(tab):
    tab.open(view="overview", run="gpu")
    target = tab.api("steps", run="gpu")["steps"][1]["step"]
    x, y = tab.hover_until(".view-overview .chart", f"Step {target}")
    tab.page.mouse.click(x, y)
    tab.settle()
    assert tab.selections()["view"] == "step"
    tab.page.go_back()
    tab.settle()
    assert tab.selections()["view"] == "overview" and "Every profiled step" in tab.text()


def test_a_profiled_step_on_the_timeline_opens_its_step(tab):
    tab.open(view="timeline", run="cpu")
    profiled = tab.api("timeline", run="cpu")["profiled"][0]
    step = (profiled[0] + profiled[1]) // 2
    x, y = tab.hover_until(".view-timeline .chart", f"Step {step}")
    assert "click to open this step" in tab.text(".view-timeline .chart .tip")
    tab.page.mouse.click(x, y)
    tab.settle()
    assert tab.selections()["view"] == "step" and tab.selections()["step"] == str(step)
    tab.page.go_back()
    tab.settle()
    assert tab.selections()["view"] == "timeline"


def test_tables_download_as_csv(tab):
    tab.open(view="operators", run="gpu")
    answer = tab.api("ops", run="gpu")
    with tab.page.expect_download() as download:
        tab.card("Operators over").get_by_role("button", name="CSV").click()
    rows = list(csv.reader(io.StringIO(download.value.path().read_text(encoding="utf-8"))))
    assert rows[0][:4] == ["Op", "Calls", "Self host ms", "Host ms"]
    assert len(rows) == len(answer["ops"]) + 1  # every row, not only those shown
    assert [r[0] for r in rows[1:]] == [o["name"] for o in answer["ops"]]
    assert [float(r[2]) for r in rows[1:6]] == [o["self_host_ms"] for o in answer["ops"][:5]]
    assert download.value.suggested_filename == "operators.csv"
    # every table has one
    tab.open(view="overview", run="gpu")
    assert tab.frame.locator(".table-box").count() == tab.frame.locator(".table-box .csv").count() > 0


VIEWS = {
    "overview": {"run": "gpu"},
    "timeline": {"run": "cpu"},
    "step": {"run": "gpu"},
    "operators": {"run": "gpu"},
    "compare": {"a_run": "gpu", "b_run": "cpu"},
    "ranks": {"run": "ranks"},
}


@pytest.mark.parametrize("width", [1440, 1024])
def test_every_view_fits_its_tables_and_stacks_its_cards(tab, width):
    """At each width, light and dark: no table hides a column behind a scroll bar; under 1200 px the
    cards stack. A screenshot of each view, as evidence."""
    tab.page.set_viewport_size({"width": width, "height": 1200})
    for dark in (False, True):
        for view, selections in VIEWS.items():
            extra = {"device": "gpu"} if view == "compare" else {}
            tab.open(dark=dark, view=view, **selections, **extra)
            if view == "step":
                tab.frame.locator(".trace-canvas").wait_for()
            frame = frame_of(tab)
            hidden = frame.evaluate("""() => [...document.querySelectorAll('.table-box')]
                .filter((b) => b.scrollWidth > b.clientWidth + 1)
                .map((b) => b.querySelector('table').getAttribute('aria-label'))""")
            assert not hidden, f"{view} at {width} px scrolls {hidden}"
            lefts = frame.evaluate("""() => [...document.querySelectorAll('.columns')].map((c) =>
                [...c.children].map((card) => Math.round(card.getBoundingClientRect().left)))""")
            for row in lefts:
                assert (len(set(row)) == 1) == (width < 1200), f"{view} at {width} px: cards at {row}"
            if view == "compare":  # GPU mode: the A and B columns of GPU time
                header = tab.card("Ops that changed most").locator("thead").inner_text()
                assert "Self GPU A" in header and "Self GPU B" in header and "Δ self GPU" in header
            tab.screenshot(f"{view}-{width}-{'dark' if dark else 'light'}")

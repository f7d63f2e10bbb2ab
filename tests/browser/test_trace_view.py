"""The step trace view and the kernel table, in a real TensorBoard and a real browser: on a built
training loop whose kernels fill its steps (two streams, ops launching several kernels), flow arrows
from a launch to its kernel on hover and on selection, the search box, the statistics of a brushed
range and of the view; on a real GPU trace (AlexNet on two streams, each kernel's launch recorded), the
kernel table's launch columns, sortable and in the CSV. Each figure the page shows is checked against
the `/trace` or `/kernels` answer, computed here from its raw events."""

from __future__ import annotations

import csv
import io
import re
import shutil

import pytest

from tests.logdir import settled, write_trace
from tests.tracebuilder import Loop

from .tab import Tab

pytestmark = pytest.mark.browser

RUN = "alexnet"  # the kernel table
LOOP = "loop"  # the trace view
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
LANE_CATEGORIES = {"phase", "apart"}  # the phase lane, left out of the range's statistics


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces):
    root = tmp_path_factory.mktemp("trace-view")
    (root / RUN).mkdir()
    for f in traces.files("gpu", "hta_alexnet_2stream"):
        shutil.copy(f, root / RUN / f.name)
    loop = Loop()
    for number in (1, 2, 3):
        forward = [("volta_sgemm_fwd", 60), ("relu_fwd", 30, 9), ("volta_sgemm_fwd", 50)]
        loop.step(number, ("## forward ##", 400, forward, [("aten::linear", 10, 300)]),
                  ("## backward ##", 600, [("volta_sgemm_bwd", 90), ("relu_bwd", 40, 9), ("volta_sgemm_bwd", 80)]),
                  ("Optimizer.step#SGD.step", 150, [("sgd_update", 40)]))
    write_trace(root / LOOP / "worker.1.pt.trace.json.gz", loop.events)
    for f in root.rglob("*"):
        settled(f)
    return root  # the package's `tensorboard` serves this logdir


#: the tab's page: wide and tall enough for the step's views, downloads kept for the CSV checks
TAB_OPTIONS = {"viewport": {"width": 1440, "height": 1600}, "accept_downloads": True}


def open_trace(tab: Tab) -> tuple[int, dict]:
    steps = tab.api("steps", run=LOOP)
    number = steps["steps"][1]["step"]
    tab.open(view="step", run=LOOP, step=number)
    tab.frame.locator(".trace-canvas").wait_for()
    return number, tab.api("trace", run=LOOP, worker=steps["worker"], step=number)


def wait_data(tab: Tab, key: str, wanted: str) -> None:
    frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
    frame.wait_for_function(f"document.querySelector('.trace-canvas').dataset.{key} === {wanted!r}", timeout=30_000)


def launch_of(doc: dict) -> dict[int, dict]:
    """Runtime calls (launches) of the step by correlation."""
    return {e["args"]["correlation"]: e for e in doc["traceEvents"]
            if e["ph"] == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}


def test_hovering_a_kernel_draws_the_arrow_from_its_launch(tab):
    _, doc = open_trace(tab)
    launches = launch_of(doc)
    canvas = tab.frame.locator(".trace-canvas")
    box = canvas.bounding_box()
    wait_data(tab, "flows", "0")
    # the last lane is a GPU stream: move along it until the tooltip names a kernel
    y = box["y"] + box["height"] - 6 - 8
    for k in range(120):
        tab.page.mouse.move(box["x"] + 175 + (box["width"] - 180) * (k + 0.5) / 120, y)
        tip = tab.frame.locator(".trace-tip")
        if tip.is_visible():
            break
    else:
        raise AssertionError("no kernel under the pointer on the last lane")
    name = tip.locator("strong").inner_text()
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == name]
    assert kernels and all(e["cat"] in DEVICE_CATEGORIES for e in kernels)
    expected = "1" if any(e["args"]["correlation"] in launches for e in kernels) else "0"
    assert expected == "1"  # the loop's kernels are launched inside the step
    wait_data(tab, "flows", "1")
    tab.page.mouse.move(box["x"] + 5, box["y"] - 40)  # off the canvas: the arrow goes
    wait_data(tab, "flows", "0")


def test_search_highlights_matches_and_selecting_one_shows_its_launch(tab):
    _, doc = open_trace(tab)
    launches = launch_of(doc)
    query = "LAUNCHKERN"  # any part of the name, in any case: cudaLaunchKernel, cudaLaunchKernelExC
    matching = [e for e in doc["traceEvents"] if e["ph"] == "X" and query.lower() in e["name"].lower()]
    assert len(matching) == len(launches) > 1
    search = tab.frame.locator(".trace-search")
    search.fill(query)
    found = tab.frame.locator(".trace-matches")
    assert found.inner_text() == f"{len(matching)} matches"
    wait_data(tab, "highlighted", str(len(matching)))  # all in view: the whole step is shown (drawn on the next frame)
    search.press("Enter")  # the first match (earliest) selected and shown
    first = min(matching, key=lambda e: e["ts"])
    selection = tab.frame.locator(".trace-selection")
    assert selection.locator("strong").inner_text() == first["name"]
    work = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") in DEVICE_CATEGORIES
            and e["args"]["correlation"] == first["args"]["correlation"]]
    assert len(work) == 1 and f"Launches {work[0]['name']} on " in selection.inner_text()
    wait_data(tab, "flows", "1")
    tab.frame.locator(".trace-search").press("Enter")  # the next one
    second = sorted(matching, key=lambda e: e["ts"])[1]
    assert f"at {round(((second['ts'] - doc['otherData']['start_us']) / 1000), 4):g} ms" in selection.inner_text()
    search.fill("no event has this name")
    assert found.inner_text() == "0 matches"
    wait_data(tab, "highlighted", "0")
    tab.screenshot("trace-view-search")


def test_selecting_an_op_draws_arrows_to_every_kernel_it_launched(tab):
    _, doc = open_trace(tab)
    launches = launch_of(doc)
    ops = sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "aten::linear"),
                 key=lambda e: e["ts"])
    op = ops[0]
    inside = [c for c, e in launches.items()
              if e["tid"] == op["tid"] and e["ts"] >= op["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"]]
    work = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") in DEVICE_CATEGORIES
            and e["args"]["correlation"] in inside]
    assert len(work) >= 2  # the op launches several kernels
    tab.frame.locator(".trace-search").fill("aten::linear")
    tab.frame.locator(".trace-search").press("Enter")
    wait_data(tab, "flows", str(len(work)))
    assert f"Launches {len(work)} kernels" in tab.frame.locator(".trace-selection").inner_text()
    tab.frame.locator(".trace-selection").get_by_role("button", name="Clear").click()
    wait_data(tab, "flows", "0")


def expected_stats(doc: dict, start: float, end: float) -> dict[tuple[str, str], tuple[int, float]]:
    """(name, where) -> (count, total ms) of the events of host threads and GPU streams in [start, end)."""
    out: dict[tuple[str, str], list] = {}
    for e in doc["traceEvents"]:
        if e["ph"] != "X" or e.get("cat") in LANE_CATEGORIES:
            continue
        a = e["ts"]
        b = a + e.get("dur", 0)
        if a < end and (b > start or a >= start):
            row = out.setdefault((e["name"], "GPU" if e.get("cat") in DEVICE_CATEGORIES else "host"), [0, 0.0])
            row[0] += 1
            row[1] += e.get("dur", 0) / 1000
    return {k: (n, t) for k, (n, t) in out.items()}


def range_rows(tab: Tab) -> tuple[float, float, dict[tuple[str, str], tuple[int, float]]]:
    """The brushed range (µs on the trace's clock) and its table as downloaded (every row)."""
    panel = tab.frame.locator(".trace-range")
    start, end = float(panel.get_attribute("data-start-us")), float(panel.get_attribute("data-end-us"))
    with tab.page.expect_download() as download:
        panel.get_by_role("button", name="CSV").click()
    rows = list(csv.reader(io.StringIO(download.value.path().read_text(encoding="utf-8"))))
    assert rows[0] == ["Name", "Where", "Count", "In range ms", "Total ms"]
    return start, end, {(r[0], r[1]): (int(r[2]), float(r[4])) for r in rows[1:]}


def assert_stats(doc, start, end, shown) -> None:
    expected = expected_stats(doc, start, end)
    assert expected and set(shown) == set(expected)
    for key, (count, total) in expected.items():
        assert shown[key][0] == count, key
        assert shown[key][1] == pytest.approx(total, rel=1e-9, abs=1e-9), key


def test_statistics_of_the_view_count_and_time_every_event_by_name(tab):
    _, doc = open_trace(tab)
    tab.card("Trace of the step").get_by_role("button", name="Statistics of the view").click()
    start, end, shown = range_rows(tab)
    info = doc["otherData"]
    assert start <= info["start_us"] and end >= info["end_us"]
    assert_stats(doc, start, end, shown)
    events = sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") not in LANE_CATEGORIES)
    assert sum(n for n, _ in shown.values()) == events  # the whole step: every event


def test_a_brushed_range_counts_the_events_in_it_and_sorts_by_any_column(tab):
    _, doc = open_trace(tab)
    canvas = tab.frame.locator(".trace-canvas")
    box = canvas.bounding_box()
    y = box["y"] + 40
    left, right = box["x"] + 170 + (box["width"] - 170) * 0.3, box["x"] + 170 + (box["width"] - 170) * 0.55
    tab.page.keyboard.down("Shift")
    tab.page.mouse.move(left, y)
    tab.page.mouse.down()
    tab.page.mouse.move((left + right) / 2, y)
    tab.page.mouse.move(right, y)
    tab.page.mouse.up()
    tab.page.keyboard.up("Shift")
    start, end, shown = range_rows(tab)
    info = doc["otherData"]
    assert info["start_us"] < start < end < info["end_us"] + (info["end_us"] - info["start_us"])
    assert_stats(doc, start, end, shown)
    events = sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") not in LANE_CATEGORIES)
    assert 0 < sum(n for n, _ in shown.values()) < events  # a part of the step
    panel = tab.frame.locator(".trace-range")
    panel.locator("th", has_text="Count").click()  # sorts by count, most first
    counts = [int(c) for c in panel.locator("tbody tr td:nth-child(3)").all_inner_texts()]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) > 1
    panel.get_by_role("button", name="Clear").click()
    assert panel.get_attribute("data-start-us") is None
    tab.screenshot("trace-view-range")


LAUNCH_COLUMNS = ["Blocks/SM", "Occupancy", "Grid", "Block", "Registers", "Shared mem", "Tensor cores"]


def dims(d):
    return "×".join(map(str, d)) if d else ""


@pytest.mark.parametrize("where", ["step", "run"])
def test_the_kernel_table_shows_each_kernels_launch_sortable_and_in_the_csv(tab, where):
    steps = tab.api("steps", run=RUN)
    number = steps["steps"][0]["step"]
    if where == "step":
        kernels = tab.api("kernels", run=RUN, step=number)["kernels"]
        tab.open(view="step", run=RUN, step=number)
        card = tab.card(f"Kernels of step {number}")
    else:
        kernels = tab.api("kernels", run=RUN)["kernels"]
        tab.open(view="operators", run=RUN)
        card = tab.card("Kernels over the profiled steps")
    card.locator("table").wait_for()
    headers = card.locator("thead th").all_inner_texts()
    assert headers[-len(LAUNCH_COLUMNS):] == LAUNCH_COLUMNS
    assert any(k["occupancy"] is not None for k in kernels) and any(k["tensor_cores"] for k in kernels)
    more = card.get_by_role("button", name=re.compile("Show all"))
    if more.count():
        more.click()
    card.locator("th", has_text="Occupancy").click()  # most first; kernels without a launch last
    rows = [[c.strip() for c in r.split("\t")] for r in card.locator("tbody tr").all_inner_texts()]
    column = {h: i for i, h in enumerate(headers)}
    by_occupancy = sorted(kernels, key=lambda k: -1 if k["occupancy"] is None else k["occupancy"], reverse=True)
    expected = [f"{k['occupancy']:.1f}%" if k["occupancy"] is not None else "—" for k in by_occupancy]
    assert [r[column["Occupancy"]] for r in rows] == expected
    with tab.page.expect_download() as download:
        card.get_by_role("button", name="CSV").click()
    table = list(csv.reader(io.StringIO(download.value.path().read_text(encoding="utf-8"))))
    assert table[0][-len(LAUNCH_COLUMNS):] == LAUNCH_COLUMNS
    assert len(table) == len(kernels) + 1
    csv_rows = {r[0]: dict(zip(table[0], r)) for r in table[1:]}
    for k in kernels:
        row = csv_rows[k["name"]]
        assert row["Grid"] == dims(k["grid"]) and row["Block"] == dims(k["block"])
        assert row["Registers"] == ("" if k["registers"] is None else str(k["registers"]))
        assert row["Shared mem"] == ("" if k["shared_memory"] is None else str(k["shared_memory"]))
        assert row["Tensor cores"] == {None: "", True: "yes", False: "no"}[k["tensor_cores"]]
        for label, field in (("Blocks/SM", "blocks_per_sm"), ("Occupancy", "occupancy")):
            assert (row[label] == "") if k[field] is None else float(row[label]) == pytest.approx(k[field])
    tab.screenshot(f"kernel-table-{where}")

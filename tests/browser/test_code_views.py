"""Where in the code, in the tab: the Modules view and the ops' call stacks, on CPU runs recorded here
(`tests.test_modules`: three blocks, the middle one slowed by a sleep): ``mlp`` with
``PhaseProfiler(modules=True)``, ``stacks`` with ``with_stack=True``."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from tests.logdir import settled
from tests.test_modules import BLOCK_LINE, _train

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    _train(root / "modules_run", modules=True)
    _train(root / "stacks_run", with_stack=True)
    for f in root.rglob("*"):
        settled(f)
    return root


def test_the_modules_view_puts_the_slow_block_first_and_shows_a_modules_ops(tab):
    tab.open(view="modules", run="modules_run/mlp")
    answer = tab.api("modules", run="modules_run/mlp")
    rows = tab.rows("Modules over")
    assert [r[0] for r in rows] == [m["path"] for m in answer["modules"]]
    assert rows[0][0] == "MLP" and rows[1][0] == "MLP.blocks.1"
    # indented by depth: a block's linear sits further right than the block
    frame = tab.frame
    block = frame.locator(".modules-table .module-name", has_text="MLP.blocks.1").first
    lin = frame.locator(".modules-table .module-name", has_text="MLP.blocks.1.lin").first
    assert lin.evaluate("e => parseFloat(getComputedStyle(e).paddingLeft)") > block.evaluate(
        "e => parseFloat(getComputedStyle(e).paddingLeft)")
    lin.click()
    ops = tab.rows("Ops of MLP.blocks.1.lin")
    names = {r[0].replace(" ", "") for r in ops}  # a long name is drawn in two parts (its end kept whole)
    assert "aten::linear" in names and "autograd::engine::evaluate_function:AddmmBackward0" in names
    assert {r[1] for r in ops} == {"forward", "backward"}
    assert frame.locator(".modules-table tr.selected .module-name").inner_text() == "MLP.blocks.1.lin"
    # sortable: by backward time, largest first
    frame.locator(".modules-table th", has_text="Backward ms").click()
    backward = [float(r[6].replace(",", "")) for r in tab.rows("Modules over")]
    assert backward == sorted(backward, reverse=True)
    tab.screenshot("modules-view")


def test_the_modules_table_downloads_as_csv(tab):
    tab.open(view="modules", run="modules_run/mlp")
    with tab.page.expect_download() as download:
        tab.card("Modules over").locator("button", has_text="CSV").first.click()
    text = Path(download.value.path()).read_text(encoding="utf-8")
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][:3] == ["Module", "Depth", "Calls"]
    answer = tab.api("modules", run="modules_run/mlp")
    assert [r[0] for r in table[1:]] == [m["path"] for m in answer["modules"]]


def test_a_run_without_module_records_says_how_to_get_them(tab):
    tab.open(view="modules", run="stacks_run/mlp")
    assert "MLP_0.Block_1" in tab.text()  # with_stack records modules too
    tab.open(view="step", run="modules_run/mlp", step=2)
    headers = tab.card("Ops by phase").locator("th").all_inner_texts()
    assert "Self host ms" in headers and "Code" not in headers  # no stacks recorded: no column


def test_op_tables_show_the_user_frame_and_the_whole_stack_on_hover(tab):
    tab.open(view="step", run="stacks_run/mlp", step=2)
    cell = tab.frame.locator("tr", has=tab.frame.locator("td .op", has_text="aten::relu")).locator(".code-frame").first
    assert cell.inner_text().endswith(f"test_modules.py({BLOCK_LINE}): forward")
    stack = cell.get_attribute("title").split("\n")
    assert stack[0].startswith("<built-in method relu") and any(f.startswith("nn.Module: Block_") for f in stack)
    answer = tab.api("step", run="stacks_run/mlp", step=2)
    (relu,) = [o for o in answer["ops"]["forward"] if o["name"] == "aten::relu"]
    assert stack == relu["stack"]
    tab.open(view="operators", run="stacks_run/mlp")
    cell = tab.frame.locator("tr", has=tab.frame.locator("td .op", has_text="aten::relu")).locator(".code-frame").first
    assert cell.inner_text().endswith(f"test_modules.py({BLOCK_LINE}): forward")
    tab.screenshot("op-stack-column")


def test_the_trace_views_tooltip_shows_an_events_user_frame_and_stack(tab):
    from .test_below_phases import AXIS, GAP, ROW, hover_names

    tab.open(view="step", run="stacks_run/mlp", step=2)
    tab.frame.locator(".trace-canvas").wait_for()
    doc = tab.api("trace", run="stacks_run/mlp", step=2)
    framed: dict[str, list[dict]] = {}  # events of one name may have been called from different lines
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e.get("args", {}).get("frame"):
            framed.setdefault(e["name"], []).append(e["args"])
    seen = {}
    for depth in range(1, 7):
        seen |= hover_names(tab, AXIS + ROW + GAP + depth * ROW + ROW / 2, columns=40)
    shown = {n: t for n, t in seen.items() if n in framed}
    assert shown, f"no tooltip of an event with a stack among {sorted(seen)}"
    for name, tip in shown.items():
        assert any(f"code {a['frame']}" in tip and a["stack"][0] in tip for a in framed[name]), (name, tip)
    tab.screenshot("trace-tooltip-stack")

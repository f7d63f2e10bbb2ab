"""The Collectives view (opened from Ranks) and the Memory view (opened from a step's memory curve):
their tables show the answers' figures, sort, and download as CSV.

A logdir of its own: a two-rank job built here whose collectives carry sizes (``ddp``: rank 1 is late
at each all_reduce, rank 0 at each all_gather) and the first 2021 ResNet-50 trace (``resnet``: CPU
and GPU memory events)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.logdir import settled, write_trace
from tests.test_collectives import STEPS, _rank_events

from .tab import ms, size

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces) -> Path:
    root = tmp_path_factory.mktemp("logdir")
    for rank in (0, 1):
        write_trace(root / "ddp" / f"rank{rank}.1.pt.trace.json", _rank_events(rank),
                    distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl"})
    (root / "resnet").mkdir()
    shutil.copy(traces.files("gpu", "kineto_resnet50_num_workers_0")[0], root / "resnet")
    for f in root.rglob("*"):
        settled(f)
    return root


def _csv(tab, card) -> str:
    with tab.page.expect_download() as download:
        card.get_by_role("button", name="CSV").first.click()
    return Path(download.value.path()).read_text()


def test_collectives_view_from_ranks_shows_sizes_bandwidth_and_who_waits(tab):
    answer = tab.api("collectives", run="ddp")
    tab.open(view="ranks", run="ddp")
    tab.frame.get_by_role("button", name="Collectives, bandwidth and who waits for whom").click()
    tab.settle()
    assert tab.selections()["view"] == "collectives"
    card = tab.card("Collectives over the profiled steps")
    rows = tab.rows("Collectives over the profiled steps")
    assert len(rows) == len(answer["collectives"]) == 4
    # sorted by time, longest first: the all_reduce rows; each row's figures are the answer's
    expected = sorted(answer["collectives"], key=lambda r: -r["time_ms"])
    for row, r in zip(rows, expected):
        assert row[1] == r["kind"] and row[4] == size(r["bytes"]) and row[5] == str(r["calls"])
        assert row[6] == ms(r["time_ms"])
        assert row[11] == f"{r['algbw_gbps']:.2f}" and row[12] == f"{r['busbw_gbps']:.2f}"
    # sort by bus bandwidth: highest first, then lowest first
    card.locator("th", has_text="busbw GB/s").click()
    busbw = [float(r[12]) for r in tab.rows("Collectives over the profiled steps")]
    assert busbw == sorted(busbw, reverse=True) and len(set(busbw)) == 4
    card.locator("th", has_text="busbw GB/s").click()
    assert [float(r[12]) for r in tab.rows("Collectives over the profiled steps")] == sorted(busbw)
    csv = _csv(tab, card)
    assert csv.splitlines()[0].startswith("Worker,Kind,Group,Ranks,Message,Calls,Time ms")
    assert "all_gather" in csv and str(answer["collectives"][0]["bytes"]) in csv
    # each rank's time, and who is waited for: rank 1 at every all_reduce
    time_rows = tab.rows("Each rank’s time")
    assert len(time_rows) == sum(len(r["steps"]) * (1 + len(r["steps"][0]["phases"])) for r in answer["ranks"])
    waits = {r[0]: r for r in tab.rows("Who the others wait for")}
    assert waits["rank1 (rank 1)"][1:3] == [str(2 * STEPS), str(STEPS)]
    assert waits["rank1 (rank 1)"][3] == ms(0.03 * STEPS)
    assert "most waited for: rank1 (rank 1)" in tab.card("Who the others wait for").inner_text()
    tab.screenshot("collectives")


def test_collectives_of_one_step(tab):
    tab.open(view="collectives", run="ddp", step=2)
    rows = tab.rows("Collectives of step 2")
    assert [r[5] for r in rows] == ["1"] * 4
    assert {r[1] for r in tab.rows("Each rank’s time")} == {"2"}


def test_memory_view_from_the_step_lists_ops_and_events_with_the_peak(tab):
    number = tab.api("steps", run="resnet")["steps"][1]["step"]
    answer = tab.api("memory_events", run="resnet", step=number)
    tab.open(view="step", run="resnet", step=number)
    tab.frame.get_by_role("button", name="Memory events and memory by op").click()
    tab.settle()
    assert tab.selections()["view"] == "memory" and tab.selections()["step"] == str(number)
    for device in answer["devices"]:
        title = f"Memory by op on {device['device']}, step {number}"
        card = tab.card(title)
        assert f"Peak {size(device['peak_bytes'])} at {ms(device['peak_ms'])} ms, in {device['peak_op']}." in \
            card.inner_text()
        rows = tab.rows(title)
        by_peak = sorted(device["ops"], key=lambda r: -r["peak_total"])
        assert [re.sub(r"\s+", "", r[0]) for r in rows] == [re.sub(r"\s+", "", o["op"]) for o in by_peak[:len(rows)]]
        assert [r[7] for r in rows] == [size(o["peak_total"]) for o in by_peak[:len(rows)]]
        csv = _csv(tab, card)
        assert len(csv.strip().splitlines()) == len(device["ops"]) + 1  # every op, not only those shown
        events = tab.card(f"Memory events on {device['device']}, step {number}")
        shown = events.locator("tbody tr")
        first = [c.strip() for c in shown.first.inner_text().split("\t")]
        e0 = device["events"][0]
        assert first[0] == ms(e0["t_ms"]) and first[1] == size(e0["bytes"], signed=True)
        assert first[4] == size(e0["allocated"])
        peak = events.locator("tbody tr.peak")
        if device["peak_ms"] <= device["events"][min(99, len(device["events"]) - 1)]["t_ms"]:
            assert peak.count() >= 1  # the peak's row, among the first 100 in time order
    tab.screenshot("memory-events")


@pytest.mark.parametrize("width", [1440, 1024])
def test_both_views_fit_their_tables(tab, width):
    """No table of either view hides a column behind a scroll bar, light and dark."""
    tab.page.set_viewport_size({"width": width, "height": 1200})
    for dark in (False, True):
        for view, run in (("collectives", "ddp"), ("memory", "resnet")):
            tab.open(dark=dark, view=view, run=run)
            frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
            hidden = frame.evaluate("""() => [...document.querySelectorAll('.table-box')]
                .filter((b) => b.scrollWidth > b.clientWidth + 1)
                .map((b) => b.querySelector('table').getAttribute('aria-label'))""")
            assert frame.evaluate("() => document.querySelectorAll('.table-box').length") >= 2
            assert not hidden, f"{view} at {width} px scrolls {hidden}"
            tab.screenshot(f"{view}-{width}-{'dark' if dark else 'light'}")

"""The Step Phases tab in a real TensorBoard and a real browser: every view shows the numbers the
API returns (read back from the page text, compared with the JSON fetched from the same server)."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from tests.logdir import settled, write_scalars
from tests.tensorboard_server import wait_loaded

from .conftest import XSS_OP, XSS_PHASE, XSS_WORKER
from .tab import change, count, ms, pct, signed_ms, size

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def demo_run(tensorboard) -> str:
    """The demo's training run: traces (with memory and shapes) and per-step scalars."""
    runs = [r["run"] for r in tensorboard.json("/data/plugin/phaseprof/runs")["runs"]
            if r["run"].startswith("demo/") and r["workers"] and r["has_scalars"]]
    return next((r for r in runs if "train" in r), runs[0])


def test_overview_shows_the_steps_route(tab):
    tab.open(view="overview", run="gpu")
    data = tab.api("steps", run="gpu")
    s = data["summary"]
    text = tab.text()
    assert tab.figure("Mean step") == f"{ms(s['mean_wall_ms'])} ms"
    assert tab.figure("Median step") == f"{ms(s['median_wall_ms'])} ms"
    assert tab.rows("Mean step by phase") == [
        [p, ms(m["host_ms"]), pct(m["share"]), ms(m["gpu_busy_ms"]), pct(m["gpu_share"]), ms(m["gpu_ms"]),
         ms(m["gpu_idle_ms"]), ms(s["costs"][p])]
        for p, m in s["mean"].items()
    ]
    assert tab.figure("Costliest phase") == s["dominant_phase"] == s["findings"][0]["phase"]
    for finding in s["findings"]:
        assert finding["text"] in text
    slow = s["slowest"]  # 0.15 ms over the median of a 95 ms step: within noise
    assert slow["noise"] == "within-noise"
    assert (f"Step {slow['step']}: {ms(slow['wall_ms'])} ms. Within the steps' noise (±{ms(slow['noise_ms'])} ms "
            f"of the median step, {ms(s['median_wall_ms'])} ms)") in text
    assert tab.rows("Top ops of")[0] == [s["top_ops"][0]["name"], count(s["top_ops"][0]["calls"])] + [
        ms(s["top_ops"][0][k]) for k in ("self_host_ms", "host_ms", "self_gpu_ms", "gpu_ms")]
    first = data["phases"][0]  # phases with time only: this run loads no data in a range
    assert first == "forward"
    assert [r[:3] for r in tab.rows("Every profiled step")] == [  # host time only
        [str(r["step"]), ms(r["wall_ms"]), ms(r["phases"][first]["host_ms"])] for r in data["steps"]
    ]
    tab.screenshot("overview")

    tab.frame.get_by_role("radio", name="GPU").click()
    tab.settle()
    assert tab.selections()["device"] == "gpu"
    assert "Phases per step (GPU busy time)" in tab.text()
    phases = data["phases"]
    first_row = data["steps"][0]
    assert tab.rows("Every profiled step")[0][2:3 + len(phases)] == [ms(first_row["gpu_time"]["busy_ms"])] + [
        ms(first_row["phases"][p]["gpu_busy_ms"]) for p in phases]
    tab.screenshot("overview-gpu")


@pytest.mark.parametrize("run", ["outlier", "early_exit"])
def test_outlier_and_empty_steps_are_flagged(tab, run):
    tab.open(view="overview", run=run)
    summary = tab.api("steps", run=run)["summary"]
    outliers, empty = summary["outliers"], summary["empty_steps"]
    assert outliers or empty
    flags = tab.frame.locator("ul.flags li").all_inner_texts()
    flagged = [int(re.search(r"step (\d+):", line).group(1)) for line in flags]
    assert sorted(flagged) == sorted(outliers + empty)
    for row in tab.rows("Every profiled step"):
        assert ("outlier" in row[-1]) == (int(row[0]) in outliers)
        assert ("empty" in row[-1]) == (int(row[0]) in empty)
    tab.screenshot(f"overview-{run}")


def test_clicking_a_bar_opens_that_step(tab):
    tab.open(view="overview", run="gpu")
    data = tab.api("steps", run="gpu")
    target = data["steps"][2]["step"]
    x, y = tab.hover_until(".view-overview .chart", f"Step {target}")
    tab.page.mouse.click(x, y)
    tab.settle()
    assert tab.selections()["view"] == "step"
    assert tab.selections()["step"] == str(target)
    detail = tab.api("step", run="gpu", worker=data["worker"], step=target)
    assert tab.figure("Wall") == f"{ms(detail['wall_ms'])} ms"
    assert [r[:4] for r in tab.rows(f"Phases of step {target}")] == [
        [p, ms(t["host_ms"]), pct(t["host_ms"] / detail["wall_ms"]), ms(t["gpu_busy_ms"])]
        for p, t in detail["phases"].items()
    ]
    forward = detail["ops"]["forward"][0]
    first_ops_row = tab.card("Ops by phase").locator("tbody tr").first.inner_text().split("\t")
    assert first_ops_row == [forward["name"], count(forward["calls"]), ms(forward["self_host_ms"]),
                             ms(forward["host_ms"]), ms(forward["self_gpu_ms"]), ms(forward["gpu_ms"])]
    tab.screenshot("step")


def test_step_detail_shows_shapes_and_memory(tab, demo_run):
    data = tab.api("steps", run=demo_run)
    number = data["steps"][1]["step"]
    tab.open(view="step", run=demo_run, step=number)
    detail = tab.api("step", run=demo_run, worker=data["worker"], step=number)
    memory = [[p, d, size(m["peak_bytes"]), size(m["delta_bytes"], signed=True)]
              for p, devices in detail["memory"].items() for d, m in devices.items()]
    assert memory, "the demo profiles memory"
    assert tab.rows("Memory by phase") == memory
    op = next(o for ops in detail["ops"].values() for o in ops[:10] if o["shapes"])
    assert op["shapes"] in tab.card("Ops by phase").inner_text()
    tab.screenshot("step-memory")


def test_timeline_shows_every_step_and_a_brushed_range(tab, demo_run):
    timeline = tab.api("timeline", run=demo_run)
    tab.open(view="timeline", run=demo_run)
    steps = timeline["steps"]
    text = tab.text()
    assert tab.figure("Steps recorded") == f"{len(steps):,}"
    assert tab.figure("From step") == str(steps[0]) and tab.figure("To step") == str(steps[-1])
    for first, last in timeline["profiled"]:
        assert (f"step {first}" if first == last else f"steps {first}–{last}") in text

    box = tab.chart_box(".view-timeline .chart")
    y = box["y"] + box["height"] * 0.45
    tab.page.mouse.move(box["x"] + box["width"] * 0.3, y)
    tab.page.mouse.down()
    tab.page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=8)
    tab.page.mouse.up()
    tab.frame.locator("h3", has_text="Selected: steps").wait_for()
    chosen = tab.selections()
    first, last = int(chosen["from"]), int(chosen["to"])
    assert steps[0] < first < last < steps[-1]
    inside = [i for i, s in enumerate(steps) if first <= s <= last]
    step_mean = sum(timeline["wall"][i] for i in inside) / len(inside)
    expected = []
    for phase in timeline["phases"]:
        values = [timeline["cpu"][phase][i] for i in inside if timeline["cpu"][phase][i] is not None]
        mean = sum(values) / len(values)
        expected.append([phase, ms(mean), pct(mean / step_mean)])
    assert tab.rows(f"Selected: steps {first}–{last}") == expected
    tab.screenshot("timeline")

    tab.page.reload()
    tab.settle()
    assert tab.rows(f"Selected: steps {first}–{last}") == expected  # the selection survived the reload


def test_timeline_of_a_run_without_scalars_says_why(tab):
    tab.open(view="timeline", run="gpu")
    assert "No per-step timings for gpu yet" in tab.text()


def test_compare_two_steps_shows_the_deltas(tab):
    data = tab.api("steps", run="gpu")
    worker, slow = data["worker"], data["summary"]["slowest"]
    a, b = data["steps"][0]["step"], slow["step"]  # the fast first step against the slowest
    tab.open(view="compare", a_run="gpu", a_worker=worker, a_step=a, b_run="gpu", b_worker=worker, b_step=b)
    result = tab.api("compare", run_a="gpu", worker_a=worker, step_a=a, run_b="gpu", worker_b=worker, step_b=b)
    rows = tab.rows("Per phase")
    assert rows[:-1] == [
        [p, ms(result["a"]["phases"][p]["host_ms"]), ms(result["b"]["phases"][p]["host_ms"]),
         signed_ms(result["delta"]["phases"][p]["host_ms"]),
         change(result["a"]["phases"][p]["host_ms"], result["b"]["phases"][p]["host_ms"])]
        for p in result["phases"]
    ]
    assert rows[-1][:4] == ["step (wall)", ms(result["a"]["wall_ms"]), ms(result["b"]["wall_ms"]),
                            signed_ms(result["delta"]["wall_ms"])]
    op = result["ops"][0]
    assert tab.rows("Ops that changed most")[0] == [
        op["phase"], op["name"], count(op["a_calls"]), count(op["b_calls"]), ms(op["a_self_host_ms"]),
        ms(op["b_self_host_ms"]), signed_ms(op["delta_self_host_ms"]), signed_ms(op["delta_host_ms"]),
        signed_ms(op["delta_gpu_ms"])]
    assert result["a"]["label"] in tab.text() and result["b"]["label"] in tab.text()
    tab.screenshot("compare-steps")


def test_compare_opens_on_two_steps_when_no_other_run_ran_the_same_model(tab):
    # The other runs here are other models (MNIST, a TorchRec job, crafted traces): never paired by
    # default (test_gpu_views.py pairs two runs of one model).
    tab.open(view="compare", run="gpu")
    chosen = tab.selections()
    numbers = [str(r["step"]) for r in tab.api("steps", run="gpu")["steps"]]
    assert chosen["a_run"] == chosen["b_run"] == "gpu"
    assert chosen["a_step"] in numbers and chosen["b_step"] in numbers and chosen["a_step"] != chosen["b_step"]
    result = tab.api("compare", run_a="gpu", worker_a=chosen["a_worker"], step_a=chosen["a_step"], run_b="gpu",
                     worker_b=chosen["b_worker"], step_b=chosen["b_step"])
    assert f"{signed_ms(result['b']['wall_ms'] - result['a']['wall_ms'])} ms" in tab.text()
    tab.screenshot("compare-runs")


def test_ranks_call_out_the_straggler(tab):
    tab.open(view="ranks", run="straggler")
    data = tab.api("ranks", run="straggler")
    s = data["straggler"]
    assert s["rank"] == 1
    text = tab.text()
    assert f"Straggler: rank {s['rank']}" in text
    banner = " ".join(tab.frame.locator(".straggler").inner_text().split())
    assert f"{s['reason']}. It works longest against the median rank in {s['phase']} " \
           f"({signed_ms(s['phase_behind_ms'])} ms per step" in banner
    rows = tab.rows("Ranks (")
    assert [r[:4] for r in rows] == [
        [str(r["rank"]), r["worker"] + ("straggler" if r["worker"] == s["worker"] else ""), str(r["steps"]),
         ms(r["wall_ms"])] for r in data["ranks"]
    ]
    assert [r[4:6] for r in rows] == [[ms(r["comm_ms"]), ms(r["compute_ms"])] for r in data["ranks"]]
    tab.screenshot("ranks")
    tab.card("Ranks (").locator("tbody tr").nth(1).click()
    tab.settle()
    assert tab.selections()["view"] == "overview" and tab.selections()["worker"] == data["ranks"][1]["worker"]


def test_ranks_even_within_noise_say_so(tab):
    tab.open(view="ranks", run="ranks")
    data = tab.api("ranks", run="ranks")
    assert data["straggler"] is None  # two steps per rank: too few to single one out
    assert "straggler" not in " ".join(r[1] for r in tab.rows("Ranks ("))
    assert f"No straggler: {data['note']}." in tab.text()


def test_ranks_over_the_whole_run(tab):
    tab.open(view="ranks", run="ranks")
    whole = tab.api("ranks", run="ranks")["whole_run"]
    assert [w["rank"] for w in whole] == [0, 1]
    rows = tab.rows("Every step of each rank")
    step = [next(p for p in w["phases"] if p["phase"] == "step" and p["clock"] == "host") for w in whole]
    assert [r[:4] for r in rows] == [[str(w["rank"]), str(w["steps"]), ms(s["p90_ms"]), ms(s["max_ms"])]
                                     for w, s in zip(whole, step)]
    assert [r[4] for r in rows] == [ms(s["median_ms"]) for s in step]


def test_gpu_view_is_off_for_runs_without_device_activity(tab):
    tab.open(view="overview", run="early_exit")
    gpu = tab.frame.get_by_role("radio", name="GPU")
    assert gpu.is_disabled()
    tab.open(view="overview", run="gpu")
    assert tab.frame.get_by_role("radio", name="GPU").is_enabled()


def test_follows_tensorboards_dark_mode(tab):
    tab.open(dark=True, view="ranks", run="ranks")
    frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
    assert frame.evaluate("document.documentElement.classList.contains('dark')")
    assert frame.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(48, 48, 48)"
    tab.screenshot("ranks-dark")
    tab.page.evaluate("document.body.classList.remove('dark-mode')")
    frame.wait_for_function("!document.documentElement.classList.contains('dark')")
    # one palette, light and dark together (styles.css): the light side of each colour again
    assert frame.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(245, 245, 245)"


def test_selections_survive_a_reload(tab):
    data = tab.api("steps", run="gpu")
    tab.open(view="overview", run="gpu")
    tab.frame.get_by_role("radio", name="Step").click()
    tab.settle()
    tab.frame.get_by_label("Step", exact=True).select_option(str(data["steps"][0]["step"]))
    tab.settle()
    tab.page.reload()
    tab.settle()
    assert tab.selections()["step"] == str(data["steps"][0]["step"])
    assert f"Phases of step {data['steps'][0]['step']}" in tab.text()


def test_a_run_added_later_appears_when_tensorboard_reloads(tab, logdir, traces):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    tab.open(view="overview", run="gpu")
    late = logdir / "zz_late"
    late.mkdir()
    for f in traces.files("cpu", "repeat2"):
        shutil.copy(f, late / f.name)
        settled(late / f.name)
    option = tab.frame.locator("select[aria-label='Run'] option[value='zz_late']")
    for _ in range(20):  # the backend rescans the logdir at most every few seconds
        tab.page.locator("app-header-reload button.reload-button").click()  # TensorBoard tells the tab
        try:
            option.wait_for(state="attached", timeout=3_000)
            break
        except PlaywrightTimeout:  # not rescanned yet: reload again
            continue
    tab.frame.get_by_label("Run").select_option("zz_late")
    wait_loaded(lambda: tab.api("runs"))  # loaded, so that later tests start settled
    want = [s["step"] for s in tab.api("steps", run="zz_late")["steps"]]
    # The tab may have drawn the run when only its first span was loaded; the second shows on a
    # later reload, as any span that appears later does.
    for _ in range(20):
        tab.settle()
        if [int(r[0]) for r in tab.rows("Every profiled step")] == want:
            break
        tab.page.locator("app-header-reload button.reload-button").click()
        time.sleep(0.5)
    assert [int(r[0]) for r in tab.rows("Every profiled step")] == want


def test_the_timeline_follows_a_growing_run(tab, logdir):
    from playwright.sync_api import expect

    tab.open(view="timeline", run="growing")
    assert tab.figure("Steps recorded") == "10"
    write_scalars(logdir / "growing", range(10, 25))
    recorded = tab.frame.locator(".figure", has_text="Steps recorded").locator(".figure-value")
    for _ in range(30):  # TensorBoard reads new events every few seconds
        tab.page.locator("app-header-reload button.reload-button").click()
        try:
            expect(recorded).to_have_text("25", timeout=2_000)
            break
        except AssertionError:
            continue
    expect(recorded).to_have_text("25", timeout=1)


def test_names_from_traces_show_as_text(tab):
    tab.open(view="overview", run="xss")
    text = tab.text()
    assert XSS_OP in text and XSS_PHASE in text
    tab.hover_until(".view-overview .chart", "Step 2")
    assert XSS_PHASE in tab.text(".view-overview .chart .tip")
    tab.screenshot("names-as-text")
    tab.open(view="step", run="xss", step=1)
    text = tab.text()
    assert XSS_OP in text and XSS_PHASE in text and XSS_WORKER in text
    assert tab.frame.locator("img, svg[onload]").count() == 0


def test_api_errors_are_shown(tab):
    tab.expected_errors.append("status of 404")  # the browser logs the failed request itself
    tab.open(view="step", run="gpu", step=99999)
    text = tab.text()
    assert "Could not load step 99999 of gpu" in text and "404" in text
    tab.screenshot("error")


# -- time kept out of the steps: evaluation passes, paused blocks, the profiler's own time ------------

#: Colours the tab gives them in the light theme (frontend/src/theme.ts), and forward's.
EVALUATION_RGB, PROFILER_RGB, FORWARD_RGB = (106, 27, 154), (191, 54, 12), (66, 165, 245)


def pixels_of(tab, selector: str, colours: dict[str, tuple[int, int, int]]) -> dict[str, list[int]]:
    """The rows (CSS px from the chart's top) where each colour is drawn on the chart's canvas."""
    frame = next(f for f in tab.page.frames if "plugin_entry.html" in f.url)
    return frame.evaluate("""([selector, colours]) => {
        const canvas = document.querySelector(selector + ' canvas');
        const ratio = canvas.width / canvas.clientWidth;
        const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        const out = {};
        for (const [name, [r, g, b]] of Object.entries(colours)) {
            const rows = new Set();
            for (let i = 0; i < data.length; i += 4) {
                const near = Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 12;
                if (near && data[i + 3] > 200) rows.add(Math.floor(i / 4 / canvas.width / ratio));
            }
            out[name] = [...rows].sort((a, b) => a - b);
        }
        return out;
    }""", [selector, colours])


def test_the_timeline_draws_evaluation_and_the_profilers_time_apart_from_the_steps(tab):
    timeline = tab.api("timeline", run="evaluation")
    tab.open(view="timeline", run="evaluation")
    legend = tab.card("Every step").locator(".legend").all_inner_texts()
    assert "evaluation (outside the steps)" in legend[1] and "profiler’s own time (outside the steps)" in legend[1]
    passes = [v for v in timeline["eval"] if v is not None]
    assert tab.figure("Evaluation") == f"{ms(sum(passes))} ms"
    # Drawn apart: evaluation's bars and the profiler's line only in a grid of their own, under the
    # stacked phases (28 px of title, then 250 px of phases; the grid apart starts 34 px lower).
    drawn = pixels_of(tab, ".view-timeline .chart",
                      {"eval": EVALUATION_RGB, "profiler": PROFILER_RGB, "forward": FORWARD_RGB})
    assert drawn["eval"] and drawn["profiler"] and drawn["forward"], drawn
    assert max(drawn["forward"]) <= 28 + 250 < 28 + 250 + 34 <= min(drawn["eval"] + drawn["profiler"])
    tab.hover_until(".view-timeline .chart", "Step 2", y_fraction=0.75)  # over the grid apart
    tip = tab.text(".view-timeline .chart .tip")
    assert f"evaluation (outside the steps)\t{ms(timeline['eval'][2])} ms" in tip
    assert f"step (wall)\t{ms(timeline['wall'][2])} ms" in tip  # the step without its pass
    tab.screenshot("timeline-outside")


def test_the_timeline_shows_the_hooks_own_time_and_says_what_it_is(tab):
    timeline = tab.api("timeline", run="evaluation")
    hooks = [v for v in timeline["hook"] if v]
    assert len(hooks) == 10
    tab.open(view="timeline", run="evaluation")
    assert tab.figure("phaseprof’s hooks") == f"{ms(sum(hooks))} ms"
    label = tab.frame.locator(".figure-label", has_text="phaseprof’s hooks")
    figure = tab.frame.locator(".figure", has=label)
    what = "in no phase and not in a step’s time"
    title = figure.get_attribute("title")
    assert what in title and f"{ms(sum(hooks) / len(hooks))} ms a step" in title
    assert what in tab.card("Every step").locator(".hook-note").inner_text()
    tab.hover_until(".view-timeline .chart", "Step 7", y_fraction=0.5)
    tip = tab.text(".view-timeline .chart .tip")
    assert f"phaseprof’s hooks (in no phase)\t{ms(timeline['hook'][7])} ms" in tip
    assert f"step (wall)\t{ms(timeline['wall'][7])} ms" in tip  # the step without the hook's time


def test_the_overview_and_the_step_show_the_time_kept_out_of_the_step_apart(tab):
    data = tab.api("steps", run="evaluation")
    rows = {r["step"]: r for r in data["steps"]}
    tab.open(view="overview", run="evaluation")
    assert tab.figure("Evaluation") == f"{ms(data['summary']['eval_ms'])} ms"
    header = tab.card("Every profiled step").locator("thead").inner_text()
    assert "Evaluation ms (outside)" in header and "Paused ms (outside)" in header
    table = {int(r[0]): r for r in tab.rows("Every profiled step")}
    assert table[2][1] == ms(rows[2]["wall_ms"]) == "10.000"  # the step's own time
    assert ms(rows[2]["eval_ms"]) in table[2] and ms(rows[3]["paused_ms"]) in table[3]
    x, _ = tab.hover_until(".view-overview .chart", "Step 2")
    tip = tab.text(".view-overview .chart .tip")
    assert f"evaluation (outside the steps)\t{ms(rows[2]['eval_ms'])} ms" in tip
    assert f"step (wall)\t{ms(rows[2]['wall_ms'])} ms" in tip
    assert "time kept out of the steps ran inside the profiled window" in tab.text()
    tab.screenshot("overview-outside")

    tab.open(view="step", run="evaluation", step=2)
    detail = tab.api("step", run="evaluation", step=2)
    assert tab.figure("Evaluation (outside)") == f"{ms(detail['eval_ms'])} ms"
    assert tab.figure("Wall") == f"{ms(detail['wall_ms'])} ms"
    assert (f"The window of step 2 also held an evaluation pass ({ms(detail['eval_ms'])} ms, launching "
            f"{ms(detail['eval_gpu_ms'])} ms of GPU work).") in tab.text()
    phases = tab.rows("Phases of step 2")
    assert [r[0] for r in phases] == list(detail["phases"])  # no "eval" phase
    assert "evaluation (outside the steps)" in tab.card("Timeline of the step").locator(".legend").inner_text()
    tab.frame.locator(".trace-canvas").wait_for()
    tab.screenshot("step-outside")

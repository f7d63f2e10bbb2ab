"""The Timeline's "Trace the next N steps" against a running training job, in a real TensorBoard
and a real browser: the button leads to a new span in the tab; once the job ended, the card says
why it cannot trace it."""

from __future__ import annotations

import time
import urllib.error

import pytest

from tests.capture_job import Job
from tests.tensorboard_server import TensorBoard

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    job = Job(tmp_path_factory.mktemp("capture"), step_s=0.05, active=5)
    try:
        job.ready()
        yield job
    finally:
        job.kill()


@pytest.fixture(scope="module")
def tensorboard(job):
    """This module's TensorBoard: on the running job's logdir only."""
    tb = TensorBoard(job.logdir, "--reload_interval", "1")
    try:
        deadline = time.monotonic() + 180
        while True:  # until TensorBoard has read the job's first scalars
            try:
                tb.json("/data/plugin/phaseprof/timeline?run=long")
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield tb
    finally:
        tb.close()


def test_the_button_traces_the_next_steps_into_a_new_span(tab, job):
    tab.open(view="timeline", run="long")
    card = tab.card("Trace the next steps")
    card.locator("text=The run is running").wait_for(timeout=60_000)
    card.locator("input.capture-steps").fill("3")
    card.locator("button", has_text="Trace the next 3 steps").click()
    progress = card.locator(".capture-progress")
    progress.locator("button", has_text="Open step").wait_for(timeout=180_000)
    text = progress.inner_text()
    assert text.startswith("New span: steps ")
    first, last = (int(s) for s in text.split("New span: steps ")[1].split(".")[0].split("–"))
    assert last - first == 2
    (capture,) = tab.api("capture", run="long")["captures"]
    assert capture["by"] == "tab" and capture["state"] == "written" and capture["first"] == first
    tab.screenshot("capture-card")
    progress.locator("button", has_text=f"Open step {first}").click()
    tab.frame.locator(".view-step").first.wait_for(timeout=60_000)
    assert tab.selections()["step"] == str(first) and tab.selections()["view"] == "step"
    # the new span's steps are the tab's steps: the step view draws the captured step
    steps = tab.api("steps", run="long")["steps"]
    assert [s["step"] for s in steps][-3:] == [first, first + 1, first + 2]
    tab.screenshot("capture-new-span")


def test_an_ended_run_is_refused_with_the_reason(tab, job):
    job.finish()
    tab.open(view="timeline", run="long")
    card = tab.card("Trace the next steps")
    reason = card.locator(".capture-reason")
    reason.wait_for(timeout=60_000)
    assert "Cannot trace this run now: the run ended at step" in reason.inner_text()
    assert card.locator("button", has_text="Trace the next").is_disabled()
    # the capture taken before is listed: a click on it opens its first step
    (capture,) = tab.api("capture", run="long")["captures"]
    assert "from the tab" in tab.rows("Trace the next steps")[0][1]
    card.locator("table tbody tr").first.click()
    tab.frame.locator(".view-step").first.wait_for(timeout=60_000)
    assert tab.selections()["step"] == str(capture["first"])

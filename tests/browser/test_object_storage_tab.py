"""The Step Phases tab of a real TensorBoard started with ``--logdir s3://…`` on a real S3 server on the
loopback (`tests.s3`), in a real headless Chromium."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.tensorboard_server import loaded

from .tab import ms

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def tensorboard(s3, tmp_path_factory, traces):
    """TensorBoard on ``s3://tab/p``: a run of a real GPU trace, uploaded as a user would."""
    local = tmp_path_factory.mktemp("s3-tab")
    (local / "gpu").mkdir()
    for f in traces.files("gpu", "hta_ns_resolution"):
        shutil.copy(f, local / "gpu" / f.name)
    s3.client().create_bucket(Bucket="tab")
    s3.upload_tree(local, "tab", "p")
    with loaded("s3://tab/p") as tb:
        yield tb


def test_the_tab_renders_a_run_read_from_a_bucket(tab):
    tab.open(view="overview", run="gpu")
    data = tab.api("steps", run="gpu")
    assert [r["step"] for r in data["steps"]] == [101, 102, 103, 104, 105]
    assert tab.figure("Mean step") == f"{ms(data['summary']['mean_wall_ms'])} ms"
    assert [r[0] for r in tab.rows("Every profiled step")] == ["101", "102", "103", "104", "105"]
    tab.screenshot("s3-overview")


def test_the_tab_says_why_a_bucket_shows_nothing_in_the_run_list_s_place(browser, s3, tensorboard_server,
                                                                        request):
    """TensorBoard on a bucket that is not there: the tab says so, once, where the runs would be."""
    from .conftest import open_tab

    tb = tensorboard_server("s3://not-made/p")
    deadline = time.monotonic() + 180  # generous: it only turns a hang into a failure
    while (why := tb.json("/data/plugin/phaseprof/runs")["logdir_error"]) is None:
        assert time.monotonic() < deadline, "no reason given"
        time.sleep(0.3)
    with open_tab(browser, tb, request, viewport={"width": 1400, "height": 900}) as t:
        t.page.goto(tb.url + "#phaseprof")
        shown = t.frame.locator(".pane .logdir-error")
        shown.wait_for(timeout=60_000)
        assert " ".join(shown.inner_text().split()) == f"The logdir cannot be read. {why}"
        assert "no bucket 'not-made'" in why
        assert t.frame.get_by_text(why).count() == 1  # once: not again among the notices
        t.screenshot("s3-no-bucket")

"""End to end: the installed plugin inside a real `tensorboard` process, over HTTP."""

from __future__ import annotations

import shutil
import time

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tests.logdir import settled, write_scalars

pytestmark = pytest.mark.slow


def test_real_tensorboard_serves_runs_steps_and_step_detail(tmp_path, traces, tensorboard_server):
    for run, src in {"gpu": ("gpu", "hta_ns_resolution"), "cpu": ("cpu", "base")}.items():
        (tmp_path / run).mkdir()
        for f in traces.files(*src):
            shutil.copy(f, tmp_path / run / f.name)
            settled(tmp_path / run / f.name)
    write_scalars(tmp_path / "cpu", range(12))
    tb = tensorboard_server(tmp_path)
    listing = tb.json("/data/plugins_listing")
    assert listing["phaseprof"]["enabled"] is True
    assert listing["phaseprof"]["tab_name"] == "Step Phases"
    runs = tb.wait_loaded()
    assert {r["run"] for r in runs["runs"]} == {"gpu", "cpu"}
    steps = tb.json("/data/plugin/phaseprof/steps?run=gpu")
    assert [s["step"] for s in steps["steps"]] == [101, 102, 103, 104, 105]
    assert all(s["phases"]["backward"]["gpu_ms"] > 0 for s in steps["steps"])
    detail = tb.json("/data/plugin/phaseprof/step?run=gpu&step=104")
    assert detail["ops"]["forward"] and detail["lanes"]["bands"]
    timeline = tb.json("/data/plugin/phaseprof/timeline?run=cpu")
    assert timeline["steps"] == list(range(12)) and timeline["profiled"] == [[2, 11]]
    with tb.open("/data/plugin/phaseprof/index.js") as r:
        assert r.headers["Content-Type"].startswith("text/javascript")
    log = "".join(tb.log)
    assert "this warning will become an error" not in log  # TensorBoard's security validator
    assert "Traceback" not in log


def test_plugin_is_inactive_without_traces(tmp_path, tensorboard_server):
    writer = EventFileWriter(str(tmp_path / "other"))  # unrelated scalars only
    for s in range(3):
        value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (s + 1))
        writer.add_event(event_pb2.Event(step=s, wall_time=time.time(), summary=summary_pb2.Summary(value=[value])))
    writer.close()
    (tmp_path / "other" / "notes.json").write_text("{}")
    tb = tensorboard_server(tmp_path)
    assert tb.json("/data/plugins_listing")["phaseprof"]["enabled"] is False

"""Per-rank scalars: each rank's every-step phase times in ``<run>/rank<N>/``, read back by the
report, the timeline and the Ranks view as one run's ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from phaseprof import analyze
from phaseprof.contract import STEP_TAG, host_tag
from phaseprof.plugin.reading.discovery import discover
from tests.logdir import settled
from tests.test_plugin import make_app
from tests.test_whole_run import write_events

BASE = "/data/plugin/phaseprof"


def two_rank_job(root, traces):
    """A run "job": two real rank traces, and each rank's scalars (rank 1's forward 3 ms slower)."""
    (root / "job").mkdir(parents=True)
    for f in traces.files("gpu", "hta_sampled_2rank"):
        shutil.copy(f, root / "job" / f.name)
    for rank in (0, 1):
        write_events(root / "job" / f"rank{rank}", [
            (s, {STEP_TAG: 10.0 + 3 * rank + s % 2, host_tag("forward"): 4.0 + 3 * rank, host_tag("backward"): 6.0})
            for s in range(50)])
    for f in root.rglob("*"):
        settled(f)
    return root


def test_rank_folders_are_the_ranks_of_their_run(tmp_path, traces):
    two_rank_job(tmp_path, traces)
    (run,) = discover(str(tmp_path))
    assert run.name == "job" and sorted(run.rank_scalars) == [0, 1] and not run.has_scalars
    (job,) = analyze(str(tmp_path))["runs"]
    whole = {w["rank"]: {p["phase"]: p for p in w["phases"]} for w in job["whole_run"]}
    assert sorted(whole) == [0, 1]
    assert whole[0]["forward"]["median_ms"] == 4.0 and whole[1]["forward"]["median_ms"] == 7.0
    assert whole[1]["step"]["steps"] == 49  # the first step left out, as the summary on close does
    text = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", str(tmp_path)], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "run job · whole run of 2 ranks (per-step scalars)" in text
    assert "slowest step of any rank: 1 on rank 1 (14.00 ms" in text


def test_timeline_and_ranks_routes_read_every_rank(tmp_path, traces):
    two_rank_job(tmp_path, traces)
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        runs = json.loads(client.get(f"{BASE}/runs").get_data())["runs"]
        assert [(r["run"], r["has_scalars"]) for r in runs] == [("job", True)]
        timeline = json.loads(client.get(f"{BASE}/timeline?run=job").get_data())
        assert timeline["steps"] == list(range(50)) and timeline["cpu"]["forward"][0] == 4.0  # rank 0's
        answer = json.loads(client.get(f"{BASE}/ranks?run=job").get_data())
        assert [r["rank"] for r in answer["ranks"]] == [0, 1]
        whole = {w["rank"]: {p["phase"]: p for p in w["phases"]} for w in answer["whole_run"]}
        assert sorted(whole) == [0, 1] and whole[1]["forward"]["median_ms"] == 7.0
    finally:
        plugin._store.close()

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


def test_ranks_are_made_once_per_change_of_the_run_not_per_request(tmp_path, traces, monkeypatch):
    """``/ranks`` asked again answers what it made before: the ranks side by side are made again only
    when a span of the run is added, and a rank's whole-run figures only when its scalars changed."""
    from phaseprof.plugin import facade

    made = {"ranks": 0, "whole_run": 0}

    def counted(name, real):
        def call(*args):
            made[name] += 1
            return real(*args)
        return call

    monkeypatch.setattr(facade, "ranks", counted("ranks", facade.ranks))
    monkeypatch.setattr(facade, "whole_run", counted("whole_run", facade.whole_run))
    two_rank_job(tmp_path, traces)
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        answers = [json.loads(client.get(f"{BASE}/ranks?run=job").get_data()) for _ in range(3)]
        assert answers[0] == answers[1] == answers[2] and len(answers[0]["whole_run"]) == 2
        assert made == {"ranks": 1, "whole_run": 2}
        # rank 1 wrote more steps: its figures (only) are made again
        write_events(tmp_path / "job" / "rank1", [(s, {STEP_TAG: 30.0, host_tag("forward"): 20.0})
                                                  for s in range(50, 60)])
        plugin._data_provider._multiplexer.Reload()
        again = json.loads(client.get(f"{BASE}/ranks?run=job").get_data())
        assert made == {"ranks": 1, "whole_run": 3} and again["whole_run"] != answers[0]["whole_run"]
        # a worker's span added: the ranks are made again, once
        shutil.copy(traces.files("cpu", "base")[0], tmp_path / "job" / "late.1.pt.trace.json.gz")
        settled(tmp_path / "job" / "late.1.pt.trace.json.gz")
        assert plugin._store.wait(300)
        changed = [json.loads(client.get(f"{BASE}/ranks?run=job").get_data()) for _ in range(2)]
        assert made["ranks"] == 2 and changed[0] == changed[1]
        assert "late" in [r["worker"] for r in changed[0]["ranks"]] + changed[0]["not_ranks"]
    finally:
        plugin._store.close()

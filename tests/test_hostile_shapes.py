"""Traces of a hostile shape — many empty steps, thousands of phase ranges in one step, module
records nested a thousand deep — answered by the report (``--json``, ``--modules``) and by every
route of the tab, without error. Smaller than `benchmarks/scaling.py`'s sizes (which time them):
here what is checked is that each answers, and answers what the trace holds."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from phaseprof.cli.report import analyze
from tests.logdir import settled
from tests.scaling_traces import depth, empty_steps, ranges
from tests.test_plugin import BASE, make_app

SHAPES = {"empty steps": (empty_steps, 2_000), "phase ranges in a step": (ranges, 2_000),
          "nested modules": (depth, 1_000)}


def routes(run: str, worker: str, numbers: list[int]) -> list[str]:
    """Every GET route of the tab (plugin/http_api.md) for ``run``/``worker``, the step routes for
    its first and last step (``timeline`` reads the scalars a trace-only run lacks: not asked)."""
    q = urllib.parse.quote
    rw = f"run={q(run)}&worker={q(worker)}"
    out = [f"{route}?run={q(run)}" for route in ("ranks", "collectives", "capture")]
    out += [f"steps?{rw}", f"ops?{rw}&group=name", f"ops?{rw}&group=shapes", f"kernels?{rw}",
            f"modules?{rw}", f"collectives?{rw}", f"compare?run_a={q(run)}&run_b={q(run)}"]
    for device in ("cpu", "gpu"):
        sides = (f"run_a={q(run)}&worker_a={q(worker)}&run_b={q(run)}&worker_b={q(worker)}"
                 f"&device={device}")
        out += [f"compare?{sides}", f"compare?{sides}&step_a={numbers[0]}&step_b={numbers[-1]}"]
    for n in {numbers[0], numbers[-1]}:
        out += [f"{route}?{rw}&step={n}" for route in ("step", "trace", "memory", "memory_events",
                                                        "kernels", "modules", "collectives")]
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_hostile_shape_is_answered_by_the_report_and_every_route(shape, tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROF_CACHE", "off")
    build, n = SHAPES[shape]
    logdir = tmp_path / "logdir"
    run = logdir / "run"
    run.mkdir(parents=True)
    settled(build(n, run))

    report = analyze(str(run), modules=True)
    assert not report["errors"], report["errors"]
    (worker,) = report["runs"][0]["workers"]
    steps = worker["steps"]
    modules = worker["modules"]["modules"]
    if shape == "empty steps":
        assert len(steps) == n and all(s["inferred_phases"] == ["forward"] for s in steps)
    elif shape == "phase ranges in a step":
        (only,) = steps
        phases = only["phases"]
        assert phases["forward"]["host_ms"] == phases["backward"]["host_ms"] == n // 2 * 0.01
    else:  # one module per level, each level's path one record longer, cut past 32 records
        assert len(modules) == n and max(m["depth"] for m in modules) == min(n - 1, 256)
        paths = [m["path"] for m in modules]
        assert len(set(paths)) == n and max(len(p) for p in paths) < 300
        assert sum(f"…{n - 16} more…" in p for p in paths) == 1  # the deepest: 8 records, a cut, 8

    plugin, client = make_app(logdir)
    try:
        assert plugin._store.wait(300)
        numbers = [s["step"] for s in steps]
        for route in routes("run", worker["worker"], numbers):
            response = client.get(f"{BASE}/{route}")
            assert response.status_code == 200, (route, response.get_data(as_text=True)[:500])
            json.loads(response.get_data())
    finally:
        plugin._store.close()

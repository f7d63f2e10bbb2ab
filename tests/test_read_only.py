"""Read-only means no write under the logdir: a TensorBoard run with ``PHASEPROF_READ_ONLY=1`` or
``--phaseprof_read_only``, asked every GET route of the tab for every run, worker and step, and
``phaseprof report`` with the variable set, leave the logdir's tree as it was, byte for byte
(listing, sizes, modification times, directories included), while the analyses and step indexes
they make go to the user's cache directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
from pathlib import Path

import pytest

from phaseprof.plugin.serving.capture import READ_ONLY_ENV
from tests.logdir import settled, write_scalars
from tests.tensorboard_server import RUNS

pytestmark = pytest.mark.slow


def logdir_of(tmp_path: Path, traces) -> Path:
    """Two runs whose traces have no analysis yet, so that a reader would want to write one: a CPU
    loop with memory and its phase scalars, and two GPU ranks that meet at collectives."""
    logdir = tmp_path / "logdir"
    for run, parts in (("cpu", ("cpu", "base")), ("gpu", ("gpu", "hta_sampled_2rank"))):
        (logdir / run).mkdir(parents=True)
        for f in traces.files(*parts):
            settled(shutil.copy(f, logdir / run / f.name))
    write_scalars(logdir / "cpu", range(2, 12))
    for path in [logdir, *logdir.rglob("*")]:
        settled(path)  # directories too: a listing that changed would show in their times
    return logdir


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (itself included): its kind, mode, size, modification time and,
    for a file, a digest of its bytes."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(path)
        digest = hashlib.blake2b(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def get(tb, route: str, **params) -> int:
    """The status of ``GET route?params``: an answer, or the error of a route asked for what is
    not there."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    try:
        with tb.open(f"/data/plugin/phaseprof/{route}?{query}", timeout=300) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def every_route(tb) -> list[tuple[str, dict, int]]:
    """Ask every GET route of the tab (plugin/http_api.md) for every run, worker and step."""
    asked: list[tuple[str, dict, int]] = []

    def ask(route: str, **params) -> dict:
        asked.append((route, params, get(tb, route, **params)))
        return params

    runs = tb.json(RUNS)["runs"]
    for run in runs:
        name = run["run"]
        for route in ("timeline", "ranks", "collectives", "capture"):
            ask(route, run=name)
        for w in run["workers"]:
            worker = w["worker"]
            steps = tb.json(f"/data/plugin/phaseprof/steps?run={urllib.parse.quote(name)}"
                            f"&worker={urllib.parse.quote(worker)}")["steps"]
            numbers = [s["step"] for s in steps]
            assert numbers, f"{name}/{worker}: no steps to ask for"
            ask("steps", run=name, worker=worker)
            for group in ("name", "shapes"):
                ask("ops", run=name, worker=worker, group=group)
            for route in ("kernels", "modules", "collectives"):
                ask(route, run=name, worker=worker)
            sides = dict(run_a=name, worker_a=worker, run_b=name, worker_b=worker)
            for device in ("cpu", "gpu"):
                ask("compare", **sides, device=device)
                ask("compare", **sides, step_a=numbers[0], step_b=numbers[-1], device=device)
            for n in numbers:
                for route in ("step", "trace", "memory", "memory_events", "kernels", "modules",
                              "collectives"):
                    ask(route, run=name, worker=worker, step=n)
    for a in runs:  # each run against each other, as the Compare view asks
        for b in runs:
            ask("compare", run_a=a["run"], run_b=b["run"])
    return asked


@pytest.mark.parametrize("how", ["environment", "flag"])
def test_a_read_only_tensorboard_serving_every_route_leaves_the_logdir_byte_identical(
        tmp_path, traces, tensorboard_server, monkeypatch, how):
    logdir = logdir_of(tmp_path, traces)
    before = tree(logdir)
    user_cache = tmp_path / "user-cache"  # the cache on (tests turn it off), out of the logdir
    env = {"PHASEPROF_CACHE": str(user_cache), READ_ONLY_ENV: "1" if how == "environment" else ""}
    monkeypatch.delenv(READ_ONLY_ENV, raising=False)
    flags = ["--phaseprof_read_only"] if how == "flag" else []
    tb = tensorboard_server(logdir, *flags, env=env)
    loaded = tb.wait_loaded(files=3)
    spans = [s for r in loaded["runs"] for w in r["workers"] for s in w["spans"]]
    assert not loaded["errors"] and all(s["state"] == "ready" for s in spans), loaded

    asked = every_route(tb)
    statuses = [status for _, _, status in asked]
    assert all(s in (200, 404) for s in statuses), [a for a in asked if a[2] not in (200, 404)]
    routes = {route for route, _, status in asked if status == 200}
    assert routes == {"timeline", "ranks", "collectives", "capture", "steps", "ops", "kernels",
                      "modules", "compare", "step", "trace", "memory", "memory_events"}
    assert statuses.count(200) >= 60, asked

    assert tree(logdir) == before
    # and the plugin did make analyses and step indexes: in the user's cache
    made = sorted(p.suffix for p in user_cache.rglob("*") if p.is_file())
    assert made.count(".analysis") == 3 and made.count(".steps") == 3, made


def test_report_and_compare_with_read_only_set_leave_the_logdir_byte_identical(tmp_path, traces):
    logdir = logdir_of(tmp_path, traces)
    before = tree(logdir)
    # each with a user cache of its own: each reads every trace afresh, and wants to write
    for i, args in enumerate((["report", logdir], ["report", logdir, "--json"],
                              ["compare", logdir / "gpu", logdir / "cpu"])):
        user_cache = tmp_path / f"user-cache-{i}"
        env = {**os.environ, "PHASEPROF_CACHE": str(user_cache), READ_ONLY_ENV: "1"}
        out = subprocess.run([sys.executable, "-m", "phaseprof.cli", *map(str, args)],
                             capture_output=True, text=True, env=env, timeout=600)
        # (compare refuses the 4 steps of gpu, after reading every trace of both sides)
        assert out.returncode == (2 if args[0] == "compare" else 0), out.stderr
        assert tree(logdir) == before
        made = [p.suffix for p in user_cache.rglob("*") if p.is_file()]
        assert made.count(".analysis") == 3, made

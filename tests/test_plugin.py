"""The TensorBoard plugin's routes through TensorBoard's own WSGI app (werkzeug test client)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

import phaseprof.plugin
from phaseprof import analyze
from phaseprof.plugin.serving.plugin import PhaseprofPlugin
from tests.logdir import settled, two_rank_job, write_scalars

BASE = "/data/plugin/phaseprof"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, traces):
    root = tmp_path_factory.mktemp("logdir")
    copies = {
        "gpu": ("gpu", "hta_ns_resolution"),
        "cpu/base": ("cpu", "base"),
        "ranks": ("gpu", "hta_sampled_2rank"),
    }
    for run, src in copies.items():
        (root / run).mkdir(parents=True)
        for f in traces.files(*src):
            shutil.copy(f, root / run / f.name)
    write_scalars(root / "cpu" / "base", range(0, 30))
    (root / "bad").mkdir()
    (root / "bad" / "w.1.pt.trace.json").write_text('{"traceEvents": [')
    (root / "scalars_only").mkdir()
    write_scalars(root / "scalars_only", range(3))
    for f in root.rglob("*"):
        settled(f)
    return root


def make_app(logdir):
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    context = base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer,
                                    data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)))
    plugin = PhaseprofPlugin(context)
    return plugin, werkzeug_test.Client(application.TensorBoardWSGI([plugin]))


@pytest.fixture(scope="module")
def served(logdir):
    plugin, client = make_app(logdir)
    assert plugin._store.wait(300)
    yield plugin, client
    plugin._store.close()


def get(client, path, status=200):
    response = client.get(path)
    assert response.status_code == status, (path, response.get_data(as_text=True))
    assert response.headers["X-Content-Type-Options"] == "nosniff"  # went through http_util.Respond
    return json.loads(response.get_data()) if response.mimetype == "application/json" else response


def test_plugin_is_listed_active_with_traces_and_inactive_without(served, tmp_path):
    _, client = served
    listing = get(client, "/data/plugins_listing")
    assert listing["phaseprof"]["enabled"] is True
    assert listing["phaseprof"]["tab_name"] == "Step Phases"
    assert listing["phaseprof"]["loading_mechanism"] == {"type": "IFRAME", "module_path": f"{BASE}/index.js"}
    plugin, empty_client = make_app(tmp_path)
    plugin._store.refresh(force=True)
    assert get(empty_client, "/data/plugins_listing")["phaseprof"]["enabled"] is False
    plugin._store.close()


def test_runs_lists_workers_spans_states_and_errors(served):
    _, client = served
    body = get(client, f"{BASE}/runs")
    runs = {r["run"]: r for r in body["runs"]}
    assert set(runs) == {"gpu", "cpu/base", "ranks", "bad", "scalars_only"}
    assert runs["scalars_only"] == {"run": "scalars_only", "has_scalars": True, "workers": []}
    assert [w["worker"] for w in runs["ranks"]["workers"]] == ["sampled_rank-0", "sampled_rank-1"]
    assert [w["rank"] for w in runs["ranks"]["workers"]] == [0, 1]
    span = runs["gpu"]["workers"][0]["spans"][0]
    assert span["state"] == "ready" and span["steps"] == 5 and span["error"] is None
    bad = runs["bad"]["workers"][0]["spans"][0]
    assert bad["state"] == "error" and "not valid JSON" in bad["error"]
    assert body["errors"] == [{"path": "bad/w.1.pt.trace.json", "error": bad["error"]}]
    assert body["loading"]["done"] == body["loading"]["files"] == 5


def test_steps_are_the_same_analysis_as_the_report(served, logdir):
    _, client = served
    body = get(client, f"{BASE}/steps?run=gpu")
    expected = analyze(str(logdir / "gpu"))["runs"][0]["workers"][0]
    assert body["steps"] == expected["steps"]
    assert body["summary"] == expected["summary"]
    # phases with no time anywhere (this run loads no data in a range) are not listed
    assert body["gpu"] is True and body["phases"] == ["forward", "backward", "optimizer", "other"]
    assert get(client, f"{BASE}/steps?run=ranks")["worker"] == "sampled_rank-0"  # lowest rank by default
    assert get(client, f"{BASE}/steps?run=ranks&worker=sampled_rank-1")["steps"][0]["step"] == 551


def test_step_detail(served):
    _, client = served
    body = get(client, f"{BASE}/step?run=gpu&step=103")
    assert body["step"] == 103 and body["run"] == "gpu"
    assert max(r["gpu_ms"] for r in body["ops"]["backward"]) > 0
    assert body["lanes"]["labels"][0].startswith("thread 1102")
    assert any(label.startswith("GPU 0 stream") for label in body["lanes"]["labels"])
    assert body["gpu_names"] == ["Tesla V100-SXM2-32GB"]
    get(client, f"{BASE}/step?run=gpu&step=999", 404)
    get(client, f"{BASE}/step?run=gpu&step=abc", 400)
    get(client, f"{BASE}/step?run=gpu", 400)


def test_a_frameworks_phase_reads_in_its_place_with_its_colour(tmp_path):
    """A run of the HF callback (a ``transformers`` phase) beside one written before framework
    phases existed: /runs gives the frameworks' colours, /timeline lists the phase after the
    canonical ones, and the older run's phases are as they were."""
    write_scalars(tmp_path / "hf", range(4), phases=("data", "forward", "backward", "optimizer",
                                                     "transformers", "other"))
    write_scalars(tmp_path / "old", range(4))
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        styles = {p["name"]: p["colour"] for p in get(client, f"{BASE}/runs")["phases"]}
        assert styles["transformers"] == "#e6c229" and styles["lightning"] == "#7e57c2"
        hf = get(client, f"{BASE}/timeline?run=hf")
        assert hf["phases"] == ["data", "forward", "backward", "optimizer", "other", "transformers"]
        assert hf["cpu"]["transformers"] == [4.0, 5.0, 6.0, 7.0]
        old = get(client, f"{BASE}/timeline?run=old")
        assert old["phases"] == ["data", "forward", "backward", "optimizer", "other"]
    finally:
        plugin._store.close()


def test_timeline_reads_every_step_from_the_scalars_and_marks_profiled_windows(served):
    _, client = served
    body = get(client, f"{BASE}/timeline?run=cpu/base")
    assert body["steps"] == list(range(30))
    assert body["phases"] == ["data", "forward", "backward", "optimizer", "other"]
    assert body["cpu"]["forward"][:3] == [1.0, 2.0, 3.0]
    assert body["gpu"] == {"forward": [0.5] * 30}
    assert body["wall"][2] == 20.0
    assert body["profiled"] == [[2, 11]]  # the traces hold ProfilerStep#2..#11
    assert body["downsampled"] is False
    assert get(client, f"{BASE}/timeline?run=scalars_only")["steps"] == [0, 1, 2]
    get(client, f"{BASE}/timeline?run=gpu", 404)


def test_compare_two_steps_two_workers_two_runs(served):
    _, client = served
    steps = get(client, f"{BASE}/compare?run_a=gpu&step_a=101&run_b=gpu&step_b=103")
    assert steps["a"]["steps"] == [101] and steps["b"]["steps"] == [103]
    assert steps["delta"]["wall_ms"] == pytest.approx(steps["b"]["wall_ms"] - steps["a"]["wall_ms"], abs=0.002)
    assert steps["a"]["label"] == "gpu · rank-0.Apr_03_18_51_38 · step 101"
    assert steps["ops"] and "delta_self_host_ms" in steps["ops"][0]
    workers = get(client, f"{BASE}/compare?run_a=ranks&worker_a=sampled_rank-0&run_b=ranks&worker_b=sampled_rank-1")
    assert workers["a"]["steps"] == workers["b"]["steps"] == [551, 552]
    runs = get(client, f"{BASE}/compare?run_a=gpu&run_b=cpu/base")
    assert runs["b"]["phases"]["backward"]["gpu_ms"] == 0
    get(client, f"{BASE}/compare?run_a=gpu", 400)
    get(client, f"{BASE}/compare?run_a=gpu&run_b=nope", 404)


@pytest.mark.parametrize("collectives", [True, False], ids=["waits-at-all_reduce", "no-collectives"])
def test_ranks_names_the_straggler(tmp_path, collectives):
    two_rank_job(tmp_path / "job", collectives)
    plugin, client = make_app(tmp_path)
    try:
        assert plugin._store.wait(300)
        body = get(client, f"{BASE}/ranks?run=job")
    finally:
        plugin._store.close()
    by_rank = {r["rank"]: r for r in body["ranks"]}
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    assert by_rank[1]["worker"] == "host-a_200" and by_rank[0]["worker"] == "host-b_100"
    s = body["straggler"]
    assert (s["rank"], s["worker"]) == (1, "host-a_200")
    assert s["waited_for"] is collectives
    assert "rank 1" in s["reason"]
    assert s["phase"] == "data" and s["phase_behind_ms"] == pytest.approx(5, abs=0.5)
    if collectives:  # rank 0 spends rank 1's lateness in the all_reduce
        assert by_rank[0]["comm_ms"] == pytest.approx(6, abs=0.5) and by_rank[1]["comm_ms"] == pytest.approx(1)
        assert by_rank[0]["wall_ms"] == pytest.approx(by_rank[1]["wall_ms"])
    else:
        assert s["behind_median_ms"] > 2


def test_ranks_of_a_real_two_rank_job(served):
    _, client = served
    body = get(client, f"{BASE}/ranks?run=ranks")
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    assert [r["steps"] for r in body["ranks"]] == [2, 2]
    # two steps per rank, 0.7% apart: nothing to call a straggler on
    assert body["straggler"] is None
    assert "too few steps" in body["note"]
    assert body["measure"] == "gpu" and body["world_size"] == 128 and len(body["missing_ranks"]) == 126
    for r in body["ranks"]:  # the compute-only figures the rule reads are in the table, in GPU time
        # GPU busy: compute, exposed communication and the copies and sets neither hides
        assert r["step_ms"] >= r["compute_ms"] + r["exposed_comm_ms"] - 0.002
        assert set(r["phase_compute_ms"]) == set(body["phases"])
    assert get(client, f"{BASE}/ranks?run=gpu")["straggler"] is None  # one rank: no straggler


class _FileAccess:
    """Paths this process opens or lists while switched on (audit hooks cannot be removed)."""

    def __init__(self):
        self.on = False
        self.paths: list[str] = []
        sys.addaudithook(self)

    def __call__(self, event, args):
        path = args[0] if args else None
        if self.on and event in ("open", "os.scandir", "os.listdir") and isinstance(path, (str, bytes, os.PathLike)):
            self.paths.append(os.fsdecode(path))


_access = _FileAccess()


@pytest.mark.parametrize("query", [
    "run=..", "run=../..", "run=/etc", "run=%2e%2e%2fgpu", "run=gpu%2f..%2f..", "run=gpu&worker=../gpu",
    "run=gpu&worker=%2fetc%2fpasswd", "run=link", "run=link/out",
])
def test_names_that_are_not_discovered_are_refused_and_nothing_outside_is_read(served, logdir, query, tmp_path):
    plugin, client = served
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(next((logdir / "gpu").glob("*.gz")), outside / "secret.1.pt.trace.json.gz")
    os.symlink(outside, logdir / "link", target_is_directory=True)
    os.symlink(outside / "secret.1.pt.trace.json.gz", logdir / "gpu" / "secret.1.pt.trace.json.gz")
    _access.paths.clear()
    _access.on = True
    try:
        routes = ("steps", "step") if "worker" in query else ("steps", "step", "timeline", "ranks")
        for route in routes:
            status = client.get(f"{BASE}/{route}?{query}&step=101").status_code
            assert status in (400, 404), (route, query, status)
        plugin._store.refresh(force=True)
        client.get(f"{BASE}/runs")
    finally:
        _access.on = False
        os.unlink(logdir / "link")
        os.unlink(logdir / "gpu" / "secret.1.pt.trace.json.gz")
    assert not [p for p in _access.paths if p.startswith(str(outside)) or p.startswith("/etc")]
    # nothing outside was queued for the loading processes either
    assert all(path.startswith(str(logdir)) for path in plugin._store._spans)


@pytest.mark.parametrize("name", ["../plugin.py", "..%2fplugin.py", "%2e%2e%2f%2e%2e%2fsetup.py", "nope.js"])
def test_static_route_serves_only_bundle_files(served, name):
    _, client = served
    assert client.get(f"{BASE}/static/{name}").status_code in (400, 404)


def test_bundle_is_served_as_javascript(served):
    _, client = served
    response = get(client, f"{BASE}/index.js")
    assert response.mimetype == "text/javascript"
    assert b"render" in response.get_data()  # TensorBoard's iframe calls the module's render()


def test_a_span_added_while_running_appears_after_one_reload(logdir, traces):
    src = traces.files("cpu", "repeat2")[0]  # three steps
    (first,) = (logdir / "cpu" / "base").glob("*.pt.trace.json.gz")
    worker = first.name.split(".")[0]
    added = logdir / "cpu" / "base" / f"{worker}.1999999999999999999.pt.trace.json.gz"  # a later span, same worker
    plugin, client = make_app(logdir)
    try:
        assert plugin._store.wait(300)
        before = get(client, f"{BASE}/steps?run=cpu/base")["steps"]
        shutil.copy(src, added)
        settled(added)
        plugin._store._scanned_at = float("-inf")  # the next request is "the next reload"
        runs = get(client, f"{BASE}/runs")
        spans = [s["file"] for r in runs["runs"] if r["run"] == "cpu/base" for s in r["workers"][0]["spans"]]
        assert added.name in spans
        assert plugin._store.wait(300)
        after = get(client, f"{BASE}/steps?run=cpu/base")["steps"]
        assert len(after) == len(before) + 3
    finally:
        plugin._store.close()
        if added.exists():
            os.unlink(added)


def test_a_file_still_being_written_waits(tmp_path, traces):
    src = traces.files("cpu", "base")[0]
    (tmp_path / "run").mkdir()
    written = tmp_path / "run" / src.name
    shutil.copy(src, written)
    future = time.time() + 3600  # modified "now" however slowly this test runs: still being written
    os.utime(written, (future, future))
    plugin, client = make_app(tmp_path)
    try:
        plugin._store.refresh(force=True)
        spans = get(client, f"{BASE}/runs")["runs"][0]["workers"][0]["spans"]
        assert spans[0]["state"] == "pending"
        settled(written)  # the writer is done
        assert plugin._store.wait(300)
        assert get(client, f"{BASE}/runs")["runs"][0]["workers"][0]["spans"][0]["state"] == "ready"
    finally:
        plugin._store.close()


def test_importing_the_plugin_does_not_import_torch():
    code = ("import sys, phaseprof.plugin, phaseprof.plugin.serving.loader, phaseprof.plugin.serving.plugin, "
            "phaseprof.plugin.spans, phaseprof.cli, phaseprof.cli.report; "
            "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_plugin_never_imports_the_cli():
    """The TensorBoard side serves the analysis; the CLI is a client of it, never the other way round:
    its modules, loaded as TensorBoard and its loading processes load them, bring in no
    ``phaseprof.cli``, and no module under plugin/ names it."""
    code = ("import sys, phaseprof.plugin.serving.loader, phaseprof.plugin.serving.plugin, "
            "phaseprof.plugin.serving.store, phaseprof.plugin.serving.loading, phaseprof.plugin.serving.capture, "
            "phaseprof.plugin.spans, phaseprof.plugin.typescript; "
            "loaded = [m for m in sys.modules if m == 'phaseprof.cli' or m.startswith('phaseprof.cli.')]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)
    plugin_dir = Path(phaseprof.plugin.__file__).parent
    naming = []
    for path in sorted(plugin_dir.rglob("*.py")):
        package = ["phaseprof", "plugin", *path.relative_to(plugin_dir).parent.parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # relative ones resolved against the file's package
                base = ".".join([*package[:len(package) - node.level + 1], node.module or ""] if node.level
                                else [node.module]).strip(".")
                modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            if any(m == "phaseprof.cli" or m.startswith("phaseprof.cli.") for m in modules):
                naming.append(f"{path.relative_to(plugin_dir)}:{node.lineno}")
    assert len(list(plugin_dir.rglob("*.py"))) > 20 and not naming, naming


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="tensorboard_plugins") if e.name == "phaseprof"]
    assert ep.value == "phaseprof.plugin.serving.loader:PhaseprofLoader"

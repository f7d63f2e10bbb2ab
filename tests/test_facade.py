"""`phaseprof.Analysis` answers what the routes answer: for every trace in tests/data, each method's
answer, encoded, equals its route's body from a real plugin over the same logdir (the plugin loads
in worker processes; `Analysis` reads in this one), and both refuse the same names."""

from __future__ import annotations

import json
import shutil
from urllib.parse import urlencode

import msgspec
import pytest

from phaseprof import Analysis
from phaseprof.plugin.facade import BadArgument, NotFound, Side
from tests.logdir import settled, write_scalars
from tests.test_plugin import make_app

#: The runs of the logdir: one per scenario folder of tests/data (``cpu_base``, ``gpu_hta_nccl_16rank``).
SCALARS_RUN = "cpu_base"


@pytest.fixture(scope="module")
def both(tmp_path_factory, traces):
    """(Analysis over the logdir, the route client, the run names): every scenario of tests/data a
    run, and the first run also with scalars (the timeline's and whole run's source)."""
    logdir = tmp_path_factory.mktemp("facade")
    folders = sorted({p.parent for p in traces.all()})
    for folder in folders:
        run = logdir / f"{folder.parent.name}_{folder.name}"
        run.mkdir()
        for trace in sorted(folder.glob("*.json.gz")):
            shutil.copy(trace, run / trace.name)
            settled(run / trace.name)
    write_scalars(logdir / SCALARS_RUN, range(1, 31))
    plugin, client = make_app(logdir)
    try:
        assert plugin._store.wait(600)
        yield Analysis(str(logdir)), client, [f"{f.parent.name}_{f.name}" for f in folders]
    finally:
        plugin._store.close()


def _route(client, route: str, **params):
    response = client.get(f"/data/plugin/phaseprof/{route}?" + urlencode({k: v for k, v in params.items()
                                                                          if v is not None}))
    return response.status_code, response.get_data()


def _same(answer, client, route: str, **params) -> None:
    status, body = _route(client, route, **params)
    assert status == 200, (route, params, body[:300])
    mine, theirs = json.loads(answer if isinstance(answer, bytes) else msgspec.json.encode(answer)), json.loads(body)
    if route == "trace":  # the same events; their order follows how the file was decoded (one or two processes)
        for doc in (mine, theirs):
            doc["traceEvents"].sort(key=lambda e: json.dumps(e, sort_keys=True))
    assert mine == theirs, (route, params)


def _first_step(a: Analysis, run: str, worker: str) -> int:
    return a.steps(run, worker).steps[0].step


def test_every_fixture_is_a_run_of_both(both):
    a, client, runs = both
    assert len(runs) >= 15 and sorted(r.run for r in a.runs().runs) == sorted(runs)


def test_steps_step_trace_and_memory_equal_their_routes(both):
    a, client, runs = both
    for run in runs:
        workers = [w.worker for w in next(r for r in a.runs().runs if r.run == run).workers]
        for worker in workers:
            _same(a.steps(run, worker), client, "steps", run=run, worker=worker)
            step = _first_step(a, run, worker)
            _same(a.step(run, step, worker), client, "step", run=run, worker=worker, step=step)
            _same(a.memory(run, step, worker), client, "memory", run=run, worker=worker, step=step)
            _same(a.memory_events(run, worker, step), client, "memory_events", run=run, worker=worker,
                  step=step)
        step = _first_step(a, run, workers[0])  # a step's trace is cut from its file again: one a run
        _same(a.trace(run, step, workers[0]), client, "trace", run=run, worker=workers[0], step=step)
        _same(a.steps(run), client, "steps", run=run)  # the default worker: the lowest rank


def test_tables_over_steps_equal_their_routes(both):
    a, client, runs = both
    for run in runs:
        steps = a.steps(run)
        step = steps.steps[0].step
        for group in ("name", "shapes"):
            _same(a.ops(run, group=group), client, "ops", run=run, group=group)
        _same(a.ops(run, phase=steps.phases[0]), client, "ops", run=run, phase=steps.phases[0])
        for at in (None, step):
            _same(a.kernels(run, step=at), client, "kernels", run=run, step=at)
            _same(a.modules(run, step=at), client, "modules", run=run, step=at)
            _same(a.collectives(run, step=at), client, "collectives", run=run, step=at)
        _same(a.memory_events(run), client, "memory_events", run=run)
        _same(a.ranks(run), client, "ranks", run=run)


def test_compare_and_the_scalars_answers_equal_their_routes(both):
    a, client, runs = both
    for first, second in zip(runs, runs[1:]):
        for device in ("cpu", "gpu"):
            _same(a.compare(first, second, device=device), client, "compare", run_a=first, run_b=second,
                  device=device)
    step = _first_step(a, runs[0], a.steps(runs[0]).worker)
    _same(a.compare(Side(runs[0], step=step), runs[0]), client, "compare", run_a=runs[0], step_a=step,
          run_b=runs[0])
    _same(a.timeline(SCALARS_RUN), client, "timeline", run=SCALARS_RUN)
    assert [w.steps for w in a.whole_run(SCALARS_RUN)] == [29]  # 30 timed, the first left out
    _same(a.runs(), client, "runs")  # last: every file has been read by then, on both sides


def test_names_the_logdir_lacks_are_refused_alike(both):
    a, client, runs = both
    run = runs[0]
    for call, route, params in (
        (lambda: a.steps("nope"), "steps", {"run": "nope"}),
        (lambda: a.steps(run, "nobody"), "steps", {"run": run, "worker": "nobody"}),
        (lambda: a.step(run, 10**12), "step", {"run": run, "step": 10**12}),
        (lambda: a.kernels(run, phase="nophase"), "kernels", {"run": run, "phase": "nophase"}),
        (lambda: a.timeline(runs[-1]), "timeline", {"run": runs[-1]}),  # no scalars
    ):
        with pytest.raises(NotFound) as refused:
            call()
        status, body = _route(client, route, **params)
        assert status == 404 and str(refused.value) in body.decode(), (route, body)
    for call, route, params in ((lambda: a.ops(run, group="bogus"), "ops", {"run": run, "group": "bogus"}),
                                (lambda: a.compare(run, run, device="tpu"), "compare",
                                 {"run_a": run, "run_b": run, "device": "tpu"})):
        with pytest.raises(BadArgument) as refused:
            call()
        status, body = _route(client, route, **params)
        assert status == 400 and str(refused.value) in body.decode(), (route, body)


def test_answers_turn_into_plain_data_and_tables(both):
    a, _, runs = both
    ops = a.ops(runs[0])
    assert ops.to_dict() == json.loads(msgspec.json.encode(ops))
    with pytest.raises(TypeError, match="StepDetail is not a table"):
        a.step(runs[0], _first_step(a, runs[0], a.steps(runs[0]).worker)).to_pandas()

"""Route behaviour every route shares, on hand-built logdirs through TensorBoard's own WSGI app:
strict parameters, one resolver, and any route starting the loading it needs."""

from __future__ import annotations

import json
import time

import pytest

from tests.logdir import settled, write_trace
from tests.test_plugin import BASE, make_app
from tests.tracebuilder import annotation, op, step


def _rank_trace(path, rank: int, slow_ms: float):
    events = []
    for s in range(5):  # five steps: the fewest a straggler is judged from
        t0 = s * 20_000
        events += [step(s + 1, t0, 10_000 + slow_ms * 1000), annotation("## forward ##", t0, 4_000),
                   annotation("## backward ##", t0 + 4_000, 4_000), op("aten::mm", t0 + 100, 3_000)]
    return write_trace(path, events, distributedInfo={"rank": rank, "world_size": 2, "backend": "gloo"})


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logdir")
    for rank in (0, 1):
        settled(_rank_trace(logdir / "ddp" / f"rank{rank}.1.pt.trace.json", rank, slow_ms=rank * 5))
    plugin, client = make_app(logdir)
    assert plugin._store.wait(300)
    yield client
    plugin._store.close()


@pytest.mark.parametrize("value", ["1_0", "+2", " 2", "2 ", "٣", "2\n", "0x2", "2.0", "²", "--2", "-"])
@pytest.mark.parametrize("route", ["step?run=ddp&step={}", "compare?run_a=ddp&step_a={}&run_b=ddp",
                                   "compare?run_a=ddp&run_b=ddp&step_b={}"])
def test_integer_parameters_are_ascii_digits_only(client, route, value):
    from urllib.parse import quote

    response = client.get(f"{BASE}/{route.format(quote(value))}")
    assert response.status_code == 400, (value, response.get_data(as_text=True))
    assert "must be an integer" in response.get_data(as_text=True)


def test_integer_parameters_accept_digits_and_a_minus(client):
    two = client.get(f"{BASE}/step?run=ddp&step=2")
    assert two.status_code == 200 and json.loads(two.get_data())["step"] == 2
    for same in ("002", "0" * 40 + "2"):  # leading zeros name the same step
        response = client.get(f"{BASE}/step?run=ddp&step={same}")
        assert response.status_code == 200 and response.get_data() == two.get_data(), same
    assert client.get(f"{BASE}/step?run=ddp&step=-2").status_code == 404  # well-formed: no such step


STEP_ROUTES = ["step?run=ddp&step={}", "trace?run=ddp&step={}", "kernels?run=ddp&step={}", "memory?run=ddp&step={}",
               "compare?run_a=ddp&step_a={}&run_b=ddp", "compare?run_a=ddp&run_b=ddp&step_b={}"]


@pytest.mark.parametrize("value", ["9" * 5_000, "-" + "9" * 5_000, "1" * 4_301, "9" * 20, str(2**63),
                                   str(-(2**63) - 1)])
@pytest.mark.parametrize("route", STEP_ROUTES)
def test_integer_parameters_of_any_length_are_a_400(client, route, value):
    response = client.get(f"{BASE}/{route.format(value)}")
    assert response.status_code == 400, (value[:30], response.status_code, response.get_data(as_text=True)[:300])
    assert "out of range" in response.get_data(as_text=True)
    assert len(response.get_data()) < 1_000  # the value is not echoed whole


@pytest.mark.parametrize("route", STEP_ROUTES)
def test_the_largest_64_bit_step_number_is_well_formed(client, route):
    for value in (str(2**63 - 1), str(-(2**63))):
        assert client.get(f"{BASE}/{route.format(value)}").status_code == 404, value  # no such step


def test_one_resolver_answers_alike_on_every_route(client):
    for route in ("steps?run=nope", "step?run=nope&step=1", "timeline?run=nope", "ranks?run=nope",
                  "compare?run_a=nope&run_b=ddp", "compare?run_a=ddp&run_b=nope"):
        response = client.get(f"{BASE}/{route}")
        assert response.status_code == 404 and "no run named 'nope'" in response.get_data(as_text=True), route
    for route in ("steps?run=ddp&worker=nope", "step?run=ddp&worker=nope&step=1",
                  "compare?run_a=ddp&worker_a=nope&run_b=ddp"):
        response = client.get(f"{BASE}/{route}")
        assert response.status_code == 404 and "no worker 'nope'" in response.get_data(as_text=True), route
    for route in ("steps", "ranks", "timeline", "step?step=1", "compare?run_b=ddp"):
        assert client.get(f"{BASE}/{route}").status_code == 400, route


def test_polling_only_ranks_on_a_fresh_logdir_loads_the_ranks(tmp_path):
    # Files just written: too fresh to load at start-up. A client that asks only /ranks must see
    # them load all the same.
    for rank in (0, 1):
        _rank_trace(tmp_path / "ddp" / f"rank{rank}.1.pt.trace.json", rank, slow_ms=rank * 5)
    plugin, client = make_app(tmp_path)
    plugin._store._settle_s = 0.5
    try:
        deadline = time.monotonic() + 300
        body = {}
        while time.monotonic() < deadline:
            response = client.get(f"{BASE}/ranks?run=ddp")
            assert response.status_code in (200, 404)  # 404 until the first scan has found the run
            body = json.loads(response.get_data()) if response.status_code == 200 else {"ranks": []}
            if len(body["ranks"]) == 2:
                break
            time.sleep(0.2)
        assert [r["rank"] for r in body["ranks"]] == [0, 1]
        assert body["straggler"]["rank"] == 1  # the longer steps, with no collectives to wait at
    finally:
        plugin._store.close()


def test_every_parameter_a_route_takes_reaches_its_answer(client):
    """The routes made by one maker (`plugin._answering`) pass each parameter on, and a missing one
    as its default: the answers say which worker, step, phase and grouping they are of."""
    runs = json.loads(client.get(f"{BASE}/runs").get_data())["runs"]
    workers = sorted(w["worker"] for w in runs[0]["workers"])
    worker = workers[-1]  # not the one a missing worker picks
    asked = f"{BASE}/ops?run=ddp&worker={worker}&phase=forward&group=shapes"
    ops = json.loads(client.get(asked).get_data())
    assert (ops["worker"], ops["phase"], ops["group"]) == (worker, "forward", "shapes")
    plain = json.loads(client.get(f"{BASE}/ops?run=ddp").get_data())
    assert (plain["worker"], plain["phase"], plain["group"]) == (workers[0], None, "name")
    for route in ("kernels", "modules", "memory_events"):
        asked = f"{BASE}/{route}?run=ddp&worker={worker}&step=2&phase=forward"
        answer = json.loads(client.get(asked).get_data())
        said = (answer["worker"], answer["step"], answer.get("phase", "forward"))
        assert said == (worker, 2, "forward"), route
    steps = json.loads(client.get(f"{BASE}/steps?run=ddp&worker={worker}").get_data())
    assert steps["worker"] == worker

"""The capture channel without a training job: the start step every rank agrees on, when a run
cannot be asked and why, bounded reading of what others wrote, and the ``/capture`` route (its
one write, its refusals, read-only mode)."""

from __future__ import annotations

import os
import time

import msgspec
import pytest
from tensorboard.plugins import base_plugin

from phaseprof.capture_channel import (
    MARGIN_STEPS,
    MAX_FILE_BYTES,
    REFUSED,
    WRITTEN,
    Answer,
    Heartbeat,
    Unreadable,
    answer_name,
    beat_name,
    capture_dir,
    plan_request,
    read_channel,
    read_small,
    request_name,
    start_step,
    write_request,
)
from phaseprof.plugin.answers import CaptureAnswer
from phaseprof.plugin.serving.capture import ASK_HEADER, READ_ONLY_ENV
from phaseprof.plugin.serving.plugin import PhaseprofPlugin
from tests.logdir import write_scalars
from tests.test_plugin import BASE, make_app


def _beat(rank=0, step=100, pace=50.0, age=0.0, ended=False, schedule_until=12, active=10, world_size=1):
    now = time.time()
    return Heartbeat(rank=rank, world_size=world_size, step=step, time=now - age, steps_per_s=pace, active=active,
                     schedule_until=schedule_until, started=now - 60, ended=ended)


def _publish(run_dir, *beats):
    folder = capture_dir(str(run_dir))
    os.makedirs(folder, exist_ok=True)
    for b in beats:
        with open(os.path.join(folder, beat_name(b.rank)), "wb") as fh:
            fh.write(msgspec.json.encode(b))
    return folder


def test_the_start_step_is_ahead_of_the_fastest_rank_and_after_the_schedule():
    now = time.time()
    slow = _beat(0, step=100, pace=10.0)
    fast = _beat(1, step=110, pace=50.0, age=0.5)
    # the fast rank: 110 + 50 x (0.5 s old + 1 s lead) = 185, plus the step in progress and a warm-up step
    assert MARGIN_STEPS == 2
    assert start_step([slow, fast], now, lead_s=1.0) == 187
    assert start_step([slow, fast], now, lead_s=2.0) == 237
    # an unknown pace: the margin only; never inside the configured window
    assert start_step([_beat(step=3, pace=0.0, schedule_until=12)], now) == 13
    assert start_step([_beat(step=30, pace=0.0)], now) == 32


@pytest.mark.parametrize(("beats", "reason"), [
    ((), "no running PhaseProfiler watches this run"),
    (({"ended": True, "step": 77},), "the run ended at step 77"),
    (({"age": 60, "step": 5},), "the run stopped writing at step 5"),
    (({"schedule_until": None},), "repeat=0"),
])
def test_a_run_that_cannot_be_asked_says_why(tmp_path, beats, reason):
    os.makedirs(capture_dir(str(tmp_path)))
    _publish(tmp_path, *(_beat(**b) for b in beats))  # written now: their age is the test's
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")):
        plan_request(str(tmp_path), 5)


def test_one_capture_at_a_time(tmp_path):
    _publish(tmp_path, _beat(0), _beat(1))
    first = plan_request(str(tmp_path), 5, ranks=[1])
    write_request(str(tmp_path), first)
    with pytest.raises(ValueError, match="another capture is running"):
        plan_request(str(tmp_path), 5)
    folder = capture_dir(str(tmp_path))
    answer = Answer(id=first.id, rank=1, state=WRITTEN, updated=time.time(), first=first.start, last=first.start + 4)
    with open(os.path.join(folder, answer_name(first.id, 1)), "wb") as fh:
        fh.write(msgspec.json.encode(answer))
    second = plan_request(str(tmp_path), None)  # answered: the next one may be asked; its size is `active`
    assert second.steps == 10 and second.ranks is None
    with pytest.raises(ValueError, match="no running rank 7"):
        plan_request(str(tmp_path), 5, ranks=[7])


def test_channel_files_are_read_within_bounds(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(Unreadable, match="more than"):
        read_small(str(tmp_path / "big"))
    (tmp_path / "ok").write_bytes(b"{}")
    os.symlink(tmp_path / "ok", tmp_path / "link")
    with pytest.raises(Unreadable, match="link"):
        read_small(str(tmp_path / "link"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(Unreadable, match="not a regular file"):
        read_small(str(tmp_path / "fifo"))  # and it does not block
    assert read_small(str(tmp_path / "ok")) == b"{}"


def test_a_request_that_is_not_one_is_listed_as_ignored(tmp_path):
    folder = _publish(tmp_path, _beat())
    bad = {"a" * 16: b'{"id": "aaaaaaaaaaaaaaaa", "written": 1, "by": "cli", "steps": 0, "start": 5}',
           "b" * 16: b'{"id": "bbbbbbbbbbbbbbbb", "written": 1, "by": "me", "steps": 2, "start": 5}',
           "c" * 16: b'{"id": "cccccccccccccccc", "written": 1, "by": "cli", "steps": 2, "start": -5}',
           "d" * 16: b'{"id": "dddddddddddddddd", "written": 1, "by": "cli", "steps": 2, "start": 5, "x": 1}'}
    for request_id, data in bad.items():
        with open(os.path.join(folder, request_name(request_id)), "wb") as fh:
            fh.write(data)
    channel = read_channel(str(tmp_path))
    assert channel.requests == [] and len(channel.ignored) == 4
    assert any("steps must lie in" in line for line in channel.ignored)
    assert any("unknown requester" in line for line in channel.ignored)


# -- the route ---------------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    write_scalars(tmp_path / "live", range(5))
    write_scalars(tmp_path / "ended", range(5))
    _publish(tmp_path / "live", _beat(0, step=40), _beat(1, step=41))
    _publish(tmp_path / "ended", _beat(ended=True, step=4))
    plugin, client = make_app(tmp_path)
    assert plugin._store.wait(300)
    yield tmp_path, plugin, client
    plugin._store.close()


def _capture(client, method="get", headers=None, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    response = getattr(client, method)(f"{BASE}/capture?{query}", headers=headers or {})
    body = response.get_data(as_text=True)
    return response.status_code, (msgspec.json.decode(body, type=CaptureAnswer) if response.status_code == 200
                                  else body)


def test_the_route_asks_a_running_run_and_lists_its_captures(served):
    logdir, _, client = served
    status, answer = _capture(client, run="live")
    assert status == 200 and answer.can_ask and answer.step == 41 and answer.active == 10 and answer.captures == []
    status, answer = _capture(client, "post", {ASK_HEADER: "ask"}, run="live", steps=3)
    assert status == 200, answer
    (info,) = answer.captures
    assert answer.asked == info.id and info.by == "tab" and info.last - info.first == 2 and info.first > 41
    assert info.state == "waiting" and [a.rank for a in info.answers] == [0, 1]
    assert not answer.can_ask and "another capture is running" in answer.reason
    # the one file it wrote: the request, under the run's capture folder
    written = sorted(os.listdir(capture_dir(str(logdir / "live"))))
    assert written == ["rank0.json", "rank1.json", request_name(info.id)]
    # a rank refuses: the capture says so, per rank
    folder = capture_dir(str(logdir / "live"))
    with open(os.path.join(folder, answer_name(info.id, 0)), "wb") as fh:
        fh.write(msgspec.json.encode(Answer(id=info.id, rank=0, state=REFUSED, updated=time.time(), reason="missed")))
    _, answer = _capture(client, run="live")
    assert answer.captures[0].answers[0].state == REFUSED and answer.captures[0].state == "waiting"


def test_the_route_refuses_with_the_reason(served):
    logdir, _, client = served
    status, answer = _capture(client, "post", {ASK_HEADER: "ask"}, run="ended")
    assert status == 200 and not answer.can_ask and "the run ended at step 4" in answer.reason
    assert sorted(os.listdir(capture_dir(str(logdir / "ended")))) == ["rank0.json"]
    # a POST without the header (what a page of another origin could send) writes nothing
    status, body = _capture(client, "post", run="live")
    assert status == 400 and ASK_HEADER in body
    assert sorted(os.listdir(capture_dir(str(logdir / "live")))) == ["rank0.json", "rank1.json"]
    for params in ({"run": "live", "steps": "0"}, {"run": "live", "steps": "x"}, {}):
        assert _capture(client, "post", {ASK_HEADER: "ask"}, **params)[0] == 400
    assert _capture(client, "post", {ASK_HEADER: "ask"}, run="nope")[0] == 404


def test_the_route_never_writes_through_a_link(tmp_path):
    write_scalars(tmp_path / "logdir" / "run", range(5))
    elsewhere = tmp_path / "elsewhere"
    _publish(elsewhere, _beat())
    os.makedirs(tmp_path / "logdir" / "run" / ".phaseprof")
    os.symlink(capture_dir(str(elsewhere)), capture_dir(str(tmp_path / "logdir" / "run")))
    plugin, client = make_app(tmp_path / "logdir")
    assert plugin._store.wait(300)
    try:
        status, _ = _capture(client, "post", {ASK_HEADER: "ask"}, run="run")
    finally:
        plugin._store.close()
    assert status == 403
    assert os.listdir(capture_dir(str(elsewhere))) == ["rank0.json"]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_read_only_tensorboard_never_writes(tmp_path, monkeypatch, how):
    write_scalars(tmp_path / "live", range(5))
    _publish(tmp_path / "live", _beat())
    if how == "env":
        monkeypatch.setenv(READ_ONLY_ENV, "1")
        plugin, client = make_app(tmp_path)
    else:
        from tensorboard.backend import application
        from werkzeug import test as werkzeug_test

        class Flags:
            phaseprof_read_only = True

        plugin = PhaseprofPlugin(base_plugin.TBContext(logdir=str(tmp_path), flags=Flags()))
        client = werkzeug_test.Client(application.TensorBoardWSGI([plugin]))
    assert plugin._store.wait(300)
    try:
        status, answer = _capture(client, run="live")
        assert status == 200 and not answer.can_ask and "read_only" in answer.reason.lower().replace("-", "_")
        status, body = _capture(client, "post", {ASK_HEADER: "ask"}, run="live")
    finally:
        plugin._store.close()
    assert status == 403 and "phaseprof capture" in body
    assert os.listdir(capture_dir(str(tmp_path / "live"))) == ["rank0.json"]


def test_tensorboard_takes_the_read_only_flag():
    import argparse

    from phaseprof.plugin.serving.loader import PhaseprofLoader

    parser = argparse.ArgumentParser()
    PhaseprofLoader().define_flags(parser)
    assert parser.parse_args(["--phaseprof_read_only"]).phaseprof_read_only
    assert not parser.parse_args([]).phaseprof_read_only


def test_a_slowdown_capture_carries_why_and_its_ranks_states(served):
    from phaseprof.capture_channel import Request, Why

    logdir, _, client = served
    folder = capture_dir(str(logdir / "live"))
    why = Why(rank=1, steps=[30, 31], step_ms=[180.0, 185.5], median_ms=60.0, band_ms=3.0)
    request = Request(id="e" * 16, written=time.time(), by="slowdown", steps=4, start=50, why=why)
    with open(os.path.join(folder, request_name(request.id)), "wb") as fh:
        fh.write(msgspec.json.encode(request))
    for rank, state in ((0, WRITTEN), (1, REFUSED)):
        answer = Answer(id=request.id, rank=rank, state=state, updated=time.time(), first=50, last=53,
                        files=["w.1.pt.trace.json.gz"] if state == WRITTEN else [], reason="missed" if rank else None)
        with open(os.path.join(folder, answer_name(request.id, rank)), "wb") as fh:
            fh.write(msgspec.json.encode(answer))
    _, answer = _capture(client, run="live")
    (info,) = answer.captures
    assert (info.by, info.first, info.last, info.state) == ("slowdown", 50, 53, "partial")
    assert info.why.step_ms == [180.0, 185.5] and info.why.median_ms == 60.0 and info.why.rank == 1
    assert [(a.rank, a.state, a.files) for a in info.answers] == [(0, WRITTEN, ["w.1.pt.trace.json.gz"]),
                                                                  (1, REFUSED, [])]
    assert answer.can_ask  # every rank answered: the next capture may be asked

"""The capture channel without a training job: the start step every rank agrees on, when a run
cannot be asked and why, bounded reading of what others wrote, and the ``/capture`` route (its
one write, its refusals, read-only mode)."""

from __future__ import annotations

import os
import time

import msgspec
import pytest
from tensorboard.plugins import base_plugin

from phaseprof import capture_store
from phaseprof.capture_channel import (
    LEAD_S,
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
    lead,
    pending,
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


def test_the_lead_covers_the_longest_look_the_heartbeats_of_a_run_in_a_store_say():
    """Ranks of a run in a store say how often they look (``look_s``): the asker's lead covers the
    longest of them and the listing's slack; a heartbeat of format 1.1 (none said), the default
    interval; a disk's watchers all look every `BEAT_S`."""
    quick, slow, older = (msgspec.structs.replace(_beat(rank), look_s=look)
                          for rank, look in ((0, 0.5), (1, 2.0), (2, None)))
    url = "s3://bucket/prefix/run"
    assert lead(url, [quick]) == 0.5 + capture_store.SLACK_S
    assert lead(url, [quick, slow]) == 2.0 + capture_store.SLACK_S
    assert lead(url, [quick, older]) == lead(url) == capture_store.LEAD_S
    assert capture_store.LEAD_S == capture_store.POLL_S + capture_store.SLACK_S
    assert lead("/runs/run", [quick, slow]) == LEAD_S


@pytest.mark.parametrize(("value", "interval"), [
    (None, 3.0), ("0.5", 0.5), ("30", 30.0), ("0.1", 3.0), ("31", 3.0), ("nan", 3.0),
    ("soon", 3.0)])
def test_a_watcher_of_a_store_looks_as_often_as_the_environment_says_within_bounds(
        monkeypatch, value, interval):
    if value is None:
        monkeypatch.delenv(capture_store.POLL_ENV, raising=False)
    else:
        monkeypatch.setenv(capture_store.POLL_ENV, value)
    assert capture_store.poll_s() == interval


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
    (tmp_path / "ok").write_bytes(b"{}")
    os.symlink(tmp_path / "ok", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Unreadable, match="more than"):
            read_small(folder, "big")
        with pytest.raises(Unreadable, match="link"):
            read_small(folder, "link")
        with pytest.raises(Unreadable, match="not a regular file"):
            read_small(folder, "fifo")  # and it does not block
        assert read_small(folder, "ok") == b"{}"
    finally:
        os.close(folder)


def test_a_request_that_is_not_one_is_listed_as_ignored(tmp_path):
    folder = _publish(tmp_path, _beat())
    bad = {"a" * 16: b'{"id": "aaaaaaaaaaaaaaaa", "written": 1, "by": "cli", "steps": 0, "start": 5}',
           "b" * 16: b'{"id": "bbbbbbbbbbbbbbbb", "written": 1, "by": "me", "steps": 2, "start": 5}',
           "c" * 16: b'{"id": "cccccccccccccccc", "written": 1, "by": "cli", "steps": 2, "start": -5}',
           "d" * 16: b'{"id": "dddddddddddddddd", "written": 1e308, "by": "cli", "steps": 2, '
                     b'"start": 5}'}
    for request_id, data in bad.items():
        with open(os.path.join(folder, request_name(request_id)), "wb") as fh:
            fh.write(data)
    channel = read_channel(str(tmp_path))
    assert channel.requests == [] and len(channel.ignored) == 4
    assert any("steps must lie in" in line for line in channel.ignored)
    assert any("unknown requester" in line for line in channel.ignored)
    assert any("is not a time before now" in line for line in channel.ignored)


# -- the route ---------------------------------------------------------------------------------------


class Logdir:
    """A logdir for the route's tests: a folder, or the same files uploaded to a prefix of a bucket
    (`tests.s3`), where the channel is objects (`phaseprof.capture_store`)."""

    def __init__(self, local, s3=None, bucket=None) -> None:
        self.local, self.s3, self.bucket = local, s3, bucket
        self.url = f"s3://{bucket}/p" if s3 is not None else str(local)

    def _prefix(self, run: str) -> str:
        return f"p/{run}/.phaseprof/capture/"

    def names(self, run: str) -> list[str]:
        """The names in the run's capture folder."""
        if self.s3 is None:
            return sorted(os.listdir(capture_dir(str(self.local / run))))
        return [k.rpartition("/")[2] for k in self.s3.keys(self.bucket, self._prefix(run))]

    def put(self, run: str, name: str, data) -> None:
        """Write a file into the run's capture folder whole, as another writer would."""
        data = data if isinstance(data, bytes) else msgspec.json.encode(data)
        if self.s3 is None:
            with open(os.path.join(capture_dir(str(self.local / run)), name), "wb") as fh:
                fh.write(data)
        else:
            self.s3.client().put_object(Bucket=self.bucket, Key=self._prefix(run) + name, Body=data)


@pytest.fixture(params=["disk", "s3"])
def served(request, tmp_path):
    local = tmp_path / "logdir"
    write_scalars(local / "live", range(5))
    write_scalars(local / "ended", range(5))
    _publish(local / "live", _beat(0, step=40), _beat(1, step=41))
    _publish(local / "ended", _beat(ended=True, step=4))
    logdir = Logdir(local)
    if request.param == "s3":
        s3, bucket = request.getfixturevalue("s3"), request.getfixturevalue("bucket")
        s3.upload_tree(local, bucket, "p")
        logdir = Logdir(local, s3, bucket)
    plugin, client = make_app(logdir.url)
    assert plugin._store.wait(300)
    yield logdir, plugin, client
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
    assert logdir.names("live") == ["rank0.json", "rank1.json", request_name(info.id)]
    # a rank refuses: the capture says so, per rank
    logdir.put("live", answer_name(info.id, 0),
               Answer(id=info.id, rank=0, state=REFUSED, updated=time.time(), reason="missed"))
    _, answer = _capture(client, run="live")
    assert answer.captures[0].answers[0].state == REFUSED and answer.captures[0].state == "waiting"


def test_the_route_refuses_with_the_reason(served):
    logdir, _, client = served
    status, answer = _capture(client, "post", {ASK_HEADER: "ask"}, run="ended")
    assert status == 200 and not answer.can_ask and "the run ended at step 4" in answer.reason
    assert logdir.names("ended") == ["rank0.json"]
    # a POST without the header (what a page of another origin could send) writes nothing
    status, body = _capture(client, "post", run="live")
    assert status == 400 and ASK_HEADER in body
    assert logdir.names("live") == ["rank0.json", "rank1.json"]
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
    why = Why(rank=1, steps=[30, 31], step_ms=[180.0, 185.5], median_ms=60.0, band_ms=3.0)
    request = Request(id="e" * 16, written=time.time(), by="slowdown", steps=4, start=50, why=why)
    logdir.put("live", request_name(request.id), request)
    for rank, state in ((0, WRITTEN), (1, REFUSED)):
        answer = Answer(id=request.id, rank=rank, state=state, updated=time.time(), first=50, last=53,
                        files=["w.1.pt.trace.json.gz"] if state == WRITTEN else [], reason="missed" if rank else None)
        logdir.put("live", answer_name(request.id, rank), answer)
    _, answer = _capture(client, run="live")
    (info,) = answer.captures
    assert (info.by, info.first, info.last, info.state) == ("slowdown", 50, 53, "partial")
    assert info.why.step_ms == [180.0, 185.5] and info.why.median_ms == 60.0 and info.why.rank == 1
    assert [(a.rank, a.state, a.files) for a in info.answers] == [(0, WRITTEN, ["w.1.pt.trace.json.gz"]),
                                                                  (1, REFUSED, [])]
    assert answer.can_ask  # every rank answered: the next capture may be asked


# -- what a writer of the logdir can put in the channel ----------------------------------------
# Anyone who can write the logdir can write these files. Each test below puts one hostile file (or
# link) where a running job would be, and checks what the CLI, the route and the library do.


def _write_raw(folder, name, data) -> None:
    with open(os.path.join(folder, name), "wb") as fh:
        fh.write(data if isinstance(data, bytes) else msgspec.json.encode(data))


def _beat_dict(**changes) -> dict:
    return {**msgspec.to_builtins(_beat()), **changes}


def _plugin(logdir, flags=None):
    from tensorboard.backend import application
    from werkzeug import test as werkzeug_test

    plugin = PhaseprofPlugin(base_plugin.TBContext(logdir=str(logdir), flags=flags))
    return plugin, werkzeug_test.Client(application.TensorBoardWSGI([plugin]))


@pytest.fixture
def live_run(tmp_path):
    """A logdir with one run whose heartbeat is fresh, and the route's app over it."""
    write_scalars(tmp_path / "live", range(5))
    folder = _publish(tmp_path / "live", _beat(0, step=40))
    plugin, client = _plugin(tmp_path)
    assert plugin._store.wait(300)
    yield tmp_path, folder, client
    plugin._store.close()


@pytest.mark.parametrize("link", [".phaseprof", ".phaseprof/capture"])
def test_the_cli_and_the_route_never_follow_a_link_to_the_channel(tmp_path, link):
    from tests.capture_job import capture

    logdir, outside = tmp_path / "logdir", tmp_path / "outside"
    write_scalars(logdir / "run", range(5))
    target = _publish(outside, _beat())  # a live heartbeat, outside the logdir
    os.makedirs(logdir / "run" / ".phaseprof", exist_ok=True)
    if link == ".phaseprof":
        os.rmdir(logdir / "run" / ".phaseprof")
        os.symlink(outside / ".phaseprof", logdir / "run" / ".phaseprof")
    else:
        os.symlink(target, logdir / "run" / ".phaseprof" / "capture")
    found = capture(str(logdir))
    assert found.returncode == 2 and "no run under" in found.stderr, found.stderr
    named = capture(str(logdir), "--run", "run")
    assert named.returncode == 1 and "a link (never followed)" in named.stderr, named.stderr
    assert "Traceback" not in found.stderr + named.stderr
    with pytest.raises(ValueError, match="a link"):
        write_request(str(logdir / "run"), plan_request(str(outside)))
    assert read_channel(str(logdir / "run")).ignored == [f"{link} is a link (never followed)"]
    plugin, client = _plugin(logdir)
    assert plugin._store.wait(300)
    try:
        status, answer = _capture(client, "post", {ASK_HEADER: "ask"}, run="run")
    finally:
        plugin._store.close()
    assert status == 403 and "outside the logdir" in answer
    assert os.listdir(target) == ["rank0.json"]  # nothing written outside the logdir


@pytest.mark.parametrize("field", [
    {"step": 10**400}, {"steps_per_s": 1.797e308}, {"time": 1e308}, {"active": 10**30},
    {"schedule_until": -5}, {"world_size": 0}, {"rank": 3}, {"started": 1e300}, {"look_s": 3600}])
def test_a_heartbeat_out_of_bounds_is_ignored_with_a_reason(live_run, field):
    from tests.capture_job import capture

    logdir, folder, client = live_run
    _write_raw(folder, "rank0.json", _beat_dict(**field))
    asked = capture(str(logdir), "--run", "live")
    assert asked.returncode == 1 and "Traceback" not in asked.stderr, asked.stderr
    lines = asked.stderr.splitlines()
    ignored = [line for line in lines if "ignored .phaseprof/capture/rank0.json" in line]
    assert len(ignored) == 1, asked.stderr  # one line, naming the file and what is wrong
    assert "no running PhaseProfiler" in asked.stderr
    status, answer = _capture(client, "post", {ASK_HEADER: "ask"}, run="live")
    assert status == 200 and not answer.can_ask and "rank0.json" in answer.reason
    assert os.listdir(folder) == ["rank0.json"]


def _blocking_requests(step: int):
    """Requests another writer could leave to block every later capture, by name: each passes the
    old checks; none may block past its own bounded window."""
    now = time.time()
    return {
        "far and in the far future": dict(written=1e308, steps=10, start=10**12),
        "far": dict(written=now, steps=10, start=10**12),
        "honest-looking, 1,000 steps far ahead": dict(written=now, steps=1000, start=step + 10**6),
        "older than its deadline (format 1.0: 60 s)": dict(written=now - 61, steps=1000,
                                                           start=step + 5),
    }


@pytest.mark.parametrize("case", list(_blocking_requests(0)))
def test_no_request_blocks_others_beyond_its_window(live_run, case):
    from tests.capture_job import capture

    logdir, folder, client = live_run
    forged = {"id": "f" * 16, "by": "cli", **_blocking_requests(40)[case]}
    _write_raw(folder, request_name(forged["id"]), forged)
    assert plan_request(str(logdir / "live")).start < 100
    status, answer = _capture(client, "post", {ASK_HEADER: "ask"}, run="live")
    assert status == 200 and answer.asked, answer
    os.remove(os.path.join(folder, request_name(answer.asked)))
    asked = capture(str(logdir), "--run", "live")
    assert asked.returncode == 0, asked.stderr


def test_a_request_blocks_others_until_its_deadline(live_run):
    logdir, folder, _ = live_run
    request = plan_request(str(logdir / "live"))
    assert request.written < request.expires <= request.written + 600
    write_request(str(logdir / "live"), request)
    with pytest.raises(ValueError, match="another capture is running"):
        plan_request(str(logdir / "live"))
    channel = read_channel(str(logdir / "live"))
    assert pending(channel, now=request.expires - 1).id == request.id
    assert pending(channel, now=request.expires + 1) is None


def test_files_carry_their_format_and_readers_tolerate_newer_fields(live_run):
    from tests.capture_job import capture

    logdir, folder, _ = live_run
    # a newer minor version's heartbeat and request: their new fields are ignored
    _write_raw(folder, "rank0.json", _beat_dict(format="1.9", gpu_memory=123))
    newer = {"id": "1" * 16, "written": time.time(), "by": "cli", "steps": 2, "start": 20,
             "format": "1.9", "priority": "high"}
    _write_raw(folder, request_name(newer["id"]), newer)
    channel = read_channel(str(logdir / "live"))
    assert channel.ignored == [] and channel.beats[0].step == 100
    assert channel.requests[0].start == 20
    os.remove(os.path.join(folder, request_name(newer["id"])))
    # what this version writes says its format
    request = plan_request(str(logdir / "live"))
    write_request(str(logdir / "live"), request)
    with open(os.path.join(folder, request_name(request.id)), "rb") as fh:
        assert msgspec.json.decode(fh.read())["format"] == "1.2"
    # a major version it does not know: refused in one line
    _write_raw(folder, "rank0.json", _beat_dict(format="2.0"))
    asked = capture(str(logdir), "--run", "live")
    assert asked.returncode == 1
    (line,) = [ln for ln in asked.stderr.splitlines() if "ignored .phaseprof" in ln]
    assert "rank0.json: format 2.0: this phaseprof reads format 1.x" in line


# -- the terminal and --wait -------------------------------------------------------------------


class Responder:
    """The job's side of the channel for one rank, answering by the file protocol (no torch): a
    fresh heartbeat every 0.1 s; the n-th request gets ``answers[n]`` (state, reason)."""

    def __init__(self, run_dir, answers):
        import threading

        self.run_dir, self.answers, self.seen = str(run_dir), answers, []
        self.folder = _publish(run_dir, _beat())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        step = 100
        while not self.stop.wait(0.1):
            step += 5
            _write_raw(self.folder, "rank0.json", _beat(step=step))
            for request in read_channel(self.run_dir).requests:
                if request.id in self.seen:
                    continue
                state, reason = self.answers[len(self.seen)]
                self.seen.append(request.id)
                answer = Answer(id=request.id, rank=0, state=state, updated=time.time(),
                                first=request.start, last=request.start + request.steps - 1,
                                reason=reason)
                _write_raw(self.folder, answer_name(request.id, 0), answer)

    def close(self):
        self.stop.set()
        self.thread.join(30)


def test_wait_asks_again_after_a_miss_and_prints_what_files_say_as_text(tmp_path):
    from tests.capture_job import capture

    run = tmp_path / "run"
    forged = "shortened\x1b]0;pwned\x07\x1b[2J"  # sets the window title, clears the screen
    missed = "missed: rank 0 was at step 7 when it saw the request; ask again"
    responder = Responder(run, [(REFUSED, missed), (WRITTEN, forged)])
    try:
        asked = capture(str(tmp_path), "--run", "run", "--ranks", "0", "--wait", "--timeout", "300")
    finally:
        responder.close()
    assert asked.returncode == 0, asked.stderr + asked.stdout
    assert "asking again with a longer lead" in asked.stdout
    requests = read_channel(str(run)).requests
    assert [r.ranks for r in requests] == [[0], [0]] and requests[1].id == responder.seen[1]
    assert "\x1b" not in asked.stdout + asked.stderr
    assert "shortened\\x1b]0;pwned\\x07\\x1b[2J" in asked.stdout


def test_an_argument_is_printed_as_text(tmp_path):
    from tests.capture_job import capture

    asked = capture(str(tmp_path), "--run", "no\x1b[2Jsuch")
    assert asked.returncode == 2 and "\x1b" not in asked.stderr
    assert "no\\x1b[2Jsuch" in asked.stderr


# -- who may POST: the address TensorBoard serves on -------------------------------------------


@pytest.mark.parametrize(("host", "origin", "status"), [
    ("evil.example", "http://evil.example", 403),  # a DNS-rebinding page: its name, resolving here
    ("evil.example", None, 403),
    ("localhost", "http://evil.example", 403),
    ("localhost", "null", 403),
    ("localhost:8080", None, 403),  # not the port TensorBoard is bound to (80 in the test client)
    ("localhost", "http://localhost:8080", 403),
    ("localhost", None, 200),
    ("localhost", "http://localhost", 200),
    ("127.0.0.1:80", "http://127.0.0.1", 200),
    ("[::1]", "http://[::1]", 200),
])
def test_a_post_from_another_host_or_origin_is_refused_and_writes_nothing(live_run, host, origin,
                                                                          status):
    logdir, folder, client = live_run
    headers = {ASK_HEADER: "ask", **({"Origin": origin} if origin else {})}
    response = client.post(f"{BASE}/capture?run=live", headers=headers,
                           environ_overrides={"HTTP_HOST": host})
    assert response.status_code == status, response.get_data(as_text=True)
    written = [n for n in os.listdir(folder) if n.startswith("request.")]
    assert len(written) == (status == 200)


def test_the_hosts_tensorboard_serves_on_follow_its_flags():
    import argparse
    import socket

    from phaseprof.plugin.serving.loader import PhaseprofLoader
    from phaseprof.plugin.serving.origin import Served

    def refusal(header, origin=None, port="6006", **flags):
        defaults = {"host": None, "bind_all": False, "phaseprof_allowed_hosts": ""}
        environ = {"HTTP_HOST": header, "SERVER_PORT": port, "wsgi.url_scheme": "http"}
        if origin:
            environ["HTTP_ORIGIN"] = origin
        return Served(argparse.Namespace(**{**defaults, **flags})).refusal(environ)

    name = socket.gethostname()
    assert refusal("localhost:6006") is None and refusal("127.0.0.1:6006") is None
    assert refusal(f"{name}:6006") is not None  # served on localhost only
    assert refusal(f"{name}:6006", f"http://{name}:6006", bind_all=True) is None
    assert refusal(f"{name.upper()}:6006", host="0.0.0.0") is None
    assert refusal("box.lab:6006", host="box.lab") is None
    assert refusal("other.lab:6006", host="box.lab")
    # a reverse proxy: its name, at its port or at TensorBoard's
    proxy = "tb.example.com"
    assert refusal(proxy, f"https://{proxy}", phaseprof_allowed_hosts=proxy) is None
    assert refusal("tb.example.com:8443", phaseprof_allowed_hosts="tb.example.com:8443") is None
    assert refusal(f"{proxy}:6006", phaseprof_allowed_hosts=f"{proxy}, x.example") is None
    assert refusal("tb.example.com:9", phaseprof_allowed_hosts="tb.example.com") is not None
    assert "not an address this TensorBoard serves on" in refusal("evil.example:6006")
    assert "is not this TensorBoard's" in refusal("localhost:6006", "http://localhost.evil.example")
    # the flag is checked when TensorBoard starts
    loader, parser = PhaseprofLoader(), argparse.ArgumentParser()
    loader.define_flags(parser)
    with pytest.raises(base_plugin.FlagsError, match="'a b:x' is not name or name:port"):
        loader.fix_flags(parser.parse_args(["--phaseprof_allowed_hosts", "ok.example,a b:x"]))


@pytest.mark.slow
def test_a_real_tensorboard_refuses_a_post_from_another_host_or_origin(tmp_path):
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    from tests.tensorboard_server import TensorBoard

    write_scalars(tmp_path / "live", range(5))
    folder = _publish(tmp_path / "live", _beat())
    tb = TensorBoard(tmp_path)
    try:
        port = urlsplit(tb.url).port
        deadline = time.monotonic() + 300
        while True:  # until the plugin has found the run
            try:
                tb.json(f"{BASE}/capture?run=live")
                break
            except urllib.error.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.5)

        def post(host, origin):
            _publish(tmp_path / "live", _beat())  # a fresh heartbeat: the run is running
            url = f"http://127.0.0.1:{port}{BASE}/capture?run=live"
            headers = {ASK_HEADER: "ask", "Host": host, "Origin": origin}
            request = urllib.request.Request(url, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.status
            except urllib.error.HTTPError as e:
                return e.code

        assert post(f"evil.example:{port}", f"http://evil.example:{port}") == 403
        assert post(f"localhost:{port}", "http://evil.example") == 403
        assert [n for n in os.listdir(folder) if n.startswith("request.")] == []
        assert post(f"localhost:{port}", f"http://localhost:{port}") == 200
        assert len([n for n in os.listdir(folder) if n.startswith("request.")]) == 1
    finally:
        tb.close()


def _request(**changes):
    from phaseprof.capture_channel import Request

    fields = {"id": "a" * 16, "written": time.time(), "by": "cli", "steps": 2, "start": 5, **changes}
    return Request(**fields)


def _why(**changes):
    from phaseprof.capture_channel import Why

    return Why(**{"rank": 0, "steps": [3], "step_ms": [9.0], "median_ms": 5.0, "band_ms": 1.0, **changes})


@pytest.mark.parametrize(("check", "line"), [
    (lambda: _request(start=-1), "negative step or rank"),
    (lambda: _request(ranks=[-2]), "negative step or rank"),
    (lambda: _request(why=_why(steps=[2 ** 60])),
     "why: step 1152921504606846976 is not a step number (0..2**53)"),
    (lambda: _request(why=_why(band_ms=float("nan"))), "why: a time that is not a finite, non-negative number"),
    (lambda: _request(id="b" * 16), "its id 'bbbbbbbbbbbbbbbb' is not its file name's"),
    (lambda: _request(by="x" * 50), f"unknown requester '{'x' * 38}…"),
], ids=["negative start", "negative rank", "why's step", "why's time", "id", "long requester"])
def test_a_request_out_of_bounds_says_what_is_wrong_in_one_line(check, line):
    """The ignored list shows each check's reason whole (a long value cut to 40 characters)."""
    from phaseprof.capture_channel import check_request

    with pytest.raises(Unreadable) as e:
        check_request(check(), "a" * 16)
    assert str(e.value).startswith(line)


@pytest.mark.parametrize(("changes", "line"), [
    ({"id": "b" * 16}, "its id or rank is not its file name's"),
    ({"first": -3, "last": 4}, "first step -3 is not a step number (0..2**53)"),
    ({"first": 3}, "steps 3–None are not a capture's"),
    ({"first": 3, "last": 2}, "steps 3–2 are not a capture's"),
    ({"first": 3, "last": 4, "files": ["a/b.json"]}, "its files are not a few trace file names"),
])
def test_an_answer_out_of_bounds_says_what_is_wrong(changes, line):
    from phaseprof.capture_channel import check_answer

    answer = Answer(**{"id": "a" * 16, "rank": 1, "state": WRITTEN, "updated": time.time(), **changes})
    with pytest.raises(Unreadable) as e:
        check_answer(answer, "a" * 16, 1, time.time())
    assert str(e.value) == line
    good = Answer(id="a" * 16, rank=1, state=WRITTEN, updated=time.time(), first=3, last=4, files=["w.json"])
    assert check_answer(good, "a" * 16, 1, time.time()) is good


def test_a_plan_says_why_not_in_full_and_starts_where_its_lead_puts_it(tmp_path):
    """The reasons a run cannot be asked, whole; a plan of one step; the start the lead given puts
    ahead of the rank, and the deadline when that rank, at its pace, reaches the start."""
    from phaseprof.capture_channel import MAX_WAIT_S, STALE_REQUEST_S

    os.makedirs(capture_dir(str(tmp_path)))
    with pytest.raises(ValueError) as e:
        plan_request(str(tmp_path), 5)
    assert str(e.value) == ("no running PhaseProfiler watches this run for capture requests (it has not "
                            "started, or it was written by another tool or an older phaseprof)")
    _publish(tmp_path, _beat(schedule_until=None))
    with pytest.raises(ValueError) as e:
        plan_request(str(tmp_path), 5)
    assert str(e.value) == ("rank 0 traces every cycle of its schedule (repeat=0): its traces already "
                            "cover the run")
    beat = _beat(step=100, pace=50.0)
    _publish(tmp_path, beat)
    now = beat.time
    plan = plan_request(str(tmp_path), 1, ranks=[0, 0], lead_s=7.0, now=now)
    assert (plan.steps, plan.ranks, plan.start) == (1, [0], 100 + 50 * 7 + MARGIN_STEPS)
    wait = (plan.start - 100) / 50  # seconds until the rank reaches the start
    assert plan.expires - now == pytest.approx(min(MAX_WAIT_S, wait + STALE_REQUEST_S))


def test_a_request_for_a_run_without_a_capture_folder_says_it_is_missing(tmp_path):
    with pytest.raises(ValueError) as e:
        write_request(str(tmp_path), _request())
    assert str(e.value) == f"{capture_dir(str(tmp_path))} is not a folder a running profiler made (missing)"


def test_the_watcher_s_folder_reads_a_file_within_the_bound(tmp_path):
    from phaseprof.capture_channel import open_folder

    folder = _publish(tmp_path)
    (tmp_path / folder / "ok").write_bytes(b"{}")
    (tmp_path / folder / "big").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    with open_folder(str(tmp_path)) as opened:
        assert opened.read("ok") == b"{}"
        with pytest.raises(Unreadable, match="more than"):
            opened.read("big")


def test_a_request_is_checked_against_the_time_the_channel_is_read_at(tmp_path):
    """`read_channel`'s ``now`` is every check's: a request written after it is not yet one."""
    folder = _publish(tmp_path, _beat())
    request = _request()
    with open(os.path.join(folder, request_name(request.id)), "wb") as fh:
        fh.write(msgspec.json.encode(request))
    assert read_channel(str(tmp_path)).requests == [request]
    early = read_channel(str(tmp_path), now=request.written - 3600)
    assert early.requests == [] and any("is not a time before now" in line for line in early.ignored)

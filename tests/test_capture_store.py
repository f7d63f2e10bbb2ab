"""The capture channel of a run in a store (`phaseprof.capture_store`), against the S3 server on the
loopback (`tests.s3`), without a training job: what one look of a rank asks of the store (seen on
the wire), objects out of bounds, and a store that fails."""

from __future__ import annotations

import math
import time
import warnings
from types import SimpleNamespace

import msgspec
import pytest

from phaseprof.capture_channel import (
    ACCEPTED,
    MARGIN_STEPS,
    REFUSED,
    Request,
    plan_request,
    read_channel,
    request_name,
    write_request,
)
from phaseprof.capture_store import POLL_ENV, SLACK_S
from phaseprof.plugin.reading import storage
from phaseprof.training_hooks.capture import CaptureWatcher, Slowdown
from phaseprof.training_hooks.faults import Faults
from phaseprof.training_hooks.recorder import PhaseStats
from tests.s3 import Relay


def _watcher(url: str, slowdown: Slowdown | None = None, stats: PhaseStats | None = None) -> CaptureWatcher:
    """A rank's watcher over the run ``url`` at step 100, its thread stopped: the test looks."""
    prof = SimpleNamespace(_rank=0, run_dir=url, _schedule={"active": 3}, _profile_until=5, step_num=100,
                           _faults=Faults(url), _recorder=SimpleNamespace(stats=stats))
    watcher = CaptureWatcher(prof, 1, slowdown)
    watcher._stop.set()
    watcher._thread.join()
    return watcher


@pytest.fixture
def on_the_wire(s3, monkeypatch):
    """Every request of the bounded store client of this process, through a relay."""
    import s3fs

    relay = Relay(s3.port)
    fs = s3fs.S3FileSystem(endpoint_url=relay.endpoint, **storage._bounded("s3"))
    fs.retries = 1
    monkeypatch.setitem(storage._filesystems, ("s3", True), fs)
    return relay


def _asked(relay) -> list[tuple[str, str]]:
    """The requests since the last call: method, and the key or the listing's prefix."""
    out = []
    for method, target in relay.take()[1]:
        path, _, query = target.partition("?")
        prefix = dict(p.partition("=")[::2] for p in query.split("&")).get("prefix")
        out.append((method, f"list {prefix}" if prefix is not None else path))
    return out


def test_a_rank_looks_with_one_listing_and_one_put(s3, bucket, on_the_wire):
    """The documented cost of a look: one LIST of the requests (by prefix: one page whatever the
    number of ranks) and one PUT of the heartbeat; a new request costs one GET, an answer one PUT."""
    url = f"s3://{bucket}/p/r"
    folder = "p/r/.phaseprof/capture/"
    watcher = _watcher(url)
    _asked(on_the_wire)  # (its thread's first look)
    try:
        watcher.tick()
        assert _asked(on_the_wire) == [("PUT", f"/{bucket}/{folder}rank0.json"), ("GET", f"list {folder}request.")]
        request = plan_request(url, 3, now=time.time())
        write_request(url, request)
        _asked(on_the_wire)
        watcher.tick()
        name = request_name(request.id)
        assert _asked(on_the_wire) == [
            ("PUT", f"/{bucket}/{folder}rank0.json"), ("GET", f"list {folder}request."),
            ("GET", f"/{bucket}/{folder}{name}"), ("PUT", f"/{bucket}/{folder}answer.{request.id}.rank0.json")]
        assert watcher.plan is not None and watcher.plan.state == ACCEPTED
        watcher.tick()  # nothing new: the look's two requests
        assert _asked(on_the_wire) == [("PUT", f"/{bucket}/{folder}rank0.json"), ("GET", f"list {folder}request.")]
    finally:
        watcher.close()
    assert read_channel(url).beats[0].ended


def test_a_watcher_looks_as_often_as_its_environment_says_and_the_asker_leads_by_that(
        s3, bucket, monkeypatch):
    """``PHASEPROF_CAPTURE_POLL_S=0.5``: the watcher's thread waits 0.5 s between looks and its
    heartbeat says so; the asker (here without that setting) then leads by 0.5 s and the slack,
    not by the default 4 s."""
    monkeypatch.setenv(POLL_ENV, "0.5")
    url = f"s3://{bucket}/p/r"
    watcher = _watcher(url)
    stop, waits = watcher._stop, []
    watcher._stop = SimpleNamespace(wait=lambda seconds: waits.append(seconds) or True)
    try:
        watcher._run()  # its thread's work: a look, then a wait (told to stop here)
    finally:
        watcher._stop = stop
        watcher.close()
    assert waits == [0.5]
    monkeypatch.delenv(POLL_ENV)
    beat = read_channel(url).beats[0]
    beat = msgspec.structs.replace(beat, ended=False, step=100, steps_per_s=10.0)
    assert beat.look_s == 0.5
    s3.put(bucket, "p/r/.phaseprof/capture/rank0.json", msgspec.json.encode(beat))
    # 10 steps a second for 0.5 s and the slack, then the step in progress and a warm-up step
    request = plan_request(url, 3, now=beat.time)
    assert request.start == 100 + math.ceil(10 * (0.5 + SLACK_S)) + MARGIN_STEPS


def test_objects_out_of_bounds_are_ignored_and_never_read_whole(s3, bucket, on_the_wire):
    """A 10 MB request is ignored with its size and never fetched; one whose id is not its name's,
    with the reason; a key one level deeper is not the channel's."""
    url = f"s3://{bucket}/p/r"
    folder = "p/r/.phaseprof/capture/"
    watcher = _watcher(url)
    client = s3.client()
    good = Request(id="1" * 16, written=time.time(), by="cli", steps=2, start=10**6)
    client.put_object(Bucket=bucket, Key=folder + request_name("2" * 16), Body=b"x" * (10 << 20))
    client.put_object(Bucket=bucket, Key=folder + request_name("3" * 16), Body=msgspec.json.encode(good))
    client.put_object(Bucket=bucket, Key=folder + "deeper/" + request_name(good.id), Body=msgspec.json.encode(good))
    _asked(on_the_wire)
    try:
        with pytest.warns(RuntimeWarning) as caught:
            watcher.tick()
        received, asked = on_the_wire.take()
    finally:
        watcher.close()
    said = sorted(str(w.message) for w in caught if str(w.message).startswith("phaseprof"))
    assert said == [f"phaseprof: ignored the capture request s3://{bucket}/{folder}{request_name('2' * 16)}: "
                    "10485760 bytes, more than 8192",
                    f"phaseprof: ignored the capture request s3://{bucket}/{folder}{request_name('3' * 16)}: "
                    f"its id '{'1' * 16}' is not its file name's"]
    assert received < 64 << 10 and not any("deeper" in t or "2" * 16 in t for _, t in asked if "?" not in t)
    channel = read_channel(url)
    assert channel.requests == [] and len(channel.ignored) == 2


def test_a_failing_store_is_one_fault_per_outage_and_the_loop_never_waits(s3, bucket):
    """The store stops: each look fails, one line for the outage (not one per look); the loop's
    side (`plan`) is read without the store; once the store is back, the next look beats there."""
    url = f"s3://{bucket}/p/r"
    watcher = _watcher(url)
    faults = watcher._prof._faults
    try:
        s3.stop()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # never the run's warning: the uploads' says more
                for _ in range(3):
                    watcher.tick()
                    assert watcher.plan is None
        finally:
            s3.start()  # back on the same port, empty
            s3.client().create_bucket(Bucket=bucket)
        (line,) = faults.summary()
        assert f"the capture channel in {url}/.phaseprof/capture failed (the store does not answer)" in line
        assert "times" not in line
        watcher.tick()
        assert read_channel(url).beats[0].step == 100
    finally:
        watcher.close()
    assert read_channel(url).beats[0].ended
    # an outage that ended lost nothing: the summary does not list it (its one warning was given)
    assert faults.summary() == []


def test_the_slowdown_trigger_asks_through_the_store(s3, bucket):
    """``capture_on_slowdown`` for a run in a store: the watcher judges the recorder's steps, writes
    its request into the store, and accepts it at its next look, as every rank would."""
    from array import array

    stats = PhaseStats()
    stats.numbers = array("q", range(62, 100))
    stats.cpu = {"forward": array("d", [10.0] * 30 + [50.0] * 8)}
    url = f"s3://{bucket}/p/r"
    watcher = _watcher(url, Slowdown(), stats)
    try:
        watcher.tick()  # the slowdown judged: the request written
        watcher.tick()  # read back, and accepted
        (request,) = read_channel(url).requests
        assert request.by == "slowdown" and request.why.steps == list(range(92, 100))
        assert watcher.plan is not None and watcher.plan.start == request.start
        assert read_channel(url).answers[request.id][0].state == ACCEPTED
    finally:
        watcher.close()
    assert read_channel(url).answers[request.id][0].state == REFUSED  # the run ended before it


def test_a_tensorboard_the_store_denies_writing_answers_403_and_writes_nothing(s3, bucket, tmp_path, monkeypatch):
    """The tab writes a request with TensorBoard's own credentials: where the bucket's policy denies
    them the PUT (a relay answering S3's AccessDenied), ``POST /capture`` is a 403 saying so."""
    import s3fs

    from phaseprof.plugin.serving.capture import ASK_HEADER
    from tests.logdir import write_scalars
    from tests.s3 import Gate
    from tests.test_capture_channel import _beat, _publish
    from tests.test_plugin import BASE, make_app

    write_scalars(tmp_path / "live", range(5))
    _publish(tmp_path / "live", _beat(0, step=40))
    s3.upload_tree(tmp_path, bucket, "p")
    keys = s3.keys(bucket)
    gate = Gate(s3.port, deny_writes=True)
    fs = s3fs.S3FileSystem(endpoint_url=gate.endpoint, **storage._bounded("s3"))
    monkeypatch.setitem(storage._filesystems, ("s3", True), fs)
    plugin, client = make_app(f"s3://{bucket}/p")
    try:
        assert plugin._store.wait(300)
        response = client.post(f"{BASE}/capture?run=live&steps=3", headers={ASK_HEADER: "ask"})
    finally:
        plugin._store.close()
        gate.stop()
    body = response.get_data(as_text=True)
    assert response.status_code == 403 and "the request cannot be written" in body and "Access Denied" in body
    assert gate.denied >= 1 and s3.keys(bucket) == keys

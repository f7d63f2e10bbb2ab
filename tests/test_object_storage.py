"""Logdirs in an object store, read through a real S3 API server on 127.0.0.1 (`tests.s3`): the CLI, the
analysis and a real TensorBoard reach it as a user's would, through s3fs and boto3 with the endpoint and
keys in the environment."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator

import pytest

from tests.logdir import write_scalars


def _logdir(tmp_path, traces):
    """A local logdir of real traces: a run of one CPU worker with its scalars, a two-rank GPU job."""
    root = tmp_path / "local"
    for run, src in {"cpu": ("cpu", "base"), "ranks": ("gpu", "hta_sampled_2rank")}.items():
        (root / run).mkdir(parents=True)
        for f in traces.files(*src):
            shutil.copy(f, root / run / f.name)
    write_scalars(root / "cpu", range(12))
    return root


def _two_ranks(tmp_path, traces):
    """A local logdir of one run, ``ranks``: the two rank traces of hta_sampled_2rank, named as traces."""
    local = tmp_path / "local"
    (local / "ranks").mkdir(parents=True)
    for i, f in enumerate(traces.files("gpu", "hta_sampled_2rank")):
        shutil.copy(f, local / "ranks" / f"rank{i}.1.pt.trace.json.gz")
    return local


@contextlib.contextmanager
def _store_process(script: str, url: str, relay, tmp_path) -> Iterator[subprocess.Popen]:
    """``script`` in a process of its own, reaching the store through ``relay``. However the test ends,
    the relay lets what it holds through and the process is ended: a failed test leaves no process
    waiting on a held request."""
    env = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint, "PHASEPROF_CACHE": str(tmp_path / "user-cache")}
    proc = subprocess.Popen([sys.executable, "-c", script, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        yield proc
    finally:
        relay.release()
        proc.kill()
        proc.wait()


def _finish_store_process(proc: subprocess.Popen, relay) -> None:
    """Let the held request through and tell the script to go on: it ends cleanly only if its own
    checks of the store hold."""
    relay.release()
    proc.stdin.close()
    assert proc.wait(300) == 0, proc.stderr.read()


def cli(*args, cache="off"):
    env = {**os.environ, "COLUMNS": "160", "PHASEPROF_CACHE": cache}
    return subprocess.run([sys.executable, "-m", "phaseprof.cli", *args], capture_output=True, text=True, env=env)


def test_report_of_a_bucket_equals_the_report_of_the_same_files_on_disk(store, store_bucket, tmp_path,
                                                                       traces):
    local = _logdir(tmp_path, traces)
    store.upload_tree(local, store_bucket, "p")
    here = cli("report", str(local), "--json")
    url = store.url(store_bucket, "p")
    # Azure's two schemes name one store: adlfs reads both
    for logdir in [url] + ([f"abfs://{store_bucket}/p"] if store.scheme == "az" else []):
        remote = cli("report", logdir, "--json")
        assert remote.returncode == 0, remote.stderr
        assert json.loads(remote.stdout) == json.loads(here.stdout)
    data = json.loads(remote.stdout)
    assert {r["run"] for r in data["runs"]} == {"cpu", "ranks"} and data["errors"] == []
    assert next(r for r in data["runs"] if r["run"] == "cpu")["whole_run"]  # the scalars were read too
    # one run, one rank: --run and the trailing slash of a prefix
    one = cli("report", f"{url}/", "--run", "ranks", "--json")
    assert [r["run"] for r in json.loads(one.stdout)["runs"]] == ["ranks"]


def test_analyses_beside_the_traces_are_read_instead_of_the_traces(s3, bucket, tmp_path, traces):
    """A trace whose analysis was written at the source is never downloaded: here each trace object is
    replaced by bytes of its size that are no trace, and the report still shows the real figures."""
    local = tmp_path / "local"
    (local / "ranks").mkdir(parents=True)
    for i, f in enumerate(traces.files("gpu", "hta_sampled_2rank")):
        shutil.copy(f, local / "ranks" / f"rank{i}.1.pt.trace.json.gz")  # named as traces: never sniffed
    expected = json.loads(cli("report", str(local / "ranks"), "--json", cache="on").stdout)  # writes the analyses
    assert len(list((local / "ranks" / ".phaseprof").glob("*.analysis"))) == 2
    s3.upload_tree(local / "ranks", bucket, "p/ranks")
    client = s3.client()
    for f in (local / "ranks").glob("*.json.gz"):
        client.put_object(Bucket=bucket, Key=f"p/ranks/{f.name}", Body=b"x" * f.stat().st_size)
    out = cli("report", f"s3://{bucket}/p/ranks", "--json", cache=str(tmp_path / "user-cache"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected
    # without the analyses, the traces are read: and these are not traces
    for f in (local / "ranks" / ".phaseprof").glob("*.analysis"):
        client.delete_object(Bucket=bucket, Key=f"p/ranks/.phaseprof/{f.name}")
    errors = json.loads(cli("report", f"s3://{bucket}/p/ranks", "--json", cache=str(tmp_path / "user-cache")).stdout)
    assert len(errors["errors"]) == 2 and all(e["path"].startswith(f"s3://{bucket}/p/ranks/") for e in errors["errors"])


def test_analyses_in_a_bucket_of_a_newer_minor_format_are_read_of_a_newer_major_one_are_not(
        s3, bucket, tmp_path, traces):
    """Analyses written at the source by another phaseprof: one of a newer minor format (1.7) is
    read instead of its trace; one of a newer major format (2.0) is not used, and its trace is
    downloaded and read instead. The report is the same, without an error."""
    local = _two_ranks(tmp_path, traces)
    # the report writes the analyses
    expected = json.loads(cli("report", str(local / "ranks"), "--json", cache="on").stdout)
    s3.upload_tree(local / "ranks", bucket, "p/ranks")
    client = s3.client()
    for i, version in enumerate((b"1.7", b"2.0")):
        name = f"rank{i}.1.pt.trace.json.gz"
        entry = (local / "ranks" / ".phaseprof" / f"{name}.analysis").read_bytes()
        entry = b"phaseprof-analysis " + version + entry[entry.index(b"\n"):]
        client.put_object(Bucket=bucket, Key=f"p/ranks/.phaseprof/{name}.analysis", Body=entry)
    size = (local / "ranks" / "rank0.1.pt.trace.json.gz").stat().st_size
    # rank 0's trace is no trace any more: only its 1.7 entry can answer
    client.put_object(Bucket=bucket, Key="p/ranks/rank0.1.pt.trace.json.gz", Body=b"x" * size)
    out = cli("report", f"s3://{bucket}/p/ranks", "--json", cache=str(tmp_path / "user-cache"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout) == expected


def test_nothing_outside_the_logdir_is_listed(s3, bucket, traces):
    from phaseprof.plugin.reading.discovery import discover

    client = s3.client()
    trace = traces.files("cpu", "base")[0].read_bytes()
    for key in ("p/run/rank0.1.pt.trace.json.gz",  # inside
                "p-other/rank1.1.pt.trace.json.gz",  # a sibling prefix that begins with the logdir's
                "p/run/../../q/rank2.1.pt.trace.json.gz",  # a key with '..' segments
                "p//rank3.1.pt.trace.json.gz", "q/rank4.1.pt.trace.json.gz"):
        client.put_object(Bucket=bucket, Key=key, Body=trace)
    runs = discover(f"s3://{bucket}/p")
    assert [(r.name, [f.path for f in r.files]) for r in runs] == [
        ("run", [f"s3://{bucket}/p/run/rank0.1.pt.trace.json.gz"])]


def test_compare_and_analyze_read_a_bucket(s3, bucket, tmp_path, traces):
    from phaseprof import analyze

    local = _logdir(tmp_path, traces)
    s3.upload_tree(local, bucket, "p")
    report = analyze(f"s3://{bucket}/p", run="cpu")
    assert report["errors"] == [] and report["runs"][0]["workers"][0]["steps"]
    out = cli("compare", f"s3://{bucket}/p/cpu", str(local / "cpu"), "--json")
    assert out.returncode in (0, 1), out.stderr
    assert json.loads(out.stdout)["base"]["path"] == f"s3://{bucket}/p/cpu"


def test_without_the_extra_a_url_gives_one_error_naming_it(tmp_path):
    blocked = ("import sys; sys.modules['s3fs'] = None; from phaseprof.cli import main; "
               "sys.exit(main(['report', 's3://bucket/p']))")
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 1
    assert "pip install 'phaseprof[s3]'" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_without_the_extra_a_profiler_writing_to_a_url_says_which_extra_to_install():
    blocked = ("import sys; sys.modules['s3fs'] = None; from phaseprof import PhaseProfiler; "
               "PhaseProfiler(logdir='s3://bucket/p')")
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].endswith("needs phaseprof's s3 extra: pip install 'phaseprof[s3]'")


@pytest.mark.slow
def test_real_tensorboard_on_a_bucket_serves_runs_steps_and_a_step_trace(store, store_bucket, tmp_path,
                                                                        traces, tensorboard_server):
    local = _logdir(tmp_path, traces)
    store.upload_tree(local, store_bucket, "p")
    tb = tensorboard_server(store.url(store_bucket, "p"), *store.tensorboard_args)
    deadline = time.monotonic() + 180
    while True:
        runs = tb.json("/data/plugin/phaseprof/runs")
        if runs["loading"]["files"] == 3 and runs["loading"]["done"] == 3:
            break
        assert time.monotonic() < deadline, f"not loaded: {runs}"
        time.sleep(0.3)
    assert {r["run"] for r in runs["runs"]} == {"cpu", "ranks"} and runs["errors"] == []
    steps = tb.json("/data/plugin/phaseprof/steps?run=ranks")
    assert steps["steps"]
    number = steps["steps"][0]["step"]
    trace = tb.json(f"/data/plugin/phaseprof/trace?run=ranks&worker={steps['worker']}&step={number}")
    assert trace["traceEvents"]
    # the run's own scalars, read by TensorBoard through its reader of the store (in its own time:
    # 404 until its first load of the run is done)
    while True:
        try:
            timeline = tb.json("/data/plugin/phaseprof/timeline?run=cpu")
            break
        except urllib.error.HTTPError as e:
            assert e.code == 404 and time.monotonic() < deadline + 120, e
            time.sleep(0.5)
    assert timeline["steps"] == list(range(12))
    # a span uploaded now appears on a later reload
    extra = traces.files("cpu", "dist")[0]
    store.put(store_bucket, f"p/later/{extra.name}", extra.read_bytes())
    while "later" not in {r["run"] for r in tb.json("/data/plugin/phaseprof/runs")["runs"]}:
        assert time.monotonic() < deadline + 120, "the new span was never listed"
        time.sleep(0.5)


def test_keys_outside_the_prefix_or_through_odd_segments_are_refused():
    """The check on every listed key, whatever the store's client lists (s3fs lists ``prefix/``; others may not)."""
    from phaseprof.plugin.reading.storage import _safe

    assert _safe("b/p/run/x.pt.trace.json.gz", "b/p")
    for key in ("b/p-other/x.pt.trace.json.gz", "b/p", "b/q/x", "b/p/../q/x", "b/p/./x", "b/p//x", "b/p/run/.."):
        assert not _safe(key, "b/p"), key


def test_on_request_capture_of_a_bucket_is_refused_with_the_reason(s3, bucket, tmp_path, traces):
    """The capture channel is files beside the run that the job and the asker share: a store has none."""
    import msgspec

    from phaseprof.capture_channel import IN_A_STORE
    from phaseprof.plugin.answers import CaptureAnswer
    from phaseprof.plugin.serving.capture import ASK_HEADER
    from tests.test_plugin import BASE, make_app

    s3.upload_tree(_logdir(tmp_path, traces), bucket, "p")
    keys = s3.keys(bucket)
    out = cli("capture", f"s3://{bucket}/p", "--run", "cpu")
    assert out.returncode == 2 and out.stderr.strip() == f"phaseprof capture: s3://{bucket}/p: {IN_A_STORE}"
    plugin, client = make_app(f"s3://{bucket}/p")
    try:
        assert plugin._store.wait(300)
        response = client.get(f"{BASE}/capture?run=cpu")
        assert response.status_code == 200, response.get_data(as_text=True)
        answer = msgspec.json.decode(response.get_data(), type=CaptureAnswer)
        assert not answer.can_ask and answer.reason == IN_A_STORE and answer.captures == []
        response = client.post(f"{BASE}/capture?run=cpu&steps=3", headers={ASK_HEADER: "ask"})
        assert response.status_code == 403 and "object store" in response.get_data(as_text=True)
    finally:
        plugin._store.close()
    assert s3.keys(bucket) == keys  # nothing written


def test_tensorboard_loads_a_bucket_s_analyses_batch_after_batch_without_a_trace(s3, bucket, tmp_path, traces,
                                                                                 monkeypatch):
    """Entries are fetched a batch at a time (the next while this one is decoded); every span loads from
    its entry: the trace objects are bytes that are no trace, and no loading process is started."""
    from phaseprof.plugin import cache
    from phaseprof.plugin.serving.store import READY, TraceStore

    local = _two_ranks(tmp_path, traces)
    assert cli("report", str(local / "ranks"), "--json", cache="on").returncode == 0  # writes the analyses
    s3.upload_tree(local / "ranks", bucket, "p/ranks")
    for f in (local / "ranks").glob("*.json.gz"):
        s3.client().put_object(Bucket=bucket, Key=f"p/ranks/{f.name}", Body=b"x" * f.stat().st_size)
    monkeypatch.setattr(cache, "PREFETCH_BATCH", 1)
    monkeypatch.setenv("PHASEPROF_CACHE", str(tmp_path / "user-cache"))
    store = TraceStore(f"s3://{bucket}/p")
    try:
        assert store.wait(300)
        spans = [store.span(f) for run in store.runs() for f in run.files]
        assert len(spans) == 2 and all(s.state == READY for s in spans), [(s.state, s.error) for s in spans]
        assert store._pool is None  # no file was handed to a loading process
    finally:
        store.close()


_LOAD = """
import sys
from phaseprof.plugin.serving.store import READY, TraceStore
store = TraceStore(sys.argv[1])
assert store.wait(300)
spans = [store.span(f) for run in store.runs() for f in run.files]
assert len(spans) == 2 and all(s.state == READY for s in spans), [(s.state, s.error) for s in spans]
store.close()
"""


def test_tensorboard_s_scan_of_a_bucket_is_one_listing_and_a_get_per_analysis(s3, bucket, tmp_path, traces):
    """What TensorBoard's store asks of the store to load a logdir whose analyses were written at the
    source, seen on the wire (a relay in front of the server): one listing of the prefix, then one GET
    of each analysis; no HEAD, no other listing, nothing of the traces."""
    from tests.s3 import Relay

    local = _two_ranks(tmp_path, traces)
    assert cli("report", str(local / "ranks"), "--json", cache="on").returncode == 0  # writes the analyses
    s3.upload_tree(local, bucket, "p")
    relay = Relay(s3.port)
    env = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint, "PHASEPROF_CACHE": str(tmp_path / "user-cache")}
    out = subprocess.run([sys.executable, "-c", _LOAD, f"s3://{bucket}/p"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    _, asked = relay.take()
    listings = [t for m, t in asked if m == "GET" and "?" in t]
    reads = sorted(t for m, t in asked if m == "GET" and "?" not in t)
    assert [m for m, _ in asked if m != "GET"] == []
    assert len(listings) == 1 and "prefix=p/&" in listings[0] and "delimiter=&" in listings[0], listings
    assert reads == [f"/{bucket}/p/ranks/.phaseprof/rank{i}.1.pt.trace.json.gz.analysis" for i in range(2)]


def test_a_url_naming_one_trace_object_is_read_as_a_logdir_of_that_trace(s3, bucket, traces):
    from phaseprof.plugin.reading.discovery import discover

    trace = traces.files("cpu", "base")[0]
    s3.client().put_object(Bucket=bucket, Key=f"p/run/{trace.name}", Body=trace.read_bytes())
    (run,) = discover(f"s3://{bucket}/p/run/{trace.name}")
    assert (run.name, run.path, [(f.path, f.size) for f in run.files]) == (
        ".", f"s3://{bucket}/p/run", [(f"s3://{bucket}/p/run/{trace.name}", trace.stat().st_size)])
    assert discover(f"s3://{bucket}/p/nothing-here") == []


_RESCAN = """
import sys, threading, time
from phaseprof.plugin.serving.store import READY, TraceStore
store = TraceStore(sys.argv[1])
first = threading.Thread(target=store.refresh, kwargs={"force": True})
first.start()
while store.progress().files < 2:  # listed; its entries are being fetched (the relay holds them)
    time.sleep(0.05)
for _ in range(3):
    store.refresh(force=True)
print("rescanned", flush=True)
sys.stdin.readline()
first.join()
assert all(store.span(f).state == READY for run in store.runs() for f in run.files)
store.close()
"""


def test_a_bucket_is_not_listed_again_while_the_scan_under_way_fetches_its_entries(s3, bucket, tmp_path, traces):
    from tests.s3 import Relay

    local = _two_ranks(tmp_path, traces)
    assert cli("report", str(local / "ranks"), "--json", cache="on").returncode == 0  # writes the analyses
    s3.upload_tree(local, bucket, "p")
    relay = Relay(s3.port, hold=".analysis")
    with _store_process(_RESCAN, f"s3://{bucket}/p", relay, tmp_path) as proc:
        assert proc.stdout.readline() == "rescanned\n", proc.stderr.read()
        _, asked = relay.take()
        _finish_store_process(proc, relay)
    assert len([t for m, t in asked if "?" in t]) == 1, asked


_ASK = """
import sys
from phaseprof.plugin.serving.store import READY, TraceStore
store = TraceStore(sys.argv[1])
store.refresh()  # what a route does
print("answered", len(store.runs()), flush=True)
sys.stdin.readline()
assert store.wait(300) and [r.name for r in store.runs()] == ["ranks"]
store.close()
"""


def test_a_request_does_not_wait_for_a_listing_of_the_bucket(s3, bucket, tmp_path, traces):
    """A route's rescan of a store runs in the background: the request answers from what is known while
    the listing (held here by a relay) is under way, and the next ones see what it found."""
    from tests.s3 import Relay

    local = _two_ranks(tmp_path, traces)
    s3.upload_tree(local, bucket, "p")
    relay = Relay(s3.port, hold="list-type=")
    with _store_process(_ASK, f"s3://{bucket}/p", relay, tmp_path) as proc:
        line = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(120)  # a generous deadline: a request waiting for the held listing never answers
        assert line == ["answered 0\n"]
        _finish_store_process(proc, relay)

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


@pytest.mark.parametrize("args, code", [(["report", "s3://bucket/p"], 1), (["capture", "s3://bucket/p"], 2),
                                        (["capture", "s3://bucket/p", "--run", "r"], 2)])
def test_without_the_extra_a_url_gives_one_error_naming_it(tmp_path, args, code):
    blocked = ("import sys; sys.modules['s3fs'] = None; from phaseprof.cli import main; "
               f"sys.exit(main({args!r}))")
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == code
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


def test_capture_of_a_bucket_run_no_job_watches_is_refused_with_the_reason(s3, bucket, tmp_path, traces):
    """A run uploaded by hand has no heartbeat in its capture folder (objects under the run's prefix,
    `phaseprof.capture_store`): the CLI and the route say no job watches it, and write nothing."""
    import msgspec

    from phaseprof.plugin.answers import CaptureAnswer
    from phaseprof.plugin.serving.capture import ASK_HEADER
    from tests.test_plugin import BASE, make_app

    s3.upload_tree(_logdir(tmp_path, traces), bucket, "p")
    keys = s3.keys(bucket)
    out = cli("capture", f"s3://{bucket}/p", "--run", "cpu")
    assert out.returncode == 1 and "no running PhaseProfiler watches this run" in out.stderr
    out = cli("capture", f"s3://{bucket}/p")
    assert out.returncode == 2 and f"no run under s3://{bucket}/p is running" in out.stderr
    plugin, client = make_app(f"s3://{bucket}/p")
    try:
        assert plugin._store.wait(300)
        for method in ("get", "post"):
            response = getattr(client, method)(f"{BASE}/capture?run=cpu&steps=3", headers={ASK_HEADER: "ask"})
            assert response.status_code == 200, response.get_data(as_text=True)
            answer = msgspec.json.decode(response.get_data(), type=CaptureAnswer)
            assert not answer.can_ask and "no running PhaseProfiler" in answer.reason and answer.captures == []
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
    source, seen on the wire (a relay in front of the server): one listing of the prefix less the
    analysis folders, one of the run's analysis folder, then one GET of each analysis; no HEAD, no
    other listing, nothing of the traces."""
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
    listing = f"/{bucket}?list-type=2&prefix=p/%sdelimiter=%s&encoding-type=url"
    assert listings == [listing % ("&", ".phaseprof/"), listing % ("ranks/.phaseprof/&", "")]
    assert reads == [f"/{bucket}/p/ranks/.phaseprof/rank{i}.1.pt.trace.json.gz.analysis" for i in range(2)]


def test_a_url_naming_one_trace_object_is_read_as_a_logdir_of_that_trace(s3, bucket, traces):
    from phaseprof.plugin.reading.discovery import discover

    trace = traces.files("cpu", "base")[0]
    s3.client().put_object(Bucket=bucket, Key=f"p/run/{trace.name}", Body=trace.read_bytes())
    (run,) = discover(f"s3://{bucket}/p/run/{trace.name}")
    assert (run.name, run.path, [(f.path, f.size) for f in run.files]) == (
        ".", f"s3://{bucket}/p/run", [(f"s3://{bucket}/p/run/{trace.name}", trace.stat().st_size)])
    assert discover(f"s3://{bucket}/p/nothing-here") == []


def test_a_listing_leaves_the_analysis_folders_out_and_a_folder_only_named_like_one_in(s3, bucket):
    """`discover` on S3 rolls each ``.phaseprof/`` folder up into its run's `analyses_apart` (its
    objects unlisted), at the logdir's root too; a run whose folder only ends in that name is listed
    all the same, its own analysis folder apart."""
    from phaseprof.plugin.reading.discovery import discover

    for key in ("run.phaseprof/r0.1.pt.trace.json.gz",
                "run.phaseprof/.phaseprof/r0.1.pt.trace.json.gz.analysis",
                "r1.1.pt.trace.json.gz", ".phaseprof/r1.1.pt.trace.json.gz.analysis",
                ".phaseprof/capture/request.json", "plain/r2.1.pt.trace.json.gz"):
        s3.put(bucket, f"p/{key}", b"x")
    runs = {r.name: ([f.name for f in r.files], r.analyses_apart, r.stored)
            for r in discover(f"s3://{bucket}/p")}
    p = f"s3://{bucket}/p"
    assert runs == {".": (["r1.1.pt.trace.json.gz"], f"{p}/.phaseprof", {}),
                    "plain": (["r2.1.pt.trace.json.gz"], "", {}),
                    "run.phaseprof": (["r0.1.pt.trace.json.gz"], f"{p}/run.phaseprof/.phaseprof",
                                      {})}


def test_a_second_start_on_a_bucket_lists_its_traces_and_fetches_no_analysis_again(
        s3, bucket, tmp_path, traces):
    """The analyses fetched from a store are kept in the user's cache with the ETag and size of
    their trace: a second start of TensorBoard's store on the bucket lists the traces alone (the
    analysis folder left out) and fetches nothing (seen on the wire). An analysis written again
    beside the same trace is not fetched (the copy holds the same figures); without the copies, the
    folder is listed and each entry fetched again; a trace added with its analysis costs that
    analysis alone."""
    from tests.s3 import Relay

    local = _two_ranks(tmp_path, traces)
    assert cli("report", str(local / "ranks"), "--json", cache="on").returncode == 0  # writes the analyses
    s3.upload_tree(local, bucket, "p")
    relay = Relay(s3.port)
    env = {**os.environ, "AWS_ENDPOINT_URL": relay.endpoint, "PHASEPROF_CACHE": str(tmp_path / "user-cache")}

    def start(ranks: int = 2) -> tuple[int, list[str], list[str]]:
        script = _LOAD.replace("== 2", f"== {ranks}")
        out = subprocess.run([sys.executable, "-c", script, f"s3://{bucket}/p"],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        received, asked = relay.take()
        assert [m for m, _ in asked if m != "GET"] == []
        return (received, [t for _, t in asked if "?" in t], sorted(t for _, t in asked if "?" not in t))

    traces_only = f"/{bucket}?list-type=2&prefix=p/&delimiter=.phaseprof/&encoding-type=url"
    folder = f"/{bucket}?list-type=2&prefix=p/ranks/.phaseprof/&delimiter=&encoding-type=url"
    entry = f"/{bucket}/p/ranks/.phaseprof/rank%d.1.pt.trace.json.gz.analysis"
    first, listings, reads = start()
    assert listings == [traces_only, folder] and reads == [entry % 0, entry % 1]
    second, listings, reads = start()
    assert listings == [traces_only] and reads == [] and second < first
    # rank 1's analysis written again (of a newer minor format: other bytes, another ETag)
    name = "rank1.1.pt.trace.json.gz.analysis"
    data = (local / "ranks" / ".phaseprof" / name).read_bytes()
    s3.client().put_object(Bucket=bucket, Key=f"p/ranks/.phaseprof/{name}",
                           Body=b"phaseprof-analysis 1.7" + data[data.index(b"\n"):])
    _, listings, reads = start()
    assert listings == [traces_only] and reads == []
    # rank 1's trace uploaded again, other bytes of its size (another ETag): its run's folder is
    # listed, and its entry, now of another ETag than the copy's, fetched (valid for a name, a size)
    trace = local / "ranks" / "rank1.1.pt.trace.json.gz"
    s3.put(bucket, "p/ranks/rank1.1.pt.trace.json.gz", b"x" * trace.stat().st_size)
    _, listings, reads = start()
    assert listings == [traces_only, folder] and reads == [entry % 1]
    s3.put(bucket, "p/ranks/rank1.1.pt.trace.json.gz", trace.read_bytes())
    shutil.rmtree(tmp_path / "user-cache" / "store")
    _, listings, reads = start()
    assert listings == [traces_only, folder] and reads == [entry % 0, entry % 1]
    # a third rank (rank 0's trace under another name), its trace and analysis uploaded later
    run_dir = local / "ranks"
    shutil.copy(run_dir / "rank0.1.pt.trace.json.gz", run_dir / "rank2.1.pt.trace.json.gz")
    assert cli("report", str(local / "ranks"), "--json", cache="on").returncode == 0
    for key in ("rank2.1.pt.trace.json.gz", ".phaseprof/rank2.1.pt.trace.json.gz.analysis"):
        s3.put(bucket, f"p/ranks/{key}", (local / "ranks" / key).read_bytes())
    _, listings, reads = start(ranks=3)
    assert listings == [traces_only, folder] and reads == [entry % 2]
    _, listings, reads = start(ranks=3)
    assert listings == [traces_only] and reads == []


_STEPS = """
import sys
from phaseprof.plugin.serving.store import READY, TraceStore
store = TraceStore(sys.argv[1])
for step in ("loaded", "rescanned", "found"):
    if step != "loaded":
        sys.stdin.readline()
    assert store.wait(300)  # a scan forced, and the loading of what it found
    spans = {f.path.rpartition("/p/")[2]: store.span(f).state
             for run in store.runs() for f in run.files}
    print(step, sorted(spans), set(spans.values()) == {READY}, store._interval, flush=True)
sys.stdin.readline()
store.close()
"""


def test_a_rescan_of_a_bucket_lists_its_traces_alone_and_finds_a_run_uploaded_since(
        s3, bucket, tmp_path, traces):
    """TensorBoard's store scanning a bucket again, seen on the wire: with nothing new, one listing
    that leaves the analysis folders out and no GET (the analyses are not listed or fetched again),
    and the next listing waits twice as long; a run uploaded since (its trace, then its analysis) is
    found by the next scan, which lists that run's analysis folder and fetches its analysis
    alone."""
    from tests.s3 import Relay

    local = _two_ranks(tmp_path, traces)
    assert cli("report", str(local / "ranks"), "--json", cache="on").returncode == 0  # the analyses
    s3.upload_tree(local, bucket, "p")
    relay = Relay(s3.port)
    traces_only = f"/{bucket}?list-type=2&prefix=p/&delimiter=.phaseprof/&encoding-type=url"
    with _store_process(_STEPS, f"s3://{bucket}/p", relay, tmp_path) as proc:
        # (the process waits for its input: its stderr is read only once it ended: no line)
        ranks = ["ranks/rank0.1.pt.trace.json.gz", "ranks/rank1.1.pt.trace.json.gz"]
        line = proc.stdout.readline()
        assert line == f"loaded {ranks} True 5.0\n", line or proc.stderr.read()
        relay.take()
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line == f"rescanned {ranks} True 10.0\n", line or proc.stderr.read()
        _, asked = relay.take()
        assert asked == [("GET", traces_only)]
        (local / "late").mkdir()
        shutil.copy(local / "ranks" / "rank0.1.pt.trace.json.gz", local / "late")
        assert cli("report", str(local / "late"), "--json", cache="on").returncode == 0
        for key in ("rank0.1.pt.trace.json.gz", ".phaseprof/rank0.1.pt.trace.json.gz.analysis"):
            s3.put(bucket, f"p/late/{key}", (local / "late" / key).read_bytes())
        proc.stdin.write("\n")
        proc.stdin.flush()
        late = ["late/rank0.1.pt.trace.json.gz", *ranks]
        line = proc.stdout.readline()
        assert line == f"found {late} True 5.0\n", line or proc.stderr.read()
        _, asked = relay.take()
        assert asked == [("GET", traces_only),
                         ("GET", traces_only.replace("p/&delimiter=.phaseprof/",
                                                     "p/late/.phaseprof/&delimiter=")),
                         ("GET", f"/{bucket}/p/late/.phaseprof/rank0.1.pt.trace.json.gz.analysis")]
        _finish_store_process(proc, relay)


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
        _finish_store_process(proc, relay)
    _, asked = relay.take()
    # the first scan's listings alone, to its end: the prefix's (the traces), then the run's
    # analysis folder (listed once the traces' listing made the spans: maybe after the rescans)
    assert [t for m, t in asked if "?" in t] == [
        f"/{bucket}?list-type=2&prefix=p/&delimiter=.phaseprof/&encoding-type=url",
        f"/{bucket}?list-type=2&prefix=p/ranks/.phaseprof/&delimiter=&encoding-type=url"], asked


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


def _logdir_error(tb, deadline_s: float = 180) -> dict:
    """TensorBoard's `/runs` once it says why its logdir cannot be listed (a generous deadline: it
    only turns a hang into a failure)."""
    deadline = time.monotonic() + deadline_s
    while (runs := tb.json("/data/plugin/phaseprof/runs"))["logdir_error"] is None:
        assert time.monotonic() < deadline, f"no reason given: {runs}"
        time.sleep(0.3)
    return runs


@pytest.mark.slow
def test_tensorboard_without_the_extra_says_which_to_install_in_the_tab(s3, bucket, tmp_path, traces,
                                                                       tensorboard_server):
    """A real TensorBoard on a bucket, its s3fs not importable (in it and its loading processes): the
    runs answer names the extra to install, once, in the run list's place, and the tab is active to say
    it (the bucket holds traces only: no scalars of TensorBoard's own that would make it active)."""
    s3.upload_tree(_two_ranks(tmp_path, traces), bucket, "p")
    blocker = tmp_path / "without-s3fs" / "s3fs"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 's3fs'\", name='s3fs')\n")
    tb = tensorboard_server(f"s3://{bucket}/p", env={"PYTHONPATH": str(blocker.parent)})
    runs = _logdir_error(tb)
    assert runs["logdir_error"] == (f"s3://{bucket}/p: reading s3:// logdirs needs phaseprof's s3 extra: "
                                    "pip install 'phaseprof[s3]'")
    assert runs["runs"] == [] and runs["errors"] == []
    assert tb.json("/data/plugins_listing")["phaseprof"]["enabled"]


def test_a_bucket_that_is_not_there_is_named_and_its_runs_show_once_it_is(s3, tmp_path, traces):
    """The store says the bucket does not exist: the runs answer says so (and nothing else); once the
    bucket is made and filled, the runs show and the reason is gone."""
    from tensorboard.backend import application
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    from phaseprof.plugin.serving.plugin import PhaseprofPlugin
    from tests.test_plugin import BASE

    name = f"later{time.monotonic_ns()}"
    # the plugin alone (TensorBoard's own reader of the scalars stops at a bucket that is not there)
    plugin = PhaseprofPlugin(base_plugin.TBContext(logdir=f"s3://{name}/p"))
    client = werkzeug_test.Client(application.TensorBoardWSGI([plugin]))
    try:
        assert plugin._store.wait(300)
        runs = json.loads(client.get(f"{BASE}/runs").get_data())
        assert runs["logdir_error"] == (f"s3://{name}/p: the store has no bucket {name!r} "
                                        "(The specified bucket does not exist)")
        assert runs["runs"] == [] and runs["errors"] == [] and plugin.is_active()
        s3.client().create_bucket(Bucket=name)
        s3.upload_tree(_two_ranks(tmp_path, traces), name, "p")
        assert plugin._store.wait(300)
        runs = json.loads(client.get(f"{BASE}/runs").get_data())
        assert runs["logdir_error"] is None and [r["run"] for r in runs["runs"]] == ["ranks"]
    finally:
        plugin._store.close()


@pytest.mark.slow
def test_credentials_the_store_refuses_are_named_in_the_tab(tmp_path, tensorboard_server):
    """A store that checks credentials (moto's, as a real one does) refuses keys it never issued: a
    real TensorBoard's runs answer says access was refused and where the credentials come from."""
    from tests.s3 import CHECKS_CREDENTIALS, S3Server

    store = S3Server(env=CHECKS_CREDENTIALS)
    store.start()
    try:
        tb = tensorboard_server("s3://logs/p", env={**store.environment(), "PHASEPROF_CACHE": str(tmp_path / "c")})
        runs = _logdir_error(tb)
        assert runs["logdir_error"] == (
            "s3://logs/p: the store refused access (The AWS Access Key Id you provided does not exist in our "
            "records.): check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws)")
        assert runs["runs"] == [] and runs["errors"] == []
    finally:
        tb.close()
        store.stop()

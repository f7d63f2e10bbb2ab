"""Training with ``logdir="s3://…"``: the run's traces, scalars and analyses end up in the bucket of a real
S3 server on the loopback (`tests.s3`), staged locally and uploaded off the loop; a store that goes
away costs one warning, and what is written once it is back is uploaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from phaseprof.contract import TRACE_FILE_RE
from tests.child_loop import TINY_LOOP, WAIT_FOR_MARKER, marker_from

TRAIN = textwrap.dedent("""
    import json, os, sys, time, warnings
    import torch
    from phaseprof import PhaseProfiler

    url, markers = sys.argv[1], sys.argv[2]

    %(wait_for)s

    def mark(name):
        open(os.path.join(markers, name), "w").close()

    %(loop)s

    outage = "--outage" in sys.argv
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = PhaseProfiler(logdir=url, run="r", wait=0, warmup=1, active=2, repeat=3 if outage else 1)
        prof.attach(model, optimizer)
        train(3)  # one profiled cycle: a trace
        if outage:
            mark("first-trace"); wait_for("stopped")  # the test stops the store
            train(3)  # written while the store is away
            deadline = time.monotonic() + 300
            while not any(str(w.message).startswith("phaseprof") for w in caught):
                assert time.monotonic() < deadline, "no warning"
                time.sleep(0.1)
            mark("warned"); wait_for("started")  # the store is back
            train(3)
        if "--crash" in sys.argv:  # the process ends without close(): what is staged still goes up
            mark("first-trace"); wait_for("uploaded")
            os._exit(3)
        train(2)
        prof.close()
    print(json.dumps([str(w.message) for w in caught if str(w.message).startswith("phaseprof")]))
""") % {"loop": TINY_LOOP, "wait_for": WAIT_FOR_MARKER}


def _train(tmp_path, url, *flags):
    work, temp, markers = tmp_path / "work", tmp_path / "staging", tmp_path / "markers"
    for d in (work, temp, markers):
        d.mkdir()
    env = {**os.environ, "PHASEPROF_STAGING": str(temp)}
    env.pop("PHASEPROF_CACHE")  # the tests' "off": here the analyses are written, as in a user's run
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, url, str(markers), *flags], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, work, temp, markers


def _kinds(keys: list[str]) -> dict[str, list[str]]:
    names = [k.rpartition("/")[2] for k in keys]
    return {"traces": [n for n in names if TRACE_FILE_RE.match(n)],
            "analyses": [k for k in keys if "/.phaseprof/" in k and k.endswith(".analysis")],
            "scalars": [n for n in names if n.startswith("events.out.tfevents.")]}


def test_a_run_written_to_a_bucket_leaves_traces_scalars_and_analyses_there_and_nothing_here(store, store_bucket,
                                                                                            tmp_path):
    url = store.url(store_bucket, "p")
    proc, work, temp, _ = _train(tmp_path, url)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == []  # no warning
    keys = store.keys(store_bucket)
    assert all(k.startswith("p/r/") for k in keys), keys
    kinds = _kinds(keys)
    assert len(kinds["traces"]) == 1 and len(kinds["analyses"]) == 1 and len(kinds["scalars"]) == 1, keys
    assert kinds["analyses"][0].endswith(kinds["traces"][0] + ".analysis")
    assert list(work.iterdir()) == [] and list(temp.iterdir()) == []  # the staging folder is gone
    assert f"tensorboard --logdir {url}" in out
    # and it reads back: the steps of its trace, and every step of the run from its scalars
    report = subprocess.run([sys.executable, "-m", "phaseprof.cli", "report", url, "--json"],
                            capture_output=True, text=True, env={**os.environ, "PHASEPROF_CACHE": "off"})
    data = json.loads(report.stdout)
    assert data["errors"] == [], data["errors"]
    (run,) = data["runs"]
    assert [s["step"] for s in run["workers"][0]["steps"]] == [1, 2]
    (whole,) = run["whole_run"]
    assert (whole["first_step"], whole["last_step"]) == (0, 4)  # all five steps trained


def test_the_store_going_away_costs_one_warning_and_later_traces_are_uploaded(store, store_bucket,
                                                                              tmp_path):
    url = store.url(store_bucket, "p")
    proc, work, temp, markers = _train(tmp_path, url, "--outage")
    marker_from(markers / "first-trace", proc)
    deadline = time.monotonic() + 300
    # the first trace and its analysis reached the store (the restarted store is empty: an analysis
    # uploaded after the restart would have no trace beside it)
    while not all(_kinds(store.keys(store_bucket))[kind] for kind in ("traces", "analyses")):
        assert time.monotonic() < deadline, "the first trace or its analysis was never uploaded"
        time.sleep(0.2)
    store.stop()
    (markers / "stopped").touch()
    marker_from(markers / "warned", proc)
    store.start()  # back on the same port, empty: the bucket is made again
    store.create_bucket(store_bucket)
    (markers / "started").touch()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    (warning,) = json.loads(out.strip().splitlines()[-1])
    assert f"could not upload to {url}/r" in warning and "Training goes on" in warning
    assert not [secret for secret in store.secrets if secret in warning]  # no credential in it
    kinds = _kinds(store.keys(store_bucket))
    # the trace written during the outage and the one written after it, with their analyses and the
    # scalars; and the first trace and analysis again: the restarted store had lost them, and the
    # staging folder goes only once every file is confirmed in the store
    assert (len(kinds["traces"]), len(kinds["analyses"]), len(kinds["scalars"])) == (3, 3, 1), kinds
    assert list(work.iterdir()) == [] and list(temp.iterdir()) == []
    assert "not done" not in out  # everything reached the store in the end


def _children(pid: int) -> list[str]:
    """The command lines of a process's children (Linux /proc)."""
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        pids = fh.read().split()
    out = []
    for child in pids:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                out.append(fh.read().replace(b"\0", b" ").decode())
        except FileNotFoundError:
            continue
    return out


def test_uploads_run_in_a_process_of_their_own_that_finishes_a_run_that_died(s3, bucket, tmp_path):
    proc, work, temp, markers = _train(tmp_path, f"s3://{bucket}/p", "--crash")
    marker_from(markers / "first-trace", proc)
    assert any("phaseprof.training_hooks.upload" in c for c in _children(proc.pid)), _children(proc.pid)
    deadline = time.monotonic() + 300
    while not all(_kinds(s3.keys(bucket))[kind] for kind in ("traces", "analyses")):
        assert time.monotonic() < deadline, "the trace or its analysis was never uploaded"
        time.sleep(0.2)
    (markers / "uploaded").touch()
    proc.communicate(timeout=300)
    assert proc.returncode == 3  # ended without close()
    # the uploader, left alone, uploads what is staged (the scalars written so far) and removes the staging folder
    while list(temp.iterdir()):
        assert time.monotonic() < deadline, f"the staging folder was kept: {list(temp.rglob('*'))}"
        time.sleep(0.2)
    kinds = _kinds(s3.keys(bucket))
    assert len(kinds["traces"]) == 1 and len(kinds["analyses"]) == 1 and len(kinds["scalars"]) == 1, kinds
    assert list(work.iterdir()) == []


def test_without_an_upload_process_a_thread_uploads_and_the_staging_folder_goes(s3, bucket, tmp_path, monkeypatch):
    from phaseprof.training_hooks import upload
    from phaseprof.training_hooks.faults import Faults

    def no_process(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(upload.subprocess, "Popen", no_process)
    monkeypatch.setenv("PHASEPROF_STAGING", str(tmp_path / "staging"))
    root = upload.staging_root()
    local = os.path.join(root, "r")
    os.makedirs(os.path.join(local, ".phaseprof"))
    for name in ("w.1.pt.trace.json.gz", ".phaseprof/w.1.pt.trace.json.gz.analysis", "w.2.pt.trace.json.part"):
        with open(os.path.join(local, name), "wb") as fh:
            fh.write(name.encode())
    faults = Faults(f"s3://{bucket}/p/r")
    with warnings.catch_warnings(record=True):
        uploader = upload.Uploader(root, local, f"s3://{bucket}/p/r", faults, interval_s=0.1)
        assert not uploader.close(wait_s=5)
    assert s3.keys(bucket) == ["p/r/.phaseprof/w.1.pt.trace.json.gz.analysis", "p/r/w.1.pt.trace.json.gz"]
    # the unfinished export was never uploaded, and is kept with the folder, which the summary names
    assert os.path.isfile(os.path.join(local, "w.2.pt.trace.json.part")) and uploader.kept
    first, last = faults.lines
    assert "could not start the upload process" in first
    assert "1 file(s) not uploaded" in last and "still being written" in last and root in last
    with warnings.catch_warnings(record=True):  # once done, all of it goes up and the folder goes
        os.replace(os.path.join(local, "w.2.pt.trace.json.part"),
                   os.path.join(local, "w.2.pt.trace.json"))
        uploader = upload.Uploader(root, local, f"s3://{bucket}/p/r", faults, interval_s=0.1)
        assert uploader.close(wait_s=60)
    assert "p/r/w.2.pt.trace.json" in s3.keys(bucket) and not os.path.exists(root)


class _Busy:
    """A store that answers every request 503 (busy: a transient error each client retries), on
    the loopback, counting the requests."""

    def __init__(self) -> None:
        import http.server
        import threading

        busy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _busy(self) -> None:
                busy.requests += 1
                self.send_response(503)  # at once: a client may wait for "100 Continue" to send
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _busy

            def log_message(self, *args) -> None:
                pass

        self.requests = 0
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(30)


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_the_upload_client_of_gcs_and_azure_tries_a_request_twice(scheme, request, monkeypatch,
                                                                   tmp_path):
    """The bounded client (the uploader's, the capture channel's) tries a request `TRIES` times, as
    its timeouts assume: gcsfs's own six tries with backoff, or Azure's four over a minute, held an
    outage's first warning and each pass of the uploader for the call's whole limit. (S3's tries
    are botocore's options, `storage._bounded`.)"""
    import fsspec

    from phaseprof.plugin.reading import storage
    from tests.stores import STORES

    store = request.getfixturevalue(STORES[scheme])
    busy = _Busy()
    try:
        for name, value in store.environment(busy.endpoint).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(storage, "_filesystems", {})
        fsspec.get_filesystem_class(store.scheme).clear_instance_cache()  # made for the emulator
        fs = storage.filesystem(store.url("bucket", "p"), bounded=True)
        fs.clear_instance_cache()  # the next one, for the emulator again, not this one
        (tmp_path / "f").write_bytes(b"x" * 100)
        with pytest.raises(Exception) as raised:  # noqa: B017 - each client raises its own kind
            fs.put_file(str(tmp_path / "f"), "bucket/p/f", **storage.call_limit(fs, 100))
        # the client gave up by itself, not cut by the call's total limit (fsspec's timeout)
        assert not isinstance(raised.value, fsspec.exceptions.FSTimeoutError), raised.value
        assert busy.requests == storage.TRIES
    finally:
        busy.close()

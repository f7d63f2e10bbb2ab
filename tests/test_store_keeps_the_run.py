"""A run written to a store is never lost: a bucket that does not exist, a store that denies
writing (a relay answering S3's 403 AccessDenied), a bucket deleted or a store gone before close, a
store that accepts connections and never answers. Each time the run's files are all in the store
or in the staging folder the summary names, with the command that uploads them; `phaseprof upload`
then puts exactly what the run wrote in the store (keys and sizes compared)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from phaseprof.contract import TRACE_FILE_RE
from tests.child_loop import TINY_LOOP, WAIT_FOR_MARKER, marker_from
from tests.s3 import BlackHole, Gate, sizes

TRAIN = textwrap.dedent("""
    import json, os, sys, time, warnings
    import torch
    from phaseprof import PhaseProfiler

    url, markers = sys.argv[1], sys.argv[2]

    if "--slow-process-start" in sys.argv:  # as on a loaded machine: starting a process takes long
        import subprocess

        class SlowStart(subprocess.Popen):
            def __init__(self, args, *rest, **options):
                time.sleep(2)
                super().__init__(args, *rest, **options)

        subprocess.Popen = SlowStart

    %(wait_for)s

    %(loop)s

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = PhaseProfiler(logdir=url, run="r", wait=0, warmup=1, active=2, repeat=2,
                             gzip="--no-gzip" not in sys.argv)
        prof.attach(model, optimizer)
        if "--warned-at-start" in sys.argv:  # before any step: the store's refusal is known already
            deadline = time.monotonic() + 120
            while not caught:
                assert time.monotonic() < deadline, "no warning at the start"
                time.sleep(0.05)
        train(3)  # one profiled cycle: a trace
        if "--hold" in sys.argv:
            open(os.path.join(markers, "trained"), "w").close()
            wait_for("close")
        train(2)  # the second cycle's trace is written by close()
        prof.close()
    print(json.dumps([str(w.message) for w in caught if str(w.message).startswith("phaseprof")]))
""") % {"loop": TINY_LOOP, "wait_for": WAIT_FOR_MARKER}

_names = itertools.count()
#: close()'s bound on the uploads where the store is gone or never answers: what close() then
#: waits out. Above the uploader's own grace (`upload.GRACE_S`, 5 s), so it is told a time to try.
UPLOAD_WAIT_S = 6


def _train(tmp_path, url, *flags, endpoint=None, upload_wait_s=None):
    work, temp, markers = tmp_path / "work", tmp_path / "staging", tmp_path / "markers"
    for d in (work, temp, markers):
        d.mkdir()
    env = {**os.environ, "PHASEPROF_STAGING": str(temp)}
    env.pop("PHASEPROF_CACHE")  # the tests' "off": here analyses are written, as in a user's run
    if upload_wait_s is not None:  # close()'s bound on uploads, shorter than its minute
        env["PHASEPROF_UPLOAD_WAIT_S"] = str(upload_wait_s)
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, url, str(markers), *flags], cwd=work,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, markers


def _finish(proc, timeout=600) -> tuple[str, list[str]]:
    """The summary and the warnings of a training process that ended well (stopped in any case)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return out, json.loads(out.strip().splitlines()[-1])


def _staged(out: str, logdir: str) -> str:
    """The staging folder the summary names, after checking that it says how to upload it and never
    sends the user to the store's URL as if the run were there."""
    found = re.search(r"The run is staged in (\S+), not in " + re.escape(logdir), out)
    assert found, out
    staging = found.group(1)
    assert f"Upload it with: phaseprof upload {staging} {logdir}" in out, out
    assert f"tensorboard --logdir {logdir}" not in out, out
    assert f"Next: tensorboard --logdir {staging}" in out, out
    return staging


def _tree(folder: str) -> dict[str, int]:
    """Each file under ``folder`` ("/"-separated, relative) and its size."""
    out = {}
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, folder).replace(os.sep, "/")] = os.path.getsize(path)
    return out


def _complete(wrote: dict[str, int]) -> None:
    """What the run wrote: two traces, each with its analysis (and step index), and the scalars."""
    traces = [k for k in wrote if TRACE_FILE_RE.match(k.rpartition("/")[2])]
    analyses = [k for k in wrote if "/.phaseprof/" in k and k.endswith(".analysis")]
    scalars = [k for k in wrote if "events.out.tfevents." in k]
    assert len(traces) == 2 and len(scalars) == 1, wrote
    expected = [f"r/.phaseprof/{t.rpartition('/')[2]}.analysis" for t in traces]
    assert sorted(analyses) == sorted(expected), wrote
    assert not [k for k in wrote if k.endswith((".part", ".tmp"))], wrote  # nothing unfinished


def _upload(staging: str, url: str, endpoint: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ) if endpoint is None else {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    return subprocess.run([sys.executable, "-m", "phaseprof.cli", "upload", staging, url], env=env,
                          capture_output=True, text=True, timeout=300)


def _uploaded(s3, bucket: str, staging: str, wrote: dict[str, int]) -> None:
    """``phaseprof upload`` put exactly what the run wrote in the store, and removed the folder."""
    done = _upload(staging, f"s3://{bucket}/p")
    assert done.returncode == 0, done.stderr
    assert f"{len(wrote)} file(s) in s3://{bucket}/p" in done.stdout and "removed" in done.stdout
    assert sizes(s3, bucket, "p/") == wrote
    assert not os.path.exists(staging)
    again = _upload(staging, f"s3://{bucket}/p")  # nothing left to do: said in one line
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "no such folder" in again.stderr


def test_a_missing_bucket_is_found_at_the_start_and_the_run_is_kept_until_uploaded(s3, tmp_path):
    bucket = f"nosuchbucket{next(_names)}"  # never created
    proc, _ = _train(tmp_path, f"s3://{bucket}/p", "--warned-at-start")
    out, warned = _finish(proc)
    (warning,) = warned
    assert f"could not upload to s3://{bucket}/p/r (the bucket does not exist)" in warning, warning
    staging = _staged(out, f"s3://{bucket}/p")
    assert "the bucket does not exist" in out and "not uploaded" in out
    wrote = _tree(staging)
    _complete(wrote)
    s3.client().create_bucket(Bucket=bucket)  # the user makes the bucket, then uploads the run
    _uploaded(s3, bucket, staging, wrote)


def test_a_store_that_denies_writing_is_found_at_the_start_and_the_run_kept(s3, bucket, tmp_path):
    gate = Gate(s3.port, deny_writes=True)
    try:
        proc, _ = _train(tmp_path, f"s3://{bucket}/p", "--warned-at-start", endpoint=gate.endpoint)
        out, warned = _finish(proc)
        staging = _staged(out, f"s3://{bucket}/p")
        (warning,) = warned
        said = f"could not upload to s3://{bucket}/p/r (the store denies writing there)"
        assert said in warning, warning
        assert "AccessDenied" in warning or "Access Denied" in warning, warning
        wrote = _tree(staging)
        _complete(wrote)
        assert s3.keys(bucket) == [] and gate.denied > 0
        # still denied: the command says so in one line, keeps the folder, exit 1; it resumes later
        refused = _upload(staging, f"s3://{bucket}/p", endpoint=gate.endpoint)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert "the store denies writing there" in refused.stderr and staging in refused.stderr
        assert _tree(staging) == wrote
        gate.deny_writes = False  # the policy is fixed
        _uploaded(s3, bucket, staging, wrote)
    finally:
        gate.stop()


def test_a_bucket_deleted_before_close_leaves_every_file_staged(s3, bucket, tmp_path):
    proc, markers = _train(tmp_path, f"s3://{bucket}/p", "--hold")
    try:
        marker_from(markers / "trained", proc)
        deadline = time.monotonic() + 300  # the first trace reached the store
        while not any(TRACE_FILE_RE.match(k.rpartition("/")[2]) for k in s3.keys(bucket)):
            assert time.monotonic() < deadline, "the first trace was never uploaded"
            time.sleep(0.2)
        client = s3.client()
        for key in s3.keys(bucket):  # the bucket goes, with what was uploaded
            client.delete_object(Bucket=bucket, Key=key)
        client.delete_bucket(Bucket=bucket)
        (markers / "close").touch()
        out, _ = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    staging = _staged(out, f"s3://{bucket}/p")
    assert "the bucket does not exist" in out
    wrote = _tree(staging)
    _complete(wrote)  # the files uploaded before are still staged: none was lost with the bucket
    client.create_bucket(Bucket=bucket)
    _uploaded(s3, bucket, staging, wrote)


@pytest.mark.slow
def test_a_store_gone_at_close_leaves_every_file_staged(s3, bucket, tmp_path):
    """The store stops answering (connections refused) before close: close() tries for its bound."""
    gate = Gate(s3.port, deny_writes=False)
    try:
        proc, markers = _train(tmp_path, f"s3://{bucket}/p", "--hold", endpoint=gate.endpoint,
                               upload_wait_s=UPLOAD_WAIT_S)
        marker_from(markers / "trained", proc)
        gate.stop()
        (markers / "close").touch()
        out, warned = _finish(proc)
    finally:
        gate.stop()
    staging = _staged(out, f"s3://{bucket}/p")
    (warning,) = warned
    assert "the store does not answer" in warning, warning
    wrote = _tree(staging)
    _complete(wrote)
    _uploaded(s3, bucket, staging, wrote)  # straight to the store, now that it answers


@pytest.mark.slow
def test_close_returns_against_a_store_that_never_answers_and_keeps_the_files(s3, bucket, tmp_path):
    """Accepted connections, no answer ever: close() returns (its bound is measured by
    benchmarks/black_hole_close.py; here only that it returns, at the bound it was given, the
    uploader stopped by the training process) and the files stay, named."""
    hole = BlackHole()
    try:
        proc, _ = _train(tmp_path, f"s3://{bucket}/p", endpoint=hole.endpoint,
                         upload_wait_s=UPLOAD_WAIT_S)
        out, _ = _finish(proc, timeout=900)
        assert hole.accepted > 0
    finally:
        hole.close()
    staging = _staged(out, f"s3://{bucket}/p")
    assert f"the store does not answer (nothing came back in {UPLOAD_WAIT_S} s)" in out, out
    wrote = _tree(staging)
    _complete(wrote)
    _uploaded(s3, bucket, staging, wrote)


def test_every_analysis_is_uploaded_before_close_returns_without_gzip(s3, bucket, tmp_path):
    """The last trace is written by close(); its analysis is started from a thread of its own, whose
    process takes seconds to start on a loaded machine (made so here)."""
    proc, _ = _train(tmp_path, f"s3://{bucket}/p", "--no-gzip", "--slow-process-start")
    out, warned = _finish(proc)
    assert warned == [] and "not done" not in out
    stored = sizes(s3, bucket, "p/")
    _complete(stored)
    assert not any(k.endswith(".gz") for k in stored)


def test_upload_resumes_uploading_only_what_is_missing_and_refuses_bad_input(s3, bucket, tmp_path):
    """A staging folder half uploaded (real traces), as a run interrupted mid-upload leaves it."""
    data = os.path.join(os.path.dirname(__file__), "data", "cpu", "repeat2")
    staging = tmp_path / "phaseprof-staging-abc"
    shutil.copytree(data, staging / "r", ignore=shutil.ignore_patterns(".phaseprof"))
    wrote = _tree(str(staging))
    assert len(wrote) >= 2, wrote
    first = sorted(wrote)[0]
    s3.client().upload_file(str(staging / first), bucket, f"p/{first}")
    done = _upload(str(staging / "r"), f"s3://{bucket}/p/r")  # a run's folder works too
    assert done.returncode == 0, done.stderr
    said = f"{len(wrote)} file(s) in s3://{bucket}/p/r ({len(wrote) - 1} uploaded now"
    assert said in done.stdout, done.stdout
    assert sizes(s3, bucket, "p/") == wrote
    assert not staging.exists()  # the staging folder above the run, empty, went too
    # a folder PhaseProfiler did not make is uploaded and kept
    other = tmp_path / "mine"
    shutil.copytree(data, other / "r", ignore=shutil.ignore_patterns(".phaseprof"))
    kept = _upload(str(other), f"s3://{bucket}/q")
    assert kept.returncode == 0 and "kept" in kept.stdout and sizes(s3, bucket, "q/") == wrote
    assert _tree(str(other)) == wrote
    for args, said in (((str(other), str(tmp_path / "local")), "not a store's URL"),
                       ((str(tmp_path / "nothing"), f"s3://{bucket}/p"), "no such folder")):
        wrong = subprocess.run([sys.executable, "-m", "phaseprof.cli", "upload", *args],
                               capture_output=True, text=True, timeout=300)
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
        assert said in wrong.stderr, wrong.stderr
